"""The state dir: where a bisect keeps its journal, lock and logs, and what ``reset`` may delete.

Where: inside the clone's git dir (``<git dir>/bisect-tool``, as git bisect keeps its state),
the clone found from any folder inside it the way git finds it (``git rev-parse``: a
subdirectory, a linked worktree, ``$GIT_DIR``), or ``--state-dir``.

What ``reset`` deletes: only what it can prove it wrote. ``--state-dir`` is the user's word, and
a wrong one (``.`` inside a clone, ``../precious``, a file) must cost nothing, so a folder is
removed only when every entry in it is one this tool writes there (``STATE_ENTRIES``), every
journal in it starts with a bisect header, and it holds no git work tree; anything else is a
one-line ``ResetRefused`` and nothing is deleted. Even then the entries are removed one by one
by name and the folder last with ``rmdir``: a file that appears meanwhile survives.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bisect_tool.errors import ResetRefused

STATE_SUBDIR = "bisect-tool"


@dataclass(frozen=True)
class Clone:
    top: Path  # the work tree's top-level folder (git rev-parse --show-toplevel)
    git_dir: Path  # its git dir; a linked worktree's own (.git/worktrees/NAME)


def find_clone(path: Path) -> Clone | None:
    """The clone ``path`` lies in (its top and git dir), found as git finds it; None outside
    any work tree (or when ``path`` does not exist)."""
    if not path.is_dir():
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--absolute-git-dir", "--show-toplevel"],
            capture_output=True, text=True, timeout=60, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return None  # not a repository, or a bare one / inside .git (no work tree)
    return Clone(top=Path(lines[1]), git_dir=Path(lines[0]))


def _journal_names() -> tuple[str, ...]:
    from bisect_tool.handover import HANDOVER_NAME, RELEASES_NAME
    from bisect_tool.journal import JOURNAL_NAME
    from bisect_tool.locate import LOCATE_JOURNAL

    return (JOURNAL_NAME, HANDOVER_NAME, RELEASES_NAME, LOCATE_JOURNAL)


def state_entries() -> dict[str, str]:
    """Every name this tool writes directly in a state dir -> its kind: "journal" (first line
    a bisect header), "partial" (a journal or holder being written: temp + rename), "lock"
    (filelock's empty file), "holder" (the lock holder's JSON), "folder" (logs/, children/)."""
    from bisect_tool.children import CHILDREN_DIR
    from bisect_tool.statelock import HOLDER_NAME, LOCK_NAME

    entries = {LOCK_NAME: "lock", HOLDER_NAME: "holder", HOLDER_NAME + ".new": "partial",
               "logs": "folder", CHILDREN_DIR: "folder"}
    for name in _journal_names():
        entries[name] = "journal"
        entries[name + ".new"] = "partial"  # journal.create writes NAME.new, then renames
    return entries


def _is_journal(path: Path) -> bool:
    """The file starts with a bisect journal header (the rest may be damaged: reset must still
    end a session whose journal is corrupt)."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(1 << 22)
        header = json.loads(first.decode("utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and header.get("type") == "header" and "session" in header


def _is_holder(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and {"pid", "host", "started"} <= set(data)


def _holds_git(folder: Path) -> bool:
    # os.walk does not follow links: a link to a clone inside logs/ is unlinked, not entered
    return any(".git" in dirs or ".git" in files for _root, dirs, files in os.walk(folder))


def _names(entries: Iterable[str]) -> str:
    shown = sorted(entries)
    more = f" and {len(shown) - 4} more" if len(shown) > 4 else ""
    return ", ".join(shown[:4]) + more


def removable(path: Path, clone: Clone | None = None) -> list[str]:
    """The entries of ``path`` that ``reset`` deletes (then the folder itself), or
    ``ResetRefused`` naming why it deletes nothing: ``path`` is a file or a link, is or holds a
    git work tree (or ``clone``), or holds an entry this tool does not write there."""
    fix = "give the state dir bisect made (by default <clone>/.git/bisect-tool)"
    if path.is_symlink():
        raise ResetRefused(
            f"--state-dir {path} is a symbolic link; reset deletes nothing (give the folder it "
            "points to)"
        )
    if not path.is_dir():
        raise ResetRefused(
            f"--state-dir {path} is a file, not a bisect state dir; reset deletes nothing; {fix}"
        )
    here = path.resolve()
    if clone is not None and (here == clone.top.resolve() or here in clone.top.resolve().parents
                              or here == clone.git_dir.resolve()):
        raise ResetRefused(
            f"--state-dir {path} is (or holds) the clone {clone.top} or its git dir; reset "
            f"deletes nothing; {fix}"
        )
    kinds = state_entries()
    try:
        present = sorted(p.name for p in path.iterdir())
    except OSError as exc:
        raise ResetRefused(
            f"cannot list --state-dir {path} ({exc.strerror or exc}); reset deletes nothing"
        ) from None
    if ".git" in present:
        raise ResetRefused(
            f"--state-dir {path} is a git work tree (it holds .git); reset deletes nothing; {fix}"
        )
    foreign = [n for n in present if n not in kinds]
    if foreign:
        raise ResetRefused(
            f"--state-dir {path} holds files bisect did not write ({_names(foreign)}); reset "
            f"deletes nothing; {fix}"
        )
    for name in present:
        entry, kind = path / name, kinds[name]
        ok = {
            "journal": lambda p: p.is_file() and not p.is_symlink() and _is_journal(p),
            "partial": lambda p: p.is_file() and not p.is_symlink(),
            "lock": lambda p: p.is_file() and not p.is_symlink() and p.stat().st_size == 0,
            "holder": lambda p: p.is_file() and not p.is_symlink() and _is_holder(p),
            "folder": lambda p: p.is_dir() and not p.is_symlink() and not _holds_git(p),
        }[kind](entry)
        if not ok:
            raise ResetRefused(
                f"--state-dir {path}: {name} is not the {kind} bisect writes there; reset "
                f"deletes nothing; {fix}"
            )
    return present


def remove(path: Path, entries: Iterable[str]) -> None:
    """Delete ``entries`` of ``path`` (checked by ``removable``), then ``path`` if it is empty."""
    for name in entries:
        entry = path / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # something appeared meanwhile: not ours, so it stays
        path.rmdir()
