"""``bisect locate``: which side carries the change, before any bisect (issue 18).

Runs the recipe's faithful probe on the four cells of ``bisect_tool.strategy.matrix`` ({good, bad}
Python
side x {good, bad} compiled side), several fresh lifetimes each, with the controls on the good
end's own pair, and weighs the explanations under the search's intermittency model. Each Python
side is the end's package with its own swap set (``artifacts.stacks``); a cell is one lifetime
of that Python side with the other end's swap set laid over it by the runtime, exactly as a
bisect candidate is, and the compatibility gate decides whether a crossing can load at all.
The evaluators come through a seam (``OpenSides``): the recipe's own (``locate_sides``) by
default, plain values in a test.

The journal (``locate.jsonl`` in the state dir) is opened as a bisect's is
(``journal.open_journal``), written before the next step and replayed on ``bisect locate``
again, so a killed run loses nothing. ``bisect start --locate`` runs this
first and bisects only when the compiled side carries the change.
"""

from __future__ import annotations

import dataclasses
import shlex
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool import journal as journal_mod
from bisect_tool.designs.locate import LocateDesign
from bisect_tool.errors import NoAnswer, UsageError
from bisect_tool.events import Observer, ignore
from bisect_tool.journal import entries
from bisect_tool.range import Candidate
from bisect_tool.recipes.recipe import BUNDLED_DIR, Recipe
from bisect_tool.run.engine import Engine
from bisect_tool.run.locate_sides import Sides, compiled_only, open_python_sides
from bisect_tool.strategy.matrix import (
    CELLS,
    GG,
    MEANING,
    Cell,
    CellCounts,
    Explanation,
    Finding,
    Side,
)
from bisect_tool.values import percent
from bisect_tool.verdict import EndState

LOCATE_JOURNAL = "locate.jsonl"


@dataclass(frozen=True)
class LocateRequest:
    """What ``bisect locate`` was asked, after its flags were parsed."""

    good: str
    bad: str
    recipe: Recipe
    state_dir: Path
    repo: Path | None = None  # a clone: commits, and Python sides from git
    releases: Any = None  # run.ReleaseRequest: the ends are releases of the recipe's package
    python_dirs: Mapping[Side, Path] = dataclasses.field(default_factory=dict)
    lifetimes_per_cell: int = 24
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class LocateOutcome:
    finding: Finding
    counts: dict[Cell, CellCounts]
    good: Candidate
    bad: Candidate
    lifetimes: int
    next_step: str  # what to do next, in words, with a command where there is one
    journal: Path


# -- the ends ---------------------------------------------------------------------------------


def _ends(request: LocateRequest) -> tuple[Candidate, Candidate, int | None]:
    """(good, bad) as candidates: commits of the clone, or releases of the recipe's package;
    and for releases, how many releases lie between them (the next step for adjacent ones is
    the commits between them, not a release-level bisect with nothing to search)."""
    if request.releases is not None:
        from bisect_tool.artifacts.pipindex import pip_index_url
        from bisect_tool.artifacts.releases import fetch_listing, resolve_release_range
        from bisect_tool.dirs import default_cache_dir

        settings = request.recipe.artifacts
        index = request.releases.index_url or settings.index_url or pip_index_url()
        listing = fetch_listing(settings.package, index, default_cache_dir(settings.cache_dir))
        resolved = resolve_release_range(
            listing, request.good, request.bad, pre=True, yanked=True,
            tag_format=request.recipe.range.release_tag,
        ).range
        by_id = {c.sha: c for c in resolved.candidates}
        # what a release-level bisect between them would search (pre-releases and yanked
        # ones left out, as it leaves them)
        searched = resolve_release_range(listing, request.good, request.bad,
                                         tag_format=request.recipe.range.release_tag).range
        return by_id[resolved.good], by_id[resolved.bad], len(searched.candidates) - 2
    if request.repo is None:
        raise UsageError("bisect locate needs a clone (--repo) or --releases")
    from bisect_tool.range import open_repo, pr_number, resolve_ref

    git_repo = open_repo(request.repo)
    with git_repo:
        out = []
        for ref in (request.good, request.bad):
            sha = resolve_ref(git_repo, ref)
            subject = str(git_repo.commit(sha).summary)
            tags = tuple(t for t in git_repo.git.tag("--points-at", sha).split() if t)
            out.append(Candidate(sha, subject, pr_number(subject), tags))
    if out[0].sha == out[1].sha:
        raise UsageError(f"--good {request.good} and --bad {request.bad} are the same commit")
    return out[0], out[1], None


# -- the journal ------------------------------------------------------------------------------


def _header(
    request: LocateRequest, good: Candidate, bad: Candidate, between: int | None
) -> entries.HeaderEntry:
    from bisect_tool import __version__

    more: dict[str, Any] = {} if between is None else {"releases_between": between}
    return entries.header(
        session=uuid.uuid4().hex[:12],
        mode="locate",
        repo=str(request.repo.resolve()) if request.repo else "",
        good_ref=request.good,
        bad_ref=request.bad,
        good=good.sha,
        bad=bad.sha,
        # the two ends, as candidates (position 0: good, 1: bad), so the journal reads the same
        candidates=[good.to_dict(), bad.to_dict()],
        direction="regression",
        recipe=request.recipe.to_dict(),
        command=request.command,
        tool_version=__version__,
        level="release" if request.releases is not None else "commit",
        lifetimes_per_cell=request.lifetimes_per_cell,
        python_dirs={str(k): str(v) for k, v in request.python_dirs.items()},
        **more,
    )


# -- the evaluators ---------------------------------------------------------------------------

#: the seam: (request, good end, bad end, session, observer) -> the cells' evaluators, open
#: while they run (``recipe_sides``: the recipe's own; a test gives plain values)
OpenSides = Callable[
    [LocateRequest, Candidate, Candidate, str, Observer], AbstractContextManager[Sides]
]


def recipe_sides(
    request: LocateRequest, good: Candidate, bad: Candidate, session: str, observer: Observer
) -> AbstractContextManager[Sides]:
    """The evaluators the recipe describes, one per Python side (``locate_sides``)."""
    return open_python_sides(
        request.recipe, {Side.GOOD: good, Side.BAD: bad}, state_dir=request.state_dir,
        session=session, repo=request.repo, from_releases=request.releases is not None,
        python_dirs=request.python_dirs, observer=observer,
    )


def whole_commits(recipe: Recipe) -> Recipe:
    """The recipe for a bisect of whole commits, once locate has said the Python side: each
    candidate's own package with its own compiled files (``[artifacts] python_side =
    "candidate"``, ``bisect_tool.artifacts.whole``), as a ``VLLM_USE_PRECOMPILED`` build makes
    it. Its candidates are the commits touching the package as well as the compiled sources;
    the fast op check is dropped (it sees the compiled side only, which is not where the change
    is)."""
    compiled = compiled_only(recipe)
    package = recipe.artifacts.package
    paths = recipe.range.paths
    if paths and f"{package}/" not in paths:
        paths = (*paths, f"{package}/")
    whole = dataclasses.replace(
        compiled,
        artifacts=dataclasses.replace(compiled.artifacts, python_side="candidate"),
        range=dataclasses.replace(compiled.range, paths=paths),
        probe=dataclasses.replace(compiled.probe, narrow=""),
    )
    from bisect_tool.recipes.recipe import check_whole

    check_whole(whole, recipe.source or recipe.name)
    return whole


# -- the run ----------------------------------------------------------------------------------


def locate(
    request: LocateRequest, observer: Observer = ignore, sides: OpenSides = recipe_sides
) -> LocateOutcome:
    """Run (or resume) the swap matrix to an answer or its budget, with the evaluators
    ``sides`` opens."""
    request.state_dir.mkdir(parents=True, exist_ok=True)
    path = request.state_dir / LOCATE_JOURNAL
    good, bad, between = _ends(request)

    def goes_on(contents: journal_mod.JournalContents) -> bool:
        """An unfinished locate of these ends goes on; a finished one is started afresh."""
        if contents.end is not None:
            return False
        if (contents.header.get("good"), contents.header.get("bad")) != (good.sha, bad.sha):
            raise UsageError(
                f"a locate of other ends is in progress in {request.state_dir}; finish it with "
                "the same --good/--bad, or `bisect reset`"
            )
        return True

    with journal_mod.open_journal(
        path, lambda: _header(request, good, bad, between), keep=goes_on
    ) as opened, sides(
        request, good, bad, str(opened.contents.header["session"]), observer
    ) as cells:
        opened.environment(cells.environment)
        design = LocateDesign(
            good, bad, confidence=request.recipe.search.confidence,
            lifetimes_per_cell=request.lifetimes_per_cell, slots=cells.slots,
            controls=request.recipe.probe.controls,
        )
        for entry in opened.contents.entries:
            design.apply(entry)
        finish = Engine(
            opened.journal, design, cells.arms, parallel=cells.slots,
            controls_for=cells.controls_for, observer=observer,
        ).run()
    if finish.state is EndState.CONTROLS_FAILED:
        raise NoAnswer(finish.message)
    finding = design.finding()
    return LocateOutcome(finding, design.counts, good, bad, len(design.observations),
                         next_step(finding, request, good, bad, design.counts, between), path)


def next_step(
    finding: Finding,
    request: LocateRequest,
    good: Candidate,
    bad: Candidate,
    counts: Mapping[Cell, CellCounts],
    between: int | None = None,
) -> str:
    """The answer in words, and the command that follows from it: for the compiled side, the
    bisect with the swap set; between two adjacent releases that is the commits between them,
    in a clone (a release-level bisect would have nothing to search)."""
    recipe = request.recipe
    name = recipe.name if recipe.source.startswith(str(BUNDLED_DIR)) else (
        recipe.source or recipe.name)
    good_ref = good.tags[0] if request.releases is not None and good.tags else request.good
    bad_ref = bad.tags[0] if request.releases is not None and bad.tags else request.bad
    words = MEANING[finding.explanation]
    untestable = [f"{c.describe(good_ref, bad_ref)} ({counts[c].untestable})"
                  for c in CELLS if counts.get(c, CellCounts()).untestable]
    if finding.tied:
        words += (" (it cannot be told apart from " + ", ".join(map(str, finding.tied))
                  + (": " + "; ".join(untestable) + " could not run" if untestable else "")
                  + ")")
    if finding.explanation is Explanation.COMPILED:
        argv = ["bisect", "start", "--good", good_ref, "--bad", bad_ref, "--recipe", name]
        if request.releases is not None and between:
            argv.insert(2, "--releases")
            return (f"{words}. Next: the {between} releases between them, then the commits "
                    f"between the two it names: {shlex.join(argv)}")
        where = " in a vLLM clone" if request.releases is not None else ""
        return f"{words}. Next, the commits between them{where}: {shlex.join(argv)}"
    if finding.explanation is Explanation.PYTHON:
        from bisect_tool.runtime.schemas import is_extension

        python_files = [p for p in recipe.artifacts.swap_set if not is_extension(p)]
        if python_files:  # this recipe swaps the Python files that matter too
            argv = ["bisect", "start", "--good", good_ref, "--bad", bad_ref, "--recipe", name]
            return (f"{words}. Next (the recipe swaps {', '.join(python_files)} too): "
                    f"{shlex.join(argv)}")
        argv = ["bisect", "start", "--locate", "--good", good_ref, "--bad", bad_ref,
                "--recipe", name]
        where = " in a vLLM clone" if request.releases is not None else ""
        return (f"{words}. Next, whole commits{where} (each candidate's own Python side with its "
                f"compiled files, as VLLM_USE_PRECOMPILED builds them): {shlex.join(argv)} "
                "bisects them after this locate")
    return words


def _name(c: Candidate) -> str:
    """An end as a maintainer names it: its tag (v0.26.0), else its short SHA."""
    return c.tags[0] if c.tags else c.label


def render(outcome: LocateOutcome) -> str:
    """The finding as a few lines for the terminal."""
    f, counts = outcome.finding, outcome.counts
    good, bad = _name(outcome.good), _name(outcome.bad)
    lines = [
        f"locate {bad} (bad) .. {good} (good): {f.explanation} "
        f"({percent(f.probability)}{'' if f.decided else ', below the asked confidence'})",
        "",
        f"{'cell':<50} {'divergent':>9} {'lifetimes':>9}",
    ]
    for cell in CELLS:
        c = counts.get(cell, CellCounts())
        what = cell.describe(good, bad)
        status = f"untestable: {c.untestable}" if c.untestable else ""
        lines.append(f"{what:<50} {c.divergent:>9} {c.total:>9}  {status}".rstrip())
    lines += ["", "posterior of each explanation (p and q integrated out):"]
    for e, prob in sorted(f.posterior.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {str(e):<12} {prob:8.4f}  {MEANING[e]}")
    lines += ["", outcome.next_step,
              f"the full report: bisect report --journal {shlex.quote(str(outcome.journal))}"]
    return "\n".join(lines)


__all__ = [
    "GG", "LocateOutcome", "LocateRequest", "OpenSides", "Sides", "compiled_only", "locate",
    "recipe_sides", "render", "whole_commits",
]
