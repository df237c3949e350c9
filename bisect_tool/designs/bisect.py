"""The bisect design: the search over a range, as the journal has it so far. Pure.

``BisectDesign`` wraps the search state rebuilt from the journal (``session.State``) and
decides, from it alone, what the run does next: a tier's lifetimes (the fast probe's runs while
it narrows, lifetimes on the two sides of its flip while they confirm it, lifetimes over the
whole range otherwise), a phase entry when the tiered search moves on, the controls before any
evidence counts, or the end with its reason. The engine (``bisect_tool.engine``) carries that
out; ``designs.drive`` does the same for ``bisect simulate``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bisect_tool import entries, lookahead
from bisect_tool.designs import Finish, Item, Record, Step, Work, controls_item
from bisect_tool.ends import SUSPECT_LIFETIMES_FACTOR, good_end_not_good
from bisect_tool.events import CandidateChosen, Event, PosteriorMoved
from bisect_tool.range import Candidate
from bisect_tool.recipe import SearchSettings
from bisect_tool.session import State, narrow_kind, observation_entry
from bisect_tool.strategy import Choice, NoCandidateLeft, Summary
from bisect_tool.tiers import NARROW_END_RUNS, Phase, Tier, confirm_sides, disagreement
from bisect_tool.values import Direction, Observation, Verdict, short
from bisect_tool.verdict import EndState, controls_problem

#: the evaluators a bisect's items name: the recipe's own probe, and the fast one that narrows
FAITHFUL = str(Tier.FAITHFUL)
NARROW = str(Tier.NARROW)


@dataclass(frozen=True)
class _Lifetimes:
    """Next: lifetimes of ``tier``, chosen ``within`` two candidates or over the range."""

    tier: Tier
    within: tuple[int, int] | None = None
    at: int | None = None  # this one candidate, for the reason ``why``
    why: str = ""


_Decision = _Lifetimes | Finish | Record


def _switch(to: Phase, message: str, **sides: Any) -> Record:
    """A phase entry: the tiered search moves on to ``to`` (``message`` says why)."""
    return Record(entries.phase(to, message, **sides), message)


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
        if not isinstance(decision, _Lifetimes):
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
            if self.slots == 1:
                return Work((controls,))
            # with slots to spare the first lifetimes boot beside the controls (they count once
            # the controls held; a run whose controls fail ends there, with them journaled)
            first = self._lifetimes(decision, self.slots - 1)
            if not isinstance(first, Work):
                return Work((controls,))
            return Work((controls, *first.items), first.prepare, first.events)
        return self._lifetimes(decision)

    def _narrow_beside_controls(self, decision: _Lifetimes) -> Step:
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

    def observation_entry(self, item: Item, obs: Observation) -> Mapping[str, Any]:
        position, tier = item.key
        return observation_entry(obs, position, tier)

    def end_entry(self, finish: Finish) -> Mapping[str, Any]:
        return end_entry(self.state, finish.state, finish.message)

    def progress(self, item: Item) -> Event | None:
        s = self.state.strategy_for(item.key[1]).summary()
        return PosteriorMoved(
            len(self.state.seen_lifetimes),
            s.candidates_left,
            self.state.candidates[s.block[0]].sha,
            s.confidence,
        )

    # -- lifetimes --------------------------------------------------------------------------

    def _lifetimes(self, decision: _Lifetimes, slots: int | None = None) -> Step:
        state, tier = self.state, decision.tier
        slots = self.slots if slots is None else slots
        strategy = state.strategy_for(tier)
        # the run's own costs, as measured so far (the recipe's until then)
        strategy.set_costs(state.measured_costs(tier))
        suspect = self._suspect_good_end(decision)
        try:
            if decision.at is not None:
                batch = [Choice(decision.at, 1, decision.why)]
            elif suspect is not None:
                batch = [Choice(suspect, slots, "the good end showed the bug: a false alarm, "
                                "or not a good end?")]
            else:
                batch = strategy.select_batch(slots, decision.within)
        except NoCandidateLeft as exc:
            if tier is Tier.NARROW or decision.within is not None:
                return _switch(Phase.FAITHFUL, f"the tiered search cannot go on ({exc}); going "
                                               "on with lifetimes over the whole range")
            summary = strategy.summary()
            _, good = summary.ends
            if good is not None and summary.divergent[good]:
                # nothing left to run, and the good end showed the bug: that, not an untestable
                # range, is why no flip holds the confidence
                return Finish(EndState.ENDS_CONTRADICT, ends_contradict_message(
                    state, "good", summary, good_end_not_good(summary)))
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

    def _suspect_good_end(self, decision: _Lifetimes) -> int | None:
        """The good end, while the chance that it is not a good end (it showed the bug) keeps the
        answer below the asked confidence: more of its own lifetimes tell a false alarm from a
        good end that is not good; after as many as the bad end gets, the doubt stays shown."""
        s = self.state.strategy.summary()
        if decision.tier is not Tier.FAITHFUL or decision.within is not None or s.deterministic:
            return None
        _, good = s.ends
        if good is None or s.total[good] >= _suspect_lifetimes(self.state.settings):
            return None
        not_good = good_end_not_good(s)
        return good if not_good > 1 - s.threshold else None

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


# -- what comes next, by phase ------------------------------------------------------------------


def decide(state: State) -> _Decision:
    """What the run does next: the one place that decides between the tiers' phases."""
    if state.phase is Phase.NARROW:
        return _narrow_step(state)
    if state.phase is Phase.CONFIRM:
        return _confirm_step(state)
    reason = stop_reason(state)
    return _Lifetimes(Tier.FAITHFUL) if reason is None else Finish(*reason)


def _narrow_step(state: State) -> _Decision:
    narrow = state.strategy_for(Tier.NARROW).summary()
    settings = dataclasses.replace(
        state.settings, max_end_lifetimes=min(state.settings.max_end_lifetimes, NARROW_END_RUNS)
    )
    runs = state.runs[Tier.NARROW]
    kind = narrow_kind(state.header) or "fast"
    # the ends first: a good end that shows the bug is a wrong --good (or ends given the wrong
    # way round), not a flaky probe
    shown = _fast_probe_good_end(state, narrow, kind)
    if shown is not None:
        return shown
    contradiction = narrow.contradiction if narrow.deterministic else None
    if contradiction is not None:
        # The op check runs fixed inputs: a clean run on the bad side of a divergent one is the
        # probe failing its premise (a flaky check, say), and a posterior that explains it with
        # false alarms would only send it on to run every candidate. Hand over at once.
        clean, divergent = (state.candidates[i] for i in contradiction)
        return _switch(Phase.FAITHFUL, (
            f"the {kind} probe contradicted itself (the bug at {divergent.label}, none at "
            f"{clean.label} nearer the bad end): it does not behave deterministically for this "
            "bug here; going on with lifetimes over the whole range, every observation kept"))
    bad_end, good_end = narrow.ends
    t = narrow.total
    if bad_end is not None and good_end is not None and t[bad_end] and not t[good_end] \
            and not narrow.divergent.any():
        # A quiet bad end may be ends given the wrong way round (0.22.0 as good, 0.28.0 as
        # bad): one run at the good end tells that in seconds, before any server boots.
        return _Lifetimes(Tier.NARROW, at=good_end, why=(
            "the bad end did not show the bug: check the good end (are the ends the wrong way "
            "round?)"))
    reason = _stop_reason(state, narrow, settings, runs, "runs of the fast probe", False)
    if reason is None and not narrow.total.any() and len(narrow.untestable) >= 2:
        # Two candidates in a row the fast probe could not run, and none it could: it cannot
        # run here (no PyTorch for the op check, say), not a property of those candidates.
        reason = (EndState.NO_CANDIDATE,
                  f"it ran on none of {len(narrow.untestable)} candidates; `bisect log` "
                  "has its messages")
    if reason is None:
        return _Lifetimes(Tier.NARROW)
    end, message = reason
    if end is EndState.DONE:
        sides = confirm_sides(narrow, state.strategy.summary())
        mass = narrow.confidence
        flip = state.candidates[narrow.block[0]]
        if sides is not None:
            bad, good = (state.candidates[sides.bad], state.candidates[sides.good])
            return _switch(
                Phase.CONFIRM,
                f"the {kind} probe put the flip at {flip.label} ({mass:.1%}) in "
                f"{state.runs[Tier.NARROW]} runs; confirming with lifetimes on both sides: "
                f"{bad.label} (bug expected) and {good.label} (none expected)",
                bad_side=sides.bad, good_side=sides.good, narrow_flip=flip.sha,
                narrow_confidence=mass,
            )
        message = "no candidate beside its flip can run with the faithful probe"
    return _switch(Phase.FAITHFUL, f"the {kind} probe could not narrow the range ({message}); "
                                   "going on with lifetimes over the whole range")


def _fast_probe_good_end(state: State, narrow: Summary, kind: str) -> Finish | None:
    """The fast probe checks both ends first: a good end it shows the bug at cannot be the good
    end, and the run stops in seconds, before any lifetime boots, saying what each end showed
    (given the wrong way round, 0.22.0 as good and 0.28.0 as bad, the controls once booted
    0.22.0's extension in 0.26.0's Python for nothing)."""
    bad, good = narrow.ends
    d, t = narrow.divergent, narrow.total
    if good is None or not t[good] or not d[good]:
        return None
    g = state.candidates[good]
    said = f"the {kind} probe shows the bug at the good end {g.label} ({d[good]} of {t[good]})"
    if bad is not None and t[bad]:
        b = state.candidates[bad]
        if d[bad]:
            return Finish(EndState.ENDS_CONTRADICT, (
                f"{said} and at the bad end {b.label} ({d[bad]} of {t[bad]}): it does not tell "
                "the ends apart; give another --good, or search with lifetimes alone "
                "(--no-narrow)"))
        return Finish(EndState.ENDS_CONTRADICT, (
            f"{said}, not at the bad end {b.label} (0 of {t[bad]}): the ends look the wrong "
            f"way round; try --good {b.tags[0] if b.tags else b.sha} "
            f"--bad {g.tags[0] if g.tags else g.sha}, or search with lifetimes alone "
            "(--no-narrow)"))
    return Finish(EndState.ENDS_CONTRADICT, (
        f"{said}: it cannot be the good end; give another --good, or search with lifetimes "
        "alone (--no-narrow)"))


def _confirm_step(state: State) -> _Decision:
    s, sides = state.strategy.summary(), state.sides
    assert sides is not None
    budget = state.settings.max_evaluations
    if sides.bad in s.untestable or sides.good in s.untestable:
        moved = confirm_sides(state.strategy_for(Tier.NARROW).summary(), s)
        if moved is not None and moved != sides:
            bad, good = state.candidates[moved.bad], state.candidates[moved.good]
            return _switch(
                Phase.CONFIRM,
                f"a side of the flip cannot run with the faithful probe; confirming at "
                f"{bad.label} and {good.label} instead",
                bad_side=moved.bad, good_side=moved.good,
            )
        return _switch(Phase.FAITHFUL, "no candidate beside the fast probe's flip can run with "
                                       "the faithful probe; going on with lifetimes over the "
                                       "whole range")
    # Both sides must have spoken: the prior alone (the fast probe's flip) is never the answer.
    if s.divergent[sides.bad] and s.total[sides.good] and s.done:
        return Finish(EndState.DONE, "the flip holds the asked confidence")
    which = disagreement(s, sides)
    d_bad, t_bad = int(s.divergent[sides.bad]), int(s.total[sides.bad])
    if which is None and not d_bad and t_bad >= state.settings.max_end_lifetimes:
        # With no divergence seen anywhere, clean lifetimes cannot rule out a rare bug: after as
        # many as the bad end gets, the confirm step stops waiting for one.
        which = "bad"
    if which is not None:
        pos = sides.bad if which == "bad" else sides.good
        d, t = int(s.divergent[pos]), int(s.total[pos])
        saw = (f"did not show the bug at {state.candidates[pos].label}, where the fast probe "
               f"did ({d} of {t} lifetimes divergent)" if which == "bad" else
               f"showed the bug at {state.candidates[pos].label}, where the fast probe did not "
               f"({d} of {t} lifetimes divergent)")
        return _switch(Phase.FAITHFUL, (
            f"the faithful probe {saw}: the fast probe is not a stand-in for this bug here; "
            "going on with lifetimes over the whole range, every observation kept"))
    if state.runs[Tier.FAITHFUL] >= budget:
        return Finish(EndState.BUDGET, f"budget of {budget} lifetimes exhausted")
    return _Lifetimes(Tier.FAITHFUL, sides.as_tuple())


def stop_reason(state: State) -> tuple[EndState, str] | None:
    """Why the (faithful) search should stop now, if it should."""
    return _stop_reason(
        state, state.strategy.summary(), state.settings, state.runs[Tier.FAITHFUL], "lifetimes",
        True,
    )


def _stop_reason(
    state: State,
    s: Summary,
    settings: SearchSettings,
    spent: int,
    unit: str,
    faithful: bool,
) -> tuple[EndState, str] | None:
    bad, good = s.ends
    for end, name in ((bad, "bad"), (good, "good")):
        if end is None:
            nominal = s.bad_end if name == "bad" else s.good_end
            why = state.untestable_why.get(nominal, "")
            return EndState.END_UNTESTABLE, (
                f"the {name} end {state.candidates[nominal].label} is untestable"
                + (f" ({why})" if why else "")
                + f" and so is every candidate next to it; pick another --{name}"
            )
    assert bad is not None and good is not None
    if faithful and s.deterministic:
        return _deterministic_stop(state, s)
    stand_in = "" if bad == s.bad_end else (
        f" (standing in for the untestable bad end {state.candidates[s.bad_end].label})")
    if (s.divergent[bad] == 0 and s.total[bad] >= settings.max_end_lifetimes
            and not s.divergent.any()):
        return EndState.BAD_END_NEVER, (
            f"the bad end {state.candidates[bad].label}{stand_in} never showed the bug in "
            f"{s.total[bad]} {unit}: nothing to bisect (check the recipe, or raise "
            "max_end_lifetimes)"
        )
    contradicted = s.contradicted_end if s.total[bad] and s.total[good] else None
    if contradicted is not None:
        return EndState.ENDS_CONTRADICT, ends_contradict_message(state, contradicted, s)
    not_good = good_end_not_good(s) if faithful else 0.0
    tested = s.total[good] >= _suspect_lifetimes(settings)
    if not_good >= s.threshold or (tested and not_good > 1 - s.threshold):
        # it is not a good end, or after all the lifetimes it gets it cannot be told from one
        # at the asked confidence: either way no flip can be named
        return EndState.ENDS_CONTRADICT, ends_contradict_message(state, "good", s, not_good)
    done = s.done and s.confidence * (1 - not_good) >= s.threshold
    if s.total[bad] and s.total[good] and done and s.bug_shown:
        return EndState.DONE, "the flip holds the asked confidence" + _would_have_saved(s)
    if spent >= settings.max_evaluations:
        return EndState.BUDGET, f"budget of {settings.max_evaluations} {unit} exhausted"
    return None


def _would_have_saved(s: Summary) -> str:
    """For an answer whose probe never contradicted itself: what ``--deterministic`` would
    have cost (git bisect's bound), when that is less than what the search spent."""
    bound = math.ceil(math.log2(max(s.size, 2))) + 2
    if s.contradiction is not None or s.evaluations <= bound:
        return ""
    return (f"; the probe never contradicted itself in {s.evaluations} runs: if it always "
            f"gives a candidate the same answer, --deterministic needs at most {bound}")


#: what a deterministic run that contradicts itself suggests
DROP_DETERMINISTIC = ("; if the probe shows the bug only in some runs, drop --deterministic "
                      "([probe] deterministic): the search then repeats runs until the answer "
                      "holds its confidence")


def _deterministic_stop(state: State, s: Summary) -> tuple[EndState, str] | None:
    """git bisect's contract (``--deterministic``): a candidate's one run is its answer. The
    run stops at once when the runs contradict themselves (an end that answers as the other
    one, a candidate both ways, a clean run nearer the bad end than a divergent one), and with
    the answer as soon as the candidates on both sides of the flip ran: at most ceil(log2 N)
    + 2 runs, never a second run of a candidate."""
    bad, good = s.ends
    assert bad is not None and good is not None
    label = state.candidates
    if s.total[bad] and not s.divergent[bad]:
        return EndState.BAD_END_NEVER, (
            f"the bad end {label[bad].label} did not show the bug in its run "
            f"(--deterministic): check the probe reproduces it there" + DROP_DETERMINISTIC)
    if s.total[good] and s.divergent[good]:
        older = "older" if state.direction is Direction.REGRESSION else "newer"
        return EndState.ENDS_CONTRADICT, (
            f"the good end {label[good].label} shows the bug (--deterministic): give an "
            f"{older} --good, or check the probe can pass at all" + DROP_DETERMINISTIC)
    if s.contradiction is not None:
        clean, divergent = s.contradiction
        if clean == divergent:
            seen = (f"the probe gave {label[clean].label} both answers ({s.divergent[clean]} of "
                    f"{s.total[clean]} runs showed the bug)")
        else:
            seen = (f"the probe showed the bug at {label[divergent].label} but not at "
                    f"{label[clean].label}, nearer the bad end: no single flip explains both")
        return EndState.PROBE_CONTRADICTED, seen + DROP_DETERMINISTIC
    block = s.block
    bracketed = s.total[block[0] - 1] and s.total[block[-1]]
    if s.total[bad] and s.total[good] and bracketed and s.bug_shown:
        return EndState.DONE, "the candidates on both sides of the flip ran (--deterministic)"
    spent, budget = s.evaluations, state.settings.max_evaluations
    if spent >= budget:
        return EndState.BUDGET, f"budget of {budget} runs exhausted"
    return None


def _suspect_lifetimes(settings: SearchSettings) -> int:
    """How many lifetimes a good end that showed the bug gets before its doubt stands."""
    return SUSPECT_LIFETIMES_FACTOR * settings.max_end_lifetimes


def ends_contradict_message(
    state: State, end: str, summary: Summary | None = None, not_good: float = 0.0
) -> str:
    """One line: which end, what it saw, what to do. ``not_good``: P(the good end shows the bug
    though the flip lies inside the range), when that is why (``bisect_tool.ends``)."""
    s = summary or state.strategy.summary()
    bad, good = s.ends
    pos = (good if end == "good" else bad)
    if pos is None:
        pos = s.good_end if end == "good" else s.bad_end
    sha = state.candidates[pos].label
    d, t = int(s.divergent[pos]), int(s.total[pos])
    beyond, not_bad = s.good_end_doubt, s.bad_end_doubt
    if end == "good":
        older = "older" if state.direction is Direction.REGRESSION else "newer"
        if not_good >= s.threshold:
            why = f"P = {not_good:.3f} that it is not a good end, more than a false alarm explains"
        elif not_good:
            why = (f"P = {not_good:.3f} that it is not a good end: its own lifetimes cannot tell "
                   "a false alarm from a good end that is not good")
        else:
            why = f"P = {beyond:.3f} that the flip lies beyond it"
        return (
            f"the good end {sha} shows the bug ({d} of {t} lifetimes divergent; {why}): give an "
            f"{older} --good, or check that the probe can pass at all (a missing file or a "
            "broken command fails everywhere)"
        )
    return (
        f"the bad end {sha} does not show the bug ({d} of {t} lifetimes divergent; P = "
        f"{not_bad:.3f} that nothing in the range does): check the recipe reproduces it, or "
        "give another --bad"
    )


def end_entry(state: State, state_name: EndState, message: str) -> entries.EndEntry:
    """The ``end`` entry (so `status` reports the outcome and a new `start` is allowed), with
    the summary at that point."""
    summary = state.summary()
    summary["state"] = str(state_name)
    summary["message"] = message
    slim = {k: v for k, v in summary.items() if k != "posterior"}
    return entries.end(str(state_name), message, summary=slim)


# -- manual mode: `bisect good|bad|skip` ------------------------------------------------------


def manual_entry(
    state: State, commit: str, verdict: Verdict, message: str = "manual"
) -> entries.ObservationEntry:
    """The observation entry of one verdict given by hand."""
    position = next((i for i, c in enumerate(state.candidates) if c.sha == commit), None)
    if position is None:
        from bisect_tool.errors import UsageError

        raise UsageError(f"{short(commit)} is not a candidate of this bisect; see `bisect log`")
    obs = Observation(
        commit, verdict, state.next_lifetime_ids(commit)[0], {"manual": True}, message
    )
    return observation_entry(obs, position)


def next_manual_candidate(state: State) -> Candidate | None:
    reason = stop_reason(state)
    # a quiet bad end is asked again (a bug that shows only sometimes), unless the probe is
    # deterministic: then its one clean answer ends the run
    again = reason is not None and reason[0] is EndState.BAD_END_NEVER \
        and not state.strategy.summary().deterministic
    if reason is not None and not again:
        return None
    try:
        return state.candidates[state.strategy.select().position]
    except NoCandidateLeft:
        return None
