"""The search loop end to end through `bisect start --run`: intermittent probes, untestable
commits, blocks, aborts, a bad end that never fails, and resume after SIGKILL (the run loop's
slots in process: tests/test_session_slots.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gitrepos import Repo, linear, run_cli, write_probe

from bisect_tool import journal as journal_mod
from bisect_tool.errors import AbortError

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


@pytest.mark.slow  # a whole intermittent bisect (the regression one stays in the fast tier)
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


@pytest.mark.slow  # whole bisects (untestable commits stay in the fast tier: the test above)
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
