"""Every slot busy: the lifetimes the answer is still expected to need, and where. Pure.

The search picks one lifetime at a time (``BayesianStrategy.select``). With k slots the
confirm step needs more: how many lifetimes the answer will take from here, on which side, so
that every slot starts one of them at once and none stands idle while more are expected (on
the H100 a two-slot run went one lifetime at a time and took 409 s where two at a time take
about half: issue 39). ``plan`` plays the search forward on a copy: each lifetime under way
and each one it plans comes back as the posterior expects (on the bad side it shows the bug at
p's estimated rate, on the good side at q's, ``expected_divergent``), until the search would
stop; the plan is what the search picked on the way. ``next_lifetimes`` hands the free slots
the plan's next lifetimes, both sides at once (``interleave``), and nothing when the lifetimes
under way are expected to end the search by themselves.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence

from bisect_tool.strategy import BayesianStrategy, NoCandidateLeft, Summary

#: the most lifetimes a plan looks ahead: enough for any slots a host has, and a bound on the
#: time a decision takes (each planned lifetime is one posterior update on a copy)
PLAN_MOST = 32

#: (the search as planned so far) -> whether it would stop there
Stops = Callable[[BayesianStrategy], bool]


def expected_divergent(s: Summary, position: int, p: float, q: float) -> bool:
    """How the next lifetime at ``position`` is expected to come back: with the candidate's
    lifetimes showing the bug at its side's rate (p on the bad side, q on the good one), the
    next one is divergent when that makes the divergent count nearest ``rate`` x lifetimes. So
    at p = 0.75 a bad side's lifetimes go divergent, divergent, clean, divergent..., its own
    journaled lifetimes counted first; never all divergent, as p = 1 would have them."""
    rate = p if s.bad_side[position] >= 0.5 else q
    d, t = int(s.divergent[position]), int(s.total[position])
    return d + 1 <= rate * (t + 1) + 0.5


def plan(
    strategy: BayesianStrategy,
    running: Sequence[int],
    stops: Stops,
    *,
    within: tuple[int, int] | None = None,
    most: int = PLAN_MOST,
) -> list[int]:
    """The positions of the lifetimes the answer is expected to need beyond those ``running``,
    in the order the search would pick them (``within``: the confirm step's two sides)."""
    rates = strategy.rates()
    p, q = rates.p_median, rates.q_median
    what_if = copy.deepcopy(strategy)
    for position in running:
        what_if.record(position, expected_divergent(what_if.summary(), position, p, q))
    out: list[int] = []
    while len(out) < most:
        if stops(what_if):
            break
        s = what_if.summary()
        try:
            position = what_if.select(within).position
        except NoCandidateLeft:
            break
        out.append(position)
        what_if.record(position, expected_divergent(s, position, p, q))
    return out


def interleave(positions: Sequence[int]) -> list[int]:
    """``positions`` with each one's count kept, taken in turns in the order each first
    appears: [bad, bad, bad, good, good] -> [bad, good, bad, good, bad], so slots started
    together run both sides at once."""
    left = Counter(positions)
    order = list(dict.fromkeys(positions))
    out: list[int] = []
    while len(out) < len(positions):
        for position in order:
            if left[position]:
                out.append(position)
                left[position] -= 1
    return out


def next_lifetimes(
    strategy: BayesianStrategy,
    running: Sequence[int],
    free: int,
    stops: Stops,
    *,
    within: tuple[int, int] | None = None,
) -> list[int]:
    """What ``free`` slots start now, beside the lifetimes ``running``: the plan's next ones,
    both sides in turn counting those under way; [] when those under way are expected to end
    the search."""
    if free <= 0:
        return []
    planned = plan(strategy, running, stops, within=within)
    queue = interleave([*running, *planned])
    for position in running:
        queue.remove(position)
    return queue[:free]
