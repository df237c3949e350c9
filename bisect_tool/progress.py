"""Terminal observers of a run's events (``bisect_tool.events``): plain lines on stderr."""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

from bisect_tool.events import (
    CandidateChosen,
    ControlsEnded,
    Event,
    LifetimeEnded,
    LifetimeStarted,
    Note,
    PosteriorMoved,
    RunStarted,
)
from bisect_tool.values import percent, short


def describe(event: Event) -> str | None:
    """The plain line an event prints as, or None for events a log does not need."""
    if isinstance(event, Note):
        return event.text
    if isinstance(event, RunStarted):
        if event.lifetimes_done:
            return f"resuming: {event.lifetimes_done} lifetimes already journaled"
        word = "bad" if event.direction == "regression" else "good"
        return (
            f"bisecting {event.candidates} candidates ({event.direction}: looking for the "
            f"first {word} commit)"
        )
    if isinstance(event, CandidateChosen):
        return (
            f"[{event.lifetimes_done} lifetimes, {event.candidates_left} candidates left, top "
            f"{percent(event.top_mass)} at {short(event.top_sha)}] "
            + ("fast probe: " if event.tier == "narrow" else "")
            + f"{event.reason}: "
            f"{short(event.sha)} {event.subject[:60]} x{event.lifetimes}"
        )
    if isinstance(event, ControlsEnded):
        return f"controls: {'ok' if event.ok else event.entry.get('problem', '')}"
    if isinstance(event, LifetimeEnded):
        waited = float(((event.detail or {}).get("timing") or {}).get("gpu_wait_s") or 0.0)
        # the seconds a lifetime waited for a GPU another server held are no part of it
        wait = f", after {waited:.0f}s waiting for a GPU" if waited >= 1 else ""
        return (
            f"  {event.lifetime_id}: {event.verdict} in {event.duration_s - waited:.1f}s{wait} "
            f"({event.message[:100]})"
        )
    return None


class PlainLines:
    """Each event worth a line, as one line (for logs, pipes and ``--quiet``-less runs)."""

    def __init__(self, stream: TextIO | None = None, *, lifetimes: bool = True) -> None:
        self.stream = stream
        self.lifetimes = lifetimes
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        if isinstance(event, LifetimeEnded) and not self.lifetimes:
            return
        line = describe(event)
        if line is None:
            return
        stream = self.stream or sys.stderr
        with self._lock:
            stream.write(line + "\n")
            stream.flush()


class LiveView:
    """On a terminal: one live status line (rich), redrawn a few times a second, with the
    stage messages and each ended lifetime printed above it.

    It shows the candidates left (the 99% credible set), the top commit and its mass, the lifetime
    running with its elapsed time against the mean of those measured, the lifetimes done and an
    estimate of the time left from those measured costs. Use it as a context manager: leaving it
    (at the end, or on Ctrl-C) stops the redraw and leaves the terminal as it was.
    """

    #: lifetimes a halving of the candidates costs at an intermittent p, for the time-left guess
    LIFETIMES_PER_HALVING = 2.0

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=True)
        self._live = Live(self, console=self.console, refresh_per_second=4, transient=True)
        self._lock = threading.Lock()
        self._status = "starting"
        self._running: dict[str, float] = {}  # lifetime id -> monotonic start
        self._durations: list[float] = []
        self._done = 0
        self._left = 0
        self._top = ""

    def __enter__(self) -> LiveView:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def __call__(self, event: Event) -> None:
        import time

        line: str | None = None
        with self._lock:
            if isinstance(event, CandidateChosen):
                self._done, self._left = event.lifetimes_done, event.candidates_left
                self._top = f"top {event.top_mass:.1%} at {short(event.top_sha)}"
                self._status = f"{event.reason}: {short(event.sha)} {event.subject[:40]}"
            elif isinstance(event, LifetimeStarted):
                self._running[event.lifetime_id] = time.monotonic()
            elif isinstance(event, LifetimeEnded):
                self._running.pop(event.lifetime_id, None)
                if event.duration_s:
                    self._durations.append(event.duration_s)
                self._done += 1
                line = describe(event)
            elif isinstance(event, PosteriorMoved):
                self._done, self._left = event.lifetimes_done, event.candidates_left
                self._top = f"top {event.top_mass:.1%} at {short(event.top_sha)}"
            else:
                line = describe(event)
        if line:
            self._live.console.print(line, markup=False, highlight=False)

    def __rich__(self) -> Any:
        import math
        import time

        from rich.text import Text

        with self._lock:
            mean = sum(self._durations) / len(self._durations) if self._durations else None
            now = time.monotonic()
            running = ", ".join(
                f"{lid} {now - t0:.0f}s" + (f"/{mean:.0f}s" if mean else "")
                for lid, t0 in self._running.items()
            )
            eta = ""
            if mean and self._left > 1:
                halvings = math.ceil(math.log2(self._left))
                eta = f" | ~{halvings * self.LIFETIMES_PER_HALVING * mean / 60:.0f} min left"
            text = (
                f"bisect: {self._left} candidates left, {self._top or 'no lifetime yet'} | "
                f"{self._done} lifetimes done"
                + (f" | running {running}" if running else "")
                + eta
                + f" | {self._status}"
            )
        return Text(text, no_wrap=True, overflow="ellipsis")
