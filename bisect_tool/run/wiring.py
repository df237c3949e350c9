"""One wiring: a recipe in, the evaluators it describes out.

Every run that evaluates candidates gets its evaluators here, and only here: ``bisect start``/
``resume`` and ``bisect probe --commit`` (``open_evaluators``), ``bisect locate`` (one set per
Python side, sharing one artifact provider and one GPU pool), and each Ray task on its node
(``server_evaluator`` and ``controls_runner``). So the controls honour the recipe's
``control_attempts`` on every backend, and a lifetime is booted the same way everywhere.

A probe kind (``[probe] kind``, its spec in ``bisect_tool.kinds``) is one factory in ``PROBES``,
and a kind that may narrow (``[probe] narrow``) one more in ``NARROW``; both are keyed by the
kinds' names, read from their specs (``tests/test_architecture.py`` holds them to
``bisect_tool.kinds.KINDS``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_tool.errors import RecipeError
from bisect_tool.evaluate.server import controls_runner, server_evaluator
from bisect_tool.events import Note, Observer, ignore, notes_to
from bisect_tool.interfaces import ArtifactProvider, Evaluator, SwapSet
from bisect_tool.kinds import find as spec_of
from bisect_tool.kinds import op as op_kind
from bisect_tool.kinds import server as server_kind
from bisect_tool.range.newer_tests import NewerTests
from bisect_tool.recipes.recipe import ProbeSettings, Recipe, RuntimeSettings
from bisect_tool.run.engine import ControlsFor, ControlsRunner, no_controls
from bisect_tool.runtime.gpus import GpuPool, profiles_free_memory
from bisect_tool.runtime.sizing import ReadCards, read_cards, size
from bisect_tool.strategy.tiers import Tier

if TYPE_CHECKING:
    from bisect_tool.artifacts.provider import CachingProvider


@dataclass(frozen=True)
class Evaluators:
    """What a recipe's run evaluates with: its own probe (``faithful``), the fast stand-in that
    narrows first (``narrow``, for ``[probe] narrow``), how many lifetimes run at once, and a
    factory for the controls runner of a commit (``no_controls``: this probe has none);
    ``controls_beside``: the controls' servers have GPU slots of their own, beside the
    ``parallel`` lifetimes' (``[runtime] controls_own_slot``)."""

    faithful: Evaluator
    parallel: int = 1
    controls_for: ControlsFor = no_controls
    narrow: Evaluator | None = None
    controls_beside: bool = False
    #: how many lifetimes may run at once now, at most ``parallel`` (the GPU pool's size falls
    #: when a card backs off: ``GpuPool.back_off``); None: always ``parallel``
    capacity: Callable[[], int] | None = None

    @property
    def has_controls(self) -> bool:
        return self.controls_for is not no_controls

    def arms(self) -> dict[str, Evaluator]:
        """The evaluators by the name a design's items give (``designs.bisect``)."""
        arms = {str(Tier.FAITHFUL): self.faithful}
        if self.narrow is not None:
            arms[str(Tier.NARROW)] = self.narrow
        return arms


@dataclass(frozen=True)
class Wiring:
    """What every probe factory is given."""

    recipe: Recipe
    provider: ArtifactProvider
    repo: Path  # the clone (a run without one: the state dir)
    state_dir: Path
    session: str
    tags: Mapping[str, Sequence[str]]
    observer: Observer = ignore
    pool: GpuPool | None = None  # shared by several sets of evaluators (bisect locate)

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"


ProbeFactory = Callable[[Wiring], AbstractContextManager[Evaluators]]
#: what ``open_evaluators`` is: (recipe, repo, session, state dir, tags, observer) -> the
#: evaluators, closed on exit (tests give the run owner and ``probe --commit`` their own)
EvaluatorFactory = Callable[
    [Recipe, Path, str, Path, Mapping[str, Sequence[str]], Observer],
    AbstractContextManager[Evaluators],
]
#: a fast stand-in: (wiring, the faithful tier's compatibility gate or None) -> its evaluator
NarrowFactory = Callable[[Wiring, Callable[[SwapSet], None] | None], Evaluator]


# -- the pieces ----------------------------------------------------------------------------------


def op_evaluator(
    w: Wiring, gate: Callable[[SwapSet], None] | None = None
) -> Evaluator:
    """The focused op check on each candidate's extension, under the pinned interpreter; as a
    fast stand-in it also asks ``gate`` whether the faithful tier could run the candidate."""
    from bisect_tool.evaluate import OpEvaluator
    from bisect_tool.probes.op import OpProbe

    op = OpProbe(w.recipe.probe, python=w.recipe.runtime.python or None)
    evaluator = OpEvaluator(w.provider, op, w.recipe.runtime.env, w.tags, gate=gate)
    evaluator.observer = w.observer
    return evaluator


# -- the probe kinds ------------------------------------------------------------------------------


class _Releasing:
    """A controls runner that gives back, when it ends, the GPU room ``reserve_controls`` kept
    for its servers."""

    def __init__(self, runner: ControlsRunner, pool: GpuPool) -> None:
        self.runner, self.pool = runner, pool

    def run(self) -> Mapping[str, Any]:
        try:
            return self.runner.run()
        finally:
            self.pool.release_controls()


@contextmanager
def _server(w: Wiring) -> Iterator[Evaluators]:
    runtime = w.recipe.runtime
    if runtime.backend == "ray":
        with _ray(w) as evaluators:
            yield evaluators
        return
    from bisect_tool.runtime import make_backend

    backend = make_backend(runtime, session=w.session, log_dir=w.log_dir)
    try:
        backend.cleanup_stale(w.session)
        pool = w.pool or gpu_pool(runtime, w.recipe.probe)
        turns = pool.booting if profiles_free_memory(runtime.server_args) else None
        evaluator = server_evaluator(
            w.recipe, w.provider, backend, session=w.session, log_dir=w.log_dir, tags=w.tags,
            gpu_lease=pool.lease, boot_lock=turns, observer=w.observer, crowding=pool,
        )

        def controls_for(commit: str) -> ControlsRunner:
            pool.reserve_controls()
            return _Releasing(controls_runner(w.recipe.probe, evaluator, commit, w.tags,
                                              gpu_lease=pool.controls_lease,
                                              recipe_env=runtime.env), pool)

        # The fast stand-in runs on the same artifacts (one cache). It also asks the gate
        # whether the faithful tier could run each candidate, so the confirm step never picks
        # one the pinned stack rejects.
        narrow = _narrow(w, backend.check_compatible)
        yield Evaluators(evaluator, pool.size, controls_for, narrow,
                         controls_beside=runtime.controls_own_slot,
                         capacity=lambda: pool.size)
    finally:
        backend.close()


def gpu_pool(runtime: RuntimeSettings, probe: ProbeSettings | None = None) -> GpuPool:
    """The GPU slots a run's servers lease: ``lifetimes_per_gpu`` on each GPU, and where
    ``controls_own_slot`` asks for them, slots of the controls' own: as many as the servers
    their negative control is spread over (``[probe] negative_servers``)."""
    return GpuPool(runtime.gpus, per_gpu=runtime.per_gpu() or 1,
                   controls_slot=runtime.controls_own_slot,
                   controls_servers=probe.negative_servers if probe is not None else 1,
                   width=runtime.gpus_per_lifetime if runtime.gpus else 1,
                   most_servers=runtime.most_servers_per_gpu)


@contextmanager
def _ray(w: Wiring) -> Iterator[Evaluators]:
    """Lifetimes as Ray tasks (as many at once as the cluster has free GPUs); the fast probe
    runs here, on the driver, on the same artifacts."""
    from bisect_tool.evaluate.ray import ray_evaluator

    progress = notes_to(w.observer)
    with ray_evaluator(
        w.provider, w.recipe, session=w.session, tags=w.tags, progress=progress
    ) as evaluator:
        narrow = _narrow(w, None)
        if narrow is not None:
            progress("the op check narrows here, on the driver; lifetimes run on Ray")
        yield Evaluators(evaluator, evaluator.parallel, evaluator.controls_for, narrow)


@contextmanager
def _op(w: Wiring) -> Iterator[Evaluators]:
    yield Evaluators(op_evaluator(w))


def command_evaluator(
    command: str, timeout_s: float, *, repo: Path, state_dir: Path, session: str,
    observer: Observer = ignore, test_from: NewerTests | None = None,
) -> Evaluator:
    """``bisect start --run CMD``: the command in a worktree of each candidate (with a newer
    commit's test files in it: ``--test-from``)."""
    from bisect_tool.evaluate import RunCommandEvaluator

    return RunCommandEvaluator(
        repo, command, timeout_s, state_dir=state_dir, session=session,
        progress=notes_to(observer), test_from=test_from,
    )


PROBES: dict[str, ProbeFactory] = {
    server_kind.SPEC.name: _server,
    op_kind.SPEC.name: _op,
}
NARROW: dict[str, NarrowFactory] = {op_kind.SPEC.name: op_evaluator}


def _narrow(w: Wiring, gate: Callable[[SwapSet], None] | None) -> Evaluator | None:
    kind = w.recipe.probe.narrow
    if not kind:
        return None
    factory = NARROW.get(kind)
    if factory is None:
        raise RecipeError(f"unknown [probe] narrow {kind!r}; one of: {', '.join(NARROW)}")
    return factory(w, gate)


def probe_factory(recipe: Recipe) -> ProbeFactory:
    factory = PROBES.get(recipe.probe.kind)
    if factory is None:
        raise RecipeError(
            f"unknown [probe] kind {recipe.probe.kind!r} in recipe {recipe.name!r}; one of: "
            + ", ".join(PROBES)
        )
    return factory


# -- open ------------------------------------------------------------------------------------------


@contextmanager
def open_compiled(
    recipe: Recipe, repo: Path, *, log_dir: Path, session: str, observer: Observer = ignore
) -> Iterator[CachingProvider]:
    """The provider of the recipe's compiled files (its swap set), whatever its Python side."""
    from bisect_tool.artifacts import make_provider

    with make_provider(
        recipe.artifacts, repo, log_dir=log_dir, progress=notes_to(observer), session=session,
        runtime=recipe.runtime, mainline=recipe.range.mainline,
    ) as provider:
        yield provider


@contextmanager
def open_provider(
    recipe: Recipe, repo: Path, *, log_dir: Path, session: str, observer: Observer = ignore
) -> Iterator[ArtifactProvider]:
    with open_compiled(
        recipe, repo, log_dir=log_dir, session=session, observer=observer
    ) as provider:
        if recipe.artifacts.python_side == "candidate":
            # whole commits: each candidate's own package with its compiled files (issue 40)
            from bisect_tool.artifacts.whole import WholeCommitProvider

            yield WholeCommitProvider(provider, provider.cache, repo, recipe.artifacts.package)
            return
        yield provider


@contextmanager
def open_evaluators(
    recipe: Recipe,
    repo: Path,
    session: str,
    state_dir: Path,
    tags: Mapping[str, Sequence[str]],
    observer: Observer = ignore,
) -> Iterator[Evaluators]:
    """The evaluators a recipe describes, with everything they opened closed on exit."""
    from bisect_tool.runtime.weights import resolve_weights

    log_dir = state_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    recipe = tensor_parallel(sized(resolve_weights(recipe, progress=notes_to(observer)),
                                   observer))
    factory = probe_factory(recipe)
    with open_provider(
        recipe, repo, log_dir=log_dir, session=session, observer=observer
    ) as provider, factory(
        Wiring(recipe, provider, repo, state_dir, session, tags, observer)
    ) as evaluators:
        yield evaluators


@contextmanager
def open_sides(
    recipes: Mapping[str, Recipe],
    provider: ArtifactProvider,
    *,
    repo: Path,
    state_dir: Path,
    session: str,
    tags: Mapping[str, Sequence[str]],
    observer: Observer = ignore,
) -> Iterator[tuple[dict[str, Evaluators], int]]:
    """One set of evaluators per named recipe (``bisect locate``: one per Python side), sharing
    ``provider`` and one GPU pool; and how many lifetimes may run at once over them all."""
    first = tensor_parallel(sized(next(iter(recipes.values())), observer))
    recipes = {name: replace(recipe, runtime=replace(
        recipe.runtime, lifetimes_per_gpu=first.runtime.lifetimes_per_gpu,
        server_args=first.runtime.server_args, env=first.runtime.env,
        controls_own_slot=first.runtime.controls_own_slot)) for name, recipe in recipes.items()}
    pool = gpu_pool(first.runtime, first.probe)
    with contextlib.ExitStack() as stack:
        sides = {
            name: stack.enter_context(probe_factory(recipe)(
                Wiring(recipe, provider, repo, state_dir, session, tags, observer, pool)
            ))
            for name, recipe in recipes.items()
        }
        yield sides, pool.size


#: what vLLM's batch-invariance mode sets in its own environment (vllm/model_executor/layers/
#: batch_invariant.py, override_envs_for_invariance): NCCL's tree all-reduce with the Simple
#: protocol on one channel, no symmetric-memory all-reduce, a fixed cuBLAS workspace. A
#: tensor-parallel lifetime gets them in its environment from the start, whatever its switch:
#: the controls' servers run with the switch off, where vLLM sets none of them, and a release
#: older than the override sets none either; so every lifetime of a run reduces the same way,
#: and only the kernels under test differ. The recipe's own [runtime.env] wins.
TP_DETERMINISM_ENV = {
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "NCCL_LAUNCH_MODE": "GROUP",
    "NCCL_COLLNET_ENABLE": "0",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_P2P_NET_DISABLE": "1",
    "NCCL_MIN_NCHANNELS": "1",
    "NCCL_MAX_NCHANNELS": "1",
    "NCCL_PROTO": "Simple",
    "NCCL_ALGO": "allreduce:tree",
    "NCCL_NTHREADS": "1",
    "NCCL_SOCKET_NTHREADS": "1",
}
TP_FLAG = "--tensor-parallel-size"


def tensor_parallel(recipe: Recipe) -> Recipe:
    """``[runtime] gpus_per_lifetime`` > 1: each server is told its tensor-parallel size (unless
    its server_args say one) and keeps the NCCL settings of vLLM's batch-invariance mode
    (``TP_DETERMINISM_ENV``)."""
    runtime = recipe.runtime
    width = runtime.gpus_per_lifetime
    if width <= 1 or not spec_of(recipe.probe.kind).boots_server:
        return recipe
    args = list(runtime.server_args)
    if not any(a == TP_FLAG or a.startswith(TP_FLAG + "=") for a in args):
        args += [TP_FLAG, str(width)]
    env = {**TP_DETERMINISM_ENV, **runtime.env}
    return replace(recipe, runtime=replace(runtime, server_args=tuple(args), env=env))


def sized(recipe: Recipe, observer: Observer = ignore, read: ReadCards = read_cards) -> Recipe:
    """``[runtime] lifetimes_per_gpu = "auto"`` settled for this run: from the listed GPUs' free
    memory where server lifetimes lease them (``runtime.sizing``: each server told its KV cache
    size, the controls given slots of their own where the card holds them), else one a GPU (no
    GPUs listed, Ray, a probe that boots no server, a card whose memory cannot be read). The
    journal keeps "auto": a resumed run sizes again from what is free then."""
    runtime = recipe.runtime
    if runtime.per_gpu() is not None:
        return recipe
    one = replace(recipe, runtime=replace(runtime, lifetimes_per_gpu=1))
    if not runtime.gpus or runtime.backend == "ray" or not spec_of(recipe.probe.kind).boots_server:
        return one
    env = dict(runtime.env)
    if runtime.pinned_package_dir:
        env["PYTHONPATH"] = runtime.pinned_package_dir
    found = size(runtime, recipe.probe, read(runtime.gpus, runtime.interpreter(), env))
    if found is None:
        observer(Note('lifetimes_per_gpu = "auto": the GPUs\' memory could not be read (no '
                      "nvidia-smi, no torch.cuda under the pinned interpreter): one lifetime a "
                      "GPU"))
        return one
    observer(Note(f'lifetimes_per_gpu = "auto": {found.why}'))
    return replace(recipe, runtime=replace(
        runtime, lifetimes_per_gpu=found.per_gpu, server_args=found.server_args(
            runtime.server_args),
        controls_own_slot=runtime.controls_own_slot or found.controls_own_slot,
        most_servers_per_gpu=runtime.most_servers_per_gpu or found.most_servers))


def side_recipe(recipe: Recipe, pinned_package_dir: Path) -> Recipe:
    """``recipe`` with its pinned stack's package taken from ``pinned_package_dir``."""
    runtime = replace(recipe.runtime, pinned_package_dir=str(pinned_package_dir))
    return replace(recipe, runtime=runtime)
