"""The search's plain values: its priors and costs, a choice, and where it stands. Pure."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bisect_tool.values import Direction

#: the search stops when the top block holds 1 - (1 - confidence) * STOP_FACTOR. The posterior
#: is calibrated on average over the prior on p, not for every p: at a fixed p of 0.3-0.5
#: stopping at exactly 0.99 was right 98.2-98.8% of the time (`bisect simulate`, 500-1000
#: trials), stopping at 0.995 99.2-99.6% (1,500-3,000 trials a cell). Stricter still (0.997)
#: reached 99.4-99.7% but cost 1.51x the lower bound at N = 512, p = 0.5, q = 0.01 (0.995:
#: 1.49x); so did a flat prior on p, or a second, flatter prior that must also agree before
#: stopping (docs/simulate-grid.txt). The report still shows the posterior.
STOP_FACTOR = 0.5


def stop_threshold(confidence: float) -> float:
    """The top-block mass at which the search stops (stricter than ``confidence``)."""
    return 1 - (1 - confidence) * STOP_FACTOR


#: the default floor the good end and the flip's neighbour must stay clean against
#: (``Priors.clean_against_rate``; ``strategy.ends`` says why one half)
CLEAN_AGAINST_RATE = 0.5


@dataclass(frozen=True)
class Priors:
    # prior probability that the bug shows in every bad-side lifetime. 0.5 made the search
    # overconfident at p = 0.5-0.8: three divergences in a row left p = 1 likely, and under
    # p = 1 a single clean lifetime "proves" a candidate good (97.5% right at N = 512, p = 0.5)
    p_point_mass: float = 0.2
    # Beta prior of p when it is not exactly 1: Beta(2, 1) leans away from p near 0, where
    # p ~ q would let a long clean run next to the flip be explained as a rare bug
    p_alpha: float = 2.0
    p_beta: float = 1.0
    q_alpha: float = 0.5  # Beta prior of the false-alarm rate: mean ~0.01, not 0
    q_beta: float = 50.0
    # prior probability, for each end, that it does not behave as the user said: the flip lies
    # beyond the given good end (it shows the bug too, just not yet seen: the seed thread records
    # a whole clean lifetime of the buggy v0.26.0), or the bad end does not show the bug at all.
    # The stated confidence is then P(flip at the named commit AND both ends as claimed).
    end_doubt: float = 0.05
    # the rate the good end and the good-side candidate next to the flip must stay clean
    # against before a commit is named (``strategy.ends.clean_not_earned``): a bug shown there
    # at this rate or more would have shown; a rarer one is caught only where it shows. The
    # recipe's ``[search] clean_against_rate`` (``--clean-against``)
    clean_against_rate: float = CLEAN_AGAINST_RATE


@dataclass(frozen=True)
class Costs:
    new_candidate: float = 10.0
    lifetime: float = 1.0


@dataclass(frozen=True)
class Choice:
    """What to run next: ``lifetimes`` lifetimes at ``position``."""

    position: int
    lifetimes: int
    reason: str
    rate: float = 0.0


@dataclass(frozen=True)
class Rates:
    """What the lifetimes say about the two rates (p: the bad side's, q: false alarms)."""

    p_median: float
    p_interval: tuple[float, float]  # 90%
    q_median: float
    q_interval: tuple[float, float]
    #: P(the bug shows in every bad-side lifetime)
    p_is_one: float


@dataclass(frozen=True, eq=False)
class Summary:
    """Where the search stands, in plain values: what every caller reads (the design, the
    tiers, the report through ``session``), so none reaches into the search. Positions are
    ``0 .. size - 1``; flips (hypotheses) ``1 .. size - 1``. The arrays are read-only copies.
    """

    size: int
    direction: Direction
    bad_end: int  # as given
    good_end: int
    #: (bad, good) as the search checks them: the given ends, or where one is untestable, the
    #: nearest testable candidate toward the other end; None when none is left
    ends: tuple[int | None, int | None]
    divergent: np.ndarray  # lifetimes that showed the bug, per position
    total: np.ndarray  # conclusive lifetimes, per position
    untestable: frozenset[int]
    #: positions whose artifacts are at hand (run here, or fetched by the other tier)
    at_hand: frozenset[int]
    block: tuple[int, ...]  # flips the answer may be (one unless untestables surround it)
    confidence: float  # posterior mass of that block
    credible_set: tuple[int, ...]  # smallest set of flips holding 90% of the mass
    candidates_left: int  # size of the 99% credible set (progress)
    #: P(the flip lies beyond the good end: it shows the bug too)
    good_end_doubt: float
    #: P(the bad end does not show the bug: nothing in the range does)
    bad_end_doubt: float
    threshold: float  # the top-block mass the search stops at (``stop_threshold``)
    done: bool  # the top block holds it
    #: whether a lifetime on the bad side of the top block showed the bug (usually the bad
    #: end; after a fall-back, a divergence inside the range counts as well)
    bug_shown: bool
    #: "good" or "bad" when the evidence says, at the threshold, that that end does not
    #: behave as claimed
    contradicted_end: str | None
    #: (clean, divergent) positions no single flip explains without a false alarm or a missed
    #: bug (a clean lifetime at least as near the bad end as a divergent one); None if none
    contradiction: tuple[int, int] | None
    bad_side: np.ndarray  # P(position i is on the bad side), i = 0 .. size - 1
    evaluations: int
    candidates_tested: int
    deterministic: bool  # one run a candidate (``--deterministic``, the fast probe)
    priors: Priors
    costs: Costs
    #: log P(evidence | flip f) for f = 1 .. size - 1, and for the two end hypotheses (beyond
    #: the good end, bad end not bad), p and q integrated out and no prior: what a caller needs
    #: to weigh alternative priors (``tiers.stand_in_probability``)
    log_likelihood: np.ndarray
    end_log_likelihood: np.ndarray


class NoCandidateLeft(Exception):
    """Nothing testable can narrow the range further."""
