"""What ``bisect locate`` runs its cells with: one Python side per end, and evaluators per side.

A *Python side* is an end's package with its own swap set (``artifacts.stacks``, reached
through the provider's ``python_side``); a cell is one lifetime of that Python side with the
other end's compiled files laid over it by the runtime, exactly as a bisect candidate is.
``Sides`` is what the matrix needs of them, and all it needs: ``bisect_tool.run.locate`` takes it
through a seam, so a test drives a locate with plain values; ``open_python_sides`` is the
recipe's own, the one the CLI runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_tool.errors import UsageError
from bisect_tool.events import Note, Observer, ignore, notes_to
from bisect_tool.interfaces import Evaluator
from bisect_tool.range import Candidate
from bisect_tool.recipes.recipe import Recipe
from bisect_tool.run.engine import ControlsFor, no_controls
from bisect_tool.strategy.matrix import Side
from bisect_tool.values import short


def _no_facts() -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Sides:
    """The evaluators of a locate's cells: one per Python side, by the side's name ("good",
    "bad"; each runs the compiled side of the end whose commit it is given), how many lifetimes
    may run at once, the controls runner of the good end's own pair, and the environment the
    cells run in (the journal's ``environment`` entry, asked once they are open)."""

    arms: Mapping[str, Evaluator]
    slots: int = 1
    controls_for: ControlsFor = no_controls
    environment: Callable[[], Mapping[str, Any]] = field(default=_no_facts)


def compiled_only(recipe: Recipe) -> Recipe:
    """The recipe with its swap set cut to the compiled files: in a cell they are the compiled
    side; a Python file a recipe swaps too (demo-python swaps demollm/model.py) belongs to the
    Python side, which is the end's whole package."""
    from bisect_tool.runtime.schemas import is_extension

    compiled = tuple(p for p in recipe.artifacts.swap_set if is_extension(p))
    if not compiled:
        raise UsageError(
            f"recipe {recipe.name!r} swaps no compiled file "
            f"({', '.join(recipe.artifacts.swap_set)}): there is no compiled side to locate"
        )
    return recipe.override("artifacts", swap_set=compiled)


@contextmanager
def open_python_sides(
    recipe: Recipe,
    ends: Mapping[Side, Candidate],
    *,
    state_dir: Path,
    session: str,
    repo: Path | None = None,
    from_releases: bool = False,
    python_dirs: Mapping[Side, Path] | None = None,
    observer: Observer = ignore,
) -> Iterator[Sides]:
    """A server evaluator per Python side (one backend each, pinned to that side's stack,
    sharing one provider of compiled files and one GPU pool). Each side is the folder
    ``python_dirs`` gives for it, else the end's release wheel (``from_releases``), else its
    package in the clone ``repo``."""
    from bisect_tool.artifacts.stacks import side_from_dir
    from bisect_tool.run.wiring import open_compiled, open_sides, side_recipe
    from bisect_tool.runtime.weights import resolve_weights

    given = python_dirs or {}
    package = recipe.artifacts.package
    compiled = compiled_only(resolve_weights(recipe, progress=notes_to(observer)))
    if compiled.runtime.backend != "local":
        raise UsageError(
            "bisect locate boots each (Python side, compiled side) pair with the local backend; "
            "drop --backend (containers pin one image's Python side)"
        )
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    tags = {end.sha: end.tags for end in ends.values()}
    where = repo if repo is not None else state_dir
    with open_compiled(
        compiled, where, log_dir=state_dir / "logs", session=session, observer=observer
    ) as provider:
        sides: dict[Side, Path] = {}
        for side, end in ends.items():
            if side in given:
                sides[side] = side_from_dir(given[side], package)
                continue
            sides[side] = provider.python_side(
                end.sha, end.tags, key=f"{short(end.sha)}-{recipe.name}", package=package,
                clone=None if from_releases else repo, index_url=recipe.artifacts.index_url,
            )
        for side, path in sides.items():
            observer(Note(f"{side} end's Python side: {path}"))
        recipes = {str(side): side_recipe(compiled, path) for side, path in sides.items()}
        with open_sides(
            recipes, provider, repo=where, state_dir=state_dir, session=session, tags=tags,
            observer=observer,
        ) as (evaluators, slots):
            yield Sides(
                {name: e.faithful for name, e in evaluators.items()}, slots,
                evaluators[str(Side.GOOD)].controls_for, lambda: _environment(recipes, sides),
            )


def _environment(recipes: Mapping[str, Recipe], sides: Mapping[Side, Path]) -> dict[str, Any]:
    """What the report's environment block shows for a locate: the machine and the bad end's
    Python side (as a bisect's pinned stack), and per side its package's version and the
    sha256 of each compiled file it holds besides the swap set, so the report can say which
    files were the same in every cell (issue 32: 0.27.0's Python side ran with 0.26.0's FA3,
    and nothing in the report said so)."""
    from bisect_tool.runtime.environment import environment_facts
    from bisect_tool.runtime.schemas import is_extension

    facts = environment_facts(recipes[str(Side.BAD)])
    per_side: dict[str, Any] = {}
    for side, path in sides.items():
        swap = set(recipes[str(side)].artifacts.swap_set)
        files: dict[str, str] = {}
        for found in sorted(path.rglob("*")):
            rel = found.relative_to(path).as_posix()
            if found.is_file() and is_extension(rel) and rel not in swap:
                digest = hashlib.sha256()
                with found.open("rb") as fh:
                    while block := fh.read(1 << 20):
                        digest.update(block)
                files[rel] = digest.hexdigest()
        per_side[str(side)] = {"files": files}
    facts["sides"] = per_side
    return facts
