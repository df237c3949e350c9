"""Issue 30, worktree faults: two runs on one clone at once (a WorktreeError traceback in 5 of
16 pairs), and a probe that deletes its worktree's .git (stale, locked entries left behind).
Real clones, real `git worktree`, real `bisect start` processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from gitrepos import Repo, git, linear, run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.errors import InfrastructureError
from bisect_tool.evaluate import RunCommandEvaluator
from bisect_tool.range.worktrees import WorktreeError, remove_stale_worktrees, worktree

N = 16
FLIP = 11
BAD = f'[ "$(cat f)" -lt {FLIP} ]'


@pytest.fixture()
def repo(tmp_path: Path) -> Repo:
    return linear(tmp_path / "repo", N, tag_every=4)


def entries(repo: Repo) -> list[str]:
    """The clone's linked worktree entries (its .git/worktrees), stale or not."""
    folder = repo.path / ".git" / "worktrees"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _start_cmd(repo: Repo, state: Path, command: str) -> list[str]:
    return [sys.executable, "-m", "bisect_tool", "start", "--good", "v0.1.0", "--bad", "v0.4.0",
            "--repo", str(repo.path), "--state-dir", str(state), "-q", "--run", command]


@pytest.mark.slow
def test_two_concurrent_starts_on_one_clone(repo: Repo, tmp_path: Path) -> None:
    for pair in range(3):
        runs = [subprocess.Popen(_start_cmd(repo, tmp_path / f"st-{pair}-{i}", BAD),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for i in range(2)]
        for proc in runs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0 and "Traceback" not in err, err
            assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    assert len(repo.worktrees()) == 1 and entries(repo) == []


@pytest.mark.slow
def test_worktrees_of_threads_and_runs_never_collide(repo: Repo) -> None:
    # git's add/remove race on the shared .git/worktrees: remove deletes it when empty while
    # another add creates its entry there, and both read each other's half-made entries
    failures: list[str] = []

    def cycle(k: int) -> None:
        for i in range(40):
            try:
                with worktree(repo.path, repo.main[(i + k) % N]) as path:
                    assert (path / "f").read_text() == f"{(i + k) % N + 1}\n"
            except WorktreeError as exc:
                failures.append(str(exc))

    threads = [threading.Thread(target=cycle, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert len(repo.worktrees()) == 1 and entries(repo) == []


def test_stale_cleanup_keeps_worktrees_of_live_runs(repo: Repo, tmp_path: Path) -> None:
    with worktree(repo.path, repo.main[0], session="live") as mine:
        code = (
            "import sys; from pathlib import Path\n"
            "from bisect_tool.range.worktrees import worktree\n"
            f"cm = worktree(Path({str(repo.path)!r}), {repo.main[1]!r}, session='other')\n"
            "print(cm.__enter__(), flush=True); sys.stdin.read()\n"
        )
        other = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert other.stdout is not None
        theirs = Path(other.stdout.readline().strip())
        try:
            assert remove_stale_worktrees(repo.path) == 0
            assert (mine / "f").exists() and (theirs / "f").exists()
        finally:
            other.kill()  # like kill -9: its worktree is left behind, locked with its pid
            other.wait()
        assert theirs.exists()
        assert remove_stale_worktrees(repo.path) == 1
        assert not theirs.parent.exists() and (mine / "f").exists()
        reason = git(repo.path, "worktree", "list", "--porcelain")
        assert f"locked bisect-tool worktree of pid {os.getpid()} on {socket.gethostname()}" \
            in reason and "session live" in reason
    assert len(repo.worktrees()) == 1 and entries(repo) == []


def test_probe_deleting_its_dot_git_leaves_no_entry_and_the_clone_intact(
    repo: Repo, tmp_path: Path
) -> None:
    head = git(repo.path, "rev-parse", "HEAD")
    state = tmp_path / "st"
    # after `rm -rf .git` git must find no repository (never one the folder sits inside)
    command = f"rm -rf .git; if git rev-parse --git-dir 2>/dev/null; then exit 3; fi; {BAD}"
    code, out, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.4.0", "--repo",
                             str(repo.path), "--state-dir", str(state), "-q", "--run", command)
    assert code == 0, err
    assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    codes = {o["detail"]["exit_code"] for o in journal_mod.read(state / "journal.jsonl")
             .observations}
    assert codes == {0, 1}
    assert len(repo.worktrees()) == 1 and entries(repo) == []
    assert git(repo.path, "rev-parse", "HEAD") == head
    assert git(repo.path, "status", "--porcelain") == ""
    git(repo.path, "fsck", "--no-progress")


def test_stale_entry_of_a_killed_run_whose_dot_git_was_deleted(repo: Repo, tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    folder = tmp_path / "bisect-wt-old"
    reason = f"bisect-tool worktree of pid {gone.pid} on {socket.gethostname()}"
    git(repo.path, "worktree", "add", "--detach", "--lock", "--reason", reason,
        str(folder / "src"), repo.main[3])
    (folder / "src" / ".git").unlink()
    assert entries(repo) == ["src"]
    assert remove_stale_worktrees(repo.path) == 1
    assert entries(repo) == [] and not folder.exists()


def test_a_commit_git_cannot_check_out_is_one_line(repo: Repo, tmp_path: Path) -> None:
    ev = RunCommandEvaluator(repo.path, "true", state_dir=tmp_path / "st", session="s")
    with pytest.raises(InfrastructureError) as caught:
        ev.evaluate("0" * 40, "lt-0")
    message = str(caught.value)
    assert message.startswith(f"cannot check out 000000000000 of {repo.path} for --run: ")
    assert "\n" not in message
    assert len(repo.worktrees()) == 1 and entries(repo) == []
