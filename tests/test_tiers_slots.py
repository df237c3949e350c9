"""The tiered search with several slots (tests/test_tiers.py has the rest): the controls beside
the fast probe, the confirm step's slots on both sides of the flip, every release gated at once
and the op check narrowing beside the gates' sweep. Scripted evaluators, the real journal,
phases and loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from test_tiers import Scripted, make_range, run_tiers, tier_header

from bisect_tool.designs import Finish, Record, ledger
from bisect_tool.journal import Journal, read
from bisect_tool.range import CommitRange
from bisect_tool.recipes.recipe import Recipe
from bisect_tool.run.owner import Evaluators, bisect_loop
from bisect_tool.strategy.tiers import Tier
from bisect_tool.values import Observation, Verdict
from bisect_tool.verdict import EndState


class _Controls:
    """Controls that hold until a fast-probe run meets them at ``together`` (so they pass only
    when they run beside the narrowing), and record which commits they ran on."""

    def __init__(self, together: Any, ran: list[str]) -> None:
        self.together, self.ran = together, ran

    def __call__(self, commit: str) -> _Controls:
        self.commit = commit
        return self

    def run(self) -> dict[str, Any]:
        self.ran.append(self.commit)
        if self.together is not None:
            self.together.wait()
        return {"type": "controls", "commit": self.commit, "ok": True, "problem": "",
                "positive": {"verdict": "divergent"}, "negative": {"verdict": "clean"}}


def test_the_controls_run_beside_the_fast_probe_once_it_has_checked_both_ends(
    tmp_path: Path,
) -> None:
    """Issue 31: the controls boot a server (a minute of vLLM) while the op check narrows in
    seconds a run, instead of before the first confirm lifetime. They meet a fast-probe run at
    a barrier, so the run finishes only if they ran side by side; the controls are journaled
    among the narrow runs, before the confirm step, on the good end."""
    import threading

    rng = make_range(60)
    shas = [c.sha for c in rng.candidates]
    flip = 37
    together = threading.Barrier(2, timeout=30)
    met: list[str] = []

    class Narrow(Scripted):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            if len(self.calls) >= 2 and not met:  # a run after both ends were checked
                together.wait()
                met.append(commit)
            return super().evaluate(commit, lifetime_id, tags)

    ran: list[str] = []
    narrow = Narrow(shas, flip, 1.0)
    faithful = Scripted(shas, flip, 0.8, seed=2)
    summary, path = run_tiers(tmp_path, rng, narrow, faithful, 1, _Controls(together, ran))
    assert met and summary["state"] == "done" and summary["flip_commit"] == shas[flip]
    assert ran == [rng.good]
    kinds = [e["type"] for e in read(path).entries]
    assert kinds.index("controls") < kinds.index("phase")


def test_ends_the_wrong_way_round_stop_before_the_controls_boot(tmp_path: Path) -> None:
    """The fast probe shows the bug at the good end and not at the bad one: the run stops in
    seconds, and no controls server was started for nothing."""
    rng = make_range(30)
    shas = [c.sha for c in rng.candidates]
    narrow = Scripted(shas, 0, 1.0)
    narrow.outcomes = {rng.good: True, rng.bad: False}
    ran: list[str] = []
    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        journal.append(tier_header(rng))
        state = ledger.replay(read(path))
        summary = bisect_loop(journal, state, Evaluators(
            Scripted(shas, 0, 1.0), 1, _Controls(None, ran), narrow=narrow), controls=True)
    assert summary["state"] == "ends_contradict"
    assert ran == [] and len(narrow.calls) == 2


def test_the_controls_are_journaled_as_they_end_beside_a_running_lifetime(
    tmp_path: Path,
) -> None:
    """Two slots, the controls in the background: they end while a confirm lifetime still
    runs, and their entry is in the journal then, not once that lifetime has ended too (on
    the H100 it came 36 s after their server was down: docs/bench/gpu-2026-12-07-h100)."""
    import threading
    import time

    rng = make_range(30)
    shas = [c.sha for c in rng.candidates]
    flip = 17
    path = tmp_path / "journal.jsonl"
    confirm_started = threading.Event()
    seen_while_running: list[bool] = []

    def controls_in() -> bool:
        return '"type": "controls"' in path.read_text()

    class Faithful(Scripted):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            # every lifetime under way when the controls end holds on until their entry is in
            if not controls_in():
                confirm_started.set()
                deadline = time.monotonic() + 10
                while not controls_in() and time.monotonic() < deadline:
                    time.sleep(0.02)
                seen_while_running.append(controls_in())
            return super().evaluate(commit, lifetime_id, tags)

    class Controls(_Controls):
        def run(self) -> dict[str, Any]:
            assert confirm_started.wait(20)  # they end while the first confirm lifetime runs
            return super().run()

    summary, _ = run_tiers(tmp_path, rng, Scripted(shas, flip, 1.0),
                           Faithful(shas, flip, 0.9, seed=4), 2, Controls(None, []))
    assert summary["state"] == "done" and summary["flip_commit"] == shas[flip]
    assert seen_while_running and all(seen_while_running), seen_while_running


def _confirming(n: int, flip: int, faithful: Sequence[tuple[int, bool]]) -> ledger.Ledger:
    """A tiered run's state in its confirm step: the op check ran every candidate (the bug
    below ``flip``), the sides are ``flip - 1`` and ``flip``, then ``faithful`` lifetimes
    (position, divergent) came back."""
    from bisect_tool.journal import JournalContents

    rng = make_range(n)
    shas = [c.sha for c in rng.candidates]

    def seen(pos: int, lid: str, divergent: bool, **more: Any) -> dict[str, Any]:
        return {"type": "observation", "lifetime_id": lid, "commit": shas[pos], "position": pos,
                "verdict": "divergent" if divergent else "clean", "detail": {}, "message": "",
                "duration_s": 50.0, **more}

    entries = [seen(i, f"op-{i}", i < flip, tier="narrow") for i in range(n)]
    entries.append({"type": "phase", "phase": "confirm", "message": "",
                    "bad_side": flip - 1, "good_side": flip})
    entries += [seen(pos, f"lifetime-{k}", d) for k, (pos, d) in enumerate(faithful)]
    return ledger.replay(JournalContents(tier_header(rng), tuple(entries)))


def test_the_confirm_step_starts_what_the_answer_is_expected_to_need_on_both_sides() -> None:
    """Issue 39, item 1: the confirm step fills the slots with the lifetimes the answer is
    expected to need, both sides at once. Eight slots at its start: several a side (the bad
    side's rate needs more than one lifetime; one bad-side lifetime beside seven good-side ones
    left the bad side to a later round); once two a side are in, the five more it expects, not
    eight: one bad-side lifetime and four clean ones on the good side, which the lifetimes' own
    evidence needs (82.9 % with two a side; the run stops at 99 % on it)."""
    from bisect_tool.designs.bisect import BisectDesign

    def started(state: ledger.Ledger) -> dict[int, int]:
        step = BisectDesign(state, slots=8).next_step()
        assert not isinstance(step, (Finish, Record)), step
        counts: dict[int, int] = {}
        for item in step.items:
            counts[item.key[0]] = counts.get(item.key[0], 0) + 1
        return counts

    first = started(_confirming(10, 5, []))
    assert first[4] >= 2 and first[5] >= 2 and sum(first.values()) <= 8, first
    later = started(_confirming(10, 5, [(4, True), (4, True), (5, False), (5, False)]))
    assert later == {4: 1, 5: 4}, later


def test_a_slot_that_comes_back_in_the_confirm_step_takes_the_side_not_under_way() -> None:
    """Two slots, a bad-side lifetime under way: the slot that came back starts the good side's
    next lifetime, and none once those under way are expected to end the search."""
    from bisect_tool.designs import Item
    from bisect_tool.designs.bisect import BisectDesign

    state = _confirming(10, 5, [(4, True), (5, False)])
    design = BisectDesign(state, slots=2)
    bad = state.candidates[4].sha
    running = Item(str(Tier.FAITHFUL), bad, "running-0", (), (4, Tier.FAITHFUL))
    work = design.refill([running], 1)
    assert work is not None and [i.key[0] for i in work.items] == [5]
    assert all(i.lifetime_id != "running-0" for i in work.items)
    done_soon = _confirming(10, 5, [(4, True), (4, True), *[(5, False)] * 6])
    running = Item(str(Tier.FAITHFUL), bad, "running-1", (), (4, Tier.FAITHFUL))
    assert BisectDesign(done_soon, slots=2).refill([running], 1) is None


class Gated(Scripted):
    """A faithful probe that can ask the compatibility gate alone (``interfaces.Gates``): it
    refuses ``refused`` (the pinned stack lacks an op of theirs), each check taking
    ``gate_s``; it records how many checks ran at once and whether any lifetime booted while
    one still ran."""

    def __init__(self, *args: Any, refused: Sequence[str] = (), gate_s: float = 0.2,
                 **kwargs: Any) -> None:
        import threading

        super().__init__(*args, **kwargs)
        self.refused, self.gate_s = set(refused), gate_s
        self.lock = threading.Lock()
        self.gating = self.peak = 0
        self.gated: list[str] = []
        self.booted_while_gating = False

    def gate_check(self, commit: str, tags: Sequence[str] = ()) -> Observation:
        import time

        with self.lock:
            self.gating += 1
            self.peak = max(self.peak, self.gating)
        time.sleep(self.gate_s)
        with self.lock:
            self.gating -= 1
            self.gated.append(commit)
        if commit in self.refused:
            return Observation(commit, Verdict.UNTESTABLE, f"gate-{commit}", {"stage": "gate"},
                               "candidate lacks op `_C::rms_norm`", self.gate_s)
        return Observation(commit, Verdict.CLEAN, f"gate-{commit}", {"stage": "gate"}, "",
                           self.gate_s)

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        with self.lock:
            self.booted_while_gating |= self.gating > 0
        assert commit not in self.refused, "a release the gate refused booted a lifetime"
        return super().evaluate(commit, lifetime_id, tags)


def _release_run(tmp_path: Path, rng: CommitRange, narrow: Any, faithful: Any, parallel: int,
                 controls: Any, notes: list[str] | None = None) -> tuple[dict[str, Any], Path]:
    """A release-level run (``level`` release) with the controls on a slot of their own; the
    notes it tells its observer go to ``notes``."""
    from bisect_tool.events import Note

    def observe(event: object) -> None:
        if notes is not None and isinstance(event, Note):
            notes.append(event.text)

    path = tmp_path / "journal.jsonl"
    recipe = Recipe("t").to_dict()
    recipe["probe"]["narrow"] = "op" if narrow is not None else ""
    recipe["probe"]["controls"] = True
    with Journal(path) as journal:
        journal.append(ledger.header_for(rng, recipe=recipe, mode="recipe", level="release"))
        state = ledger.replay(read(path))
        evaluators = Evaluators(faithful, parallel, controls, narrow=narrow,
                                controls_beside=True)
        summary = bisect_loop(journal, state, evaluators, controls=True, observer=observe)
    return summary, path


def test_every_release_is_gated_at_once_before_any_server_boots(tmp_path: Path) -> None:
    """Issue 39, item 3: with --no-narrow the controls looked for a testable release one at a
    time (the gate refused three in a row; the controls ended at 361 s of a 406 s run). Now
    every release is gated at once before the first boot, the refused ones journaled as
    untestable with the gate's reason, and the controls boot at once on the nearest testable
    release."""
    rng = make_range(12)
    shas = [c.sha for c in rng.candidates]
    refused = shas[9:]  # a fix: the good end is the newest; the three newest are refused
    faithful = Gated(shas, 5, 1.0, refused=refused)
    ran: list[str] = []
    notes: list[str] = []
    summary, path = _release_run(tmp_path, rng, None, faithful, 2, _Controls(None, ran), notes)
    assert summary["state"] == "done" and summary["flip_commit"] == shas[5]
    assert "gating 12 releases at once before any server boots" in notes
    assert sum(n.startswith("the gate refused") and "rms_norm" in n for n in notes) == 3
    assert sorted(faithful.gated) == sorted(shas) and faithful.peak >= 4
    assert not faithful.booted_while_gating
    assert ran == [shas[8]]  # the controls, once, on the nearest testable release
    contents = read(path)
    untestable = contents.of_type("untestable")
    assert {e["commit"] for e in untestable} == set(refused)
    assert all(e["stage"] == "gate" and "rms_norm" in e["message"] for e in untestable)
    assert {e["commit"] for e in contents.of_type("gate")} == set(shas) - set(refused)


def test_the_op_check_narrows_beside_the_gates_sweep(tmp_path: Path) -> None:
    """A tiered release-level run: the op check's runs (they boot no server) go on while the
    sweep gates every release; the controls and the confirm lifetimes wait for it, and the
    confirm step's good side skips the refused release."""
    import threading

    rng = make_range(10)
    shas = [c.sha for c in rng.candidates]
    flip = 6
    sweeping = threading.Event()

    class Narrow(Scripted):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            if faithful.gating:
                sweeping.set()
            return super().evaluate(commit, lifetime_id, tags)

    faithful = Gated(shas, flip, 0.9, seed=2, refused=[shas[flip]], gate_s=0.5)
    ran: list[str] = []
    summary, path = _release_run(tmp_path, rng, Narrow(shas, flip, 1.0), faithful, 2,
                                 _Controls(None, ran))
    assert sweeping.is_set() and not faithful.booted_while_gating
    # the refused release and the next one form the block the answer names
    assert summary["state"] == "done" and summary["flip_block"] == [shas[flip], shas[flip + 1]]
    assert shas[flip] not in faithful.calls and ran == [shas[-1]]
    phase = read(path).of_type("phase")[0]
    assert (phase["bad_side"], phase["good_side"]) == (flip - 1, flip + 1)


def test_the_confirm_step_stops_only_on_the_lifetimes_own_evidence_too() -> None:
    """Issue 39: "the asked confidence on the lifetimes' own evidence". Three bad-side
    divergences and four clean good-side lifetimes put the flip at 99.8 % with the op check's
    prior (above the stop threshold) but at 97.8 % from the lifetimes alone: the run goes on
    with the good side; two more clean ones carry the lifetimes alone past 99 % and end it."""
    from bisect_tool.designs.phases import decide
    from bisect_tool.strategy.tiers import lifetimes_alone

    short = _confirming(10, 5, [(4, True)] * 3 + [(5, False)] * 4)
    s = short.strategy.summary()
    assert short.prior is not None
    assert s.done and lifetimes_alone(short.strategy, short.prior.plain) < 0.99
    assert not isinstance(decide(short), Finish)
    enough = _confirming(10, 5, [(4, True)] * 3 + [(5, False)] * 6)
    finish = decide(enough)
    assert isinstance(finish, Finish) and finish.state is EndState.DONE, finish


def test_the_lifetimes_alone_that_stop_the_run_are_the_reports() -> None:
    """The stop rule's lifetimes-alone (``tiers.lifetimes_alone``: the likelihood reweighted to
    a plain prior) and the report's (the journal replayed without the op check) are one number,
    on the H100's tiered run of ten releases."""
    from bisect_tool.report import lifetimes_alone as report_alone
    from bisect_tool.strategy.tiers import lifetimes_alone

    path = Path(__file__).parent.parent / "docs/bench/gpu-2026-12-07b-h100/journal-tiered.jsonl"
    contents = read(path)
    state = ledger.replay(contents)
    assert state.prior is not None
    ours = lifetimes_alone(state.strategy, state.prior.plain)
    theirs = report_alone(contents)
    assert theirs is not None and abs(ours - theirs) < 1e-9
    assert round(ours, 3) == 0.967  # the record's "96.7 % from the server lifetimes alone"


def test_the_controls_are_made_before_the_lifetimes_beside_them_start(tmp_path: Path) -> None:
    """The controls' runner is made where the run hands the controls out, on the run's own
    thread, before the lifetimes handed out with them start: the server backend's runner
    reserves its servers' room on the card there (``GpuPool.reserve_controls``). On the H100,
    made on the controls' own thread, six lifetimes leased first and nine servers shared the
    card."""
    import threading

    rng = make_range(12)
    shas = [c.sha for c in rng.candidates]
    made_on: list[str] = []
    started: list[str] = []

    class Recorded(_Controls):
        def __call__(self, commit: str) -> _Controls:
            made_on.append(threading.current_thread().name)
            started.append("controls made")
            return super().__call__(commit)

    class Faithful(Gated):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            started.append("lifetime")
            return super().evaluate(commit, lifetime_id, tags)

    ran: list[str] = []
    summary, _ = _release_run(tmp_path, rng, None, Faithful(shas, 5, 1.0), 2,
                              Recorded(None, ran))
    assert summary["state"] == "done" and ran
    assert made_on == [threading.main_thread().name]
    assert started.index("controls made") < started.index("lifetime")
