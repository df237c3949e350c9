"""A recipe's TOML values checked against its settings' field types: a wrong type is a
one-line ``RecipeError`` naming the key and the file; a misspelt key gets a "did you mean"."""

from __future__ import annotations

import difflib
import math
import types
import typing
from typing import Any

from bisect_tool.errors import RecipeError


def did_you_mean(key: str, known: typing.Iterable[str]) -> str:
    """" (did you mean 'max_tokens'?)" for a misspelt key, "" when none is close (difflib: the
    standard library's matcher; a schema library would not word it better)."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_value(source: str, where: str, value: Any, expected: Any) -> Any:
    """Check a TOML value against a field's type; tuples come from TOML arrays."""
    origin = typing.get_origin(expected)
    problem = f"{source}: '{where}' must be {describe_type(expected)}, got {type(value).__name__}"
    if expected is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RecipeError(problem)
        if not math.isfinite(value):  # TOML has nan and inf; no setting means either
            raise RecipeError(f"{source}: '{where}' must be a finite number, got {value}")
        return float(value)
    if expected is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecipeError(problem)
        return value
    if expected in (str, bool):
        if not isinstance(value, expected):
            raise RecipeError(problem)
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise RecipeError(problem)
        args = typing.get_args(expected)
        item_type = args[0]
        if len(args) == 2 and args[1] is not Ellipsis and len(value) != 2:
            raise RecipeError(f"{source}: '{where}' must have exactly 2 items")
        return tuple(check_value(source, where, item, item_type) for item in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise RecipeError(problem)
        return {str(k): check_value(source, f"{where}.{k}", v, str) for k, v in value.items()}
    if isinstance(expected, types.UnionType):
        return value
    raise RecipeError(f"{source}: cannot check '{where}'")


def describe_type(expected: Any) -> str:
    origin = typing.get_origin(expected)
    if origin is tuple:
        return f"a list of {describe_type(typing.get_args(expected)[0])}"
    if origin is dict:
        return "a table of strings"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        expected, str(expected)
    )
