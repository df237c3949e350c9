"""Which side carries the change: the swap matrix of ``bisect locate`` (issue 18). Pure.

In the seed thread (vLLM issue 51187) the decisive step, done by hand, was to keep the Python
side of one release and swap in the compiled extension of the other: it showed the bug lives in
``_C``, not in the scheduler. ``bisect locate`` runs the probe on the four cells {good, bad}
Python side x {good, bad} compiled side, and weighs six explanations of what it sees:

- ``compiled``: the bug follows the compiled side (cells with the bad end's extension show it);
- ``python``: it follows the Python side;
- ``interaction``: only the bad end's own pair shows it (it needs both sides);
- ``either``: either bad side alone is enough (both sides carry a change);
- ``nothing``: not even the bad end's own pair shows it (nothing reproduced);
- ``everywhere``: the good end's own pair shows it too (the good end is not good).

A cell showing the bug diverges with an unknown probability p per lifetime, one not showing it
with a small false-alarm rate q, both integrated out with the search's own priors
(``strategy.Priors``: p ~ Beta(2, 1) with a point mass at 1, q ~ Beta(0.5, 50)). A cell the
compatibility gate rejects (its crossing cannot load: an op schema differs) gives no data, so
explanations that differ only there stay tied, and the answer says which cell kept them apart.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass

from bisect_tool.strategy import Priors, log_sequence


class Side(enum.StrEnum):
    GOOD = "good"
    BAD = "bad"


@dataclass(frozen=True)
class Cell:
    """One combination: whose Python side, whose compiled extension."""

    python: Side
    compiled: Side

    @property
    def key(self) -> str:
        return f"python={self.python},compiled={self.compiled}"

    @classmethod
    def from_key(cls, key: str) -> Cell:
        parts = dict(item.split("=", 1) for item in key.split(","))
        return cls(Side(parts["python"]), Side(parts["compiled"]))

    def describe(self, good: str, bad: str) -> str:
        py = good if self.python is Side.GOOD else bad
        c = good if self.compiled is Side.GOOD else bad
        if py == c:
            return f"{py} as released (its own Python and compiled side)"
        return f"{py}'s Python with {c}'s compiled extension"


GG = Cell(Side.GOOD, Side.GOOD)
GB = Cell(Side.GOOD, Side.BAD)
BG = Cell(Side.BAD, Side.GOOD)
BB = Cell(Side.BAD, Side.BAD)
#: the order lifetimes are first handed out in: the bad end's own pair shows whether there is
#: anything to locate; the crossings tell the sides apart; the good end's pair is the baseline
CELLS = (BB, GB, BG, GG)


class Explanation(enum.StrEnum):
    COMPILED = "compiled"
    PYTHON = "python"
    INTERACTION = "interaction"
    EITHER = "either"
    NOTHING = "nothing"
    EVERYWHERE = "everywhere"


#: the cells that show the bug under each explanation
BUGGY: dict[Explanation, frozenset[Cell]] = {
    Explanation.COMPILED: frozenset({GB, BB}),
    Explanation.PYTHON: frozenset({BG, BB}),
    Explanation.INTERACTION: frozenset({BB}),
    Explanation.EITHER: frozenset({GB, BG, BB}),
    Explanation.NOTHING: frozenset(),
    Explanation.EVERYWHERE: frozenset({GG, GB, BG, BB}),
}
#: prior belief: one side carries a bisectable change far more often than both do; the last two
#: say the ends are not what they were given as (as the search's end_doubt does)
PRIOR: dict[Explanation, float] = {
    Explanation.COMPILED: 0.35,
    Explanation.PYTHON: 0.35,
    Explanation.INTERACTION: 0.1,
    Explanation.EITHER: 0.1,
    Explanation.NOTHING: 0.05,
    Explanation.EVERYWHERE: 0.05,
}


@dataclass(frozen=True)
class CellCounts:
    divergent: int = 0
    total: int = 0  # conclusive lifetimes (CLEAN or DIVERGENT)
    untestable: str = ""  # why the cell cannot run at all ("" = it can)


def _log_p_side(d: int, t: int, priors: Priors) -> float:
    """log P(a given sequence with d divergent of t | the cells show the bug), p integrated."""
    w = priors.p_point_mass
    beta = log_sequence(d, t, priors.p_alpha, priors.p_beta)
    terms = [math.log1p(-w) + beta] if w < 1 else []
    if w > 0 and d == t:
        terms.append(math.log(w))
    top = max(terms)
    return top + math.log(sum(math.exp(x - top) for x in terms))


def _log_q_side(d: int, t: int, priors: Priors) -> float:
    return log_sequence(d, t, priors.q_alpha, priors.q_beta)


def log_likelihood(
    explanation: Explanation, counts: Mapping[Cell, CellCounts], priors: Priors
) -> float:
    bug_d = bug_t = ok_d = ok_t = 0
    for cell in CELLS:
        c = counts.get(cell, CellCounts())
        if cell in BUGGY[explanation]:
            bug_d, bug_t = bug_d + c.divergent, bug_t + c.total
        else:
            ok_d, ok_t = ok_d + c.divergent, ok_t + c.total
    return _log_p_side(bug_d, bug_t, priors) + _log_q_side(ok_d, ok_t, priors)


#: the search's priors, but with less mass at p = 1: four cells of a few lifetimes each let
#: three or four divergences in a row "prove" p = 1, and then a few clean lifetimes of a
#: crossing that does show the bug at p = 0.5 settle the wrong side (3% of such runs, in
#: simulation, at the search's 0.2)
LOCATE_PRIORS = Priors(p_point_mass=0.05, p_alpha=1.0, p_beta=1.0)


def posterior(
    counts: Mapping[Cell, CellCounts], priors: Priors | None = None
) -> dict[Explanation, float]:
    """P(explanation | the cells' lifetimes), p and q integrated out."""
    priors = priors or LOCATE_PRIORS
    logs = {
        e: math.log(PRIOR[e]) + log_likelihood(e, counts, priors) for e in Explanation
    }
    top = max(logs.values())
    weights = {e: math.exp(v - top) for e, v in logs.items()}
    total = sum(weights.values())
    return {e: w / total for e, w in weights.items()}


#: lifetimes of each runnable cell before an answer is given
MIN_PER_CELL = 2


def stop_threshold(confidence: float) -> float:
    """As the search's (``bisect_tool.strategy.stop_threshold``): stricter than the confidence."""
    return 1 - (1 - confidence) / 2


def _entropy(dist: Mapping[Explanation, float]) -> float:
    return -sum(p * math.log2(p) for p in dist.values() if p > 0)


def _with(counts: Mapping[Cell, CellCounts], cell: Cell, divergent: bool) -> dict[Cell, CellCounts]:
    out = dict(counts)
    c = out.get(cell, CellCounts())
    out[cell] = CellCounts(c.divergent + int(divergent), c.total + 1, c.untestable)
    return out


def information(counts: Mapping[Cell, CellCounts], cell: Cell, priors: Priors) -> float:
    """Expected drop in the entropy over the explanations (bits) from one lifetime of ``cell``."""
    now = posterior(counts, priors)
    gain = _entropy(now)
    for divergent in (True, False):
        after = _with(counts, cell, divergent)
        # P(outcome) = sum over explanations of P(e) P(outcome | e, data): a ratio of marginals
        prob = 0.0
        for e, pe in now.items():
            if pe > 0:
                prob += pe * math.exp(
                    log_likelihood(e, after, priors) - log_likelihood(e, counts, priors)
                )
        if prob > 0:
            gain -= prob * _entropy(posterior(after, priors))
    return max(gain, 0.0)


def next_cell(
    counts: Mapping[Cell, CellCounts], max_per_cell: int, priors: Priors | None = None
) -> Cell | None:
    """The cell to run next: each runnable cell once first (CELLS' order), then the one whose
    lifetime is worth the most; None when no runnable cell has lifetimes left or is worth one."""
    priors = priors or LOCATE_PRIORS
    runnable = [
        c for c in CELLS
        if not counts.get(c, CellCounts()).untestable
        and counts.get(c, CellCounts()).total < max_per_cell
    ]
    for floor in range(MIN_PER_CELL):
        for cell in runnable:
            if counts.get(cell, CellCounts()).total <= floor:
                return cell
    scored = [(information(counts, c, priors), c) for c in runnable]
    scored = [(g, c) for g, c in scored if g > 1e-6]
    if not scored:
        return None
    return max(scored, key=lambda gc: gc[0])[1]


@dataclass(frozen=True)
class Finding:
    """What ``bisect locate`` concludes (plain values)."""

    explanation: Explanation
    probability: float
    posterior: dict[Explanation, float]
    decided: bool  # the top explanation holds the asked confidence
    tied: tuple[Explanation, ...]  # explanations no runnable cell can tell apart from the top


def conclude(
    counts: Mapping[Cell, CellCounts], confidence: float, priors: Priors | None = None
) -> Finding:
    priors = priors or LOCATE_PRIORS
    post = posterior(counts, priors)
    top = max(post, key=lambda e: post[e])
    runnable = [c for c in CELLS if not counts.get(c, CellCounts()).untestable]
    tied = tuple(
        e for e in Explanation
        if e is not top and all((c in BUGGY[e]) == (c in BUGGY[top]) for c in runnable)
    )
    # every runnable cell speaks at least MIN_PER_CELL times before an answer: a single clean
    # lifetime of a crossing says little when the bug shows in half the lifetimes
    enough = all(counts.get(c, CellCounts()).total >= MIN_PER_CELL for c in runnable)
    decided = enough and post[top] >= stop_threshold(confidence)
    return Finding(top, post[top], post, decided, tied)


#: what each explanation means for the next step, in words
MEANING: dict[Explanation, str] = {
    Explanation.COMPILED: "the compiled side carries the change: bisect with the swap set, the "
    "Python side pinned",
    Explanation.PYTHON: "the Python side carries the change: bisect with whole wheels or --run, "
    "the compiled side pinned",
    Explanation.INTERACTION: "an interaction: only the bad end's Python and compiled side "
    "together show it",
    Explanation.EITHER: "both sides carry a change: either one alone shows it",
    Explanation.NOTHING: "nothing reproduced: the bad end's own pair did not show the bug",
    Explanation.EVERYWHERE: "the good end shows the bug too: it is not a good end for this probe",
}
