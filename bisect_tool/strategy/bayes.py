"""The search as its callers see it: record lifetimes, select the next ones, read the posterior
and a summary. Pure. The parts live beside it: ``evidence`` (the counts), ``posterior`` (the
flip's posterior), ``rates`` (p and q), ``information`` (the value of more lifetimes) and
``selection`` (the choice)."""

from __future__ import annotations

import numpy as np

from bisect_tool.strategy.evidence import Evidence
from bisect_tool.strategy.posterior import FlipPosterior
from bisect_tool.strategy.rates import rates
from bisect_tool.strategy.selection import Policy, Selection
from bisect_tool.strategy.values import Choice, Costs, Priors, Rates, Summary, stop_threshold
from bisect_tool.values import Direction


def _frozen(a: np.ndarray) -> np.ndarray:
    out = np.array(a, copy=True)
    out.setflags(write=False)
    return out


class BayesianStrategy:
    """Posterior over the flip position; picks the next candidate; says when to stop.

    Positions ``0 .. size - 1`` are the candidates in history order, the old end first.
    ``deterministic``: a candidate's first conclusive run is its answer (one run a candidate,
    git bisect's contract; the fast probe of the tiered search and ``--deterministic``)."""

    def __init__(
        self,
        size: int,
        direction: Direction,
        *,
        priors: Priors | None = None,
        costs: Costs | None = None,
        confidence: float = 0.99,
        deterministic: bool = False,
    ) -> None:
        if size < 2:
            raise ValueError("a range needs at least two positions (the two ends)")
        self._confidence = confidence
        self._evidence = Evidence(size, direction)
        self._post = FlipPosterior(self._evidence, priors or Priors())
        self._policy = Policy(costs or Costs(), deterministic)
        self._selection = Selection(self._evidence, self._post, self._policy)
        self._summary: Summary | None = None

    # -- evidence -------------------------------------------------------------------------------

    def record(self, position: int, divergent: bool) -> None:
        """One conclusive lifetime at ``position``: did it show the bug?"""
        self._evidence.record(position, divergent)
        self._changed()

    def mark_untestable(self, position: int) -> None:
        """``position`` cannot run (no artifact, build or boot failure): never chosen; the
        flips it separates become one block."""
        self._evidence.untestable.add(position)
        self._changed()

    def retire(self, position: int) -> None:
        """Stop choosing ``position`` but keep its evidence (e.g. the probe keeps coming back
        inconclusive there after some conclusive lifetimes)."""
        self._evidence.retired.add(position)
        self._summary = None

    def mark_prepared(self, position: int) -> None:
        """``position``'s artifacts are at hand (the other tier fetched them): no switch cost."""
        self._evidence.ready.add(position)
        self._summary = None

    def set_prior(self, in_range: np.ndarray, ends: tuple[float, float]) -> None:
        """Replace the prior: ``in_range[f - 1]`` for each flip f = 1..n and ``ends`` = (beyond
        the good end, bad end not bad), as non-negative weights (normalised here)."""
        self._post.set_prior(in_range, ends)
        self._changed()

    def set_costs(self, costs: Costs) -> None:
        """Choose by these costs from now on (the run's measured ones)."""
        if costs != self._policy.costs:
            self._policy.costs = costs
            self._summary = None

    def _changed(self) -> None:
        self._post.invalidate()
        self._summary = None

    # -- decisions --------------------------------------------------------------------------------

    def select(self, within: tuple[int, int] | None = None) -> Choice:
        """The next lifetimes to run, by expected information per unit cost. ``within`` = (bad
        side, good side): only those two are chosen from, checked the way the ends are (the
        tiered search's confirm step). Raises ``NoCandidateLeft``."""
        return self._selection.select(within)

    def select_batch(self, slots: int, within: tuple[int, int] | None = None) -> list[Choice]:
        """Work for ``slots`` lifetimes at once (several GPUs)."""
        return self._selection.select_batch(slots, within)

    # -- reading ----------------------------------------------------------------------------------

    def posterior(self) -> np.ndarray:
        """P(flip at f and both ends as claimed) for f = 1..n (index f - 1), read-only. It sums
        to 1 minus the two end doubts (``Summary.good_end_doubt``, ``bad_end_doubt``)."""
        return _frozen(self._post.flips())

    def rates(self) -> Rates:
        """p and q: medians, 90% intervals, P(p = 1) (a grid integral: for reports, not loops)."""
        return rates(self._post)

    def summary(self) -> Summary:
        """Where the search stands (cached until the evidence changes)."""
        if self._summary is None:
            self._summary = self._summarise()
        return self._summary

    def summary_under(self, in_range: np.ndarray, ends: tuple[float, float]) -> Summary:
        """Where the search would stand under another prior over the flip (``set_prior``'s
        arguments), on the same evidence: the tiered search's lifetimes weighed without the
        fast probe's prior (``tiers.lifetimes_alone``). Not cached; changes nothing."""
        post = FlipPosterior(self._evidence, self._post.priors)
        post.set_prior(in_range, ends)
        return self._summarise(post)

    def _summarise(self, post: FlipPosterior | None = None) -> Summary:
        ev, post = self._evidence, post or self._post
        block, mass = post.top_block()
        beyond, not_bad = post.end_doubts()
        threshold = stop_threshold(self._confidence)
        base = post.base()
        return Summary(
            size=ev.n + 1,
            direction=ev.direction,
            bad_end=ev.bad_end,
            good_end=ev.good_end,
            ends=ev.effective_ends(),
            divergent=_frozen(ev.divergent),
            total=_frozen(ev.total),
            untestable=frozenset(ev.untestable),
            at_hand=frozenset(int(i) for i in np.flatnonzero(ev.total)) | ev.ready,
            block=block,
            confidence=mass,
            credible_set=post.credible_set(0.9),
            candidates_left=len(post.credible_set(0.99)),
            good_end_doubt=beyond,
            bad_end_doubt=not_bad,
            threshold=threshold,
            done=mass >= threshold,
            bug_shown=post.bug_shown(),
            contradicted_end=post.contradicted_end(threshold),
            contradiction=ev.contradiction(),
            bad_side=_frozen(post.bad_side()),
            evaluations=int(ev.total.sum()),
            candidates_tested=int((ev.total > 0).sum()),
            deterministic=self._policy.deterministic,
            priors=post.priors,
            costs=self._policy.costs,
            log_likelihood=_frozen(base.log_like),
            end_log_likelihood=_frozen(base.end_like),
        )
