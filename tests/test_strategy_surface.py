"""Issue 29: the strategy's surface stays small. Callers use ``BayesianStrategy``'s few methods
and the package's plain values; none imports a part of the package or reaches a private name."""

from __future__ import annotations

import ast
from pathlib import Path

from bisect_tool.strategy import BayesianStrategy

PACKAGE = Path(__file__).resolve().parent.parent / "bisect_tool"
STRATEGY = PACKAGE / "strategy"

#: everything a caller may use of a strategy
SURFACE = {
    "record", "select", "select_batch", "posterior", "summary", "rates",
    "mark_untestable", "retire", "mark_prepared", "set_prior", "set_costs", "summary_under",
}


def test_the_strategy_exposes_only_its_surface() -> None:
    public = {name for name in vars(BayesianStrategy) if not name.startswith("_")}
    assert public == SURFACE


#: the strategy's own parts; the package's other modules (the tiers, the locate matrix, the
#: ends' checks, the lookahead, the simulated histories) are its callers, kept beside it
PARTS = {"__init__", "bayes", "beta", "evidence", "information", "posterior", "rates",
         "selection", "values"}


def _outside() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if not (p.parent == STRATEGY and p.stem in PARTS)]


def _a_part(module: str) -> bool:
    head, _, rest = module.partition("bisect_tool.strategy.")
    return not head and rest.split(".")[0] in PARTS


def test_no_caller_imports_a_part_of_the_strategy() -> None:
    offenders = []
    for path in _outside():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and _a_part(node.module or ""):
                offenders.append(f"{path.relative_to(PACKAGE)}: {node.module}")
            if isinstance(node, ast.Import):
                offenders += [f"{path.relative_to(PACKAGE)}: {a.name}" for a in node.names
                              if _a_part(a.name)]
    assert not offenders


def test_no_caller_reaches_a_private_member_of_a_strategy() -> None:
    """``strategy._x`` / ``self.strategy._x`` anywhere outside the package."""
    offenders = []
    for path in _outside():
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                base = node.value
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name in ("strategy", "narrow", "faithful") or name.endswith("_strategy"):
                    offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.attr}")
    assert not offenders


def test_no_part_of_the_strategy_is_over_500_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in STRATEGY.glob("*.py")}
    assert max(sizes.values()) <= 500, sizes
