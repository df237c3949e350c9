"""The search: a Bayesian posterior over the flip position for an intermittent probe.

Pure: plain values in, plain values out; no git, docker or HTTP here. Its callers use
``BayesianStrategy`` (record, select, posterior, summary; mark_untestable, retire,
mark_prepared, set_prior, set_costs, select_batch, rates, summary_under) and the plain values
below, nothing else: the parts inside are for this package.

Positions ``0..n`` are the candidates in history order: position 0 is the *old end* (the older of
good/bad), position ``n`` the *new end*. A hypothesis ``f`` in ``1..n`` says the first commit with
the new behaviour is at ``f``. Under intermittent evidence the ends are hypotheses too (the seed
thread records a whole clean lifetime of the buggy v0.26.0), so the stated confidence is P(the
flip is the named commit AND both ends behave as claimed), and the search keeps testing an end
until that holds; when an end hypothesis itself reaches the threshold the search says so instead
of naming a commit.

A lifetime on the bad side shows the bug with unknown probability ``p``, on the good side with an
unknown false-alarm rate ``q``; both are integrated out (``posterior``). ``p``'s prior has a
point mass at exactly 1, so a deterministic bug is recognised quickly and costs about what
classic bisection costs. Selection is by expected information per unit cost (``information``,
``selection``). Untestable candidates are removed from the choice but keep their prior:
hypotheses separated only by untestable commits cannot be told apart, so the answer is then a
*block*, as ``git bisect`` reports it. The search stops when the top block holds
``stop_threshold(confidence)``, stricter than the confidence itself (``values.STOP_FACTOR``).

The modules: ``values`` (priors, costs, a choice, the summary), ``evidence`` (the counts),
``posterior`` (the flip), ``rates`` (p and q), ``information`` (the value of more lifetimes),
``selection`` (the choice), ``bayes`` (the class the callers use); ``beta`` (log B(a, b) and
a run's evidence under a Beta rate: ``log_beta``, ``log_sequence``) is shared with the end
checks, the locate matrix and the report.
"""

from bisect_tool.strategy.bayes import BayesianStrategy
from bisect_tool.strategy.beta import log_beta, log_sequence
from bisect_tool.strategy.values import (
    CLEAN_AGAINST_RATE,
    Choice,
    Costs,
    NoCandidateLeft,
    Priors,
    Rates,
    Summary,
    stop_threshold,
)

__all__ = [
    "CLEAN_AGAINST_RATE",
    "BayesianStrategy",
    "Choice",
    "Costs",
    "NoCandidateLeft",
    "Priors",
    "Rates",
    "Summary",
    "log_beta",
    "log_sequence",
    "stop_threshold",
]
