"""What the good end's own lifetimes say: a false alarm, or a good end that is not good. Pure.

The search's model explains a divergence on the good side as a false alarm (rate ``q``, small).
One at the given good end is also what a good end that is not good at all looks like, while the
commits after it are fine (issue 30: a history with a real flip in it, where only the good end
fails; the run answered 99.5 % "both ends as given" in 3 of 3 runs). So the good end's lifetimes
are weighed on their own as well: under "a false alarm", they come from the good side's rate
``q`` (learnt from the other good-side candidates); under "not a good end", from the bad side's
rate ``p``, or, as likely, from a rate of its own (a good end that is bad may be bad another
way, or more rarely: a flaky good end failing half its lifetimes beside a bad side failing
every one fitted neither the bad side's p nor a false alarm, and the false alarm won, 5 of 17
"explained" at 99.7 %). Their likelihood ratio, with the prior ``end_doubt`` on the second,
gives ``good_end_not_good``: a run keeps testing the good end while it blocks the asked
confidence (up to ``SUSPECT_LIFETIMES_FACTOR`` times the ends' lifetimes), and stops with the
ends contradicting once it holds it, or once those lifetimes did not clear it. With no divergence
at the good end it is 0.
"""

from __future__ import annotations

import math

from bisect_tool.strategy import Summary, log_sequence
from bisect_tool.values import Direction


def _log_sequence(d: int, t: int, a: float, b: float, seen_d: int, seen_t: int) -> float:
    """log P(one given sequence of ``d`` divergences in ``t`` lifetimes), the rate ~ Beta(a, b)
    updated with ``seen_d`` of ``seen_t`` seen elsewhere."""
    return log_sequence(d, t, a + seen_d, b + seen_t - seen_d)


#: a good end that showed the bug is tested up to this many times ``max_end_lifetimes``: one
#: false alarm then needs ~15 clean lifetimes to stop blocking 0.99 (1 in 12 still leaves 0.7 %)
SUSPECT_LIFETIMES_FACTOR = 2


def good_end_not_good(s: Summary) -> float:
    """P(the good end shows the bug although the flip lies inside the range | its lifetimes)."""
    _, good = s.ends
    if good is None:
        return 0.0
    divergent, total = s.divergent, s.total
    d_g, t_g = int(divergent[good]), int(total[good])
    if not d_g:
        return 0.0
    flip = s.block[0]
    positions = range(len(total))
    if s.direction is Direction.REGRESSION:
        bad_side = [i for i in positions if i >= flip]
    else:
        bad_side = [i for i in positions if i < flip]
    good_side = [i for i in positions if i not in bad_side and i != good]
    priors = s.priors
    d_b, t_b = int(divergent[bad_side].sum()), int(total[bad_side].sum())
    d_q, t_q = int(divergent[good_side].sum()), int(total[good_side].sum())
    shared = _log_sequence(d_g, t_g, priors.p_alpha, priors.p_beta, d_b, t_b)
    own = _log_sequence(d_g, t_g, priors.p_alpha, priors.p_beta, 0, 0)
    top = max(shared, own)
    as_bad = top + math.log(0.5 * math.exp(shared - top) + 0.5 * math.exp(own - top))
    as_false_alarm = _log_sequence(d_g, t_g, priors.q_alpha, priors.q_beta, d_q, t_q)
    doubt = priors.end_doubt
    if doubt <= 0:
        return 0.0
    log_odds = math.log(doubt / (1 - doubt)) + as_bad - as_false_alarm
    if log_odds > 50:
        return 1.0
    return 1.0 / (1.0 + math.exp(-log_odds))
