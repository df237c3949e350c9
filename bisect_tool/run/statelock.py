"""One bisect per state dir: an exclusive lock held for as long as a command writes the journal.

Without it two ``start`` (or a ``resume`` beside a live run) both append to one journal: seq
numbers and lifetime ids repeat, and one run's lifetimes are lost. The lock is a ``filelock``
(an ``flock`` on Linux), so the kernel drops it when its holder dies, even by SIGKILL; beside it
``lock.holder`` names the holder (pid, host, start time) so a refused command can say who runs,
and a later command can say it took over the lock of a process that is gone.

Holder info is a separate file because opening a lock file may truncate it (filelock versions
differ), which would wipe the live holder's pid when a second process merely tries.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from bisect_tool.errors import LockHeld, StateDirUnusable
from bisect_tool.run import statedir
from bisect_tool.run.statedir import HOLDER_NAME, LOCK_NAME

__all__ = ["HOLDER_NAME", "LOCK_NAME", "Holder", "ensure_dir", "hold", "live_holder",
           "read_holder"]


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    started: float
    command: str = ""

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on {self.host}, since {since}"


def ensure_dir(state_dir: Path) -> None:
    """Create the state dir (marked as the tool's: ``statedir.make``), or say in one line why
    it cannot be (a file, no permission)."""
    statedir.make(state_dir)
    if not state_dir.is_dir():
        raise StateDirUnusable(
            f"--state-dir {state_dir} is not a folder; pass a folder you can write"
        )
    if not os.access(state_dir, os.W_OK | os.X_OK):
        raise StateDirUnusable(
            f"the state dir {state_dir} is not writable; pass --state-dir PATH to a folder "
            "you can write"
        )


def read_holder(state_dir: Path) -> Holder | None:
    """Who last held the lock (alive or not), or None."""
    try:
        data = json.loads((state_dir / HOLDER_NAME).read_text())
        return Holder(
            int(data["pid"]), str(data["host"]), float(data["started"]), str(data.get("command")
                                                                             or "")
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def live_holder(state_dir: Path) -> Holder | None:
    """The process holding the lock now, or None when nobody does (probing takes it briefly)."""
    from filelock import FileLock, Timeout

    lock_path = state_dir / LOCK_NAME
    if not lock_path.exists():
        return None
    lock = FileLock(str(lock_path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return read_holder(state_dir) or Holder(0, "?", 0.0)
    except OSError:
        return None
    lock.release()
    return None


@contextmanager
def hold(
    state_dir: Path, command: str = "", notice: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold the state dir's lock while inside; refuse at once (one line naming the running pid)
    when another process holds it. A holder file left by a dead process is taken over, and
    ``notice`` says so in one line."""
    from filelock import FileLock, Timeout

    ensure_dir(state_dir)
    lock = FileLock(str(state_dir / LOCK_NAME), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = read_holder(state_dir)
        who = holder.describe() if holder else "another process"
        kill = f" (kill {holder.pid})" if holder and holder.pid else ""
        raise LockHeld(
            f"a bisect is running in {state_dir}: {who}; wait for it, or stop it{kill} and "
            "`bisect resume`"
        ) from None
    except OSError as exc:
        raise StateDirUnusable(
            f"cannot lock the state dir {state_dir} ({exc.strerror or exc}); "
            "pass --state-dir PATH to a folder you can write"
        ) from None
    try:
        previous = read_holder(state_dir)
        if previous is not None and previous.pid != os.getpid() and notice is not None:
            notice(
                f"took over the lock of {previous.describe()}, which is no longer running"
            )
        me = Holder(os.getpid(), socket.gethostname(), time.time(), command)
        tmp = state_dir / (HOLDER_NAME + ".new")
        try:
            tmp.write_text(json.dumps(me.__dict__))
            os.replace(tmp, state_dir / HOLDER_NAME)
        except OSError as exc:  # a full disk: one line, not a traceback (issue 38)
            with suppress(OSError):
                tmp.unlink()
            raise StateDirUnusable(
                f"cannot write in the state dir {state_dir} ({exc.strerror or exc}); free "
                "space there, or pass --state-dir PATH to another folder"
            ) from None
        yield
    finally:
        # The holder file goes first: whoever takes the lock next must not read us as stale.
        with suppress(OSError):
            if (read_holder(state_dir) or Holder(0, "", 0)).pid == os.getpid():
                (state_dir / HOLDER_NAME).unlink()
        lock.release()
