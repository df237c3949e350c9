"""Issue 30, signals: SIGHUP (a closed terminal or SSH session) acts like SIGTERM, and Ctrl-C in
the first moments of `bisect start` is one line and exit 130. Real `bisect start --run`
processes; the tests wait on what the run wrote, never on the clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gitrepos import Repo, linear, run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.errors import AbortError

N = 16
FLIP = 11
BAD = f'[ "$(cat f)" -lt {FLIP} ]'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("faults-signals") / "repo", N, tag_every=4)


def start_argv(repo: Repo, state: Path, command: str) -> list[str]:
    return ["start", "--good", "v0.1.0", "--bad", "v0.4.0", "--repo", str(repo.path),
            "--state-dir", str(state), "--run", command]


def labelled(session: str) -> list[int]:
    """Live processes carrying the session's label (the probes and what they started)."""
    wanted = f"BISECT_SESSION={session}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in env and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_for_lines(path: Path, count: int, proc: subprocess.Popen[str]) -> None:
    while not (path.exists() and len(path.read_text().splitlines()) >= count):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_sighup_acts_like_sigterm(repo: Repo, tmp_path: Path, sig: signal.Signals) -> None:
    record, state = tmp_path / "record", tmp_path / "st"
    # the first lifetime ends at once; with SLOW set, the second one is still running when
    # the signal comes (resume runs without SLOW)
    probe = (f'echo "$BISECT_LIFETIME" >> {record}; '
             f'if [ -n "$SLOW" ] && [ "$(wc -l < {record})" -ge 2 ]; then sleep 60; fi; {BAD}')
    proc = subprocess.Popen(
        [sys.executable, "-m", "bisect_tool", *start_argv(repo, state, probe)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SLOW": "1"},
    )
    wait_for_lines(record, 2, proc)
    session = str(journal_mod.read(state / "journal.jsonl").header["session"])
    assert labelled(session), "the second lifetime is running"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == AbortError.exit_code, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"bisect: terminated ({sig.name}); lifetimes torn down"
    finished = journal_mod.read(state / "journal.jsonl").observations
    assert [o["lifetime_id"] for o in finished] == [record.read_text().split()[0]]
    assert labelled(session) == [], "no probe left running"
    assert len(repo.worktrees()) == 1

    code, out, err = run_cli("resume", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    ids = [o["lifetime_id"] for o in journal_mod.read(state / "journal.jsonl").observations]
    assert ids[0] == finished[0]["lifetime_id"] and len(ids) == len(set(ids))


def test_sighup_is_left_alone_under_nohup(repo: Repo, tmp_path: Path) -> None:
    # `nohup bisect start ...` asks to outlive the terminal: SIGHUP stays ignored
    state, started, sent = tmp_path / "st", tmp_path / "started", tmp_path / "sent"
    # the first lifetime waits until the SIGHUP was sent, so it lands mid-run on any machine;
    # the others answer at once
    probe = (f"if mkdir {started} 2>/dev/null; then "
             f"while [ ! -e {sent} ]; do sleep 0.01; done; fi; {BAD}")
    proc = subprocess.Popen(
        ["nohup", sys.executable, "-m", "bisect_tool", *start_argv(repo, state, probe)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    while not started.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGHUP)
    sent.touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    log = (tmp_path / "nohup.out").read_text() if (tmp_path / "nohup.out").exists() else out
    assert f"first bad commit: {repo.main[FLIP - 1]}" in log


# three places in the fast tier, all six in `make test`
@pytest.mark.parametrize("delay", [0.02, pytest.param(0.05, marks=pytest.mark.slow), 0.1,
                                   pytest.param(0.2, marks=pytest.mark.slow), 0.35,
                                   pytest.param(0.5, marks=pytest.mark.slow)])
def test_ctrl_c_early_in_start_is_one_line_and_a_new_start_works(
    repo: Repo, tmp_path: Path, delay: float
) -> None:
    state = tmp_path / "st"
    # -X importtime: its line for the package says the interpreter's own start is over (a
    # Ctrl-C inside Python's startup, before any of the tool's code runs, is Python's)
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "bisect_tool",
         *start_argv(repo, state, f"sleep 30; {BAD}")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.rstrip().endswith("| bisect_tool"):
            break
    else:
        raise AssertionError("".join(seen))
    time.sleep(delay)  # where in the start the Ctrl-C lands: each place must end cleanly
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    said = [x for x in rest.splitlines() if x.strip() and not x.startswith("import time:")]
    # 130, or killed by SIGINT (the shell shows both as 130)
    assert proc.returncode in (130, -signal.SIGINT), rest
    # progress lines may come first (on a quick machine the run is under way by then); the
    # error is one line, the last, and there is no traceback
    errors = [x for x in said if x.startswith("bisect: interrupted")]
    assert "Traceback" not in rest and errors == [said[-1]], said
    assert said[-1].startswith("bisect: interrupted"), said
    if (state / "journal.jsonl").exists():
        session = str(journal_mod.read(state / "journal.jsonl").header["session"])
        assert labelled(session) == []

    code, out, err = run_cli(*start_argv(repo, state, BAD))
    assert code == 0, err
    assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    assert len(repo.worktrees()) == 1
