"""Leases on GPUs so several lifetimes run at once, each pinned to its own device.

One lifetime per GPU by default: the bug under study depends on how a step's batch forms, so two
servers sharing a device perturb each other's timing. ``[runtime] lifetimes_per_gpu`` lets
several share one (a small model on a large GPU); ``booting(gpu)`` then lets only one of them
boot (or be torn down) at a time, so the next lifetime's boot overlaps this one's probe but never
its memory profiling. A server told its KV cache size (vLLM's ``--kv-cache-memory-bytes``)
profiles no free memory, so its boots need no turn (``profiles_free_memory``). With no GPUs
(CPU targets such as the demo engine) the pool hands out anonymous slots (``None``) to bound
concurrency instead. ``controls_slot`` keeps one slot more, for the controls' server alone
(``controls_lease``), so the controls never take a lifetime's slot.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager

from bisect_tool.errors import UsageError


class GpuPool:
    """Thread-safe: ``with pool.lease() as gpu:`` blocks until a device (or slot) is free."""

    def __init__(self, gpus: Sequence[str] = (), *, slots: int = 1, per_gpu: int = 1,
                 controls_slot: bool = False) -> None:
        ids = [str(g).strip() for g in gpus]
        if any(not g for g in ids):
            raise UsageError("empty GPU id in the GPU list; give ids like 0,1")
        if len(set(ids)) != len(ids):
            raise UsageError(f"GPU listed twice in {','.join(ids)}; give each GPU once")
        if not ids and slots < 1:
            raise UsageError("at least one lifetime slot is needed; give --parallel 1 or more")
        if per_gpu < 1:
            raise UsageError("[runtime] lifetimes_per_gpu must be 1 or more")
        # Several lifetimes may share a GPU that holds them all (a small model on an H200:
        # give each server its share with --gpu-memory-utilization).
        self._items: list[str | None] = (
            [g for g in ids for _ in range(per_gpu)] if ids else [None] * slots
        )
        self._free: queue.Queue[str | None] = queue.Queue()
        for item in self._items:
            self._free.put(item)
        self._boots = {g: threading.Lock() for g in ids}
        # the controls' own slot, on the first GPU (its boots take that GPU's turns too)
        self._controls: queue.Queue[str | None] | None = None
        if controls_slot:
            self._controls = queue.Queue()
            self._controls.put(ids[0] if ids else None)

    @property
    def size(self) -> int:
        """How many lifetimes may run at once."""
        return len(self._items)

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(g for g in self._items if g is not None)

    @contextlib.contextmanager
    def lease(self, timeout: float | None = None) -> Iterator[str | None]:
        """A free GPU id (``None`` for an anonymous slot), given back on exit even on error."""
        with _taken(self._free, timeout) as item:
            yield item

    def controls_lease(self, timeout: float | None = None) -> AbstractContextManager[str | None]:
        """The controls' slot where the pool keeps one (``controls_slot``), else a lifetime's."""
        if self._controls is None:
            return self.lease(timeout)
        return _taken(self._controls, timeout)

    @contextlib.contextmanager
    def booting(self, gpu: str | None) -> Iterator[None]:
        """Held while a server boots on ``gpu`` (until /health): one boot per GPU at a time.
        An anonymous slot (no GPU) boots freely."""
        lock = self._boots.get(gpu) if gpu is not None else None
        if lock is None:
            yield
            return
        with lock:
            yield


@contextlib.contextmanager
def _taken(free: queue.Queue[str | None], timeout: float | None) -> Iterator[str | None]:
    try:
        item = free.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"no GPU free within {timeout} s") from None
    try:
        yield item
    finally:
        free.put(item)


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
