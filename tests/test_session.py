"""The search loop end to end through `bisect start --run`: intermittent probes, untestable
commits, blocks, aborts, a bad end that never fails, and resume after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from gitrepos import Repo, linear, run_cli, write_probe

from bisect_tool import journal as journal_mod
from bisect_tool.errors import AbortError

if TYPE_CHECKING:
    from bisect_tool.interfaces import Evaluator
    from bisect_tool.range import CommitRange
    from bisect_tool.wiring import ControlsFor

N = 16  # commits; v0.1.0 is commit 4, v0.4.0 commit 16


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("s") / "repo", N, tag_every=4)


def sha(repo: Repo, index: int) -> str:
    return repo.main[index - 1]


def start(
    repo: Repo, state: Path, command: str, *extra: str, good: str = "v0.1.0", bad: str = "v0.4.0"
) -> tuple[int, str, str]:
    return run_cli(
        "start",
        "--good",
        good,
        "--bad",
        bad,
        "--run",
        command,
        "--repo",
        str(repo.path),
        "--state-dir",
        str(state),
        *extra,
    )


def status(repo: Repo, state: Path) -> dict[str, object]:
    code, out, err = run_cli(
        "status", "--json", "--repo", str(repo.path), "--state-dir", str(state)
    )
    assert code == 0, err
    return dict(json.loads(out))


def observations(state: Path) -> list[dict[str, object]]:
    return journal_mod.read(state / journal_mod.JOURNAL_NAME).of_type("observation")


@pytest.fixture(scope="module")
def intermittent(tmp_path_factory: pytest.TempPathFactory, repo: Repo) -> tuple[Path, str, str]:
    """One uninterrupted run with p = 0.5: (its state dir, the --run command, stdout)."""
    tmp_path = tmp_path_factory.mktemp("intermittent")
    command = write_probe(tmp_path / "probe.py", flip=11, p=0.5)
    code, out, err = start(repo, tmp_path / "st", command)
    assert code == 0, err
    return tmp_path / "st", command, out


def test_intermittent_regression_is_found(intermittent: tuple[Path, str, str], repo: Repo) -> None:
    state, _, out = intermittent
    assert f"first bad commit: {sha(repo, 11)}" in out
    s = status(repo, state)
    assert s["state"] == "done" and s["flip_commit"] == sha(repo, 11)
    assert float(s["confidence"]) >= 0.99  # type: ignore[arg-type]
    assert 0.2 < float(s["p_estimate"]) < 0.9  # type: ignore[arg-type]
    # it took repeated lifetimes: some commit on the bad side ran clean at least once
    obs = observations(state)
    assert any(o["verdict"] == "clean" and int(str(o["position"])) >= 7 for o in obs)


def test_intermittent_fix_is_found(tmp_path: Path, repo: Repo) -> None:
    # --good newer than --bad: the bug shows (half the time) before commit 9, not from 9 on
    command = write_probe(tmp_path / "probe.py", flip=9, p=0.5, fix=True)
    code, out, err = start(repo, tmp_path / "st", command, good="v0.4.0", bad="v0.1.0")
    assert code == 0, err
    assert f"first good commit: {sha(repo, 9)}" in out
    s = status(repo, tmp_path / "st")
    assert s["direction"] == "fix" and s["flip_commit"] == sha(repo, 9)


def test_untestable_commits_are_never_blamed(tmp_path: Path, repo: Repo) -> None:
    untestable = {6, 7, 11, 12}
    command = write_probe(tmp_path / "probe.py", flip=9, untestable=untestable)
    code, out, err = start(repo, tmp_path / "st", command)
    assert code == 0, err
    s = status(repo, tmp_path / "st")
    assert s["flip_commit"] == sha(repo, 9)
    blamed = {sha(repo, i) for i in untestable}
    assert not blamed & set(s["credible_set"])  # type: ignore[arg-type]
    for o in observations(tmp_path / "st"):
        if o["commit"] in blamed:
            assert o["verdict"] == "untestable"


@pytest.mark.parametrize(("untestable", "block"), [({9}, [9, 10]), ({8}, [8, 9])])
def test_flip_next_to_untestables_is_a_block(
    tmp_path: Path, repo: Repo, untestable: set[int], block: list[int]
) -> None:
    command = write_probe(tmp_path / "probe.py", flip=9, untestable=untestable)
    code, out, err = start(repo, tmp_path / "st", command)
    assert code == 0, err
    s = status(repo, tmp_path / "st")
    assert s["flip_commit"] is None
    assert s["flip_block"] == [sha(repo, i) for i in block]
    assert "could be any of" in out and all(sha(repo, i) in out for i in block)


def test_probe_killed_by_a_signal_aborts_and_keeps_the_journal(tmp_path: Path, repo: Repo) -> None:
    # the two ends run; the first commit in between kills the probe (exit 137, like git's >= 128)
    command = 'i=$(cat f); [ "$i" = 4 ] || [ "$i" = 16 ] || kill -9 $$; [ "$i" -lt 9 ]'
    code, out, err = start(repo, tmp_path / "st", command)
    assert code == AbortError.exit_code
    assert err.strip().splitlines()[-1].startswith("bisect: --run command was killed by SIGKILL")
    assert "Traceback" not in err
    killed_at = err.split(" at ")[-1].split(";")[0]
    obs = observations(tmp_path / "st")
    recorded = {(o["commit"], o["verdict"]) for o in obs}
    assert recorded == {(sha(repo, 16), "divergent"), (sha(repo, 4), "clean")}
    assert not any(str(o["commit"]).startswith(killed_at) for o in obs)
    s = status(repo, tmp_path / "st")
    assert s["state"] == "running" and s["evaluations"] == len(obs)
    assert len(repo.worktrees()) == 1  # the killed lifetime's worktree is gone too


def test_bad_end_that_never_fails_stops_and_says_so(tmp_path: Path, repo: Repo) -> None:
    code, out, err = start(repo, tmp_path / "st", "exit 0")
    assert code == 9, err  # stopped without an answer: a scripted caller can tell
    last = err.strip().splitlines()[-1]  # progress lines come before the one-line verdict
    assert "traceback" not in err.lower()
    assert last.startswith("bisect: stopped without an answer (bad_end_never_reproduced)")
    assert "never showed the bug" in last
    s = status(repo, tmp_path / "st")
    assert s["state"] == "bad_end_never_reproduced"
    assert {o["commit"] for o in observations(tmp_path / "st")} == {sha(repo, 16)}


def _wait_for(predicate: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


@pytest.mark.slow
def test_resume_after_sigkill_gives_the_uninterrupted_answer(
    tmp_path: Path, repo: Repo, intermittent: tuple[Path, str, str]
) -> None:
    whole, fast, _ = intermittent
    uninterrupted = [(o["lifetime_id"], o["verdict"]) for o in observations(whole)]
    assert len(uninterrupted) > 8

    # the same probe, slowed down (only) in the run that gets killed
    state = tmp_path / "killed"
    journal = state / journal_mod.JOURNAL_NAME
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bisect_tool",
            "start",
            "--good",
            "v0.1.0",
            "--bad",
            "v0.4.0",
            "--run",
            fast,
            "--repo",
            str(repo.path),
            "--state-dir",
            str(state),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PROBE_SLEEP": "0.2"},
    )
    try:
        _wait_for(lambda: journal.exists() and len(observations(state)) >= 5)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    kept = len(observations(state))
    assert 5 <= kept < len(uninterrupted)

    time.sleep(0.5)  # the orphaned probe (its own session) finishes its sleep
    code, out, err = run_cli("resume", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert f"first bad commit: {sha(repo, 11)}" in out
    resumed = [(o["lifetime_id"], o["verdict"]) for o in observations(state)]
    ids = [lid for lid, _ in resumed]
    assert len(ids) == len(set(ids))  # nothing counted twice
    assert resumed == uninterrupted  # nothing lost: the same lifetimes, the same verdicts
    assert status(repo, state)["evaluations"] == len(uninterrupted)
    assert len(repo.worktrees()) == 1  # the killed run's worktree was cleaned up


def test_run_timeout_aborts_and_cleans_up(tmp_path: Path, repo: Repo) -> None:
    code, out, err = start(repo, tmp_path / "st", "sleep 30", "--run-timeout", "0.5")
    assert code == AbortError.exit_code
    assert "timed out after" in err and "--run-timeout" in err and "Traceback" not in err
    # nothing was observed: no journal is left to refuse a start with a longer timeout
    assert not (tmp_path / "st" / "journal.jsonl").exists()
    assert len(repo.worktrees()) == 1


def test_sigterm_stops_the_run_and_tears_the_lifetime_down(tmp_path: Path, repo: Repo) -> None:
    record = tmp_path / "record.txt"
    command = write_probe(tmp_path / "probe.py", flip=11, sleep=30, record=record)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bisect_tool",
            "start",
            "--good",
            "v0.1.0",
            "--bad",
            "v0.4.0",
            "--run",
            command,
            "--repo",
            str(repo.path),
            "--state-dir",
            str(tmp_path / "st"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: record.exists() and record.read_text().strip())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == AbortError.exit_code
    assert "terminated (SIGTERM)" in err and "Traceback" not in err
    assert len(repo.worktrees()) == 1  # the probe's process group was killed, its tree removed
    s = status(repo, tmp_path / "st")
    assert s["state"] == "running" and s["evaluations"] == 0


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
    from bisect_tool import session
    from bisect_tool.journal import Journal, read
    from bisect_tool.run import Evaluators, bisect_loop

    recipe = {"probe": {"controls": True}} if controls is not None else None
    with Journal(path) as journal:
        journal.append(session.header_for(rng, recipe=recipe,
                                          mode="recipe" if recipe else "manual"))
        state = session.replay(read(path))
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

    from bisect_tool import session
    from bisect_tool.journal import Journal, read
    from bisect_tool.run import Evaluators, bisect_loop
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
        journal.append(session.header_for(rng))
        state = session.replay(read(path))
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

    from bisect_tool import engine as engine_mod
    from bisect_tool.journal import read
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
    assert "controls" in kinds[:3]  # journaled with the first lifetimes, before the rest


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
