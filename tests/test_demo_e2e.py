"""`bisect demo` end to end with the local backend: the whole pipeline, for real, no GPU.

Generates a demo history, source-builds each candidate's C kernel, swaps it into the pinned
demollm stack, boots fresh server lifetimes, probes them under real concurrency, and bisects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bisect_tool import journal as journal_mod

pytestmark = pytest.mark.slow


def _servers_of(session: str) -> list[int]:
    """Live processes whose environment carries this bisect session (the demo servers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"BISECT_SESSION={session}".encode() in environ:
            found.append(int(entry.name))
    return found


def test_demo_finds_the_planted_fix_and_the_report_matches_the_journal(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisect_tool",
            "demo",
            "--workdir",
            str(workdir),
            "--json",
            "--commits",
            "80",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert summary["state"] == "done"
    assert summary["flip_commit"] == summary["planted_commit"]
    assert summary["confidence"] >= 0.99

    state_dir = workdir / "state"
    contents = journal_mod.read(state_dir / journal_mod.JOURNAL_NAME)
    assert _servers_of(str(contents.header["session"])) == []  # no server left behind
    assert not list(Path("/tmp").glob(f"bisect-overlay-{contents.header['session']}*"))

    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "bisect_tool",
            "report",
            "--format",
            "json",
            "--repo",
            str(workdir / "demo-repo"),
            "--state-dir",
            str(state_dir),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    by_commit: dict[str, list[str]] = {}
    for o in contents.observations:
        by_commit.setdefault(o["commit"], []).append(o["verdict"])
    tested = {row["sha"]: row for row in data["tested"]}
    assert set(tested) == set(by_commit)
    for sha, verdicts in by_commit.items():
        assert tested[sha]["lifetimes"] == len(verdicts)
        assert tested[sha]["divergent"] == verdicts.count("divergent")
    assert data["controls"]["positive"]["verdict"].upper() == "DIVERGENT"
