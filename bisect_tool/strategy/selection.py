"""Which lifetimes to run next: the ends' checks, then expected information per unit cost
("patch leaving"), one at a time or for several slots at once. Pure.

Another lifetime of a candidate whose artifacts are already prepared costs ``Costs.lifetime``;
a new candidate costs ``Costs.new_candidate`` more (a download or a build). Untestable and
retired candidates are never chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bisect_tool.strategy.evidence import Evidence
from bisect_tool.strategy.information import Plan, plan_values
from bisect_tool.strategy.posterior import FlipPosterior
from bisect_tool.strategy.values import Choice, Costs, NoCandidateLeft

#: lifetimes planned at once when a new candidate is prepared
BATCH_OPTIONS = (1, 2, 3, 5, 8)
#: posterior quantiles whose positions are worth scoring (plus neighbours, ends, prepared)
QUANTILES = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)
#: lifetimes at the bad end before the search leaves it (it is prepared, so they are cheap),
#: unless one of them runs clean first: a deterministic-looking bug must earn the point mass
#: at p = 1 before clean candidates are judged by it (search-notes: estimate p early)
BAD_END_LIFETIMES = 3


@dataclass
class Policy:
    """How the search chooses, besides the posterior: the costs (the run's measured ones, the
    recipe's until then) and whether the probe is deterministic (the op check: fixed inputs,
    the same rows in every run; ``--deterministic``): then a candidate's first conclusive run
    is its answer, so no candidate is run twice and parallel slots split the posterior instead
    of repeating a candidate."""

    costs: Costs
    deterministic: bool = False

    @property
    def bad_end_lifetimes(self) -> int:
        return 1 if self.deterministic else BAD_END_LIFETIMES


class Selection:
    """The choice of the next lifetimes from ``evidence`` and ``post`` (read, never written)."""

    def __init__(self, evidence: Evidence, post: FlipPosterior, policy: Policy) -> None:
        self.evidence = evidence
        self.post = post
        self.policy = policy

    def select(self, within: tuple[int, int] | None = None) -> Choice:
        """The next lifetimes to run, by expected information per unit cost.

        ``within`` = (bad side, good side): only those two candidates are chosen from, and they
        are checked the way the ends are (the tiered search's confirm step, on both sides of
        the flip the fast probe found)."""
        ev = self.evidence
        if within is None:
            bad_end, good_end = ev.effective_ends()
            if bad_end is None or good_end is None:
                raise NoCandidateLeft("no testable candidate is left at one end of the range")
            names = ("the bad end", "the good end")
        else:
            bad_end, good_end = within
            names = ("the bad side", "the good side")
        t, d = ev.total, ev.divergent
        if t[bad_end] == 0:
            return Choice(bad_end, 1, f"check {names[0]} first")
        # Until the bug shows somewhere, only the bad end can show that there is anything to
        # bisect; once a lifetime inside the range showed it (a fall-back from the tiered
        # search), hammering a quiet bad end teaches nothing the ranking would not choose.
        if d[bad_end] == 0 and (within is not None or not d.any()):
            return Choice(bad_end, 1, f"{names[0]} has not shown the bug yet")
        if t[bad_end] < self.policy.bad_end_lifetimes and d[bad_end] == t[bad_end]:
            return Choice(bad_end, 1, f"estimate how often {names[0]} shows the bug")
        if t[good_end] == 0:
            return Choice(good_end, 1, f"check {names[1]}")
        ranked = self.ranked(None if within is None else set(within))
        if not ranked or ranked[0].rate <= 1e-9:
            raise NoCandidateLeft("every candidate that could tell the flip apart is untestable")
        return ranked[0]

    def _worth_scoring(self) -> list[int]:
        ev, post = self.evidence, self.post
        cdf = np.cumsum(post.flips())
        found: set[int] = {ev.bad_end, ev.good_end}
        for f in np.searchsorted(cdf, QUANTILES) + 1:  # hypothesis f at each quantile
            found.update({int(f) - 1, int(f)})
        block, _ = post.top_block()
        found.update({block[0] - 1, block[-1]})
        bad_side = post.bad_side()
        found.update(int(i) for i in np.flatnonzero(ev.total)
                     if 1e-4 < bad_side[i] < 1 - 1e-4)
        return sorted(i for i in found if 0 <= i <= ev.n and ev.choosable(i))

    def ranked(self, only: set[int] | None = None) -> list[Choice]:
        """The best option of each scored position (of ``only``, when given), best rate first."""
        ev = self.evidence
        if only is None:
            positions = self._worth_scoring()
        else:
            positions = sorted(i for i in only if ev.choosable(i))
        if self.policy.deterministic:
            # A second run would repeat the first one's answer; the candidates that can still
            # tell the flip apart are the nearest ones not yet run. Next to a bracketed flip the
            # model's small false-alarm rate leaves ~1e-3 on the flip lying further back, which
            # one more run beside the bracket settles (the demo at 80 commits stopped here).
            positions = sorted({j for i in positions for j in ev.nearest_unrun(i)})
        if not positions:
            return []
        one = (Plan(1),)
        new_plans = tuple(Plan(m) for m in BATCH_OPTIONS)
        plans = [one if ev.prepared(i) else new_plans for i in positions]
        gains, lifetimes = plan_values(self.post, positions, plans)
        costs = self.policy.costs
        best_of: list[Choice] = []
        for i, options, g, m_exp in zip(positions, plans, gains, lifetimes, strict=True):
            prepared = ev.prepared(i)
            # a candidate whose artifacts are already at hand (another tier fetched them) costs
            # no switch
            switch = 0.0 if ev.at_hand(i) else costs.new_candidate
            best: Choice | None = None
            for plan, gain, m in zip(options, g, m_exp, strict=True):
                rate = float(gain) / (m * costs.lifetime + switch)
                if best is None or rate > best.rate:
                    reason = "another lifetime" if prepared else "new candidate"
                    best = Choice(i, plan.lifetimes, reason, rate)
            if best is not None:
                best_of.append(best)
        return sorted(best_of, key=lambda c: -c.rate)

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
        if self.policy.deterministic:
            return self._split_batch(first, slots)
        if first.reason.startswith(("check", "the bad end", "estimate")):
            # the ends: more lifetimes of the same end are exactly what is needed
            return [Choice(first.position, min(slots, max(first.lifetimes, slots)), first.reason)]
        batch = [Choice(first.position, min(first.lifetimes, slots), first.reason, first.rate)]
        used = batch[0].lifetimes
        for choice in self.ranked():
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
        _, good = within
        counts: dict[int, int] = {first.position: 1}
        reasons = {first.position: first.reason}
        usable = [i for i in within if self.evidence.choosable(i)]
        ranked = self.ranked(set(usable)) if usable else []
        for _ in range(slots - 1):
            if good in usable and not self.evidence.total[good] and good not in counts:
                pick, why = good, "check the good side (parallel)"
            elif ranked and ranked[0].rate > 1e-9:
                pick, why = ranked[0].position, ranked[0].reason + " (parallel)"
            else:
                pick, why = first.position, first.reason
            counts[pick] = counts.get(pick, 0) + 1
            reasons.setdefault(pick, why)
        return [Choice(pos, n, reasons[pos]) for pos, n in counts.items()]

    def _split_batch(self, first: Choice, slots: int) -> list[Choice]:
        """Slots for a deterministic probe: the ends not yet run, then candidates that cut the
        flip's posterior into equal parts, so that k runs at once narrow the range (k + 1)-fold
        rather than 2-fold, as k neighbours of the best single split would (nearly the same
        answer k times); no candidate runs twice."""
        ev = self.evidence
        batch: list[Choice] = []
        taken: set[int] = set()

        def add(position: int, reason: str) -> None:
            batch.append(Choice(position, 1, reason))
            taken.add(position)

        bad, good = ev.effective_ends()
        for end, name in ((bad, "bad"), (good, "good")):
            if end is not None and not ev.total[end] and len(batch) < slots:
                add(end, f"check the {name} end")
        free = slots - len(batch)
        if free > 0:
            post = self.post.flips()
            cdf = np.cumsum(post) / max(float(post.sum()), 1e-300)
            # testing position i separates the flips f <= i from f > i (1-based hypotheses)
            for j in range(1, free + 1):
                i = int(np.searchsorted(cdf, j / (free + 1))) + 1
                if 0 < i < ev.n and i not in taken and ev.unrun(i):
                    add(i, "split the range")
            for choice in self.ranked():
                if len(batch) >= slots:
                    break
                if choice.position not in taken and choice.rate > 1e-9:
                    add(choice.position, choice.reason)
        return batch or [first]
