"""Leases on GPUs so several lifetimes run at once, each pinned to its own devices.

One lifetime per GPU by default: the bug under study depends on how a step's batch forms, so two
servers sharing a device perturb each other's timing. ``[runtime] lifetimes_per_gpu`` lets
several share one (a small model on a large GPU; ``"auto"``: as many as its free memory holds,
``bisect_tool.runtime.sizing``); ``booting(gpu)`` then lets only one of them boot (or be torn
down) at a time, so the next lifetime's boot overlaps this one's probe but never its memory
profiling. A server told its KV cache size (vLLM's ``--kv-cache-memory-bytes``) profiles no
free memory, so its boots need no turn (``profiles_free_memory``). With no GPUs (CPU targets
such as the demo engine) the pool hands out anonymous slots (``None``) to bound concurrency
instead.

A GPU's share count is its capacity; ``back_off`` lowers it when a lifetime that shared the
card with others missed the probe's co-residency (issue 39: with 8 servers on an H100 one
lifetime reached 38-42 of the 44 sequences it needed, and was INCONCLUSIVE: a lifetime lost).

``controls_slot`` keeps slots apart for the controls' servers alone (``controls_lease``, as many
as ``controls_servers``: the negative control spread over several), so the controls never take
a lifetime's slot. ``width`` GPUs of the host make one lifetime (``[runtime]
gpus_per_lifetime``: the tensor-parallel size); a lease of several GPUs is one id list
("0,1"), as ``CUDA_VISIBLE_DEVICES`` takes it, and leases of different widths pack on one pool
(a wide lease takes the GPUs with the most free shares; leases are granted in the order they
were asked for, so a wide one is never starved by narrow ones).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterable, Iterator, Sequence

from bisect_tool.errors import UsageError


class GpuPool:
    """Thread-safe: ``with pool.lease() as gpu:`` blocks until a device (or slot) is free."""

    def __init__(self, gpus: Sequence[str] = (), *, slots: int = 1, per_gpu: int = 1,
                 controls_slot: bool = False, controls_servers: int = 1,
                 width: int = 1, most_servers: int = 0) -> None:
        ids = [str(g).strip() for g in gpus]
        if any(not g for g in ids):
            raise UsageError("empty GPU id in the GPU list; give ids like 0,1")
        if len(set(ids)) != len(ids):
            raise UsageError(f"GPU listed twice in {','.join(ids)}; give each GPU once")
        if not ids and slots < 1:
            raise UsageError("at least one lifetime slot is needed; give --parallel 1 or more")
        if per_gpu < 1:
            raise UsageError("[runtime] lifetimes_per_gpu must be 1 or more")
        if width < 1 or (ids and width > len(ids)):
            raise UsageError(
                f"[runtime] gpus_per_lifetime is {width}, but the run has {len(ids)} GPU(s): "
                "list as many GPUs (--gpus) as one lifetime needs, or lower it")
        self._ids = ids
        self.width = width if ids else 1
        # Several lifetimes may share a GPU that holds them all (a small model on an H200:
        # give each server its KV cache size with --kv-cache-memory-bytes).
        self._capacity = {g: per_gpu for g in ids}
        self._on = {g: 0 for g in ids}  # servers on each GPU now (lifetimes and controls)
        self._held = {g: 0 for g in ids}  # lifetimes' leases on each GPU now
        self._anonymous = slots if not ids else 0
        self._anonymous_held = 0
        # a lifetime starts on a GPU only while it carries fewer servers than this (the
        # controls' counted; 0: no ceiling): past the knee the probe's co-residency falls
        self._most_servers = most_servers
        self._controls_cap = max(1, controls_servers) if controls_slot else 0
        self._controls_held = 0
        # the controls' servers not yet on a card, from ``reserve_controls`` on: lifetimes leave
        # them room under the ceiling (on the H100 six lifetimes that started first and then
        # the controls' three made nine servers, and a lifetime fell short of co-residency 44)
        self._controls_reserved = 0
        self._cond = threading.Condition()
        self._tickets = itertools.count()
        self._queue: list[int] = []  # lifetimes' leases waiting, first asked first
        self._boots = {g: threading.Lock() for g in ids}

    @property
    def size(self) -> int:
        """How many lifetimes may run at once now (it falls when ``back_off`` lowers a GPU)."""
        with self._cond:
            if not self._ids:
                return self._anonymous
            return _fits(dict(self._capacity), self.width)

    @property
    def gpus(self) -> tuple[str, ...]:
        """Every GPU share: each GPU as many times as lifetimes may use it at once."""
        with self._cond:
            return tuple(g for g in self._ids for _ in range(self._capacity[g]))

    @property
    def most_servers(self) -> int:
        """The most servers a GPU carries before a lifetime waits (0: no ceiling)."""
        return self._most_servers

    def capacity(self, gpu: str) -> int:
        with self._cond:
            return self._capacity[gpu]

    @contextlib.contextmanager
    def lease(self, timeout: float | None = None, width: int | None = None
              ) -> Iterator[str | None]:
        """Free GPUs for one lifetime, ``width`` of them (the pool's by default) as one id list
        ("0,1"; ``None`` for an anonymous slot), given back on exit even on error."""
        wide = self.width if width is None or not self._ids else width
        if wide > len(self._ids) and self._ids:
            raise UsageError(f"a lifetime of {wide} GPUs on a run of {len(self._ids)}: list "
                             "more GPUs (--gpus)")
        ticket = next(self._tickets)
        with self._cond:
            self._queue.append(ticket)
            try:
                if not self._cond.wait_for(lambda: self._queue[0] == ticket
                                           and self._pick(wide) is not None, timeout):
                    raise TimeoutError(f"no GPU free within {timeout} s")
                picked = self._pick(wide)
                assert picked is not None
                self._take(picked, lifetime=True)
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()
        try:
            yield ",".join(picked) if picked else None
        finally:
            with self._cond:
                self._give(picked, lifetime=True)
                self._cond.notify_all()

    def controls_lease(self, timeout: float | None = None) -> contextlib.AbstractContextManager[
            str | None]:
        """A slot of the controls' own where the pool keeps them (``controls_slot``), else a
        lifetime's."""
        if not self._controls_cap:
            return self.lease(timeout)
        return self._controls(timeout)

    def reserve_controls(self) -> None:
        """The controls are about to start: under the ceiling (``most_servers``) lifetimes
        leave their servers room, each until it takes its slot or ``release_controls``. Called
        before the lifetimes beside them are started, so whichever leases first, the card
        holds no more than the ceiling."""
        with self._cond:
            self._controls_reserved = self._controls_cap if self._most_servers else 0

    def release_controls(self) -> None:
        """The controls ended: what they had not taken of their reservation is free again."""
        with self._cond:
            self._controls_reserved = 0
            self._cond.notify_all()

    @contextlib.contextmanager
    def _controls(self, timeout: float | None) -> Iterator[str | None]:
        with self._cond:
            if not self._cond.wait_for(lambda: self._controls_held < self._controls_cap,
                                       timeout):
                raise TimeoutError(f"no slot for the controls within {timeout} s")
            self._controls_held += 1
            self._controls_reserved = max(0, self._controls_reserved - 1)
            # on the GPUs that carry the fewest servers now (their boots take those GPUs' turns)
            picked = (sorted(self._ids, key=lambda g: (self._on[g], self._ids.index(g)))
                      [:self.width] if self._ids else [])
            self._take(picked, lifetime=False)
        try:
            yield ",".join(sorted(picked, key=self._ids.index)) if picked else None
        finally:
            with self._cond:
                self._controls_held -= 1
                self._give(picked, lifetime=False)
                self._cond.notify_all()

    def sharing(self, gpu: str | None) -> int:
        """How many servers share ``gpu``'s card(s) now (the most on any of its GPUs)."""
        if gpu is None:
            return 1
        with self._cond:
            return max((self._on.get(g, 0) for g in gpu.split(",")), default=1)

    def back_off(self, gpu: str | None, servers: int) -> bool:
        """A lifetime on ``gpu`` missed the probe's co-residency while ``servers`` shared its
        card: each of its GPUs holds at most ``servers - 1`` lifetimes from now on (never fewer
        than one). Whether that lowered any."""
        if gpu is None or servers <= 1:
            return False
        lowered = False
        with self._cond:
            for g in gpu.split(","):
                if g in self._capacity and self._capacity[g] > max(1, servers - 1):
                    self._capacity[g] = max(1, servers - 1)
                    lowered = True
        return lowered

    @contextlib.contextmanager
    def booting(self, gpu: str | None) -> Iterator[None]:
        """Held while a server boots on ``gpu`` (until /health): one boot per GPU at a time.
        An anonymous slot (no GPU) boots freely; several GPUs take their turns in order."""
        with contextlib.ExitStack() as turns:
            for g in sorted((gpu or "").split(","), key=lambda g: (len(g), g)):
                lock = self._boots.get(g)
                if lock is not None:
                    turns.enter_context(lock)
            yield

    # -- under ``_cond`` ---------------------------------------------------------------------

    def _pick(self, width: int) -> list[str] | None:
        """The GPUs the next lifetime would take ([] for an anonymous slot), None: none free.
        The ``width`` GPUs with the most free shares (the least crowded first)."""
        if not self._ids:
            return [] if self._anonymous_held < self._anonymous else None
        # the controls' reserved servers go where they will: the card carrying the fewest now
        calm = min(self._ids, key=lambda g: (self._on[g], self._ids.index(g)))
        free = [g for g in self._ids if self._held[g] < self._capacity[g]
                and (not self._most_servers or self._on[g]
                     + (self._controls_reserved if g == calm else 0) < self._most_servers)]
        if len(free) < width:
            return None
        free.sort(key=lambda g: (self._held[g] - self._capacity[g], self._on[g],
                                 self._ids.index(g)))
        return sorted(free[:width], key=self._ids.index)

    def _take(self, picked: Iterable[str], *, lifetime: bool) -> None:
        picked = list(picked)
        if not self._ids and lifetime:
            self._anonymous_held += 1
        for g in picked:
            self._on[g] += 1
            if lifetime:
                self._held[g] += 1

    def _give(self, picked: Iterable[str], *, lifetime: bool) -> None:
        picked = list(picked)
        if not self._ids and lifetime:
            self._anonymous_held -= 1
        for g in picked:
            self._on[g] -= 1
            if lifetime:
                self._held[g] -= 1


def _fits(capacity: dict[str, int], width: int) -> int:
    """How many lifetimes of ``width`` GPUs the shares ``capacity`` hold at once, each taking
    one share on each of ``width`` GPUs with the most shares left."""
    count = 0
    while True:
        ranked = sorted((g for g in capacity if capacity[g] > 0), key=lambda g: -capacity[g])
        if len(ranked) < width:
            return count
        for g in ranked[:width]:
            capacity[g] -= 1
        count += 1


#: vLLM's flag that fixes the KV cache's size: its worker then skips the free-memory profile
#: (v0.26 vllm/v1/worker/gpu_worker.py determine_available_memory returns the given size after
#: a plain profile run), so servers booting side by side on one GPU cannot upset each other's
#: sizing and boots may overlap.
KV_CACHE_SIZE_FLAG = "--kv-cache-memory-bytes"


def profiles_free_memory(server_args: Iterable[str]) -> bool:
    """Whether a server started with ``server_args`` sizes its memory from what is free on the
    GPU at boot (vLLM's default), so boots and teardowns on a shared GPU must take turns."""
    return not any(
        arg == KV_CACHE_SIZE_FLAG or arg.startswith(KV_CACHE_SIZE_FLAG + "=")
        for arg in server_args
    )
