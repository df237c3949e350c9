"""`bisect simulate`: the real strategy against simulated intermittent histories.

A benchmark, not a test: users plan a budget with it, and we hold the strategy to its targets.
Costs: a new candidate costs ``cost_new``, each lifetime ``cost_lifetime`` (10 and 1 by default).
Every strategy pays the same price for the same work, and all run on the same histories.

- *bayes*: :class:`~bisect_tool.strategy.BayesianStrategy`, one lifetime at a time.
- *classic*: one lifetime per candidate, a bad one if it diverges (``git bisect run``), after
  one lifetime at each end to confirm the labels, as the Bayesian search also does.
- *fixed_repeats*: ``k`` lifetimes per candidate, bad if any diverges (syzkaller's and Chromium's
  "--times N" rule), after the same end checks.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from bisect_tool.strategy import BayesianStrategy, Costs, NoCandidateLeft
from bisect_tool.values import Direction


@dataclass(frozen=True)
class StrategyStats:
    accuracy: float
    mean_evaluations: float
    p95_evaluations: float
    mean_cost: float
    mean_candidates: float


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

    def to_dict(self) -> dict[str, object]:
        return {
            "candidates": self.candidates,
            "p": self.p,
            "q": self.q,
            "trials": self.trials,
            "confidence": self.confidence,
            "lower_bound": asdict(self.lower_bound),
            "strategies": {k: asdict(v) for k, v in self.strategies.items()},
        }


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


def _run_bayes(h: _History, costs: Costs, confidence: float, budget: int) -> int:
    strategy = BayesianStrategy(h.n + 1, Direction.FIX, costs=costs, confidence=confidence)
    while h.lifetimes < budget:
        if strategy.counts.total[strategy.bad_end] and strategy.counts.total[
            strategy.good_end
        ] and strategy.done():
            break
        try:
            choice = strategy.select()
        except NoCandidateLeft:
            break
        strategy.record(choice.position, h.run(choice.position))
    return strategy.top_block()[0][0]


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
    return LowerBound(lifetimes, lifetimes * costs.lifetime + bits * costs.new_candidate)


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
) -> SimulationResult:
    costs = costs or Costs()
    rng = np.random.default_rng(seed)
    n = candidates  # positions 0..n: the two ends and n - 1 commits between; flips in 1..n
    results: dict[str, list[tuple[bool, int, float, int]]] = {
        "bayes": [],
        "classic": [],
        "fixed_repeats": [],
    }
    for _ in range(trials):
        flip = int(rng.integers(1, n + 1))
        trial_seed = int(rng.integers(2**63))
        runners = {
            "bayes": lambda h: _run_bayes(h, costs, confidence, budget),
            "classic": lambda h: _run_fixed(h, 1),
            "fixed_repeats": lambda h: _run_fixed(h, repeats),
        }
        for name, runner in runners.items():
            h = _History(n, flip, p, q, np.random.default_rng(trial_seed))
            found = runner(h)
            results[name].append((found == flip, h.lifetimes, h.cost(costs), len(h.candidates)))
    stats = {}
    for name, rows in results.items():
        evaluations = np.array([r[1] for r in rows])
        stats[name] = StrategyStats(
            accuracy=float(np.mean([r[0] for r in rows])),
            mean_evaluations=float(evaluations.mean()),
            p95_evaluations=float(np.percentile(evaluations, 95)),
            mean_cost=float(np.mean([r[2] for r in rows])),
            mean_candidates=float(np.mean([r[3] for r in rows])),
        )
    return SimulationResult(
        candidates, p, q, trials, confidence, lower_bound(n, p, q, costs), stats
    )
