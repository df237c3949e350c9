"""The ranges a recipe's numbers must lie in, and the paths that must stay inside a folder.

A number out of range is accepted by the type check but wrong in a way that shows only much later
(``confidence = 1.5`` runs until the budget is spent, ``0`` answers at 66.7 %, a negative budget
stops at once without a word), so each is a one-line ``RecipeError`` at load time, naming the
key, the range and the file. The CLI flags that override these use the same bounds (click
ranges in ``bisect_tool/cli/``); overrides go through :func:`check_section` as well.

Swap-set entries are paths inside site-packages: an absolute one or one with ``..`` would place a
candidate's file outside the overlay (or a wheel member outside ``--out``), so they are refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from bisect_tool.errors import RecipeError, UsageError
from bisect_tool.kinds import kind_choices, narrow_choices


@dataclass(frozen=True)
class Bound:
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, x: float) -> bool:
        if not math.isfinite(x):
            return False
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return not (self.high is not None and (x >= self.high if self.high_open else x > self.high))

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            lo = "(" if self.low_open else "["
            hi = ")" if self.high_open else "]"
            return f"in {lo}{self.low:g}, {self.high:g}{hi}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"{'<' if self.high_open else '<='} {self.high:g}"


POSITIVE = Bound(0, low_open=True)
AT_LEAST_0 = Bound(0)
AT_LEAST_1 = Bound(1)
PROBABILITY = Bound(0, 1, low_open=True, high_open=True)

BOUNDS: dict[str, dict[str, Bound]] = {
    "search": {
        "confidence": PROBABILITY,
        "lifetimes_per_candidate": AT_LEAST_1,
        "max_evaluations": AT_LEAST_1,
        "max_end_lifetimes": AT_LEAST_1,
        "cost_new_candidate": AT_LEAST_0,
        "cost_lifetime": POSITIVE,  # a free lifetime would make every rate infinite
        # 1 would take the fast probe's flip as proven before any faithful lifetime
        "stand_in_prior": Bound(0, 1, high_open=True),
        # each end's doubt; 0.5 or more leaves no prior mass for any flip inside the range
        "end_doubt": Bound(0, 0.5, high_open=True),
        # 0 would need endless clean lifetimes; 1 rules out nothing but a bug in every one
        "clean_against_rate": PROBABILITY,
    },
    "artifacts": {
        "build_timeout_s": POSITIVE,
        "max_jobs": AT_LEAST_1,
        "cache_max_bytes": AT_LEAST_0,
        "prefetch": Bound(-1),  # -1: the run chooses
    },
    "runtime": {"boot_timeout_s": POSITIVE, "lifetimes_per_gpu": AT_LEAST_1,
                "gpus_per_lifetime": AT_LEAST_1, "most_servers_per_gpu": AT_LEAST_0},
    "probe": {
        "requests": AT_LEAST_1,
        "fillers": AT_LEAST_0,
        "prefix_tokens": AT_LEAST_0,
        "prompt_tokens": AT_LEAST_1,
        "filler_tokens": AT_LEAST_0,
        "vocab_size": Bound(2),
        "repeats": Bound(2),  # determinism is a comparison of at least two repeats
        "max_tokens": AT_LEAST_1,
        "logprobs": AT_LEAST_0,
        "jitter_ms": AT_LEAST_0,
        "target_coresidency": AT_LEAST_0,
        "request_timeout_s": POSITIVE,
        "control_attempts": AT_LEAST_1,
        "suspect_lifetimes": AT_LEAST_1,
        "batch_sizes": AT_LEAST_1,
        "needles": AT_LEAST_0,
        "warmup_requests": AT_LEAST_0,
        "negative_servers": AT_LEAST_1,
        "seeds": AT_LEAST_1,
        "hidden_sizes": AT_LEAST_1,
        "row_counts": AT_LEAST_1,
        "timeout_s": AT_LEAST_0,
    },
}


#: what to give instead, where the range alone does not say it
HINTS: dict[tuple[str, str], str] = {
    ("search", "clean_against_rate"): (
        "give the lowest share of lifetimes a bug before the flip may show in: 0.5 (the "
        "default) costs 8 clean lifetimes at the good end, 0.15 costs 33"),
}


# Keys whose value must be one of a few words; anything else would only fail inside a child
# process much later (the op check's child would refuse an unknown --abi with a usage error).
# ``[probe] kind`` and ``narrow`` are the probe kinds' (``choices``, ``narrow_choices``).
CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "probe": {"op_abi": ("torch", "ctypes"),
              "mode": ("repeats", "bs1-vs-bsN")},
    "runtime": {"backend": ("local", "docker", "ray"),
                "docker_gpu": ("auto", "toolkit", "devices")},
    "artifacts": {"build_executor": ("docker", "host"), "python_side": ("pinned", "candidate")},
}
#: the artifact sources a recipe may list (bisect_tool.artifacts.KNOWN_SOURCES, kept equal by
#: tests/test_inputs.py; not imported from there: that package imports the recipe module)
ARTIFACT_SOURCES = ("wheel-index", "release", "local", "source-build")


def choices(section: str) -> dict[str, tuple[str, ...]]:
    """The words each key of ``section`` may be: ``CHOICES``, with ``[probe] kind`` from the
    probe kinds registered now (``bisect_tool.kinds.KINDS``)."""
    if section != "probe":
        return CHOICES.get(section, {})
    probe = CHOICES["probe"]
    return {"op_abi": probe["op_abi"], "kind": kind_choices(), "mode": probe["mode"]}


def check_section(source: str, section: str, values: Mapping[str, Any]) -> None:
    """Raise a one-line RecipeError for the first value of ``section`` out of its range."""
    for key, allowed in choices(section).items():
        if key in values and values[key] not in allowed:
            raise RecipeError(
                f"{source}: '{section}.{key}' must be one of {', '.join(map(repr, allowed))}, "
                f"got {values[key]!r}"
            )
    for key, bound in BOUNDS.get(section, {}).items():
        if key not in values:
            continue
        raw = values[key]
        items = raw if isinstance(raw, list | tuple) else [raw]
        for item in items:
            if isinstance(item, int | float) and not isinstance(item, bool) and not bound.holds(
                float(item)
            ):
                hint = HINTS.get((section, key))
                raise RecipeError(
                    f"{source}: '{section}.{key}' must be {bound.describe()}, got {item}"
                    + (f"; {hint}" if hint else "")
                )
    per_gpu = values.get("lifetimes_per_gpu", "auto") if section == "runtime" else "auto"
    if isinstance(per_gpu, bool) or not isinstance(per_gpu, int | str) or (
            isinstance(per_gpu, str) and per_gpu != "auto"):
        raise RecipeError(
            f"{source}: 'runtime.lifetimes_per_gpu' must be \"auto\" or a whole number >= 1, "
            f"got {per_gpu!r}"
        )
    narrow = narrow_choices()
    if section == "probe" and values.get("narrow", "") not in narrow:
        raise RecipeError(
            f"{source}: 'probe.narrow' must be one of {', '.join(map(repr, narrow))}, "
            f"got {values['narrow']!r}"
        )
    if section == "range" and "release_tag" in values and "{version}" not in values["release_tag"]:
        raise RecipeError(
            f"{source}: 'range.release_tag' must contain {{version}} (e.g. \"v{{version}}\"), "
            f"got {values['release_tag']!r}"
        )
    if section == "artifacts" and "sources" in values:
        unknown = [v for v in values["sources"] if v not in ARTIFACT_SOURCES]
        if unknown:
            raise RecipeError(
                f"{source}: 'artifacts.sources' lists unknown source {unknown[0]!r}; known: "
                f"{', '.join(map(repr, ARTIFACT_SOURCES))}"
            )
    if section == "artifacts" and "swap_set" in values:
        for entry in values["swap_set"]:
            problem = relative_problem(entry)
            if problem:
                raise RecipeError(
                    f"{source}: swap_set entry '{entry}' {problem}; give a path inside "
                    "site-packages such as vllm/_C.abi3.so"
                )


def relative_problem(name: str) -> str:
    """Why ``name`` is not a plain relative path that stays inside its folder ('' if it is)."""
    if not name or not name.strip():
        return "is empty"
    if "\\" in name or "\0" in name:
        return "holds a backslash or NUL"
    path = PurePosixPath(name)
    if path.is_absolute():
        return "is an absolute path"
    if ".." in path.parts:
        return "climbs out of its folder with '..'"
    return ""


def inside(base: Path, name: str, what: str = "member") -> Path:
    """``base / name``, refused (one line) unless it stays inside ``base``."""
    problem = relative_problem(name)
    dest = base / name
    if not problem:
        try:
            dest.resolve().relative_to(base.resolve())
        except ValueError:
            problem = "leads outside the target folder (through a link)"
    if problem:
        raise UsageError(f"{what} '{name}' {problem}; refusing to write outside {base}")
    return dest
