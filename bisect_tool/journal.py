"""The journal: an append-only, versioned JSONL file; resume is replay.

Every entry is one JSON object on one line, written and fsynced before the next step, so a crash
loses at most the entry being written; a torn last line (crash mid-write) is skipped on read.

Entry types (``"type"``):
- ``header``   (first line) version, session id, repo, good/bad refs and SHAs, direction, the
  ordered candidate list (``candidates``: old end first, new end last, both ends included, each
  ``{"sha", "subject", "pr", "tags"}``), the recipe as a dict, tool version, command line, start.
- ``observation`` one lifetime: seq, lifetime_id, commit, position, verdict, detail, message,
  duration_s, time. A lifetime id is recorded once: replay ignores a repeated id.
- ``untestable`` a whole candidate: commit, position, message (no artifact, build/boot failure,
  incompatible ops).
- ``controls`` the positive and negative controls: positive, negative (ProbeResult dicts), ok,
  problem.
- ``environment`` facts for the report (GPU, driver, versions...).
- ``end`` state (done, bad_end_never_reproduced, budget_exhausted, no_candidate_left, aborted,
  controls_failed) and the summary at that point.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_tool.errors import StateError

JOURNAL_VERSION = 1
JOURNAL_NAME = "journal.jsonl"


@dataclass(frozen=True)
class JournalContents:
    header: dict[str, Any]
    entries: tuple[dict[str, Any], ...]
    torn_tail: bool = False

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.entries if e.get("type") == kind]

    @property
    def observations(self) -> list[dict[str, Any]]:
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

    def __enter__(self) -> Journal:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in __exit__
        if self.path.stat().st_size:
            self._seq = len(read(self.path).entries) + 1  # the header is seq 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _repair_torn_tail(self) -> None:
        """Cut a torn last line so the next entry starts on a fresh line. A last line that
        ends in a newline but does not parse (a crash can leave zeros) is cut too: ``read``
        tolerates it only as the last line, so it must not become a middle one."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        body = data.rstrip(b"\n")
        start = body.rfind(b"\n") + 1
        torn = bool(data) and not data.endswith(b"\n")
        if not torn and body:
            try:
                json.loads(body[start:])
            except ValueError:
                torn = True
        if torn:
            cut = start
            with open(self.path, "r+b") as fh:
                fh.truncate(cut)
                fh.flush()
                os.fsync(fh.fileno())

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        if self._file is None:
            raise StateError("journal is not open")
        entry = {**entry, "seq": self._seq, "time": time.time()}
        line = json.dumps(entry, sort_keys=True, allow_nan=False, default=str)
        self._file.write(line + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._seq += 1
        return entry


def create(path: Path, header: dict[str, Any]) -> None:
    """Write a new journal holding only its header, atomically: a reader never sees a journal
    file without its header line (e.g. `bisect status` racing `bisect start`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {**header, "seq": 0, "time": time.time()}
    tmp = path.with_name(path.name + ".new")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True, allow_nan=False, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read(path: Path) -> JournalContents:
    """Parse a journal; a torn last line is tolerated, a corrupt line elsewhere is an error."""
    if not path.exists():
        raise StateError(f"no bisect session at {path.parent}; start one with `bisect start`")
    lines = path.read_text(encoding="utf-8").split("\n")
    entries: list[dict[str, Any]] = []
    torn = False
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            if number >= len(lines) - 1:  # the last line: a crash mid-write
                torn = True
                continue
            raise StateError(
                f"{path}:{number}: corrupt journal line; fix or remove it, then `bisect resume`"
            ) from None
    if not entries or entries[0].get("type") != "header":
        raise StateError(f"{path}: not a bisect journal (no header line)")
    version = entries[0].get("version")
    if version != JOURNAL_VERSION:
        raise StateError(
            f"{path}: journal version {version} is not supported (this tool reads "
            f"{JOURNAL_VERSION}); use the bisect version that wrote it"
        )
    return JournalContents(entries[0], tuple(entries[1:]), torn)


def iter_entries(path: Path) -> Iterator[dict[str, Any]]:
    contents = read(path)
    yield contents.header
    yield from contents.entries
