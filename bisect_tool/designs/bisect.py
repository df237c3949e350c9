"""The bisect design: the search over a range, as the journal has it so far. Pure.

``BisectDesign`` wraps the search state rebuilt from the journal (``session.State``) and
decides, from it alone, what the run does next: a tier's lifetimes (the fast probe's runs while
it narrows, lifetimes on the two sides of its flip while they confirm it, lifetimes over the
whole range otherwise), a phase entry when the tiered search moves on, the controls before any
evidence counts, or the end with its reason. The engine (``bisect_tool.engine``) carries that
out; ``designs.drive`` does the same for ``bisect simulate``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool import entries, lookahead
from bisect_tool.designs import Finish, Item, Step, Work, controls_item
from bisect_tool.designs.phases import (
    Lifetimes,
    decide,
    ends_contradict,
    suspect,
    switch,
)
from bisect_tool.ends import checks_seen, good_end_not_good
from bisect_tool.events import CandidateChosen, Event, PosteriorMoved
from bisect_tool.range import Candidate
from bisect_tool.session import State, observation_entry
from bisect_tool.strategy import BayesianStrategy, Choice, NoCandidateLeft
from bisect_tool.tiers import Phase, Tier
from bisect_tool.values import Observation
from bisect_tool.verdict import EndState, controls_problem

#: the evaluators a bisect's items name: the recipe's own probe, and the fast one that narrows
FAITHFUL = str(Tier.FAITHFUL)
NARROW = str(Tier.NARROW)


class BisectDesign:
    """The bisect as a design: ``apply`` journal entries, ask ``next_step``.

    ``slots`` lifetimes may run at once; ``controls``: the run wants the positive and negative
    controls (on the good end) before any lifetime counts."""

    def __init__(self, state: State, *, slots: int = 1, controls: bool = False) -> None:
        self.state = state
        self.slots = max(1, slots)
        self.controls = controls
        # the controls were handed out to run in the background and have not come back yet
        # (not journaled: a resumed run asks for them again)
        self._controls_running = False

    # -- the Design protocol ----------------------------------------------------------------

    def apply(self, entry: Mapping[str, Any]) -> None:
        if entry.get("type") == "controls":
            self._controls_running = False
        self.state.apply(entry)

    def next_step(self) -> Step:
        state = self.state
        problem = controls_problem(state.controls)
        if problem:
            return Finish(EndState.CONTROLS_FAILED, problem)
        decision = decide(state)
        if not isinstance(decision, Lifetimes):
            return decision
        wanted = self.controls and state.controls is None and not self._controls_running
        if wanted and decision.tier is Tier.NARROW:
            return self._narrow_beside_controls(decision)
        if decision.tier is Tier.FAITHFUL and wanted:
            # Before the first lifetime counts: the controls, on the good end or, where the
            # pinned stack cannot run it, the nearest testable candidate toward the bad end. A
            # tiered run narrows first, so its fast probe gates the ends before this.
            _, good = state.strategy.summary().ends
            if good is None:
                return Finish(EndState.END_UNTESTABLE, (
                    "no candidate at the good end can run the controls: "
                    + "; ".join(str(e.get("problem", "")) for e in state.controls_refused)))
            controls = controls_item(state.candidates[good].sha, FAITHFUL)
            self._controls_running = True
            if self.slots == 1:
                return Work((controls,))
            # with slots to spare the first lifetimes boot beside the controls (they count once
            # the controls held; a run whose controls fail ends there, with them journaled)
            first = self._lifetimes(decision, self.slots - 1)
            if not isinstance(first, Work):
                return Work((controls,))
            return Work((controls, *first.items), first.prepare, first.events)
        return self._lifetimes(decision)

    def _narrow_beside_controls(self, decision: Lifetimes) -> Step:
        """The fast probe's next runs, and the controls started in the background once it has
        checked both ends: they boot a server (a minute for vLLM) while the op check narrows in
        seconds a run, so the confirm step finds them done (issue 31: 180 s of controls before
        the first lifetime on the H100). Before both ends are checked they wait: ends given the
        wrong way round stop the run in seconds, with nothing booted."""
        step = self._lifetimes(decision)
        narrow = self.state.strategy_for(Tier.NARROW).summary()
        bad, good_narrow = narrow.ends
        _, good = self.state.strategy.summary().ends
        checked = (bad is not None and good_narrow is not None
                   and narrow.total[bad] > 0 and narrow.total[good_narrow] > 0)
        if not isinstance(step, Work) or not checked or good is None:
            return step
        self._controls_running = True
        controls = controls_item(self.state.candidates[good].sha, FAITHFUL, background=True)
        return Work((*step.items, controls), step.prepare, step.events)

    def refill(self, running: Sequence[Item], free: int) -> Work | None:
        """Lifetimes for ``free`` slots that came back while ``running`` ones still run: what
        ``next_step`` would hand out now to every slot, less what is already running (on the
        H100 a slot stood idle 188 s beside the controls once the gate had refused its release:
        docs/bench/gpu-2026-12-07-h100). None, to wait for the running ones, whenever the next
        step is no lifetimes of their tier: a phase change, the controls, the end (which thus
        still counts every lifetime under way). A deterministic probe keeps whole batches: its
        runs take seconds, and each one's answer decides where the next one goes."""
        state = self.state
        lifetimes = [item for item in running if not item.controls]
        if free <= 0 or controls_problem(state.controls):
            return None
        if self.controls and state.controls is None and not self._controls_running:
            return None
        decision = decide(state)
        if not isinstance(decision, Lifetimes):
            return None
        if any(item.key[1] is not decision.tier for item in lifetimes):
            return None
        strategy = state.strategy_for(decision.tier)
        if strategy.summary().deterministic or _could_end(strategy, lifetimes):
            return None
        out = {item.lifetime_id for item in lifetimes} - state.seen_lifetimes
        state.seen_lifetimes.update(out)  # their ids are taken: the new ones come after
        try:
            step = self._lifetimes(decision, free + len(lifetimes))
        finally:
            state.seen_lifetimes.difference_update(out)
        if not isinstance(step, Work):
            return None
        under_way = Counter(item.key for item in lifetimes)
        items: list[Item] = []
        for item in step.items:
            if under_way[item.key]:
                under_way[item.key] -= 1
            elif len(items) < free:
                items.append(item)
        if not items:
            return None
        started = Counter(item.commit for item in items)
        events = tuple(
            dataclasses.replace(e, lifetimes=started[e.sha]) if isinstance(e, CandidateChosen)
            else e
            for e in step.events if not isinstance(e, CandidateChosen) or started[e.sha])
        return Work(tuple(items), step.prepare, events)

    def observation_entry(self, item: Item, obs: Observation) -> Mapping[str, Any]:
        position, tier = item.key
        return observation_entry(obs, position, tier)

    def end_entry(self, finish: Finish) -> Mapping[str, Any]:
        return end_entry(self.state, finish.state, finish.message, finish.extra)

    def progress(self, item: Item) -> Event | None:
        s = self.state.strategy_for(item.key[1]).summary()
        return PosteriorMoved(
            len(self.state.seen_lifetimes),
            s.candidates_left,
            self.state.candidates[s.block[0]].sha,
            s.confidence,
        )

    # -- lifetimes --------------------------------------------------------------------------

    def _lifetimes(self, decision: Lifetimes, slots: int | None = None) -> Step:
        state, tier = self.state, decision.tier
        slots = self.slots if slots is None else slots
        strategy = state.strategy_for(tier)
        # the run's own costs, as measured so far (the recipe's until then)
        strategy.set_costs(state.measured_costs(tier))
        suspect = self._suspect(decision)
        try:
            if decision.at is not None:
                batch = [Choice(decision.at, 1, decision.why)]
            elif suspect is not None:
                batch = [Choice(suspect[0], slots, suspect[1])]
            else:
                batch = strategy.select_batch(slots, decision.within)
        except NoCandidateLeft as exc:
            if tier is Tier.NARROW or decision.within is not None:
                return switch(Phase.FAITHFUL, f"the tiered search cannot go on ({exc}); going "
                                               "on with lifetimes over the whole range")
            summary = strategy.summary()
            _, good = summary.ends
            if good is not None and summary.divergent[good]:
                # nothing left to run, and the good end showed the bug: that, not an untestable
                # range, is why no flip holds the confidence
                return ends_contradict(state, "good", summary, good_end_not_good(summary))
            return Finish(EndState.NO_CANDIDATE, str(exc))
        items: list[Item] = []
        events: list[Event] = []
        reserved: list[str] = []
        for choice in batch:
            candidate = state.candidates[choice.position]
            count = choice.lifetimes if slots > 1 else 1
            ids = state.next_lifetime_ids(candidate.sha, count, tier)
            state.seen_lifetimes.update(ids)  # reserved while the batch is made
            reserved += ids
            items += [Item(str(tier), candidate.sha, lid, candidate.tags, (choice.position, tier))
                      for lid in ids]
            events.append(self._chosen(tier, candidate, choice.reason, len(ids)))
        state.seen_lifetimes.difference_update(reserved)
        # at most K candidates fetched while this batch runs (bisect_tool.lookahead)
        ahead = lookahead.lookahead(
            state.header.get("recipe") or {}, tier, strategy,
            [choice.position for choice in batch], decision.within,
        )
        prepare = tuple(state.candidates[p].sha for p in ahead)
        return Work(tuple(items), prepare, tuple(events))

    def _suspect(self, decision: Lifetimes) -> tuple[int, str] | None:
        """The candidate the plain search's checks want run next (``phases.suspect``)."""
        if decision.tier is not Tier.FAITHFUL or decision.within is not None:
            return None
        return suspect(self.state)

    def _chosen(self, tier: Tier, candidate: Candidate, reason: str, lifetimes: int) -> Event:
        s = self.state.strategy_for(tier).summary()
        return CandidateChosen(
            candidate.sha,
            candidate.subject,
            reason,
            lifetimes,
            s.evaluations,
            s.candidates_left,
            self.state.candidates[s.block[0]].sha,
            s.confidence,
            str(tier) if self.state.tiered else "",
        )


def _could_end(strategy: BayesianStrategy, running: Sequence[Item]) -> bool:
    """Whether the lifetimes under way would end the search, each coming back as the posterior
    expects (divergent on the likely bad side): then a slot that comes back waits for them
    rather than start a lifetime the answer does not need, which the end would wait for
    (bench/slots.py: refilled at once, the tiered runs took 0.89x as long as whole batches)."""
    if not running:
        return False
    bad_side = strategy.summary().bad_side
    what_if = copy.deepcopy(strategy)
    for item in running:
        position = item.key[0]
        what_if.record(position, bool(bad_side[position] >= 0.5))
    return what_if.summary().done


def end_entry(
    state: State, state_name: EndState, message: str, facts: Mapping[str, Any] | None = None
) -> entries.EndEntry:
    """The ``end`` entry (so `status` reports the outcome and a new `start` is allowed), with
    the summary at that point, what the checks of the model saw (``checks``: the chance that
    the good end shows the bug after all, and that the good side of the flip shows it at a
    rate of its own, with the good-side candidates that showed it) and what the stop rule saw
    (``facts``), as plain values."""
    summary = state.summary()
    sha = {i: c.sha for i, c in enumerate(state.candidates)}
    seen = checks_seen(state.strategy.summary())
    summary["checks"] = {
        **{k: v for k, v in seen.items() if k not in ("good_side_diverged", "clean")},
        "good_side_diverged": [[sha[i], d, t] for i, d, t in seen["good_side_diverged"]],
        "clean": [[sha[i], n] for i, n in seen["clean"]],
    }
    summary.update(facts or {})
    summary["state"] = str(state_name)
    summary["message"] = message
    slim = {k: v for k, v in summary.items() if k != "posterior"}
    return entries.end(str(state_name), message, summary=slim)


