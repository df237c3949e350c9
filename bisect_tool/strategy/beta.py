"""The Beta function in log space, and the evidence of a run of lifetimes under a Beta-distributed
rate: the one helper the search, the end checks, the locate matrix and the report share. Pure."""

from __future__ import annotations

import math


def log_beta(a: float, b: float) -> float:
    """log B(a, b)."""
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def log_sequence(divergent: int, total: int, a: float, b: float) -> float:
    """log P(one given sequence of ``divergent`` divergences in ``total`` lifetimes), the rate
    ~ Beta(a, b) integrated out: log B(a + d, b + t - d) - log B(a, b)."""
    return log_beta(a + divergent, b + total - divergent) - log_beta(a, b)
