"""The two rates' posteriors: p (a bad-side lifetime shows the bug) and q (a false alarm on the
good side), marginalised over the flip. What the report, ``status`` and the lookahead read.
Pure."""

from __future__ import annotations

import math

import numpy as np

from bisect_tool.strategy.posterior import FlipPosterior
from bisect_tool.strategy.values import Rates

#: grid points of the rate densities (medians and intervals to 1/400)
GRID = 400


def _density(post: FlipPosterior, which: str) -> np.ndarray:
    """Posterior density of p or q on the grid, marginalised over the flip position."""
    grid = (np.arange(GRID) + 0.5) / GRID
    flips = post.flips()
    bad_d, bad_t, good_d, good_t = post.split()
    priors = post.priors
    if which == "p":
        d, t, a, b = bad_d, bad_t, priors.p_alpha, priors.p_beta
    else:
        d, t, a, b = good_d, good_t, priors.q_alpha, priors.q_beta
    if not flips.max() > 0:  # every flip ruled out (an end contradicted): the prior's shape
        flips, d, t = np.ones(1), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    keep = flips > 1e-6 * flips.max()
    w, d, t = flips[keep], d[keep], t[keep]
    log_grid, log_comp = np.log(grid), np.log1p(-grid)
    log_f = (a - 1 + d[:, None]) * log_grid + (b - 1 + (t - d)[:, None]) * log_comp
    f = np.exp(log_f - log_f.max(axis=1, keepdims=True))
    dens = (w[:, None] * f / f.sum(axis=1, keepdims=True)).sum(axis=0)
    return np.asarray(dens / dens.sum())


def p_is_one(post: FlipPosterior) -> float:
    """Posterior probability that the bug shows in every bad-side lifetime."""
    w = post.priors.p_point_mass
    if w <= 0:
        return 0.0
    base = post.base()
    lq = post.bb_q(base.good_d, base.good_t)
    point = np.where(base.bad_d == base.bad_t, math.log(w), -np.inf) + lq + post.log_prior
    end_bad_d, end_bad_t, end_good_d, end_good_t = post.end_counts()
    end_point = (
        np.where(end_bad_d == end_bad_t, math.log(w), -np.inf)
        + post.bb_q(end_good_d, end_good_t)
        + post.end_log_prior
    )
    return float(np.exp(point - base.log_z).sum() + np.exp(end_point - base.log_z).sum())


def rate_summary(
    post: FlipPosterior, which: str, one: float = 0.0
) -> tuple[float, tuple[float, float]]:
    """Median and 90% interval of p or q (the continuous part; ``one``, P(p = 1), shifts p's
    quantiles up)."""
    grid = (np.arange(GRID) + 0.5) / GRID
    cdf = np.cumsum(_density(post, which)) * (1 - one)

    def quantile(x: float) -> float:
        i = int(np.searchsorted(cdf, x))
        return 1.0 if i >= GRID else float(grid[i])

    return quantile(0.5), (quantile(0.05), quantile(0.95))


def rates(post: FlipPosterior) -> Rates:
    one = p_is_one(post)
    p_med, p_int = rate_summary(post, "p", one)
    q_med, q_int = rate_summary(post, "q")
    return Rates(p_med, p_int, q_med, q_int, one)
