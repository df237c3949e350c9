"""The one engine: carries a design's steps out against real evaluators.

A design (``bisect_tool.designs``) decides; the engine does: it journals every entry before the
next step (and applies it to the design as written, so what the run decides from and what a later
replay rebuilds are the same), runs a step's lifetimes one at a time or in parallel threads,
journals each lifetime as it ends (not in submission order), runs the controls, and tells the
observer its progress as events. ``bisect start``/``resume``, ``bisect locate`` and, through the
same evaluators, the Ray backend all run on it.

Signals. A run's journal is open (``journal.open_journal``) with SIGTERM and SIGHUP raising (a
closed terminal or SSH session is a SIGHUP; a GPU job's deadline a SIGTERM), so a run stopped
from outside leaves the way Ctrl-C does: every lifetime that ended is journaled, every resource
closed. Lifetimes in flight are cancelled where their evaluator can cancel them (Ray tasks);
elsewhere they end as they would have and are journaled before the exception goes on (on a lent
H100 a finished divergent lifetime was printed, then lost, and run again by the next call). The
controls are not waited for (issue 38: Ctrl-C during them waited minutes on a GPU): they run on
a daemon thread, the backend's close stops their server, and a resumed run asks for them again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import Any, Protocol

from bisect_tool.designs import Design, Finish, Item, Record, Wait, Work
from bisect_tool.errors import InfrastructureError
from bisect_tool.events import (
    ControlsEnded,
    LifetimeEnded,
    LifetimeStarted,
    Note,
    Observer,
    RunEnded,
    ignore,
)
from bisect_tool.interfaces import Evaluator, Gates
from bisect_tool.journal import Journal
from bisect_tool.values import Observation, short


class ControlsRunner(Protocol):
    def run(self) -> Mapping[str, Any]:
        """The controls on one candidate, as the journal's ``controls`` entry."""
        ...


#: commit -> its controls runner (None: this backend has none)
ControlsFor = Callable[[str], ControlsRunner | None]
#: items run in the background at once: the controls, and a release-level run's gate checks
#: (one interpreter each, 7-11 s on the H100: ten releases gated side by side, not in turn)
BACKGROUND_WORKERS = 8


def no_controls(_commit: str) -> None:
    """The controls runner of a probe that has no controls (``Engine``'s default)."""
    return None


def _on_a_daemon_thread(
    fn: Callable[[Item], Observation | Mapping[str, Any]], item: Item
) -> Future[Observation | Mapping[str, Any]]:
    """``fn(item)`` on a thread of its own that the interpreter does not wait for when it exits
    (a ``ThreadPoolExecutor``'s workers it joins): Ctrl-C during the controls must not wait
    for their server. The backend's close stops that server, which ends the thread."""
    future: Future[Observation | Mapping[str, Any]] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(item))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(exc)

    threading.Thread(target=run, name="bisect-controls", daemon=True).start()
    return future


class Engine:
    """Runs ``design`` to its end: each ``Work`` item goes to ``arms[item.arm]``, up to
    ``parallel`` at once."""

    def __init__(
        self,
        journal: Journal,
        design: Design,
        arms: Mapping[str, Evaluator],
        *,
        parallel: int = 1,
        controls_for: ControlsFor = no_controls,
        observer: Observer = ignore,
        capacity: Callable[[], int] | None = None,
    ) -> None:
        self.journal = journal
        self.design = design
        self.arms = arms
        self.parallel = max(1, parallel)
        # how many may run now, at most ``parallel`` (a GPU that backed off holds fewer)
        self.capacity = capacity
        self.controls_for = controls_for
        self.observer = observer
        self._durations: dict[str, list[float]] = {}
        # items started in the background (``Item.background``): the controls while the fast
        # probe narrows; journaled as they end, before the next decision
        self._background: dict[Future[Observation | Mapping[str, Any]], Item] = {}
        # several slots: the items under way; a slot that comes back is refilled at once
        # (``Design.refill``) instead of standing idle until the others end
        self._running: dict[Future[Observation | Mapping[str, Any]], Item] = {}
        self._pool: ThreadPoolExecutor | None = None
        # the gate sweep's checks in the background (the controls have daemon threads)
        self._background_pool: ThreadPoolExecutor | None = None
        # the controls' runners, made when their item is handed out (before the lifetimes
        # beside them start: a runner may reserve their GPU room), run on their own thread
        self._controls_runners: dict[int, ControlsRunner | None] = {}

    def append(self, entry: Mapping[str, Any]) -> dict[str, Any]:
        """Journal ``entry`` and apply it, as written, to the design."""
        written = self.journal.append(entry)
        self.design.apply(written)
        return written

    def run(self) -> Finish:
        try:
            while True:
                self._collect_background(wait=False)
                if self._running:
                    self._collect_running()
                    if self._running:
                        work = self.design.refill(
                            tuple(self._running.values()), self._slots() - len(self._running))
                        if work is not None:
                            self._start(work)
                        continue
                step = self.design.next_step()
                if isinstance(step, Finish):
                    if self._background:
                        # decided, but not on everything asked for: what is still running (the
                        # controls) may change the answer, so decide again once it is in
                        self._collect_background(wait=True)
                        continue
                    self._end(step)
                    return step
                if isinstance(step, Record):
                    self.append(step.entry)
                    if step.note:
                        self.observer(Note(step.note))
                elif isinstance(step, Wait):
                    self._collect_first_background()
                else:
                    self._work(step)
        except BaseException:
            if self._running:
                self._stop_running()
            if self._background:
                # journal what ended; what still runs (the controls) is not waited for
                self._collect_background(wait=False, raising=False)
                self._background.clear()
            raise
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            if self._background_pool is not None:
                # a check under way ends in seconds; those not begun are dropped
                self._background_pool.shutdown(wait=True, cancel_futures=True)

    def _slots(self) -> int:
        if self.capacity is None:
            return self.parallel
        return max(1, min(self.parallel, self.capacity()))

    def _collect_running(self) -> None:
        """Wait for the first item under way, or in the background, to end; journal what
        ended. A background item is journaled as it ends, not once the lifetimes beside it have
        (on the H100 the controls' entry came 36 s after their server was down)."""
        done = [f for f in self._running if f.done()]
        if not done:
            first = next(as_completed([*self._running, *self._background]))
            self._collect_background(wait=False)
            done = [first] if first in self._running else []
        for fut in done:
            item = self._running.pop(fut)
            self._record(item, fut.result())  # a lifetime that failed stops the run here

    def _stop_running(self) -> None:
        """Ctrl-C, SIGTERM/SIGHUP or a failed lifetime: stop what can be stopped (Ray tasks),
        let the lifetimes end as they would have, and journal each one that did. The controls
        are not waited for (minutes of a server on a GPU): journaled if they have ended."""
        for arm in {item.arm for item in self._running.values()}:
            self._arm_named(arm).cancel()
        lifetimes = [f for f, item in self._running.items() if not item.controls or f.done()]
        for fut in as_completed(lifetimes):
            item = self._running.pop(fut)
            if not fut.cancelled() and fut.exception() is None:
                self._record(item, fut.result())
        self._running.clear()

    def _collect_first_background(self) -> None:
        """Wait for the first background item to end and journal it (``Wait``)."""
        if not self._background:
            raise InfrastructureError("a design waited with nothing under way; this is a bug "
                                      "in bisect")
        first = next(as_completed(self._background))
        item = self._background.pop(first)
        self._record(item, first.result())
        self._collect_background(wait=False)

    def _collect_background(self, *, wait: bool, raising: bool = True) -> None:
        """Journal the background items that ended (all of them, once ended, with ``wait``)."""
        while self._background:
            done = [f for f in self._background if f.done()]
            if not done and wait:
                done = [next(as_completed(self._background))]
            if not done:
                return
            for fut in done:
                item = self._background.pop(fut)
                if fut.cancelled() or (not raising and fut.exception() is not None):
                    continue
                self._record(item, fut.result())

    # -- steps ------------------------------------------------------------------------------

    def _end(self, finish: Finish) -> None:
        # decided: no fetch or build may start from here on (the ones under way stop when the
        # evaluators close)
        for arm in {id(e): e for e in self.arms.values()}.values():
            arm.prepare(())
        entry = self.append(self.design.end_entry(finish))
        summary = entry.get("summary") or {}
        self.observer(RunEnded(
            str(finish.state),
            finish.message,
            tuple(summary.get("flip_block") or ()),
            float(summary.get("confidence") or 0.0),
            int(summary.get("evaluations") or 0),
        ))

    def _work(self, work: Work) -> None:
        for event in work.events:
            self.observer(event)
        if not work.items:
            raise InfrastructureError("a design handed out no work; this is a bug in bisect")
        items = [item for item in work.items if not item.background]
        for item in work.items:
            if item.controls:
                self._controls_runners[id(item)] = self.controls_for(item.commit)
        for item in work.items:
            if item.background:
                if item.controls:
                    # the controls on a thread of their own, never waited for at exit: Ctrl-C
                    # during them must not wait for their server (see _stop_running)
                    self._background[_on_a_daemon_thread(self._evaluate, item)] = item
                    continue
                # the gate sweep's checks (seconds each), a few at a time
                if self._background_pool is None:
                    self._background_pool = ThreadPoolExecutor(
                        max_workers=BACKGROUND_WORKERS, thread_name_prefix="bisect-background")
                self._background[self._background_pool.submit(self._evaluate, item)] = item
        if not items:
            return
        if self.parallel > 1:
            self._start(Work(tuple(items), work.prepare))
            return
        # one slot: each in turn, journaled before the next starts
        # (the lookahead, bisect_tool.strategy.lookahead: each step replaces the last list, so an
        # empty
        # one stops what an earlier guess would still have fetched)
        self._arm(items[-1]).prepare(list(work.prepare))
        for item in items:
            self._record(item, self._evaluate(item))

    def _start(self, work: Work) -> None:
        """Start ``work``'s items on free slots; they are journaled as each one ends."""
        for event in work.events:
            self.observer(event)
        self._arm(work.items[-1]).prepare(list(work.prepare))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.parallel,
                                            thread_name_prefix="bisect-slot")
        for item in work.items:
            # the controls on a thread of their own, never waited for at exit (see _stop_running)
            started = (_on_a_daemon_thread(self._evaluate, item) if item.controls
                       else self._pool.submit(self._evaluate, item))
            self._running[started] = item

    def _arm(self, item: Item) -> Evaluator:
        return self._arm_named(item.arm)

    def _arm_named(self, arm: str) -> Evaluator:
        try:
            return self.arms[arm]
        except KeyError:
            raise InfrastructureError(f"this run has no {arm} probe") from None

    def _evaluate(self, item: Item) -> Observation | Mapping[str, Any]:
        if item.controls:
            return self._run_controls(item)
        if item.gate:
            arm = self._arm(item)
            if not isinstance(arm, Gates):
                raise InfrastructureError(
                    f"the run asked the {item.arm} probe's gate alone, but it has none; this "
                    "is a bug in bisect")
            return arm.gate_check(item.commit, item.tags)
        done = self._durations.get(item.arm, [])
        mean = sum(done) / len(done) if done else None
        self.observer(LifetimeStarted(item.commit, item.lifetime_id, mean))
        obs = self._arm(item).evaluate(item.commit, item.lifetime_id, item.tags)
        self.observer(LifetimeEnded(
            obs.commit, item.lifetime_id, str(obs.verdict), obs.message, obs.duration_s,
            obs.detail, item.arm,
        ))
        return obs

    def _run_controls(self, item: Item) -> Mapping[str, Any]:
        runner = (self._controls_runners.pop(id(item)) if id(item) in self._controls_runners
                  else self.controls_for(item.commit))
        if runner is None:
            raise InfrastructureError(
                "the run asked for the controls, but its backend cannot run them; pass "
                "--no-controls"
            )
        self.observer(Note(f"running the controls on {short(item.commit)}"))
        return runner.run()

    def _record(self, item: Item, result: Observation | Mapping[str, Any]) -> None:
        if not isinstance(result, Observation):
            entry = self.append(result)
            self.observer(ControlsEnded(bool(entry.get("ok")), entry))
            return
        self.append(self.design.observation_entry(item, result))
        if result.duration_s and not item.gate:
            self._durations.setdefault(item.arm, []).append(result.duration_s)
        event = self.design.progress(item)
        if event is not None:
            self.observer(event)
