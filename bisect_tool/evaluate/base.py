"""What the server and op evaluators share: a candidate's artifacts, its gate result, and an
UNTESTABLE observation (never an exception) when the candidate itself cannot run."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.errors import (
    ArtifactUnavailable,
    BootFailed,
    IncompatibleExtension,
    UntestableError,
)
from bisect_tool.events import ArtifactReady, Observer, ignore
from bisect_tool.interfaces import ArtifactProvider, ProbeResult, SwapSet
from bisect_tool.values import Observation, Verdict


def untestable_stage(exc: UntestableError) -> str:
    """Where a candidate could not be run: its artifacts (missing, or the build failed: then no
    tier can run it), the compatibility gate, or the server's boot."""
    if isinstance(exc, IncompatibleExtension):
        return "gate"
    if isinstance(exc, BootFailed):
        return "boot"
    if isinstance(exc, ArtifactUnavailable):  # BuildFailed is one too
        return "artifacts"
    return "probe"


def swap_facts(swap: SwapSet) -> dict[str, Any]:
    """What the report's environment block says of a candidate's compiled files."""
    return {"swap_sha256": dict(swap.sha256), "swap_source": swap.source}


class _ArtifactEvaluator:
    """Shared by the server and op evaluators: artifacts, gate, and UNTESTABLE on failure."""

    def __init__(self, provider: ArtifactProvider, tags: Mapping[str, Sequence[str]]) -> None:
        self.provider = provider
        self.tags = tags
        self._lock = threading.Lock()
        self.observer: Observer = ignore  # the run owner's, for ArtifactReady
        self._ready: set[str] = set()

    def _announce(self, commit: str, seconds: float) -> None:
        with self._lock:
            first = commit not in self._ready
            self._ready.add(commit)
        if first:
            self.observer(ArtifactReady(commit, seconds))

    def prepare(self, commits: Sequence[str]) -> None:
        """The lookahead (``bisect_tool.strategy.lookahead``): the provider fetches these once the
        next
        evaluation has its own artifact, so they overlap its probe, never its build."""
        self.provider.prefetch(commits, {c: self.tags.get(c, ()) for c in commits})

    def cancel(self) -> int:
        return 0  # a local lifetime or op check runs to its end (the backend stops servers)

    def _swap(self, commit: str, tags: Sequence[str]) -> SwapSet:
        return self.provider.get(commit, tags)


def untestable(
    commit: str, lifetime_id: str, exc: UntestableError, started: float
) -> Observation:
    """The candidate itself could not be run: an UNTESTABLE observation saying where, never an
    exception (``started``: the evaluation's ``time.monotonic()``)."""
    return Observation(
        commit, Verdict.UNTESTABLE, lifetime_id, {"stage": untestable_stage(exc)}, str(exc),
        time.monotonic() - started,
    )


def observed(
    commit: str, lifetime_id: str, result: ProbeResult, detail: dict[str, Any], started: float
) -> Observation:
    """What the probe saw in the lifetime, as the observation the engine journals."""
    return Observation(
        commit, result.verdict, lifetime_id, detail, result.message, time.monotonic() - started
    )
