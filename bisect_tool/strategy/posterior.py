"""The posterior over the flip: P(flip at f, and both ends as claimed | the lifetimes). Pure.

A hypothesis ``f`` in ``1..n`` says the first commit with the new behaviour is at ``f``:
positions ``>= f`` behave like the new end, positions ``< f`` like the old end. Which side is
*bad* depends on the direction: for a regression the new side is, for a fix the old side. Two
more hypotheses say an end is not what the user said: "the flip lies beyond the good end" and
"the bad end does not show the bug", each with prior mass ``Priors.end_doubt``.

A bad-side lifetime shows the bug with unknown probability ``p``, a good-side one with an
unknown false-alarm rate ``q``; both are integrated out in closed form (``q`` ~ Beta, ``p`` ~ a
Beta mixed with a point mass at exactly 1). The posterior needs only prefix sums of (divergent,
total) counts, in log space: O(n) per update, cached until the evidence or the prior changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from bisect_tool.strategy.beta import log_beta
from bisect_tool.strategy.evidence import Evidence
from bisect_tool.strategy.values import Priors
from bisect_tool.values import Direction


class _LogGammaTable:
    """lgamma(offset + k) for integer k, grown on demand: counts are integers."""

    def __init__(self, offset: float) -> None:
        self.offset = offset
        self.values = np.array([math.lgamma(offset + k) for k in range(64)])

    def __call__(self, k: np.ndarray) -> np.ndarray:
        top = int(k.max(initial=0))
        if top >= len(self.values):
            size = max(top + 1, 2 * len(self.values))
            self.values = np.array([math.lgamma(self.offset + i) for i in range(size)])
        out: np.ndarray = self.values[k]
        return out


class _BetaBinomial:
    """log of the probability of a given sequence with D successes in T, p ~ Beta(a, b)."""

    def __init__(self, a: float, b: float) -> None:
        self.la, self.lb, self.lab = _LogGammaTable(a), _LogGammaTable(b), _LogGammaTable(a + b)
        self.norm = log_beta(a, b)

    def __call__(self, d: np.ndarray, t: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.la(d) + self.lb(t - d) - self.lab(t) - self.norm
        return out


@dataclass(frozen=True)
class Base:
    """Per-hypothesis side counts and log joint for the current evidence (cached)."""

    bad_d: np.ndarray
    bad_t: np.ndarray
    good_d: np.ndarray
    good_t: np.ndarray
    log_joint: np.ndarray
    log_z: float
    end_joint: np.ndarray  # (beyond the good end, bad end not bad), with their prior weight
    log_like: np.ndarray  # log_joint without the prior
    end_like: np.ndarray  # end_joint without the prior


class FlipPosterior:
    """The posterior over the flip for the lifetimes in ``evidence`` (read, never written)."""

    def __init__(self, evidence: Evidence, priors: Priors) -> None:
        self.evidence = evidence
        self.n = evidence.n
        self.direction = evidence.direction
        self.priors = priors
        self.bb_p = _BetaBinomial(priors.p_alpha, priors.p_beta)
        self.bb_q = _BetaBinomial(priors.q_alpha, priors.q_beta)
        self.hyp = np.arange(1, self.n + 1)
        # The two end hypotheses as flip positions outside 1..n: "every position is on the bad
        # side" (the good end too) and "every position is on the good side" (the bad end too).
        # For a regression the bad side is >= f, so these are f = 0 and f = n + 1; for a fix
        # (bad side < f) the other way round. Order: (beyond the good end, bad end not bad).
        if self.direction is Direction.REGRESSION:
            self.end_hyp = np.array([0, self.n + 1])
        else:
            self.end_hyp = np.array([self.n + 1, 0])
        doubt = priors.end_doubt
        if not 0 <= doubt < 0.5:
            raise ValueError("end_doubt must be in [0, 0.5)")
        if not 0 < priors.clean_against_rate < 1:
            raise ValueError("clean_against_rate must be in (0, 1)")
        # prior weight of each end hypothesis relative to one in-range flip, whose prior is
        # (1 - 2 doubt) / n; -inf switches them off
        end_log_prior = math.log(doubt * self.n / (1 - 2 * doubt)) if doubt > 0 else -math.inf
        # Log prior weight (relative) of each in-range hypothesis f = 1..n and of the two end
        # hypotheses: uniform by default; ``set_prior`` replaces them (the tiered search's
        # confirm step starts from what the fast probe found: bisect_tool.strategy.tiers).
        self.log_prior = np.zeros(self.n)
        self.end_log_prior = np.array([end_log_prior, end_log_prior])
        self._flips: np.ndarray | None = None
        self._base: Base | None = None

    def set_prior(self, in_range: np.ndarray, ends: tuple[float, float]) -> None:
        """Replace the prior: ``in_range[f - 1]`` for each flip f = 1..n and ``ends`` = (beyond
        the good end, bad end not bad), as non-negative weights (normalised here)."""
        weights = np.asarray(in_range, dtype=float)
        if weights.shape != (self.n,) or (weights < 0).any() or min(ends) < 0:
            raise ValueError("a prior needs n non-negative weights and two for the ends")
        total = float(weights.sum()) + sum(ends)
        if total <= 0:
            raise ValueError("a prior needs some positive weight")
        with np.errstate(divide="ignore"):
            self.log_prior = np.log(weights / total)
            self.end_log_prior = np.log(np.asarray(ends, dtype=float) / total)
        self.invalidate()

    def invalidate(self) -> None:
        self._flips = None
        self._base = None

    # -- the likelihood -----------------------------------------------------------------------

    def split(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(D, T) on the bad side and on the good side, for each hypothesis f = 1..n."""
        cd, ct = np.cumsum(self.evidence.divergent), np.cumsum(self.evidence.total)
        old_d, old_t = cd[:-1], ct[:-1]  # positions 0..f-1 for f = 1..n
        new_d, new_t = cd[-1] - old_d, ct[-1] - old_t
        if self.direction is Direction.REGRESSION:
            return new_d, new_t, old_d, old_t  # bad side is the new side
        return old_d, old_t, new_d, new_t

    def log_joint(
        self, bad_d: np.ndarray, bad_t: np.ndarray, good_d: np.ndarray, good_t: np.ndarray
    ) -> np.ndarray:
        """log P(the counts on each side), p and q integrated out."""
        w = self.priors.p_point_mass
        beta_part = math.log1p(-w) + self.bb_p(bad_d, bad_t) if w < 1 else -np.inf
        if w <= 0:
            like_p = np.asarray(beta_part + np.zeros(np.shape(bad_d)))
        else:
            like_p = np.logaddexp(beta_part, np.where(bad_d == bad_t, math.log(w), -np.inf))
        out: np.ndarray = like_p + self.bb_q(good_d, good_t)
        return out

    def end_counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(bad D, bad T, good D, good T) under each end hypothesis: all on one side."""
        d, t = int(self.evidence.divergent.sum()), int(self.evidence.total.sum())
        return np.array([d, 0]), np.array([t, 0]), np.array([0, d]), np.array([0, t])

    def base(self) -> Base:
        if self._base is None:
            bad_d, bad_t, good_d, good_t = self.split()
            log_like = self.log_joint(bad_d, bad_t, good_d, good_t)
            end_like = self.log_joint(*self.end_counts())
            log_joint = log_like + self.log_prior
            end_joint = end_like + self.end_log_prior
            every = np.concatenate([log_joint, end_joint])
            top = float(every.max())
            log_z = top + math.log(float(np.exp(every - top).sum()))
            self._base = Base(
                bad_d, bad_t, good_d, good_t, log_joint, log_z, end_joint, log_like, end_like
            )
        return self._base

    # -- what it says ---------------------------------------------------------------------------

    def flips(self) -> np.ndarray:
        """P(flip at f and both ends as claimed) for f = 1..n, as an array of length n (index
        f - 1). It sums to 1 minus the two end doubts (``end_doubts``)."""
        if self._flips is None:
            base = self.base()
            self._flips = np.exp(base.log_joint - base.log_z)
        return self._flips

    def end_doubts(self) -> tuple[float, float]:
        """(P(the flip lies beyond the good end), P(the bad end does not show the bug))."""
        base = self.base()
        beyond, not_bad = np.exp(base.end_joint - base.log_z)
        return float(beyond), float(not_bad)

    def top_block(self) -> tuple[tuple[int, ...], float]:
        """The block of flips (hypotheses no testable commit separates) with the most mass."""
        ids = self.evidence.block_ids()
        mass = np.bincount(ids, weights=self.flips())
        best = int(np.argmax(mass))
        return tuple(int(f) for f in self.hyp[ids == best]), float(mass[best])

    def credible_set(self, mass: float) -> tuple[int, ...]:
        post = self.flips()
        order = np.argsort(-post, kind="stable")
        cumulative = np.cumsum(post[order])
        k = min(int(np.searchsorted(cumulative, mass)) + 1, len(order))
        return tuple(sorted(int(i) + 1 for i in order[:k]))

    def bad_side(self) -> np.ndarray:
        """P(position i is on the bad side) for i = 0..n."""
        # position i is on the new side iff f <= i; the end hypothesis at f = 0 puts every
        # position there
        below = self.end_doubts()[0 if self.direction is Direction.REGRESSION else 1]
        new_side = np.clip(below + np.concatenate([[0.0], np.cumsum(self.flips())]), 0.0, 1.0)
        out: np.ndarray = new_side if self.direction is Direction.REGRESSION else 1.0 - new_side
        return out

    def bug_shown(self) -> bool:
        """Whether a lifetime on the bad side of the answer (the top block) showed the bug.

        Usually that is the bad end. After the tiered search falls back to lifetimes over the
        whole range, a divergence already seen inside the range (at the fast probe's flip) shows
        the bug as well: the bad end need not be made to show it again before an answer."""
        block, _ = self.top_block()
        return bool(self.base().bad_d[block[0] - 1] > 0)

    def contradicted_end(self, threshold: float) -> str | None:
        """"good" or "bad" when the evidence says, at ``threshold``, that that end does not
        behave as claimed; None otherwise."""
        beyond, not_bad = self.end_doubts()
        if beyond >= threshold:
            return "good"
        if not_bad >= threshold:
            return "bad"
        return None
