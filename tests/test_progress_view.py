"""The live progress view in a real pseudo-terminal: the status line shows while lifetimes run,
and Ctrl-C ends the run cleanly (one line, exit 130, the terminal left as it was)."""

from __future__ import annotations

import os
import pty
import re
import select
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from gitrepos import linear, write_probe

from bisect_tool import journal as journal_mod

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _read_until(fd: int, wanted: bytes, limit_s: float, seen: bytearray) -> bool:
    # A bound on the wait, not a timing assertion: the test fails only if the line never shows.
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return wanted in ANSI.sub(b"", bytes(seen))
            if not chunk:
                break
            seen.extend(chunk)
            if wanted in ANSI.sub(b"", bytes(seen)):
                return True
    return wanted in ANSI.sub(b"", bytes(seen))


def test_live_view_shows_the_search_and_ends_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    repo = linear(tmp_path / "repo", 40)
    # every lifetime takes a while, so Ctrl-C lands while one runs
    command = write_probe(tmp_path / "probe.py", flip=25, sleep=0.6)
    state = tmp_path / "state"
    argv = [sys.executable, "-m", "bisect_tool", "start", "--good", repo.main[0], "--bad",
            repo.main[-1], "--run", command, "--repo", str(repo.path), "--state-dir", str(state)]
    pid, fd = pty.fork()
    if pid == 0:  # the child: bisect on the pty as its terminal
        os.environ["COLUMNS"] = "200"
        os.execv(sys.executable, argv)
    seen = bytearray()
    try:
        assert _read_until(fd, b"candidates left", 120, seen), bytes(seen)[-2000:]
        assert _read_until(fd, b" lifetimes, ", 120, seen), bytes(seen)[-2000:]
        assert _read_until(fd, b"| running ", 120, seen), bytes(seen)[-2000:]
        os.write(fd, b"\x03")  # Ctrl-C, as the terminal sends it
        assert _read_until(fd, b"bisect resume", 60, seen), bytes(seen)[-2000:]
        _read_until(fd, b"\x00never", 5, seen)  # drain to the end
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 130
    text = ANSI.sub(b"", bytes(seen)).decode(errors="replace")
    assert "interrupted; `bisect resume` continues where it stopped" in text
    assert "Traceback" not in text
    # the live line was erased at the end (transient), the cursor shown again
    assert b"\x1b[?25h" in bytes(seen)
    # nothing was lost: every journaled line is whole and resume can go on from it
    contents = journal_mod.read(state / journal_mod.JOURNAL_NAME)
    assert not contents.torn_tail


@pytest.mark.slow  # a whole `start --run` in a subprocess
def test_plain_lines_without_a_terminal(tmp_path: Path) -> None:
    import subprocess

    repo = linear(tmp_path / "repo", 12)
    command = write_probe(tmp_path / "probe.py", flip=6)
    done = subprocess.run(
        [sys.executable, "-m", "bisect_tool", "start", "--good", repo.main[0], "--bad",
         repo.main[-1], "--run", command, "--repo", str(repo.path), "--state-dir",
         str(tmp_path / "state"), "-v"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stderr  # no terminal codes in a log
    assert re.search(r"^\s+\S+-\d+: (clean|divergent) in ", done.stderr, re.M)  # -v: lifetimes
    quiet = subprocess.run(
        [sys.executable, "-m", "bisect_tool", "resume", "--repo", str(repo.path), "--state-dir",
         str(tmp_path / "state"), "-q"],
        capture_output=True, text=True, timeout=120,
    )
    assert quiet.returncode == 0 and quiet.stdout.startswith("first bad commit")


# -- what the lines count (issue 41), on the events a tiered run sends -------------------------


def _chosen(sha: str, left: int, tier: str, subject: str = "[Kernel] Tidy launcher (#1)",
            lifetimes: int = 1) -> Any:
    from bisect_tool.events import CandidateChosen

    return CandidateChosen(sha * 40, subject, "split the range", lifetimes, 0, left, "f" * 40,
                           0.5, tier)


def _ended(sha: str, tier: str) -> Any:
    from bisect_tool.events import LifetimeEnded

    return LifetimeEnded(sha * 40, f"{sha * 12}-0", "clean", "all identical", 1.0, {}, tier)


def test_the_counts_keep_op_runs_apart_never_restart_and_never_go_up() -> None:
    import io

    from bisect_tool.events import RunStarted
    from bisect_tool.run.progress import PlainLines

    out = io.StringIO()
    lines = PlainLines(out, lifetimes=False)
    lines(RunStarted(114, "fix", 0))
    for sha, left in (("a", 113), ("b", 38), ("c", 4)):
        lines(_chosen(sha, left, "narrow"))
        lines(_ended(sha, "narrow"))
    # the lifetimes' posterior starts over the whole range, with the op check's flip as prior
    lines(_chosen("d", 113, "faithful",
                  "[Bugfix][Kernel] Fix batch invariance in RMSNorm kernels by pinning block "
                  "size (#48391)"))
    lines(_ended("d", "faithful"))
    lines(_chosen("d", 68, "faithful", lifetimes=3))
    text = out.getvalue().splitlines()
    assert text[1].startswith("[0 lifetimes, 113 candidates left, top 50.0% at ffffffffffff] "
                              "op check: ")
    assert text[3].startswith("[2 op runs, 0 lifetimes, 4 candidates left, ")
    assert text[4].startswith("[3 op runs, 0 lifetimes, 4 candidates left, ")
    assert text[5].startswith("[3 op runs, 1 lifetime, 4 candidates left, ")
    # a subject cut at a word, with an ellipsis; no unexplained "x1"
    assert text[4].endswith("Fix batch invariance in RMSNorm kernels…"), text[4]
    assert not any(line.endswith(" x1") for line in text)
    assert text[5].endswith("(3 lifetimes at once)")


def test_clip_cuts_at_a_word_with_an_ellipsis() -> None:
    from bisect_tool.run.progress import clip

    assert clip("short", 60) == "short"
    assert clip("one two three four", 12) == "one two…"
    assert clip("x" * 30, 10) == "x" * 9 + "…"
    assert clip("a  b\n c", 60) == "a b c"
