"""The small interfaces between stages. The loop sees only these; I/O lives behind them.

- ``ArtifactProvider`` gives a candidate's swap set (its compiled files), from a cache.
- ``RuntimeBackend`` boots one lifetime of the pinned stack with that swap set in place.
- ``ServerProbe`` decides what one lifetime saw.
- ``Evaluator`` turns (candidate, lifetime id) into an ``Observation``; the loop calls only this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from bisect_tool.values import Observation, Verdict


@dataclass(frozen=True)
class SwapSet:
    """A candidate's compiled files, ready to be placed over the pinned stack's own.

    ``files`` maps the path relative to the pinned install root (site-packages), e.g.
    ``vllm/_C_stable_libtorch.abi3.so``, to the verified file in the artifact cache.
    """

    commit: str
    files: Mapping[str, Path]
    source: str = ""  # "wheel-index", "release", "local", "source-build", "import"
    origin: str = ""  # URL or path it came from
    sha256: Mapping[str, str] = field(default_factory=dict)
    # top-level packages the files hold whole (the candidate's own Python side, issue 40: a
    # bisect of whole commits): laid in place of the pinned package, not over it, and not
    # gated (its Python side is its own)
    whole_packages: tuple[str, ...] = ()


class ArtifactProvider(Protocol):
    def get(self, commit: str, tags: Sequence[str] = ()) -> SwapSet:
        """The swap set of ``commit``; raises ``UntestableError`` when no source has it."""
        ...

    def prefetch(self, commits: Sequence[str], tags: Mapping[str, Sequence[str]]) -> None:
        """The lookahead: fetch these in the background once the next ``get`` has its swap set
        (the candidates the search may ask after it, likeliest first). Replaces the last call's
        lookahead, cancelling what it drops; ``prefetch([])`` starts nothing more."""
        ...


@dataclass(frozen=True)
class LifetimeSpec:
    """One fresh server: the swap set to place, where, and with which environment."""

    session: str
    lifetime_id: str  # unique and stable: "<commit12>-<n>"; idempotent across resumes
    swap: SwapSet
    gpu: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # on top of the recipe's env
    log_dir: Path | None = None


@dataclass(frozen=True)
class ServerHandle:
    url: str  # e.g. http://127.0.0.1:41234
    lifetime_id: str
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class RuntimeBackend(Protocol):
    def lifetime(self, spec: LifetimeSpec) -> AbstractContextManager[ServerHandle]:
        """Boot, wait for /health, yield, always tear down. Raises ``BootFailed`` with the log
        tail when the server exits or the deadline passes first."""
        ...

    def check_compatible(self, swap: SwapSet) -> None:
        """Raise ``IncompatibleExtension`` naming the op when the swap set's op schemas differ
        from the pinned stack's; each swap set is checked once, its verdict kept, however many
        threads ask."""
        ...

    def cleanup_stale(self, session: str | None = None) -> int:
        """Remove what an earlier crash of ``session`` (default: this backend's) left
        (containers by label, process groups); how many."""
        ...

    def close(self) -> int:
        """Stop every lifetime still running (another thread's, on Ctrl-C); how many."""
        ...


@dataclass(frozen=True)
class ProbeResult:
    verdict: Verdict
    detail: dict[str, Any] = field(default_factory=dict)
    message: str = ""


class ServerProbe(Protocol):
    def run(self, server: ServerHandle, is_alive: Any = None) -> ProbeResult: ...


class Evaluator(Protocol):
    """Runs one lifetime of one candidate. The loop's only view of artifacts/runtime/probes."""

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation: ...

    def prepare(self, commits: Sequence[str]) -> None:
        """Hint: these candidates may come after the next evaluation (fetch their artifacts
        meanwhile); each call replaces the last, and ``prepare(())`` (the run is decided)
        starts no more fetches."""
        ...

    def cancel(self) -> int:
        """Stop the lifetimes in flight where that can be done (Ray tasks); how many were
        stopped. 0: they run to their end (a local process, a container)."""
        ...




@runtime_checkable
class Gates(Protocol):
    """An evaluator that can ask the compatibility gate alone, with no server booted (a
    release-level run gates every release at once before its first boot)."""

    def gate_check(self, commit: str, tags: Sequence[str] = ()) -> Observation:
        """UNTESTABLE (with its stage, ``gate`` or ``artifacts``, in the detail) when the
        pinned stack cannot run ``commit``'s compiled files; CLEAN when the gate lets it
        through."""
        ...
