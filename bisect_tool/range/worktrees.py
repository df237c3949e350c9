"""Detached git worktrees of candidates: never the user's checkout, always removed, and the
ones a killed run left behind (SIGKILL skips the cleanup) found again by their lock.

Several runs may share one clone (two ``start``s with different state dirs; issue 30), so:

- each worktree has its own folder, named with its session, and its lock names its owner (pid,
  start time, host, session): the stale-worktree cleanup removes only this tool's worktrees
  whose owner is gone, never a live run's;
- git's worktree commands race each other on the clone's shared ``.git/worktrees``: ``remove``
  and ``prune`` delete it when it is empty, while another process's ``add`` is creating its
  entry there ("could not create directory of '.git/worktrees/src'"), and ``add``/``remove``
  read every entry, one half-made ("failed to read .git/worktrees/src/commondir"). So this
  tool's ``add`` and ``remove`` take turns (an ``flock`` on a file in the clone's git dir, for
  every process of the tool), a command that still lost a race (to a git command of the user)
  is tried again, and nothing prunes the whole clone: each run removes only its own entries;
- a probe that deletes its worktree's ``.git`` (``rm -rf .git``) leaves git unable to
  ``remove`` it (validation fails) and the entry locked; the folder is then deleted first and
  the entry removed by path, which git allows for a missing worktree.
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bisect_tool.errors import InfrastructureError

_WORKTREE_LOCK = "bisect-tool worktree of pid"
_FOLDER_PREFIX = "bisect-wt-"
#: tries of a ``git worktree`` command that lost a race for ``.git/worktrees`` to another one
_ATTEMPTS = 5
_TURNS = "bisect-tool-worktrees.lock"
# "bisect-tool worktree of pid 123 on host" (older runs), then " since 456 session abc"
_LOCK = re.compile(
    rf"^{_WORKTREE_LOCK} (?P<pid>\d+) on (?P<host>\S+)"
    r"(?: since (?P<ticks>\d+))?(?: session (?P<session>\S+))?"
)


class WorktreeError(InfrastructureError):
    """``git worktree add`` failed; the message is git's last line (callers say of what). An
    ``InfrastructureError``: the clone, not the candidate, failed, and uncaught it is still one
    line from the CLI."""


@functools.lru_cache(maxsize=64)
def _git_common_dir(repo_path: str) -> Path | None:
    done = subprocess.run(
        ["git", "-C", repo_path, "rev-parse", "--git-common-dir"], capture_output=True, text=True
    )
    if done.returncode != 0 or not done.stdout.strip():
        return None
    return (Path(repo_path) / done.stdout.strip()).resolve()


#: this thread's turn files, by clone: [open file, the ``_turn`` that holds it]
_held = threading.local()


@contextmanager
def _turn(repo_path: Path) -> Iterator[None]:
    """One ``git worktree`` command at a time on this clone, across all processes of the tool
    (without a writable git dir: no turns, the retries alone).

    A Ctrl-C that lands after the command but before the lock's file is closed (in
    contextlib's ``__exit__``, before the generator resumes) left that file open, kept alive by
    the traceback, and locked; the worktree's removal then waited for its own turn on a second
    file, for ever (``flock`` locks by open file, not by process), with Ctrl-C held back. So
    the open file is this thread's, by clone, and a turn this thread did not give back is
    taken over, not waited for (a thread runs one turn at a time)."""
    common = _git_common_dir(str(repo_path))
    files: dict[Path, list[Any]] = _held.__dict__.setdefault("files", {})
    mine = object()
    entry: list[Any] | None = None
    if common is not None:
        entry = files.get(common)
        if entry is None or entry[0].closed:
            files.pop(common, None)
            try:
                entry = files[common] = [open(common / _TURNS, "a"), mine]  # noqa: SIM115
            except OSError:
                entry = None
    if entry is not None:
        entry[1] = mine
        fcntl.flock(entry[0], fcntl.LOCK_EX)  # the kernel drops it if we die; ours: at once
    try:
        yield
    finally:
        if common is not None and entry is not None and entry[1] is mine:
            entry[0].close()  # first: dropped from ``files`` or not, the lock is given back
            files.pop(common, None)


def _git_worktree(
    repo_path: Path, *args: str, made: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``git worktree ARGS`` in its turn, again while it fails for a race on .git/worktrees
    (``made``: what a failed try may have left, removed before the next)."""
    for attempt in range(1, _ATTEMPTS + 1):
        with _turn(repo_path):
            done = subprocess.run(
                ["git", "-C", str(repo_path), "worktree", *args], capture_output=True, text=True
            )
        if done.returncode == 0 or attempt == _ATTEMPTS or not _lost_race(done.stderr):
            return done
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        time.sleep(0.05 * attempt)  # the other command is mid-way: let it finish
    raise AssertionError("unreachable")


def _lost_race(stderr: str) -> bool:
    """Whether a ``git worktree`` command failed on another process's half-made or half-removed
    entry under ``.git/worktrees`` (not on something wrong with its own arguments)."""
    return "worktrees/" in stderr or "worktrees'" in stderr


def _lock_reason(session: str) -> str:
    from bisect_tool.runtime.children import start_ticks

    reason = f"{_WORKTREE_LOCK} {os.getpid()} on {socket.gethostname()}"
    ticks = start_ticks(os.getpid())
    if ticks is not None:
        reason += f" since {ticks}"
    return reason + (f" session {session}" if session else "")


def _owner_gone(reason: str) -> bool:
    """Whether the run that locked a worktree with ``reason`` is gone (False when unsure)."""
    from bisect_tool.runtime.children import start_ticks

    match = _LOCK.match(reason)
    if match is None or match["host"] != socket.gethostname():
        return False  # not ours, or another host's: its owner cannot be asked
    pid = int(match["pid"])
    if not _alive(pid):
        return True
    # a pid reused by another process is not the owner
    return match["ticks"] is not None and start_ticks(pid) != int(match["ticks"])


def remove_stale_worktrees(repo_path: Path) -> int:
    """Remove the worktrees a killed bisect left (SIGKILL skips ``worktree``'s cleanup).

    Each worktree is locked with its owner's pid, start time and host; one whose owner is gone
    is removed, so ``resume`` after a crash leaves the user's ``git worktree list`` as it was.
    Worktrees of live runs (another ``start`` on the same clone) and the user's own are kept.
    """
    proc = _git_worktree(repo_path, "list", "--porcelain")
    removed = 0
    path = ""
    for line in proc.stdout.splitlines():
        if line.startswith("worktree "):
            path = line[len("worktree ") :]
        elif line.startswith("locked ") and _owner_gone(line[len("locked ") :]):
            folder = Path(path).parent
            ours = folder.name.startswith(_FOLDER_PREFIX)
            _remove(repo_path, Path(path), folder if ours else None)
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


def _remove(repo_path: Path, path: Path, folder: Path | None) -> None:
    """Remove one of this tool's worktrees: its files, its folder (the ``bisect-wt-`` folder this
    tool made, when given), and its entry in the clone (only that entry: no prune of the whole
    clone)."""

    def remove() -> bool:
        return _git_worktree(repo_path, "remove", "--force", "--force", str(path)).returncode == 0

    if not remove() and folder is not None:
        # e.g. the probe deleted the worktree's .git: git cannot validate it, so it refuses;
        # with the folder gone, git removes the (locked) entry of a missing worktree.
        shutil.rmtree(folder, ignore_errors=True)
        remove()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def confined(path: Path) -> dict[str, str]:
    """Environment for a command run in the worktree ``path``: git never looks above its folder
    for a repository, so a command after ``rm -rf .git`` there finds none (rather than one the
    folder may sit inside) and cannot touch it."""
    ceiling = str(path.parent)
    rest = os.environ.get("GIT_CEILING_DIRECTORIES", "")
    return {"GIT_CEILING_DIRECTORIES": ceiling + (os.pathsep + rest if rest else "")}


@contextmanager
def worktree(
    repo_path: Path, commit: str, parent: Path | None = None, *, session: str = ""
) -> Iterator[Path]:
    """A detached git worktree of ``commit`` (under ``parent``, default the temp dir), never the
    user's checkout; always removed.

    Its folder is named with ``session``; it is locked with this process's pid and start time
    and the session, so a later run can tell it was left by a killed one."""
    from bisect_tool.runtime.common import signals_deferred

    prefix = _FOLDER_PREFIX + (f"{re.sub(r'[^A-Za-z0-9_.-]', '_', session)}-" if session else "")
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    path = folder / "src"
    try:
        added = _git_worktree(
            repo_path, "add", "--detach", "--quiet", "--lock", "--reason", _lock_reason(session),
            str(path), commit, made=path,
        )
        if added.returncode != 0:
            lines = added.stderr.strip().splitlines() or ["git worktree add failed"]
            raise WorktreeError(lines[-1])
        yield path
    finally:
        # a second Ctrl-C must not leave the worktree half removed
        with signals_deferred():
            _remove(repo_path, path, folder)
