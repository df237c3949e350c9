"""The tiered search: a fast probe narrows the range, the faithful probe confirms the flip.

Pure: plain values and strategies in, plain values out (no git, HTTP, Docker or click).

A server lifetime of real vLLM costs about a minute; the focused op check of the seed's bug
(vLLM issue 51187) answers in seconds per candidate, and deterministically. A recipe that
declares such a stand-in (``[probe] narrow = "op"``) gets three phases:

- **narrow**: the fast probe's own search (a ``BayesianStrategy`` of its own) runs until it
  holds the asked confidence;
- **confirm**: faithful lifetimes (server lifetimes) on both sides of the flip it found, the
  last candidate with the bug and the first without it (nearest ones the faithful tier can run);
- **faithful**: the plain search with faithful lifetimes, over the whole range. The run falls
  back to it when the fast probe could not narrow (it never showed the bug at the bad end, its
  ends contradicted each other) or when the faithful lifetimes disagree with it at its flip;
  nothing observed before is dropped.

Why the confirmation is enough. The faithful search's prior over the flip F is a mixture: with
probability ``stand_in`` (the recipe's ``[search] stand_in_prior``, 0.5 by default) the fast
probe is a valid stand-in and F is where the fast probe flips (its posterior), otherwise F is
anywhere, as in a plain search. The faithful lifetimes are scored under the same model as
always, p and q integrated out. A bad-side lifetime that diverges and good-side lifetimes that
stay clean make every other flip unlikely together: a flip elsewhere needs either the stand-in
to be wrong AND the faithful flip to land exactly between the two (1 chance in N) or the clean
side to be unlucky. The answer's confidence is that posterior's mass, and the report shows
P(stand-in valid) next to it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from bisect_tool.strategy import BayesianStrategy, Priors, Summary
from bisect_tool.strategy.ends import doubts
from bisect_tool.values import Direction


class Tier(enum.StrEnum):
    """Which probe an observation came from (the journal's ``tier``; absent = faithful)."""

    NARROW = "narrow"  # the fast stand-in (the op probe)
    FAITHFUL = "faithful"  # the recipe's own probe (server lifetimes)


class Phase(enum.StrEnum):
    """Where a tiered run stands (the journal's ``phase`` entries)."""

    NARROW = "narrow"
    CONFIRM = "confirm"
    FAITHFUL = "faithful"


#: the faithful posterior says the fast probe's flip is wrong (its bad side clean, or its good
#: side buggy) with this probability: the run leaves the confirm step. A wrong call here costs
#: only time (the plain search follows, with every observation kept; a wrong answer is guarded
#: by the stopping threshold, not by this), but a lot of it: at 0.95 a valid stand-in was left
#: in 1 of 200 simulated runs at p = 0.5, for the few lifetimes more that 0.99 asks
DISAGREE_AT = 0.99
#: runs of the fast probe at the bad end: it is deterministic (below), so a clean run there means
#: it cannot show this bug, and the faithful search takes over
NARROW_END_RUNS = 1


def narrow_priors(end_doubt: float) -> Priors:
    """The fast probe's model: deterministic. The op check runs fixed inputs through the
    candidate's kernels, so a second run repeats the first one's rows (vLLM #51187: 16/32 and
    32/32 differing cases on v0.26.0, 0/32 on v0.27.0, the same in every run). It shows the
    bug in every run on its bad side (p = 1) and all but never on its good side (a false
    alarm's prior mean 1e-4), so one run settles a candidate and 2 runs at once split the range
    in three. A stand-in that is in fact flaky at worst brackets a wrong flip; the confirm
    step's lifetimes are scored with 1 - stand_in_prior of the prior off that flip, and catch
    it (``bisect simulate --stand-in-wrong``)."""
    return Priors(end_doubt=end_doubt, p_point_mass=1.0, q_alpha=0.005, q_beta=50.0)


@dataclass(frozen=True)
class Sides:
    """The two candidates the confirm step runs: the last with the bug, the first without."""

    bad: int
    good: int

    def as_tuple(self) -> tuple[int, int]:
        return (self.bad, self.good)


def confirm_sides(narrow: Summary, faithful: Summary) -> Sides | None:
    """Both sides of the fast probe's flip block, moved outward past candidates the faithful
    tier cannot run (e.g. releases whose extension the pinned stack rejects); None when one
    side has none left."""
    first, last = narrow.block[0], narrow.block[-1]
    # Hypothesis f puts positions >= f on the new side: the old-side neighbour is first - 1,
    # the new-side one is last (untestable commits between them make the block).
    old = next((i for i in range(first - 1, -1, -1) if i not in faithful.untestable), None)
    new = next((i for i in range(last, faithful.size) if i not in faithful.untestable), None)
    if old is None or new is None:
        return None
    if narrow.direction is Direction.FIX:  # the old side carries the bug
        return Sides(bad=old, good=new)
    return Sides(bad=new, good=old)


@dataclass(frozen=True)
class MixturePrior:
    """The faithful search's prior in the confirm step, and its two components."""

    in_range: np.ndarray  # weight of F = f for f = 1..n
    ends: tuple[float, float]  # (beyond the good end, bad end not bad)
    stand_in: float
    valid: tuple[np.ndarray, tuple[float, float]]  # F follows the fast probe's posterior
    plain: tuple[np.ndarray, tuple[float, float]]  # F anywhere, as in a plain search


def plain_prior(size: int, end_doubt: float) -> tuple[np.ndarray, tuple[float, float]]:
    """A plain search's prior over the flip, as ``set_prior``'s arguments: every flip of a range
    of ``size`` positions alike, ``end_doubt`` on each end."""
    n = size - 1
    return np.full(n, (1 - 2 * end_doubt) / n), (end_doubt, end_doubt)


def mixture_prior(narrow: BayesianStrategy, stand_in: float, end_doubt: float) -> MixturePrior:
    """P(F) = stand_in * P_fast(F) + (1 - stand_in) * P_plain(F)."""
    if not 0 <= stand_in < 1:
        raise ValueError("stand_in_prior must be in [0, 1)")
    summary = narrow.summary()
    plain_in, plain_ends = plain_prior(summary.size, end_doubt)
    valid_in = np.asarray(narrow.posterior(), dtype=float).copy()
    valid_ends = (summary.good_end_doubt, summary.bad_end_doubt)
    in_range = stand_in * valid_in + (1 - stand_in) * plain_in
    ends = (
        stand_in * valid_ends[0] + (1 - stand_in) * plain_ends[0],
        stand_in * valid_ends[1] + (1 - stand_in) * plain_ends[1],
    )
    return MixturePrior(in_range, ends, stand_in, (valid_in, valid_ends),
                        (plain_in, plain_ends))


def stand_in_probability(faithful: Summary, prior: MixturePrior) -> float:
    """P(the fast probe is a valid stand-in | the faithful lifetimes), under the mixture."""
    log_like, end_like = faithful.log_likelihood, faithful.end_log_likelihood

    def evidence(component: tuple[np.ndarray, tuple[float, float]]) -> float:
        weights, ends = component
        with np.errstate(divide="ignore"):
            terms = np.concatenate([log_like + np.log(weights), end_like + np.log(ends)])
        finite = terms[np.isfinite(terms)]
        if not len(finite):
            return -math.inf
        top = float(finite.max())
        return top + math.log(float(np.exp(finite - top).sum()))

    valid = math.log(prior.stand_in) + evidence(prior.valid) if prior.stand_in > 0 else -math.inf
    plain = math.log1p(-prior.stand_in) + evidence(prior.plain)
    top = max(valid, plain)
    if top == -math.inf:
        return prior.stand_in
    return math.exp(valid - top) / (math.exp(valid - top) + math.exp(plain - top))


def lifetimes_alone(faithful: BayesianStrategy, plain: tuple[np.ndarray, tuple[float, float]]
                    ) -> float:
    """The confidence from the server lifetimes alone: the faithful tier's evidence under a
    plain search's prior (``MixturePrior.plain``), the fast probe's share left out, the checks'
    doubts taken off as a plain search states them. It is the report's "from the server
    lifetimes alone" (the journal replayed without the op check). On the H100 a tiered run
    stopped at 99.7 % with it at 96.7 %: three clean lifetimes beside the flip, the rest the op
    check's prior; issue 39 asks for the asked confidence on the lifetimes' own evidence."""
    s = faithful.summary_under(*plain)
    return doubts(s).held(s.confidence)


def confirmed(faithful: BayesianStrategy, sides: Sides,
              plain: tuple[np.ndarray, tuple[float, float]], confidence: float) -> bool:
    """The confirm step's answer holds: both sides have spoken (the prior alone, the fast
    probe's flip, is never the answer), the flip holds the stop threshold with the op check's
    narrowing, and the asked ``confidence`` on the lifetimes' own evidence."""
    s = faithful.summary()
    return bool(s.divergent[sides.bad] and s.total[sides.good] and s.done
                and lifetimes_alone(faithful, plain) >= confidence)


def disagreement(faithful: Summary, sides: Sides) -> str | None:
    """Which side the faithful lifetimes put on the other side of the flip, at DISAGREE_AT:
    "bad" (the fast probe's last buggy candidate looks clean to them), "good" (its first fixed
    candidate shows the bug), or None."""
    bad_side = faithful.bad_side
    if 1 - bad_side[sides.bad] >= DISAGREE_AT:
        return "bad"
    if bad_side[sides.good] >= DISAGREE_AT:
        return "good"
    return None
