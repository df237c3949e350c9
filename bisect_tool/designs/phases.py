"""What the bisect does next, by phase, and why it stops. Pure.

The tiered search's phases (``bisect_tool.strategy.tiers.Phase``): while the fast probe narrows,
its next
runs or the hand-over (``_narrow_step``); while lifetimes confirm its flip, their next ones on
the two sides or the fall-back (``_confirm_step``); otherwise the plain search's next lifetimes.
``stop`` is the one set of rules that ends a search: an end that contradicts its role,
an untestable end, the flip holding the asked confidence, a spent budget. ``BisectDesign``
(``bisect_tool.designs.bisect``) turns these decisions into steps for the engine; manual mode
(``bisect_tool.designs.manual``) asks the same rules.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from bisect_tool.designs import Finish, Record
from bisect_tool.designs.ledger import Ledger, narrow_kind
from bisect_tool.designs.mergebase import merge_base_message
from bisect_tool.journal import entries
from bisect_tool.recipes.recipe import SearchSettings
from bisect_tool.strategy import Summary
from bisect_tool.strategy.ends import (
    SUSPECT_LIFETIMES_FACTOR,
    GoodSideCheck,
    clean_not_earned,
    doubts,
    good_end_not_good,
)
from bisect_tool.strategy.tiers import (
    NARROW_END_RUNS,
    Phase,
    Tier,
    confirm_sides,
    confirmed,
    disagreement,
)
from bisect_tool.values import Direction, percent
from bisect_tool.verdict import EndState


@dataclass(frozen=True)
class Lifetimes:
    """Next: lifetimes of ``tier``, chosen ``within`` two candidates or over the range."""

    tier: Tier
    within: tuple[int, int] | None = None
    at: int | None = None  # this one candidate, for the reason ``why``
    why: str = ""


Decision = Lifetimes | Finish | Record


def switch(to: Phase, message: str, **sides: Any) -> Record:
    """A phase entry: the tiered search moves on to ``to`` (``message`` says why)."""
    return Record(entries.phase(to, message, **sides), message)


# -- what comes next, by phase ------------------------------------------------------------------


def decide(state: Ledger) -> Decision:
    """What the run does next: the one place that decides between the tiers' phases."""
    if state.phase is Phase.NARROW:
        return _narrow_step(state)
    if state.phase is Phase.CONFIRM:
        return _confirm_step(state)
    finish = stop(state)
    return Lifetimes(Tier.FAITHFUL) if finish is None else finish


def _narrow_step(state: Ledger) -> Decision:
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
        return switch(Phase.FAITHFUL, (
            f"the {kind} probe contradicted itself (the bug at {divergent.label}, none at "
            f"{clean.label} nearer the bad end): it does not behave deterministically for this "
            "bug here; going on with lifetimes over the whole range, every observation kept"))
    bad_end, good_end = narrow.ends
    t = narrow.total
    if bad_end is not None and good_end is not None and t[bad_end] and not t[good_end] \
            and not narrow.divergent.any():
        # A quiet bad end may be ends given the wrong way round (0.22.0 as good, 0.28.0 as
        # bad): one run at the good end tells that in seconds, before any server boots.
        return Lifetimes(Tier.NARROW, at=good_end, why=(
            "the bad end did not show the bug: check the good end (are the ends the wrong way "
            "round?)"))
    reason = _stop(state, narrow, settings, runs, "runs of the fast probe", False)
    if reason is None and not narrow.total.any() and len(narrow.untestable) >= 2:
        # Two candidates in a row the fast probe could not run, and none it could: it cannot
        # run here (no PyTorch for the op check, say), not a property of those candidates.
        reason = Finish(EndState.NO_CANDIDATE,
                        f"it ran on none of {len(narrow.untestable)} candidates; `bisect log` "
                        "has its messages")
    if reason is None:
        return Lifetimes(Tier.NARROW)
    end, message = reason.state, reason.message
    if end is EndState.DONE:
        sides = confirm_sides(narrow, state.strategy.summary())
        mass = narrow.confidence
        flip = state.candidates[narrow.block[0]]
        if sides is not None:
            bad, good = (state.candidates[sides.bad], state.candidates[sides.good])
            return switch(
                Phase.CONFIRM,
                f"the {kind} probe put the flip at {flip.label} ({percent(mass)}) in "
                f"{state.runs[Tier.NARROW]} runs; confirming with lifetimes on both sides: "
                f"{bad.label} (bug expected) and {good.label} (none expected)",
                bad_side=sides.bad, good_side=sides.good, narrow_flip=flip.sha,
                narrow_confidence=mass,
            )
        message = "no candidate beside its flip can run with the faithful probe"
    return switch(Phase.FAITHFUL, f"the {kind} probe could not narrow the range ({message}); "
                                   "going on with lifetimes over the whole range")


def _fast_probe_good_end(state: Ledger, narrow: Summary, kind: str) -> Finish | None:
    """The fast probe checks both ends first: a good end it shows the bug at cannot be the good
    end, and the run stops in seconds, before any lifetime boots, saying what each end showed
    (given the wrong way round, 0.22.0 as good and 0.28.0 as bad, the controls once booted
    0.22.0's extension in 0.26.0's Python for nothing)."""
    bad, good = narrow.ends
    d, t = narrow.divergent, narrow.total
    if good is None or not t[good] or not d[good]:
        return None
    g = state.candidates[good]
    if g.stands_for:
        return Finish(EndState.ENDS_CONTRADICT, merge_base_message(
            state.header, g, state.direction, f"{d[good]} of {t[good]} runs of the {kind} probe"))
    said = f"the {kind} probe shows the bug at the good end {g.label} ({d[good]} of {t[good]})"
    if bad is not None and t[bad]:
        b = state.candidates[bad]
        if d[bad]:
            return Finish(EndState.ENDS_CONTRADICT, (
                f"{said} and at the bad end {b.label} ({d[bad]} of {t[bad]}): it does not tell "
                "the ends apart; give another --good, or search with lifetimes alone "
                "(--no-narrow)"), {"contradicted": "good"})
        return Finish(EndState.ENDS_CONTRADICT, (
            f"{said}, not at the bad end {b.label} (0 of {t[bad]}): the ends look the wrong "
            f"way round; try --good {b.tags[0] if b.tags else b.sha} "
            f"--bad {g.tags[0] if g.tags else g.sha}, or search with lifetimes alone "
            "(--no-narrow)"), {"contradicted": "good"})
    return Finish(EndState.ENDS_CONTRADICT, (
        f"{said}: it cannot be the good end; give another --good, or search with lifetimes "
        "alone (--no-narrow)"), {"contradicted": "good"})


def _confirm_step(state: Ledger) -> Decision:
    s, sides = state.strategy.summary(), state.sides
    assert sides is not None
    budget = state.settings.max_evaluations
    if sides.bad in s.untestable or sides.good in s.untestable:
        moved = confirm_sides(state.strategy_for(Tier.NARROW).summary(), s)
        if moved is not None and moved != sides:
            bad, good = state.candidates[moved.bad], state.candidates[moved.good]
            return switch(
                Phase.CONFIRM,
                f"a side of the flip cannot run with the faithful probe; confirming at "
                f"{bad.label} and {good.label} instead",
                bad_side=moved.bad, good_side=moved.good,
            )
        return switch(Phase.FAITHFUL, "no candidate beside the fast probe's flip can run with "
                                       "the faithful probe; going on with lifetimes over the "
                                       "whole range")
    assert state.prior is not None  # set on entering the confirm step
    if confirmed(state.strategy, sides, state.prior.plain, state.settings.confidence):
        return Finish(EndState.DONE, "the flip holds the asked confidence, on the lifetimes' "
                                     "own evidence too")
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
        return switch(Phase.FAITHFUL, (
            f"the faithful probe {saw}: the fast probe is not a stand-in for this bug here; "
            "going on with lifetimes over the whole range, every observation kept"))
    if state.runs[Tier.FAITHFUL] >= budget:
        return Finish(EndState.BUDGET, f"budget of {budget} lifetimes exhausted")
    return Lifetimes(Tier.FAITHFUL, sides.as_tuple())


def stop(state: Ledger) -> Finish | None:
    """Why the (faithful) search should stop now, if it should: the end state, its message,
    and what the rule saw (``Finish.extra``, kept in the journal's end entry)."""
    return _stop(
        state, state.strategy.summary(), state.settings, state.runs[Tier.FAITHFUL], "lifetimes",
        True,
    )


def stop_reason(state: Ledger) -> tuple[EndState, str] | None:
    """``stop`` as (end state, message), for manual mode's callers."""
    finish = stop(state)
    return None if finish is None else (finish.state, finish.message)


def _stop(
    state: Ledger,
    s: Summary,
    settings: SearchSettings,
    spent: int,
    unit: str,
    faithful: bool,
) -> Finish | None:
    bad, good = s.ends
    for end, name in ((bad, "bad"), (good, "good")):
        if end is None:
            nominal = s.bad_end if name == "bad" else s.good_end
            why = state.untestable_why.get(nominal, "")
            return Finish(EndState.END_UNTESTABLE, (
                f"the {name} end {state.candidates[nominal].label} is untestable"
                + (f" ({why})" if why else "")
                + f" and so is every candidate next to it; pick another --{name}"
            ))
    assert bad is not None and good is not None
    if faithful and s.deterministic:
        return _deterministic_stop(state, s)
    stand_in = "" if bad == s.bad_end else (
        f" (standing in for the untestable bad end {state.candidates[s.bad_end].label})")
    if (s.divergent[bad] == 0 and s.total[bad] >= settings.max_end_lifetimes
            and not s.divergent.any()):
        if state.candidates[bad].stands_for:
            return Finish(EndState.BAD_END_NEVER, merge_base_message(
                state.header, state.candidates[bad], state.direction,
                f"0 of {s.total[bad]} {unit} divergent"), {"contradicted": "bad"})
        return Finish(EndState.BAD_END_NEVER, (
            f"the bad end {state.candidates[bad].label}{stand_in} never showed the bug in "
            f"{s.total[bad]} {unit}: nothing to bisect (check the recipe, or raise "
            "max_end_lifetimes)"
        ))
    contradicted = s.contradicted_end if s.total[bad] and s.total[good] else None
    if contradicted is not None:
        return ends_contradict(state, contradicted, s)
    if not faithful:
        return _answer_or_budget(s, 0.0, settings, spent, unit)
    seen = doubts(s)
    not_good = seen.not_good
    limit = suspect_lifetimes(settings)
    if not_good >= s.threshold or (s.total[good] >= limit and not_good > 1 - s.threshold):
        # it is not a good end, or after all the lifetimes it gets it cannot be told from one
        # at the asked confidence: either way no flip can be named
        return ends_contradict(state, "good", s, not_good)
    check = seen.good_side
    told = s.total[check.nearest] >= limit
    if s.done and (check.doubt >= s.threshold or (told and check.doubt > 1 - s.threshold)):
        # the flip holds under the model, but the commits before it show the bug more than
        # false alarms explain, or after all the lifetimes they get cannot be told from ones
        # that do: the bug may start earlier, at a lower rate (issue 38)
        return good_side_shows_bug(state, s, check)
    earned = not clean_not_earned(s)
    return _answer_or_budget(s, seen.total, settings, spent, unit, earned)


def _answer_or_budget(
    s: Summary, doubt: float, settings: SearchSettings, spent: int, unit: str,
    earned: bool = True,
) -> Finish | None:
    """The answer, once the flip holds the asked confidence with ``doubt`` (what the ends'
    and the good side's checks leave open) taken off; or the budget's end."""
    bad, good = s.ends
    assert bad is not None and good is not None
    done = s.done and s.confidence * (1 - doubt) >= s.threshold and earned
    if s.total[bad] and s.total[good] and done and s.bug_shown:
        return Finish(EndState.DONE,
                      "the flip holds the asked confidence" + _would_have_saved(s))
    if spent >= settings.max_evaluations:
        return Finish(EndState.BUDGET, f"budget of {settings.max_evaluations} {unit} exhausted")
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


def _deterministic_stop(state: Ledger, s: Summary) -> Finish | None:
    """git bisect's contract (``--deterministic``): a candidate's one run is its answer. The
    run stops at once when the runs contradict themselves (an end that answers as the other
    one, a candidate both ways, a clean run nearer the bad end than a divergent one), and with
    the answer as soon as the candidates on both sides of the flip ran: at most ceil(log2 N)
    + 2 runs, never a second run of a candidate."""
    bad, good = s.ends
    assert bad is not None and good is not None
    label = state.candidates
    if s.total[bad] and not s.divergent[bad]:
        if label[bad].stands_for:
            return Finish(EndState.BAD_END_NEVER, merge_base_message(
                state.header, label[bad], state.direction, "its one run clean, --deterministic"),
                {"contradicted": "bad"})
        return Finish(EndState.BAD_END_NEVER, (
            f"the bad end {label[bad].label} did not show the bug in its run "
            f"(--deterministic): check the probe reproduces it there" + DROP_DETERMINISTIC))
    if s.total[good] and s.divergent[good]:
        if label[good].stands_for:
            return Finish(EndState.ENDS_CONTRADICT, merge_base_message(
                state.header, label[good], state.direction,
                "its one run divergent, --deterministic"), {"contradicted": "good"})
        older = "older" if state.direction is Direction.REGRESSION else "newer"
        return Finish(EndState.ENDS_CONTRADICT, (
            f"the good end {label[good].label} shows the bug (--deterministic): give an "
            f"{older} --good, or check the probe can pass at all" + DROP_DETERMINISTIC),
            {"contradicted": "good"})
    if s.contradiction is not None:
        clean, divergent = s.contradiction
        if clean == divergent:
            seen = (f"the probe gave {label[clean].label} both answers ({s.divergent[clean]} of "
                    f"{s.total[clean]} runs showed the bug)")
        else:
            seen = (f"the probe showed the bug at {label[divergent].label} but not at "
                    f"{label[clean].label}, nearer the bad end: no single flip explains both")
        return Finish(EndState.PROBE_CONTRADICTED, seen + DROP_DETERMINISTIC)
    block = s.block
    bracketed = s.total[block[0] - 1] and s.total[block[-1]]
    if s.total[bad] and s.total[good] and bracketed and s.bug_shown:
        return Finish(EndState.DONE,
                      "the candidates on both sides of the flip ran (--deterministic)")
    spent, budget = s.evaluations, state.settings.max_evaluations
    if spent >= budget:
        return Finish(EndState.BUDGET, f"budget of {budget} runs exhausted")
    return None


def suspect(state: Ledger) -> tuple[int, str] | None:
    """The candidate whose own lifetimes must clear what the model does not weigh
    (``bisect_tool.strategy.ends``), and why, for the plain search and manual mode alike: the good
    end
    once it showed the bug (a false alarm, or not a good end?), at once; once the flip holds
    under the model, the good end and the good-side candidate next to the flip until each ran
    clean often enough to rule out a bug at the run's ``clean_against_rate`` or more; then
    whichever check still keeps the answer below the asked confidence. Each gets at most
    ``suspect_lifetimes``; the stop rules say the rest. None: the search's own choice."""
    s = state.strategy.summary()
    _, good = s.ends
    if good is None or s.deterministic:
        return None
    limit = suspect_lifetimes(state.settings)
    not_good = good_end_not_good(s)
    if s.divergent[good] and s.total[good] < limit and not_good > 1 - s.threshold:
        return good, "the good end showed the bug: a false alarm, or not a good end?"
    if not s.done:
        return None
    for position in clean_not_earned(s):
        which = "the good end" if position == good else "the commit next to the flip"
        rate = percent(s.priors.clean_against_rate)
        if s.divergent[position]:  # the flip's neighbour, held to the floor all the same
            return position, (f"{which} showed the bug in {s.divergent[position]} of "
                              f"{s.total[position]} lifetimes: more of them, until a bug there "
                              f"in {rate} of lifetimes or more is ruled out")
        return position, (f"{which} must keep running clean: a bug there in {rate} of "
                          "lifetimes or more would have shown")
    seen = doubts(s)
    check = seen.good_side
    if seen.held(s.confidence) >= s.threshold:
        return None
    if not_good >= check.doubt and s.total[good] < limit:
        return good, f"P = {not_good:.4f} that the good end shows the bug: more of its lifetimes"
    if s.total[check.nearest] < limit:
        return check.nearest, (f"P = {check.doubt:.4f} that the bug shows before the flip too, "
                               "at a rate of its own: more lifetimes next to it")
    return None


def suspect_lifetimes(settings: SearchSettings) -> int:
    """How many lifetimes a good end that showed the bug gets before its doubt stands."""
    return SUSPECT_LIFETIMES_FACTOR * settings.max_end_lifetimes


def good_side_shows_bug(state: Ledger, s: Summary, check: GoodSideCheck) -> Finish:
    """The stop that says the bug shows before the named flip too (issue 38: 15 % of lifetimes
    from c17, every one from c26, and c26 named at 99.5 %): which commits showed it, and the
    next command, a bisect of the older part. Where the stretch reaches the good end, it is
    the good end that is not good."""
    if check.through_good_end >= 0.5:
        return ends_contradict(state, "good", s, check.doubt)
    label = state.candidates
    flip = label[s.block[0]].label
    seen = ", ".join(f"{label[i].label} in {d} of {t}" for i, d, t in check.diverged[:5])
    more = f" and {len(check.diverged) - 5} more" if len(check.diverged) > 5 else ""
    good = s.ends[1]
    assert good is not None
    older = label[check.diverged[-1][0]] if check.diverged else label[check.nearest]
    ref = older.tags[0] if older.tags else older.label
    good_ref = label[good].tags[0] if label[good].tags else label[good].label
    if state.direction is Direction.REGRESSION:
        story = (f"the bug may start earlier, at a lower rate, and {flip} make it worse; bisect "
                 f"the older part: --good {good_ref} --bad {ref}")
    else:
        story = (f"{flip} may fix it only in part, the bug still showing after it at a lower "
                 f"rate; bisect the newer part: --bad {ref} --good {good_ref}")
    weight = ("more than false alarms explain" if check.doubt >= s.threshold else
              f"and {s.total[check.nearest]} lifetimes next to the flip cannot tell it from false "
              "alarms")
    message = (
        f"the good side of {flip} shows the bug too ({seen or 'no divergence yet'}{more}; P = "
        f"{check.doubt:.3f} that it shows there at a rate of its own, {weight}): {story}, with "
        "the same recipe")
    return Finish(EndState.GOOD_SIDE_SHOWS_BUG, message, {
        "good_side": {"doubt": check.doubt, "through_good_end": check.through_good_end,
                      "nearest": label[check.nearest].sha,
                      "diverged": [[label[i].sha, d, t] for i, d, t in check.diverged]},
        "next_range": {"good": label[good].sha, "bad": older.sha},
    })


def ends_contradict(
    state: Ledger, end: str, summary: Summary | None = None, not_good: float = 0.0
) -> Finish:
    """The stop that says ``end`` ("good" or "bad") is not what it was said to be."""
    return Finish(EndState.ENDS_CONTRADICT,
                  ends_contradict_message(state, end, summary, not_good), {"contradicted": end})


def ends_contradict_message(
    state: Ledger, end: str, summary: Summary | None = None, not_good: float = 0.0
) -> str:
    """One line: which end, what it saw, what to do. ``not_good``: P(the good end shows the bug
    though the flip lies inside the range), when that is why (``bisect_tool.strategy.ends``)."""
    s = summary or state.strategy.summary()
    bad, good = s.ends
    pos = (good if end == "good" else bad)
    if pos is None:
        pos = s.good_end if end == "good" else s.bad_end
    sha = state.candidates[pos].label
    d, t = int(s.divergent[pos]), int(s.total[pos])
    if state.candidates[pos].stands_for:
        return merge_base_message(state.header, state.candidates[pos], state.direction,
                                  f"{d} of {t} lifetimes divergent")
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


