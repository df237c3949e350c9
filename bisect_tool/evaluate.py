"""Evaluators: one lifetime of one candidate -> one ``Observation``.

They join the stages (artifacts -> runtime -> probe -> verdict) behind the small ``Evaluator``
interface, so the loop in ``session`` never touches git worktrees, HTTP or Docker itself.
An evaluator never raises for a candidate's own failure: that is an UNTESTABLE observation.
Infrastructure failures (``InfrastructureError``) and aborts propagate: they are never verdicts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from bisect_tool.errors import (
    AbortError,
    ArtifactUnavailable,
    BootFailed,
    IncompatibleExtension,
    UntestableError,
)
from bisect_tool.events import ArtifactReady, Observer, ignore
from bisect_tool.interfaces import (
    ArtifactProvider,
    LifetimeSpec,
    ProbeResult,
    RuntimeBackend,
    ServerHandle,
    ServerProbe,
    SwapSet,
)
from bisect_tool.values import Observation, Verdict, short
from bisect_tool.worktrees import remove_stale_worktrees, worktree

Progress = Callable[[str], None]


_SIGNALS = {int(sig) for sig in signal.Signals}
class RunCommandEvaluator:
    """``bisect start --run CMD``: the generic probe, with ``git bisect run`` exit codes.

    0 = good (CLEAN), 125 = untestable, 1..127 otherwise = bad (DIVERGENT),
    >= 128 (killed by a signal) or a timeout = abort the whole run.
    """

    def __init__(
        self,
        repo_path: Path,
        command: str,
        timeout_s: float = 0.0,
        *,
        state_dir: Path | None = None,
        session: str = "",
        progress: Progress | None = None,
    ) -> None:
        from bisect_tool.children import Registry

        self.repo_path = repo_path
        self.command = command
        self.timeout_s = timeout_s or None
        # Each probe's group is recorded there and labelled with the session, so a `resume` or
        # `reset` after a kill -9 of this process can end it (children.py).
        self.children = Registry(state_dir) if state_dir is not None else None
        self.session = session
        self.progress = progress or (lambda _msg: None)
        self._first = True
        remove_stale_worktrees(repo_path)

    def prepare(self, commits: Sequence[str]) -> None:
        return None

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        started = time.monotonic()
        from bisect_tool import runprobe
        from bisect_tool.runtime.common import ENV_SESSION

        with worktree(self.repo_path, commit) as path:
            env = {**os.environ, "BISECT_COMMIT": commit, "BISECT_LIFETIME": lifetime_id}
            if self.session:
                env[ENV_SESSION] = self.session
            first, self._first = self._first, False
            if first:
                self.progress(runprobe.banner(path, commit))
            proc = subprocess.Popen(
                ["bash", "-c", self.command],
                cwd=path,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            tracked = (
                self.children.tracked(proc.pid, f"--run at {commit[:12]}")
                if self.children is not None
                else contextlib.nullcontext()
            )
            try:
                with tracked:
                    out, _ = proc.communicate(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise AbortError(
                    f"--run command timed out after {self.timeout_s:.0f}s at {commit[:12]}; "
                    "raise --run-timeout or make the command exit 125 when it cannot decide"
                ) from None
            except BaseException:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                raise
            code = proc.returncode
            text = out.decode(errors="replace")
            # asked while the worktree exists: does the path the command named exist there?
            problem = runprobe.exit_problem(code, text, self.command, path, commit)
        if problem:
            raise AbortError(problem)
        tail = "\n".join(text.splitlines()[-20:])
        if first:  # the log says where the command ran (relative paths resolve from there)
            tail = runprobe.banner(path, commit) + "\n" + tail
        elapsed = time.monotonic() - started
        detail: dict[str, Any] = {"exit_code": code, "log_tail": tail}
        if code == 0:
            verdict = Verdict.CLEAN
        elif code == 125:
            verdict = Verdict.UNTESTABLE
        elif 0 < code < 128:
            verdict = Verdict.DIVERGENT
        else:
            # Popen reports death by a signal as -N; bash reports it as 128 + N
            how = f"by {signal.Signals(-code).name}" if -code in _SIGNALS else f"(exit {code})"
            raise AbortError(
                f"--run command was killed {how} at {commit[:12]}; exit codes >= 128 "
                "abort the bisect, like git bisect run"
            )
        return Observation(commit, verdict, lifetime_id, detail, f"exit {code}", elapsed)


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
        """The lookahead (``bisect_tool.lookahead``): the provider fetches these once the next
        evaluation has its own artifact, so they overlap its probe, never its build."""
        self.provider.prefetch(commits, {c: self.tags.get(c, ()) for c in commits})

    def _swap(self, commit: str, tags: Sequence[str]) -> SwapSet:
        return self.provider.get(commit, tags)


class ServerEvaluator(_ArtifactEvaluator):
    """Artifacts -> compatibility gate -> one fresh lifetime -> the server probe."""

    def __init__(
        self,
        provider: ArtifactProvider,
        backend: RuntimeBackend,
        probe_factory: Callable[[bool], ServerProbe],
        *,
        session: str,
        log_dir: Path,
        tags: Mapping[str, Sequence[str]],
        gpu_lease: Callable[[], AbstractContextManager[str | None]],
    ) -> None:
        super().__init__(provider, tags)
        self.backend = backend
        self.probe_factory = probe_factory
        self.session = session
        self.log_dir = log_dir
        self.gpu_lease = gpu_lease
        self._gated: set[str] = set()

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        started = time.monotonic()
        try:
            swap = self._swap(commit, tags or self.tags.get(commit, ()))
            if commit not in self._gated:
                self.backend.check_compatible(swap)
                self._gated.add(commit)
            artifacts_s = time.monotonic() - started
            self._announce(commit, artifacts_s)
            result = self.run_lifetime(swap, lifetime_id, {}, sequential=False)
        except UntestableError as exc:
            return Observation(
                commit, Verdict.UNTESTABLE, lifetime_id, {"stage": untestable_stage(exc)},
                str(exc), time.monotonic() - started,
            )
        detail = dict(result.detail)
        detail["timing"] = {**detail.get("timing", {}), "artifacts_s": round(artifacts_s, 3)}
        detail.update(swap_facts(swap))
        return Observation(
            commit,
            result.verdict,
            lifetime_id,
            detail,
            result.message,
            time.monotonic() - started,
        )

    def boot(
        self, swap: SwapSet, lifetime_id: str, env: Mapping[str, str]
    ) -> AbstractContextManager[ServerHandle]:
        @contextmanager
        def _boot() -> Iterator[ServerHandle]:
            with self.gpu_lease() as gpu:
                spec = LifetimeSpec(self.session, lifetime_id, swap, gpu, env, self.log_dir)
                with self.backend.lifetime(spec) as server:
                    yield server

        return _boot()

    def run_lifetime(
        self, swap: SwapSet, lifetime_id: str, env: Mapping[str, str], *, sequential: bool
    ) -> ProbeResult:
        started = time.monotonic()
        with self.boot(swap, lifetime_id, env) as server:
            booted = time.monotonic()
            probe = self.probe_factory(sequential)
            is_alive = getattr(server, "is_alive", None)
            result = probe.run(server, is_alive)
            probed = time.monotonic()
            tail = server.log_tail(30)
        detail = {
            **result.detail,
            "log_tail": tail,
            "lifetime_id": lifetime_id,
            "timing": {
                "boot_s": round(booted - started, 3),
                "probe_s": round(probed - booted, 3),
                "teardown_s": round(time.monotonic() - probed, 3),
            },
        }
        return ProbeResult(result.verdict, detail, result.message)


class OpEvaluator(_ArtifactEvaluator):
    """Artifacts -> the focused op probe on the candidate's extension (no server, no model).

    As the tiered search's fast probe it is given the faithful tier's ``gate`` too: the op
    check needs no pinned Python, but the confirm step must know which candidates the pinned
    stack would reject, so each candidate's gate result rides in its detail (``gate``: "ok" or
    the op that differs); the op verdict stands either way."""

    def __init__(
        self,
        provider: ArtifactProvider,
        op_probe: Any,
        env: Mapping[str, str],
        tags: Mapping[str, Sequence[str]],
        gate: Callable[[SwapSet], None] | None = None,
    ) -> None:
        super().__init__(provider, tags)
        self.op_probe = op_probe
        self.env = dict(env)
        self.gate = gate
        self._gate_results: dict[str, str] = {}

    def _gate_result(self, swap: SwapSet) -> str | None:
        if self.gate is None:
            return None
        with self._lock:
            known = self._gate_results.get(swap.commit)
        if known is None:
            try:
                self.gate(swap)
                known = "ok"
            except IncompatibleExtension as exc:
                known = str(exc)
            with self._lock:
                self._gate_results[swap.commit] = known
        return known

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        started = time.monotonic()
        try:
            swap = self._swap(commit, tags or self.tags.get(commit, ()))
        except UntestableError as exc:
            return Observation(
                commit, Verdict.UNTESTABLE, lifetime_id, {"stage": untestable_stage(exc)},
                str(exc), time.monotonic() - started,
            )
        artifacts_s = time.monotonic() - started
        self._announce(commit, artifacts_s)
        gate = self._gate_result(swap)
        path = next(iter(swap.files.values()))
        probing = time.monotonic()
        result = self.op_probe.run_extension(path, self.env)
        detail: dict[str, Any] = {**result.detail, **swap_facts(swap)}
        detail["timing"] = {
            "artifacts_s": round(artifacts_s, 3),
            "probe_s": round(time.monotonic() - probing, 3),
        }
        if gate is not None:
            detail["gate"] = gate
        if result.verdict is Verdict.UNTESTABLE:
            detail.setdefault("stage", "probe")
        return Observation(
            commit,
            result.verdict,
            lifetime_id,
            detail,
            result.message,
            time.monotonic() - started,
        )


class ControlsRunner:
    """The positive and negative controls on one candidate (the good end by default)."""

    def __init__(
        self,
        evaluator: ServerEvaluator,
        commit: str,
        invariance_env: str,
        tags: Mapping[str, Sequence[str]],
        attempts: int = 3,
    ) -> None:
        self.evaluator = evaluator
        self.commit = commit
        self.invariance_env = invariance_env
        self.tags = tags
        self.attempts = attempts

    def run(self) -> dict[str, Any]:
        """Up to ``attempts`` lifetimes until the positive control diverges (it may be
        intermittent too), each also running the sequential negative control."""
        from bisect_tool.probes.controls import run_controls

        swap = self.evaluator._swap(self.commit, self.tags.get(self.commit, ()))
        result = None
        for attempt in range(self.attempts):
            lid = f"control-{short(self.commit)}-{attempt}"

            def boot(
                env: Mapping[str, str], lid: str = lid
            ) -> AbstractContextManager[ServerHandle]:
                return self.evaluator.boot(swap, lid, env)

            result = run_controls(self.evaluator.probe_factory, boot, self.invariance_env)
            if result.positive_ok:
                break
        assert result is not None
        return {
            "type": "controls",
            "commit": self.commit,
            "ok": result.ok,
            "problem": result.problem,
            **result.to_detail(),
        }
