"""The server evaluator: artifacts -> compatibility gate -> one fresh lifetime -> the server
probe; and the controls on one candidate."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Protocol

from bisect_tool.errors import (
    UntestableError,
)
from bisect_tool.evaluate.base import (
    _ArtifactEvaluator,
    observed,
    swap_facts,
    untestable,
    untestable_stage,
)
from bisect_tool.events import Observer, ignore
from bisect_tool.interfaces import (
    ArtifactProvider,
    LifetimeSpec,
    ProbeResult,
    RuntimeBackend,
    ServerHandle,
    ServerProbe,
    SwapSet,
)
from bisect_tool.journal import entries
from bisect_tool.recipes.recipe import ProbeSettings, Recipe
from bisect_tool.values import Observation, Verdict, short


class Crowding(Protocol):
    """What a lifetime asks of the GPUs it shares (``runtime.gpus.GpuPool``)."""

    def sharing(self, gpu: str | None) -> int:
        """How many servers share ``gpu``'s card now."""
        ...

    def back_off(self, gpu: str | None, servers: int) -> bool:
        """``servers`` were too many on ``gpu``: lower its share; whether that lowered it."""
        ...


def short_of_target(result: ProbeResult) -> bool:
    """An INCONCLUSIVE lifetime whose repeats never reached the target co-residency."""
    if result.verdict is not Verdict.INCONCLUSIVE:
        return False
    target = result.detail.get("target_coresidency")
    peaks = result.detail.get("coresidency_per_repeat") or []
    return isinstance(target, int) and target > 0 and any(
        isinstance(p, int) and p < target for p in peaks)


class ServerEvaluator(_ArtifactEvaluator):
    """Artifacts -> compatibility gate -> one fresh lifetime -> the server probe.

    ``crowding``: the GPU pool the lifetimes lease from; a lifetime that missed the probe's
    co-residency while other servers shared its card lowers that card's share, so the next
    lifetimes are not lost the same way (on the H100 one of 8 servers sharing the card reached
    38-42 of the 44 sequences it needed: INCONCLUSIVE, a whole lifetime spent: issue 39)."""

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
        boot_lock: Callable[[str | None], AbstractContextManager[None]] | None = None,
        crowding: Crowding | None = None,
    ) -> None:
        super().__init__(provider, tags)
        self.crowding = crowding
        self.boot_lock = boot_lock or (lambda _gpu: contextlib.nullcontext())
        self.backend = backend
        self.probe_factory = probe_factory
        self.session = session
        self.log_dir = log_dir
        self.gpu_lease = gpu_lease

    def gate(self, swap: SwapSet) -> None:
        """Raise ``IncompatibleExtension`` when the pinned stack cannot load ``swap``: every
        lifetime, the controls' too, is gated before it boots (the backend checks a swap set
        once and keeps its verdict, ``Backend.check_compatible``)."""
        self.backend.check_compatible(swap)

    def gate_check(self, commit: str, tags: Sequence[str] = ()) -> Observation:
        """The gate alone on ``commit`` (its artifacts fetched first), no server booted: CLEAN
        when it passes, else UNTESTABLE saying where (``interfaces.Gates``)."""
        started = time.monotonic()
        lifetime_id = f"gate-{short(commit)}"
        try:
            swap = self._swap(commit, tags or self.tags.get(commit, ()))
            self.gate(swap)
        except UntestableError as exc:
            return untestable(commit, lifetime_id, exc, started)
        return Observation(commit, Verdict.CLEAN, lifetime_id,
                           {"stage": "gate", **swap_facts(swap)}, "",
                           time.monotonic() - started)

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        started = time.monotonic()
        try:
            swap = self._swap(commit, tags or self.tags.get(commit, ()))
            self.gate(swap)
            artifacts_s = time.monotonic() - started
            self._announce(commit, artifacts_s)
            result = self.run_lifetime(swap, lifetime_id, {}, sequential=False)
        except UntestableError as exc:
            return untestable(commit, lifetime_id, exc, started)
        detail = dict(result.detail)
        detail["timing"] = {**detail.get("timing", {}), "artifacts_s": round(artifacts_s, 3)}
        detail.update(swap_facts(swap))
        return observed(commit, lifetime_id, result, detail, started)

    def boot(
        self, swap: SwapSet, lifetime_id: str, env: Mapping[str, str],
        timing: dict[str, Any] | None = None,
        gpu_lease: Callable[[], AbstractContextManager[str | None]] | None = None,
    ) -> AbstractContextManager[ServerHandle]:
        """One server lifetime on a leased GPU (``gpu_lease``: another pool's, such as the
        controls' own slot); ``timing["gpu_wait_s"]``: how long it waited for that lease,
        ``timing["gpu"]``: which GPU(s) it got."""
        lease = gpu_lease or self.gpu_lease

        @contextmanager
        def _boot() -> Iterator[ServerHandle]:
            asked = time.monotonic()
            with lease() as gpu, contextlib.ExitStack() as running:
                # waiting for a GPU is no part of the lifetime: on the H100 a lifetime said
                # "clean in 148 s" of which 91 s were the controls' server holding the lease
                # (docs/bench/gpu-2026-12-07-h100)
                if timing is not None:
                    timing["gpu_wait_s"] = time.monotonic() - asked
                    timing["gpu"] = gpu
                spec = LifetimeSpec(self.session, lifetime_id, swap, gpu, env, self.log_dir)
                # One server boots on a GPU at a time (until /health), even where several
                # share it: two vLLM servers profiling one GPU at once each count the other's
                # memory as their own (seen on the H200: "Available KV cache memory: -0.67
                # GiB"). The next lifetime's boot still overlaps this one's probe.
                with self.boot_lock(gpu):
                    server = running.enter_context(self.backend.lifetime(spec))
                try:
                    yield server
                finally:
                    # A teardown frees memory, which a neighbour's profile run would count
                    # against itself: vLLM asserts that free memory did not grow while it
                    # profiled ("Error in memory profiling", v0.26
                    # vllm/v1/worker/gpu_worker.py determine_available_memory). So a server
                    # is torn down, like one boots, while no other boots on its GPU.
                    with self.boot_lock(gpu):
                        running.close()

        return _boot()

    def run_lifetime(
        self, swap: SwapSet, lifetime_id: str, env: Mapping[str, str], *, sequential: bool
    ) -> ProbeResult:
        started = time.monotonic()
        waits: dict[str, Any] = {}
        crowding = self.crowding
        with self.boot(swap, lifetime_id, env, waits) as server:
            booted = time.monotonic()
            gpu = waits.get("gpu")
            servers = crowding.sharing(gpu) if crowding is not None else 1
            probe = self.probe_factory(sequential)
            is_alive = getattr(server, "is_alive", None)
            result = probe.run(server, is_alive)
            probed = time.monotonic()
            if crowding is not None:
                servers = max(servers, crowding.sharing(gpu))
            tail = server.log_tail(30)
            backend = _attention_backend(server)
        waited = float(waits.get("gpu_wait_s", 0.0))
        detail = {
            **result.detail,
            **({"attention_backend": backend} if backend else {}),
            "log_tail": tail,
            "lifetime_id": lifetime_id,
            "timing": {
                "gpu_wait_s": round(waited, 3),
                "boot_s": round(booted - started - waited, 3),
                "probe_s": round(probed - booted, 3),
                "teardown_s": round(time.monotonic() - probed, 3),
            },
        }
        message = result.message
        if gpu is not None and crowding is not None:
            detail["gpu"] = {"id": gpu, "servers": servers}
            if short_of_target(result) and crowding.back_off(gpu, servers):
                # a lifetime lost to crowding is a cost: the next ones get fewer neighbours
                detail["gpu"]["backed_off_to"] = servers - 1
                message += (f"; {servers} servers shared GPU {gpu}: it takes at most "
                            f"{servers - 1} lifetimes from now on")
        return ProbeResult(result.verdict, detail, message)


def _attention_backend(server: ServerHandle) -> str | None:
    """The attention backend the server's own log says vLLM chose, for the report (the batch
    invariance of a lifetime depends on it: vllm-facts.md, FLASH_ATTN and TRITON_ATTN)."""
    from bisect_tool.runtime.common import attention_backend

    try:
        text = server.log_path.read_text(errors="replace")
    except OSError:
        return None
    return attention_backend(text)


class ControlsRunner:
    """The positive and negative controls on one candidate (the good end by default)."""

    def __init__(
        self,
        evaluator: ServerEvaluator,
        commit: str,
        invariance_env: str,
        tags: Mapping[str, Sequence[str]],
        attempts: int = 3,
        gpu_lease: Callable[[], AbstractContextManager[str | None]] | None = None,
        suspects: Mapping[str, str] | None = None,
        suspect_lifetimes: int = 2,
        recipe_env: Mapping[str, str] | None = None,
        spread: int = 1,
    ) -> None:
        self.evaluator = evaluator
        self.commit = commit
        self.invariance_env = invariance_env
        self.tags = tags
        self.attempts = attempts
        # [probe] suspects: settings to run the candidate under besides the recipe's own
        self.suspects = dict(suspects or {})
        self.suspect_lifetimes = suspect_lifetimes
        self.recipe_env = dict(recipe_env or {})
        # None: a lifetime's slot, as the lifetimes lease them
        self.gpu_lease = gpu_lease
        # the servers the negative control's requests are dealt over (probes.controls)
        self.spread = spread

    def run(self) -> dict[str, Any]:
        """Up to ``attempts`` lifetimes until the positive control diverges (it may be
        intermittent too), each also running the sequential negative control. The candidate is
        gated first, as every lifetime is: one the pinned stack cannot load, or whose server
        never boots, says so (``untestable``) and the run moves the controls to another."""
        from bisect_tool.probes.controls import ControlsResult, run_controls

        try:
            swap = self.evaluator._swap(self.commit, self.tags.get(self.commit, ()))
            self.evaluator.gate(swap)
        except UntestableError as exc:
            failed = ProbeResult(Verdict.UNTESTABLE, {"stage": untestable_stage(exc)},
                                 f"{short(self.commit)}: {exc}")
            refused = ControlsResult(failed, failed)
            return dict(entries.controls(
                self.commit, False, refused.problem, refused.to_detail(), attempts=0,
                untestable=True,
            ))
        result: ControlsResult | None = None
        tried = 0
        for attempt in range(self.attempts):
            tried += 1
            lid = f"control-{short(self.commit)}-{attempt}"

            def boot(
                env: Mapping[str, str], part: int = 0, lid: str = lid
            ) -> AbstractContextManager[ServerHandle]:
                name = f"{lid}-s{part}" if part else lid
                return self.evaluator.boot(swap, name, env, gpu_lease=self.gpu_lease)

            result = run_controls(self.evaluator.probe_factory, boot, self.invariance_env,
                                  spread=self.spread)
            if result.positive_ok or result.could_not_run:
                break
        assert result is not None
        suspects = None
        if self.suspects and not result.could_not_run:
            suspects = self._suspects(swap)
        return dict(entries.controls(
            self.commit, result.ok, result.problem, result.to_detail(), attempts=tried,
            untestable=result.could_not_run, suspects=suspects,
        ))

    def _suspects(self, swap: SwapSet) -> dict[str, Any]:
        """The candidate under each suspect setting, the invariance switch as the recipe
        sets it: which settings show divergence (``probes.controls.suspect_findings``)."""
        from bisect_tool.probes.controls import run_suspects, suspect_findings

        def boot(env: Mapping[str, str], label: str) -> AbstractContextManager[ServerHandle]:
            lid = f"suspect-{short(self.commit)}-{label}"
            return self.evaluator.boot(swap, lid, env, gpu_lease=self.gpu_lease)

        results = run_suspects(self.evaluator.probe_factory, boot, self.suspects,
                               self.suspect_lifetimes)
        return suspect_findings(results, self.recipe_env, short(self.commit))


# -- built the same way on every backend ----------------------------------------------------


def server_probe_factory(probe: ProbeSettings, model: str | None) -> Callable[[bool], Any]:
    """(sequential) -> the determinism probe of one lifetime (sequential: the negative control),
    of the recipe's ``[probe] mode``."""
    from bisect_tool.probes.batch_sizes import server_probe

    def factory(sequential: bool) -> Any:
        return server_probe(probe, model=model, sequential=sequential)

    return factory


def server_evaluator(
    recipe: Recipe,
    provider: ArtifactProvider,
    backend: RuntimeBackend,
    *,
    session: str,
    log_dir: Path,
    tags: Mapping[str, Sequence[str]],
    gpu_lease: Callable[[], AbstractContextManager[str | None]],
    boot_lock: Callable[[str | None], AbstractContextManager[None]] | None = None,
    observer: Observer = ignore,
    crowding: Crowding | None = None,
) -> ServerEvaluator:
    """Artifacts -> gate -> one lifetime on ``backend`` -> the server probe: the same on every
    backend (a Ray task builds its own on its node with this)."""
    evaluator = ServerEvaluator(
        provider,
        backend,
        server_probe_factory(recipe.probe, recipe.runtime.model or None),
        session=session,
        log_dir=log_dir,
        tags=tags,
        gpu_lease=gpu_lease,
        boot_lock=boot_lock,
        crowding=crowding,
    )
    evaluator.observer = observer
    return evaluator


def controls_runner(
    probe: ProbeSettings, evaluator: Any, commit: str, tags: Mapping[str, Sequence[str]],
    gpu_lease: Callable[[], AbstractContextManager[str | None]] | None = None,
    recipe_env: Mapping[str, str] | None = None,
) -> ControlsRunner:
    """The positive and negative controls on ``commit``, as the recipe asks for them, on
    ``gpu_lease``'s slots (None: the lifetimes'); and its suspects (``[probe] suspects``),
    named against the settings the recipe's lifetimes run with (``recipe_env``)."""
    return ControlsRunner(
        evaluator, commit, probe.invariance_env, tags, attempts=probe.control_attempts,
        gpu_lease=gpu_lease, suspects=probe.suspects, suspect_lifetimes=probe.suspect_lifetimes,
        recipe_env=recipe_env, spread=probe.negative_servers,
    )
