"""The engine on its own thread, stepping on a modelled device clock (``EngineLoop``): see
``demollm.engine`` for how steps form and what the clock is for."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from demollm.engine import DeviceTiming, LLMEngine, Request

logger = logging.getLogger("demollm")


class EngineLoop:
    """The engine on its own thread: HTTP threads submit, the loop steps while there is work.

    Every step lasts ``timing.step_seconds(tokens)`` on the device clock ``device_t``: a step
    starts where the previous one ended (or, on an idle device, when the first waiting request
    arrived) and admits the requests that arrived by its start. The loop sleeps out what the
    compute did not use before it hands the step's finished requests back (a GPU step's outputs
    exist at its end). A step whose compute took longer than modelled is counted in ``overruns``
    (and ``overrun_s``); the device clock does not stretch with it, so a late step still admits
    only what arrived by its modelled start, and the batches form as on a CPU that kept up.

    While a busy period began with a request that declared its arrival, the device runs
    ``offset_s`` (the timing's admission lag) behind real time: a step is formed once its start
    lies that far in the past, and its answers are handed back that much after its end. A
    request handed to the engine after a step that started at or after its arrival was formed
    is a late arrival (``late_arrivals``): the one way left for this machine's speed to change
    how steps form, so it is counted, with the longest hand-over delay seen
    (``max_arrival_delay_s``).
    """

    def __init__(
        self,
        engine: LLMEngine,
        timing: DeviceTiming | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.engine = engine
        self.timing = timing if timing is not None else DeviceTiming()
        self._clock, self._sleep = clock, sleep  # injectable: tests run the clock on model time
        self.overruns = 0  # steps whose compute outlasted their modelled time
        self.overrun_s = 0.0  # by how much, in total
        self.late_arrivals = 0  # requests handed over after a step they arrived for was formed
        self.max_arrival_delay_s = 0.0  # longest declared arrival -> engine hand-over
        self.device_t: float | None = None  # the device clock: when its next step starts
        self.offset_s = 0.0  # how far the device runs behind real time in this busy period
        self._formed_at: float | None = None  # device start of the last step formed
        self._cond = threading.Condition()
        self._incoming: list[Request] = []
        self._pending: set[Request] = set()  # submitted, not finished (failed if the engine dies)
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    def submit(self, request: Request) -> Future[Request]:
        with self._cond:
            if self.error is not None:
                raise RuntimeError(f"engine is dead: {self.error}")
            self._incoming.append(request)
            self._pending.add(request)
            self._cond.notify_all()
        return request.future

    def counts(self) -> tuple[int, int]:
        """(running, waiting), like vllm:num_requests_running / _waiting."""
        with self._cond:
            return len(self.engine.running), len(self.engine.waiting) + len(self._incoming)

    def add(self, request: Request) -> None:
        """Hand a request to the engine now (the loop thread, or a test): counts it as a late
        arrival when a step it arrived in time for was already formed without it."""
        if self._formed_at is not None and request.arrival <= self._formed_at:
            self.late_arrivals += 1
        if request.declared_arrival:
            delay = self._clock() - request.arrival
            self.max_arrival_delay_s = max(self.max_arrival_delay_s, delay)
        self.engine.add_request(request)
        if self.timing.enabled:
            # First come, first served by arrival: an HTTP thread may hand over a request after
            # one that arrived later. One assignment (the metrics thread reads it).
            self.engine.waiting = deque(sorted(self.engine.waiting, key=lambda r: r.arrival))

    def _next_start(self) -> float | None:
        """The device time the next step starts; None with nothing to run. An idle device
        starts a busy period when its first waiting request arrived, running the admission lag
        behind real time if any waiting request declared its arrival."""
        engine = self.engine
        if engine.running:
            return self.device_t
        if not engine.waiting:
            return None
        declared = any(r.declared_arrival for r in engine.waiting)
        self.offset_s = self.timing.admission_lag_ms / 1000.0 if declared else 0.0
        first = engine.waiting[0].arrival
        return first if self.device_t is None else max(self.device_t, first)

    def due(self) -> float | None:
        """When (real time) the next step may be formed; None with nothing to run."""
        if not self.timing.enabled:
            return self._clock() if self.engine.has_work() else None
        start = self._next_start()
        return None if start is None else start + self.offset_s

    def _take_incoming(self) -> None:
        for request in self._incoming:
            self.add(request)
        self._incoming.clear()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and not self._incoming and not self.engine.has_work():
                        self._cond.wait()
                    self._take_incoming()
                    # Hold the step until its start is the admission lag in the past, taking
                    # in what comes meanwhile (an earlier arrival may move an idle start).
                    while not self._stop:
                        due = self.due()
                        wait = 0.0 if due is None else due - self._clock()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                        self._take_incoming()
                    if self._stop:
                        return
                for request in self.timed_step():
                    with self._cond:
                        self._pending.discard(request)
                    request.future.set_result(request)
        except Exception as exc:  # the engine died: fail everything, /health turns 503
            logger.exception("engine step failed; the engine is dead")
            with self._cond:
                self.error = exc
                pending = list(self._pending)
                self._pending.clear()
            for request in pending:
                if not request.future.done():
                    request.future.set_exception(RuntimeError(f"engine is dead: {exc!r}"))

    def timed_step(self) -> list[Request]:
        """One engine step on the device clock (the loop thread calls it once the step is due;
        tests may call it directly)."""
        engine = self.engine
        if not self.timing.enabled:
            return engine.step()
        start = self._next_start()
        if start is None:
            return []
        self.device_t = start
        wall, cpu = self._clock(), time.thread_time()
        steps = engine.steps
        finished = engine.step(admit_until=start)
        if engine.steps == steps:
            return finished
        self._formed_at = start
        modelled = self.timing.step_seconds(engine.step_sizes[-1])
        used = self._clock() - wall
        if used > modelled:
            self.overruns += 1
            self.overrun_s += used - modelled
            # This thread's CPU time against the wall time tells a slow CPU from a busy one
            # (time spent waiting for a core or for the GIL).
            logger.info(
                "step %d (%d tokens) overran its modelled time: %.2f ms (%.2f ms on this "
                "thread's CPU), %.2f ms modelled", engine.steps, engine.step_sizes[-1],
                used * 1e3, (time.thread_time() - cpu) * 1e3, modelled * 1e3,
            )
        self.device_t = start + modelled
        delay = self.device_t + self.offset_s - self._clock()
        if delay > 0:
            self._sleep(delay)
        return finished
