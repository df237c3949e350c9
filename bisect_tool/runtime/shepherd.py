"""The parent of one probe: it outlives nothing the probe started. Run as a script, stdlib only.

    python -I -S shepherd.py TOOL_PID -- ARGV...

A probe's children are found the way the kernel keeps them, not by their environment (issue 38:
a daemon that cleared it, ``env -i setsid sh -c ...``, outlived the run and ``bisect reset``).
This process makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux 3.4): every
process the probe starts that loses its parent (a double fork, ``setsid``, a daemon) is given to
it instead of to init, so all of them stay its descendants whatever they do to their session,
process group or environment. It runs ARGV, waits for it, then SIGKILLs every descendant left
and reaps them, and exits as ARGV did (its code, or its signal).

The tool (``runprobe.run_group``) starts it as the leader of the probe's process group. A
SIGTERM, SIGINT or SIGHUP to it (the tool's timeout or Ctrl-C) ends ARGV and every descendant
the same way. So does the tool's death, even by SIGKILL: the kernel sends it SIGTERM then
(``prctl(PR_SET_PDEATHSIG)``).

Not Linux (no ``prctl``): ARGV runs as a plain child, and what leaves its tree is found only by
the process group and the lifetime's label, as before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: rounds of "kill what is left, reap it": each round also takes the children of the last
_ROUNDS = 200


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _prctl(option: int, value: int) -> bool:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """The live processes below ``root`` (zombies left out: they are only reaped)."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in (b"Z", b"X"):
            kids.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for kid in kids.get(todo.pop(), ()):
            found.append(kid)
            todo.append(kid)
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_descendants() -> None:
    """SIGKILL every descendant, reap them; again until none is left (a process killed may
    leave children, which come to us)."""
    me = os.getpid()
    for _ in range(_ROUNDS):
        left = descendants(me)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _reap()
    _reap()


def _exit_as(status: int) -> None:
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        with contextlib.suppress(ImportError, OSError, ValueError):
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core of our own
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.waitstatus_to_exitcode(status))


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: shepherd.py TOOL_PID -- ARGV...\n")
        os._exit(2)
    tool, command = int(argv[0]), argv[2:]

    def stop(signum: int, _frame: object) -> None:
        raise _Stop(signum)

    for sig in _ENDING:
        signal.signal(sig, stop)
    # Python ignores these at its start, and an ignored signal stays ignored across exec: the
    # probe would see EPIPE where a shell pipeline expects to die by SIGPIPE (as subprocess's
    # restore_signals does)
    for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        if _prctl(PR_SET_PDEATHSIG, signal.SIGTERM) and os.getppid() != tool:
            raise _Stop(signal.SIGTERM)  # the tool died before the death signal was set
        try:
            probe = os.posix_spawnp(command[0], command, os.environ)
        except OSError as exc:
            sys.stderr.write(f"{command[0]}: {exc.strerror}\n")
            os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
        while True:
            pid, status = os.waitpid(-1, 0)  # orphans handed to us are reaped as they end
            if pid == probe:
                break
    except _Stop as stopped:
        for sig in _ENDING:
            signal.signal(sig, signal.SIG_IGN)
        end_descendants()
        os._exit(128 + stopped.signum)
    for sig in _ENDING:
        signal.signal(sig, signal.SIG_IGN)
    end_descendants()
    _exit_as(status)


if __name__ == "__main__":
    main(sys.argv[1:])
