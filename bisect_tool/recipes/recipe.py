"""Recipes: TOML files that describe one kind of bisect (what to swap, how to boot, what to probe).

Validated strictly: an unknown key, a wrong type or a missing field is a one-line ``RecipeError``
naming the key and the file. Bundled recipes live in ``bisect_tool/recipes/`` (``--recipe NAME``);
a path works too. CLI flags override recipe values through :func:`Recipe.override`.
"""

from __future__ import annotations

import dataclasses
import sys
import tomllib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_tool.errors import RecipeError
from bisect_tool.kinds import DEFAULT as DEFAULT_KIND
from bisect_tool.recipes.tomlvalues import check_value, did_you_mean

BUNDLED_DIR = Path(__file__).parent


@dataclass(frozen=True)
class RangeSettings:
    # Only commits touching these paths are candidates (extension-swap mode): a commit that
    # changes only Python cannot change the swapped compiled files.
    paths: tuple[str, ...] = ()
    # How a release's tag is spelled in the repository (release-level search goes on to the
    # commits between two adjacent releases through these tags).
    release_tag: str = "v{version}"
    # The main line releases branch from ("origin/main"; "" = the remote's main, else main):
    # release tags map to where their branch left it, and its commits alone have per-commit
    # wheels (vLLM #16217). `--mainline` overrides it.
    mainline: str = ""


@dataclass(frozen=True)
class ArtifactSettings:
    # Tried in order; each gives the candidate's files or says "unavailable" (untestable).
    sources: tuple[str, ...] = ("wheel-index", "release", "local", "source-build")
    swap_set: tuple[str, ...] = ()
    package: str = "vllm"
    # The simple index (PEP 503/691) release wheels come from; "" = the one pip is configured
    # with ($PIP_INDEX_URL, pip.conf), else PyPI.
    index_url: str = ""
    wheel_index_url: str = "https://wheels.vllm.ai"
    variant: str = ""
    local_paths: dict[str, str] = field(default_factory=dict)  # commit or tag -> wheel or dir
    build_executor: str = "docker"  # "docker" (Dockerfile.base builder stage) or "host"
    build_command: str = ""  # run in the candidate's worktree; must produce the swap set
    build_image: str = ""
    # A build that hangs (a stuck compiler, a lock) must not stall the bisect: past this many
    # seconds it is killed and the candidate is untestable. A cold vLLM build with MAX_JOBS=2
    # takes hours; ccache makes later ones minutes.
    build_timeout_s: int = 4 * 3600
    arch_list: str = "9.0"
    max_jobs: int = 2
    cache_dir: str = ""  # default: $BISECT_CACHE_DIR, else the user cache dir (platformdirs)
    cache_max_bytes: int = 20 * 1024**3
    # "pinned": candidates swap their compiled files over the pinned Python side; "candidate":
    # each candidate runs its own Python package (git archive of the commit) with its own
    # compiled files, as a VLLM_USE_PRECOMPILED build does (bisect_tool/artifacts/whole.py):
    # a bisect of whole commits, for a change on the Python side (needs a clone)
    python_side: str = "pinned"
    # Candidates fetched or built ahead of the one the next decision needs (--prefetch K); a
    # run then builds at most K more than it runs. -1: the run chooses from its measured costs
    # (0 for source builds on the machine the probe keeps busy; bisect_tool/strategy/lookahead.py).
    prefetch: int = -1


@dataclass(frozen=True)
class RuntimeSettings:
    backend: str = "local"  # "local", "docker" or "ray"
    image: str = ""  # docker: the pinned image
    # The interpreter of the pinned stack ("" = not named: the tool's own interpreter for the
    # local and ray backends, the image's python3 in a container; see ``interpreter``).
    python: str = ""
    pinned_package_dir: str = ""  # where the pinned package lives ("" = import it and ask)
    server_module: str = ""  # e.g. "vllm.entrypoints.openai.api_server"
    server_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    model: str = ""  # local model path or name passed with --model
    model_cache: str = ""  # mounted read-only into containers
    weights: str = ""  # "random:CONFIG" makes a random checkpoint; a dir uses it; "" = server args
    gpus: tuple[str, ...] = ()
    # GPUs of one host a lifetime takes: vLLM's tensor-parallel size (--tensor-parallel-size is
    # passed, and the NCCL settings vLLM's batch-invariance mode sets are kept in every
    # lifetime's environment: bisect_tool/run/wiring.py, TP_DETERMINISM_ENV). The bugs that live
    # only
    # with TP (vLLM #51290, #50136, #56370) need 2 or more; list at least as many GPUs.
    gpus_per_lifetime: int = 1
    # The compatibility gate compares these ops only ("_C::rms_norm" or "rms_norm"; empty: every
    # op the pinned extension registers). For a crossing of two releases (`bisect locate`),
    # where the newer Python registers ops the older extension lacks but this workload never
    # calls; an op the workload does call and the gate skipped fails its lifetime instead.
    gate_ops: tuple[str, ...] = ()
    # lifetimes that may share one GPU at once. "auto": as many as the card's free memory holds
    # with the KV cache the probe needs, each server told its KV cache size and memory share
    # (--kv-cache-memory-bytes, --gpu-memory-utilization), at most 6 until a lifetime that
    # misses the probe's co-residency lowers it (bisect_tool/runtime/sizing.py). A number:
    # that many (each server then needs its own share of the memory in server_args; they boot
    # and are torn down one at a time unless server_args fix the KV cache's size, which spares
    # vLLM its free-memory profile: bisect_tool/runtime/gpus.py)
    lifetimes_per_gpu: int | str = "auto"
    # the controls' server on a GPU slot of its own, beside the lifetimes' slots (on the first
    # GPU), so the confirm step keeps all of them: on the H100 the controls held one of two
    # slots for 259 s and the lifetimes ran one at a time (docs/bench/gpu-2026-12-07-h100).
    # That GPU then holds one server more: give each its share (--kv-cache-memory-bytes)
    controls_own_slot: bool = False
    # the most servers one GPU holds at once, lifetimes and the controls' together (0: no
    # ceiling but lifetimes_per_gpu); "auto" sets the H100's knee, 8 (runtime/sizing.py)
    most_servers_per_gpu: int = 0
    shm_size: str = "8g"
    # docker: how a container gets its GPU: "toolkit" (a device request; needs the NVIDIA
    # container toolkit), "devices" (the /dev/nvidia* nodes and the driver libraries found on
    # this host, mounted read-only) or "auto" (toolkit if present, else devices if a driver is)
    docker_gpu: str = "auto"
    boot_timeout_s: float = 600.0
    ray_address: str = ""
    # ray: a directory mounted at the same path on every node; swap files under it travel as
    # paths (checked by sha256 on the node) instead of through Ray's object store
    ray_shared_cache: str = ""

    def per_gpu(self) -> int | None:
        """``lifetimes_per_gpu`` as a number; None for "auto" (sized when the run starts)."""
        value = self.lifetimes_per_gpu
        return value if isinstance(value, int) else None

    def interpreter(self) -> str:
        """The interpreter lifetimes, gate checks and the environment facts run under: the one
        the recipe or --python names, else the tool's own (``sys.executable``), never whatever
        ``python3`` is first on PATH (one without numpy made every demo lifetime UNTESTABLE);
        in a container, the image's ``python3``."""
        if self.python:
            return self.python
        return "python3" if self.backend == "docker" else sys.executable


@dataclass(frozen=True)
class ProbeSettings:
    # a name in bisect_tool.kinds.KINDS: "server" (determinism across repeats), "op" (focused
    # kernel)
    kind: str = DEFAULT_KIND
    requests: int = 31
    fillers: int = 13
    prefix_tokens: int = 16
    prompt_tokens: int = 24  # per request, after the shared prefix
    filler_tokens: int = 16
    vocab_size: int = 151_936
    repeats: int = 5
    max_tokens: int = 24
    logprobs: int = 5
    seed: int = 0
    jitter_ms: float = 40.0  # random submission delay per request: varies how steps form
    # What a lifetime compares: "repeats" (vLLM #51187's: repeats of one concurrent workload,
    # every pair bitwise) or "bs1-vs-bsN" (vLLM's own definition, tests/v1/determinism/
    # test_online_batch_invariance.py: each prompt alone against itself in a batch of N)
    mode: str = "repeats"
    # bs1-vs-bsN: the batch sizes N, each the first N prompts of the workload (empty: all of
    # them), and how many of a batch's prompts are also sent alone and compared (0: every one;
    # 1: vLLM's "needle", a request alone against itself in batches of 17 and 65)
    batch_sizes: tuple[int, ...] = ()
    needles: int = 0
    # The first requests after start-up, sent alone before the workload and again after it,
    # reported apart: graph capture and JIT warm-up make them differ (vLLM #33537), which is
    # not the bug; 0: none
    warmup_requests: int = 0
    # A prompt the workload never sends, sent alone twice after it: prefix caching cold, then
    # warm (vLLM #40896, #42019), reported apart
    prefix_cache_check: bool = False
    target_coresidency: int = 0  # lifetimes that never reach it are INCONCLUSIVE (0: M + F)
    invariance_env: str = "VLLM_BATCH_INVARIANT"
    request_timeout_s: float = 120.0
    controls: bool = True
    # The positive control can be as intermittent as the bug: up to this many lifetimes until it
    # diverges (each also runs the negative control).
    control_attempts: int = 3
    # The controls also run their candidate under each of these settings of [runtime.env]
    # besides the recipe's own, each value in its own `suspect_lifetimes` lifetimes, and say
    # which settings show divergence: VLLM_USE_FLASHINFER_SAMPLER = "0,1" tells the sampler
    # from the kernels (vLLM #51187's reporters saw the divergence go with it at 0).
    suspects: dict[str, str] = field(default_factory=dict)
    suspect_lifetimes: int = 2
    # Servers the negative control's requests are dealt over, booted at once (each request is
    # still sent alone and compared with itself over the repeats, on one server): its pass of
    # every request one at a time took 119 s on the H100, the longest thing in the run
    # (bisect_tool/probes/controls.py)
    negative_servers: int = 1
    # A fast stand-in probe to narrow the range with before this probe confirms the flip on
    # both sides of it ("" = none; "op": the op check below on each candidate's extension).
    # See bisect_tool/strategy/tiers.py.
    narrow: str = ""
    # git bisect's contract (``--deterministic``): the probe gives a candidate the same answer
    # every run, so each candidate runs once, at most ceil(log2 N) + 2 runs in all; a run that
    # contradicts itself (one candidate both ways, or the ends) stops with exit 9.
    deterministic: bool = False
    # What the issue being bisected reported, in words; the report compares what the lifetimes
    # showed with it (e.g. "different logprobs across repeats at ~44 co-resident sequences").
    reported_symptom: str = ""
    # op probe
    ops: tuple[str, ...] = ("rms_norm", "fused_add_rms_norm")
    # checked where the candidate registers them, named as not registered where it does not
    # (vLLM's quantized RMSNorm ops, #48997, are not in every release's _C)
    optional_ops: tuple[str, ...] = ()
    op_namespace: str = "_C"
    dtypes: tuple[str, ...] = ("float16",)
    hidden_sizes: tuple[int, ...] = (512, 4096)
    seeds: int = 16
    row_counts: tuple[int, int] = (255, 300)
    # How the op check calls the ops: "torch" loads a vLLM extension into PyTorch
    # (torch.ops.<op_namespace>.<op>); "ctypes" loads a plain C library that declares the same
    # schemas through bisect_op_schemas() and takes float32 rows (the demo's demollm/_kernels.so),
    # with no torch in the child at all.
    op_abi: str = "torch"
    # Read by no probe: the keys of a `[probe] kind = "run"` that recipe validation always
    # refused (a command is `bisect start --run`); kept so every journal's recipe still loads.
    command: str = ""
    timeout_s: float = 0.0


@dataclass(frozen=True)
class SearchSettings:
    confidence: float = 0.99
    lifetimes_per_candidate: int = 3  # batch size when a candidate is prepared
    max_evaluations: int = 400
    max_end_lifetimes: int = 12  # the bad end must show the bug within this many lifetimes
    cost_new_candidate: float = 10.0
    cost_lifetime: float = 1.0
    # prior probability, for each end, that it does not behave as given (the flip lies beyond
    # the good end; the bad end does not show the bug): the confidence covers the ends too
    end_doubt: float = 0.05
    # prior probability that the fast probe ([probe] narrow) flips where the faithful probe
    # does; the confirm step's lifetimes must hold the confidence under it (tiers.py)
    stand_in_prior: float = 0.5
    # the rate the good end and the commit next to the flip must run clean against before a
    # commit is named: a bug there in this share of lifetimes or more would have shown at the
    # stop threshold (8 and 9 clean lifetimes at 0.5; 33 and 37 at 0.15: lower costs more);
    # a rarer one is caught only where it shows (bisect_tool/strategy/ends.py)
    clean_against_rate: float = 0.5


@dataclass(frozen=True)
class ReportedSetup:
    """What the issue being bisected reported running (``[reported]``): the report flags every
    way the run differs from it (issue 32: a maintainer must see at once that the run used an
    H200, random weights or ``VLLM_USE_FLASHINFER_SAMPLER=0`` where the reporter did not).
    Empty: nothing to compare with."""

    issue: str = ""  # e.g. "vLLM #51187"
    gpu: str = ""  # e.g. "NVIDIA GeForce RTX 4060 Laptop, RTX 4090 (compute capability 8.9)"
    # package -> version as reported ("vllm", "torch", "triton", "flashinfer", ...)
    versions: dict[str, str] = field(default_factory=dict)
    model: str = ""  # e.g. "Qwen/Qwen3-0.6B (its own weights), float16"
    env: dict[str, str] = field(default_factory=dict)
    server_args: tuple[str, ...] = ()
    requests: int = 0
    fillers: int = 0
    jitter_ms: float = 0.0  # how the reporter's requests arrived (0: all at once)
    workload: str = ""  # anything else of the workload, in words


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str = ""
    range: RangeSettings = field(default_factory=RangeSettings)
    artifacts: ArtifactSettings = field(default_factory=ArtifactSettings)
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    probe: ProbeSettings = field(default_factory=ProbeSettings)
    search: SearchSettings = field(default_factory=SearchSettings)
    reported: ReportedSetup = field(default_factory=ReportedSetup)
    source: str = ""  # where it was loaded from

    def override(self, section: str, **values: Any) -> Recipe:
        """A copy with some values of one section replaced (CLI flags win over the recipe)."""
        given = {k: v for k, v in values.items() if v is not None}
        if not given:
            return self
        current = getattr(self, section)
        from bisect_tool.recipes.limits import check_section

        check_section("command line", section, given)
        try:
            updated = dataclasses.replace(current, **given)
        except TypeError as exc:
            raise RecipeError(f"unknown setting for [{section}]: {exc}") from None
        recipe = dataclasses.replace(self, **{section: updated})
        check_whole(recipe, "command line")
        return recipe

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS: dict[str, type] = {
    "range": RangeSettings,
    "artifacts": ArtifactSettings,
    "runtime": RuntimeSettings,
    "probe": ProbeSettings,
    "search": SearchSettings,
    "reported": ReportedSetup,
}


def bundled_names() -> list[str]:
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.toml") if not p.stem.startswith("_"))


def looks_like_path(name_or_path: str) -> bool:
    """A recipe argument is a path only when it looks like one: it holds a ``/`` or ends in
    ``.toml``. Anything else is a bundled name, whatever the current folder holds (a ``demo/``
    folder beside ``bisect demo`` must not shadow the bundled ``demo`` recipe)."""
    return "/" in name_or_path or name_or_path.endswith(".toml")


def find(name_or_path: str) -> Path:
    """A bundled recipe by name, or a path to a TOML file (see ``looks_like_path``)."""
    if looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if path.is_dir():
            raise RecipeError(f"recipe {path} is a folder; give the .toml file in it")
        if not path.is_file():
            raise RecipeError(f"recipe file not found: {path}")
        return path
    bundled = BUNDLED_DIR / f"{name_or_path}.toml"
    if name_or_path and bundled.is_file():
        return bundled
    names = ", ".join(bundled_names())
    local = Path(name_or_path)
    hint = (f"; for the file {name_or_path} here, write ./{name_or_path}"
            if name_or_path and local.is_file() else " (or give a path to a .toml file)")
    raise RecipeError(f"unknown recipe '{name_or_path}'; bundled recipes: {names}{hint}")


def load(name_or_path: str) -> Recipe:
    path = find(name_or_path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise RecipeError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); TOML files are UTF-8, "
            "save it as UTF-8"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path}: not valid TOML: {exc}") from None
    return from_dict(data, source=str(path))


def from_dict(data: dict[str, Any], source: str = "<dict>") -> Recipe:
    known = {"name", "description", *_SECTIONS}
    unknown = sorted(set(data) - known)
    if unknown:
        raise RecipeError(
            f"{source}: unknown key '{unknown[0]}' at top level{did_you_mean(unknown[0], known)}; "
            f"known: {', '.join(sorted(known))}"
        )
    if "name" not in data:
        raise RecipeError(f"{source}: missing field 'name'")
    kwargs: dict[str, Any] = {
        "name": check_value(source, "name", data["name"], str),
        "description": check_value(source, "description", data.get("description", ""), str),
        "source": source,
    }
    for section, cls in _SECTIONS.items():
        raw = data.get(section, {})
        if not isinstance(raw, dict):
            raise RecipeError(f"{source}: [{section}] must be a table")
        kwargs[section] = _build_section(source, section, cls, raw)
    recipe = Recipe(**kwargs)
    check_whole(recipe, source)
    return recipe


def check_whole(recipe: Recipe, source: str) -> None:
    """What no single key's range says but the stages later rely on, checked at load so a bad
    recipe is one line before anything starts (not an error deep in a lifetime, or a journal
    header the tool itself then refuses to read)."""
    p, r = recipe.probe, recipe.runtime
    total = p.requests + p.fillers
    if p.target_coresidency > total:
        raise RecipeError(
            f"{source}: 'probe.target_coresidency' ({p.target_coresidency}) exceeds requests + "
            f"fillers ({total}): it could never be reached; lower it or add fillers"
        )
    small, big = p.row_counts
    if not small < big:
        raise RecipeError(
            f"{source}: 'probe.row_counts' must be [small, big] with small < big, got "
            f"{[small, big]}"
        )
    sizes = p.batch_sizes or (total,)
    if p.mode == "bs1-vs-bsN" and (max(sizes) > total or p.needles > min(sizes)):
        raise RecipeError(
            f"{source}: 'probe.batch_sizes' {list(sizes)} and 'probe.needles' {p.needles} need "
            f"batches of at most requests + fillers ({total}) holding every needle; add "
            "requests or lower them"
        )
    if recipe.artifacts.python_side == "candidate" and r.backend != "local":
        raise RecipeError(
            f"{source}: 'artifacts.python_side' = \"candidate\" lays each candidate's package "
            f"in place of the pinned one with the local backend, not {r.backend!r}; set "
            "[runtime] backend = \"local\""
        )
    if any(not g.strip() for g in r.gpus):
        raise RecipeError(f"{source}: 'runtime.gpus' holds an empty GPU id; give ids like [\"0\"]")
    if len(set(r.gpus)) != len(r.gpus):
        raise RecipeError(f"{source}: 'runtime.gpus' lists a GPU twice; give each GPU once")
    if r.gpus_per_lifetime > 1 and len(r.gpus) < r.gpus_per_lifetime:
        raise RecipeError(
            f"{source}: 'runtime.gpus_per_lifetime' is {r.gpus_per_lifetime} but 'runtime.gpus' "
            f"lists {len(r.gpus)}; list at least as many GPUs of one host (--gpus 0,1,...)"
        )


def _build_section(source: str, section: str, cls: type, raw: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in names:
            elsewhere = [s for s, c in _SECTIONS.items() if s != section
                         and key in {f.name for f in dataclasses.fields(c)}]
            hint = did_you_mean(key, names) or (
                f" (it belongs in [{elsewhere[0]}])" if elsewhere else "")
            raise RecipeError(
                f"{source}: unknown key '{key}' in [{section}]{hint}; known: "
                f"{', '.join(sorted(names))}"
            )
        values[key] = check_value(source, f"{section}.{key}", value, hints[key])
    from bisect_tool.recipes.limits import check_section

    check_section(source, section, values)
    if section == "runtime" and "env" in values:
        from bisect_tool import redact

        redact.remember(values["env"])  # a child may print them: scrub them from its log too
    return cls(**values)


def from_dict_loose(data: dict[str, Any]) -> Recipe:
    """A recipe stored in a journal header (``Recipe.to_dict()``): validated the same way."""
    data = dict(data)
    source = str(data.pop("source", "") or "<journal>")
    return _restore_secrets(from_dict(data, source=source))


def _restore_secrets(recipe: Recipe) -> Recipe:
    """The journal keeps ``[runtime.env]`` secrets as ``[redacted]``; a resumed run takes them
    from the environment, else from the recipe file it was started with."""
    from bisect_tool.redact import REDACTED

    env = dict(recipe.runtime.env)
    hidden = [k for k, v in env.items() if v == REDACTED]
    if not hidden:
        return recipe
    import os

    from_file: dict[str, str] = {}
    if recipe.source and Path(recipe.source).is_file():
        try:
            from_file = load(recipe.source).runtime.env
        except RecipeError:
            from_file = {}
    for key in hidden:
        value = os.environ.get(key) or from_file.get(key)
        if not value or value == REDACTED:
            raise RecipeError(
                f"[runtime.env] {key} was redacted from the journal and is neither in the "
                f"environment nor in {recipe.source or 'the recipe file'}; export {key}=... "
                "and run `bisect resume` again"
            )
        env[key] = value
    from bisect_tool import redact

    redact.remember(env)
    return dataclasses.replace(recipe, runtime=dataclasses.replace(recipe.runtime, env=env))
