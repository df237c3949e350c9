"""Issue 38, data loss: the state dir is the tool's only where it can prove it, and the files in it
(journals, the previous session's too) are never lost to a command of its own.

Each case is what a user would type; each asserts what the user would check afterwards: their
files still there, the one line on stderr, the exit status. docs/reliability.md lists them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from gitrepos import Repo, linear, live_run, run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.errors import ResetRefused, StateDirUnusable, UsageError
from bisect_tool.run import statedir
from bisect_tool.runtime.local import pids_with_env

N = 16
FLIP = 11
PROBE = f'[ "$(cat f)" -lt {FLIP} ]'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("statedir") / "repo", N, tag_every=4)


def start(repo: Repo, state: Path | None, *extra: str) -> tuple[int, str, str]:
    where = ["--state-dir", str(state)] if state is not None else []
    return run_cli("start", "--good", "v0.1.0", "--bad", "v0.4.0", "--repo", str(repo.path),
                   "-q", *where, *extra)


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert lines and lines[-1].startswith("bisect: "), err
    return lines[-1]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


# ---- reset: only a folder the tool can prove it made ------------------------------------------


def test_reset_of_dot_in_a_project_keeps_its_own_logs(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`cd proj && bisect reset --state-dir .` printed "removed ." and wiped the user's logs/:
    every name in proj was one the tool uses, and nothing more was asked."""
    proj = tmp_path / "proj"
    (proj / "logs").mkdir(parents=True)
    (proj / "logs" / "app.log").write_text("a week of my service's logs")
    (proj / "children").mkdir()
    (proj / "lock").write_bytes(b"")
    before = tree(proj)
    monkeypatch.chdir(proj)
    code, out, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", ".")
    assert code == ResetRefused.exit_code, out + err
    line = one_line(err)
    assert "is not marked as a bisect state dir and holds no bisect journal" in line
    assert "reset deletes nothing" in line
    assert tree(proj) == before and (proj / "children").is_dir()


def test_a_state_dir_the_tool_creates_is_marked_and_reset_removes_it(
    repo: Repo, tmp_path: Path
) -> None:
    state = tmp_path / "a" / "st"
    code, _, err = start(repo, state, "--run", PROBE)
    assert code == 0, err
    mark = statedir.read_marker(state)
    assert mark is not None and mark.inode == state.stat().st_ino
    assert json.loads((state / statedir.MARKER_NAME).read_text())["tool"] == "bisect"
    # without its journal, the mark alone proves it
    (state / "journal.jsonl").unlink()
    code, out, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert f"removed {state}" in out and not state.exists() and (tmp_path / "a").is_dir()


@pytest.mark.slow  # a whole `start --run` (the marked-folder one stays in the fast tier)
def test_an_existing_folder_is_not_marked(repo: Repo, tmp_path: Path) -> None:
    """A folder that was there before holds what the user put there: the tool never claims it."""
    state = tmp_path / "mine"
    state.mkdir()
    code, _, err = start(repo, state, "--run", PROBE)
    assert code == 0, err
    assert statedir.read_marker(state) is None
    # its journal proves the session (a state dir made before the mark existed is the same)
    code, out, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert not state.exists()


@pytest.mark.slow  # a whole `start --run`
def test_a_state_dir_made_before_the_mark_is_still_reset(repo: Repo, tmp_path: Path) -> None:
    state = tmp_path / "old"
    code, _, err = start(repo, state, "--run", PROBE)
    assert code == 0, err
    (state / statedir.MARKER_NAME).unlink()  # as an older bisect left it: a journal, logs/
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert not state.exists()
    # an unmarked folder of the tool's names with no journal proves nothing
    (state / "logs").mkdir(parents=True)
    (state / "lock").write_bytes(b"")
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == ResetRefused.exit_code and "reset deletes nothing" in one_line(err)
    assert (state / "logs").is_dir()


def test_the_default_state_dir_is_the_tools_by_its_place(tmp_path: Path) -> None:
    """`<git dir>/bisect-tool` is the tool's by name: an older run's leftovers there (a lock and
    logs/, no journal, no mark) are still removed."""
    clone = linear(tmp_path / "clone", N, tag_every=4)
    state = clone.path / ".git" / "bisect-tool"
    (state / "logs").mkdir(parents=True)
    (state / "lock").write_bytes(b"")
    code, out, err = run_cli("reset", "--repo", str(clone.path))
    assert code == 0, err
    assert not state.exists() and (clone.path / ".git" / "HEAD").is_file()


def _live_run(repo: Repo, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, str]:
    proc, state, _ = live_run(repo, tmp_path, flip=FLIP)
    session = str(journal_mod.read(state / "journal.jsonl").header["session"])
    return proc, state, session


def test_reset_of_a_copy_of_a_live_state_dir_leaves_the_live_probe_alone(
    repo: Repo, tmp_path: Path
) -> None:
    proc, state, session = _live_run(repo, tmp_path)
    try:
        probes = pids_with_env("BISECT_SESSION", session)
        assert probes
        copy = tmp_path / "copy"
        subprocess.run(["cp", "-a", str(state), str(copy)], check=True)
        assert (copy / "children").is_dir() and any((copy / "children").iterdir())
        code, out, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(copy))
        assert code == 0, err
        assert f"removed {copy}" in out and "is a copy of another state dir" in err
        assert not copy.exists()
        assert proc.poll() is None
        assert all(Path(f"/proc/{p}").exists() for p in probes), "the live run's probe was killed"
        assert pids_with_env("BISECT_SESSION", session) == probes
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    code, out, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err


# ---- not among git's own files ------------------------------------------------------------------


@pytest.mark.parametrize("inside", [".git", *(pytest.param(inside, marks=pytest.mark.slow)
                                             for inside in (".git/refs/bisect", ".git/logs/st",
                                                            ".git/x/y"))])
def test_a_state_dir_inside_the_git_dir_is_refused(tmp_path: Path, inside: str) -> None:
    clone = linear(tmp_path / "clone", N, tag_every=4)
    before = tree(clone.path / ".git")
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.4.0", "--run", PROBE,
                           "--repo", str(clone.path), "--state-dir", str(clone.path / inside))
    assert code == StateDirUnusable.exit_code, err
    assert "is inside the git dir" in one_line(err) and "leave --state-dir out" in one_line(err)
    assert tree(clone.path / ".git") == before
    fsck = subprocess.run(["git", "-C", str(clone.path), "for-each-ref"], capture_output=True,
                          text=True, check=True)
    assert "broken" not in fsck.stderr and "ignoring" not in fsck.stderr
    # the tool's own place there, and any folder under it, is fine
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.4.0", "--run", PROBE,
                           "--repo", str(clone.path), "-q",
                           "--state-dir", str(clone.path / ".git" / "bisect-tool" / "two"))
    assert code == 0, err


@pytest.mark.slow  # a whole `start --run` in a linked worktree
def test_the_linked_worktrees_own_place_is_fine(repo: Repo, tmp_path: Path) -> None:
    clone = linear(tmp_path / "clone", N, tag_every=4)
    linked = tmp_path / "linked"
    clone.git("worktree", "add", "-q", str(linked), "HEAD")
    own = clone.path / ".git" / "worktrees" / "linked" / "bisect-tool"
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.4.0", "--run", PROBE,
                           "--repo", str(linked), "-q", "--state-dir", str(own))
    assert code == 0, err
    code, _, err = run_cli("status", "--repo", str(linked), "--state-dir",
                           str(clone.path / ".git" / "worktrees" / "linked"))
    assert code == StateDirUnusable.exit_code and "is inside the git dir" in one_line(err)


def test_a_mark_of_another_program_proves_nothing(repo: Repo, tmp_path: Path) -> None:
    state = tmp_path / "st"
    (state / "logs").mkdir(parents=True)
    (state / statedir.MARKER_NAME).write_text('{"tool": "other", "id": "x"}')
    assert statedir.read_marker(state) is None and not statedir.copied_from(state)
    before = tree(state)
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == ResetRefused.exit_code and "is not the marker bisect writes" in one_line(err)
    assert tree(state) == before


# ---- the report never lands on a journal or in the state dir ----------------------------------


@pytest.fixture(scope="module")
def finished(repo: Repo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("finished") / "st"
    code, _, err = start(repo, state, "--run", PROBE)
    assert code == 0, err
    return state


@pytest.mark.parametrize("flag", ["-o", "--plot"])
def test_report_onto_the_journal_or_into_the_state_dir_is_refused(
    repo: Repo, finished: Path, tmp_path: Path, flag: str
) -> None:
    journal = finished / "journal.jsonl"
    before = tree(finished)
    copy = tmp_path / "kept.jsonl"
    copy.write_bytes(journal.read_bytes())
    link = tmp_path / "link.jsonl"
    link.symlink_to(journal)
    for target, argv, says in (
        (journal, ["--state-dir", str(finished)], "is a bisect journal"),
        (journal, ["--journal", str(journal)], "is a bisect journal"),
        (link, ["--state-dir", str(finished)], "is a bisect journal"),
        (copy, ["--journal", str(copy)], "is a bisect journal"),  # report --journal X -o X
        (finished / "report.md", ["--state-dir", str(finished)], "is inside the state dir"),
        (finished / "logs" / "r.md", ["--journal", str(journal)], "is inside the state dir"),
    ):
        code, out, err = run_cli("report", "--repo", str(repo.path), *argv, flag, str(target))
        assert code == UsageError.exit_code, (target, argv, out, err)
        assert says in one_line(err) and "give" in one_line(err)
    assert tree(finished) == before
    assert copy.read_bytes() == journal.read_bytes()
    # beside it, where the user asked, it is written
    code, _, err = run_cli("report", "--repo", str(repo.path), "--state-dir", str(finished),
                           "-o", str(tmp_path / "report.md"))
    assert code == 0, err
    assert "first bad commit" in (tmp_path / "report.md").read_text().lower()


# ---- a new start keeps the previous session's journal --------------------------------------------


@pytest.mark.slow  # three whole `start --run`s
def test_a_new_start_keeps_the_previous_finished_journal_and_says_where(
    repo: Repo, tmp_path: Path
) -> None:
    state = tmp_path / "st"
    sessions = []
    for n in (1, 2, 3):
        code, out, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.4.0", "--run", PROBE,
                                 "--repo", str(repo.path), "--state-dir", str(state))
        assert code == 0, err
        sessions.append(journal_mod.read(state / "journal.jsonl").header["session"])
        if n > 1:
            kept = state / "archive" / f"journal-{n - 1}.jsonl"
            assert f"the previous session's journal is kept in {kept}" in err
    archived = [journal_mod.read(state / "archive" / f"journal-{n}.jsonl") for n in (1, 2)]
    assert [a.header["session"] for a in archived] == sessions[:2]
    assert all(a.end is not None and a.observations for a in archived)
    code, out, err = run_cli("report", "--journal", str(state / "archive" / "journal-1.jsonl"),
                             "--repo", str(repo.path))
    assert code == 0 and repo.main[FLIP - 1][:7] in out, err
    # reset removes them with the rest: they are journals the tool wrote there
    code, out, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert not state.exists()


@pytest.mark.slow  # whole `start --run`s
def test_an_archive_with_a_users_file_is_not_reset(repo: Repo, tmp_path: Path) -> None:
    state = tmp_path / "st"
    for _ in range(2):
        code, _, err = start(repo, state, "--run", PROBE)
        assert code == 0, err
    (state / "archive" / "notes.txt").write_text("mine")
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == ResetRefused.exit_code and "archive is not the archive" in one_line(err)
    assert (state / "archive" / "notes.txt").read_text() == "mine"


# ---- a full disk under the state dir: one line, never a traceback -----------------------------


def _on_a_small_disk(tmp_path: Path, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` (sh) with ``$DISK`` a 1 MiB tmpfs (a mount namespace of its own) and ``$BISECT``
    the tool; skipped where the machine allows no such namespace."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): cannot make a small disk here")
    body = f'mount -t tmpfs -o size=1m tmpfs "$DISK" || exit 99; {script}'
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", body],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "DISK": str(disk), "BISECT": f"{sys.executable} -m bisect_tool"},
    )
    if done.returncode == 99 or "unshare failed" in done.stderr:
        pytest.skip(f"cannot mount a small disk here: {done.stderr.strip()}")
    return done


@pytest.mark.parametrize("when", ["before the start", "during the run"])
def test_a_full_state_dir_disk_is_one_line(repo: Repo, tmp_path: Path, when: str) -> None:
    fill = 'head -c 2000000 /dev/zero > "$DISK/filler" 2>/dev/null'
    probe = (f'[ -e "$DISK/filler" ] || {{ {fill}; }}; {PROBE}' if when == "during the run"
             else PROBE)
    before = f"{fill}; " if when == "before the start" else ""
    done = _on_a_small_disk(tmp_path, (
        f"{before}$BISECT start --good v0.1.0 --bad v0.4.0 --repo {repo.path} -q "
        f'--state-dir "$DISK/st" --run \'{probe}\''))
    assert done.returncode in (StateDirUnusable.exit_code, 8), done.stderr
    line = one_line(done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "free space" in line and "No space left on device" in line


# ---- the sweep's low-severity cases (docs/reliability.md) ----------------------------------------


def test_an_empty_state_dir_is_refused_not_read_as_the_current_folder(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--state-dir "$UNSET"` read as `.`: the journal, the lock and logs/ went into the current
    folder."""
    monkeypatch.chdir(tmp_path)
    code, _, err = start(repo, None, "--run", PROBE, "--state-dir", "")
    assert code == 2 and "'--state-dir': is empty (an unset variable?)" in one_line(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a whole `start --run`
def test_the_top_of_the_clone_is_refused_as_a_state_dir(tmp_path: Path) -> None:
    clone = linear(tmp_path / "clone", N, tag_every=4)
    before = tree(clone.path)
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.4.0", "--run", PROBE,
                           "--repo", str(clone.path), "--state-dir", str(clone.path))
    assert code == StateDirUnusable.exit_code and "is the work tree of the clone" in one_line(err)
    assert tree(clone.path) == before
    # a folder of its own inside the clone is the user's choice
    code, _, err = start(Repo(clone.path, clone.main), clone.path / "st", "--run", PROBE)
    assert code == 0, err


@pytest.mark.slow  # a whole `start --run`, then a resume
def test_a_journal_saved_with_a_byte_order_mark_still_reads(repo: Repo, tmp_path: Path) -> None:
    """An editor may save the journal with a BOM when the user fixes a line by hand: it read as
    "not a bisect journal", and reset refused it."""
    state = tmp_path / "st"
    code, _, err = start(repo, state, "--run", PROBE)
    assert code == 0, err
    journal = state / "journal.jsonl"
    journal.write_bytes(b"\xef\xbb\xbf" + journal.read_bytes())
    code, out, err = run_cli("status", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0 and "done" in out, err
    (state / statedir.MARKER_NAME).unlink()  # the journal is the only proof left
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0 and not state.exists(), err


@pytest.mark.slow  # a whole `start --run`, then a resume
def test_a_journal_with_crlf_line_ends_still_reads_and_resumes(repo: Repo, tmp_path: Path) -> None:
    state = tmp_path / "st"
    code, _, err = start(repo, state, "--run", PROBE)
    assert code == 0, err
    journal = state / "journal.jsonl"
    lines = journal.read_bytes().splitlines()
    journal.write_bytes(b"\r\n".join(lines[:-1]) + b"\r\n")  # saved on Windows, the end cut
    code, out, err = run_cli("resume", "--repo", str(repo.path), "--state-dir", str(state), "-q")
    assert code == 0 and "first bad commit" in out, err


@pytest.mark.slow  # a whole `start --run`
def test_reset_names_a_saved_lost_journal_and_keeps_it(repo: Repo, tmp_path: Path) -> None:
    state = tmp_path / "st"
    code, _, err = start(repo, state, "--run", PROBE)
    assert code == 0, err
    (state / "journal.jsonl").rename(state / "journal.jsonl.lost")
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == ResetRefused.exit_code
    assert "holds journal.jsonl.lost: the entries a run saved" in one_line(err)
    assert (state / "journal.jsonl.lost").is_file()


@pytest.mark.slow  # a whole `start --run`
def test_a_reset_stopped_half_way_leaves_a_folder_the_next_reset_removes(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "st"
    code, _, err = start(repo, state, "--run", PROBE)
    assert code == 0, err
    real_unlink = Path.unlink

    def ctrl_c_after_the_journal(self: Path, missing_ok: bool = False) -> None:
        real_unlink(self, missing_ok=missing_ok)
        if self.name == "journal.jsonl":
            raise KeyboardInterrupt

    monkeypatch.setattr(Path, "unlink", ctrl_c_after_the_journal)
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 130 and not (state / "journal.jsonl").exists()
    monkeypatch.undo()
    code, _, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0 and not state.exists(), err


def test_a_plot_or_report_onto_a_folder_is_one_line(repo: Repo, finished: Path) -> None:
    for flag in ("-o", "--plot"):
        code, _, err = run_cli("report", "--repo", str(repo.path), "--state-dir", str(finished),
                               flag, str(finished.parent))
        assert code == UsageError.exit_code and "Is a directory" in one_line(err)


def test_every_test_the_issue_38_rows_name_exists() -> None:
    """docs/reliability.md names the test of each row; a renamed test must not leave it stale."""
    import re

    root = Path(__file__).resolve().parent.parent
    text = (root / "docs" / "reliability.md").read_text()
    section = text[text.index("## Issue 38"):]
    section = section[section.index("### Data loss"):]
    named = re.findall(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", section)
    current, checked = None, 0
    for path, name in named:
        if path:
            current = root / path
            assert current.is_file(), path
        if name:
            assert current is not None and f"def {name}(" in current.read_text(), (current, name)
            checked += 1
    assert checked >= 30
