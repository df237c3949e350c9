"""A Ctrl-C (or SIGTERM/SIGHUP) that lands inside a finalizer is delivered again once it is over.

Python runs a signal's handler in the main thread between two bytecodes, wherever that thread
is, finalizers included: ``subprocess.Popen.__del__`` runs at the end of every
``subprocess.run`` (``git worktree add`` as a lifetime starts), and the garbage collector may
run any ``__del__`` or weakref callback at any allocation. An exception raised there cannot
propagate: Python prints "Exception ignored in: <function Popen.__del__ ...>" with a traceback
and goes on. A Ctrl-C that landed there was lost, and ``bisect start`` ran on, lifetime after
lifetime (CI: `bisect start --run 'sleep 30; ...'` did not end within 120 s of its Ctrl-C).

So while the tool runs, SIGINT's handler does not raise inside a finalizer (a ``__del__`` frame,
a ``weakref.finalize`` callback, or the unraisable hook below on the stack): it asks for the
signal again 10 ms later, and the handler then in place (this one, ``signals_deferred``'s, the
SIGTERM handler) acts on it outside. The finalizers it cannot tell apart (a weakref callback of
its own, a generator closed by the collector) still swallow the exception: ``sys.unraisablehook``
sees it, prints nothing (no traceback: the CLI says one line), and asks for the signal again.
Stdlib only: installed before the CLI's imports.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

#: how long after a signal that landed in a finalizer it is delivered again
AGAIN_S = 0.01

_pipe: tuple[int, int] | None = None
_lock = threading.Lock()
#: signals asked for again: their handler acts on them even if it already fired once
_owed: set[int] = set()
_previous_hook: Any = None


def in_finalizer(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside a finalizer, where an exception would be dropped."""
    while frame is not None:
        code = frame.f_code
        if (
            code.co_name == "__del__"
            or code is _hook.__code__
            or (code.co_name == "__call__" and code.co_filename.endswith("weakref.py"))
        ):
            return True
        frame = frame.f_back
    return False


def again(signum: int) -> None:
    """Deliver ``signum`` to the main thread again shortly (a real signal: it also ends a wait
    in a system call). Safe in a signal handler and a finalizer: one write to a pipe."""
    if _pipe is None:
        return
    _owed.add(signum)
    with contextlib.suppress(OSError):  # a full pipe: one is on its way already
        os.write(_pipe[1], bytes([signum]))


def owed(signum: int) -> bool:
    """Whether this delivery of ``signum`` is one asked for again (once; the flag is cleared)."""
    if signum in _owed:
        _owed.discard(signum)
        return True
    return False


def _deliver(read_fd: int, main: int) -> None:
    while True:
        try:
            got = os.read(read_fd, 64)
        except OSError:
            return
        if not got:
            return
        time.sleep(AGAIN_S)  # the finalizer is over by then (else the handler asks again)
        for signum in dict.fromkeys(got):
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(main, signum)


def on_sigint(signum: int, frame: FrameType | None) -> None:
    """Python's own Ctrl-C handling (``KeyboardInterrupt``), but never inside a finalizer."""
    if in_finalizer(frame):
        again(signum)
        return
    _owed.discard(signum)
    raise KeyboardInterrupt


def _hook(unraisable: Any) -> None:
    exc = unraisable.exc_value
    if isinstance(exc, KeyboardInterrupt):
        again(signal.SIGINT)
        return
    signum = getattr(exc, "signum", None)
    if isinstance(signum, int):  # the SIGTERM/SIGHUP handler's Interrupted
        again(signum)
        return
    (_previous_hook or sys.__unraisablehook__)(unraisable)


def install() -> None:
    """From here on (main thread; once): a signal dropped by a finalizer is delivered again.
    SIGINT's handler becomes ``on_sigint`` where it was Python's own (an ignored SIGINT stays
    ignored; ``__main__`` puts it in place after the imports)."""
    global _pipe, _previous_hook
    with _lock:
        if _pipe is not None or threading.current_thread() is not threading.main_thread():
            return
        _pipe = os.pipe()
        os.set_inheritable(_pipe[0], False)
        os.set_inheritable(_pipe[1], False)
        threading.Thread(
            target=_deliver, args=(_pipe[0], threading.get_ident()),
            name="bisect-signal-again", daemon=True,
        ).start()
        _previous_hook = sys.unraisablehook
        sys.unraisablehook = _hook
        # `kill -USR1 <pid>` prints where every thread of a run is, to stderr (a run that did
        # not end after its SIGHUP in CI, once, with no trace of where it waited)
        with contextlib.suppress(AttributeError, ValueError, OSError):
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, on_sigint)
