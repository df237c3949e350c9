"""Lifetimes scheduled on a Ray cluster (``--backend ray --ray-address ADDR``).

Each lifetime is one Ray task asking for one GPU (``num_gpus=1``). On whatever node Ray picks, the
task runs the *local* backend and the server probe exactly as a single-host bisect would (the
``ServerEvaluator`` that ``evaluate.server.server_evaluator`` builds there too), and returns
plain values: the observation (its
detail carries the log tail) and where and how long it ran. The driver keeps everything that has
state: the artifact provider (swap sets are built or fetched once, on the driver) and the journal
(written only by the engine, ``bisect_tool.run.engine``).

How a swap set reaches a node: its files' bytes go into Ray's object store (``ray.put``), the
task checks each file's sha256 on arrival and writes it to a node-local content-addressed cache.
When ``[runtime] ray_shared_cache`` names a directory mounted at the same path on every node and
the swap files lie under it, only paths and hashes travel; the node still checks the sha256.

Faults: a worker process or node lost mid-lifetime is retried by Ray (``max_retries``) and, if
that is exhausted, resubmitted by the driver under the *same* lifetime id; only the one returned
value is recorded, and the journal ignores a lifetime id it already holds, so nothing is counted
twice or lost. An infrastructure failure is never a verdict: when every attempt failed the
lifetime raises ``InfrastructureError``. Ctrl-C cancels the outstanding tasks (``ray.cancel``).

Ray is an optional extra; without it ``--backend ray`` is a one-line error naming
``pip install 'bisect-tool[ray]'``. Every node needs bisect-tool and the pinned stack installed at
the paths the recipe names (the same image or venv on every node, as Ray itself requires).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from bisect_tool.errors import (
    AbortError,
    BisectError,
    InfrastructureError,
    UntestableError,
    UsageError,
)
from bisect_tool.evaluate.ray_ship import ShippedSwap, pack_swap, unpack_swap
from bisect_tool.evaluate.server import ServerEvaluator, controls_runner, server_evaluator
from bisect_tool.interfaces import ArtifactProvider, SwapSet
from bisect_tool.recipes.recipe import ProbeSettings, RuntimeSettings
from bisect_tool.values import Observation, Verdict, short

INSTALL_HINT = "pip install 'bisect-tool[ray]'"
#: Ray's own retries of a task whose worker process or node died (system failures only)
TASK_MAX_RETRIES = 2
#: further submissions by the driver when Ray gave up (the cluster may have healed meanwhile)
RESUBMITS = 2
#: swap sets kept in the object store (vLLM's extension is ~hundreds of MB; a few suffice since
#: the search returns to the same candidates)
SHIPPED_KEEP = 8
_POLL_S = 0.25

Progress = Callable[[str], None]


def import_ray() -> ModuleType:
    """The ``ray`` module, or a one-line ``UsageError`` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise UsageError(
            f"--backend ray needs Ray, which is not installed: {INSTALL_HINT}"
        ) from None
    return ray


# ---- the node side (runs inside a Ray task) ----------------------------------------------------


class _Given:
    """An ``ArtifactProvider`` holding the one swap set the task was sent."""

    def __init__(self, swap: SwapSet) -> None:
        self.swap = swap

    def get(self, commit: str, tags: Sequence[str] = ()) -> SwapSet:
        return self.swap

    def prefetch(self, commits: Sequence[str], tags: Mapping[str, Sequence[str]]) -> None:
        return None


_node_backends: dict[tuple[str, str], Any] = {}
_node_lock = threading.Lock()


def _node_evaluator(
    settings: RuntimeSettings, probe: ProbeSettings, session: str, swap: SwapSet
) -> ServerEvaluator:
    """A local ``ServerEvaluator`` on this node, built as on a single host
    (``evaluate.server.server_evaluator``). The backend is kept per worker process: Ray reuses
    workers, so the pinned schema dumps of the compatibility gate are made once."""
    from bisect_tool.recipes.recipe import Recipe
    from bisect_tool.runtime.local import LocalBackend

    log_dir = Path(tempfile.gettempdir()) / "bisect-ray-logs" / session
    log_dir.mkdir(parents=True, exist_ok=True)
    local = dataclasses.replace(settings, backend="local")
    with _node_lock:
        key = (session, repr(local))  # RuntimeSettings holds a dict: not hashable
        backend = _node_backends.get(key)
        if backend is None:
            backend = LocalBackend(local, session=session, log_dir=log_dir)
            _node_backends[key] = backend
    return server_evaluator(
        Recipe("ray-node", runtime=settings, probe=probe),
        _Given(swap),
        backend,
        session=session,
        log_dir=log_dir,
        tags={},
        # Ray already gave this task its GPU through CUDA_VISIBLE_DEVICES; the local backend
        # inherits it when the lease says None.
        gpu_lease=lambda: contextlib.nullcontext(None),
    )


def _where() -> dict[str, Any]:
    import ray

    ctx = ray.get_runtime_context()
    return {
        "node_id": ctx.get_node_id(),
        "gpus": [str(g) for g in ray.get_gpu_ids()],
        "pid": os.getpid(),
    }


def run_lifetime_task(
    settings: RuntimeSettings,
    probe: ProbeSettings,
    session: str,
    lifetime_id: str,
    shipped: ShippedSwap,
) -> dict[str, Any]:
    """The body of one lifetime's Ray task; returns plain values only."""
    started = time.monotonic()
    swap = unpack_swap(shipped)
    obs = _node_evaluator(settings, probe, session, swap).evaluate(shipped.commit, lifetime_id)
    return {
        "verdict": str(obs.verdict),
        "detail": obs.detail,
        "message": obs.message,
        "lifetime_s": round(obs.duration_s, 3),
        "task_body_s": round(time.monotonic() - started, 3),
        "where": _where(),
    }


def run_controls_task(
    settings: RuntimeSettings, probe: ProbeSettings, session: str, shipped: ShippedSwap
) -> dict[str, Any]:
    """The positive and negative controls on one candidate, on one node."""
    swap = unpack_swap(shipped)
    evaluator = _node_evaluator(settings, probe, session, swap)
    # the recipe's control_attempts, as on a single host; the negative control on this task's
    # one GPU (its share over several servers needs GPU slots of the controls' own)
    one = dataclasses.replace(probe, negative_servers=1)
    entry = controls_runner(one, evaluator, shipped.commit, {}, recipe_env=settings.env).run()
    entry["where"] = _where()
    return entry


def cleanup_task(settings: RuntimeSettings, session: str) -> int:
    """Leftovers of this session on one node (servers whose worker died with SIGKILL)."""
    from bisect_tool.runtime.local import LocalBackend

    local = dataclasses.replace(settings, backend="local")
    log_dir = Path(tempfile.gettempdir()) / "bisect-ray-logs" / session
    return LocalBackend(local, session=session, log_dir=log_dir).cleanup_stale(session)


# ---- the driver side ---------------------------------------------------------------------------


def free_gpus(ray: ModuleType) -> int:
    """GPUs free on the cluster now (at least 1 when the cluster has any)."""
    total = int(ray.cluster_resources().get("GPU", 0))
    free = int(ray.available_resources().get("GPU", 0))
    return max(1, min(free, total)) if total else 0


def gpus_per_task(runtime: RuntimeSettings) -> float:
    """The GPUs one lifetime's task asks Ray for: ``gpus_per_lifetime`` whole GPUs of one node
    (a tensor-parallel server), else a share of one where several lifetimes may share a GPU
    (``lifetimes_per_gpu`` = N: 1/N, Ray's fractional GPUs; "auto" cannot read a remote card
    from the driver, so it is one a GPU on Ray)."""
    if runtime.gpus_per_lifetime > 1:
        return float(runtime.gpus_per_lifetime)
    per_gpu = runtime.per_gpu() or 1
    return 1.0 / per_gpu


class RayEvaluator:
    """``Evaluator`` whose lifetimes are Ray tasks. Thread-safe: ``session.Loop`` calls
    ``evaluate`` from several threads at once (``parallel`` of them)."""

    def __init__(
        self,
        provider: ArtifactProvider,
        runtime: RuntimeSettings,
        probe: ProbeSettings,
        *,
        session: str,
        tags: Mapping[str, Sequence[str]],
        ray_module: ModuleType,
        progress: Progress | None = None,
        task_retries: int = TASK_MAX_RETRIES,
        resubmits: int = RESUBMITS,
    ) -> None:
        self.provider = provider
        self.runtime = runtime
        self.probe = probe
        self.session = session
        self.tags = tags
        self.ray = ray_module
        self.progress = progress or (lambda _msg: None)
        self.resubmits = resubmits
        # SPREAD: lifetimes gain nothing from sharing a node, and spreading them keeps a single
        # node's loss from taking most of the lifetimes in flight.
        self.task_gpus = gpus_per_task(runtime)
        self._lifetime = ray_module.remote(run_lifetime_task).options(
            num_gpus=self.task_gpus,
            max_retries=task_retries,
            retry_exceptions=False,
            scheduling_strategy="SPREAD",
        )
        self._controls = ray_module.remote(run_controls_task).options(
            num_gpus=self.task_gpus, max_retries=task_retries, retry_exceptions=False
        )
        self.shipped = 0  # swap sets put in the object store (each commit once, while kept)
        self._shipped: OrderedDict[str, Any] = OrderedDict()  # commit -> ObjectRef
        self._ship_turns: dict[str, threading.Lock] = {}  # one put of a commit at a time
        self._lock = threading.Lock()
        self._outstanding: set[Any] = set()
        self._cancelled = threading.Event()

    @property
    def parallel(self) -> int:
        """Lifetimes the cluster runs at once now: its free GPUs over what each task asks."""
        return max(1, int(free_gpus(self.ray) / self.task_gpus + 1e-9))

    # -- Evaluator --------------------------------------------------------------------------------

    def prepare(self, commits: Sequence[str]) -> None:
        self.provider.prefetch(commits, {c: self.tags.get(c, ()) for c in commits})

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        started = time.monotonic()
        try:
            swap = self.provider.get(commit, tags or self.tags.get(commit, ()))
        except UntestableError as exc:
            return Observation(
                commit, Verdict.UNTESTABLE, lifetime_id, {}, str(exc), time.monotonic() - started
            )
        artifacts_s = time.monotonic() - started
        result, attempts, task_s = self._submit(
            swap,
            lambda ref: self._lifetime.remote(
                self.runtime, self.probe, self.session, lifetime_id, ref
            ),
            f"lifetime {lifetime_id}",
        )
        detail = dict(result["detail"])
        timing = dict(detail.get("timing", {}))
        timing["artifacts_s"] = round(artifacts_s, 3)
        # What Ray adds per lifetime: submit -> result on the driver, minus the lifetime itself.
        timing["task_s"] = round(task_s, 3)
        timing["schedule_s"] = round(task_s - float(result["lifetime_s"]), 3)
        detail["timing"] = timing
        detail["ray"] = {**result["where"], "attempts": attempts}
        return Observation(
            commit,
            Verdict(result["verdict"]),
            lifetime_id,
            detail,
            result["message"],
            time.monotonic() - started,
        )

    # -- controls ---------------------------------------------------------------------------------

    def controls_for(self, commit: str) -> _RayControls:
        return _RayControls(self, commit)

    def run_controls(self, commit: str) -> dict[str, Any]:
        swap = self.provider.get(commit, self.tags.get(commit, ()))
        entry, _attempts, _task_s = self._submit(
            swap,
            lambda ref: self._controls.remote(self.runtime, self.probe, self.session, ref),
            f"controls on {short(commit)}",
        )
        entry.pop("where", None)
        return entry

    # -- submission, faults, cancel ---------------------------------------------------------------

    def _ship(self, swap: SwapSet, fresh: bool = False) -> Any:
        """The swap set's object in the store, put once however many lifetimes of the commit
        start at once (the confirm step starts several of one side together; each put of vLLM's
        extension is hundreds of MB); Ray hands it to each node once, and the node keeps the
        files in its content-addressed cache (``ray_ship.unpack_swap``). ``fresh``: put again
        (a resubmission after the object was lost)."""
        with self._lock:
            turn = self._ship_turns.setdefault(swap.commit, threading.Lock())
        with turn:
            with self._lock:
                ref = None if fresh else self._shipped.get(swap.commit)
                if ref is not None:
                    self._shipped.move_to_end(swap.commit)
                    return ref
            ref = self.ray.put(pack_swap(swap, self.runtime.ray_shared_cache))
            with self._lock:
                self.shipped += 1
                self._shipped[swap.commit] = ref
                while len(self._shipped) > SHIPPED_KEEP:
                    self._shipped.popitem(last=False)
            return ref

    def _submit(
        self, swap: SwapSet, submit: Callable[[Any], Any], what: str
    ) -> tuple[dict[str, Any], int, float]:
        """Run a task to its result; infrastructure failures are retried, never verdicts."""
        ray = self.ray
        problems: list[str] = []
        for attempt in range(1, self.resubmits + 2):
            if self._cancelled.is_set():
                raise AbortError(f"{what} cancelled")
            ref = submit(self._ship(swap, fresh=attempt > 1))
            submitted = time.monotonic()
            with self._lock:
                self._outstanding.add(ref)
            try:
                while not ray.wait([ref], timeout=_POLL_S)[0]:
                    if self._cancelled.is_set():
                        raise AbortError(f"{what} cancelled")
                return ray.get(ref), attempt, time.monotonic() - submitted
            except ray.exceptions.TaskCancelledError:
                raise AbortError(f"{what} cancelled") from None
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, BisectError) and not isinstance(cause, InfrastructureError):
                    raise cause from None  # e.g. AbortError from the probe: the user's to see
                problems.append(_first_line(cause or exc))
            except ray.exceptions.RayError as exc:
                # Worker or node died (Ray's own retries exhausted), object lost, ...
                problems.append(_first_line(exc))
            except BaseException:
                ray.cancel(ref, force=True)  # Ctrl-C on the thread that waits
                raise
            finally:
                with self._lock:
                    self._outstanding.discard(ref)
            self.progress(f"{what}: attempt {attempt} failed on the Ray cluster: {problems[-1]}")
        raise InfrastructureError(
            f"{what} failed on the Ray cluster {len(problems)} times (last: {problems[-1]}); "
            "check `ray status`, then `bisect resume`"
        )

    def cancel(self) -> int:
        """Cancel every outstanding task (Ctrl-C); how many there were."""
        self._cancelled.set()
        with self._lock:
            refs = list(self._outstanding)
        for ref in refs:
            with contextlib.suppress(Exception):
                self.ray.cancel(ref, force=True)
        return len(refs)

    def cleanup_nodes(self) -> int:
        """Leftovers of this session on every alive node (best effort)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = self.ray.remote(cleanup_task)
        refs = [
            task.options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
            ).remote(self.runtime, self.session)
            for node in self.ray.nodes()
            if node.get("Alive")
        ]
        ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=30)
        count = 0
        for ref in ready:
            with contextlib.suppress(Exception):
                count += int(self.ray.get(ref))
        return count


class _RayControls:
    def __init__(self, evaluator: RayEvaluator, commit: str) -> None:
        self.evaluator = evaluator
        self.commit = commit

    def run(self) -> dict[str, Any]:
        return self.evaluator.run_controls(self.commit)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def connect(ray: ModuleType, address: str) -> None:
    """Join the cluster at ``address`` (``auto``: the one this machine runs); one-line errors."""
    try:
        ray.init(
            address=address,
            logging_level=logging.ERROR,
            log_to_driver=False,  # the lifetimes' output goes to their log files, not the CLI
            include_dashboard=False,
            configure_logging=True,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise InfrastructureError(
            f"cannot join the Ray cluster at {address}: {_first_line(exc)}; start one with "
            "`ray start --head --num-gpus N` or give --ray-address HOST:PORT"
        ) from None


@contextlib.contextmanager
def ray_evaluator(
    provider: ArtifactProvider,
    recipe: Any,
    *,
    session: str,
    tags: Mapping[str, Sequence[str]],
    progress: Progress | None = None,
    ray_module: ModuleType | None = None,
) -> Iterator[RayEvaluator]:
    """Connected to the recipe's cluster; on exit the outstanding tasks are cancelled, this
    session's leftovers removed from every node, and the driver disconnected."""
    ray = ray_module or import_ray()
    address = recipe.runtime.ray_address or os.environ.get("RAY_ADDRESS", "") or "auto"
    if not ray.is_initialized():
        connect(ray, address)
    try:
        if not ray.cluster_resources().get("GPU", 0):
            raise InfrastructureError(
                f"the Ray cluster at {address} has no GPUs; start its nodes with "
                "`ray start --num-gpus N`"
            )
        evaluator = RayEvaluator(
            provider,
            recipe.runtime,
            recipe.probe,
            session=session,
            tags=tags,
            ray_module=ray,
            progress=progress,
        )
        try:
            yield evaluator
        finally:
            evaluator.cancel()
            with contextlib.suppress(Exception):
                evaluator.cleanup_nodes()
    finally:
        ray.shutdown()
