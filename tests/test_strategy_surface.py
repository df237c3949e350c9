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
    "mark_untestable", "retire", "mark_prepared", "set_prior", "set_costs",
}


def test_the_strategy_exposes_only_its_surface() -> None:
    public = {name for name in vars(BayesianStrategy) if not name.startswith("_")}
    assert public == SURFACE


def _outside() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if STRATEGY not in p.parents]


def test_no_caller_imports_a_part_of_the_strategy() -> None:
    offenders = []
    for path in _outside():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "bisect_tool.strategy."
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}: {node.module}")
            if isinstance(node, ast.Import):
                offenders += [f"{path.relative_to(PACKAGE)}: {a.name}" for a in node.names
                              if a.name.startswith("bisect_tool.strategy.")]
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
