"""What the search has seen, per position: the lifetimes and their outcomes, the candidates that
cannot run, and the questions that need only those counts (the ends as checked, blocks of
hypotheses, whether the record contradicts itself). Pure."""

from __future__ import annotations

import numpy as np

from bisect_tool.values import Direction


class Evidence:
    """Per-position counts of ``0 .. n`` and the sets of positions the choice must skip.

    ``bad_end`` and ``good_end`` are the ends as given (position ``n`` or ``0``, by the
    direction: for a regression the new end shows the bug)."""

    def __init__(self, size: int, direction: Direction) -> None:
        self.n = size - 1
        self.direction = direction
        self.divergent = np.zeros(size, dtype=np.int64)
        self.total = np.zeros(size, dtype=np.int64)
        self.untestable: set[int] = set()
        #: never chosen again, evidence kept (the probe keeps coming back inconclusive there)
        self.retired: set[int] = set()
        #: artifacts at hand although this search has not run them (the other tier fetched them)
        self.ready: set[int] = set()
        self.bad_end = self.n if direction is Direction.REGRESSION else 0
        self.good_end = 0 if direction is Direction.REGRESSION else self.n

    def record(self, position: int, divergent: bool) -> None:
        self.total[position] += 1
        self.divergent[position] += int(divergent)

    def prepared(self, position: int) -> bool:
        """Run here at least once: another lifetime costs no switch."""
        return bool(self.total[position])

    def at_hand(self, position: int) -> bool:
        return self.prepared(position) or position in self.ready

    def choosable(self, position: int) -> bool:
        return position not in self.untestable and position not in self.retired

    def unrun(self, position: int) -> bool:
        """It can run and has not (what a deterministic probe may run next)."""
        return not self.total[position] and self.choosable(position)

    def nearest_unrun(self, position: int) -> tuple[int, ...]:
        """``position`` if it has not run, else the nearest testable candidates on each side
        of it that have not."""
        if self.unrun(position):
            return (position,)
        below = next((i for i in range(position - 1, -1, -1) if self.unrun(i)), None)
        above = next((i for i in range(position + 1, self.n + 1) if self.unrun(i)), None)
        return tuple(i for i in (below, above) if i is not None)

    def effective_ends(self) -> tuple[int | None, int | None]:
        """(bad, good) as the search checks them: the given ends, or, where one is untestable
        (a release whose extension the pinned stack rejects, a commit that does not build), the
        nearest testable candidate toward the other end, which stands in for it. None when no
        candidate on the way is testable. The hypotheses still span the whole range."""

        def walk(start: int, stop: int) -> int | None:
            step = 1 if stop > start else -1
            for i in range(start, stop, step):
                if i not in self.untestable:
                    return i
            return None

        good = walk(self.good_end, self.bad_end)
        bad = walk(self.bad_end, good if good is not None else self.good_end)
        return bad, good

    def contradiction(self) -> tuple[int, int] | None:
        """(clean, divergent) positions that no single flip explains without a false alarm or a
        missed bug: a clean run at least as near the bad end as a divergent one (the same
        candidate giving both answers is one). None when every observation fits one flip. For
        a deterministic probe this is the probe failing its premise, not evidence about the
        flip."""
        clean = np.flatnonzero(self.total > self.divergent)
        divergent = np.flatnonzero(self.divergent)
        if not len(clean) or not len(divergent):
            return None
        to_bad = np.abs(np.arange(self.n + 1) - self.bad_end)
        nearest_clean = int(clean[np.argmin(to_bad[clean])])
        farthest_divergent = int(divergent[np.argmax(to_bad[divergent])])
        if to_bad[nearest_clean] <= to_bad[farthest_divergent]:
            return nearest_clean, farthest_divergent
        return None

    def block_ids(self) -> np.ndarray:
        """Block index of each hypothesis f = 1..n: a new block starts where commit f - 1 is
        testable, since f and f + 1 differ only in commit f."""
        starts = np.ones(self.n, dtype=bool)
        for u in self.untestable:
            if 1 <= u <= self.n - 1:
                starts[u] = False  # hypothesis u + 1 joins the block of u
        ids: np.ndarray = np.cumsum(starts) - 1
        return ids
