"""What every runtime backend is, whatever boots its lifetimes (``LocalBackend``: a process
group, ``DockerBackend``: a container): the lifetimes it is running (so ``close`` can stop them
from another thread), the HTTP client its boots poll ``/health`` with, where a lifetime's log
goes, and the compatibility gate's bookkeeping (each swap set asked once; the backend says only
how an extension's op schemas are read, pinned and candidate)."""

from __future__ import annotations

import abc
import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Generic, TypeAlias, TypeVar

import httpx

from bisect_tool.errors import IncompatibleExtension, InfrastructureError
from bisect_tool.interfaces import LifetimeSpec, SwapSet
from bisect_tool.recipes.recipe import RuntimeSettings
from bisect_tool.runtime import schemas
from bisect_tool.runtime.common import Launched, RunningServer, serve_lifetime
from bisect_tool.runtime.overlay import safe_name

#: an extension's op schemas by swap path (None: it registers no op of the gate's)
SchemaDump = Callable[[str], "dict[str, str] | None"]
#: one running lifetime as the backend keeps it (a process group, a container)
L = TypeVar("L", bound=Launched)
#: a swap set as the gate remembers it (``schemas.gate_key``)
GateKey: TypeAlias = tuple[str, tuple[tuple[str, str], ...]]


class Backend(abc.ABC, Generic[L]):
    """The parts of ``bisect_tool.interfaces.RuntimeBackend`` both backends share."""

    def __init__(
        self,
        settings: RuntimeSettings,
        *,
        session: str,
        log_dir: Path,
        http_client: httpx.Client | None,
        grace_s: float,
    ) -> None:
        self.settings = settings
        self.session = session
        self.log_dir = Path(log_dir)
        self.grace_s = grace_s
        self._http = http_client
        self._checked: set[GateKey] = set()
        # a swap set the gate refused, and its verdict (the schemas do not change between asks)
        self._refused: dict[GateKey, IncompatibleExtension] = {}
        # one check of a swap set at a time: two slots given the same candidate at once each ran
        # the gate's interpreter on the H100 (7-11 s apiece, docs/bench/gpu-2026-12-07-h100)
        self._gate_locks: dict[GateKey, threading.Lock] = {}
        # the pinned extension's schemas are read once, however many gates ask at once (a
        # release-level run gates every release in parallel)
        self._pinned_lock = threading.Lock()
        self._live: dict[str, L] = {}
        self._lock = threading.Lock()
        self._closed = False

    def log_path(self, spec: LifetimeSpec) -> Path:
        """Where the lifetime's output goes (beside the journal, named by its lifetime id)."""
        return Path(spec.log_dir or self.log_dir) / f"{safe_name(spec.lifetime_id)}.log"

    @contextlib.contextmanager
    def _client(self) -> Iterator[httpx.Client]:
        if self._http is not None:
            yield self._http
        else:
            # trust_env=False: a proxy from the environment must never see loopback traffic.
            with httpx.Client(trust_env=False) as client:
                yield client

    @contextlib.contextmanager
    def _serve(
        self, spec: LifetimeSpec, launch: Callable[[int], L], *, what: str = "server"
    ) -> Iterator[RunningServer]:
        """The lifetime booted by ``launch(port)`` through the loop every backend shares
        (``serve_lifetime``: /health, another port on a lost race, teardown), kept among this
        backend's live ones while it runs."""
        if self._closed:
            # the run is over (Ctrl-C, SIGTERM): a thread still at work (the controls, never
            # waited for) must not boot another server after its own was stopped (issue 38)
            raise InfrastructureError(f"the run is stopping: {spec.lifetime_id} is not booted")
        with self._client() as http, serve_lifetime(
            spec.lifetime_id,
            self.log_path(spec),
            launch,
            live=self._live,
            lock=self._lock,
            boot_timeout_s=self.settings.boot_timeout_s,
            grace_s=self.grace_s,
            http=http,
            what=what,
        ) as server:
            yield server

    def close(self) -> int:
        """Tear down every lifetime still running (from any thread); how many there were.

        For the lead's loop: on Ctrl-C the main thread calls this so lifetimes running in worker
        threads stop now instead of at the end of their probe.
        """
        with self._lock:
            self._closed = True
            live = list(self._live.values())
        for running in live:
            running.stop(self.grace_s)
        return len(live)

    def check_compatible(self, swap: SwapSet) -> None:
        """Raise ``IncompatibleExtension`` naming the op when the swap set's extensions
        register op schemas that differ from the pinned stack's (each swap set asked once).
        A candidate that brings its own Python side (``SwapSet.whole_packages``) calls its own
        ops: nothing to gate."""
        if swap.whole_packages:
            return
        key = schemas.gate_key(swap)
        with self._lock:
            turn = self._gate_locks.setdefault(key, threading.Lock())
        with turn:
            if key in self._checked:
                return
            if key in self._refused:
                raise self._refused[key]
            exts = schemas.extension_paths(list(swap.files))
            if exts:
                try:
                    with self._schema_dumps(swap) as (pinned, candidate):

                        def pinned_once(rel: str) -> dict[str, str] | None:
                            with self._pinned_lock:
                                return pinned(rel)

                        schemas.check_extensions(swap, exts, pinned_once, candidate,
                                                 self.settings.gate_ops)
                except IncompatibleExtension as refused:
                    self._refused[key] = refused
                    raise
            self._checked.add(key)

    @abc.abstractmethod
    def _schema_dumps(
        self, swap: SwapSet
    ) -> contextlib.AbstractContextManager[tuple[SchemaDump, SchemaDump]]:
        """How this backend reads the op schemas of a swap path's pinned file and of the
        candidate's, while the candidate's files are in place as its lifetimes see them."""

    @abc.abstractmethod
    def cleanup_stale(self, session: str | None = None) -> int:
        """Remove what an earlier run of ``session`` (None: of every session) left behind;
        lifetimes this backend is running now are kept. How many things it removed."""
