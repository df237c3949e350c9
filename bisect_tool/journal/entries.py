"""Journal entries: their types, how each is built, and what each reads back as.

The journal (``bisect_tool.journal``) is one JSON object per line; this module and its sibling
``bisect_tool.journal.shapes`` (the shape each must have on reading) are the only places that
know what those objects hold. Writers build entries with the functions below (typed as the
``TypedDict`` of their kind); ``journal.read`` checks every line it reads
(``shapes.check_header``, ``shapes.check_entry``), and readers take each entry as its kind's
frozen value (``parse``, ``JournalContents.observed``), never by key. ``JOURNAL_VERSION`` is
the header's ``version``: a journal of another version is refused with a one-line error naming
the version that wrote it.

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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from bisect_tool.strategy.tiers import Phase, Tier
from bisect_tool.values import Observation, Verdict

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


# -- reading them back: one frozen value per kind ---------------------------------------------
#
# Replay reads entries through these, never by key: ``parse`` gives each kind's fields their
# types and defaults (an older journal's missing ``tier`` is the faithful tier) in one place.
# ``check_entry`` has already refused a line whose fields have the wrong type.


@dataclass(frozen=True)
class Observed:
    """An ``observation`` entry: one lifetime."""

    lifetime_id: str
    commit: str
    position: int
    verdict: Verdict
    tier: Tier = Tier.FAITHFUL
    detail: Mapping[str, Any] = field(default_factory=dict)
    message: str = ""
    duration_s: float = 0.0
    cell: str = ""
    carried_from: str = ""
    seq: int | None = None  # its place in the journal (``Journal.append`` numbers entries)


@dataclass(frozen=True)
class Refused:
    """An ``untestable`` entry: a whole candidate the faithful tier cannot run."""

    commit: str
    position: int
    message: str = ""
    stage: str = ""
    duration_s: float = 0.0


@dataclass(frozen=True)
class GateLetThrough:
    """A ``gate`` entry: the gate's sweep let a candidate through."""

    commit: str
    position: int
    duration_s: float = 0.0


@dataclass(frozen=True)
class ControlsRan:
    """A ``controls`` entry; ``entry``: the entry itself, which the report and the controls'
    checks read whole."""

    commit: str
    ok: bool
    problem: str
    untestable: bool
    entry: Mapping[str, Any]


@dataclass(frozen=True)
class PhaseChanged:
    """A ``phase`` entry: the tiered search moves on; a confirm step names its two sides."""

    phase: Phase
    message: str = ""
    bad_side: int | None = None
    good_side: int | None = None
    entry: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Ended:
    """An ``end`` entry."""

    state: str
    message: str
    entry: Mapping[str, Any]


@dataclass(frozen=True)
class Other:
    """An entry replay does not count (``environment``, a newer tool's kind)."""

    kind: str
    entry: Mapping[str, Any]


Entry = Observed | Refused | GateLetThrough | ControlsRan | PhaseChanged | Ended | Other


def _float(value: Any) -> float:
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0  # a duration a user edited into text: no timing, not an error


def observed(entry: Mapping[str, Any]) -> Observed:
    """An ``observation`` entry as its value."""
    detail = entry.get("detail")
    return Observed(
        lifetime_id=str(entry.get("lifetime_id") or ""), commit=str(entry["commit"]),
        position=int(entry["position"]), verdict=Verdict(entry["verdict"]),
        tier=Tier(entry.get("tier") or Tier.FAITHFUL),
        detail=detail if isinstance(detail, dict) else {},
        message=str(entry.get("message") or ""), duration_s=_float(entry.get("duration_s")),
        cell=str(entry.get("cell") or ""), carried_from=str(entry.get("carried_from") or ""),
        seq=entry["seq"] if isinstance(entry.get("seq"), int) else None)


def refused(entry: Mapping[str, Any]) -> Refused:
    """An ``untestable`` entry as its value."""
    return Refused(str(entry["commit"]), int(entry["position"]), str(entry.get("message") or ""),
                   str(entry.get("stage") or ""), _float(entry.get("duration_s")))


def parse(entry: Mapping[str, Any]) -> Entry:
    """One entry after the header, as its kind's value."""
    kind = str(entry.get("type") or "")
    if kind == "observation":
        return observed(entry)
    if kind == "untestable":
        return refused(entry)
    if kind == "gate":
        return GateLetThrough(str(entry["commit"]), int(entry["position"]),
                              _float(entry.get("duration_s")))
    if kind == "controls":
        return ControlsRan(str(entry.get("commit") or ""), bool(entry.get("ok")),
                           str(entry.get("problem") or ""), bool(entry.get("untestable")), entry)
    if kind == "phase":
        bad, good = entry.get("bad_side"), entry.get("good_side")
        return PhaseChanged(Phase(entry["phase"]), str(entry.get("message") or ""),
                            None if bad is None else int(bad),
                            None if good is None else int(good), entry)
    if kind == "end":
        return Ended(str(entry.get("state") or ""), str(entry.get("message") or ""), entry)
    return Other(kind, entry)
