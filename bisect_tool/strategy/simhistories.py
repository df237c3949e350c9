"""The simulated histories `bisect simulate` searches (``bisect_tool.designs.simulate``): how often
a
lifetime shows the bug at each candidate, the right answer, the lifetimes drawn from them, and
the least any search can pay on one (Fano's bound on the channel bad -> Bernoulli(p), good ->
Bernoulli(q))."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bisect_tool.errors import UsageError
from bisect_tool.strategy import Costs
from bisect_tool.values import Direction


@dataclass(frozen=True)
class History:
    """A simulated range: positions ``0 .. n`` in history order (0 the old end); a lifetime at
    position ``i`` shows the bug with probability ``rates[i]``. ``flip``: the right answer (the
    first candidate with the new behaviour), or None where the given good end is itself bad
    (the right answer is then to say so). ``shape``: the history in a few words."""

    rates: tuple[float, ...]
    direction: Direction
    flip: int | None
    shape: str = ""

    @property
    def n(self) -> int:
        return len(self.rates) - 1


def step(n: int, flip: int, p: float, q: float, direction: Direction = Direction.FIX) -> History:
    """One flip at ``flip`` (1..n): the bad side at ``p``, the good side at ``q``. The grid
    searches for a fix, as in the seed: the old side (positions < flip) is bad."""
    old_bad = direction is Direction.FIX
    rates = tuple(p if (i < flip) == old_bad else q for i in range(n + 1))
    return History(rates, direction, flip)


def beyond_good_end(n: int, p: float) -> History:
    """A fix whose given good end is bad too: every position at ``p`` (the flip lies beyond
    the good end)."""
    return History((p,) * (n + 1), Direction.FIX, None, "good end bad")


def rate_step(n: int, low: tuple[int, float], high: tuple[int, float], q: float) -> History:
    """A regression whose bug shows at rate ``low[1]`` from position ``low[0]`` and at
    ``high[1]`` from ``high[0]`` on (a later commit makes it worse; issue 38: 15 % from c17,
    every lifetime from c26). The first bad commit is ``low[0]``; at 0 the given good end itself
    is bad."""
    (a, p1), (b, p2) = low, high
    if not 0 <= a < b <= n:
        raise UsageError(f"a rate step needs 0 <= {a} < {b} <= {n}")
    rates = tuple(q if i < a else p1 if i < b else p2 for i in range(n + 1))
    return History(rates, Direction.REGRESSION, a or None, f"step {p1:g}@{a} {p2:g}@{b}")


def flaky_good_end(n: int, rate: float, flip: int, p: float, q: float) -> History:
    """A regression with a flip at ``flip`` whose given good end shows the bug in a share
    ``rate`` of its lifetimes, the commits between clean (issue 30's history, issue 38's rate):
    the good end is not a good end, and naming the flip would say it is."""
    rates = (rate, *(q if i < flip else p for i in range(1, n + 1)))
    return History(rates, Direction.REGRESSION, None, f"good end at {rate:g}")


class Lifetimes:
    """A history's lifetimes, drawn on demand from one random stream, and what they cost."""

    def __init__(self, history: History, rng: np.random.Generator) -> None:
        self.history, self.rng = history, rng
        self.count = 0
        self.candidates: set[int] = set()

    def run(self, position: int) -> bool:
        self.count += 1
        self.candidates.add(position)
        return bool(self.rng.random() < self.history.rates[position])

    def cost(self, costs: Costs) -> float:
        return self.count * costs.lifetime + len(self.candidates) * costs.new_candidate


# -- the lower bound ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LowerBound:
    evaluations: float
    cost: float


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
