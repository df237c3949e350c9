"""The state dir: where a bisect keeps its journal, lock and logs, and what ``reset`` may delete.

Where: inside the clone's git dir (``<git dir>/bisect-tool``, as git bisect keeps its state),
the clone found from any folder inside it the way git finds it (``git rev-parse``: a
subdirectory, a linked worktree, ``$GIT_DIR``), or ``--state-dir``.

What ``reset`` deletes: only what it can prove it wrote. ``--state-dir`` is the user's word, and
a wrong one (``.`` inside a clone, ``../precious``, a file, a project whose own ``logs/`` has
the name the tool uses) must cost nothing. So the tool marks the folder it creates
(``MARKER_NAME``: the tool's name and an id) and a folder is removed only when it carries that
mark, or (a state dir made before the mark existed) holds a journal that starts with a bisect
header, or is the default ``<git dir>/bisect-tool``; and every entry in it is one this tool
writes there (``state_entries``), every journal starts with a bisect header, and it holds no
git work tree. Anything else is a one-line ``ResetRefused`` and nothing is deleted. Even then
the entries are removed one by one by name and the folder last with ``rmdir``: a file that
appears meanwhile survives.

The mark also records the folder's inode: a ``cp -a`` copy of a live state dir carries the
mark, but not its inode, so ``copied_from`` tells ``reset`` and ``resume`` that the processes
its records name are another folder's (the live run's), not this one's to end.

Where it may not be: inside a git dir, other than the tool's own ``<git dir>/bisect-tool``
(``check_location``). ``--state-dir .git/refs/x`` wrote the journal and the lock among the refs
and git then read them as broken refs; ``.git`` itself has a ``logs/`` folder of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bisect_tool.errors import ResetRefused, StateDirUnusable

STATE_SUBDIR = "bisect-tool"
#: the lock (filelock's empty file) and its holder's record (``bisect_tool.run.statelock``)
LOCK_NAME = "lock"
HOLDER_NAME = "lock.holder"
#: written into every state dir the tool creates: what proves to ``reset`` that it is the tool's
MARKER_NAME = "bisect-state.json"
#: the previous sessions' journals a new ``start`` keeps (``request.archive_previous``)
ARCHIVE_DIR = "archive"
_TOOL = "bisect"


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


@dataclass(frozen=True)
class Marker:
    """The mark of a state dir the tool created."""

    id: str
    created: float
    inode: int  # the folder's own inode when it was made: a copy has another


def make(path: Path) -> None:
    """Create the state dir ``path`` (and its parents), marked as the tool's; an existing folder
    is left as it is (not marked: what is in it may be the user's). One line naming the fix
    when it cannot be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
    except FileExistsError:
        if not path.is_dir():
            raise StateDirUnusable(
                f"--state-dir {path} is a file, not a folder; pass a folder you can write"
            ) from None
        return
    except OSError as exc:
        raise StateDirUnusable(
            f"cannot create the state dir {path} ({exc.strerror or exc}); "
            "pass --state-dir PATH to a folder you can write"
        ) from None
    mark(path)


def mark(path: Path) -> None:
    """Write the mark into ``path``, a folder this tool has just created."""
    body = {"tool": _TOOL, "id": uuid.uuid4().hex, "created": time.time(),
            "inode": path.stat().st_ino}
    tmp = path / (MARKER_NAME + ".new")
    try:
        tmp.write_text(json.dumps(body) + "\n")
        os.replace(tmp, path / MARKER_NAME)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StateDirUnusable(
            f"cannot write in the state dir {path} ({exc.strerror or exc}); free space there "
            "or pass --state-dir PATH to a folder you can write"
        ) from None


def read_marker(path: Path) -> Marker | None:
    """The mark of the state dir ``path``, or None (none, not a file, not the tool's)."""
    entry = path / MARKER_NAME
    if entry.is_symlink() or not entry.is_file():
        return None
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("tool") != _TOOL or not data.get("id"):
            return None
        return Marker(str(data["id"]), float(data["created"]), int(data["inode"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def copied_from(path: Path) -> bool:
    """Whether the state dir ``path`` is a copy (``cp -a``, a restored backup) of the one the
    tool made: its mark names another folder's inode. The processes and containers its records
    and its session name are then the original's, maybe live: not this folder's to end."""
    found = read_marker(path)
    if found is None:
        return False
    try:
        return path.stat().st_ino != found.inode
    except OSError:
        return False


def check_location(path: Path) -> None:
    """Refuse a state dir inside a git dir other than the tool's own ``<git dir>/bisect-tool``
    (the journal, the lock and ``logs/`` would land among git's own files: refs, reflogs), or
    the top of a clone's work tree (among the user's own files)."""
    here = Path(os.path.abspath(path))
    probe = here
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return
    try:
        done = subprocess.run(
            ["git", "-C", str(probe), "rev-parse", "--is-inside-git-dir", "--absolute-git-dir"],
            capture_output=True, text=True, timeout=60, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return
    own = Path(lines[1]).resolve() / STATE_SUBDIR
    resolved = here.parent.resolve() / here.name
    clone = find_clone(probe) if lines[0] != "true" else None
    if clone is not None and resolved == clone.top.resolve():
        # `--state-dir .` in the clone: journal.jsonl, lock, logs/ among the user's files
        raise StateDirUnusable(
            f"--state-dir {path} is the work tree of the clone {clone.top}; leave --state-dir "
            f"out (the default is {own}) or give a folder of its own"
        )
    if lines[0] != "true" or resolved == own or own in resolved.parents:
        return
    raise StateDirUnusable(
        f"--state-dir {path} is inside the git dir {lines[1]}, where its journal, lock and "
        f"logs/ would sit among git's own files; leave --state-dir out (the default is "
        f"{own}) or give a folder outside it"
    )


def archive_previous(path: Path) -> Path:
    """Move the finished journal at ``path`` (and the release-level journal it went on from,
    if any) into the state dir's archive, numbered after the ones there; where it went.

    A new ``start`` deleted the previous session's journal without a word (issue 38): the
    record of a finished bisect is the user's, for as long as they keep the state dir."""
    from bisect_tool.run.handover import RELEASES_NAME

    archive = path.parent / ARCHIVE_DIR
    try:
        archive.mkdir(exist_ok=True)
        taken = [int(p.stem.rsplit("-", 1)[1]) for p in archive.glob("*-*.jsonl")
                 if p.stem.rsplit("-", 1)[1].isdigit()]
        number = max(taken, default=0) + 1
        releases = path.with_name(RELEASES_NAME)
        if releases.is_file():
            releases.replace(archive / f"releases-{number}.jsonl")
        kept = archive / f"{path.stem}-{number}.jsonl"
        path.replace(kept)
    except OSError as exc:
        raise StateDirUnusable(
            f"cannot keep the previous journal in {archive} ({exc.strerror or exc}); free "
            f"space there, or move {path} away yourself, then `bisect start` again"
        ) from None
    return kept


def looks_like_state_dir(folder: Path) -> bool:
    """Whether ``folder`` is a bisect state dir by what is in it or its name (its mark, a lock,
    ``bisect-tool``): a folder of journals and their reports (docs/h200) is not one."""
    return folder.name == STATE_SUBDIR or read_marker(folder) is not None or (
        (folder / LOCK_NAME).is_file() and not (folder / LOCK_NAME).is_symlink())


def check_output(target: Path, flag: str, journal: Path, state_dir: Path | None) -> None:
    """Refuse (one line) to write a report or a plot onto a bisect journal (``journal`` or any
    other) or anywhere inside ``state_dir``: `bisect report -o journal.jsonl` overwrote the
    journal with exit 0 (issue 38)."""
    from bisect_tool.errors import UsageError

    def same(a: Path, b: Path) -> bool:
        try:
            return a.exists() and b.exists() and os.path.samefile(a, b)
        except OSError:
            return False

    fix = f"give {flag} a file outside the state dir"
    if same(target, journal) or (target.is_file() and _is_journal(target)):
        raise UsageError(
            f"{flag} {target} is a bisect journal; writing there would destroy it; {fix}"
        )
    if state_dir is None:
        return
    where = Path(os.path.abspath(target))
    where = where.parent.resolve() / where.name
    home = state_dir.resolve()
    if home in where.parents or where == home:
        raise UsageError(
            f"{flag} {target} is inside the state dir {state_dir}, which holds only what "
            f"bisect writes there; {fix}"
        )


def _journal_names() -> tuple[str, ...]:
    from bisect_tool.journal import JOURNAL_NAME
    from bisect_tool.run.handover import HANDOVER_NAME, RELEASES_NAME
    from bisect_tool.run.locate import LOCATE_JOURNAL

    return (JOURNAL_NAME, HANDOVER_NAME, RELEASES_NAME, LOCATE_JOURNAL)


def state_entries() -> dict[str, str]:
    """Every name this tool writes directly in a state dir -> its kind: "journal" (first line
    a bisect header), "partial" (a journal or holder being written: temp + rename), "lock"
    (filelock's empty file), "holder" (the lock holder's JSON), "folder" (logs/, children/),
    "marker" (the tool's mark), "archive" (earlier sessions' journals, every one a journal)."""
    from bisect_tool.runtime.children import CHILDREN_DIR
    entries = {LOCK_NAME: "lock", HOLDER_NAME: "holder", HOLDER_NAME + ".new": "partial",
               "logs": "folder", CHILDREN_DIR: "folder", MARKER_NAME: "marker",
               MARKER_NAME + ".new": "partial", ARCHIVE_DIR: "archive"}
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
        header = json.loads(first.decode("utf-8-sig"))  # an editor's byte-order mark
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
    lost = [n for n in foreign if ".jsonl.lost" in n]
    if lost:
        # what a run saved when its journal was deleted under it (journal.JournalLost)
        raise ResetRefused(
            f"--state-dir {path} holds {_names(lost)}: the entries a run saved when its journal "
            "was deleted while it ran; move it back over the journal (then `bisect resume`) or "
            "away, then reset; reset deletes nothing"
        )
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
            "marker": lambda p: read_marker(p.parent) is not None,
            "archive": _is_archive,
        }[kind](entry)
        if not ok:
            raise ResetRefused(
                f"--state-dir {path}: {name} is not the {kind} bisect writes there; reset "
                f"deletes nothing; {fix}"
            )
    journals = [n for n in present if kinds[n] == "journal"]
    default = clone is not None and here == (clone.git_dir / STATE_SUBDIR).resolve()
    if present and not (MARKER_NAME in present or journals or default):
        # Every name is one the tool uses, but nothing proves the tool made the folder: a
        # project's own logs/ (``cd proj && bisect reset --state-dir .`` wiped it, issue 38).
        raise ResetRefused(
            f"--state-dir {path} is not marked as a bisect state dir and holds no bisect "
            f"journal ({_names(present)} may be yours); reset deletes nothing; {fix}"
        )
    return present


def _is_archive(folder: Path) -> bool:
    """The archive of earlier sessions: a folder of journals (and nothing else)."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        found = list(folder.iterdir())
    except OSError:
        return False
    return all(p.is_file() and not p.is_symlink() and p.suffix == ".jsonl" and _is_journal(p)
               for p in found)


def remove(path: Path, entries: Iterable[str]) -> None:
    """Delete ``entries`` of ``path`` (checked by ``removable``), then ``path`` if it is empty.
    The mark goes last: a reset stopped half-way (Ctrl-C) leaves a folder still proven the
    tool's, which the next reset removes."""
    for name in sorted(entries, key=lambda n: n == MARKER_NAME):
        entry = path / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # something appeared meanwhile: not ours, so it stays
        path.rmdir()
