"""The search: a Bayesian posterior over the flip position for an intermittent probe.

Pure: plain values in, plain values out; no git, docker or HTTP here.

Positions ``0..n`` are the candidates in history order: position 0 is the *old end* (the older of
good/bad), position ``n`` the *new end*. A hypothesis ``f`` in ``1..n`` says the first commit with
the new behaviour is at ``f``: positions ``>= f`` behave like the new end, positions ``< f`` like
the old end. Which side is *bad* (shows the bug) depends on the direction: for a regression the new
side is bad, for a fix (``--good`` newer than ``--bad``) the old side is.

A lifetime on the bad side shows the bug with unknown probability ``p``, on the good side with an
unknown false-alarm rate ``q``. Both are integrated out in closed form: ``q`` has a Beta prior
concentrated near (but not at) 0, so one false alarm is not fatal; ``p`` has a Beta prior mixed
with a point mass at exactly 1, so a deterministic bug is recognised quickly and costs about what
classic bisection costs. The posterior over ``f`` needs only prefix sums of (divergent, total)
counts, computed in log space, O(n) per update.

Selection is by expected information per unit cost ("patch leaving"): another lifetime of a
candidate whose artifacts are already prepared costs ``cost_lifetime``; a new candidate costs
``cost_new_candidate`` more (a download or a build). Untestable candidates are removed from the
choice but keep their prior: hypotheses separated only by untestable commits cannot be told apart,
so the answer is then a *block*, as ``git bisect`` reports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from bisect_tool.values import Direction


@dataclass(frozen=True)
class Priors:
    p_point_mass: float = 0.5  # prior probability that the bug shows in every bad-side lifetime
    p_alpha: float = 1.0  # Beta prior of p when it is not exactly 1
    p_beta: float = 1.0
    q_alpha: float = 0.5  # Beta prior of the false-alarm rate: mean ~0.01, not 0
    q_beta: float = 50.0


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


@dataclass
class Counts:
    divergent: np.ndarray
    total: np.ndarray
    untestable: set[int] = field(default_factory=set)


_LOG_FACT = [math.lgamma(k + 1) for k in range(64)]


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
        return self.values[k]


class _BetaBinomial:
    """log of the probability of a given sequence with D successes in T, p ~ Beta(a, b)."""

    def __init__(self, a: float, b: float) -> None:
        self.la, self.lb, self.lab = _LogGammaTable(a), _LogGammaTable(b), _LogGammaTable(a + b)
        self.norm = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)

    def __call__(self, d: np.ndarray, t: np.ndarray) -> np.ndarray:
        return self.la(d) + self.lb(t - d) - self.lab(t) - self.norm


class BayesianStrategy:
    """Posterior over the flip position; picks the next candidate; says when to stop."""

    #: the most lifetimes planned at once for one candidate
    MAX_BATCH = 24

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
        self._bb_p = _BetaBinomial(self.priors.p_alpha, self.priors.p_beta)
        self._bb_q = _BetaBinomial(self.priors.q_alpha, self.priors.q_beta)
        self._posterior: np.ndarray | None = None
        self._base: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float] | None = None

    # -- evidence -----------------------------------------------------------------------------

    @property
    def bad_end(self) -> int:
        return self.n if self.direction is Direction.REGRESSION else 0

    @property
    def good_end(self) -> int:
        return 0 if self.direction is Direction.REGRESSION else self.n

    def record(self, position: int, divergent: bool) -> None:
        """One lifetime at ``position``: did it show the bug?"""
        self.counts.total[position] += 1
        self.counts.divergent[position] += int(divergent)
        self.prepared.add(position)
        self._posterior = None
        self._base = None

    def mark_untestable(self, position: int) -> None:
        self.counts.untestable.add(position)
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

    def _log_like_p(self, bad_d: np.ndarray, bad_t: np.ndarray) -> np.ndarray:
        w = self.priors.p_point_mass
        beta_part = math.log1p(-w) + self._bb_p(bad_d, bad_t) if w < 1 else -np.inf
        point = np.where(bad_d == bad_t, math.log(w) if w > 0 else -np.inf, -np.inf)
        return np.logaddexp(beta_part, point)

    def posterior(self) -> np.ndarray:
        """P(flip at f) for f = 1..n, as an array of length n (index f - 1)."""
        if self._posterior is None:
            bad_d, bad_t, good_d, good_t = self._split()
            log_post = self._log_like_p(bad_d, bad_t) + self._bb_q(good_d, good_t)
            log_post -= log_post.max()
            post = np.exp(log_post)
            self._posterior = post / post.sum()
        return self._posterior

    def blocks(self) -> list[tuple[int, ...]]:
        """Hypotheses that no testable commit separates: f and f+1 differ only in commit f."""
        out: list[list[int]] = [[1]]
        for f in range(2, self.n + 1):
            if (f - 1) in self.counts.untestable:
                out[-1].append(f)
            else:
                out.append([f])
        return [tuple(b) for b in out]

    def top_block(self) -> tuple[tuple[int, ...], float]:
        post = self.posterior()
        best: tuple[int, ...] = (1,)
        best_mass = -1.0
        for block in self.blocks():
            mass = float(post[block[0] - 1 : block[-1]].sum())
            if mass > best_mass:
                best, best_mass = block, mass
        return best, best_mass

    def credible_set(self, mass: float = 0.9) -> tuple[int, ...]:
        post = self.posterior()
        order = np.argsort(-post, kind="stable")
        cumulative = np.cumsum(post[order])
        k = int(np.searchsorted(cumulative, mass)) + 1
        return tuple(sorted(int(i) + 1 for i in order[:k]))

    def done(self) -> bool:
        return self.top_block()[1] >= self.confidence

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
        dens = np.zeros(grid_size)
        for wi, di, ti in zip(w, d, t, strict=True):
            log_f = (a - 1 + di) * log_grid + (b - 1 + ti - di) * log_comp
            f = np.exp(log_f - log_f.max())
            dens += wi * f / f.sum()
        return dens / dens.sum()

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
        bad_d, bad_t, good_d, good_t = self._split()
        lq = self._bb_q(good_d, good_t)
        point = np.where(bad_d == bad_t, math.log(w), -np.inf) + lq
        full = self._log_like_p(bad_d, bad_t) + lq
        m = full.max()
        num = np.exp(point - m).sum()
        den = np.exp(full - m).sum()
        return float(num / den)

    def summary(self) -> Summary:
        block, mass = self.top_block()
        p_med, p_int = self.rate_summary("p")
        q_med, q_int = self.rate_summary("q")
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
        )

    # -- selection ----------------------------------------------------------------------------

    #: lifetimes planned at once when a new candidate is prepared
    BATCH_OPTIONS = (1, 2, 3, 5, 8)
    #: posterior quantiles whose positions are worth scoring (plus neighbours, ends, prepared)
    QUANTILES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)

    def _log_joint(
        self, bad_d: np.ndarray, bad_t: np.ndarray, good_d: np.ndarray, good_t: np.ndarray
    ) -> np.ndarray:
        return self._log_like_p(bad_d, bad_t) + self._bb_q(good_d, good_t)

    def _bad_mask(self, position: int) -> np.ndarray:
        """For each hypothesis f = 1..n: is ``position`` on the bad side?"""
        f = np.arange(1, self.n + 1)
        if self.direction is Direction.REGRESSION:
            return f <= position
        return f > position

    def _lookahead_base(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float, float]:
        if self._base is None:
            bad_d, bad_t, good_d, good_t = self._split()
            base = self._log_joint(bad_d, bad_t, good_d, good_t)
            top = base.max()
            log_z = top + math.log(np.exp(base - top).sum())
            post = np.exp(base - log_z)
            h_now = float(-(post * np.log2(np.where(post > 0, post, 1.0))).sum())
            self._base = (bad_d, bad_t, good_d, good_t, log_z, h_now)
        return self._base

    def expected_information(self, position: int, m: int) -> float:
        """Expected drop in the entropy of the flip (bits) from m more lifetimes at position."""
        return float(self._expected_information(position, (m,))[0])

    def _expected_information(self, position: int, options: tuple[int, ...]) -> np.ndarray:
        """Expected entropy drop for each lifetime count in ``options``, in one numpy pass.

        Exact one-step lookahead: p and q stay integrated out, so lifetimes that only sharpen
        p (at the bad end, say) are valued for how much they sharpen the flip.
        """
        bad_d, bad_t, good_d, good_t, log_z, h_now = self._lookahead_base()
        mask = self._bad_mask(position)[None, :]
        ms = np.concatenate([np.full(m + 1, m) for m in options])[:, None]
        ks = np.concatenate([np.arange(m + 1) for m in options])[:, None]
        log_joint = self._log_joint(
            bad_d + ks * mask, bad_t + ms * mask, good_d + ks * ~mask, good_t + ms * ~mask
        )
        top = log_joint.max(axis=1, keepdims=True)
        log_zk = top[:, 0] + np.log(np.exp(log_joint - top).sum(axis=1))
        post_k = np.exp(log_joint - log_zk[:, None])
        with np.errstate(divide="ignore", invalid="ignore"):
            h_k = -np.where(post_k > 0, post_k * np.log2(post_k), 0.0).sum(axis=1)
        m_flat, k_flat = ms[:, 0], ks[:, 0]
        log_choose = np.array(
            [_LOG_FACT[m] - _LOG_FACT[k] - _LOG_FACT[m - k] for m, k in zip(m_flat, k_flat)]
        )
        prob_k = np.exp(log_choose + log_zk - log_z)
        gains = []
        for m in options:
            rows = m_flat == m
            gains.append(max(h_now - float((prob_k[rows] * h_k[rows]).sum()), 0.0))
        return np.array(gains)

    def bad_side_probability(self) -> np.ndarray:
        """P(position i is on the bad side) for i = 0..n."""
        # position i is on the new side iff f <= i
        new_side = np.clip(np.concatenate([[0.0], np.cumsum(self.posterior())]), 0.0, 1.0)
        return new_side if self.direction is Direction.REGRESSION else 1.0 - new_side

    def _positions_worth_scoring(self) -> list[int]:
        post = self.posterior()
        cdf = np.cumsum(post)
        found: set[int] = {self.bad_end, self.good_end}
        for q in self.QUANTILES:
            f = int(np.searchsorted(cdf, q)) + 1  # hypothesis f at that quantile
            found.update({f - 1, f})
        block, _ = self.top_block()
        found.update({block[0] - 1, block[-1]})
        bad_side = self.bad_side_probability()
        found.update(i for i in self.prepared if 1e-4 < bad_side[i] < 1 - 1e-4)
        return sorted(
            i for i in found if 0 <= i <= self.n and i not in self.counts.untestable
        )

    def select(self) -> Choice:
        """The next lifetimes to run, by expected information per unit cost."""
        bad_end, good_end = self.bad_end, self.good_end
        t = self.counts.total
        if t[bad_end] == 0:
            return Choice(bad_end, 1, "check the bad end first")
        if self.counts.divergent[bad_end] == 0:
            return Choice(bad_end, 1, "the bad end has not shown the bug yet")
        if t[good_end] == 0:
            return Choice(good_end, 1, "check the good end")
        best: Choice | None = None
        for i in self._positions_worth_scoring():
            prepared = i in self.prepared
            options = (1,) if prepared else self.BATCH_OPTIONS
            gains = self._expected_information(i, options)
            for m, gain in zip(options, gains, strict=True):
                cost = m * self.costs.lifetime + (0.0 if prepared else self.costs.new_candidate)
                rate = float(gain) / cost
                if best is None or rate > best.rate:
                    reason = "another lifetime" if prepared else "new candidate"
                    best = Choice(i, m, reason, rate)
        if best is None or best.rate <= 1e-9:
            raise NoCandidateLeft("every candidate that could tell the flip apart is untestable")
        return best


class NoCandidateLeft(Exception):
    """Nothing testable can narrow the range further."""
