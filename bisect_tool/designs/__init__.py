"""Designs: what to run next, decided from the journal alone. Pure: plain values in and out.

A *design* is the part of a run that thinks: the bisect search over a range
(``designs.bisect``), the 2x2 swap matrix of ``bisect locate`` (``designs.locate``), and
whatever comes next. It is rebuilt from the journal entry by entry (``apply``) and, asked
``next_step()``, answers with one of:

- ``Work``: lifetimes to run now (several at once when there are slots), each an ``Item``; an
  item may be the controls instead (the positive and negative controls on one candidate, which
  must hold before a clean lifetime counts), run beside the first lifetimes where slots allow,
  or in the background while a fast probe narrows (``Item.background``);
  an item may also be one candidate's compatibility gate (``Item.gate``: the pinned stack
  asked whether it loads the candidate's compiled files, no server booted): a release-level run
  gates every release at once, in the background, before any server boots;
- ``Record``: an entry to journal as is (the tiered search moving to its next phase);
- ``Wait``: nothing to start until an item under way in the background comes back (the gate's
  sweep, before the first server boots);
- ``Finish``: the end state and its one-line message.

With several slots, a design may also ``refill`` a slot as soon as its lifetime ends, while the
others still run (on the H100 the gate refused a release in 11 s and that slot then stood idle
188 s, until the controls beside it ended: docs/bench/gpu-2026-12-07-h100).

The one engine (``bisect_tool.run.engine``) carries the steps out against real evaluators: it owns
the
journal, the parallel lifetimes, the signals and the progress events, and never decides anything
itself. ``drive`` below carries them out against a plain function instead, with no journal and no
threads: ``bisect simulate`` runs the very same designs that way, so a simulated search and a real
one cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bisect_tool.events import Event
from bisect_tool.values import Observation
from bisect_tool.verdict import EndState


@dataclass(frozen=True)
class Item:
    """One lifetime to run: which evaluator (``arm``), which candidate, its lifetime id, and the
    design's own key for it (a position and tier, a cell), handed back with the observation.
    ``controls``: the controls on the candidate instead (their entry is journaled as is).
    ``gate``: the candidate's compatibility gate instead (the arm's ``Gates.gate_check``).
    ``background``: the engine starts it and goes on deciding without waiting for it; it is
    journaled when it ends (before the next decision), and a ``Finish`` waits for it."""

    arm: str
    commit: str
    lifetime_id: str
    tags: tuple[str, ...] = ()
    key: Any = None
    controls: bool = False
    background: bool = False
    gate: bool = False


def controls_item(commit: str, arm: str, *, background: bool = False) -> Item:
    return Item(arm, commit, f"controls-{commit}", controls=True, background=background)


def gate_item(commit: str, arm: str, key: Any, tags: tuple[str, ...] = ()) -> Item:
    """``commit``'s compatibility gate, in the background (``key``: the design's own)."""
    return Item(arm, commit, f"gate-{commit}", tags, key, background=True, gate=True)


@dataclass(frozen=True)
class Work:
    """Lifetimes to run now; ``prepare``: candidates that may come next (fetch their artifacts
    meanwhile); ``events``: what to tell the observer before they start."""

    items: tuple[Item, ...]
    prepare: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()


@dataclass(frozen=True)
class Record:
    """Journal ``entry`` as it is, then decide again; ``note`` says why in one line."""

    entry: Mapping[str, Any]
    note: str = ""


@dataclass(frozen=True)
class Wait:
    """Start nothing until an item under way in the background comes back, then decide
    again."""


@dataclass(frozen=True)
class Finish:
    state: EndState
    message: str
    extra: dict[str, Any] = field(default_factory=dict)  # more fields of the end entry


Step = Work | Record | Wait | Finish


class Design(Protocol):
    """What the engine and ``drive`` need of a design."""

    def apply(self, entry: Mapping[str, Any]) -> None:
        """Take one journal entry into account (as written, or as replayed)."""
        ...

    def next_step(self) -> Step: ...

    def refill(self, running: Sequence[Item], free: int) -> Work | None:
        """Work for ``free`` idle slots while ``running`` items are still out, or None: wait for
        them (the engine then asks ``next_step`` once nothing runs). A design that decides only
        on complete batches returns None."""
        ...

    def observation_entry(self, item: Item, obs: Observation) -> Mapping[str, Any]:
        """The journal entry of one finished lifetime."""
        ...

    def end_entry(self, finish: Finish) -> Mapping[str, Any]:
        """The journal's ``end`` entry for ``finish`` (its summary included)."""
        ...

    def progress(self, item: Item) -> Event | None:
        """What to tell the observer after ``item``'s observation was applied (or nothing)."""
        ...


#: what ``drive`` calls for each item: (item) -> its observation
Evaluate = Callable[[Item], Observation]
#: what ``drive`` calls for a controls item: (commit) -> the controls entry
RunControls = Callable[[str], Mapping[str, Any]]


def drive(
    design: Design,
    evaluate: Evaluate,
    controls: RunControls | None = None,
    *,
    max_steps: int = 1_000_000,
) -> Finish:
    """Carry a design out to its end against ``evaluate`` (no journal, no threads): the
    simulation's engine. Entries are applied as the engine would journal them."""
    for _ in range(max_steps):
        step = design.next_step()
        if isinstance(step, Finish):
            design.apply(design.end_entry(step))
            return step
        if isinstance(step, Record):
            design.apply(step.entry)
            continue
        if isinstance(step, Wait):  # every item ran in its turn: nothing is under way here
            raise RuntimeError("the design waits for items under way, but none are")
        for item in step.items:  # background items too: here nothing runs beside anything
            if item.controls:
                if controls is None:
                    raise ValueError("the design asked for controls, but none can run here")
                design.apply(controls(item.commit))
            else:
                design.apply(design.observation_entry(item, evaluate(item)))
    raise RuntimeError(f"the design did not finish in {max_steps} steps")
