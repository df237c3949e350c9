"""Issue 30: the journal deleted (or replaced) during a run went unnoticed, and the run exited 0
with nothing recorded. Now the next append stops the run with one line and exit 16, and what
the journal held is saved beside it so no entry is lost."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gitrepos import Repo, linear, run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.errors import JournalLost, StateError

N = 16
FLIP = 11
BAD = f'[ "$(cat f)" -lt {FLIP} ]'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("faults-journal") / "repo", N, tag_every=4)


def test_journal_lost_has_its_own_exit_code() -> None:
    assert issubclass(JournalLost, StateError)
    assert JournalLost.exit_code == 16


def _run_until_third_lifetime(repo: Repo, tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    """A real run held inside its third lifetime (two journaled) until ``go`` exists."""
    record, go, state = tmp_path / "record", tmp_path / "go", tmp_path / "st"
    probe = (f'echo x >> {record}; if [ "$(wc -l < {record})" -eq 3 ]; then '
             f"while [ ! -e {go} ]; do sleep 0.02; done; fi; {BAD}")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bisect_tool", "start", "--good", "v0.1.0", "--bad", "v0.4.0",
         "--repo", str(repo.path), "--state-dir", str(state), "-q", "--run", probe],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    while not (record.exists() and len(record.read_text().splitlines()) >= 3):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    return proc, state


@pytest.mark.parametrize("how", ["deleted", pytest.param("replaced", marks=pytest.mark.slow)])
def test_journal_lost_during_a_run_stops_it_and_keeps_every_entry(
    repo: Repo, tmp_path: Path, how: str
) -> None:
    proc, state = _run_until_third_lifetime(repo, tmp_path)
    journal = state / "journal.jsonl"
    before = journal.read_text().splitlines()
    assert len(before) == 3  # the header and two observations
    if how == "deleted":
        journal.unlink()
    else:  # e.g. restored from a backup: another file at the same path
        shutil.copy(journal, tmp_path / "copy.jsonl")
        os.replace(tmp_path / "copy.jsonl", journal)
    (tmp_path / "go").touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == JournalLost.exit_code, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err and "first bad commit" not in out
    what = "deleted" if how == "deleted" else "replaced by another file"
    assert lines[-1].startswith(f"bisect: the journal {journal} was {what} while this run")
    saved = state / "journal.jsonl.lost"
    assert f"saved in {saved}" in lines[-1]
    kept = saved.read_text().splitlines()
    assert kept[:3] == before and len(kept) == 4  # and the third lifetime, not lost

    saved.replace(journal)
    code, out, err = run_cli("resume", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    assert len(repo.worktrees()) == 1


def test_append_after_the_file_was_deleted_raises(tmp_path: Path) -> None:
    path = tmp_path / "st" / "journal.jsonl"
    header = {"type": "header", "version": 1, "candidates": [{"sha": "a"}, {"sha": "b"}],
              "direction": "regression"}
    journal_mod.create(path, header)
    with journal_mod.Journal(path) as journal:
        journal.append({"type": "note", "message": "kept"})
        shutil.rmtree(path.parent)
        with pytest.raises(JournalLost, match="was deleted .*nothing could be saved"):
            journal.append({"type": "note", "message": "no folder left"})
