"""`bisect plan` (the same as `bisect start --dry-run`): what a bisect would do and cost, before
it spends a build or a GPU minute, and whether this machine can run it at all.

- **The candidates**, as `start` would resolve them (the same flags, the same recipe), each with
  where its swap set would come from (cache, wheel index, release wheel, local, source build;
  ``bisect_tool.artifacts.origins``: looked up, never fetched or built) and, where the artifact
  is at hand (the cache), whether the compatibility gate rejects it.
- **Availability and bytes**: how many candidates have a wheel, how many need a build and why
  the wheel index has none for them (not on main, too new, the variant missing), and the bytes
  the wheel-index candidates will move (the swap-set members and the central directory, read
  from one wheel's central directory: an estimate for the others).
- **What it would cost**: the real search (``designs.bisect``, the run's own decision code,
  through ``bisect_tool.designs.simulate.run_design``, the harness ``bisect simulate`` uses) on
  simulated histories at an assumed p (the prior's
  mean unless ``--p``) and q, with the flip anywhere: the op runs, lifetimes, candidates, builds
  and wall time at the recipe's costs.
- **The environment** (``bisect_tool.run.preflight``): the pinned interpreter, torch, the pinned
  stack, the GPU, Docker or Ray when the recipe's backend needs them, the random checkpoint;
  one line each, ok or missing with the fix. The required ones are what `start` checks before
  it writes a journal: a start that cannot work says so and leaves no session behind.

It writes nothing: no journal, no state dir, no cache entry (the cache is only looked at).
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bisect_tool.designs.simulate import Outcome, run_design
from bisect_tool.errors import BisectError
from bisect_tool.kinds import find
from bisect_tool.recipes.recipe import Recipe
from bisect_tool.run.preflight import Check, environment
from bisect_tool.strategy import Costs, Priors
from bisect_tool.strategy.simhistories import Lifetimes, step
from bisect_tool.strategy.tiers import Tier
from bisect_tool.values import Direction

if TYPE_CHECKING:
    from bisect_tool.artifacts.origins import FetchEstimate, Origin
    from bisect_tool.range import CommitRange
    from bisect_tool.run.request import StartRequest

#: simulated runs behind the expected costs (seeded: the same plan prints the same numbers)
TRIALS = 16
#: a simulated run stops here even if the search would go on (the budget of a real one does)
SIM_CAP = 2000


# -- what it would cost --------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """Means over the simulated runs (each with the flip drawn anywhere in the range)."""

    trials: int
    p: float
    q: float
    op_runs: float
    lifetimes: float
    controls: int  # lifetimes of the controls, before the search (at least; more if they fail)
    candidates: float  # distinct candidates run
    builds: float  # of them, source builds (not in the cache)
    downloads: float  # of them, downloads (not in the cache)
    wall_s: float  # at the recipe's costs
    right: float  # share of simulated runs that named the flip
    prefetch: int  # K: at most this many more builds from the lookahead
    cost_new: float
    cost_lifetime: float


def assumed_p(recipe: Mapping[str, Any]) -> tuple[float, float]:
    """The p and q a plan assumes: the prior's means (p: its point mass at 1 and Beta(2, 1)
    beside it; q: Beta(0.5, 50)), or 1 and 0 for a deterministic probe (the op check runs
    fixed inputs: the same rows every run; tiers.narrow_priors)."""
    probe = recipe.get("probe") or {}
    if probe.get("deterministic") or find(probe.get("kind")).deterministic:
        return 1.0, 0.0
    pri = Priors()
    p = pri.p_point_mass + (1 - pri.p_point_mass) * pri.p_alpha / (pri.p_alpha + pri.p_beta)
    return p, pri.q_alpha / (pri.q_alpha + pri.q_beta)


def simulate(
    header: Mapping[str, Any],
    *,
    p: float,
    q: float,
    trials: int = TRIALS,
    rejected: frozenset[int] = frozenset(),
    cached: frozenset[int] = frozenset(),
    builds_at: frozenset[int] = frozenset(),
    downloads_at: frozenset[int] = frozenset(),
    slots: int = 1,
    seed: int = 0,
) -> Expected:
    """The run's own decision code on ``trials`` simulated histories: the fast probe (if the
    recipe narrows) deterministic at the same flip, lifetimes divergent with p on the bad side
    and q on the good side; ``rejected`` positions the gate refuses."""
    from bisect_tool.strategy import lookahead

    recipe = header.get("recipe") or {}
    search = recipe.get("search") or {}
    cost_new = float(search.get("cost_new_candidate", 10.0))
    cost_lifetime = float(search.get("cost_lifetime", 1.0))
    rng = np.random.default_rng(seed)
    rows = [_one_run(header, p, q, rng, rejected, slots) for _ in range(max(1, trials))]
    probe = recipe.get("probe") or {}
    # the own runs of a probe that boots no server (an op recipe's) are runs, not lifetimes
    kind = find(probe.get("kind"))
    own_runs = not kind.boots_server
    runs = np.array([(r[0] + r[1], 0) if own_runs else (r[0], r[1]) for r in rows], dtype=float)
    fresh = [r[2] - cached for r in rows]
    controls = 0
    if kind.has_controls and probe.get("controls", True):
        controls = 1
    # the controls' lifetime shares the lifetimes' slots, unless it has one of its own
    shared_controls = 0 if (recipe.get("runtime") or {}).get("controls_own_slot") else controls
    first_tier = Tier.NARROW if probe.get("narrow") else Tier.FAITHFUL
    k = lookahead.depth(
        int((recipe.get("artifacts") or {}).get("prefetch", lookahead.CHOSEN_BY_RUN)),
        lookahead.build_facts(recipe, first_tier),
        Costs(new_candidate=cost_new, lifetime=cost_lifetime),
    )
    return Expected(
        trials=len(rows),
        p=p,
        q=q,
        op_runs=float(runs[:, 0].mean()),
        lifetimes=float(runs[:, 1].mean()),
        controls=controls,
        candidates=float(np.mean([len(r[2]) for r in rows])),
        builds=float(np.mean([len(f & builds_at) for f in fresh])),
        downloads=float(np.mean([len(f & downloads_at) for f in fresh])),
        # lifetimes run ``slots`` at a time; op runs and new candidates one after another
        wall_s=float(np.mean([
            (r[0] + (r[1] + shared_controls) / slots) * cost_lifetime + len(f) * cost_new
            for r, f in zip(rows, fresh, strict=True)
        ])),
        right=float(np.mean([r[3] for r in rows])),
        prefetch=k,
        cost_new=cost_new,
        cost_lifetime=cost_lifetime,
    )


def _one_run(
    header: Mapping[str, Any],
    p: float,
    q: float,
    rng: np.random.Generator,
    rejected: frozenset[int],
    slots: int,
) -> tuple[int, int, frozenset[int], bool]:
    """(op runs, lifetimes, positions run, named the flip) of one simulated run: the bisect
    design a real run carries out, through ``bisect_tool.designs.simulate.run_design`` (the harness
    ``bisect simulate`` uses), the flip drawn anywhere in the range."""
    candidates = header["candidates"]
    n = len(candidates) - 1
    flip = int(rng.integers(1, n + 1))  # the hypotheses f = 1..n (bisect_tool.strategy)
    direction = Direction(header["direction"])
    lifetimes = Lifetimes(step(n, flip, p, q, direction), rng)
    # the fast probe is deterministic: it flips where the bug does, every run the same (its
    # own stream, so the lifetimes draw as they would without it)
    fast = Lifetimes(step(n, flip, 1.0, 0.0, direction), np.random.default_rng(flip))
    run = run_design(header, lifetimes, fast=fast, rejected=rejected, slots=slots, cap=SIM_CAP)
    ran = frozenset(lifetimes.candidates)
    return run.fast_runs, run.lifetimes, ran, run.outcome is Outcome.RIGHT


# -- the plan ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CandidateLine:
    position: int
    sha: str
    label: str
    subject: str
    origin: str  # how the plan names the source ("cache", "source build", ...; "" in --run)
    detail: str  # its URL, path, or why no source has it
    gate: str  # "ok", the gate's message, or "" (not asked: the artifact is not at hand)
    no_wheel: str = ""  # why the wheel index has none ("" where it has one or was not asked)
    no_wheel_kind: str = ""  # its kind ("not on main", "too new", "variant missing", ...)
    where: str = ""  # off the main line: its branch and the main commit it copies

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Availability:
    """The candidates by where their swap set comes from, and why the wheel index has none
    for those it has none for."""

    by_origin: Mapping[str, int]  # "wheel index" -> 12, "source build" -> 3, ...
    no_wheel: Mapping[str, int]  # NoWheel kind -> candidates
    reasons: Mapping[str, str]  # NoWheel kind -> one message of that kind
    fetch: FetchEstimate | None = None

    def to_dict(self) -> dict[str, Any]:
        fetch = None
        if self.fetch is not None:
            fetch = {**dataclasses.asdict(self.fetch), "total": self.fetch.total,
                     "exact": self.fetch.exact}
        return {"by_origin": dict(self.by_origin), "no_wheel": dict(self.no_wheel),
                "reasons": dict(self.reasons), "fetch": fetch}


def availability(lines: Sequence[CandidateLine], fetch: FetchEstimate | None) -> Availability:
    by_origin: dict[str, int] = {}
    no_wheel: dict[str, int] = {}
    reasons: dict[str, str] = {}
    for line in lines:
        by_origin[line.origin] = by_origin.get(line.origin, 0) + 1
        if line.no_wheel_kind:
            no_wheel[line.no_wheel_kind] = no_wheel.get(line.no_wheel_kind, 0) + 1
            reasons.setdefault(line.no_wheel_kind, line.no_wheel)
    return Availability(by_origin, no_wheel, reasons, fetch)


@dataclass(frozen=True)
class Plan:
    mode: str  # "recipe", "run" or "manual"
    recipe: str
    level: str  # "commit" or "release"
    direction: str
    good: str
    bad: str
    candidates: tuple[CandidateLine, ...]
    checks: tuple[Check, ...]
    unreachable: Mapping[str, str]  # sources that could not be asked, and why
    gate_note: str  # why the gate was not asked, if it was not
    expected: Expected
    available: Availability | None = None  # (recipe mode only)
    placement: tuple[str, ...] = ()  # where the range sits (range.placement), one line each

    @property
    def ready(self) -> bool:
        return all(c.ok for c in self.checks if c.required)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "recipe": self.recipe, "level": self.level,
            "direction": self.direction, "good": self.good, "bad": self.bad,
            "ready": self.ready,
            "candidates": [c.to_dict() for c in self.candidates],
            "environment": [c.to_dict() for c in self.checks],
            "unreachable": dict(self.unreachable),
            "gate_note": self.gate_note,
            "expected": dataclasses.asdict(self.expected),
            "availability": self.available.to_dict() if self.available else None,
            "placement": list(self.placement),
        }


def make(request: StartRequest, *, p: float | None = None, trials: int = TRIALS) -> Plan:
    """The plan for what `start` was asked (``request``), with nothing written."""
    from bisect_tool.designs import ledger
    from bisect_tool.range import placement
    from bisect_tool.run.request import resolve

    commit_range, recipe, extra = resolve(request)
    header = ledger.header_for(
        commit_range,
        recipe=ledger.header_recipe(
            recipe, request.search_overrides, deterministic=request.deterministic
        ),
        mode="run" if request.run_command else ("recipe" if recipe else "manual"),
        **extra,
    )
    checks = environment(recipe)
    lines, unreachable, gate_note, fetch = _candidate_lines(recipe, commit_range, request, checks)
    rejected = frozenset(c.position for c in lines if c.gate not in ("", "ok"))
    cached = frozenset(c.position for c in lines if c.origin == "cache")
    builds_at = frozenset(c.position for c in lines if c.origin == "source build")
    downloads_at = frozenset(c.position for c in lines
                             if c.origin in ("wheel index", "release wheel"))
    assumed, q = assumed_p(header["recipe"])
    # "auto" is sized from the card when the run starts: planned here as one a GPU
    slots = max(1, len(recipe.runtime.gpus) * (recipe.runtime.per_gpu() or 1)) \
        if recipe is not None and find(recipe.probe.kind).boots_server else 1
    expected = simulate(
        header, p=assumed if p is None else p, q=q, trials=trials, rejected=rejected,
        cached=cached, builds_at=builds_at, downloads_at=downloads_at, slots=slots,
    )
    return Plan(
        mode=str(header["mode"]),
        recipe=recipe.name if recipe else "",
        level=str(extra.get("level", "commit")),
        direction=str(commit_range.direction),
        good=commit_range.good_ref,
        bad=commit_range.bad_ref,
        candidates=tuple(lines),
        checks=tuple(checks),
        unreachable=unreachable,
        gate_note=gate_note,
        expected=expected,
        available=availability(lines, fetch) if recipe is not None else None,
        placement=tuple(placement(commit_range)) if extra.get("level") != "release" else (),
    )


def _candidate_lines(
    recipe: Recipe | None,
    commit_range: CommitRange,
    request: StartRequest,
    checks: Sequence[Check],
) -> tuple[list[CandidateLine], dict[str, str], str, FetchEstimate | None]:
    candidates = commit_range.candidates
    if recipe is None:
        where = "a worktree runs --run" if request.run_command else "you judge it"
        return [CandidateLine(i, c.sha, c.label, c.subject, "", where, "",
                              where=c.provenance())
                for i, c in enumerate(candidates)], {}, "", None
    from bisect_tool.artifacts.origins import locate_all
    from bisect_tool.artifacts.sources import CommitFacts

    repo = request.repo if request.releases is None or request.releases.then_commits else None
    # The range marks a candidate off the main line (a release branch's commit has no wheel,
    # vLLM #16217) where it knows; the commit time comes from the clone.
    facts = {c.sha: CommitFacts(on_mainline=c.on_mainline if commit_range.mainline else None,
                                committed_at=c.time or None)
             for c in candidates}
    origins, unreachable, fetch = locate_all(
        recipe.artifacts, [(c.sha, c.tags) for c in candidates], repo,
        runtime=recipe.runtime, facts=facts, estimate=True,
    )
    gates, gate_note = _gate(recipe, origins, checks)
    lines = [
        CandidateLine(i, c.sha, c.label, c.subject, o.name, o.detail, gates.get(i, ""),
                      o.no_wheel[1] if o.no_wheel else "", o.no_wheel[0] if o.no_wheel else "",
                      c.provenance())
        for i, (c, o) in enumerate(zip(candidates, origins, strict=True))
    ]
    return lines, unreachable, gate_note, fetch


def _gate(
    recipe: Recipe, origins: Sequence[Origin], checks: Sequence[Check]
) -> tuple[dict[int, str], str]:
    """The compatibility gate on the candidates whose artifacts are at hand: "ok" or its
    message per position; and why it was not asked, when it was not."""
    from bisect_tool.errors import IncompatibleExtension

    server = find(recipe.probe.kind).boots_server
    if not server or recipe.runtime.backend not in ("local", "docker"):
        return {}, "" if not server else \
            f"the {recipe.runtime.backend} backend gates on its nodes"
    missing = [c.name for c in checks if c.required and not c.ok]
    if missing:
        return {}, f"not asked: {', '.join(missing)} missing"
    at_hand = [(i, o.swap) for i, o in enumerate(origins) if o.swap is not None]
    if not at_hand:
        return {}, ""
    from bisect_tool.runtime import make_backend

    results: dict[int, str] = {}
    with tempfile.TemporaryDirectory(prefix="bisect-plan-") as tmp:
        try:
            backend = make_backend(recipe.runtime, session="plan", log_dir=Path(tmp))
        except BisectError as exc:
            return {}, f"not asked: {exc}"
        try:
            for i, swap in at_hand:
                assert swap is not None
                try:
                    backend.check_compatible(swap)
                    results[i] = "ok"
                except IncompatibleExtension as exc:
                    results[i] = str(exc)
                except BisectError as exc:
                    return results, f"stopped: {exc}"
        finally:
            backend.close()
    return results, ""


# -- what a user reads --------------------------------------------------------------------------


def render(plan: Plan) -> str:
    e = plan.expected
    noun = "releases" if plan.level == "release" else "candidates"
    what = "first good" if plan.direction == "fix" else "first bad"
    lines = [
        f"plan: {len(plan.candidates)} {noun} from {plan.good} (good) to {plan.bad} (bad), "
        f"looking for the {what} one"
        + (f", recipe {plan.recipe}" if plan.recipe else f" ({plan.mode} mode)"),
        *(f"  {line}" for line in plan.placement),
        "",
        "candidates (position, commit, where its artifact comes from, the gate):",
    ]
    for c in plan.candidates:
        gate = "" if not c.gate else ("  gate: ok" if c.gate == "ok" else
                                      f"  gate REJECTS: {c.gate}")
        origin = c.origin or c.detail
        where = f" [{c.where}]" if c.where else ""
        lines.append(f"  {c.position:>4} {c.label:<14} {origin:<13} {c.subject[:60]}{where}{gate}")
    if plan.mode == "recipe" and plan.available is not None:
        lines += render_availability(plan.available)
    for source, why in plan.unreachable.items():
        lines.append(f"  {source}: not asked ({why})")
    if plan.gate_note:
        lines.append(f"  gate: {plan.gate_note}")
    lines += [
        "",
        f"expected (the search itself on {e.trials} simulated runs, the flip anywhere; "
        f"assumed p = {e.p:.2f}, q = {e.q:.2f}):",
        f"  op runs {e.op_runs:.1f}, lifetimes {e.lifetimes:.1f}"
        + (f" (+{e.controls} for the controls)" if e.controls else "")
        + f", candidates {e.candidates:.1f}",
        f"  builds {e.builds:.1f}, downloads {e.downloads:.1f} (the rest from the cache); "
        f"the lookahead (--prefetch {e.prefetch}) adds at most {e.prefetch} builds",
        f"  wall time about {_duration(e.wall_s)} at the recipe's costs ({e.cost_new:g} s a new "
        f"candidate, {e.cost_lifetime:g} s a lifetime or op run); named the flip in "
        f"{e.right:.0%} of them",
    ]
    if plan.checks:
        lines += ["", "environment:"]
        lines += [f"  {c.line()}" for c in plan.checks]
    lines += ["", "ready: `bisect start` with the same flags runs this" if plan.ready else
              "not ready: fix the missing lines above first"]
    return "\n".join(lines)


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def render_availability(a: Availability) -> list[str]:
    """How many candidates have a wheel, need a build or have nothing (and why the wheel index
    has none), and the bytes the wheel-index ones will move."""
    wheels = a.by_origin.get("wheel index", 0)
    builds = a.by_origin.get("source build", 0)
    parts = [f"{wheels} with a wheel", f"{builds} need a source build"]
    parts += [f"{n} {name}" for name, n in a.by_origin.items()
              if name not in ("wheel index", "source build")]
    lines = ["  artifacts: " + ", ".join(parts)]
    for kind, n in a.no_wheel.items():
        lines.append(f"    no wheel ({kind}): {n}, e.g. {a.reasons[kind]}")
    fetch = a.fetch
    if fetch is not None:
        if not fetch.per_candidate:
            lines.append(f"  bytes to fetch: not measured ({fetch.note or 'no length'})")
        elif fetch.whole_wheels:
            lines.append(
                f"  bytes to fetch: about {_bytes(fetch.total)}: whole wheels of "
                f"{_bytes(fetch.per_candidate)} for {fetch.candidates} candidate(s) (the wheel "
                "index ignores HTTP ranges; an estimate from one wheel's length)")
        else:
            how = "measured" if fetch.exact else (
                f"an estimate: read from the wheel of {fetch.sampled[:12]}, the same taken for "
                f"the other {fetch.candidates - 1}")
            lines.append(
                f"  bytes to fetch: {'' if fetch.exact else 'about '}{_bytes(fetch.total)} for "
                f"{fetch.candidates} candidate(s): {_bytes(fetch.members)} of swap-set members "
                f"(compressed) + {_bytes(fetch.directory)} of central directory each, against "
                f"{_bytes(fetch.wheel_size)} a whole wheel ({how})")
    return lines


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
