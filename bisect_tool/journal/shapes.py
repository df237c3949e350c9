"""The shape each journal entry must have on reading (``bisect_tool.journal.entries`` holds the
kinds, how each is built and what each reads back as).

A journal is a file a user can edit, copy, truncate or mix up with another file (`bisect replay
FILE`), so a line that is valid JSON but not an entry this tool wrote (``[1,2,3]``, an
observation without a verdict, a position outside the range) must be a one-line error naming
the line, not a KeyError deep inside replay. Entry types this version does not know are kept
(a newer tool may add some); the types replay reads are checked field by field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from bisect_tool.strategy.tiers import Phase, Tier
from bisect_tool.values import Direction, Verdict

# -- checking them on reading ----------------------------------------------------------------

_VERDICTS = {str(v) for v in Verdict}
_DIRECTIONS = {str(d) for d in Direction}
_TIERS = {str(t) for t in Tier}
_PHASES = {str(p) for p in Phase}
_SEARCH_NUMBERS = ("confidence", "lifetimes_per_candidate", "max_evaluations",
                   "max_end_lifetimes", "cost_new_candidate", "cost_lifetime", "end_doubt",
                   "stand_in_prior", "clean_against_rate")


class ShapeError(ValueError):
    """What is wrong with one entry (the reader adds the file and line)."""


def _need(entry: Mapping[str, Any], key: str, kinds: type | tuple[type, ...]) -> Any:
    if key not in entry:
        raise ShapeError(f"lacks '{key}'")
    value = entry[key]
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ShapeError(f"'{key}' has the wrong type (bool)")
    if not isinstance(value, kinds):
        raise ShapeError(f"'{key}' has the wrong type ({type(value).__name__})")
    return value


def check_header(entry: Any) -> int:
    """Check the header line; returns how many candidates it lists."""
    if not isinstance(entry, dict):
        raise ShapeError("is not a JSON object")
    candidates = _need(entry, "candidates", list)
    _check_candidates(candidates)
    if _need(entry, "direction", str) not in _DIRECTIONS:
        raise ShapeError(f"has direction '{entry['direction']}', not regression or fix")
    recipe = entry.get("recipe", {})
    if not isinstance(recipe, dict):
        raise ShapeError("has a 'recipe' that is not an object")
    search = recipe.get("search", {})
    if not isinstance(search, dict):
        raise ShapeError("has a recipe 'search' that is not an object")
    for key in _SEARCH_NUMBERS:
        if key in search:
            _check_search_number(key, search[key])
    for key in ("session", "mode", "run_command", "repo", "good_ref", "bad_ref"):
        if key in entry and not isinstance(entry[key], str):
            raise ShapeError(f"'{key}' has the wrong type ({type(entry[key]).__name__})")
    return len(candidates)


def _check_candidates(candidates: list[Any]) -> None:
    if not candidates:
        raise ShapeError("lists no candidates")
    for c in candidates:
        if not isinstance(c, dict) or not isinstance(c.get("sha"), str):
            raise ShapeError("has a candidate without a 'sha' string")
        if not isinstance(c.get("subject", ""), str) or not isinstance(c.get("tags", []), list):
            raise ShapeError(f"has a malformed candidate {str(c.get('sha'))[:12]}")


def _check_search_number(key: str, v: Any) -> None:
    """One of the recipe's ``_SEARCH_NUMBERS``: a finite number in its range."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ShapeError(f"has a non-numeric search setting '{key}'")
    if key == "confidence" and not 0 < v < 1:
        raise ShapeError("has a search confidence outside (0, 1)")
    if key == "clean_against_rate" and not 0 < v < 1:
        raise ShapeError("has a search clean_against_rate outside (0, 1)")
    if key != "confidence" and v < 0:
        raise ShapeError(f"has a negative search setting '{key}'")
    if (key == "end_doubt" and v >= 0.5) or (key == "stand_in_prior" and v >= 1):
        raise ShapeError(f"has a search setting '{key}' out of its range")


def check_entry(entry: Any, candidates: int) -> None:
    """Check one entry after the header (``candidates``: how many the header lists)."""
    if not isinstance(entry, dict):
        raise ShapeError("is not a JSON object")
    kind = entry.get("type")
    if not isinstance(kind, str):
        raise ShapeError("has no 'type' string")
    if kind == "header":
        raise ShapeError("is a second header")
    if kind in ("observation", "untestable", "gate"):
        position = _need(entry, "position", int)
        if not 0 <= position < candidates:
            raise ShapeError(f"has position {position} outside the {candidates} candidates")
        _need(entry, "commit", str)
    check = _KIND_CHECKS.get(kind)
    if check is not None:
        check(entry, candidates)


def _check_observation(entry: dict[str, Any], candidates: int) -> None:
    _need(entry, "lifetime_id", str)
    if _need(entry, "verdict", str) not in _VERDICTS:
        raise ShapeError(f"has an unknown verdict '{entry['verdict']}'")
    if not isinstance(entry.get("detail", {}), dict):
        raise ShapeError("has a 'detail' that is not an object")
    if not isinstance(entry.get("message", ""), str):
        raise ShapeError("has a 'message' that is not a string")
    if entry.get("tier", "faithful") not in _TIERS:
        raise ShapeError(f"has an unknown tier '{entry.get('tier')}'")


def _check_phase(entry: dict[str, Any], candidates: int) -> None:
    if _need(entry, "phase", str) not in _PHASES:
        raise ShapeError(f"has an unknown phase '{entry['phase']}'")
    if entry["phase"] == "confirm":
        for key in ("bad_side", "good_side"):
            side = _need(entry, key, int)
            if not 0 <= side < candidates:
                raise ShapeError(f"has {key} {side} outside the {candidates} candidates")


def _check_end(entry: dict[str, Any], candidates: int) -> None:
    _need(entry, "state", str)
    if not isinstance(entry.get("message", ""), str):
        raise ShapeError("has a 'message' that is not a string")
    if not isinstance(entry.get("summary", {}), dict):
        raise ShapeError("has a 'summary' that is not an object")


def _check_controls(entry: dict[str, Any], candidates: int) -> None:
    for side in ("positive", "negative"):
        if not isinstance(entry.get(side) or {}, dict):
            raise ShapeError(f"has a '{side}' that is not an object")
    if not isinstance(entry.get("problem", ""), str):
        raise ShapeError("has a 'problem' that is not a string")


#: what each kind of entry after the header must hold besides its position (where it has one)
_KIND_CHECKS: dict[str, Callable[[dict[str, Any], int], None]] = {
    "observation": _check_observation,
    "phase": _check_phase,
    "end": _check_end,
    "controls": _check_controls,
}
