"""Detached git worktrees of candidates: never the user's checkout, always removed, and the
ones a killed run left behind (SIGKILL skips the cleanup) found again by their lock."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_WORKTREE_LOCK = "bisect-tool worktree of pid"


def _lock_reason() -> str:
    return f"{_WORKTREE_LOCK} {os.getpid()} on {socket.gethostname()}"


def remove_stale_worktrees(repo_path: Path) -> int:
    """Remove the worktrees a killed bisect left (SIGKILL skips ``worktree``'s cleanup).

    Each worktree is locked with its owner's pid and host; one whose owner is gone is removed,
    so ``resume`` after a crash leaves the user's ``git worktree list`` as it was.
    """
    proc = subprocess.run(
        ["git", "-C", str(repo_path), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
    )
    removed = 0
    path = ""
    for line in proc.stdout.splitlines():
        if line.startswith("worktree "):
            path = line[len("worktree ") :]
        elif line.startswith(f"locked {_WORKTREE_LOCK} "):
            pid_text, _, host = line[len(f"locked {_WORKTREE_LOCK} ") :].partition(" on ")
            if host != socket.gethostname() or not pid_text.isdigit() or _alive(int(pid_text)):
                continue
            subprocess.run(
                ["git", "-C", str(repo_path), "worktree", "remove", "--force", "--force", path],
                capture_output=True,
            )
            parent = Path(path).parent
            if parent.name.startswith("bisect-wt-"):
                shutil.rmtree(parent, ignore_errors=True)
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorktreeError(Exception):
    """``git worktree add`` failed; the message is git's last line."""


@contextmanager
def worktree(repo_path: Path, commit: str, parent: Path | None = None) -> Iterator[Path]:
    """A detached git worktree of ``commit`` (under ``parent``, default the temp dir), never the
    user's checkout; always removed.

    Locked with this process's pid, so a later run can tell it was left by a killed one."""
    folder = Path(tempfile.mkdtemp(prefix="bisect-wt-", dir=parent))
    path = folder / "src"
    try:
        added = subprocess.run(
            [
                "git",
                "-C",
                str(repo_path),
                "worktree",
                "add",
                "--detach",
                "--quiet",
                "--lock",
                "--reason",
                _lock_reason(),
                str(path),
                commit,
            ],
            capture_output=True,
            text=True,
        )
        if added.returncode != 0:
            lines = added.stderr.strip().splitlines() or ["git worktree add failed"]
            raise WorktreeError(lines[-1])
        yield path
    finally:
        subprocess.run(
            ["git", "-C", str(repo_path), "worktree", "remove", "--force", "--force", str(path)],
            capture_output=True,
        )
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run(["git", "-C", str(repo_path), "worktree", "prune"], capture_output=True)
