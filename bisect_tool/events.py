"""Progress as events: what the run owner (``bisect_tool.run.owner``) tells whoever watches it.

The journal is the record and is written by the run itself; observers only show progress (a
terminal view, plain log lines, a test that collects events). An observer must be cheap and
thread-safe: lifetimes running in parallel report from worker threads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Note:
    """A stage's own message (a build started, a checkpoint being made, the controls ran)."""

    text: str


@dataclass(frozen=True)
class RunStarted:
    candidates: int
    direction: str  # "regression" | "fix"
    lifetimes_done: int  # > 0 when resumed


@dataclass(frozen=True)
class CandidateChosen:
    sha: str
    subject: str
    reason: str  # why the strategy picked it ("bisect the mass", "another lifetime", ...)
    lifetimes: int  # lifetimes handed out for it now
    lifetimes_done: int
    candidates_left: int  # the 99% credible set's size
    top_sha: str
    top_mass: float
    tier: str = ""  # "narrow" or "faithful" in a tiered run ("" otherwise)


@dataclass(frozen=True)
class ArtifactReady:
    sha: str
    seconds: float


@dataclass(frozen=True)
class LifetimeStarted:
    sha: str
    lifetime_id: str
    expected_s: float | None = None  # the mean of the lifetimes measured so far


@dataclass(frozen=True)
class LifetimeEnded:
    sha: str
    lifetime_id: str
    verdict: str
    message: str
    duration_s: float
    detail: dict[str, Any]
    tier: str = ""  # "narrow": a run of the fast probe (the op check), not a server lifetime


@dataclass(frozen=True)
class PosteriorMoved:
    lifetimes_done: int
    candidates_left: int
    top_sha: str
    top_mass: float
    seconds_left: float | None = None  # estimated from the measured costs


@dataclass(frozen=True)
class ControlsEnded:
    ok: bool
    entry: dict[str, Any]  # the journal's controls entry


@dataclass(frozen=True)
class RunEnded:
    state: str  # an EndState value
    message: str
    flip_block: tuple[str, ...]
    confidence: float
    lifetimes: int


Event = (
    Note
    | RunStarted
    | CandidateChosen
    | ArtifactReady
    | LifetimeStarted
    | LifetimeEnded
    | PosteriorMoved
    | ControlsEnded
    | RunEnded
)
Observer = Callable[[Event], None]


def ignore(_event: Event) -> None:
    """The observer of a caller that watches nothing."""


def notes_to(observer: Observer) -> Callable[[str], None]:
    """A ``progress(message)`` callback for stages that report plain messages."""

    def progress(message: str) -> None:
        observer(Note(message))

    return progress
