"""Running a probe command, and what its exit says about the command itself.

``run_group`` runs one probe (a ``--run`` command, the op check's child) as its own process
group, ends the whole group when the probe returns, keeps only a bounded tail of its output in
memory and streams the rest to its log file (issue 30: a background child hung a lifetime for
11 minutes; a probe printing 300 MB took the tool to 1.45 GB).

``exit_problem``: ``git bisect run`` counts 1..127 (but 125) as bad, and so does this tool; but
an exit 126 or 127 with the shell's own "command not found" / "Permission denied" line means
the command never ran: most often a relative path such as ``bash ../probe.sh``, which resolves
against the candidate's temporary worktree, not the directory the user typed it in. Counted as
bad, every commit is "bad" and the search names a first bad commit with high confidence. So
these abort, with one line naming the path as the worktree sees it. A plain ``exit 127`` (no such
line) is the probe's own answer: bad, like any other code from 1 to 127 but 125.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from bisect_tool.errors import InfrastructureError

if TYPE_CHECKING:
    from bisect_tool.redact import LineRedactor

NOT_EXECUTABLE = 126
NOT_FOUND = 127

# The shell's own line when it could not run a command, and nothing else: "bash: line 1: nope:
# command not found", "bash: ../p.sh: No such file or directory", "bash: line 1: ./f: Permission
# denied", "sh: 1: nope: not found" (dash), "./probe.sh: line 3: nope: command not found",
# "/usr/bin/env: 'python9': No such file or directory". A probe's own "cat: x: No such file or
# directory" before its own `exit 127` is not one: that exit is the probe's answer.
_SHELL_ERROR = re.compile(
    r"^(?P<who>[\w./-]*\b(?:bash|sh|dash|env)(?:: line \d+|: \d+)?|[^:\n]+: line \d+): "
    r"(?:exec: )?['`\u2018]?(?P<path>[^:'`\u2018\u2019\n]+?)['`\u2019]?: "
    r"(?P<why>No such file or directory|command not found|Permission denied|Is a directory"
    r"|cannot execute[^\n]*|not found)\s*$",
    re.MULTILINE,
)
# which of those lines goes with which exit status
_WHY_NOT_FOUND = ("No such file or directory", "command not found", "not found")
_WHY_NOT_EXECUTABLE = ("Permission denied", "Is a directory", "cannot execute")


def banner(cwd: Path, commit: str) -> str:
    """The first line of the first lifetime's log: where relative paths resolve."""
    return (
        f"bisect: --run runs in {cwd} (a temporary worktree of {commit[:12]}, not your "
        "checkout); relative paths in the command resolve from there"
    )


def exit_problem(code: int, output: str, command: str, cwd: Path, commit: str) -> str | None:
    """The abort message for an exit that says the command could not run, else None.

    127 with the shell's "command not found" / "No such file or directory" line is a command or
    script that is not there; 126 with its "Permission denied" / "cannot execute" line is one
    that cannot be executed. The same codes without such a line are what the probe itself
    chose (``exit 127``): a bad verdict, as in ``git bisect run``."""
    if code == NOT_FOUND:
        reasons = _WHY_NOT_FOUND
    elif code == NOT_EXECUTABLE:
        reasons = _WHY_NOT_EXECUTABLE
    else:
        return None
    matches = [m for m in _SHELL_ERROR.finditer(output) if m.group("why").startswith(reasons)]
    if not matches:
        return None
    last = matches[-1]
    named, why = last.group("path").strip(), last.group("why")
    what = "not executable" if code == NOT_EXECUTABLE else "not found"
    head = f"--run command exited {code} ({what}) at {commit[:12]}"
    looked_up = why in ("command not found", "not found") or last.group("who").endswith("env")
    if "/" not in named and looked_up:  # a name looked up on PATH, not a path
        return (
            f"{head}: `{named}` is not a command on PATH (the shell said \"{why}\"); fix the "
            "command (it never ran, so this is not counted as bad)"
        )
    seen = (cwd / named).resolve() if not Path(named).is_absolute() else Path(named)
    fix = (
        "make it executable (chmod +x) or run it through its interpreter"
        if code == NOT_EXECUTABLE and seen.exists()
        else "give an absolute path"
    )
    return (
        f"{head}: `{named}` is {seen} as the candidate's worktree sees it"
        f"{'' if seen.exists() else ', which does not exist'} (the command runs in a temporary "
        f"worktree of each commit, not in your checkout); {fix}"
    )


# ---- running one probe as a process group ------------------------------------------------------

#: what is kept in memory of a probe's output (the rest goes only to its log file)
TAIL_BYTES = 64 * 1024
#: how long the pipes are read after the group is ended (a member that left the group and
#: dropped the label may hold them open; it is not waited for longer)
DRAIN_S = 5.0
_CHUNK = 65536


#: how long a shepherd asked to stop (a timeout, Ctrl-C) has to end what the probe started
SHEPHERD_GRACE_S = 5.0
#: the probe's parent that keeps every process it starts findable
#: (``bisect_tool.runtime.shepherd``);
#: None where the kernel cannot (not Linux)
_SHEPHERD: Path | None = (
    Path(__file__).with_name("shepherd.py") if sys.platform.startswith("linux") else None
)


def shepherded(argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """``argv`` run under the shepherd: a child subreaper that ends every process the probe
    started, however it left the probe's session, group or environment, before it exits. A
    program that cannot be run raises here, as ``Popen`` of it would."""
    if _SHEPHERD is None:
        return list(argv)
    program = argv[0]
    path = (env if env is not None else os.environ).get("PATH", os.defpath)
    if shutil.which(program, path=path) is None:
        if "/" in program and os.path.exists(program):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    return [sys.executable, "-I", "-S", str(_SHEPHERD), str(os.getpid()), "--", *argv]


@dataclass(frozen=True)
class Finished:
    """How one probe's process group ended. ``code`` is the leader's exit status (``-N``: killed
    by signal N), None when it ran past its timeout (then the group was killed)."""

    code: int | None
    output: str  # the last TAIL_BYTES of its stdout (with stderr, when merged)
    errors: str = ""  # the last TAIL_BYTES of its stderr, when kept apart
    printed: int = 0  # bytes it printed in all
    kept: int = 0  # bytes of them in ``output`` and ``errors``
    log: Path | None = None  # where all of it went (redacted), when asked

    @property
    def timed_out(self) -> bool:
        return self.code is None


class _Tail:
    """The last ``limit`` bytes of a stream, and how many it had in all."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.data += chunk
        if len(self.data) > 2 * self.limit:  # trimmed in steps: no copy per chunk
            del self.data[: -self.limit]

    def text(self) -> str:
        return bytes(self.data[-self.limit :]).decode(errors="replace")


def run_group(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    log: Path | None = None,
    merge_stderr: bool = True,
    log_header: str = "",
    track: Callable[[int], AbstractContextManager[object]] | None = None,
    label: Mapping[str, str] | None = None,
    tail_bytes: int = TAIL_BYTES,
) -> Finished:
    """Run ``argv`` as its own session and process group; end the whole group when the leader
    exits, times out, or the caller is interrupted (Ctrl-C, SIGTERM/SIGHUP turned into an
    exception by ``sigterm_raises``); return once nothing of it runs.

    Why not ``Popen.communicate``: it waits for EOF on the pipe, and a background child
    (``(sleep 321 &)``) that holds the pipe keeps it open: the lifetime lasted until the child
    exited (issue 30). Here the leader's exit ends the wait, the group is SIGKILLed, and the
    pipes are read only until the group is gone. Memory is bounded: only the last
    ``tail_bytes`` of each stream are kept, all of it streams to ``log`` (redacted) when given.

    ``track(pgid)`` (e.g. ``children.Registry.tracked``) is held from the spawn until the group
    is reaped, so a ``kill -9`` of the tool still leaves the group findable. ``label``: entries
    of ``env`` unique to this run; a process that carries them all but left the group (``setsid``,
    a daemon) is ended too. The leader is not reaped before its group is killed, so its pid (the
    group id) cannot be reused by an unrelated process while we signal the group.
    """
    from bisect_tool import redact

    sink = _open_log(log, log_header)
    try:
        proc = subprocess.Popen(
            shepherded(argv, env),
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,  # unattended: a probe that reads stdin must not wait on us
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,
        )
    except BaseException:
        if sink is not None:
            sink.close()
        raise
    streams: dict[int, tuple[_Tail, redact.LineRedactor]] = {}
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            os.set_blocking(pipe.fileno(), False)
            streams[pipe.fileno()] = (_Tail(tail_bytes), redact.LineRedactor())

    take = _taker(streams, sink, log)
    exited = False
    try:
        with track(proc.pid) if track is not None else contextlib.nullcontext():
            try:
                exited = _read_until_exit(proc.pid, streams, take, timeout_s)
            finally:
                _end_group(proc, label, exited)
        _drain(streams, take)  # what it wrote before the group was ended
    finally:
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        if sink is not None:
            _close_log(sink, streams)
    tails = [tail for tail, _ in streams.values()]
    out = tails[0]
    err = tails[1] if len(tails) > 1 else None
    return Finished(
        proc.returncode if exited else None,
        out.text(),
        err.text() if err is not None else "",
        sum(t.total for t in tails),
        sum(min(len(t.data), t.limit) for t in tails),
        log,
    )


def _open_log(log: Path | None, header: str) -> BinaryIO | None:
    """``log`` opened to append to, ``header`` written first (redacted); None without one."""
    from bisect_tool import redact

    if log is None:
        return None
    sink = None
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        sink = log.open("ab")
        if header:
            sink.write(redact.text(header.rstrip("\n") + "\n").encode())
    except OSError as exc:  # the disk is full: a failure of the machine, not the probe
        if sink is not None:
            with contextlib.suppress(OSError):
                sink.close()
        raise InfrastructureError(
            f"cannot write the probe's log {log} ({exc.strerror or exc}); free space "
            "there, then `bisect resume`"
        ) from None
    return sink


def _taker(
    streams: Mapping[int, tuple[_Tail, LineRedactor]], sink: BinaryIO | None, log: Path | None
) -> Callable[[int], bool]:
    """What reads a pipe: its tail kept, all of it to ``sink`` (redacted) when given."""

    def take(fd: int) -> bool:
        """Read what ``fd`` has; False at its EOF."""
        try:
            chunk = os.read(fd, _CHUNK)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        tail, redactor = streams[fd]
        tail.add(chunk)
        if sink is not None:
            try:
                sink.write(redactor.feed(chunk))
            except OSError as exc:  # the disk is full: a failure of the machine, not the probe
                raise InfrastructureError(
                    f"cannot write the probe's log {log} ({exc.strerror or exc}); free space "
                    "there, then `bisect resume`"
                ) from None
        return True

    return take


def _close_log(sink: BinaryIO, streams: Mapping[int, tuple[_Tail, LineRedactor]]) -> None:
    """What the redactors still hold written, then the log closed."""
    with contextlib.suppress(OSError, ValueError):
        for _, redactor in streams.values():
            sink.write(redactor.flush())
    with contextlib.suppress(OSError):  # a full disk: said by what fails next
        sink.close()


def _read_until_exit(
    pid: int,
    streams: Mapping[int, object],
    take: Callable[[int], bool],
    timeout_s: float | None,
) -> bool:
    """Copy the pipes until the leader exits (True; left unreaped) or the timeout (False)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        exit_fd: int | None = os.pidfd_open(pid)  # readable once the process has exited
    except (AttributeError, OSError):  # not Linux >= 5.3: look every 50 ms instead
        exit_fd = None
    open_fds = set(streams)
    try:
        with selectors.DefaultSelector() as sel:
            for fd in open_fds:
                sel.register(fd, selectors.EVENT_READ)
            if exit_fd is not None:
                sel.register(exit_fd, selectors.EVENT_READ)
            while True:
                if _exited(pid):
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                wait = left if exit_fd is not None else min(0.05, left or 0.05)
                for key, _ in sel.select(wait):
                    if key.fd in open_fds and not take(key.fd):
                        sel.unregister(key.fd)  # it closed its output but may run on
                        open_fds.discard(key.fd)
    finally:
        if exit_fd is not None:
            os.close(exit_fd)


def _exited(pid: int) -> bool:
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _end_group(
    proc: subprocess.Popen[bytes], label: Mapping[str, str] | None, exited: bool
) -> None:
    """End all of the probe: a leader that has not exited (a timeout, Ctrl-C) is first asked to
    end its descendants (SIGTERM: the shepherd SIGKILLs every one, wherever it went); then the
    group is SIGKILLed, the leader reaped, the members that left the group but carry the label
    ended, and all of them waited for. Ctrl-C is held back meanwhile: a second one must not
    leave half of it running."""
    from bisect_tool.runtime.children import end_carrying, wait_gone
    from bisect_tool.runtime.common import signals_deferred

    with signals_deferred():
        if not exited and _SHEPHERD is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + SHEPHERD_GRACE_S
            while not _exited(proc.pid) and time.monotonic() < deadline:
                time.sleep(0.005)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        groups = {proc.pid, *(end_carrying(label) if label else ())}
        wait_gone(groups)  # nothing of it runs once we return


def _drain(streams: Mapping[int, object], take: Callable[[int], bool]) -> None:
    """Read what the ended group left in the pipes, up to their EOF (bounded by DRAIN_S)."""
    deadline = time.monotonic() + DRAIN_S
    open_fds = set(streams)
    with selectors.DefaultSelector() as sel:
        for fd in open_fds:
            sel.register(fd, selectors.EVENT_READ)
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for key, _ in sel.select(left):
                if not take(key.fd):
                    sel.unregister(key.fd)
                    open_fds.discard(key.fd)
