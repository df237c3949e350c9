"""The journal: an append-only, versioned JSONL file; resume is replay.

Every entry is one JSON object on one line, written and fsynced before the next step, so a crash
loses at most the entry being written; a torn last line (crash mid-write) is skipped on read.
What each entry holds, and the shape it is checked against on reading, is
``bisect_tool.journal.entries``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_tool import redact
from bisect_tool.errors import CorruptJournal, JournalLost, NoSession, StateDirUnusable, StateError
from bisect_tool.journal.entries import JOURNAL_VERSION, Observed, Refused, environment
from bisect_tool.journal.entries import observed as parse_observed
from bisect_tool.journal.entries import refused as parse_refused
from bisect_tool.journal.shapes import ShapeError, check_entry, check_header

JOURNAL_NAME = "journal.jsonl"


@dataclass(frozen=True)
class JournalContents:
    header: dict[str, Any]
    entries: tuple[dict[str, Any], ...]
    torn_tail: bool = False

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.entries if e.get("type") == kind]

    @property
    def observed(self) -> tuple[Observed, ...]:
        """The lifetimes, each once (a retried lifetime id is not counted twice), as typed
        values: what the report and the run's checks read."""
        return tuple(parse_observed(e) for e in self.observations)

    @property
    def refused(self) -> tuple[Refused, ...]:
        """The ``untestable`` entries, as typed values."""
        return tuple(parse_refused(e) for e in self.of_type("untestable"))

    @property
    def observations(self) -> list[dict[str, Any]]:
        """The observation entries as the file holds them, each lifetime id once (what a test
        checks, or a run carries into another journal); readers use ``observed``."""
        seen: set[str] = set()
        out = []
        for e in self.of_type("observation"):
            lid = e.get("lifetime_id", "")
            if lid and lid in seen:
                continue  # idempotent lifetime ids: a retried task is not counted twice
            seen.add(lid)
            out.append(e)
        return out

    @property
    def end(self) -> dict[str, Any] | None:
        ends = self.of_type("end")
        return ends[-1] if ends else None


@dataclass
class Journal:
    """Appends entries to ``path`` durably. Use as a context manager."""

    path: Path
    _file: Any = field(default=None, repr=False)
    _seq: int = 0
    _identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the file opened

    def __enter__(self) -> Journal:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._repair_torn_tail()
        except OSError as exc:
            raise StateDirUnusable(
                f"cannot open the journal {self.path} ({exc.strerror or exc}); pass --state-dir "
                "PATH to a folder you can write, or free space there"
            ) from None
        # "a+": appends, and can read back what it wrote if the path loses the file (append)
        self._file = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - closed in __exit__
        opened = os.fstat(self._file.fileno())
        self._identity = (opened.st_dev, opened.st_ino)
        if opened.st_size:
            self._seq = len(read(self.path).entries) + 1  # the header is seq 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):  # a write that failed left data it cannot flush
                self._file.close()
            self._file = None

    def _repair_torn_tail(self) -> None:
        """Make the next entry start on a fresh line. A last line that does not parse (torn
        by a crash mid-write; or ending in a newline but holding zeros) is cut: ``read``
        tolerates it only as the last line, so it must not become a middle one. A last line
        that parses but lacks its newline is whole, and is kept: an editor saves a file so
        when the user follows the tool's own advice to "fix or remove that line" (issue 38:
        it was cut, and a valid entry lost)."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        body = data.rstrip(b"\n")
        start = body.rfind(b"\n") + 1
        if not body[start:].strip():
            return
        whole = _parses(body[start:])
        if whole and data.endswith(b"\n"):
            return
        with open(self.path, "r+b") as fh:
            if whole:  # only its newline is missing
                fh.seek(0, os.SEEK_END)
                fh.write(b"\n")
            else:
                fh.truncate(start)
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        if self._file is None:
            raise StateError("journal is not open")
        # Redacted before it is written: the journal travels with the public report.
        written: dict[str, Any] = redact.value({**entry, "seq": self._seq, "time": time.time()})
        line = json.dumps(written, sort_keys=True, allow_nan=False, default=str)
        # The path must still name the file we opened: deleted (or replaced by another file)
        # during the run, every entry would go to an unlinked inode and the run would end
        # "done" with nothing recorded (issue 30). Stop, and keep what it held.
        try:
            now = os.stat(self.path)
            same = (now.st_dev, now.st_ino) == self._identity
        except OSError:
            same = False
        if not same:
            raise _lost(self.path, self._file, line)
        try:
            self._file.write(line + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            # a full disk: the entry is not recorded (what it said runs again on resume); a
            # part of its line that reached the disk is cut when the journal is next opened
            raise StateDirUnusable(
                f"cannot write the journal {self.path} ({exc.strerror or exc}); free space on "
                "its disk, then `bisect resume`"
            ) from None
        self._seq += 1
        return written


def _parses(line: bytes) -> bool:
    """Whether ``line`` is a whole entry: a JSON object (a torn prefix of one never parses)."""
    try:
        return isinstance(json.loads(line.decode("utf-8")), dict)
    except ValueError:
        return False


def _lost(path: Path, file: Any, line: str) -> JournalLost:
    """The error for a journal whose path lost its file, after saving what the open file held
    (and the entry that could not be written) beside it, so no entry is lost."""
    kept = ""
    try:
        file.flush()
        file.seek(0)
        held = file.read() + line + "\n"
        for n in range(100):  # never over an earlier one
            saved = path.with_name(f"{path.name}.lost{n or ''}")
            try:
                with open(saved, "x", encoding="utf-8") as out:
                    out.write(held)
                    out.flush()
                    os.fsync(out.fileno())
            except FileExistsError:
                continue
            kept = f"; what it held is saved in {saved} (move it to {path} and `bisect resume`)"
            break
    except OSError:
        pass  # the folder itself is gone: say so below
    what = "deleted" if not path.exists() else "replaced by another file"
    return JournalLost(
        f"the journal {path} was {what} while this run wrote it; stopped rather than go on "
        f"without a record{kept or ' (nothing could be saved beside it)'}"
    )


def create(path: Path, header: Mapping[str, Any]) -> None:
    """Write a new journal holding only its header, atomically: a reader never sees a journal
    file without its header line (e.g. `bisect status` racing `bisect start`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = redact.value({**header, "seq": 0, "time": time.time()})
    tmp = path.with_name(path.name + ".new")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, sort_keys=True, allow_nan=False, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise StateDirUnusable(
            f"cannot write the journal in {path.parent} ({exc.strerror or exc}); "
            "pass --state-dir PATH to a folder you can write"
        ) from None


@dataclass
class OpenJournal:
    """A journal a run appends to (``open_journal``): the entries it held when it was opened,
    and its environment entry, written once."""

    journal: Journal
    contents: JournalContents  # as it stood when opened, before this run's entries
    _environment_written: bool = field(default=False, repr=False)

    def append(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        return self.journal.append(entry)

    def environment(self, facts: Callable[[], Mapping[str, Any]]) -> dict[str, Any] | None:
        """The ``environment`` entry of ``facts()``, where it is due: once per journal, once
        the evaluators are open (a run that could not open them records none). The entry
        written; None where the journal holds one already (``facts`` is not called)."""
        if self._environment_written or self.contents.of_type("environment"):
            return None
        written = self.journal.append(environment(facts()))
        self._environment_written = True
        return written


@contextlib.contextmanager
def open_journal(
    path: Path,
    header: Callable[[], Mapping[str, Any]] | None = None,
    keep: Callable[[JournalContents], bool] | None = None,
) -> Iterator[OpenJournal]:
    """The one way a run opens its journal (``bisect start``/``resume``, ``bisect locate``):
    open for appending, with SIGTERM and SIGHUP raising while it is open (a closed terminal or
    SSH session is a SIGHUP; a GPU job's deadline a SIGTERM), so a run stopped from outside
    leaves the way Ctrl-C does.

    With ``header``, a journal that is not there, or one ``keep`` says not to go on with (it
    may raise instead), is first replaced by a new one holding ``header()``; without it the
    journal must exist (``NoSession``)."""
    from bisect_tool.runtime.common import sigterm_raises

    contents = read(path) if header is None or path.exists() else None
    if header is not None and contents is not None and keep is not None and not keep(contents):
        contents = None
    if contents is None:
        assert header is not None
        path.unlink(missing_ok=True)
        create(path, header())
        contents = read(path)
    with Journal(path) as journal, sigterm_raises():
        yield OpenJournal(journal, contents)


def read(path: Path) -> JournalContents:
    """Parse a journal; a torn last line is tolerated, a corrupt line elsewhere is an error.

    Any file at all gives either the journal's contents or a one-line ``StateError`` naming the
    line: not UTF-8, not JSON, JSON of the wrong shape (see ``bisect_tool.journal.entries``)."""
    if not path.exists():
        raise NoSession(f"no bisect session at {path.parent}; start one with `bisect start`")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise StateDirUnusable(f"cannot read {path} ({exc.strerror or exc})") from None
    lines = data.split(b"\n")
    entries: list[dict[str, Any]] = []
    torn = False
    candidates = 0
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        last = number >= len(lines) - 1  # the last line: a crash mid-write may have torn it
        entry = _parse_line(path, number, raw, last, first=not entries)
        if entry is _TORN:
            torn = True
            continue
        if not entries:
            _check_version(path, entry)
        candidates = _check_shape(path, number, entry, candidates, header=not entries)
        entries.append(entry)
    if not entries:
        raise CorruptJournal(f"{path}: not a bisect journal (no header line)")
    return JournalContents(entries[0], tuple(entries[1:]), torn)


#: what ``_parse_line`` returns for a last line that a crash mid-write tore
_TORN = object()


def _parse_line(path: Path, number: int, raw: bytes, last: bool, first: bool) -> Any:
    """Line ``number``'s JSON value, or ``_TORN`` where the last line is not one. ``first``:
    no entry came before it (it must be the header)."""
    try:
        # utf-8-sig: an editor may save the file with a byte-order mark before the header
        return json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
    except UnicodeDecodeError:
        if last:
            return _TORN
        raise CorruptJournal(
            f"{path}:{number}: not UTF-8 text; this is not a bisect journal (or it is "
            "damaged): fix or remove that line, then `bisect resume`"
        ) from None
    except ValueError:
        if first and not last:  # e.g. `bisect replay` of some other file
            raise CorruptJournal(
                f"{path}: not a bisect journal (line {number} is not a journal header); "
                "give the journal.jsonl of a state dir"
            ) from None
        if last:
            return _TORN
        raise CorruptJournal(
            f"{path}:{number}: corrupt journal line; fix or remove it, then `bisect resume`"
        ) from None


def _check_version(path: Path, entry: Any) -> None:
    """The first line is a header of the journal version this tool reads."""
    if not isinstance(entry, dict) or entry.get("type") != "header":
        raise CorruptJournal(f"{path}: not a bisect journal (no header line)")
    version = entry.get("version")
    if version != JOURNAL_VERSION:
        raise CorruptJournal(
            f"{path}: journal version {_shown(version)} is not supported (this tool "
            f"reads {JOURNAL_VERSION}); use the bisect version that wrote it"
        )


def _check_shape(
    path: Path, number: int, entry: Any, candidates: int, header: bool
) -> int:
    """Check line ``number``'s shape (``bisect_tool.journal.entries``); returns how many candidates
    the
    journal lists (the header's count, read from it when ``header``)."""
    try:
        if header:
            return check_header(entry)
        check_entry(entry, candidates)
        return candidates
    except ShapeError as exc:
        raise CorruptJournal(
            f"{path}:{number}: not a journal entry this tool wrote: it {exc}; fix or "
            "remove that line, then `bisect resume`"
        ) from None


def _shown(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 20 else text[:20] + "..."

