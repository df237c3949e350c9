"""The bisect design: the search over a range, as the journal has it so far. Pure.

``BisectDesign`` wraps the search state rebuilt from the journal (``ledger.Ledger``) and
decides, from it alone, what the run does next: a tier's lifetimes (the fast probe's runs while
it narrows, lifetimes on the two sides of its flip while they confirm it, lifetimes over the
whole range otherwise), a phase entry when the tiered search moves on, the controls before any
evidence counts, or the end with its reason. The engine (``bisect_tool.run.engine``) carries that
out; ``designs.drive`` does the same for ``bisect simulate``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from bisect_tool.designs import (
    Finish,
    Item,
    Step,
    Wait,
    Work,
    controls_item,
    fill,
    gate_item,
)
from bisect_tool.designs.ledger import Ledger, observation_entry
from bisect_tool.designs.phases import (
    Lifetimes,
    decide,
    ends_contradict,
    suspect,
    switch,
)
from bisect_tool.events import CandidateChosen, Event, Note, PosteriorMoved
from bisect_tool.journal import entries
from bisect_tool.range import Candidate
from bisect_tool.strategy import BayesianStrategy, Choice, NoCandidateLeft, lookahead
from bisect_tool.strategy.ends import good_end_not_good
from bisect_tool.strategy.tiers import MixturePrior, Phase, Sides, Tier, confirmed, disagreement
from bisect_tool.values import Observation, Verdict
from bisect_tool.verdict import EndState, controls_problem

#: the evaluators a bisect's items name: the recipe's own probe, and the fast one that narrows
FAITHFUL = str(Tier.FAITHFUL)
NARROW = str(Tier.NARROW)


class BisectDesign:
    """The bisect as a design: ``apply`` journal entries, ask ``next_step``.

    ``slots`` lifetimes may run at once; ``controls``: the run wants the positive and negative
    controls (on the good end) before any lifetime counts; ``controls_beside``: they have GPU
    slots of their own (``[runtime] controls_own_slot``), so they run in the background and the
    lifetimes keep every slot (on the H100 they took one of two: issue 39's two-slot run went
    one lifetime at a time). ``gate_sweep``: the faithful evaluator can ask the compatibility
    gate alone (``interfaces.Gates``), and a release-level run then gates every release at
    once, in the background, before any server boots (``_sweep``)."""

    def __init__(self, state: Ledger, *, slots: int | Callable[[], int] = 1,
                 controls: bool = False, controls_beside: bool = False,
                 gate_sweep: bool = False) -> None:
        self.state = state
        self._slots = slots
        self.controls = controls
        self.controls_beside = controls_beside
        self.gate_sweep = gate_sweep and state.header.get("level") == "release"
        # the controls were handed out to run in the background and have not come back yet
        # (not journaled: a resumed run asks for them again)
        self._controls_running = False
        # the gate's sweep: handed out (once a run), and the candidates not yet back
        self._swept = False
        self._gating: set[str] = set()

    @property
    def slots(self) -> int:
        """Lifetimes that may run at once now (a GPU that backed off holds fewer)."""
        return max(1, self._slots() if callable(self._slots) else self._slots)

    # -- the Design protocol ----------------------------------------------------------------

    def apply(self, entry: Mapping[str, Any]) -> None:
        read = entries.parse(entry)
        match read:
            case entries.ControlsRan():
                self._controls_running = False
            case entries.GateLetThrough(commit=commit) | entries.Refused(commit=commit):
                self._gating.discard(commit)
        self.state.count(read)

    def next_step(self) -> Step:
        state = self.state
        problem = controls_problem(state.controls)
        if problem:
            return Finish(EndState.CONTROLS_FAILED, problem)
        sweep = self._sweep()
        if sweep is not None:
            return sweep
        decision = decide(state)
        if self._gating and not (isinstance(decision, Lifetimes)
                                 and decision.tier is Tier.NARROW):
            # nothing but the op check before every release is gated: the confirm step's
            # sides, the lifetimes and the controls then go to testable ones at once (on the
            # H100 the controls tried three refused releases in turn and ended at 361 s of a
            # 406 s run: issue 39)
            return Wait()
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
            self._controls_running = True
            if self.controls_beside:
                beside = controls_item(state.candidates[good].sha, FAITHFUL, background=True)
                first = self._lifetimes(decision)
                if not isinstance(first, Work):
                    return Work((beside,))
                return Work((*first.items, beside), first.prepare, first.events)
            controls = controls_item(state.candidates[good].sha, FAITHFUL)
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
        if not isinstance(step, Work) or not checked or good is None or self._gating:
            return step
        self._controls_running = True
        controls = controls_item(self.state.candidates[good].sha, FAITHFUL, background=True)
        return Work((*step.items, controls), step.prepare, step.events)

    def _sweep(self) -> Work | None:
        """Once a run, a release-level run's gate on every release not gated yet, all at once in
        the background (a schema dump is 7-11 s on the H100; the op check narrows beside it,
        nothing boots before it is in). Likeliest needed first: the ends, then from the middle
        out, so a cold cache fetches what the op check runs first."""
        if not self.gate_sweep or self._swept:
            return None
        self._swept = True
        state = self.state
        untestable = state.strategy.summary().untestable
        last = len(state.candidates) - 1
        order = sorted(range(len(state.candidates)),
                       key=lambda i: (i not in (0, last), abs(2 * i - last)))
        items = tuple(
            gate_item(state.candidates[i].sha, FAITHFUL, (i, Tier.FAITHFUL),
                      state.candidates[i].tags)
            for i in order if i not in state.gated and i not in untestable)
        if not items:
            return None
        self._gating = {item.commit for item in items}
        return Work(items, events=(Note(
            f"gating {len(items)} releases at once before any server boots"),))

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
        if self._gating and decision.tier is Tier.FAITHFUL:
            return None
        if any(item.key[1] is not decision.tier for item in lifetimes):
            return None
        strategy = state.strategy_for(decision.tier)
        if strategy.summary().deterministic:
            return None
        confirm = decision.within is not None and decision.at is None
        if not confirm and _could_end(strategy, lifetimes):
            return None
        # the ids of those under way are taken: the new ones come after
        under_way_ids = frozenset(item.lifetime_id for item in lifetimes)
        if confirm:
            # the confirm step: the plan's next lifetimes beside those under way
            step = self._lifetimes(
                decision, free, [item.key[0] for item in lifetimes], under_way_ids)
            return step if isinstance(step, Work) and step.items else None
        step = self._lifetimes(decision, free + len(lifetimes), taken=under_way_ids)
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
        if item.gate:
            if obs.verdict is Verdict.UNTESTABLE:
                return entries.untestable(
                    obs.commit, position, obs.message, stage=str(obs.detail.get("stage") or ""),
                    duration_s=obs.duration_s)
            return entries.gate_passed(obs.commit, position, duration_s=obs.duration_s)
        return observation_entry(obs, position, tier)

    def end_entry(self, finish: Finish) -> Mapping[str, Any]:
        return end_entry(self.state, finish.state, finish.message, finish.extra)

    def progress(self, item: Item) -> Event | None:
        if item.gate:
            position = item.key[0]
            why = self.state.untestable_why.get(position)
            if position not in self.state.strategy.summary().untestable or why is None:
                return None
            return Note(f"the gate refused {self.state.candidates[position].label}: {why}")
        s = self.state.strategy_for(item.key[1]).summary()
        return PosteriorMoved(
            len(self.state.seen_lifetimes),
            s.candidates_left,
            self.state.candidates[s.block[0]].sha,
            s.confidence,
        )

    # -- lifetimes --------------------------------------------------------------------------

    def _lifetimes(
        self, decision: Lifetimes, slots: int | None = None, running: Sequence[int] = (),
        taken: frozenset[str] = frozenset(),
    ) -> Step:
        """``slots`` lifetimes (all of them by default) for ``decision``; in the confirm step,
        beside the lifetimes ``running`` (their positions), those the answer is expected to
        need (``designs.fill``), and none when those running are expected to end it.
        ``taken``: lifetime ids already handed out (those under way)."""
        state, tier = self.state, decision.tier
        slots = self.slots if slots is None else slots
        strategy = state.strategy_for(tier)
        suspect = self._suspect(decision)
        try:
            if decision.at is not None:
                batch = [Choice(decision.at, 1, decision.why)]
            elif suspect is not None:
                batch = [Choice(suspect[0], slots, suspect[1])]
            elif (decision.within is not None and self.slots > 1
                  and not strategy.summary().deterministic):
                batch = _confirm_batch(strategy, decision.within, running, slots,
                                       state.prior, state.settings.confidence)
                if not batch and running:
                    return Work(())  # those under way are expected to end it: wait for them
                batch = batch or strategy.select_batch(slots, decision.within)
            else:
                batch = strategy.select_batch(slots, decision.within)
                if strategy.summary().deterministic and decision.within is None:
                    batch = useful_runs(strategy, batch)
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
        handed_out = set(taken)
        for choice in batch:
            candidate = state.candidates[choice.position]
            count = choice.lifetimes if slots > 1 else 1
            ids = state.next_lifetime_ids(candidate.sha, count, tier, handed_out)
            handed_out.update(ids)
            items += [Item(str(tier), candidate.sha, lid, candidate.tags, (choice.position, tier))
                      for lid in ids]
            events.append(self._chosen(tier, candidate, choice.reason, len(ids)))
        # at most K candidates fetched while this batch runs (bisect_tool.strategy.lookahead)
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


def useful_runs(strategy: BayesianStrategy, batch: Sequence[Choice]) -> list[Choice]:
    """A deterministic probe's batch (the op check: one run settles a candidate) less the runs
    whose answer could not move the answer: a run at position i tells the flips f <= i from
    f > i, so it is worth a slot only while each side holds at least the mass the search may
    leave unresolved (1 - its stopping threshold). The ends' first runs always count. With 8
    slots the op check ran 12 times over 12 candidates on the H100 (issue 39): the second round
    filled its slots with candidates beside a flip already bracketed; k slots need about
    log_{k+1} N rounds of the runs that split what is left."""
    s = strategy.summary()
    flips = np.asarray(strategy.posterior(), dtype=float)
    total = float(flips.sum())
    if total <= 0:
        return list(batch)
    below = np.concatenate([[0.0], np.cumsum(flips) / total])  # mass of f <= i, i = 0 .. n
    slack = 1 - s.threshold
    ends = {e for e in s.ends if e is not None and not s.total[e]}
    kept = [c for c in batch if c.position in ends
            or min(below[c.position], 1 - below[c.position]) >= slack]
    return kept or list(batch[:1])


def _confirm_batch(
    strategy: BayesianStrategy, sides: tuple[int, int], running: Sequence[int], free: int,
    prior: MixturePrior | None, confidence: float,
) -> list[Choice]:
    """The confirm step's lifetimes for ``free`` slots beside those ``running``: what the
    answer is expected to need from here, both sides at once (``designs.fill``), until the
    step's own stop rule (``tiers.confirmed``) would end it."""
    bad, good = sides
    assert prior is not None  # set on entering the confirm step

    def stops(what_if: BayesianStrategy) -> bool:
        return confirmed(what_if, Sides(bad, good), prior.plain, confidence) \
            or disagreement(what_if.summary(), Sides(bad, good)) is not None

    planned = fill.next_lifetimes(strategy, running, free, stops, within=sides)
    counts = Counter(planned)
    names = {bad: "the bad side", good: "the good side"}
    return [Choice(position, n, f"{names.get(position, 'a side')}: expected to be needed")
            for position, n in counts.items()]


def _faithful_stops(what_if: BayesianStrategy) -> bool:
    """The plain search would stop (``phases.stop_reason``'s answer, as a plan sees it)."""
    s = what_if.summary()
    bad, good = s.ends
    return bad is None or good is None or bool(
        s.done and s.bug_shown and s.total[bad] and s.total[good])


def _could_end(strategy: BayesianStrategy, running: Sequence[Item]) -> bool:
    """Whether the lifetimes under way would end the search, each coming back as the posterior
    expects (on the bad side showing the bug at p's estimated rate, not every time:
    ``fill.expected_divergent``): then a slot that comes back waits for them rather than start
    a lifetime the answer does not need, which the end would wait for (bench/slots.py:
    refilled at once, the tiered runs took 0.89x as long as whole batches)."""
    if not running:
        return False
    positions = [item.key[0] for item in running]
    return not fill.plan(strategy, positions, _faithful_stops, most=1)


def end_entry(
    state: Ledger, state_name: EndState, message: str, facts: Mapping[str, Any] | None = None
) -> entries.EndEntry:
    """The ``end`` entry (so `status` reports the outcome and a new `start` is allowed), with
    the summary at that point, what the checks of the model saw (``checks``: the chance that
    the good end shows the bug after all, and that the good side of the flip shows it at a
    rate of its own, with the good-side candidates that showed it) and what the stop rule saw
    (``facts``), as plain values."""
    standing = state.standing()
    summary = {**standing.status(), "checks": standing.checks}
    summary.update(facts or {})
    summary["state"] = str(state_name)
    summary["message"] = message
    slim = {k: v for k, v in summary.items() if k != "posterior"}
    return entries.end(str(state_name), message, summary=slim)


