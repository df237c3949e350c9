"""Terminal observers of a run's events (``bisect_tool.events``): plain lines on stderr."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

from bisect_tool.events import (
    CandidateChosen,
    ControlsEnded,
    Event,
    LifetimeEnded,
    LifetimeStarted,
    Note,
    Observer,
    PosteriorMoved,
    RunStarted,
    ignore,
)
from bisect_tool.values import percent, short


def clip(text: str, width: int) -> str:
    """``text`` on one line in at most ``width`` characters, cut at a word with an ellipsis
    (issue 41: "... in RMSNorm kernels by " was a subject cut mid-sentence)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[: width - 1]
    space = cut.rfind(" ")
    if space >= width // 2:  # a word boundary not too far back; else a very long word is cut
        cut = cut[:space]
    return cut.rstrip(" ,;:-([") + "…"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class Tally:
    """What the progress lines count, kept apart and never going back (issue 41: the op check's
    runs were counted as "lifetimes", the count restarted at 0 when the lifetimes began, and
    "candidates left" went 113 -> 68 -> 113): the op check's runs and the server lifetimes
    each counted from the events that end them, and the candidates left as the fewest any
    posterior of the run has left so far (the lifetimes' posterior starts over the whole range
    with the op check's flip as its prior; the op check's own narrowing still stands)."""

    def __init__(self) -> None:
        self.op_runs = 0
        self.lifetimes = 0
        self.left: int | None = None
        self.top = ""

    def see(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self.lifetimes = max(self.lifetimes, event.lifetimes_done)
            self.left = event.candidates
        elif isinstance(event, LifetimeEnded):
            if event.tier == "narrow":
                self.op_runs += 1
            else:
                self.lifetimes += 1
        elif isinstance(event, CandidateChosen | PosteriorMoved):
            left = event.candidates_left
            self.left = left if self.left is None else min(self.left, left)
            self.top = f"top {percent(event.top_mass)} at {short(event.top_sha)}"

    def words(self) -> str:
        runs = [_count(self.op_runs, "op run")] if self.op_runs else []
        runs.append(_count(self.lifetimes, "lifetime"))
        left = [] if self.left is None else [_count(self.left, "candidate") + " left"]
        return ", ".join([*runs, *left, *([self.top] if self.top else [])])


def describe(event: Event, tally: Tally | None = None) -> str | None:
    """The plain line an event prints as, or None for events a log does not need; ``tally``:
    the run's counts so far, shown on each candidate's line."""
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
        counts = tally.words() if tally is not None else (
            f"{event.lifetimes_done} lifetimes, {event.candidates_left} candidates left")
        # several lifetimes of one candidate at once (GPUs or slots): said, not "x3"
        at_once = f" ({event.lifetimes} lifetimes at once)" if event.lifetimes > 1 else ""
        return (
            f"[{counts}] " + ("op check: " if event.tier == "narrow" else "")
            + f"{event.reason}: {short(event.sha)} {clip(event.subject, 60)}{at_once}"
        )
    if isinstance(event, ControlsEnded):
        return f"controls: {'ok' if event.ok else event.entry.get('problem', '')}"
    if isinstance(event, LifetimeEnded):
        waited = float(((event.detail or {}).get("timing") or {}).get("gpu_wait_s") or 0.0)
        # the seconds a lifetime waited for a GPU another server held are no part of it
        wait = f", after {waited:.0f}s waiting for a GPU" if waited >= 1 else ""
        return (
            f"  {event.lifetime_id}: {event.verdict} in {event.duration_s - waited:.1f}s{wait} "
            f"({clip(event.message, 100)})"
        )
    return None


class PlainLines:
    """Each event worth a line, as one line (for logs, pipes and ``--quiet``-less runs)."""

    def __init__(self, stream: TextIO | None = None, *, lifetimes: bool = True) -> None:
        self.stream = stream
        self.lifetimes = lifetimes
        self.tally = Tally()
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        with self._lock:
            self.tally.see(event)
            if isinstance(event, LifetimeEnded) and not self.lifetimes:
                return
            line = describe(event, self.tally)
            if line is None:
                return
            stream = self.stream or sys.stderr
            stream.write(line + "\n")
            stream.flush()


class LiveView:
    """On a terminal: one live status line (rich), redrawn a few times a second, with the
    stage messages and each ended lifetime printed above it.

    It shows the run's counts (``Tally``: the op check's runs apart from the server lifetimes,
    the candidates left, the top commit and its mass), the lifetimes running with their elapsed
    time against the mean of those measured, an estimate of the time left from those measured
    costs, and what the search is doing. Use it as a context manager: leaving it (at the end,
    or on Ctrl-C) stops the redraw and leaves the terminal as it was.
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
        self.tally = Tally()

    def __enter__(self) -> LiveView:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.stop()

    def __call__(self, event: Event) -> None:
        import time

        line: str | None = None
        with self._lock:
            self.tally.see(event)
            if isinstance(event, CandidateChosen):
                what = "op check: " if event.tier == "narrow" else ""
                self._status = (f"{what}{event.reason}: {short(event.sha)} "
                                f"{clip(event.subject, 40)}")
            elif isinstance(event, LifetimeStarted):
                self._running[event.lifetime_id] = time.monotonic()
            elif isinstance(event, LifetimeEnded):
                self._running.pop(event.lifetime_id, None)
                if event.duration_s and event.tier != "narrow":
                    self._durations.append(event.duration_s)
                line = describe(event, self.tally)
            elif not isinstance(event, PosteriorMoved):
                line = describe(event, self.tally)
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
            left = self.tally.left or 0
            if mean and left > 1:
                halvings = math.ceil(math.log2(left))
                eta = f" | ~{halvings * self.LIFETIMES_PER_HALVING * mean / 60:.0f} min left"
            text = (
                f"bisect: {self.tally.words()}"
                + (f" | running {running}" if running else "")
                + eta
                + f" | {self._status}"
            )
        return Text(text, no_wrap=True, overflow="ellipsis")


@contextlib.contextmanager
def watching(quiet: bool, verbose: bool) -> Iterator[Observer]:
    """How a run's progress is shown: a live view on a terminal (the stream it draws on,
    stderr), plain lines otherwise (or with -v), nothing with -q."""
    if quiet:
        yield ignore
    elif verbose or not sys.stderr.isatty():
        yield PlainLines(lifetimes=verbose)
    else:
        with LiveView() as view:
            yield view
