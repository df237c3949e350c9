"""`bisect simulate`: the product's own search against simulated intermittent histories.

A benchmark, not a test: users plan a budget with it, and we hold the search to its targets.
One harness, ``run_design``, drives the bisect design a real run carries out
(``designs.bisect.BisectDesign``: every stop rule, the good end's, the bad end's, the budget)
through ``designs.drive`` against simulated lifetimes; ``bisect simulate``, ``bisect plan``'s
estimates (``bisect_tool.run.plan``) and the accuracy tests all go through it.

A *history* (``History``, bisect_tool.strategy.simhistories) says how often a lifetime shows the
bug at
each candidate, and what the right answer is: one flip (``step``: the bad side at p, the good
side at q), a given good end that is in fact bad (``beyond_good_end``), a bug that a later
commit makes worse (``rate_step``: issue 38), or a good end that shows the bug now and then
while a real flip lies inside the range (``flaky_good_end``). Every run ends one of three ways:
right, wrong (a named commit that is not the answer, or a commit named where the good end is
bad), or no answer (the search stopped saying what it saw: not wrong, but its lifetimes are
counted).

Costs: a new candidate costs ``cost_new``, each lifetime ``cost_lifetime`` (10 and 1 by default).
A candidate is paid for once (its artifacts stay cached), so going back to one costs only its
lifetimes. Every strategy pays the same price for the same work, and all run on the same
histories (the same flip and the same random stream per trial).

- *bayes*: the bisect design as ``bisect start`` runs it with lifetimes alone, stopped by its own
  rules (the asked confidence, an end that is not what it was said to be, the budget).
- *classic*: ``git bisect run`` on one lifetime per candidate: bad if that lifetime diverges.
  Before bisecting it runs one lifetime at each end to confirm the labels, as the Bayesian
  search also does, so its cost is ``2 * (cost_new + cost_lifetime)`` plus
  ``ceil(log2 N) * (cost_new + cost_lifetime)``. This is the baseline for p = 1.
- *fixed_repeats*: ``k`` lifetimes per candidate, bad if any diverges (syzkaller's and Chromium's
  "--times N" rule), after the same end checks.
- *tiered* (``--tiered``): the same design with a deterministic fast probe (p = 1, q = 0) whose
  runs cost ``narrow_cost`` lifetimes each narrowing, faithful lifetimes confirming. With
  ``stand_in_wrong`` the fast probe flips at another position than the bug (it is no stand-in):
  right then still means the faithful flip.

The lower bound is Fano's: ``((1 - Pe) log2 N - h(Pe)) / C`` lifetimes, C the capacity of the
channel bad -> Bernoulli(p), good -> Bernoulli(q); a new candidate reveals at most one bit about
the flip, so at least that many bits' worth of new candidates are paid for too.
"""

from __future__ import annotations

import contextlib
import enum
import math
import multiprocessing
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bisect_tool.designs import Item, drive, ledger
from bisect_tool.designs.bisect import BisectDesign
from bisect_tool.errors import UsageError
from bisect_tool.journal import JournalContents
from bisect_tool.kinds import narrowing
from bisect_tool.strategy import CLEAN_AGAINST_RATE, Costs, Priors
from bisect_tool.strategy.simhistories import (
    History,
    Lifetimes,
    LowerBound,
    beyond_good_end,
    flaky_good_end,
    lower_bound,
    rate_step,
    step,
)
from bisect_tool.strategy.tiers import Tier
from bisect_tool.values import Direction, Observation, Verdict
from bisect_tool.verdict import EndState

STRATEGIES = ("bayes", "classic", "fixed_repeats")
TIERED = "tiered"

#: the cells the search is held to (accuracy >= 0.99 in each); see ``--grid``
GRID_P = (0.3, 0.5, 0.8, 1.0)
GRID_Q = (0.0, 0.01)
GRID_N = (64, 512, 4096)
#: cells where the given good end is in fact bad (the flip lies beyond it): the search must say
#: so, not name a commit (N, p, q)
GRID_GOOD_END_BAD = ((64, 0.3, 0.01), (64, 0.5, 0.01), (64, 1.0, 0.0), (512, 0.5, 0.01))
#: a bug that a later commit makes worse (issue 38): (N, a, p1, b, p, q), the bug at p1 from
#: position a and at p from b (a regression; positions from the good end; a = 0: the good end
#: itself shows it). Naming b, or anything but a, is wrong; stopping without an answer is not
#: The first three hold the search to <= 1 % wrong (a lower rate of one half or more: the good
#: end and the commit next to the flip run clean 8 and 9 times, bisect_tool.strategy.ends); the
#: last two show what the default floor (0.5) cannot hold, rates of 0.3 and 0.15, caught only
#: where they show; ``--clean-against`` at their rate holds them (docs/simulate-grid.txt).
GRID_RATE_STEP = ((30, 17, 0.5, 26, 1.0, 0.0), (64, 30, 0.5, 34, 0.8, 0.01),
                  (64, 0, 0.5, 32, 1.0, 0.0), (64, 20, 0.3, 40, 1.0, 0.01),
                  (30, 17, 0.15, 26, 1.0, 0.0))
#: a good end that shows the bug in a share of its lifetimes, a real flip inside the range
#: (issue 38: half its lifetimes, accepted after one clean one): (N, p, q, the good end's rate);
#: each held to <= 1 % wrong
GRID_FLAKY_GOOD_END = ((30, 1.0, 0.0, 0.5), (64, 0.8, 0.01, 0.5), (512, 0.5, 0.01, 0.5),
                       (64, 1.0, 0.0, 0.8))


# -- the product's search on a history -------------------------------------------------------


class Outcome(enum.StrEnum):
    RIGHT = "right"
    WRONG = "wrong"  # a commit named that is not the answer (or named where the good end is bad)
    NO_ANSWER = "no answer"  # the search stopped without naming a commit: not wrong


@dataclass(frozen=True)
class DesignRun:
    """How one simulated run of the bisect design ended."""

    end: EndState
    message: str
    block: tuple[int, ...]  # the named commits (the best guess, where none was named)
    confidence: float  # as the answer states it: P(the flip there AND both ends as given)
    contradicted: str  # the end an ENDS_CONTRADICT stop named ("good"/"bad"), else ""
    outcome: Outcome
    fast_runs: int  # runs of the fast probe (a tiered header)
    lifetimes: int  # runs of the faithful probe, those the gate refused included


def search_header(
    history: History,
    *,
    confidence: float = 0.99,
    costs: Costs | None = None,
    budget: int | None = None,
    narrow: bool = False,
    clean_against_rate: float | None = None,
) -> dict[str, Any]:
    """The journal header a run over ``history``'s candidates starts from: a recipe run with
    the product's search settings but those given (``narrow``: an op check narrows first;
    ``clean_against_rate``: the recipe's ``[search] clean_against_rate``, as
    ``--clean-against`` sets it on a real run)."""
    costs = costs or Costs()
    search: dict[str, Any] = {"confidence": confidence, "cost_new_candidate": costs.new_candidate,
                              "cost_lifetime": costs.lifetime}
    if budget is not None:
        search["max_evaluations"] = budget
    if clean_against_rate is not None:
        search["clean_against_rate"] = clean_against_rate
    recipe: dict[str, Any] = {"search": search}
    if narrow:
        recipe["probe"] = {"narrow": narrowing(None).name}
    return {
        "direction": str(history.direction),
        "mode": "recipe",
        "candidates": [{"sha": f"{i:040x}", "subject": ""} for i in range(history.n + 1)],
        "recipe": recipe,
    }


class _Capped(Exception):
    """A run that went past its cap of runs (stopped there, counted as it stands)."""


def run_design(
    header: Mapping[str, Any],
    lifetimes: Lifetimes,
    *,
    fast: Lifetimes | None = None,
    rejected: frozenset[int] = frozenset(),
    slots: int = 1,
    cap: int | None = None,
    priors: Priors | None = None,
) -> DesignRun:
    """The bisect design a real run carries out (``designs.bisect``), from ``header``, driven by
    ``designs.drive`` against simulated lifetimes: the faithful probe's from ``lifetimes``, the
    fast probe's (a header that narrows) from ``fast``; ``rejected`` positions the compatibility
    gate refuses (the fast probe runs there, the faithful one cannot). ``cap``: stop after this
    many runs of either probe (a budget stop). ``priors``: a bench's what-if only (the search
    told p and q, bench/cost_bounds.py); a run always starts from the recipe's."""
    state = ledger.replay(JournalContents(dict(header), ()), priors)
    history = lifetimes.history
    runs = {Tier.NARROW: 0, Tier.FAITHFUL: 0}

    def evaluate(item: Item) -> Observation:
        position, tier = item.key
        if cap is not None and sum(runs.values()) >= cap:
            raise _Capped
        runs[tier] += 1
        detail: dict[str, Any] = {}
        if tier is Tier.NARROW:
            if fast is None:
                raise ValueError("the header narrows, but no fast probe was given")
            bug = fast.run(position)
            lifetimes.candidates.add(position)  # its artifact is paid for once, for both tiers
            if position in rejected:
                detail["gate"] = "rejected"
            verdict = Verdict.DIVERGENT if bug else Verdict.CLEAN
        elif position in rejected:
            lifetimes.candidates.add(position)
            verdict, detail = Verdict.UNTESTABLE, {"stage": "gate"}
        else:
            verdict = Verdict.DIVERGENT if lifetimes.run(position) else Verdict.CLEAN
        return Observation(item.commit, verdict, item.lifetime_id, detail)

    end, message, contradicted = EndState.BUDGET, f"stopped after {cap} runs", ""
    with contextlib.suppress(_Capped):
        finish = drive(BisectDesign(state, slots=slots), evaluate)
        end, message = finish.state, finish.message
        contradicted = str(finish.extra.get("contradicted", ""))
    block = state.strategy.summary().block
    answer = state.standing()
    if end is EndState.DONE:
        right = history.flip is not None and history.flip in block
        outcome = Outcome.RIGHT if right else Outcome.WRONG
    elif history.flip is None and end is EndState.ENDS_CONTRADICT and contradicted == "good":
        outcome = Outcome.RIGHT
    else:
        outcome = Outcome.NO_ANSWER
    return DesignRun(end, message, block, answer.confidence, contradicted, outcome,
                     runs[Tier.NARROW], runs[Tier.FAITHFUL])


# -- the baselines ----------------------------------------------------------------------------


def _run_fixed(h: Lifetimes, repeats: int) -> Outcome:
    """Bisection with ``repeats`` lifetimes per candidate, bad if any diverges. It always names
    a commit: where the good end is bad, that is wrong."""

    def is_bad(position: int) -> bool:
        return any([h.run(position) for _ in range(repeats)])

    n = h.history.n
    is_bad(0)  # confirm the labels once each, as the Bayesian search does
    is_bad(n)
    old_bad = h.history.direction is Direction.FIX
    lo, hi = 0, n  # lo: on the old end's side, hi: on the new end's side
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if is_bad(mid) == old_bad:
            lo = mid
        else:
            hi = mid
    return Outcome.RIGHT if hi == h.history.flip else Outcome.WRONG


# -- the benchmark ------------------------------------------------------------------------------


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
    #: runs that stopped without naming a commit (not wrong), and their mean lifetimes
    no_answer: int = 0
    no_answer_evaluations: float = 0.0
    #: the upper end of the 95% Wilson interval of the wrong answers' share
    wrong_high: float = 0.0


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
class SimulationResult:
    candidates: int
    p: float
    q: float
    trials: int
    confidence: float
    lower_bound: LowerBound
    strategies: dict[str, StrategyStats]
    #: mean confidence the search stated where it named a commit (compare with its accuracy)
    bayes_reported_confidence: float = 0.0
    #: the given good end is in fact bad: right means saying so, not naming a commit
    good_end_bad: bool = False
    #: the history's shape in a few words ("" for one flip at p; see ``History.shape``)
    shape: str = ""
    #: the rate the good end and the commit next to the flip ran clean against (the header's
    #: ``[search] clean_against_rate``; 0.5 unless set)
    clean_against_rate: float = CLEAN_AGAINST_RATE

    def to_dict(self) -> dict[str, object]:
        return {
            "candidates": self.candidates,
            "p": self.p,
            "q": self.q,
            "trials": self.trials,
            "confidence": self.confidence,
            "bayes_reported_confidence": self.bayes_reported_confidence,
            "good_end_bad": self.good_end_bad,
            "shape": self.shape,
            "clean_against_rate": self.clean_against_rate,
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


#: what a trial builds its history from: (n, its random stream) -> the history
Shape = tuple[str, tuple[Any, ...]]


@dataclass(frozen=True)
class _Settings:
    n: int
    p: float
    q: float
    costs: Costs
    confidence: float
    repeats: int
    budget: int | None
    priors: Priors | None = None
    shape: Shape = ("step", ())
    tiered: bool = False
    narrow_cost: float = 0.1
    stand_in_wrong: bool = False
    clean_against_rate: float | None = None  # None: the recipe's default


def _history(s: _Settings, rng: np.random.Generator) -> History:
    kind, args = s.shape
    flip = int(rng.integers(1, s.n + 1))
    if kind == "good end bad":
        return beyond_good_end(s.n, s.p)
    if kind == "rate step":
        low, high = args
        return rate_step(s.n, low, high, s.q)
    if kind == "flaky good end":
        (rate,) = args
        return flaky_good_end(s.n, rate, flip, s.p, s.q)
    return step(s.n, flip, s.p, s.q)


# one trial: per strategy (outcome, lifetimes, cost, candidates), and the stated confidence
_Row = tuple[Outcome, int, float, int]


def _trial(args: tuple[_Settings, int]) -> tuple[dict[str, _Row], float | None]:
    s, seed = args
    rng = np.random.default_rng(seed)
    history = _history(s, rng)
    stream = int(rng.integers(2**63))
    out: dict[str, _Row] = {}
    stated: float | None = None
    for name in STRATEGIES + ((TIERED,) if s.tiered else ()):
        h = Lifetimes(history, np.random.default_rng(stream))
        extra = 0.0
        if name in ("bayes", TIERED):
            fast = None
            if name == TIERED:
                fast_flip = history.flip or 1
                if s.stand_in_wrong:  # anywhere but the bug's own flip
                    fast_flip = int(rng.integers(1, s.n))
                    fast_flip += fast_flip >= (history.flip or 1)
                fast = Lifetimes(step(s.n, fast_flip, 1.0, 0.0, history.direction),
                                 np.random.default_rng(stream + 1))
            header = search_header(history, confidence=s.confidence, costs=s.costs,
                                   budget=s.budget, narrow=fast is not None,
                                   clean_against_rate=s.clean_against_rate)
            run = run_design(header, h, fast=fast, priors=s.priors)
            outcome = run.outcome
            if name == "bayes" and run.end is EndState.DONE:
                stated = run.confidence
            if fast is not None:
                extra = run.fast_runs * s.narrow_cost * s.costs.lifetime
        else:
            outcome = _run_fixed(h, 1 if name == "classic" else s.repeats)
        out[name] = (outcome, h.count, h.cost(s.costs) + extra, len(h.candidates))
    return out, stated


def _stats(rows: list[_Row]) -> StrategyStats:
    evaluations = np.array([r[1] for r in rows])
    right = sum(1 for r in rows if r[0] is Outcome.RIGHT)
    wrong = sum(1 for r in rows if r[0] is Outcome.WRONG)
    silent = [r[1] for r in rows if r[0] is Outcome.NO_ANSWER]
    return StrategyStats(
        accuracy=right / len(rows),
        mean_evaluations=float(evaluations.mean()),
        p95_evaluations=float(np.percentile(evaluations, 95)),
        mean_cost=float(np.mean([r[2] for r in rows])),
        mean_candidates=float(np.mean([r[3] for r in rows])),
        errors=wrong,
        accuracy_interval=wilson_interval(right, len(rows)),
        no_answer=len(silent),
        no_answer_evaluations=float(np.mean(silent)) if silent else 0.0,
        wrong_high=wilson_interval(wrong, len(rows))[1],
    )


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
    budget: int | None = None,
    priors: Priors | None = None,
    processes: int | None = None,
    good_end_bad: bool = False,
    rate_step_at: tuple[int, float, int] | None = None,
    flaky_good_end_rate: float | None = None,
    tiered: bool = False,
    narrow_cost: float = 0.1,
    stand_in_wrong: bool = False,
    clean_against_rate: float | None = None,
) -> SimulationResult:
    """``trials`` random histories searched by every strategy: one flip uniform in 1..N at p
    and q, or the shape asked (``good_end_bad``; ``rate_step_at`` = (a, p1, b): a regression
    whose bug shows at p1 from position a and at p from b, positions counted from the good end;
    ``flaky_good_end_rate``: the good end at that rate, a flip uniform in 1..N at p).
    ``budget``: the search's lifetimes (the product's ``max_evaluations`` unless given).
    ``clean_against_rate``: the header's ``[search] clean_against_rate`` (None: the default).

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
    n = candidates  # the hypotheses f = 1..N: positions 0..N
    shape: Shape = ("step", ())
    if good_end_bad:
        shape = ("good end bad", ())
    elif rate_step_at is not None:
        a, p1, b = rate_step_at
        rate_step(n, (a, p1), (b, p), q)  # checks the positions
        shape = ("rate step", ((a, p1), (b, p)))
    elif flaky_good_end_rate is not None:
        shape = ("flaky good end", (flaky_good_end_rate,))
    if clean_against_rate is not None and not 0 < clean_against_rate < 1:
        raise UsageError("--clean-against must be in (0, 1)")
    settings = _Settings(n, p, q, costs, confidence, repeats, budget, priors, shape, tiered,
                         narrow_cost, stand_in_wrong, clean_against_rate)
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
    stats = {name: _stats([r[0][name] for r in rows])
             for name in STRATEGIES + ((TIERED,) if tiered else ())}
    stated = [r[1] for r in rows if r[1] is not None]
    first = _history(settings, np.random.default_rng(0))
    return SimulationResult(
        candidates,
        p,
        q,
        trials,
        confidence,
        lower_bound(candidates, p, q, costs),
        stats,
        bayes_reported_confidence=float(np.mean(stated)) if stated else 0.0,
        good_end_bad=good_end_bad,
        shape=first.shape,
        clean_against_rate=(CLEAN_AGAINST_RATE if clean_against_rate is None
                            else clean_against_rate),
    )
