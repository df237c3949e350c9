"""Pieces both backends share: ports, readiness, log tails, signals, the package-location query.

Why each exists:
- a lifetime is one fresh server, so every boot needs a free loopback port (never another
  address: DESIGN.md keeps all traffic on 127.0.0.1);
- a server that dies before /health must fail fast with its log tail (testcontainers' habit),
  not after the whole boot deadline;
- SIGTERM and SIGHUP (a closed terminal or SSH session) to the tool must tear lifetimes down
  like Ctrl-C does, so they are turned into an exception that unwinds the context managers.
"""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import httpx

from bisect_tool import interrupts
from bisect_tool.errors import BootFailed, Interrupted
from bisect_tool.interfaces import ServerHandle

LOOPBACK = "127.0.0.1"
#: boots of one lifetime when the server lost the race for its port
PORT_ATTEMPTS = 3

# Printed by a server that lost the race for its port (we pick it, then it binds): boot again.
_PORT_TAKEN = ("address already in use", "errno 98", "eaddrinuse")

#: The folder the pinned interpreter is asked from (where its package lives, its versions, the
#: plan's checks): never the caller's. ``python -c`` puts the working folder first on sys.path,
#: so inside a vLLM clone it would find the clone's uncompiled package before the pinned one
#: (issue 41: `bisect plan` run in the clone said "ready", and `start` then failed at once).
NEUTRAL_CWD = "/"


# Asked of the pinned interpreter: where a package lives, without importing it (importing vLLM
# takes ~20 s and may touch CUDA; find_spec only searches sys.path).
PACKAGE_DIR_SCRIPT = (
    "import importlib.util, os, sys\n"
    "spec = importlib.util.find_spec(sys.argv[1])\n"
    "if spec is None:\n"
    "    sys.exit('package not found: ' + sys.argv[1])\n"
    "locs = list(spec.submodule_search_locations or [])\n"
    "print(locs[0] if locs else os.path.dirname(spec.origin))\n"
)


@dataclass(frozen=True)
class RunningServer(ServerHandle):
    """A ``ServerHandle`` that can also say whether the server is still up (for the probe)."""

    alive: Callable[[], bool] = field(default=lambda: True, compare=False, repr=False)

    def is_alive(self) -> bool:
        return self.alive()


def free_port() -> int:
    """A port free on loopback right now (the OS picks it; the server may still lose a race)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def port_taken(log_text: str) -> bool:
    low = log_text.lower()
    return any(marker in low for marker in _PORT_TAKEN)


def tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


# vLLM's processes prefix each line with "(APIServer pid=4217)"; pydantic ends its errors with a
# link line. Neither says what failed.
_PROCESS_PREFIX = re.compile(r"^\(\w+ pid=\d+\)\s*")
_NOT_A_CAUSE = re.compile(r"^(For further information visit|File \"|\^+$|Traceback )")
_CAUSE = re.compile(r"error|exception|failed|cannot|could not|not found|killed", re.IGNORECASE)


def likely_cause(log_tail: str, limit: int = 200) -> str:
    """The one line of a dead server's log tail that most likely says why: the last line that
    names an error (vLLM 0.27.0 on torch 2.11 ends with pydantic's link line, two lines below
    "Model architectures ['Qwen3ForCausalLM'] failed to be inspected"), else the last line."""
    lines = [_PROCESS_PREFIX.sub("", x).strip() for x in log_tail.splitlines()]
    lines = [x for x in lines if x]
    if not lines:
        return ""
    candidates = [x for x in lines if not _NOT_A_CAUSE.match(x)]
    found = next((x for x in reversed(candidates) if _CAUSE.search(x)), lines[-1])
    return found if len(found) <= limit else found[: limit - 3] + "..."


#: vLLM names the attention backend it chose once per process at boot: "Using FLASH_ATTN attention
#: backend out of potential backends: ['FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION']."
#: (vllm/platforms/cuda.py, get_attn_backend_cls; seen on the H100, docs/bench/
#: gpu-2026-12-07-h100/record.tgz); older V1 engines said "Using Flash Attention backend on V1
#: engine."
_ATTENTION_BACKEND = (
    re.compile(r"Using (\w+) attention backend out of potential backends"),
    re.compile(r"Using ([\w ]+?) backend on V1 engine"),
)


def attention_backend(log_text: str) -> str | None:
    """The attention backend a vLLM server's log says it chose (the last one named), if any."""
    for pattern in _ATTENTION_BACKEND:
        found = pattern.findall(log_text)
        if found:
            return str(found[-1]).strip()
    return None


def boot_failed(lifetime_id: str, why: str, log_tail: str) -> BootFailed:
    shown = log_tail.strip() or "(empty log)"
    return BootFailed(f"lifetime {lifetime_id}: {why}; log tail:\n{shown}")


class ServerExited(Exception):
    """Internal: the server ended before it became healthy."""


def wait_healthy(
    url: str,
    *,
    exited: Callable[[], str | None],
    timeout_s: float,
    http: httpx.Client,
    interval_s: float = 0.25,
) -> None:
    """Poll ``GET {url}/health`` until 200.

    ``exited()`` returns a description when the server is gone: then fail at once rather than
    wait out ``timeout_s`` (vLLM's boot takes ~50 s on an H200; a crash shows in the first
    seconds). Raises ``ServerExited`` or ``TimeoutError``; the caller attaches the log tail.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        status = exited()
        if status is not None:
            raise ServerExited(status)
        try:
            if http.get(f"{url}/health", timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not healthy after {timeout_s:g} s")
        time.sleep(delay)
        delay = min(interval_s, delay * 2)


#: the signals that end a run like Ctrl-C does: kill's default, and the terminal or SSH session
#: closing (SIGHUP's default would kill the tool with no teardown and no journal entry)
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into ``Interrupted`` (an ``AbortError``) while inside (main
    thread only; elsewhere a no-op).

    Python's default for either kills the interpreter without unwinding ``with`` blocks, which
    would leave servers, containers and probe groups behind and lose the lifetimes that finished;
    an exception unwinds them like Ctrl-C does, and both exit with AbortError's code. The
    handler fires once: a second signal during teardown does not interrupt the teardown.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal fired
        if fired and not interrupts.owed(signum):
            return
        if interrupts.in_finalizer(frame):  # raised there, it would be dropped
            interrupts.again(signum)
            return
        fired = True
        name = signal.Signals(signum).name
        stop = Interrupted(f"terminated ({name}); lifetimes torn down")
        stop.signum = signum  # dropped by a finalizer all the same: delivered again
        raise stop

    # Under `nohup` SIGHUP is ignored on purpose: the run must outlive the terminal.
    previous = {
        sig: signal.signal(sig, handler)
        for sig in ENDING_SIGNALS
        if signal.getsignal(sig) != signal.SIG_IGN
    }
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP back during a teardown (bounded by its grace period),
    then deliver.

    A second Ctrl-C in the middle of killing a process group must not leave half of it running.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append(signum)

    previous: dict[int, Any] = {}
    for sig in (signal.SIGINT, *ENDING_SIGNALS):
        previous[sig] = signal.signal(sig, hold)
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
        if pending:
            signum = pending[0]
            old = previous[signum]
            if callable(old):
                old(signum, None)
            elif old == signal.SIG_DFL and signum == signal.SIGINT:
                raise KeyboardInterrupt
            elif old == signal.SIG_DFL:
                signal.raise_signal(signum)


def open_log(path: Path) -> Any:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("ab", buffering=0)


class Launched(Protocol):
    """One started server (a process group, a container) as the shared boot loop drives it."""

    def exit_status(self) -> str | None: ...

    def alive(self) -> bool: ...

    def stop(self, grace_s: float) -> None: ...

    def boot_log(self) -> str:
        """What it wrote since it was launched (for a failed boot's log tail)."""
        ...


@contextlib.contextmanager
def serve_lifetime(
    lifetime_id: str,
    log_path: Path,
    launch: Callable[[int], Launched],
    *,
    live: dict[str, Any],
    lock: threading.Lock,
    boot_timeout_s: float,
    grace_s: float,
    http: httpx.Client,
    what: str = "server",
) -> Iterator[RunningServer]:
    """The boot/retry/teardown loop every backend shares.

    ``launch(port)`` starts one server on ``port`` (a backend's only job); this loop waits for
    ``/health``, boots again on another port when the server lost the race for its port, turns
    a server that died or never became healthy into ``BootFailed`` with its log tail, keeps it
    in ``live`` while it runs (so ``close()`` can stop it from another thread) and stops it on
    the way out, with SIGINT/SIGTERM deferred so a Ctrl-C cannot leave it running.
    """
    launched: Launched | None = None
    try:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            port = free_port()
            launched = launch(port)
            with lock:
                live[lifetime_id] = launched
            url = f"http://{LOOPBACK}:{port}"
            try:
                wait_healthy(url, exited=launched.exit_status, timeout_s=boot_timeout_s, http=http)
                break
            except ServerExited as exc:
                text = launched.boot_log()
                launched.stop(grace_s)
                if port_taken(text) and attempt < PORT_ATTEMPTS:
                    continue  # lost the race for the port: boot again on another
                raise boot_failed(lifetime_id, f"{what} {exc} before /health", tail(text)) from None
            except TimeoutError as exc:
                raise boot_failed(lifetime_id, str(exc), tail(launched.boot_log())) from None
        assert launched is not None  # the loop either broke out with one or raised
        yield RunningServer(
            url=url, lifetime_id=lifetime_id, log_path=log_path, alive=launched.alive
        )
    finally:
        if launched is not None:
            with signals_deferred():
                launched.stop(grace_s)
        with lock:
            live.pop(lifetime_id, None)
