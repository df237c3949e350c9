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
        assert _read_until(fd, b"lifetimes done | running", 120, seen), bytes(seen)[-2000:]
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
