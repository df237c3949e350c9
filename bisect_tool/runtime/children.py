"""Children of the tool that a SIGKILL would orphan, findable again from the state dir.

A ``--run`` probe (and a host source build) runs in its own process group so a timeout can kill
all of it; when the tool itself is killed -9 nothing kills that group, and init adopts it. So
each such child carries the session label in its environment from its first instruction
(``BISECT_SESSION``, as the servers do), and its process group and start time are written to
``<state dir>/children/`` right after it is spawned, before the tool waits on it. ``reset`` and
``resume`` end the groups recorded there (and any process labelled with the session) and say how
many.

The start time (``/proc/<pid>/stat`` field 22, clock ticks since boot, with the boot id) guards
against pid reuse: a recorded group is killed only while its leader is the very process recorded,
or while the leader is gone but members of its group live on (Linux does not hand out a pid that
is still some group's id, so those members are ours).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

CHILDREN_DIR = "children"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class ChildRecord:
    pgid: int
    start_ticks: int
    boot_id: str
    host: str
    what: str  # e.g. "--run at 1a2b3c4d5e6f" (for the message only)


def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after its closing one.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])  # field 22 overall; fields[0] is field 3 (state)


def _pgrp(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[2])


def _running_in(groups: Collection[int]) -> list[int]:
    """The processes of ``groups`` that have not died yet (a zombie has: it only waits to be
    reaped by its parent, or by init once that is gone)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in groups and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_gone(groups: Collection[int], timeout_s: float = 10.0) -> bool:
    """Wait until every process of ``groups`` (already sent SIGKILL) has died: a signal is
    delivered when its target next runs, not when ``kill`` returns. False if some still run
    after ``timeout_s`` (in uninterruptible sleep: stuck in the kernel, e.g. on a dead NFS)."""
    deadline = time.monotonic() + timeout_s
    while _running_in(groups):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


class Registry:
    """The state dir's record of live child process groups."""

    def __init__(self, state_dir: Path) -> None:
        self.folder = Path(state_dir) / CHILDREN_DIR

    def _path(self, pgid: int) -> Path:
        return self.folder / f"{pgid}.json"

    def record(self, pgid: int, what: str) -> None:
        ticks = start_ticks(pgid)
        if ticks is None:
            return  # already gone: nothing left to find later
        rec = ChildRecord(pgid, ticks, _boot_id(), socket.gethostname(), what)
        tmp = self._path(pgid).with_suffix(".new")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(asdict(rec)))
            os.replace(tmp, self._path(pgid))
        except OSError:
            # a full disk: the probe's shepherd still ends it with the tool; the journal's
            # next entry says the disk is full
            tmp.unlink(missing_ok=True)

    def forget(self, pgid: int) -> None:
        with contextlib.suppress(OSError):
            self._path(pgid).unlink()

    def records(self) -> list[ChildRecord]:
        found = []
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            try:
                found.append(ChildRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError):
                path.unlink(missing_ok=True)
        return found

    @contextlib.contextmanager
    def tracked(self, pgid: int, what: str) -> Iterator[None]:
        """Recorded while inside; forgotten once the caller has reaped the group."""
        self.record(pgid, what)
        try:
            yield
        finally:
            self.forget(pgid)

    def end_orphans(self) -> set[int]:
        """SIGKILL every recorded group that is still ours and alive; the groups ended."""
        ended = set()
        boot, host = _boot_id(), socket.gethostname()
        for rec in self.records():
            if rec.host == host and rec.boot_id == boot and _still_ours(rec) and _kill(rec.pgid):
                ended.add(rec.pgid)
            self.forget(rec.pgid)
        return ended


def _still_ours(rec: ChildRecord) -> bool:
    ticks = start_ticks(rec.pgid)
    if ticks is not None:
        return ticks == rec.start_ticks and _pgrp(rec.pgid) == rec.pgid
    return bool(_group_members(rec.pgid))


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _pgrp(int(entry.name)) == pgid:
            members.append(int(entry.name))
    return members


def _kill(pgid: int) -> bool:
    # a process caught while it exits reads as group -1 in /proc/PID/stat (seen under load:
    # os.killpg(-1) raised EINVAL out of a lifetime that had ended well)
    if pgid <= 1 or pgid == os.getpgrp():
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:  # gone (ESRCH), not ours (EPERM), or no such group (EINVAL)
        return False
    return True


def end_labelled(session: str, keep: Collection[int] = ()) -> int:
    """SIGKILL the process groups whose members carry ``BISECT_SESSION=session`` (a --run probe
    whose group record was lost); how many groups."""
    from bisect_tool.labels import ENV_SESSION
    from bisect_tool.runtime.local import pids_with_env

    groups = set()
    for pid in pids_with_env(ENV_SESSION, session):
        group = _pgrp(pid)
        if group is not None and group not in keep:
            groups.add(group)
    return sum(1 for g in groups if _kill(g))


def end_carrying(label: Mapping[str, str]) -> set[int]:
    """SIGKILL the process groups of the processes whose environment carries every entry of
    ``label`` (a probe's members that left its process group: ``setsid``, a daemon); the groups.
    The tool's own group is never one of them."""
    from bisect_tool.runtime.local import pids_with_env

    if not label:
        return set()
    wanted = {f"{k}={v}".encode() for k, v in label.items()}
    name, value = next(iter(label.items()))
    groups = set()
    for pid in pids_with_env(name, value):
        try:
            env = set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        group = _pgrp(pid)
        if wanted <= env and group is not None:
            groups.add(group)
    return {g for g in groups if _kill(g)}


def end_all(state_dir: Path, session: str) -> int:
    """Everything a killed run of ``session`` left running: recorded groups, then labelled ones."""
    ended = Registry(state_dir).end_orphans()
    # A group just killed may still be listed (dying); it is not a second one.
    return len(ended) + (end_labelled(session, keep=ended) if session else 0)
