"""`bisect simulate`: the real strategy against simulated intermittent histories.

A benchmark, not a test: users plan a budget with it, and we hold the strategy to its targets.
Costs: a new candidate costs ``cost_new``, each lifetime ``cost_lifetime`` (10 and 1 by default).
A candidate is paid for once (its artifacts stay cached), so going back to one costs only its
lifetimes. Every strategy pays the same price for the same work, and all run on the same
histories (the same flip and the same random stream per trial).

- *bayes*: :class:`~bisect_tool.strategy.BayesianStrategy`, one lifetime at a time, stopped at
  the asked confidence (or the lifetime budget).
- *classic*: ``git bisect run`` on one lifetime per candidate: bad if that lifetime diverges.
  Before bisecting it runs one lifetime at each end to confirm the labels, as the Bayesian
  search also does, so its cost is ``2 * (cost_new + cost_lifetime)`` plus
  ``ceil(log2 N) * (cost_new + cost_lifetime)``. This is the baseline for p = 1.
- *fixed_repeats*: ``k`` lifetimes per candidate, bad if any diverges (syzkaller's and Chromium's
  "--times N" rule), after the same end checks.
- *tiered* (``--tiered``): the tiered search of ``bisect_tool.tiers`` driven by the run's own
  decision code (the bisect design, ``designs.bisect``): a deterministic fast probe (p = 1,
  q = 0) whose runs cost ``narrow_cost`` lifetimes each narrows, faithful lifetimes confirm. With
  ``stand_in_wrong`` the fast probe flips at another position than the bug (it is no stand-in):
  right then still means the faithful flip.

The lower bound is Fano's: ``((1 - Pe) log2 N - h(Pe)) / C`` lifetimes, C the capacity of the
channel bad -> Bernoulli(p), good -> Bernoulli(q); a new candidate reveals at most one bit about
the flip, so at least that many bits' worth of new candidates are paid for too.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from dataclasses import asdict, dataclass

import numpy as np

from bisect_tool.errors import UsageError
from bisect_tool.strategy import BayesianStrategy, Costs, NoCandidateLeft, Priors
from bisect_tool.values import Direction
from bisect_tool.verdict import EndState

STRATEGIES = ("bayes", "classic", "fixed_repeats")
TIERED = "tiered"

#: the cells the strategy is held to (accuracy >= 0.99 in each); see ``--grid``
GRID_P = (0.3, 0.5, 0.8, 1.0)
GRID_Q = (0.0, 0.01)
GRID_N = (64, 512, 4096)
#: cells where the given good end is in fact bad (the flip lies beyond it): the search must say
#: so, not name a commit (N, p, q)
GRID_GOOD_END_BAD = ((64, 0.3, 0.01), (64, 0.5, 0.01), (64, 1.0, 0.0), (512, 0.5, 0.01))
#: what ``_run_bayes`` reports instead of a position when the search says an end contradicts
GOOD_END_CONTRADICTED = -1
BAD_END_CONTRADICTED = -2


@dataclass(frozen=True)
class StrategyStats:
    accuracy: float
    mean_evaluations: float
    p95_evaluations: float
    mean_cost: float
    mean_candidates: float
    #: wrong answers out of the trials, and the 95% Wilson interval of the accuracy: at 100
    #: trials one wrong answer more or less moves the accuracy by 0.01, so 0.98 is not evidence
    #: against a true 0.995 (the interval says so)
    errors: int = 0
    accuracy_interval: tuple[float, float] = (0.0, 1.0)


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (sound near 0 and 1, unlike the normal one)."""
    if trials <= 0:
        return (0.0, 1.0)
    phat = successes / trials
    denom = 1 + z * z / trials
    centre = (phat + z * z / (2 * trials)) / denom
    half = z * math.sqrt(phat * (1 - phat) / trials + z * z / (4 * trials * trials)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class LowerBound:
    evaluations: float
    cost: float


@dataclass(frozen=True)
class SimulationResult:
    candidates: int
    p: float
    q: float
    trials: int
    confidence: float
    lower_bound: LowerBound
    strategies: dict[str, StrategyStats]
    #: mean confidence the Bayesian search reported when it stopped (compare with its accuracy)
    bayes_reported_confidence: float = 0.0
    #: the given good end is in fact bad: right means saying so, not naming a commit
    good_end_bad: bool = False

    def to_dict(self) -> dict[str, object]:
        return {
            "candidates": self.candidates,
            "p": self.p,
            "q": self.q,
            "trials": self.trials,
            "confidence": self.confidence,
            "bayes_reported_confidence": self.bayes_reported_confidence,
            "good_end_bad": self.good_end_bad,
            "lower_bound": asdict(self.lower_bound),
            "strategies": {k: asdict(v) for k, v in self.strategies.items()},
        }

    def ratios(self) -> dict[str, float]:
        bayes = self.strategies["bayes"].mean_cost
        out = {
            "bayes_over_lower_bound": bayes / self.lower_bound.cost if self.lower_bound.cost else 0,
            "bayes_over_classic": bayes / self.strategies["classic"].mean_cost,
        }
        if TIERED in self.strategies and self.strategies[TIERED].mean_cost:
            out["bayes_over_tiered"] = bayes / self.strategies[TIERED].mean_cost
        return out


class _History:
    """A simulated range: positions 0..n, the flip at ``flip``; lifetimes drawn on demand."""

    def __init__(self, n: int, flip: int, p: float, q: float, rng: np.random.Generator) -> None:
        self.n, self.flip, self.p, self.q, self.rng = n, flip, p, q, rng
        self.lifetimes = 0
        self.candidates: set[int] = set()

    def run(self, position: int) -> bool:
        self.lifetimes += 1
        self.candidates.add(position)
        # fix-finding direction, as in the seed: the old side (position < flip) is bad
        rate = self.p if position < self.flip else self.q
        return bool(self.rng.random() < rate)

    def cost(self, costs: Costs) -> float:
        return self.lifetimes * costs.lifetime + len(self.candidates) * costs.new_candidate


@dataclass(frozen=True)
class _Settings:
    n: int
    p: float
    q: float
    costs: Costs
    confidence: float
    repeats: int
    budget: int
    priors: Priors | None
    good_end_bad: bool = False
    tiered: bool = False
    narrow_cost: float = 0.1
    stand_in_wrong: bool = False


def _run_bayes(
    h: _History, costs: Costs, confidence: float, budget: int, priors: Priors | None = None
) -> tuple[int, float]:
    """The search as the session loop drives it (``session.stop_reason``'s order); returns
    (reported flip, reported confidence), the flip ``GOOD_END_CONTRADICTED`` or
    ``BAD_END_CONTRADICTED`` when it stopped saying an end is not what it was said to be."""
    strategy = BayesianStrategy(
        h.n + 1, Direction.FIX, costs=costs, confidence=confidence, priors=priors
    )
    while h.lifetimes < budget:
        s = strategy.summary()
        if s.total[s.bad_end] and s.total[s.good_end]:
            if s.contradicted_end == "good":
                return GOOD_END_CONTRADICTED, s.good_end_doubt
            if s.contradicted_end == "bad":
                return BAD_END_CONTRADICTED, s.bad_end_doubt
            if s.done and s.bug_shown:
                break
        try:
            choice = strategy.select()
        except NoCandidateLeft:
            break
        strategy.record(choice.position, h.run(choice.position))
    s = strategy.summary()
    return s.block[0], s.confidence


def _run_tiered(
    h: _History, fast: _History, s: _Settings
) -> tuple[int, float, int]:
    """The tiered search as a run does it: the bisect design (``designs.bisect``), driven by
    ``designs.drive`` instead of the engine; returns (reported flip, reported confidence, fast
    probe runs)."""
    from bisect_tool import session
    from bisect_tool.designs import Item, drive
    from bisect_tool.designs.bisect import BisectDesign
    from bisect_tool.journal import JournalContents
    from bisect_tool.tiers import Tier
    from bisect_tool.values import Observation, Verdict

    shas = [f"{i:040x}" for i in range(h.n + 1)]
    header: dict[str, object] = {
        "direction": "fix",
        "mode": "recipe",
        "candidates": [{"sha": sha, "subject": ""} for sha in shas],
        "recipe": {"probe": {"narrow": "op"},
                   "search": {"confidence": s.confidence, "max_evaluations": s.budget,
                              "cost_new_candidate": s.costs.new_candidate,
                              "cost_lifetime": s.costs.lifetime}},
    }
    state = session.replay(JournalContents(header, ()))
    runs = 0

    def evaluate(item: Item) -> Observation:
        nonlocal runs
        position, tier = item.key
        narrow = tier is Tier.NARROW
        bug = (fast if narrow else h).run(position)
        runs += narrow
        if narrow:
            h.candidates.add(position)  # its artifact is paid for once, for both tiers
        return Observation(item.commit, Verdict.DIVERGENT if bug else Verdict.CLEAN,
                           item.lifetime_id)

    finish = drive(BisectDesign(state), evaluate)
    summary = state.strategy.summary()
    if finish.state is EndState.ENDS_CONTRADICT:
        contradicted = summary.contradicted_end
        found = GOOD_END_CONTRADICTED if contradicted == "good" else BAD_END_CONTRADICTED
        return found, 0.0, runs
    return summary.block[0], summary.confidence, runs


def _run_fixed(h: _History, repeats: int) -> int:
    """Bisection with ``repeats`` lifetimes per candidate, bad if any diverges."""

    def is_bad(position: int) -> bool:
        return any([h.run(position) for _ in range(repeats)])

    is_bad(0)  # confirm the labels once each, as the Bayesian search does
    is_bad(h.n)
    lo, hi = 0, h.n  # lo: known bad (old side), hi: known good (new side)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if is_bad(mid):
            lo = mid
        else:
            hi = mid
    return hi


# one trial: per strategy (right?, lifetimes, cost, candidates), and bayes' reported confidence
_Row = tuple[bool, int, float, int]


def _trial(args: tuple[_Settings, int]) -> tuple[dict[str, _Row], float]:
    s, seed = args
    rng = np.random.default_rng(seed)
    flip = int(rng.integers(1, s.n + 1))
    if s.good_end_bad:
        flip = s.n + 1  # every position is on the bad (old) side, the given good end included
    stream = int(rng.integers(2**63))
    out: dict[str, _Row] = {}
    reported = 0.0
    for name in STRATEGIES + ((TIERED,) if s.tiered else ()):
        h = _History(s.n, flip, s.p, s.q, np.random.default_rng(stream))
        extra = 0.0
        if name == "bayes":
            found, reported = _run_bayes(h, s.costs, s.confidence, s.budget, s.priors)
        elif name == TIERED:
            fast_flip = flip
            if s.stand_in_wrong:  # anywhere but the bug's own flip
                fast_flip = int(rng.integers(1, s.n))
                fast_flip += fast_flip >= flip
            fast = _History(s.n, fast_flip, 1.0, 0.0, np.random.default_rng(stream + 1))
            found, _, runs = _run_tiered(h, fast, s)
            extra = runs * s.narrow_cost * s.costs.lifetime
        else:
            found = _run_fixed(h, 1 if name == "classic" else s.repeats)
        right = found == GOOD_END_CONTRADICTED if s.good_end_bad else found == flip
        out[name] = (right, h.lifetimes, h.cost(s.costs) + extra, len(h.candidates))
    return out, reported


def channel_capacity(p: float, q: float) -> float:
    """Capacity (bits per lifetime) of bad -> Bernoulli(p), good -> Bernoulli(q)."""

    def h(x: float) -> float:
        return 0.0 if x <= 0 or x >= 1 else -x * math.log2(x) - (1 - x) * math.log2(1 - x)

    best = 0.0
    for pi in np.linspace(0.001, 0.999, 999):
        mix = pi * p + (1 - pi) * q
        best = max(best, h(mix) - pi * h(p) - (1 - pi) * h(q))
    return best


def lower_bound(n: int, p: float, q: float, costs: Costs, error: float = 0.01) -> LowerBound:
    """Fano: ((1 - Pe) log2 N - h(Pe)) / C lifetimes; a new candidate reveals at most one bit."""
    h_e = -error * math.log2(error) - (1 - error) * math.log2(1 - error)
    bits = max((1 - error) * math.log2(n) - h_e, 0.0)
    lifetimes = bits / channel_capacity(p, q)
    cost = lifetimes * costs.lifetime + bits * costs.new_candidate
    return LowerBound(float(lifetimes), float(cost))


def simulate(
    candidates: int,
    p: float,
    q: float,
    trials: int,
    *,
    confidence: float = 0.99,
    costs: Costs | None = None,
    repeats: int = 7,
    seed: int = 0,
    budget: int = 5000,
    priors: Priors | None = None,
    processes: int | None = None,
    good_end_bad: bool = False,
    tiered: bool = False,
    narrow_cost: float = 0.1,
    stand_in_wrong: bool = False,
) -> SimulationResult:
    """``trials`` random histories (flip uniform in 1..N) searched by every strategy.

    Trials run in ``processes`` worker processes (default: one per CPU); each trial's seed comes
    from ``seed`` alone, so the result does not depend on how many processes ran it.
    """
    if candidates < 2:
        raise UsageError("--candidates must be at least 2")
    if not (0 < p <= 1 and 0 <= q < p):
        raise UsageError("need 0 < p <= 1 and 0 <= q < p (p: bad-side rate, q: false alarms)")
    if trials < 1:
        raise UsageError("--trials must be at least 1")
    costs = costs or Costs()
    settings = _Settings(
        candidates, p, q, costs, confidence, repeats, budget, priors, good_end_bad, tiered,
        narrow_cost, stand_in_wrong,
    )
    seeds = [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(seed).spawn(trials)]
    work = [(settings, s) for s in seeds]
    processes = processes or os.cpu_count() or 1
    if processes > 1 and trials > 1:
        # fork: the workers need nothing but this module; chunks keep the pickling small
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(processes) as pool:
            rows = pool.map(_trial, work, chunksize=max(1, trials // (4 * processes)))
    else:
        rows = [_trial(w) for w in work]
    stats = {}
    for name in STRATEGIES + ((TIERED,) if tiered else ()):
        mine = [r[0][name] for r in rows]
        evaluations = np.array([r[1] for r in mine])
        right = sum(1 for r in mine if r[0])
        stats[name] = StrategyStats(
            accuracy=right / len(mine),
            mean_evaluations=float(evaluations.mean()),
            p95_evaluations=float(np.percentile(evaluations, 95)),
            mean_cost=float(np.mean([r[2] for r in mine])),
            mean_candidates=float(np.mean([r[3] for r in mine])),
            errors=len(mine) - right,
            accuracy_interval=wilson_interval(right, len(mine)),
        )
    return SimulationResult(
        candidates,
        p,
        q,
        trials,
        confidence,
        lower_bound(candidates, p, q, costs),
        stats,
        bayes_reported_confidence=float(np.mean([r[1] for r in rows])),
        good_end_bad=good_end_bad,
    )


def format_result(r: SimulationResult) -> str:
    """The side-by-side table a user reads."""
    cell = " (the given good end is bad: right = saying so)" if r.good_end_bad else ""
    lines = [
        f"N={r.candidates} p={r.p:g} q={r.q:g} trials={r.trials} confidence={r.confidence:g}"
        + cell,
        f"{'strategy':<14}{'accuracy':>9}{'95% interval':>15}{'wrong':>7}{'mean evals':>12}"
        f"{'p95 evals':>11}{'mean cost':>11}",
    ]
    for name, s in r.strategies.items():
        lo, hi = s.accuracy_interval
        lines.append(
            f"{name:<14}{s.accuracy:>9.3f}{f'{lo:.3f}-{hi:.3f}':>15}{s.errors:>7}"
            f"{s.mean_evaluations:>12.1f}{s.p95_evaluations:>11.0f}{s.mean_cost:>11.1f}"
        )
    lb = r.lower_bound
    lines.append(
        f"{'lower bound':<14}{'>=0.99':>9}{'':>15}{'':>7}{lb.evaluations:>12.1f}{'':>11}"
        f"{lb.cost:>11.1f}"
    )
    ratios = r.ratios()
    lines.append(
        f"bayes cost / lower bound = {ratios['bayes_over_lower_bound']:.2f}; "
        f"bayes cost / classic cost = {ratios['bayes_over_classic']:.2f}; "
        f"bayes mean reported confidence {r.bayes_reported_confidence:.4f}"
    )
    if "bayes_over_tiered" in ratios:
        lines.append(
            f"lifetimes only (bayes) cost / tiered cost = {ratios['bayes_over_tiered']:.2f} "
            "(tiered: a deterministic fast probe narrows, lifetimes confirm; its cost counts "
            "the fast probe's runs)"
        )
    return "\n".join(lines)


def grid_row(r: SimulationResult) -> str:
    b, c = r.strategies["bayes"], r.strategies["classic"]
    ratios = r.ratios()
    return (
        f"{r.candidates:>5} {r.p:>4g} {r.q:>5g} {r.trials:>6} {b.accuracy:>6.3f} "
        f"{b.errors:>5} {b.accuracy_interval[0]:>6.3f} "
        f"{r.bayes_reported_confidence:>7.4f} {b.mean_evaluations:>7.1f} {b.p95_evaluations:>5.0f} "
        f"{b.mean_cost:>7.1f} {r.lower_bound.cost:>6.1f} {ratios['bayes_over_lower_bound']:>6.2f} "
        f"{c.accuracy:>6.3f} {c.mean_cost:>6.1f} {ratios['bayes_over_classic']:>6.2f} "
        f"{r.strategies['fixed_repeats'].accuracy:>6.3f}"
        + ("  good end bad" if r.good_end_bad else "")
    )


GRID_HEADER = (
    "    N    p     q trials  b.acc b.err b.lo95  b.conf  b.eval   p95  b.cost  lower  b/low  "
    "c.acc c.cost  b/cls  fr.acc"
)
