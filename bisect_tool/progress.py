"""Terminal observers of a run's events (``bisect_tool.events``): plain lines on stderr."""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from bisect_tool.events import (
    CandidateChosen,
    ControlsEnded,
    Event,
    LifetimeEnded,
    Note,
    RunStarted,
)


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
            f"{event.top_mass:.1%} at {event.top_sha[:12]}] {event.reason}: "
            f"{event.sha[:12]} {event.subject[:60]} x{event.lifetimes}"
        )
    if isinstance(event, ControlsEnded):
        return f"controls: {'ok' if event.ok else event.entry.get('problem', '')}"
    if isinstance(event, LifetimeEnded):
        return (
            f"  {event.lifetime_id}: {event.verdict} in {event.duration_s:.1f}s "
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
