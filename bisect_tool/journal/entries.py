"""Journal entries: their types, how each is built, and the shape each must have on reading.

The journal (``bisect_tool.journal``) is one JSON object per line; this module is the only place
that knows what those objects hold. Writers build entries with the functions below (typed as the
``TypedDict`` of their kind); ``journal.read`` checks every line it reads with ``check_header`` and
``check_entry``. ``JOURNAL_VERSION`` is the header's ``version``: a journal of another version is
refused with a one-line error naming the version that wrote it.

Kinds (``"type"``), each written before the next step:

- ``header`` (first line): version, session id, repo, good/bad refs and SHAs, direction, the
  ordered candidates (old end first, new end last, both ends included), the recipe as a dict,
  mode (``manual``, ``run``, ``recipe``, ``locate``), tool version, command line;
- ``observation``: one lifetime (lifetime id, commit, position, verdict, detail, message,
  duration; ``tier`` for the fast probe's runs, ``cell`` in a locate journal, ``carried_from``
  for a release's observation carried into the commit-level run). A lifetime id counts once;
- ``untestable``: a whole candidate (older journals; the gate's refusals in a release-level
  run's sweep, with ``stage``);
- ``gate``: a candidate the gate's sweep let through (the pinned stack loads its files);
- ``controls``: the positive and negative controls (``ok``, ``problem``, both results);
- ``environment``: facts for the report (GPU, driver, versions, interpreter);
- ``phase``: the tiered search moves on (``narrow`` -> ``confirm`` -> ``faithful``);
- ``end``: the end state, its message, and the summary (``finding`` in a locate journal).

A journal is a file a user can edit, copy, truncate or mix up with another file (`bisect replay
FILE`), so a line that is valid JSON but not an entry this tool wrote (``[1,2,3]``, an
observation without a verdict, a position outside the range) must be a one-line error naming
the line, not a KeyError deep inside replay. Entry types this version does not know are kept
(a newer tool may add some); the types replay reads are checked field by field.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypedDict

from bisect_tool.strategy.tiers import Phase, Tier
from bisect_tool.values import Direction, Observation, Verdict

JOURNAL_VERSION = 1


# -- the kinds ------------------------------------------------------------------------------------


class HeaderEntry(TypedDict, total=False):
    type: Literal["header"]
    version: int
    session: str
    repo: str
    good_ref: str
    bad_ref: str
    good: str
    bad: str
    direction: str
    paths: list[str]
    # where the range sits: the main line (release tags map to where their branch left it), the
    # merge base standing in for the older end when the ends are not on one line of history, and
    # what the path filter left out ([why, count])
    mainline: str
    merge_base: str
    path_left_out: list[list[Any]]
    candidates: list[dict[str, Any]]
    recipe: dict[str, Any]
    mode: str
    tool_version: str
    command: list[str]
    # a clone's: where its commits come from, and where the report's links point
    remote_url: str
    repo_url: str
    # mode "run": the command and its timeout
    run_command: str
    run_timeout: float
    # a release-level run (level "release"): the listing it bisects, and where it goes next
    level: str
    package: str
    index_url: str
    listing_source: str
    listing_note: str
    left_out: list[list[str]]
    release_tag: str
    then_repo: str
    commit_sources: list[str]
    # a commit-level run that a release-level one handed over to: that run's summary
    previous: dict[str, Any]
    # bisect locate
    lifetimes_per_cell: int
    python_dirs: dict[str, str]
    releases_between: int  # release ends: the releases listed between them (none: adjacent)


class ObservationEntry(TypedDict, total=False):
    type: Literal["observation"]
    lifetime_id: str
    commit: str
    position: int
    verdict: str
    detail: dict[str, Any]
    message: str
    duration_s: float
    tier: str  # absent = faithful: journals from before the tiers read the same
    cell: str  # bisect locate: which (Python side, compiled side)
    carried_from: str  # a release's observation carried into the commit-level run


class ControlsEntry(TypedDict, total=False):
    type: Literal["controls"]
    commit: str
    ok: bool
    problem: str
    positive: dict[str, Any]
    negative: dict[str, Any]
    attempts: int  # lifetimes they took (the positive control may be intermittent too)
    untestable: bool  # the candidate could not run them (gate, boot): they move to another
    suspects: dict[str, Any]  # [probe] suspects: which settings showed divergence there


class UntestableEntry(TypedDict, total=False):
    type: Literal["untestable"]
    commit: str
    position: int
    message: str
    stage: str  # where it could not run: "gate", "artifacts"
    duration_s: float


class GateEntry(TypedDict, total=False):
    type: Literal["gate"]
    commit: str
    position: int
    ok: bool
    duration_s: float


class PhaseEntry(TypedDict, total=False):
    type: Literal["phase"]
    phase: str
    message: str
    bad_side: int
    good_side: int
    narrow_flip: str
    narrow_confidence: float


class EndEntry(TypedDict, total=False):
    type: Literal["end"]
    state: str
    message: str
    summary: dict[str, Any]
    finding: dict[str, Any]  # bisect locate


# -- building them ---------------------------------------------------------------------------


def header(
    *,
    session: str,
    mode: str,
    candidates: Sequence[Mapping[str, Any]],
    direction: str,
    good: str,
    bad: str,
    good_ref: str,
    bad_ref: str,
    repo: str = "",
    recipe: Mapping[str, Any] | None = None,
    command: Sequence[str] = (),
    paths: Sequence[str] = (),
    tool_version: str = "",
    **more: Any,
) -> HeaderEntry:
    """The header; ``more``: a mode's own fields (a release-level run's listing, say)."""
    entry: HeaderEntry = {
        "type": "header", "version": JOURNAL_VERSION, "session": session, "repo": repo,
        "good_ref": good_ref, "bad_ref": bad_ref, "good": good, "bad": bad,
        "direction": direction, "paths": list(paths),
        "candidates": [dict(c) for c in candidates], "recipe": dict(recipe or {}),
        "mode": mode, "tool_version": tool_version, "command": list(command),
    }
    entry.update(more)  # type: ignore[typeddict-item]
    return entry


def observation(
    obs: Observation, position: int, *, tier: Tier = Tier.FAITHFUL, cell: str = ""
) -> ObservationEntry:
    """One finished lifetime."""
    entry: ObservationEntry = {
        "type": "observation",
        "lifetime_id": obs.lifetime_id,
        "commit": obs.commit,
        "position": position,
        "verdict": str(obs.verdict),
        "detail": obs.detail,
        "message": obs.message,
        "duration_s": round(obs.duration_s, 3),
    }
    if tier is not Tier.FAITHFUL:
        entry["tier"] = str(tier)
    if cell:
        entry["cell"] = cell
    return entry


def controls(
    commit: str, ok: bool, problem: str, results: Mapping[str, Any], *, attempts: int = 1,
    untestable: bool = False, suspects: Mapping[str, Any] | None = None,
) -> ControlsEntry:
    """The controls on ``commit``; ``results``: the positive and negative probe results."""
    entry: ControlsEntry = {
        "type": "controls", "commit": commit, "ok": ok, "problem": problem,
        "positive": dict(results.get("positive") or {}),
        "negative": dict(results.get("negative") or {}),
        "attempts": attempts,
    }
    if untestable:
        entry["untestable"] = True
    if suspects:
        entry["suspects"] = dict(suspects)
    return entry


def untestable(
    commit: str, position: int, message: str, *, stage: str = "", duration_s: float = 0.0
) -> UntestableEntry:
    """A whole candidate the faithful tier cannot run (``stage``: what refused it)."""
    entry: UntestableEntry = {"type": "untestable", "commit": commit, "position": position,
                              "message": message}
    if stage:
        entry["stage"] = stage
    if duration_s:
        entry["duration_s"] = round(duration_s, 3)
    return entry


def gate_passed(commit: str, position: int, *, duration_s: float = 0.0) -> GateEntry:
    """The gate's sweep let ``commit`` through: the pinned stack loads its compiled files."""
    return {"type": "gate", "commit": commit, "position": position, "ok": True,
            "duration_s": round(duration_s, 3)}


def environment(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The environment the lifetimes ran in (``runtime.environment.environment_facts``)."""
    return {"type": "environment", **facts}


def phase(
    to: Phase,
    message: str,
    *,
    bad_side: int | None = None,
    good_side: int | None = None,
    narrow_flip: str = "",
    narrow_confidence: float | None = None,
) -> PhaseEntry:
    """The tiered search moves to ``to``; a confirm step names its two sides."""
    entry: PhaseEntry = {"type": "phase", "phase": str(to), "message": message}
    if bad_side is not None and good_side is not None:
        entry["bad_side"] = bad_side
        entry["good_side"] = good_side
    if narrow_flip:
        entry["narrow_flip"] = narrow_flip
    if narrow_confidence is not None:
        entry["narrow_confidence"] = narrow_confidence
    return entry


def end(
    state: str,
    message: str,
    *,
    summary: Mapping[str, Any] | None = None,
    finding: Mapping[str, Any] | None = None,
) -> EndEntry:
    entry: EndEntry = {"type": "end", "state": state, "message": message}
    if summary is not None:
        entry["summary"] = dict(summary)
    if finding is not None:
        entry["finding"] = dict(finding)
    return entry


def carried(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry of another journal as this one keeps it: its place there (``seq``, ``time``)
    left behind, the journal it is appended to writes its own."""
    return {k: v for k, v in entry.items() if k not in ("seq", "time")}


def carried_observation(entry: Mapping[str, Any], commit: str, position: int) -> dict[str, Any]:
    """A release-level observation carried into the commit-level run: re-keyed to the commit
    the release's tag names, at its position there, saying which release it came from."""
    return {**carried(entry), "commit": commit, "position": position,
            "carried_from": str(entry["commit"])}


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
