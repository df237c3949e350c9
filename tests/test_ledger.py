"""The ledger (issue 42, item 2): the search rebuilt from its journal changes only by its
entries, the designs' decisions read it and change nothing, each counting rule is one named
policy, and where the search stands is one frozen value, ``Standing``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_tiers import make_range, tier_header

from bisect_tool.designs import Finish, Item, Record, Work, ledger
from bisect_tool.designs.bisect import BisectDesign
from bisect_tool.designs.phases import decide, suspect
from bisect_tool.journal import JournalContents
from bisect_tool.strategy.tiers import Tier
from bisect_tool.values import Standing, Verdict
from bisect_tool.verdict import MAX_INCONCLUSIVE_STREAK, EndState, Evidence


def _seen(shas: list[str], pos: int, lid: str, verdict: str, **more: Any) -> dict[str, Any]:
    return {"type": "observation", "lifetime_id": lid, "commit": shas[pos], "position": pos,
            "verdict": verdict, "detail": {}, "message": "", "duration_s": 50.0, **more}


def _plain_journal(n: int = 16) -> JournalContents:
    """A plain (lifetimes only) search part-way: both ends ran, a few candidates between."""
    rng = make_range(n)
    shas = [c.sha for c in rng.candidates]
    runs = [(0, "divergent"), (n - 1, "clean"), (n // 2, "clean"), (n // 4, "divergent"),
            (n // 4, "clean"), (n // 2 - 1, "divergent")]
    return JournalContents(tier_header(rng, narrow=""), tuple(
        _seen(shas, pos, f"{shas[pos][-4:]}-{k}", v) for k, (pos, v) in enumerate(runs)))


def _plain_ledger(n: int = 16) -> ledger.Ledger:
    return ledger.replay(_plain_journal(n))


def _fingerprint(state: ledger.Ledger) -> tuple[Any, ...]:
    """What a decision could change: the lifetimes counted, the evidence, where it stands,
    the costs it chooses by (what it would pick next shows them)."""
    s = state.strategy.summary()
    picks = [(c.position, c.lifetimes) for c in state.strategy.select_batch(4)]
    return (frozenset(state.seen_lifetimes), dict(state.lifetimes_by_commit),
            s.total.tolist(), s.divergent.tolist(), sorted(s.untestable), state.standing(),
            state.measured_costs(Tier.FAITHFUL), picks, state.phase,
            dict(state.inconclusive_streak))


MUTATORS = ("record", "mark_untestable", "retire", "mark_prepared", "set_prior", "set_costs")


def _watch(monkeypatch: pytest.MonkeyPatch, state: ledger.Ledger) -> list[str]:
    """The ledger's own strategies' mutators called from now on (a decision's what-if copy
    may change itself: that is not the ledger)."""
    from bisect_tool.strategy import BayesianStrategy

    called: list[str] = []
    mine = [s for s in (state.strategy, state.narrow) if s is not None]
    for name in MUTATORS:
        original = getattr(BayesianStrategy, name)

        def watched(self: Any, *args: Any, _name: str = name, _original: Any = original,
                    **kwargs: Any) -> Any:
            if any(self is s for s in mine):
                called.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(BayesianStrategy, name, watched)
    return called


def test_deciding_changes_nothing_the_ledger_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A design asked what comes next, and to refill slots beside lifetimes under way, leaves
    the ledger as the journal made it: no strategy mutator is called (the run's measured
    costs are set when its observations are applied), the lifetime ids it hands out are
    reserved in the batch, not in the ledger, and asked again it decides the same."""
    state = _plain_ledger()
    before = _fingerprint(state)
    called = _watch(monkeypatch, state)
    design = BisectDesign(state, slots=4)
    first = design.next_step()
    assert isinstance(first, Work) and first.items, first
    decide(state)
    suspect(state)
    running = first.items[:2]
    again = design.refill(running, 2)
    assert _fingerprint(state) == before
    assert design.next_step() == first
    assert called == []
    if again is not None:  # the refill's ids come after those under way, never one of theirs
        assert not {i.lifetime_id for i in again.items} & {i.lifetime_id for i in running}


def test_lifetime_ids_skip_those_taken_without_reserving_them() -> None:
    state = _plain_ledger()
    sha = state.candidates[3].sha
    first = state.next_lifetime_ids(sha, 2)
    assert state.next_lifetime_ids(sha, 2, taken=first) == state.next_lifetime_ids(sha, 4)[2:]
    assert state.next_lifetime_ids(sha, 2) == first  # nothing was reserved in the ledger


def test_a_replayed_journal_stands_where_the_live_one_did() -> None:
    """The ledger is the journal: entries applied one by one to a ledger of the header alone
    (a live run) stand where their replay does."""
    contents = _plain_journal()
    live = ledger.replay(JournalContents(contents.header, ()))
    for entry in contents.entries:
        live.apply(entry)
    assert live.standing() == ledger.replay(contents).standing()


def test_a_retried_lifetime_counts_once() -> None:
    contents = _plain_journal()
    state = ledger.replay(contents)
    before = state.standing()
    state.apply(contents.entries[2])
    assert state.standing() == before


def test_standing_is_frozen_and_its_status_uses_the_documented_names() -> None:
    standing = _plain_ledger().standing()
    with pytest.raises(dataclasses.FrozenInstanceError):
        standing.confidence = 1.0  # type: ignore[misc]
    status = standing.status()
    assert set(status) == {
        "tiers", "state", "direction", "flip_commit", "flip_block", "confidence",
        "credible_set", "evaluations", "candidates_tested", "candidates", "p_estimate",
        "p_interval", "q_estimate", "q_interval", "posterior", "good_end_doubt",
        "bad_end_doubt", "message", "level", "flip_provenance"}
    assert status["candidates"] == 16 and status["state"] == "running"
    assert status["flip_commit"] == (standing.flip_block[0] if len(standing.flip_block) == 1
                                     else None)
    assert isinstance(standing, Standing) and "clean" in standing.checks


def test_the_end_entry_holds_the_standing_it_ended_on() -> None:
    state = _plain_ledger()
    entry = BisectDesign(state).end_entry(Finish(EndState.BUDGET, "spent"))
    summary = entry["summary"]
    standing = state.standing()
    assert summary["confidence"] == standing.confidence
    assert summary["checks"] == standing.checks
    assert summary["state"] == str(EndState.BUDGET) and summary["message"] == "spent"
    assert "posterior" not in summary  # the report recomputes it from the lifetimes


# -- the policies, one named rule each ----------------------------------------------------------


def test_a_first_boot_death_is_no_evidence_the_second_in_a_row_is() -> None:
    boot = {"stage": "boot"}
    assert ledger.evidence_of(Verdict.UNTESTABLE, boot, 0) is Evidence.NOTHING
    assert ledger.evidence_of(Verdict.UNTESTABLE, boot, 1) is Evidence.CANNOT_RUN
    # a candidate whose artifact is missing cannot run, at once
    assert ledger.evidence_of(Verdict.UNTESTABLE, {"stage": "artifacts"}, 0) \
        is Evidence.CANNOT_RUN
    assert ledger.evidence_of(Verdict.DIVERGENT, {}, 5) is Evidence.BUG


def test_the_ledger_applies_the_boot_policy_per_candidate_in_a_row() -> None:
    rng = make_range(8)
    shas = [c.sha for c in rng.candidates]
    died = {"detail": {"stage": "boot"}}
    entries = [_seen(shas, 3, "a", "untestable", **died), _seen(shas, 3, "b", "clean"),
               _seen(shas, 3, "c", "untestable", **died)]
    state = ledger.replay(JournalContents(tier_header(rng, narrow=""), tuple(entries)))
    assert 3 not in state.strategy.summary().untestable  # a clean lifetime broke the row
    state.apply(_seen(shas, 4, "d", "untestable", **died))
    state.apply(_seen(shas, 4, "e", "untestable", **died))
    assert 4 in state.strategy.summary().untestable


def test_inconclusive_lifetimes_give_up_after_the_streak() -> None:
    assert not ledger.gives_up(MAX_INCONCLUSIVE_STREAK - 1)
    assert ledger.gives_up(MAX_INCONCLUSIVE_STREAK)


def test_only_the_fast_probe_s_gate_refuses_the_faithful_tier() -> None:
    assert ledger.gate_refused(Tier.NARROW, {"gate": "missing op"})
    assert not ledger.gate_refused(Tier.NARROW, {"gate": "ok"})
    assert not ledger.gate_refused(Tier.FAITHFUL, {"gate": "missing op"})
    assert ledger.shared_failure({"stage": "artifacts"})
    assert not ledger.shared_failure({"stage": "boot"})


def test_a_confirm_step_decision_changes_nothing_either(monkeypatch: pytest.MonkeyPatch) -> None:
    from test_tiers_slots import _confirming

    state = _confirming(10, 5, [(4, True), (5, False)])
    before = _fingerprint(state)
    called = _watch(monkeypatch, state)
    step = BisectDesign(state, slots=8).next_step()
    assert not isinstance(step, (Finish, Record)), step
    assert _fingerprint(state) == before
    running = [Item("faithful", state.candidates[4].sha, "x-1", (), (4, Tier.FAITHFUL))]
    BisectDesign(state, slots=8).refill(running, 3)
    assert _fingerprint(state) == before
    assert called == []


# -- reading entries: one frozen value per kind ----------------------------------------------


def test_each_entry_reads_back_as_its_kind_s_value() -> None:
    from bisect_tool.journal import entries
    from bisect_tool.strategy.tiers import Phase
    from bisect_tool.values import Observation

    written = entries.observation(
        Observation("c" * 40, Verdict.DIVERGENT, "c-1", {"stage": "probe"}, "saw it", 12.5),
        3, tier=Tier.NARROW)
    seen = entries.parse({**written, "seq": 7})
    assert seen == entries.Observed("c-1", "c" * 40, 3, Verdict.DIVERGENT, Tier.NARROW,
                                    {"stage": "probe"}, "saw it", 12.5, seq=7)
    older = {k: v for k, v in written.items() if k not in ("tier", "duration_s", "detail")}
    assert entries.parse(older) == entries.Observed(  # a journal from before the tiers
        "c-1", "c" * 40, 3, Verdict.DIVERGENT, Tier.FAITHFUL, {}, "saw it", 0.0)
    assert entries.parse(entries.untestable("d" * 40, 2, "no wheel", stage="artifacts")) \
        == entries.Refused("d" * 40, 2, "no wheel", "artifacts")
    assert entries.parse(entries.gate_passed("e" * 40, 1, duration_s=8.0)) \
        == entries.GateLetThrough("e" * 40, 1, 8.0)
    phase = entries.parse(entries.phase(Phase.CONFIRM, "why", bad_side=4, good_side=5))
    assert isinstance(phase, entries.PhaseChanged)
    assert (phase.phase, phase.bad_side, phase.good_side) == (Phase.CONFIRM, 4, 5)
    controls = entries.parse(entries.controls("f" * 40, False, "no bug", {}, untestable=True))
    assert isinstance(controls, entries.ControlsRan)
    assert (controls.ok, controls.problem, controls.untestable) == (False, "no bug", True)
    assert entries.parse(entries.end("done", "held")) == entries.Ended(
        "done", "held", {"type": "end", "state": "done", "message": "held"})
    assert entries.parse({"type": "environment", "gpu": "H100"}) == entries.Other(
        "environment", {"type": "environment", "gpu": "H100"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen.position = 4  # type: ignore[misc]


def test_the_journal_s_lifetimes_read_once_each_as_values() -> None:
    contents = _plain_journal()
    retried = JournalContents(contents.header, (*contents.entries, contents.entries[0]))
    assert [o.lifetime_id for o in retried.observed] == \
        [e["lifetime_id"] for e in contents.entries]
    assert all(o.tier is Tier.FAITHFUL for o in retried.observed)
