"""The locate design: the 2x2 swap matrix of ``bisect locate``, as the journal has it. Pure.

Four cells, {good, bad} Python side x {good, bad} compiled side (``bisect_tool.strategy.matrix``);
each
lifetime runs the compiled side's candidate under the Python side's evaluator (the item's
``arm``). The controls run first, on the good end's own pair; then cells are handed out, up to
the slots at once, until one explanation holds the asked confidence or every cell has had its
lifetimes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bisect_tool.cause import one_line
from bisect_tool.designs import Finish, Item, Step, Work, controls_item
from bisect_tool.events import Event
from bisect_tool.journal import entries
from bisect_tool.range import Candidate
from bisect_tool.strategy.matrix import CELLS, Cell, CellCounts, Finding, Side, conclude, next_cell
from bisect_tool.values import Observation
from bisect_tool.verdict import EndState, Evidence, controls_problem, evidence


class LocateDesign:
    """``bisect locate`` as a design: ``apply`` journal entries, ask ``next_step``."""

    def __init__(
        self,
        good: Candidate,
        bad: Candidate,
        *,
        confidence: float,
        lifetimes_per_cell: int,
        slots: int = 1,
        controls: bool = False,
    ) -> None:
        self.ends = {Side.GOOD: good, Side.BAD: bad}
        self.confidence = confidence
        self.per_cell = lifetimes_per_cell
        self.slots = max(1, slots)
        self.controls = controls
        self.observations: list[entries.Observed] = []
        self._seen: set[str] = set()
        self.controls_entry: dict[str, Any] | None = None
        self.end: dict[str, Any] | None = None
        self.counts: dict[Cell, CellCounts] = counts_of(())

    # -- the Design protocol ----------------------------------------------------------------

    def apply(self, entry: Mapping[str, Any]) -> None:
        match entries.parse(entry):
            case entries.Observed() as seen:
                if seen.lifetime_id and seen.lifetime_id in self._seen:
                    return  # idempotent: a lifetime is counted once
                self._seen.add(seen.lifetime_id)
                self.observations.append(seen)
                self.counts = counts_of(self.observations)
            case entries.ControlsRan(entry=raw):
                self.controls_entry = dict(raw)
            case entries.Ended(entry=raw):
                self.end = dict(raw)
            case _:
                pass

    def next_step(self) -> Step:
        if self.controls and self.controls_entry is None:
            return Work((controls_item(self.ends[Side.GOOD].sha, str(Side.GOOD)),))
        problem = controls_problem(self.controls_entry)
        if problem:
            return Finish(EndState.CONTROLS_FAILED, problem)
        finding = self.finding()
        if finding.decided:
            return Finish(EndState.DONE, f"{finding.explanation}: {finding.probability:.4f}")
        batch = cells_for(self.counts, self.slots, self.per_cell)
        if not batch:
            return Finish(EndState.BUDGET, f"{finding.explanation}: {finding.probability:.4f}")
        issued: dict[str, int] = {}
        for obs in self.observations:
            issued[obs.cell] = issued.get(obs.cell, 0) + 1
        items = []
        for cell in batch:
            n = issued.get(cell.key, 0)
            issued[cell.key] = n + 1
            end = self.ends[cell.compiled]
            lid = f"locate-{cell.python}-py-{cell.compiled}-c-{n}"
            items.append(Item(str(cell.python), end.sha, lid, end.tags, cell))
        return Work(tuple(items))

    def observation_entry(self, item: Item, obs: Observation) -> Mapping[str, Any]:
        cell: Cell = item.key
        position = 0 if cell.compiled is Side.GOOD else 1
        return entries.observation(obs, position, cell=cell.key)

    def end_entry(self, finish: Finish) -> Mapping[str, Any]:
        finding = self.finding()
        return entries.end(
            str(finish.state), finish.message,
            finding={"explanation": str(finding.explanation),
                     "probability": finding.probability,
                     "posterior": {str(k): v for k, v in finding.posterior.items()},
                     "decided": finding.decided,
                     "tied": [str(t) for t in finding.tied]},
            summary={"confidence": finding.probability, "evaluations": len(self.observations)},
        )

    def refill(self, running: Sequence[Item], free: int) -> Work | None:
        """The matrix hands out each round whole: its cells are compared side by side."""
        return None

    def progress(self, item: Item) -> Event | None:
        return None

    # -- the answer -------------------------------------------------------------------------

    def finding(self) -> Finding:
        return conclude(self.counts, self.confidence)


def counts_of(observations: Iterable[entries.Observed]) -> dict[Cell, CellCounts]:
    """Each cell's divergent and conclusive lifetimes; a cell that never gave a conclusive one
    and could not run says why (the first line of the failure, or the log's likely cause)."""
    counts: dict[Cell, CellCounts] = {cell: CellCounts() for cell in CELLS}
    for obs in observations:
        cell = Cell.from_key(obs.cell)
        c = counts[cell]
        seen = evidence(obs.verdict)
        if seen is Evidence.BUG or seen is Evidence.NO_BUG:
            counts[cell] = CellCounts(c.divergent + (seen is Evidence.BUG), c.total + 1,
                                      c.untestable)
        elif seen is Evidence.CANNOT_RUN and not c.total:
            # the first line says what failed, the first error of a log tail why (the whole
            # tail stays in the journal and the lifetime's log)
            why = one_line(obs.message, 300) or "?"
            counts[cell] = CellCounts(c.divergent, c.total, why)
    return counts


def cells_for(counts: Mapping[Cell, CellCounts], slots: int, per_cell: int) -> list[Cell]:
    """Up to ``slots`` cells for lifetimes at once: the best next cell, then the next best of
    the others, scored as if the earlier picks had run with no outcome yet."""
    batch: list[Cell] = []
    pending = dict(counts)
    for _ in range(max(1, slots)):
        cell = next_cell(pending, per_cell)
        if cell is None:
            break
        batch.append(cell)
        c = pending.get(cell, CellCounts())
        # a pending lifetime fills its place in the budget (and the "each cell first" order)
        pending[cell] = CellCounts(c.divergent, c.total + 1, c.untestable)
    return batch
