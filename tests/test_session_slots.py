"""The run loop's slots in process (``bisect_loop`` with stand-in evaluators and controls):
each lifetime journaled once, slots refilled as they come back, fewer lifetimes where the GPUs
hold fewer, SIGTERM, and the controls beside the lifetimes."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bisect_tool.errors import AbortError

if TYPE_CHECKING:
    from bisect_tool.interfaces import Evaluator
    from bisect_tool.range import CommitRange
    from bisect_tool.run.wiring import ControlsFor


class _LoopProbe:
    """An evaluator for ``bisect_loop`` tests: nothing to prepare, nothing to cancel."""

    def prepare(self, commits: object) -> None:
        return None

    def cancel(self) -> int:
        return 0


class _HeldControls:
    """Controls for ``bisect_loop`` tests that hold once ``ready()`` says so (a barrier met,
    an event set in time)."""

    ready: Callable[[], bool]

    def __init__(self, commit: str) -> None:
        self.commit = commit

    def run(self) -> dict[str, object]:
        held = type(self).ready()
        return {"type": "controls", "commit": self.commit, "ok": held,
                "problem": "" if held else "the controls were not ready in time",
                "positive": {"verdict": "divergent"}, "negative": {"verdict": "clean"}}


def _loop_range(n: int) -> tuple[list[str], CommitRange]:
    from bisect_tool.range import Candidate, CommitRange
    from bisect_tool.values import Direction

    shas = [f"{i:040x}" for i in range(1, n + 1)]
    return shas, CommitRange("good", "bad", shas[0], shas[-1], Direction.REGRESSION,
                             tuple(Candidate(s, f"commit {i}") for i, s in enumerate(shas)))


def _run_loop(path: Path, rng: CommitRange, probe: Evaluator, parallel: int,
              controls: ControlsFor | None = None, beside: bool = False) -> dict[str, Any]:
    """``bisect_loop`` over ``rng`` with ``parallel`` slots (and the controls, when given; on
    slots of their own with ``beside``)."""
    from bisect_tool.designs import ledger
    from bisect_tool.journal import Journal, read
    from bisect_tool.run.owner import Evaluators, bisect_loop

    recipe = {"probe": {"controls": True}} if controls is not None else None
    with Journal(path) as journal:
        journal.append(ledger.header_for(rng, recipe=recipe,
                                          mode="recipe" if recipe else "manual"))
        state = ledger.replay(read(path))
        evaluators = (Evaluators(probe, parallel, controls, controls_beside=beside)
                      if controls is not None else Evaluators(probe, parallel))
        return bisect_loop(journal, state, evaluators, controls=controls is not None)


def test_loop_with_several_slots_journals_each_lifetime_once_and_finds_the_flip(
    tmp_path: Path,
) -> None:
    """Several GPUs: the loop hands out several candidates at once (parallel=3)."""
    import threading

    from bisect_tool.journal import read
    from bisect_tool.values import Observation, Verdict

    shas, rng = _loop_range(40)
    flip = 23  # regression: positions >= 23 are bad, deterministically
    running, peak, lock = [0], [0], threading.Lock()

    class Scripted(_LoopProbe):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.02)
            with lock:
                running[0] -= 1
            bad = shas.index(commit) >= flip
            return Observation(commit, Verdict.DIVERGENT if bad else Verdict.CLEAN, lifetime_id)

    path = tmp_path / "journal.jsonl"
    summary = _run_loop(path, rng, Scripted(), 3)
    assert summary["state"] == "done" and summary["flip_commit"] == shas[flip]
    ids = [o["lifetime_id"] for o in read(path).observations]
    assert len(ids) == len(set(ids))
    assert peak[0] == 3  # the slots were used at once


def test_a_slot_that_comes_back_is_refilled_while_the_other_still_runs(tmp_path: Path) -> None:
    """Two slots: when one lifetime ends, the next one starts at once, not once its pair ends
    (on the H100 a slot stood idle 188 s beside the controls once the gate had refused its
    release: docs/bench/gpu-2026-12-07-h100). The bad end's first lifetime here ends only once
    a third lifetime has started; a run that waited for whole batches could not start one."""
    import threading

    from bisect_tool.journal import read
    from bisect_tool.values import Observation, Verdict

    shas, rng = _loop_range(20)
    flip = 11
    started: list[str] = []
    third_started = threading.Event()
    waited_for_it: list[bool] = []
    lock = threading.Lock()

    class SlowFirst(_LoopProbe):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            with lock:
                started.append(lifetime_id)
                if len(started) >= 3:
                    third_started.set()
            if len(started) == 1 or lifetime_id == started[0]:
                waited_for_it.append(third_started.wait(20))
            bad = shas.index(commit) >= flip
            return Observation(commit, Verdict.DIVERGENT if bad else Verdict.CLEAN, lifetime_id)

    path = tmp_path / "journal.jsonl"
    summary = _run_loop(path, rng, SlowFirst(), 2)
    assert waited_for_it == [True], "the third lifetime waited for the first one's pair"
    assert summary["state"] == "done" and summary["flip_commit"] == shas[flip]
    observed = read(path).observations
    ids = [o["lifetime_id"] for o in observed]
    assert len(ids) == len(set(ids)) and set(ids) == set(started)
    # journaled as each ended: the slow first lifetime after the ones that overtook it
    assert ids.index(started[0]) > ids.index(started[1])


def test_when_the_gpus_hold_fewer_lifetimes_the_loop_starts_fewer(tmp_path: Path) -> None:
    """Three slots, and a GPU that backs off to one lifetime after the first one came back
    short of its co-residency (``GpuPool.back_off``): the loop starts no lifetime beside
    another from then on, rather than one that would wait for the GPU, or crowd it again."""
    import threading

    from bisect_tool.designs import ledger
    from bisect_tool.journal import Journal, read
    from bisect_tool.run.owner import Evaluators, bisect_loop
    from bisect_tool.values import Observation, Verdict

    shas, rng = _loop_range(30)
    capacity = [3]
    lock = threading.Lock()
    running = [0]
    crowded_after: list[int] = []

    class BacksOff(_LoopProbe):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            with lock:
                running[0] += 1
                if capacity[0] == 1:
                    crowded_after.append(running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
                capacity[0] = 1  # the first lifetime back lowered the card's share
            bad = shas.index(commit) >= 17
            return Observation(commit, Verdict.DIVERGENT if bad else Verdict.CLEAN, lifetime_id)

    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        journal.append(ledger.header_for(rng))
        state = ledger.replay(read(path))
        summary = bisect_loop(journal, state, Evaluators(
            BacksOff(), 3, capacity=lambda: capacity[0]))
    assert summary["state"] == "done" and summary["flip_commit"] == shas[17]
    assert crowded_after and max(crowded_after) == 1, crowded_after


def test_lifetimes_that_end_after_a_sigterm_are_journaled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several slots, and a SIGTERM (a GPU call's deadline) while their lifetimes run: the run
    stops, but each lifetime already running ends as it would have and is in the journal, so
    `bisect resume` does not run it again."""
    import concurrent.futures
    import threading

    from bisect_tool.journal import read
    from bisect_tool.run import engine as engine_mod
    from bisect_tool.runtime.common import sigterm_raises
    from bisect_tool.values import Observation, Verdict

    _, rng = _loop_range(20)
    waiting = threading.Event()

    def as_completed(futures: object) -> object:
        waiting.set()
        return concurrent.futures.as_completed(futures)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_mod, "as_completed", as_completed)

    class DeadlineMidLifetime(_LoopProbe):  # nothing can stop them: each ends as it would have

        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            assert waiting.wait(30)  # the loop waits for the slots
            if lifetime_id.endswith("-0"):
                os.kill(os.getpid(), signal.SIGTERM)  # the deadline, while the probes run
            time.sleep(0.3)  # each lifetime goes on to its end
            return Observation(commit, Verdict.DIVERGENT, lifetime_id)

    path = tmp_path / "journal.jsonl"
    with pytest.raises(AbortError, match="SIGTERM"), sigterm_raises():
        _run_loop(path, rng, DeadlineMidLifetime(), 3)
    seen = read(path).observations
    assert len(seen) == 3 and {o["verdict"] for o in seen} == {"divergent"}
    assert len({o["lifetime_id"] for o in seen}) == 3


def test_with_two_slots_the_first_lifetime_runs_beside_the_controls(tmp_path: Path) -> None:
    """The controls hold the first lifetime's verdict back, not its boot: with two slots, one
    lifetime runs while the controls do (they meet at a barrier), and the answer stands."""
    import threading

    from bisect_tool.journal import read
    from bisect_tool.values import Observation, Verdict

    shas, rng = _loop_range(20)
    together = threading.Barrier(2, timeout=30)
    met: list[str] = []

    class Scripted(_LoopProbe):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            if not met:
                together.wait()
                met.append(lifetime_id)
            bad = shas.index(commit) >= 12
            return Observation(commit, Verdict.DIVERGENT if bad else Verdict.CLEAN, lifetime_id)

    class Controls(_HeldControls):
        ready = staticmethod(lambda: together.wait() >= 0)

    path = tmp_path / "journal.jsonl"
    summary = _run_loop(path, rng, Scripted(), 2, Controls)
    assert met and summary["state"] == "done" and summary["flip_commit"] == shas[12]
    kinds = [e["type"] for e in read(path).entries]
    # journaled among the first lifetimes, not after the search: the lifetimes after the first
    # take no time here, so how many land before the controls' entry is the scheduler's (3 of
    # them did on 2 cores under 3 other test runs); before the search's second half is the rule
    assert kinds.index("controls") <= len(kinds) // 2, kinds


def test_controls_on_a_slot_of_their_own_leave_every_slot_to_the_lifetimes(
    tmp_path: Path,
) -> None:
    """[runtime] controls_own_slot: the controls' server has a GPU slot of its own, so they run
    beside two lifetimes on two slots; on the H100 they took one of the two and the run went one
    lifetime at a time (issue 39). The controls here run until two lifetimes ran at once beside
    them (or 5 s)."""
    import threading

    from bisect_tool.values import Observation, Verdict

    shas, rng = _loop_range(20)
    lock = threading.Lock()
    running, beside_controls = [0], [0]
    controls_on = threading.Event()
    two_at_once = threading.Event()

    class Scripted(_LoopProbe):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            with lock:
                running[0] += 1
                if controls_on.is_set():
                    beside_controls[0] = max(beside_controls[0], running[0])
                if running[0] >= 2:
                    two_at_once.set()
            two_at_once.wait(0.3)
            with lock:
                running[0] -= 1
            bad = shas.index(commit) >= 12
            return Observation(commit, Verdict.DIVERGENT if bad else Verdict.CLEAN, lifetime_id)

    def ready() -> bool:
        controls_on.set()
        two_at_once.wait(5)
        controls_on.clear()
        return True

    class Controls(_HeldControls):
        pass

    Controls.ready = staticmethod(ready)
    summary = _run_loop(tmp_path / "journal.jsonl", rng, Scripted(), 2, Controls, beside=True)
    assert summary["state"] == "done" and summary["flip_commit"] == shas[12]
    assert beside_controls[0] == 2


def test_while_the_controls_run_a_slot_whose_end_was_refused_goes_on_to_the_next(
    tmp_path: Path,
) -> None:
    """The GPU case (docs/bench/gpu-2026-12-07-h100, --no-narrow): the controls and the bad
    end's first lifetime start together; the gate refuses the bad end at once. The lifetimes
    go on from the nearest testable candidate while the controls still run (these end only once
    two candidates have been tried), not 188 s later when they are done."""
    import threading

    from bisect_tool.journal import read
    from bisect_tool.values import Observation, Verdict

    shas, rng = _loop_range(20)
    tried: list[str] = []
    two_tried = threading.Event()

    class RefusesTheBadEnd(_LoopProbe):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            tried.append(commit)
            if len(set(tried)) >= 2:
                two_tried.set()
            if commit == shas[-1]:  # the bad end: the pinned stack's gate refuses it
                return Observation(commit, Verdict.UNTESTABLE, lifetime_id, {}, "refused")
            bad = shas.index(commit) >= 12
            return Observation(commit, Verdict.DIVERGENT if bad else Verdict.CLEAN, lifetime_id)

    class Controls(_HeldControls):
        ready = staticmethod(lambda: two_tried.wait(20))  # the lifetimes went on meanwhile

    path = tmp_path / "journal.jsonl"
    summary = _run_loop(path, rng, RefusesTheBadEnd(), 2, Controls)
    assert summary["state"] == "done" and summary["flip_commit"] == shas[12], summary["message"]
    entries = read(path).entries
    kinds = [e["type"] for e in entries]
    tried_before_controls = {e["commit"] for e in entries[:kinds.index("controls")]
                             if e["type"] in ("observation", "untestable")}
    assert shas[-2] in tried_before_controls  # the next candidate ran beside the controls


def test_controls_the_good_end_cannot_run_move_to_the_nearest_testable_candidate(
    tmp_path: Path,
) -> None:
    """Issue 30 (the GPU case, 0.22.0's extension under 0.26.0's Python): the good end's
    controls are refused by the gate, say so, and run on the next candidate toward the bad end;
    the good end is untestable for lifetimes and the answer still comes."""
    from bisect_tool.journal import read
    from bisect_tool.values import Observation, Verdict

    shas, rng = _loop_range(20)
    ran: list[str] = []

    class Scripted(_LoopProbe):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            assert commit != shas[0], "the refused good end booted a lifetime"
            bad = shas.index(commit) >= 12
            return Observation(commit, Verdict.DIVERGENT if bad else Verdict.CLEAN, lifetime_id)

    class Controls:
        def __init__(self, commit: str) -> None:
            self.commit = commit

        def run(self) -> dict[str, object]:
            ran.append(self.commit)
            if self.commit == shas[0]:
                return {"type": "controls", "commit": self.commit, "ok": False,
                        "untestable": True, "attempts": 0,
                        "problem": "the controls could not run: candidate lacks op "
                                   "`_C::rms_norm`"}
            return {"type": "controls", "commit": self.commit, "ok": True, "problem": "",
                    "positive": {"verdict": "divergent"}, "negative": {"verdict": "clean"}}

    path = tmp_path / "journal.jsonl"
    summary = _run_loop(path, rng, Scripted(), 1, Controls)
    assert ran == [shas[0], shas[1]]
    assert summary["state"] == "done" and summary["flip_commit"] == shas[12]
    refused = read(path).of_type("controls")[0]
    assert refused["untestable"] and "could not run" in refused["problem"]
