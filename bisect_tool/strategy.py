"""The search: a Bayesian posterior over the flip position for an intermittent probe.

Pure: plain values in, plain values out; no git, docker or HTTP here.

Positions ``0..n`` are the candidates in history order: position 0 is the *old end* (the older of
good/bad), position ``n`` the *new end*. A hypothesis ``f`` in ``1..n`` says the first commit with
the new behaviour is at ``f``: positions ``>= f`` behave like the new end, positions ``< f`` like
the old end. Which side is *bad* (shows the bug) depends on the direction: for a regression the new
side is bad, for a fix (``--good`` newer than ``--bad``) the old side is.

Two more hypotheses say an end is not what the user said: "the flip lies beyond the good end"
(every position, the good end too, is on the bad side) and "the bad end does not show the bug"
(every position is on the good side), each with prior mass ``Priors.end_doubt``. Under
intermittent evidence the good end is a hypothesis, not a fact (the seed thread records a whole
clean lifetime of the buggy v0.26.0), so the stated confidence is P(the flip is the named commit
AND both ends behave as claimed), and the search keeps testing an end until that holds; when an
end hypothesis itself reaches the threshold the search says so instead of naming a commit.

A lifetime on the bad side shows the bug with unknown probability ``p``, on the good side with an
unknown false-alarm rate ``q``. Both are integrated out in closed form: ``q`` has a Beta prior
concentrated near (but not at) 0, so one false alarm is not fatal; ``p`` has a Beta prior mixed
with a point mass at exactly 1, so a deterministic bug is recognised quickly and costs about what
classic bisection costs. The posterior over ``f`` needs only prefix sums of (divergent, total)
counts, computed in log space, O(n) per update.

Selection is by expected information per unit cost ("patch leaving"): another lifetime of a
candidate whose artifacts are already prepared costs ``cost_lifetime``; a new candidate costs
``cost_new_candidate`` more (a download or a build). A new candidate is valued as a plan of up to
m lifetimes that stops at the first divergence, which is how a bad-side candidate gets settled
(one divergence says "bad side"; only a clean run needs many lifetimes), so its expected cost is
what it will really take, not m. Untestable candidates are removed from the choice but keep
their prior: hypotheses separated only by untestable commits cannot be told apart, so the answer
is then a *block*, as ``git bisect`` reports it.

The search stops when the top block holds ``1 - (1 - confidence) / 2`` (``STOP_FACTOR``), not
``confidence`` itself: the posterior is calibrated on average over the prior on p, and at a fixed
p of 0.3-0.5 stopping at exactly 0.99 was right only ~98.5% of the time. The lookahead works on
runs of hypotheses that no tested or scored commit separates, which makes a step O(tested
commits) instead of O(n): about 1.5 s for a whole N = 4096 search instead of 52 s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bisect_tool.values import Direction


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
class Summary:
    """Where the search stands, in plain values (the report and `status` read this)."""

    block: tuple[int, ...]  # positions the flip may be at (one unless untestables surround it)
    confidence: float  # posterior mass of that block
    credible_set: tuple[int, ...]  # smallest set of positions holding 90% of the mass
    p_median: float
    p_interval: tuple[float, float]
    q_median: float
    q_interval: tuple[float, float]
    evaluations: int
    candidates_tested: int
    #: P(the flip lies beyond the good end: it shows the bug too)
    good_end_doubt: float = 0.0
    #: P(the bad end does not show the bug: nothing in the range does)
    bad_end_doubt: float = 0.0


@dataclass
class Counts:
    divergent: np.ndarray
    total: np.ndarray
    untestable: set[int] = field(default_factory=set)


def _log_choose(m: int, k: int) -> float:
    return math.lgamma(m + 1) - math.lgamma(k + 1) - math.lgamma(m - k + 1)


@dataclass(frozen=True)
class Plan:
    """Up to ``lifetimes`` lifetimes at one candidate; with ``until_divergent`` the plan stops at
    the first divergence (a bad candidate then costs one or two lifetimes, not all of them)."""

    lifetimes: int
    until_divergent: bool = True

    def outcomes(self) -> list[tuple[int, int]]:
        """(divergent, total) of each way the plan can end."""
        m = self.lifetimes
        if self.until_divergent:
            return [(1, j) for j in range(1, m + 1)] + [(0, m)]
        return [(k, m) for k in range(m + 1)]


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
        self.norm = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    def __call__(self, d: np.ndarray, t: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.la(d) + self.lb(t - d) - self.lab(t) - self.norm
        return out


class BayesianStrategy:
    """Posterior over the flip position; picks the next candidate; says when to stop."""

    #: the most lifetimes planned at once for one candidate
    MAX_BATCH = 24
    #: lifetimes at the bad end before the search leaves it (it is prepared, so they are cheap),
    #: unless one of them runs clean first: a deterministic-looking bug must earn the point mass
    #: at p = 1 before clean candidates are judged by it (search-notes: estimate p early)
    BAD_END_LIFETIMES = 3
    #: the search stops when the top block holds 1 - (1 - confidence) * STOP_FACTOR. The
    #: posterior is calibrated on average over the prior on p, not for every p: at a fixed p of
    #: 0.3-0.5 stopping at exactly 0.99 was right 98.2-98.8% of the time (`bisect simulate`,
    #: 500-1000 trials), stopping at 0.995 99.2-99.6% (1,500-3,000 trials a cell). Stricter
    #: still (0.997) reached 99.4-99.7% but cost 1.51x the lower bound at N = 512, p = 0.5,
    #: q = 0.01 (0.995: 1.49x); so did a flat prior on p, or a second, flatter prior that must
    #: also agree before stopping (docs/simulate-grid.txt). The report still shows the posterior.
    STOP_FACTOR = 0.5
    #: rows x hypotheses scored in one numpy pass (bounds memory at large n)
    CHUNK = 1 << 21

    def __init__(
        self,
        size: int,
        direction: Direction,
        *,
        priors: Priors | None = None,
        costs: Costs | None = None,
        confidence: float = 0.99,
    ) -> None:
        if size < 2:
            raise ValueError("a range needs at least two positions (the two ends)")
        self.n = size - 1  # positions 0..n
        self.direction = direction
        self.priors = priors or Priors()
        self.costs = costs or Costs()
        self.confidence = confidence
        self.counts = Counts(np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64))
        self.prepared: set[int] = set()
        self.retired: set[int] = set()
        #: positions whose artifacts are at hand although this search has not run them yet
        self.artifacts_ready: set[int] = set()
        #: a deterministic probe (the op check: fixed inputs, the same rows in every run): a
        #: candidate's first conclusive run is its answer, so no candidate is run twice and
        #: parallel slots split the posterior instead of repeating a candidate
        self.deterministic = False
        #: lifetimes at the bad end before the search leaves it (BAD_END_LIFETIMES)
        self.bad_end_lifetimes = self.BAD_END_LIFETIMES
        self._bb_p = _BetaBinomial(self.priors.p_alpha, self.priors.p_beta)
        self._bb_q = _BetaBinomial(self.priors.q_alpha, self.priors.q_beta)
        self._hyp = np.arange(1, self.n + 1)
        # The two end hypotheses as flip positions outside 1..n: "every position is on the bad
        # side" (the good end too) and "every position is on the good side" (the bad end too).
        # For a regression the bad side is >= f, so these are f = 0 and f = n + 1; for a fix
        # (bad side < f) the other way round. Order: (beyond the good end, bad end not bad).
        if direction is Direction.REGRESSION:
            self._end_hyp = np.array([0, self.n + 1])
        else:
            self._end_hyp = np.array([self.n + 1, 0])
        doubt = self.priors.end_doubt
        if not 0 <= doubt < 0.5:
            raise ValueError("end_doubt must be in [0, 0.5)")
        # prior weight of each end hypothesis relative to one in-range flip, whose prior is
        # (1 - 2 doubt) / n; -inf switches them off
        end_log_prior = math.log(doubt * self.n / (1 - 2 * doubt)) if doubt > 0 else -math.inf
        # Log prior weight (relative) of each in-range hypothesis f = 1..n and of the two end
        # hypotheses: uniform by default; ``set_prior`` replaces them (the tiered search's
        # confirm step starts from what the fast probe found: bisect_tool.tiers).
        self._log_prior = np.zeros(self.n)
        self._end_log_prior = np.array([end_log_prior, end_log_prior])
        self._posterior: np.ndarray | None = None
        self._base: _Base | None = None

    # -- evidence -----------------------------------------------------------------------------

    @property
    def bad_end(self) -> int:
        return self.n if self.direction is Direction.REGRESSION else 0

    @property
    def good_end(self) -> int:
        return 0 if self.direction is Direction.REGRESSION else self.n

    def effective_ends(self) -> tuple[int | None, int | None]:
        """(bad, good) as the search checks them: the given ends, or, where one is untestable
        (a release whose extension the pinned stack rejects, a commit that does not build), the
        nearest testable candidate toward the other end, which stands in for it. None when no
        candidate on the way is testable. The hypotheses still span the whole range."""
        untestable = self.counts.untestable

        def walk(start: int, stop: int) -> int | None:
            step = 1 if stop > start else -1
            for i in range(start, stop, step):
                if i not in untestable:
                    return i
            return None

        good = walk(self.good_end, self.bad_end)
        bad = walk(self.bad_end, good if good is not None else self.good_end)
        return bad, good

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
            self._log_prior = np.log(weights / total)
            self._end_log_prior = np.log(np.asarray(ends, dtype=float) / total)
        self._invalidate()

    def log_likelihoods(self) -> tuple[np.ndarray, np.ndarray]:
        """log P(evidence | flip f) for f = 1..n, and for the two end hypotheses (p and q
        integrated out; no prior): what a caller needs to weigh alternative priors."""
        base = self._base_state()
        return base.log_like, base.end_like

    def record(self, position: int, divergent: bool) -> None:
        """One lifetime at ``position``: did it show the bug?"""
        self.counts.total[position] += 1
        self.counts.divergent[position] += int(divergent)
        self.prepared.add(position)
        self._invalidate()

    def retire(self, position: int) -> None:
        """Stop choosing ``position`` but keep its evidence (e.g. the probe keeps coming back
        inconclusive there after some conclusive lifetimes)."""
        self.retired.add(position)

    def mark_untestable(self, position: int) -> None:
        self.counts.untestable.add(position)
        self._invalidate()

    def _invalidate(self) -> None:
        self._posterior = None
        self._base = None

    # -- posterior ----------------------------------------------------------------------------

    def _side_sums(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(D, T) on the old side (< f) and the new side (>= f) for each hypothesis f = 1..n."""
        d, t = self.counts.divergent, self.counts.total
        cd, ct = np.cumsum(d), np.cumsum(t)
        old_d, old_t = cd[:-1], ct[:-1]  # positions 0..f-1 for f = 1..n
        new_d, new_t = cd[-1] - old_d, ct[-1] - old_t
        return old_d, old_t, new_d, new_t

    def _split(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        old_d, old_t, new_d, new_t = self._side_sums()
        if self.direction is Direction.REGRESSION:
            return new_d, new_t, old_d, old_t  # bad side is the new side
        return old_d, old_t, new_d, new_t

    def _log_like_p(
        self, bad_d: np.ndarray, bad_t: np.ndarray, point_mass: float | None = None
    ) -> np.ndarray:
        w = self.priors.p_point_mass if point_mass is None else point_mass
        beta_part = math.log1p(-w) + self._bb_p(bad_d, bad_t) if w < 1 else -np.inf
        if w <= 0:
            return np.asarray(beta_part + np.zeros(np.shape(bad_d)))
        point = np.where(bad_d == bad_t, math.log(w), -np.inf)
        return np.logaddexp(beta_part, point)

    def _log_joint(
        self,
        bad_d: np.ndarray,
        bad_t: np.ndarray,
        good_d: np.ndarray,
        good_t: np.ndarray,
        point_mass: float | None = None,
    ) -> np.ndarray:
        out: np.ndarray = self._log_like_p(bad_d, bad_t, point_mass) + self._bb_q(good_d, good_t)
        return out

    def _end_counts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(bad D, bad T, good D, good T) under each end hypothesis: all on one side."""
        d, t = int(self.counts.divergent.sum()), int(self.counts.total.sum())
        return np.array([d, 0]), np.array([t, 0]), np.array([0, d]), np.array([0, t])

    def _base_state(self) -> _Base:
        if self._base is None:
            bad_d, bad_t, good_d, good_t = self._split()
            log_like = self._log_joint(bad_d, bad_t, good_d, good_t)
            end_like = self._log_joint(*self._end_counts())
            log_joint = log_like + self._log_prior
            end_joint = end_like + self._end_log_prior
            every = np.concatenate([log_joint, end_joint])
            top = float(every.max())
            log_z = top + math.log(float(np.exp(every - top).sum()))
            self._base = _Base(
                bad_d, bad_t, good_d, good_t, log_joint, log_z, end_joint, log_like, end_like
            )
        return self._base

    def posterior(self) -> np.ndarray:
        """P(flip at f and both ends as claimed) for f = 1..n, as an array of length n (index
        f - 1). It sums to 1 minus the two end doubts (``end_doubts``)."""
        if self._posterior is None:
            base = self._base_state()
            self._posterior = np.exp(base.log_joint - base.log_z)
        return self._posterior

    def end_doubts(self) -> tuple[float, float]:
        """(P(the flip lies beyond the good end), P(the bad end does not show the bug))."""
        base = self._base_state()
        beyond, not_bad = np.exp(base.end_joint - base.log_z)
        return float(beyond), float(not_bad)

    def contradicted_end(self) -> str | None:
        """"good" or "bad" when the evidence says, at the stopping threshold, that that end does
        not behave as claimed; None otherwise."""
        beyond, not_bad = self.end_doubts()
        threshold = self.stop_threshold()
        if beyond >= threshold:
            return "good"
        if not_bad >= threshold:
            return "bad"
        return None

    def self_contradiction(self) -> tuple[int, int] | None:
        """(clean, divergent) positions that no single flip explains without a false alarm or a
        missed bug: a clean run at least as near the bad end as a divergent one. None when every
        observation fits one flip. For a deterministic probe this is the probe failing its
        premise, not evidence about the flip."""
        d, t = self.counts.divergent, self.counts.total
        clean = [i for i in range(self.n + 1) if t[i] > d[i]]
        divergent = [i for i in range(self.n + 1) if d[i]]
        if not clean or not divergent:
            return None

        def to_bad_end(i: int) -> int:
            return abs(self.bad_end - i)

        nearest_clean = min(clean, key=to_bad_end)
        farthest_divergent = max(divergent, key=to_bad_end)
        if to_bad_end(nearest_clean) <= to_bad_end(farthest_divergent):
            return nearest_clean, farthest_divergent
        return None

    def _block_ids(self) -> np.ndarray:
        """Block index of each hypothesis f = 1..n: a new block starts where commit f - 1 is
        testable, since f and f + 1 differ only in commit f."""
        starts = np.ones(self.n, dtype=bool)
        for u in self.counts.untestable:
            if 1 <= u <= self.n - 1:
                starts[u] = False  # hypothesis u + 1 joins the block of u
        return np.cumsum(starts) - 1

    def blocks(self) -> list[tuple[int, ...]]:
        """Hypotheses that no testable commit separates: f and f+1 differ only in commit f."""
        ids = self._block_ids()
        cuts = np.flatnonzero(np.diff(ids)) + 1
        return [tuple(int(f) for f in part) for part in np.split(self._hyp, cuts)]

    def _top_block_of(self, post: np.ndarray) -> tuple[tuple[int, ...], float]:
        ids = self._block_ids()
        mass = np.bincount(ids, weights=post)
        best = int(np.argmax(mass))
        return tuple(int(f) for f in self._hyp[ids == best]), float(mass[best])

    def top_block(self) -> tuple[tuple[int, ...], float]:
        return self._top_block_of(self.posterior())

    def credible_set(self, mass: float = 0.9) -> tuple[int, ...]:
        post = self.posterior()
        order = np.argsort(-post, kind="stable")
        cumulative = np.cumsum(post[order])
        k = min(int(np.searchsorted(cumulative, mass)) + 1, len(order))
        return tuple(sorted(int(i) + 1 for i in order[:k]))

    def stop_threshold(self) -> float:
        """The top-block mass at which the search stops (stricter than ``confidence``)."""
        return 1 - (1 - self.confidence) * self.STOP_FACTOR

    def done(self) -> bool:
        return self.top_block()[1] >= self.stop_threshold()

    def bug_shown(self) -> bool:
        """Whether a lifetime on the bad side of the answer (the top block) showed the bug.

        Usually that is the bad end. After the tiered search falls back to lifetimes over the
        whole range, a divergence already seen inside the range (at the fast probe's flip) shows
        the bug as well: the bad end need not be made to show it again before an answer."""
        block, _ = self.top_block()
        bad_d = self._split()[0]
        return bool(bad_d[block[0] - 1] > 0)

    def _rate_posterior(self, which: str, grid_size: int = 400) -> np.ndarray:
        """Posterior density of p or q on a grid, marginalised over the flip position."""
        grid = (np.arange(grid_size) + 0.5) / grid_size
        post = self.posterior()
        bad_d, bad_t, good_d, good_t = self._split()
        if which == "p":
            d, t, a, b = bad_d, bad_t, self.priors.p_alpha, self.priors.p_beta
        else:
            d, t, a, b = good_d, good_t, self.priors.q_alpha, self.priors.q_beta
        keep = post > 1e-6 * post.max()
        w, d, t = post[keep], d[keep], t[keep]
        log_grid, log_comp = np.log(grid), np.log1p(-grid)
        log_f = (a - 1 + d[:, None]) * log_grid + (b - 1 + (t - d)[:, None]) * log_comp
        f = np.exp(log_f - log_f.max(axis=1, keepdims=True))
        dens = (w[:, None] * f / f.sum(axis=1, keepdims=True)).sum(axis=0)
        return np.asarray(dens / dens.sum())

    def rate_summary(self, which: str) -> tuple[float, tuple[float, float]]:
        """Median and 90% interval of p or q (the continuous part, point mass folded to 1)."""
        grid_size = 400
        dens = self._rate_posterior(which, grid_size)
        grid = (np.arange(grid_size) + 0.5) / grid_size
        cdf = np.cumsum(dens)
        if which == "p":
            # the point mass at p = 1 shifts the quantiles up
            p1 = self.p_is_one_probability()
            cdf = cdf * (1 - p1)

        def quantile(x: float) -> float:
            i = int(np.searchsorted(cdf, x))
            return 1.0 if i >= grid_size else float(grid[i])

        return quantile(0.5), (quantile(0.05), quantile(0.95))

    def p_is_one_probability(self) -> float:
        """Posterior probability that the bug shows in every bad-side lifetime."""
        w = self.priors.p_point_mass
        if w <= 0:
            return 0.0
        base = self._base_state()
        lq = self._bb_q(base.good_d, base.good_t)
        point = np.where(base.bad_d == base.bad_t, math.log(w), -np.inf) + lq + self._log_prior
        end_bad_d, end_bad_t, end_good_d, end_good_t = self._end_counts()
        end_point = (
            np.where(end_bad_d == end_bad_t, math.log(w), -np.inf)
            + self._bb_q(end_good_d, end_good_t)
            + self._end_log_prior
        )
        return float(np.exp(point - base.log_z).sum() + np.exp(end_point - base.log_z).sum())

    def summary(self) -> Summary:
        block, mass = self.top_block()
        p_med, p_int = self.rate_summary("p")
        q_med, q_int = self.rate_summary("q")
        beyond, not_bad = self.end_doubts()
        return Summary(
            block=block,
            confidence=mass,
            credible_set=self.credible_set(0.9),
            p_median=p_med,
            p_interval=p_int,
            q_median=q_med,
            q_interval=q_int,
            evaluations=int(self.counts.total.sum()),
            candidates_tested=int((self.counts.total > 0).sum()),
            good_end_doubt=beyond,
            bad_end_doubt=not_bad,
        )

    # -- selection ----------------------------------------------------------------------------

    #: lifetimes planned at once when a new candidate is prepared
    BATCH_OPTIONS = (1, 2, 3, 5, 8)
    #: posterior quantiles whose positions are worth scoring (plus neighbours, ends, prepared)
    QUANTILES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)

    def _bad_mask(self, position: int) -> np.ndarray:
        """For each hypothesis f = 1..n: is ``position`` on the bad side?"""
        if self.direction is Direction.REGRESSION:
            return self._hyp <= position
        return self._hyp > position

    def _segments(self, positions: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """First hypothesis and size of each run of hypotheses the lookahead cannot tell apart.

        Hypotheses f and f + 1 differ only in which side commit f is on: if commit f has no
        lifetimes and is not being scored, they have the same likelihood now and after any
        outcome considered. So the lookahead works on runs between tested or scored positions
        (a few dozen) instead of all n hypotheses, exactly.
        """
        cuts = np.union1d(np.flatnonzero(self.counts.total), np.asarray(positions, dtype=np.int64))
        starts = np.union1d([1], cuts[(cuts >= 0) & (cuts < self.n)] + 1)
        sizes = np.diff(np.append(starts, self.n + 1))
        return starts, sizes

    def expected_information(self, position: int, m: int) -> float:
        """Expected drop in the entropy of the flip (bits) from m more lifetimes at position."""
        gains, _ = self._plan_values([position], [(Plan(m, until_divergent=False),)])
        return float(gains[0][0])

    def _plan_values(
        self, positions: Sequence[int], plans: Sequence[tuple[Plan, ...]]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Expected entropy drop and expected lifetimes of each plan at each position.

        Exact one-step lookahead: p and q stay integrated out, so lifetimes that only sharpen
        p (at the bad end, say) are valued for how much they sharpen the flip. Hypotheses are
        grouped in runs that no evidence separates; all positions are scored in one numpy pass.
        A plan's outcomes are (divergent, total) pairs: k of m for a fixed batch, or "the first
        divergence at lifetime j" (j = 1..m) and "m clean" for a plan that stops at the first
        divergence, which is how a bad candidate is usually settled after one or two lifetimes.
        """
        base = self._base_state()
        hyp, sizes = self._segments(positions)
        active = hyp - 1
        # Each run shares one likelihood; its hypotheses may carry different prior weights w_i.
        # A run's entropy is then -sum(P_r (ll_r - log Z + m_r)) with P_r its posterior mass and
        # m_r the prior-weighted mean of w over the run (0 for a uniform prior, where it is the
        # familiar size * p log p). The two end hypotheses join as runs of one.
        log_w, mean_w = self._run_weights(active, sizes)
        hyp = np.concatenate([hyp, self._end_hyp])
        log_w = np.concatenate([log_w, self._end_log_prior])
        mean_w = np.concatenate([mean_w, np.where(np.isfinite(self._end_log_prior),
                                                  self._end_log_prior, 0.0)])
        ll = np.concatenate([base.log_like[active], base.end_like])
        log_z = base.log_z
        h_now = _run_entropy(ll, log_w, mean_w, log_z)
        end_bad_d, end_bad_t, end_good_d, end_good_t = self._end_counts()
        bad_d = np.concatenate([base.bad_d[active], end_bad_d])
        bad_t = np.concatenate([base.bad_t[active], end_bad_t])
        good_d = np.concatenate([base.good_d[active], end_good_d])
        good_t = np.concatenate([base.good_t[active], end_good_t])
        # one row per (position, plan, outcome): k divergent lifetimes out of m more
        rows_pos: list[int] = []
        rows_k: list[int] = []
        rows_m: list[int] = []
        rows_log_ways: list[float] = []  # orderings of the outcome the plan can produce
        plan_sizes: list[int] = []
        for s, options in enumerate(plans):
            for plan in options:
                outcomes = plan.outcomes()
                plan_sizes.append(len(outcomes))
                for k, m in outcomes:
                    rows_pos.append(s)
                    rows_k.append(k)
                    rows_m.append(m)
                    rows_log_ways.append(0.0 if plan.until_divergent else _log_choose(m, k))
        r_pos, r_k, r_m = np.array(rows_pos), np.array(rows_k), np.array(rows_m)
        pos_arr = np.array(positions)
        h_k = np.empty(len(r_pos))
        log_zk = np.empty(len(r_pos))
        step = max(1, self.CHUNK // max(len(hyp), 1))
        for lo in range(0, len(r_pos), step):
            sl = slice(lo, lo + step)
            where = pos_arr[r_pos[sl]][:, None]
            if self.direction is Direction.REGRESSION:
                mask = hyp[None, :] <= where
            else:
                mask = hyp[None, :] > where
            k_col, m_col = r_k[sl][:, None], r_m[sl][:, None]
            km, mm = k_col * mask, m_col * mask
            joint = self._log_joint(
                bad_d + km, bad_t + mm, good_d + (k_col - km), good_t + (m_col - mm)
            )
            weighted = joint + log_w
            top = weighted.max(axis=1, keepdims=True)
            z = top[:, 0] + np.log(np.exp(weighted - top).sum(axis=1))
            h_k[sl] = _run_entropy(joint, log_w, mean_w, z[:, None])
            log_zk[sl] = z
        prob_k = np.exp(np.array(rows_log_ways) + log_zk - log_z)
        # rows of one (position, plan) are contiguous
        starts = np.concatenate([[0], np.cumsum(plan_sizes)[:-1]]).astype(np.int64)
        expected_h = np.add.reduceat(prob_k * h_k, starts)
        expected_m = np.add.reduceat(prob_k * r_m, starts)
        gains = np.maximum(h_now - expected_h, 0.0)
        out_gain: list[np.ndarray] = []
        out_m: list[np.ndarray] = []
        i = 0
        for options in plans:
            out_gain.append(gains[i : i + len(options)])
            out_m.append(expected_m[i : i + len(options)])
            i += len(options)
        return out_gain, out_m

    def _run_weights(
        self, first: np.ndarray, sizes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """log of the summed prior weight and the weight-averaged log weight of each run of
        hypotheses (indices ``first .. first + size - 1``), from prefix sums."""
        w = self._log_prior
        if not w.any():  # uniform: the common case, exactly
            return np.log(sizes.astype(float)), np.zeros(len(sizes))
        finite = np.isfinite(w)
        top = float(w[finite].max()) if finite.any() else 0.0
        e = np.where(finite, np.exp(w - top), 0.0)
        ew = np.where(finite, e * np.where(finite, w, 0.0), 0.0)
        cs_e = np.concatenate([[0.0], np.cumsum(e)])
        cs_ew = np.concatenate([[0.0], np.cumsum(ew)])
        total = cs_e[first + sizes] - cs_e[first]
        weighted = cs_ew[first + sizes] - cs_ew[first]
        safe = np.maximum(total, 1e-300)
        with np.errstate(divide="ignore"):
            log_w = np.where(total > 0, np.log(safe) + top, -np.inf)
        return log_w, np.where(total > 0, weighted / safe, 0.0)

    def bad_side_probability(self) -> np.ndarray:
        """P(position i is on the bad side) for i = 0..n."""
        # position i is on the new side iff f <= i; the end hypothesis at f = 0 puts every
        # position there
        below = self.end_doubts()[0 if self.direction is Direction.REGRESSION else 1]
        new_side = np.clip(
            below + np.concatenate([[0.0], np.cumsum(self.posterior())]), 0.0, 1.0
        )
        out: np.ndarray = new_side if self.direction is Direction.REGRESSION else 1.0 - new_side
        return out

    def _positions_worth_scoring(self) -> list[int]:
        post = self.posterior()
        cdf = np.cumsum(post)
        found: set[int] = {self.bad_end, self.good_end}
        for f in np.searchsorted(cdf, self.QUANTILES) + 1:  # hypothesis f at each quantile
            found.update({int(f) - 1, int(f)})
        block, _ = self.top_block()
        found.update({block[0] - 1, block[-1]})
        bad_side = self.bad_side_probability()
        found.update(i for i in self.prepared if 1e-4 < bad_side[i] < 1 - 1e-4)
        return sorted(
            i
            for i in found
            if 0 <= i <= self.n and i not in self.counts.untestable and i not in self.retired
        )

    def next_midpoints(self, position: int) -> tuple[int, ...]:
        """The candidates either outcome at ``position`` would bisect next (mozregression's
        trick: fetch their artifacts while ``position`` is tested)."""
        post = self.posterior()
        cumulative = np.cumsum(post)
        left = float(post[:position].sum()) if position else 0.0
        hints: set[int] = set()
        for target in (left / 2, left + (1 - left) / 2):
            f = int(np.searchsorted(cumulative, target)) + 1
            hints.update(p for p in (f - 1, f) if 0 <= p <= self.n and p != position)
        return tuple(sorted(hints))

    def select(self, within: tuple[int, int] | None = None) -> Choice:
        """The next lifetimes to run, by expected information per unit cost.

        ``within`` = (bad side, good side): only those two candidates are chosen from, and they
        are checked the way the ends are (the tiered search's confirm step, on both sides of
        the flip the fast probe found)."""
        if within is None:
            bad_end, good_end = self.effective_ends()
            if bad_end is None or good_end is None:
                raise NoCandidateLeft("no testable candidate is left at one end of the range")
            names = ("the bad end", "the good end")
        else:
            bad_end, good_end = within
            names = ("the bad side", "the good side")
        t, d = self.counts.total, self.counts.divergent
        if t[bad_end] == 0:
            return Choice(bad_end, 1, f"check {names[0]} first")
        # Until the bug shows somewhere, only the bad end can show that there is anything to
        # bisect; once a lifetime inside the range showed it (a fall-back from the tiered search),
        # hammering a quiet bad end teaches nothing the ranking would not choose itself.
        if d[bad_end] == 0 and (within is not None or not d.any()):
            return Choice(bad_end, 1, f"{names[0]} has not shown the bug yet")
        if t[bad_end] < self.bad_end_lifetimes and d[bad_end] == t[bad_end]:
            return Choice(bad_end, 1, f"estimate how often {names[0]} shows the bug")
        if t[good_end] == 0:
            return Choice(good_end, 1, f"check {names[1]}")
        ranked = self._ranked(None if within is None else set(within))
        if not ranked or ranked[0].rate <= 1e-9:
            raise NoCandidateLeft("every candidate that could tell the flip apart is untestable")
        return ranked[0]

    def _ranked(self, only: set[int] | None = None) -> list[Choice]:
        """The best option of each scored position (of ``only``, when given), best rate first."""
        if only is None:
            positions = self._positions_worth_scoring()
        else:
            positions = sorted(
                i for i in only if i not in self.counts.untestable and i not in self.retired
            )
        if self.deterministic:
            # A second run would repeat the first one's answer; the candidates that can still
            # tell the flip apart are the nearest ones not yet run. Next to a bracketed flip the
            # model's small false-alarm rate leaves ~1e-3 on the flip lying further back, which
            # one more run beside the bracket settles (the demo at 80 commits stopped here).
            positions = sorted({j for i in positions for j in self._nearest_unrun(i)})
        if not positions:
            return []
        one = (Plan(1),)
        new_plans = tuple(Plan(m) for m in self.BATCH_OPTIONS)
        plans = [one if i in self.prepared else new_plans for i in positions]
        gains, lifetimes = self._plan_values(positions, plans)
        best_of: list[Choice] = []
        for i, options, g, m_exp in zip(positions, plans, gains, lifetimes, strict=True):
            prepared = i in self.prepared
            # a candidate whose artifacts are already at hand (another tier fetched them) costs
            # no switch
            switch = 0.0 if prepared or i in self.artifacts_ready else self.costs.new_candidate
            best: Choice | None = None
            for plan, gain, m in zip(options, g, m_exp, strict=True):
                cost = m * self.costs.lifetime + switch
                rate = float(gain) / cost
                if best is None or rate > best.rate:
                    reason = "another lifetime" if prepared else "new candidate"
                    best = Choice(i, plan.lifetimes, reason, rate)
            if best is not None:
                best_of.append(best)
        return sorted(best_of, key=lambda c: -c.rate)

    def _unrun(self, i: int) -> bool:
        """Candidate ``i`` can run and has not (what a deterministic probe may run next)."""
        return (not self.counts.total[i] and i not in self.counts.untestable
                and i not in self.retired)

    def _nearest_unrun(self, position: int) -> tuple[int, ...]:
        """``position`` if it has not run, else the nearest testable candidates on each side
        of it that have not."""
        if self._unrun(position):
            return (position,)
        below = next((i for i in range(position - 1, -1, -1) if self._unrun(i)), None)
        above = next((i for i in range(position + 1, self.n + 1) if self._unrun(i)), None)
        return tuple(i for i in (below, above) if i is not None)

    def select_batch(self, slots: int, within: tuple[int, int] | None = None) -> list[Choice]:
        """Work for ``slots`` lifetimes at once (several GPUs): the best choice first, with as
        many of its planned lifetimes as fit, then the next best positions, one lifetime each.

        The later picks are scored before the first one's outcome is known, so they are worth
        less than sequential picks; idle GPUs are worth nothing, which is why they are filled.
        """
        first = self.select(within)
        if slots <= 1:
            return [first]
        if within is not None:
            return self._confirm_batch(first, slots, within)
        if self.deterministic:
            return self._split_batch(first, slots)
        if first.reason.startswith(("check", "the bad end", "estimate")):
            # the ends: more lifetimes of the same end are exactly what is needed
            return [Choice(first.position, min(slots, max(first.lifetimes, slots)), first.reason)]
        batch = [Choice(first.position, min(first.lifetimes, slots), first.reason, first.rate)]
        used = batch[0].lifetimes
        for choice in self._ranked():
            if used >= slots:
                break
            if choice.position == first.position or choice.rate <= 1e-9:
                continue
            batch.append(Choice(choice.position, 1, choice.reason + " (parallel)", choice.rate))
            used += 1
        if used < slots:  # nothing else worth a slot: more lifetimes of the best
            batch[0] = Choice(first.position, batch[0].lifetimes + slots - used, first.reason)
        return batch

    def _confirm_batch(self, first: Choice, slots: int, within: tuple[int, int]) -> list[Choice]:
        """Slots on the two sides of a flip: the checks each side still needs first, then by
        value per cost (certifying the good side usually wants most of them)."""
        bad, good = within
        counts: dict[int, int] = {first.position: 1}
        reasons = {first.position: first.reason}
        usable = [i for i in within if i not in self.counts.untestable and i not in self.retired]
        ranked = self._ranked(set(usable)) if usable else []
        for _ in range(slots - 1):
            if good in usable and not self.counts.total[good] and good not in counts:
                pick, why = good, "check the good side (parallel)"
            elif ranked and ranked[0].rate > 1e-9:
                pick, why = ranked[0].position, ranked[0].reason + " (parallel)"
            else:
                pick, why = first.position, first.reason
            counts[pick] = counts.get(pick, 0) + 1
            reasons.setdefault(pick, why)
        del bad
        return [Choice(pos, n, reasons[pos]) for pos, n in counts.items()]

    def _split_batch(self, first: Choice, slots: int) -> list[Choice]:
        """Slots for a deterministic probe: the ends not yet run, then candidates that cut the
        flip's posterior into equal parts, so that k runs at once narrow the range (k + 1)-fold
        rather than 2-fold, as k neighbours of the best single split would (nearly the same
        answer k times); no candidate runs twice."""
        batch: list[Choice] = []
        taken: set[int] = set()

        def add(position: int, reason: str) -> None:
            batch.append(Choice(position, 1, reason))
            taken.add(position)

        bad, good = self.effective_ends()
        for end, name in ((bad, "bad"), (good, "good")):
            if end is not None and not self.counts.total[end] and len(batch) < slots:
                add(end, f"check the {name} end")
        free = slots - len(batch)
        if free > 0:
            post = self.posterior()
            cdf = np.cumsum(post) / max(float(post.sum()), 1e-300)
            # testing position i separates the flips f <= i from f > i (1-based hypotheses)
            for j in range(1, free + 1):
                i = int(np.searchsorted(cdf, j / (free + 1))) + 1
                if 0 < i < self.n and i not in taken and self._unrun(i):
                    add(i, "split the range")
            for choice in self._ranked():
                if len(batch) >= slots:
                    break
                if choice.position not in taken and choice.rate > 1e-9:
                    add(choice.position, choice.reason)
        return batch or [first]


@dataclass(frozen=True)
class _Base:
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


def _run_entropy(
    ll: np.ndarray, log_w: np.ndarray, mean_w: np.ndarray, log_z: np.ndarray | float
) -> np.ndarray | float:
    """Entropy (bits) of the flip over runs of hypotheses sharing a likelihood ``ll`` (last
    axis), each run's prior weight ``exp(log_w)`` spread as ``mean_w`` says; ``log_z``
    normalises (one per row)."""
    mass = np.exp(ll + log_w - log_z)
    with np.errstate(invalid="ignore"):
        terms = np.where(mass > 0, mass * (ll - log_z + mean_w), 0.0)
    out: np.ndarray = -terms.sum(axis=-1) / math.log(2)
    return out


class NoCandidateLeft(Exception):
    """Nothing testable can narrow the range further."""
