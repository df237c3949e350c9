"""What ``bisect start`` asks for, and the journal it opens.

``StartRequest`` is a start after its flags were parsed (``bisect start``, ``bisect plan``,
``bisect demo``, a release-level run going on to its commits). ``resolve`` turns it into the
candidates (commits of a clone, or releases on an index) and the recipe as the run will use
it; ``create_journal`` writes the new journal's header (and the entries a commit-level run
carries over from the release-level run before it). The run owner (``bisect_tool.run.owner``) then
resumes that journal: a run is replaying its journal and going on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool import journal as journal_mod
from bisect_tool.designs import ledger
from bisect_tool.errors import StateError, UsageError
from bisect_tool.events import Note, Observer, ignore
from bisect_tool.journal import entries
from bisect_tool.range import CommitRange
from bisect_tool.recipes.recipe import Recipe


@dataclass(frozen=True)
class ReleaseRequest:
    """``bisect start --releases``: bisect the recipe's package's releases (no clone needed)."""

    index_url: str = ""  # "" = the recipe's [artifacts] index_url, else pip's index
    pre: bool = False  # pre-releases are candidates too
    yanked: bool = False  # yanked releases are candidates too
    then_commits: bool = False  # a clone was given (--repo): go on to its commits at the end


@dataclass(frozen=True)
class Carried:
    """Observations a commit-level run starts with: those of the two releases the release-level
    run ended between, re-keyed to their commits (``release id -> (sha, position)``)."""

    journal: Path
    commits: Mapping[str, str]  # release id -> the commit its tag names
    summary: Mapping[str, Any]


@dataclass(frozen=True)
class StartRequest:
    """What ``bisect start`` was asked, after its flags were parsed."""

    repo: Path
    good: str
    bad: str
    journal_path: Path
    recipe: Recipe | None = None
    run_command: str | None = None
    run_timeout: float = 0.0
    paths: tuple[str, ...] = ()
    mainline: str | None = None  # --mainline: the ref releases branch from (None: the default)
    search_overrides: Mapping[str, Any] | None = None  # without a recipe: --confidence etc.
    deterministic: bool = False  # --deterministic: one run a candidate (git bisect's contract)
    command: tuple[str, ...] = ()
    releases: ReleaseRequest | None = None
    carried: Carried | None = None
    # --test-from REF --test-file PATH: test files of a newer commit, run at every candidate
    # (bisect_tool.range.newer_tests)
    test_from: str | None = None
    test_files: tuple[str, ...] = ()


def resolve(request: StartRequest) -> tuple[CommitRange, Recipe | None, dict[str, Any]]:
    """The candidates, the recipe as the run uses it, and the header's facts about a release
    listing ({} for commits). The run (``create_journal``) and the plan resolve alike."""
    from bisect_tool.range import resolve_range

    recipe = request.recipe
    if request.releases is not None:
        if recipe is None or request.run_command:
            raise UsageError(
                "--releases needs --recipe (its [artifacts] package and swap set name what to "
                "fetch for each release)"
            )
        return release_range(request, recipe, request.releases)
    path_filter = request.paths or (recipe.range.paths if recipe else ())
    mainline = request.mainline or (recipe.range.mainline if recipe else "") or None
    commit_range = resolve_range(request.repo, request.good, request.bad, path_filter,
                                 mainline=mainline)
    return commit_range, recipe, {}


def create_journal(
    request: StartRequest,
    observer: Observer = ignore,
    keep: Callable[[Path], Path] | None = None,
) -> tuple[Path, CommitRange]:
    """The new journal: the range resolved, its header (and carried entries) written. A
    finished session's journal is first moved away by ``keep`` (``statedir.archive_previous``:
    the run owner passes it), which says where it went; without ``keep`` it is replaced."""
    from bisect_tool.range import remote_url
    from bisect_tool.range.remote import clone_link_base

    path = request.journal_path
    recorded: list[dict[str, Any]] = []
    if path.exists():
        contents = journal_mod.read(path)
        # An unattended start interrupted before it recorded anything (Ctrl-C in its first
        # seconds) left nothing to resume: a new start replaces it (issue 30).
        recorded = [e for e in contents.entries if e.get("type") != "environment"]
        waiting = recorded or contents.header.get("mode", "manual") == "manual"
        if waiting and not any(e.get("type") == "end" for e in contents.entries):
            raise StateError(
                f"a bisect is already in progress in {path.parent}; "
                "`bisect resume` continues it, `bisect reset` ends it"
            )
    commit_range, recipe, extra = resolve(request)
    if path.exists():  # a finished bisect; kept until the new range resolved
        if recorded and keep is not None:
            observer(Note(f"the previous session's journal is kept in {keep(path)}"))
        else:
            path.unlink()  # a header and nothing else
    recipe_dict = ledger.header_recipe(
        recipe, request.search_overrides, deterministic=request.deterministic
    )
    mode = "run" if request.run_command else ("recipe" if recipe else "manual")
    if request.test_from is not None or request.test_files:
        from bisect_tool.range import newer_tests

        if mode != "run":
            raise UsageError("--test-from and --test-file go with --run CMD (the command that "
                             "runs the test at each candidate)")
        exported = newer_tests.export(request.repo, request.test_from or "",
                                      request.test_files, path.parent)
        extra["test_from"] = exported.to_header()
    clone = request.releases is None or request.releases.then_commits
    if request.carried is not None:
        extra["previous"] = dict(request.carried.summary)
    header = ledger.header_for(
        commit_range,
        recipe=recipe_dict,
        command=request.command,
        repo=request.repo.resolve() if clone else None,
        mode=mode,
        remote_url=remote_url(request.repo) if clone else "",
        # where the report's commit links point: the clone's own GitHub vLLM remote, or nowhere
        repo_url=clone_link_base(request.repo) if clone else "",
        run_command=request.run_command or "",
        run_timeout=request.run_timeout,
        **_placed(commit_range),
        **extra,
    )
    journal_mod.create(path, header)
    if request.carried is not None:
        _carry(path, header, request.carried)
    return path, commit_range


def _placed(commit_range: CommitRange) -> dict[str, Any]:
    """The header's facts about where the range sits: the main line, the merge base standing in
    for the older end, what the path filter left out (only those that are set)."""
    out: dict[str, Any] = {}
    if commit_range.mainline:
        out["mainline"] = commit_range.mainline
    if commit_range.merge_base:
        out["merge_base"] = commit_range.merge_base
    if commit_range.left_out:
        out["path_left_out"] = [list(item) for item in commit_range.left_out]
    return out


def release_range(
    request: StartRequest, recipe: Recipe, releases: ReleaseRequest
) -> tuple[CommitRange, Recipe, dict[str, Any]]:
    """The releases between --good and --bad as candidates, the recipe as a release-level run
    uses it (release wheels, or files at hand: no clone to build from), and the header's facts
    about the listing."""
    from bisect_tool.artifacts.pipindex import pip_index_url
    from bisect_tool.artifacts.releases import fetch_listing, resolve_release_range
    from bisect_tool.dirs import default_cache_dir

    settings = recipe.artifacts
    index = releases.index_url or settings.index_url or pip_index_url()
    listing = fetch_listing(settings.package, index, default_cache_dir(settings.cache_dir))
    resolved = resolve_release_range(
        listing, request.good, request.bad, pre=releases.pre, yanked=releases.yanked,
        tag_format=recipe.range.release_tag,
    )
    commit_sources = list(settings.sources)
    sources = tuple(s for s in settings.sources if s in ("release", "local")) or ("release",)
    if "release" not in sources:
        sources = ("release", *sources)
    recipe = recipe.override("artifacts", sources=sources, index_url=listing.index_url)
    extra = {
        "level": "release",
        "package": settings.package,
        "index_url": listing.index_url,
        "listing_source": listing.source,
        "listing_note": listing.offline_reason,
        "left_out": [list(item) for item in resolved.left_out],
        "release_tag": recipe.range.release_tag,
        "then_repo": str(request.repo.resolve()) if releases.then_commits else "",
        "commit_sources": commit_sources,
    }
    return resolved.range, recipe, extra


def _carry(path: Path, header: Mapping[str, Any], carried: Carried) -> None:
    """Journal the release-level observations of the two end releases (and the controls) as
    the commit-level run's first entries, re-keyed to the commits the release tags name."""
    old = journal_mod.read(carried.journal)
    positions = {str(c["sha"]): i for i, c in enumerate(header["candidates"])}
    with journal_mod.Journal(path) as journal:
        for entry in old.entries:
            kind = entry.get("type")
            if kind == "controls":
                journal.append(entries.carried(entry))
            sha = carried.commits.get(str(entry.get("commit")))
            if kind != "observation" or sha is None or sha not in positions:
                continue
            journal.append(entries.carried_observation(entry, sha, positions[sha]))
