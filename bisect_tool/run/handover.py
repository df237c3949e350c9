"""From releases to commits: a release-level run that found its flip goes on to the commits
between the two adjacent releases in the clone it was given (cargo-bisect-rustc's nightlies ->
commits), carrying the observations it has of those two releases.

The commit journal is written whole beside the release journal (``HANDOVER_NAME``), which is
then archived (``RELEASES_NAME``) and replaced by it: a kill in between leaves both, and
``settle_handover`` finishes the move when the run is resumed.
"""

from __future__ import annotations

from pathlib import Path

from bisect_tool.designs import ledger
from bisect_tool.events import Note, Observer
from bisect_tool.run.request import Carried, StartRequest
from bisect_tool.strategy.tiers import Tier
from bisect_tool.values import Direction, percent
from bisect_tool.verdict import EndState

HANDOVER_NAME = "journal.next.jsonl"
RELEASES_NAME = "releases.jsonl"


def settle_handover(journal_path: Path) -> None:
    """Finish a release -> commit handover a kill interrupted between its two renames."""
    nxt = journal_path.with_name(HANDOVER_NAME)
    if not journal_path.exists() and nxt.exists():
        nxt.replace(journal_path)


def commit_request(
    journal_path: Path, state: ledger.Ledger, observer: Observer
) -> StartRequest | None:
    """The start of the commit-level run that follows the ended release-level run of
    ``journal_path`` (its journal to be written at ``HANDOVER_NAME``); None when there is
    nothing to go on to (not a release-level run, no clone, no answer, untagged ends)."""
    header = state.header
    repo = str(header.get("then_repo") or "")
    if header.get("level") != "release" or not repo or state.end is None:
        return None
    if EndState(state.end["state"]) is not EndState.DONE:
        return None
    from bisect_tool.range import open_repo, resolve_ref
    from bisect_tool.recipes import recipe as recipe_mod

    summary = state.strategy.summary()
    block, mass = summary.block, summary.confidence
    old_c, new_c = state.candidates[block[0] - 1], state.candidates[block[-1]]
    if not old_c.tags or not new_c.tags:
        return None
    fix = state.direction is Direction.FIX
    good_c, bad_c = (new_c, old_c) if fix else (old_c, new_c)
    git_repo = open_repo(Path(repo))
    with git_repo:
        good_sha = resolve_ref(git_repo, good_c.tags[0])
        bad_sha = resolve_ref(git_repo, bad_c.tags[0])
    recipe = recipe_mod.from_dict_loose(header["recipe"])
    recipe = recipe.override(
        "artifacts", sources=tuple(header.get("commit_sources") or recipe.artifacts.sources)
    )
    nxt = journal_path.with_name(HANDOVER_NAME)
    nxt.unlink(missing_ok=True)
    observer(Note(
        f"first {'good' if fix else 'bad'} release {new_c.label} ({percent(mass)}); going on to "
        f"the commits between {old_c.tags[0]} and {new_c.tags[0]} in {repo}"
    ))
    return StartRequest(
        repo=Path(repo),
        good=good_c.tags[0],
        bad=bad_c.tags[0],
        journal_path=nxt,
        recipe=recipe,
        command=("bisect", "start", "--good", good_c.tags[0], "--bad", bad_c.tags[0],
                 "--recipe", recipe.source or recipe.name, "--repo", repo),
        carried=Carried(
            journal_path,
            {good_c.sha: good_sha, bad_c.sha: bad_sha},
            {"level": "release", "journal": RELEASES_NAME, "good_ref": header.get("good_ref"),
             "bad_ref": header.get("bad_ref"), "candidates": len(state.candidates),
             "flip": new_c.sha, "flip_label": new_c.label, "confidence": mass,
             "lifetimes": state.runs[Tier.FAITHFUL], "narrow_runs": state.runs[Tier.NARROW],
             "package": header.get("package")},
        ),
    )


def take_over(journal_path: Path, written: Path) -> None:
    """Archive the release journal and put the commit journal ``written`` in its place."""
    journal_path.replace(journal_path.with_name(RELEASES_NAME))
    written.replace(journal_path)
