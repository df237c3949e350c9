"""The run owner: one bisect from the range to its end.

``start`` resolves the range and writes the journal's header; ``resume`` continues a journal
(that is all a run is: replaying the journal and going on): the environment entry, then the
bisect design (``designs.bisect``: controls, the tiers, the end) carried out by the one engine
(``bisect_tool.engine``) with the evaluators the recipe describes (``bisect_tool.wiring``).
``probe_commit`` runs one candidate the way a bisect evaluates it. The CLIs (``bisect
start/resume``, ``bisect probe --commit``, ``bisect demo``) only parse flags, call these, and
print. Progress goes to an observer as events (``bisect_tool.events``); the run never prints.
"""

from __future__ import annotations

import secrets
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool import entries, session
from bisect_tool import journal as journal_mod
from bisect_tool.designs.bisect import BisectDesign, next_manual_candidate
from bisect_tool.engine import Engine, journaled
from bisect_tool.errors import BisectError, Interrupted, StateError, UsageError
from bisect_tool.events import (
    ControlsEnded,
    LifetimeEnded,
    LifetimeStarted,
    Note,
    Observer,
    RunStarted,
    ignore,
)
from bisect_tool.journal import Journal
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.recipe import Recipe
from bisect_tool.tiers import Tier
from bisect_tool.values import Direction, Observation, ProbeKind, Verdict, short
from bisect_tool.verdict import EndState, aggregate, trusted
from bisect_tool.wiring import Evaluators, command_evaluator, open_evaluators

#: (recipe, repo, session, state dir, tags, observer) -> the evaluators, closed on exit
EvaluatorFactory = Callable[
    [Recipe, Path, str, Path, Mapping[str, Sequence[str]], Observer],
    AbstractContextManager[Evaluators],
]


@dataclass(frozen=True)
class Outcome:
    """How a run stands when ``start``/``resume`` return."""

    state: EndState
    message: str
    summary: dict[str, Any]  # ``State.summary()`` at the end (``status --json``'s names)
    next_candidate: Candidate | None = None  # manual mode: the commit to judge next

    @property
    def answered(self) -> bool:
        return self.state.answered


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
    search_overrides: Mapping[str, Any] | None = None  # without a recipe: --confidence etc.
    deterministic: bool = False  # --deterministic: one run a candidate (git bisect's contract)
    command: tuple[str, ...] = ()
    releases: ReleaseRequest | None = None
    carried: Carried | None = None


# -- start / resume


def start(
    request: StartRequest,
    observer: Observer = ignore,
    evaluator_factory: EvaluatorFactory = open_evaluators,
) -> Outcome:
    """Resolve the range, write the journal's header, and run to the end (or, in manual mode,
    to the first candidate to judge)."""
    if request.recipe is not None and evaluator_factory is open_evaluators:
        # before the journal: what cannot work here is one line naming the fix, and no session
        # is left to refuse the next start (injected evaluators bring their own environment)
        from bisect_tool import preflight

        preflight.require(request.recipe)
    path, commit_range = _create(request)
    try:
        return resume(path, observer, evaluator_factory, _range=commit_range)
    except Interrupted:
        raise  # stopped on request: `bisect resume` goes on from the journal
    except BisectError:
        _forget_if_unobserved(path, observer)
        raise


def _forget_if_unobserved(path: Path, observer: Observer) -> None:
    """A start that failed before its first observation leaves no journal behind: nothing in
    it is worth resuming, and it would refuse the next start until `bisect reset`."""
    try:
        contents = journal_mod.read(path)
    except StateError:
        return
    if contents.header.get("mode") == "manual" or any(
        e.get("type") in ("observation", "controls", "untestable", "end")
        for e in contents.entries
    ):
        return
    path.unlink(missing_ok=True)
    observer(Note("nothing was observed: no session is left behind; fix the cause and run "
                  "`bisect start` again"))


def _create(request: StartRequest) -> tuple[Path, CommitRange]:
    """The new journal: the range resolved, its header (and carried entries) written."""
    from bisect_tool.range import remote_url, resolve_range
    from bisect_tool.remote import clone_link_base

    path = request.journal_path
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
    recipe = request.recipe
    extra: dict[str, Any] = {}
    if request.releases is not None:
        if recipe is None or request.run_command:
            raise UsageError(
                "--releases needs --recipe (its [artifacts] package and swap set name what to "
                "fetch for each release)"
            )
        commit_range, recipe, extra = _release_range(request, recipe, request.releases)
    else:
        path_filter = request.paths or (recipe.range.paths if recipe else ())
        commit_range = resolve_range(request.repo, request.good, request.bad, path_filter)
    if path.exists():  # a finished bisect; kept until the new range resolved
        path.unlink()
    recipe_dict = session.header_recipe(
        recipe, request.search_overrides, deterministic=request.deterministic
    )
    mode = "run" if request.run_command else ("recipe" if recipe else "manual")
    clone = request.releases is None or request.releases.then_commits
    if request.carried is not None:
        extra["previous"] = dict(request.carried.summary)
    header = session.header_for(
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
        **extra,
    )
    journal_mod.create(path, header)
    if request.carried is not None:
        _carry(path, header, request.carried)
    return path, commit_range


def _release_range(
    request: StartRequest, recipe: Recipe, releases: ReleaseRequest
) -> tuple[CommitRange, Recipe, dict[str, Any]]:
    """The releases between --good and --bad as candidates, the recipe as a release-level run
    uses it (release wheels, or files at hand: no clone to build from), and the header's facts
    about the listing."""
    from bisect_tool.artifacts.releases import fetch_listing, resolve_release_range
    from bisect_tool.artifacts.sources import pip_index_url
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
                journal.append({k: v for k, v in entry.items() if k not in ("seq", "time")})
            sha = carried.commits.get(str(entry.get("commit")))
            if kind != "observation" or sha not in positions:
                continue
            moved = {k: v for k, v in entry.items() if k not in ("seq", "time")}
            moved.update(commit=sha, position=positions[sha], carried_from=str(entry["commit"]))
            journal.append(moved)


HANDOVER_NAME = "journal.next.jsonl"
RELEASES_NAME = "releases.jsonl"


def settle_handover(journal_path: Path) -> None:
    """Finish a release -> commit handover a kill interrupted between its two renames."""
    nxt = journal_path.with_name(HANDOVER_NAME)
    if not journal_path.exists() and nxt.exists():
        nxt.replace(journal_path)


def _continue_to_commits(
    journal_path: Path,
    state: session.State,
    observer: Observer,
    evaluator_factory: EvaluatorFactory,
) -> Outcome | None:
    """A release-level run that found its flip goes on to the commits between the two
    adjacent releases in the clone it was given (cargo-bisect-rustc's nightlies -> commits),
    carrying the observations it has of those two releases. None when there is nothing to do."""
    header = state.header
    repo = str(header.get("then_repo") or "")
    if header.get("level") != "release" or not repo or state.end is None:
        return None
    if EndState(state.end["state"]) is not EndState.DONE:
        return None
    from bisect_tool import recipe as recipe_mod
    from bisect_tool.range import open_repo, resolve_ref

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
    archive = journal_path.with_name(RELEASES_NAME)
    nxt = journal_path.with_name(HANDOVER_NAME)
    nxt.unlink(missing_ok=True)
    observer(Note(
        f"first {'good' if fix else 'bad'} release {new_c.label} ({mass:.1%}); going on to "
        f"the commits between {old_c.tags[0]} and {new_c.tags[0]} in {repo}"
    ))
    request = StartRequest(
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
    # The commit journal is written whole beside the release journal, which is then archived
    # and replaced by it: a kill in between leaves both, and settle_handover finishes the move.
    path, commit_range = _create(request)
    journal_path.replace(archive)
    path.replace(journal_path)
    return resume(journal_path, observer, evaluator_factory, _range=commit_range)


def resume(
    journal_path: Path,
    observer: Observer = ignore,
    evaluator_factory: EvaluatorFactory = open_evaluators,
    *,
    _range: CommitRange | None = None,
) -> Outcome:
    """Continue the run the journal describes, from where it stopped."""
    from bisect_tool import recipe as recipe_mod

    settle_handover(journal_path)
    contents = journal_mod.read(journal_path)
    state = session.replay(contents)
    header = contents.header
    if state.end is not None:
        onward = _continue_to_commits(journal_path, state, observer, evaluator_factory)
        return onward if onward is not None else _outcome(state)
    mode = header.get("mode", "manual")
    if mode == "manual":
        return _outcome(state, next_candidate=next_manual_candidate(state))
    observer(RunStarted(len(state.candidates), str(state.direction), len(state.seen_lifetimes)))
    end_leftovers(Path(header["repo"]) if header.get("repo") else None, journal_path.parent,
                  str(header.get("session", "")), observer)
    with journaled(journal_path) as journal:
        if mode == "run":
            evaluator = command_evaluator(
                header["run_command"],
                float(header.get("run_timeout") or 0),
                repo=Path(header["repo"]),
                state_dir=journal_path.parent,
                session=str(header.get("session", "")),
                observer=observer,
            )
            bisect_loop(journal, state, Evaluators(evaluator), observer=observer)
            return _outcome(state)
        recipe = recipe_mod.from_dict_loose(header["recipe"])
        tags = {c.sha: c.tags for c in state.candidates}
        repo = Path(header["repo"]) if header.get("repo") else journal_path.parent
        with evaluator_factory(
            recipe, repo, header["session"], journal_path.parent, tags, observer
        ) as evaluators:
            _environment(journal, state, contents, recipe)
            bisect_loop(
                journal, state, evaluators, observer=observer,
                controls=recipe.probe.controls and evaluators.has_controls,
            )
    onward = _continue_to_commits(journal_path, state, observer, evaluator_factory)
    return onward if onward is not None else _outcome(state)


def bisect_loop(
    journal: Journal,
    state: session.State,
    evaluators: Evaluators,
    *,
    observer: Observer = ignore,
    controls: bool = False,
) -> dict[str, Any]:
    """The bisect design run by the engine to its end; the summary there."""
    if state.tiered and evaluators.narrow is None:
        raise UsageError(
            "this run narrows with a fast probe, but its backend has none (the op probe runs "
            "with the local, docker or ray backend)"
        )
    design = BisectDesign(state, slots=evaluators.parallel, controls=controls)
    Engine(
        journal, design, evaluators.arms(), parallel=evaluators.parallel,
        controls_for=evaluators.controls_for, observer=observer,
    ).run()
    return state.summary()


def end_leftovers(
    repo: Path | None, state_dir: Path, session_id: str, observer: Observer
) -> int:
    """End what a killed run left running (probe process groups, worktrees); say how many."""
    from bisect_tool.children import end_all
    from bisect_tool.worktrees import remove_stale_worktrees

    ended = end_all(state_dir, session_id)
    if ended:
        observer(Note(f"ended {ended} process group(s) left running by a killed run"))
    if repo is not None:  # a release-level run without a clone has no worktrees
        remove_stale_worktrees(repo)
    return ended


def _environment(
    journal: Journal,
    state: session.State,
    contents: journal_mod.JournalContents,
    recipe: Recipe,
) -> None:
    from bisect_tool.runtime.environment import environment_facts

    if not any(e.get("type") == "environment" for e in contents.entries):
        state.apply(journal.append(entries.environment(environment_facts(recipe))))


def _outcome(state: session.State, next_candidate: Candidate | None = None) -> Outcome:
    summary = state.summary()
    end = state.end or {}
    end_state = EndState(end["state"]) if end else EndState.RUNNING
    return Outcome(end_state, str(end.get("message", "")), summary, next_candidate)


# -- one candidate, as a bisect evaluates it


@dataclass(frozen=True)
class CommitProbe:
    """``bisect probe --commit``: the candidate's verdict over its lifetimes, by the search's
    rule (``verdict.aggregate``), vetoed to INCONCLUSIVE when the controls failed."""

    sha: str
    verdict: Verdict
    note: str
    observations: tuple[Observation, ...]
    controls: dict[str, Any] | None


def probe_commit(
    repo_path: Path,
    ref: str,
    recipe: Recipe,
    *,
    lifetimes: int,
    controls: bool,
    state_dir: Path | None,
    observer: Observer = ignore,
    evaluator_factory: EvaluatorFactory = open_evaluators,
) -> CommitProbe:
    from bisect_tool.range import open_repo, resolve_ref
    from bisect_tool.runtime.common import sigterm_raises

    if lifetimes == 0 and not controls:
        raise UsageError("--lifetimes 0 probes nothing; give --lifetimes 1 or more, or --controls")
    if recipe.probe.kind not in (ProbeKind.SERVER, ProbeKind.OP):
        raise UsageError(
            f"recipe {recipe.name!r} has [probe] kind {recipe.probe.kind!r}; --commit needs a "
            "server or op probe (for a command, use `bisect start --run`)"
        )
    if controls and recipe.probe.kind != ProbeKind.SERVER:
        raise UsageError("--controls needs a server probe; the op probe has no controls")
    git_repo = open_repo(repo_path)
    sha = resolve_ref(git_repo, ref)
    # Release tags let the download provider find the commit's published wheel.
    tags = {sha: tuple(t for t in git_repo.git.tag("--points-at", sha).split() if t)}
    session_id = f"probe-{secrets.token_hex(4)}"
    observer(Note(
        f"probing {short(sha)} ({ref}) with recipe {recipe.name!r}, session {session_id}"
    ))
    observations: list[Observation] = []
    control_entry: dict[str, Any] | None = None
    with _scratch(state_dir) as state, sigterm_raises(), evaluator_factory(
        recipe, repo_path.resolve(), session_id, state, tags, observer
    ) as evaluators:
        evaluator = evaluators.faithful
        if controls:
            runner = evaluators.controls_for(sha)
            assert runner is not None  # a server probe always has a controls runner
            observer(Note("running the controls (invariance off: concurrent, then sequential)"))
            control_entry = dict(runner.run())
            observer(ControlsEnded(bool(control_entry["ok"]), control_entry))
        for index in range(lifetimes):
            lifetime_id = f"{short(sha)}-probe-{index}"
            observer(LifetimeStarted(sha, lifetime_id))
            started = time.monotonic()
            obs = evaluator.evaluate(sha, lifetime_id, tags[sha])
            observations.append(obs)
            observer(
                LifetimeEnded(
                    sha,
                    lifetime_id,
                    str(obs.verdict),
                    obs.message,
                    obs.duration_s or time.monotonic() - started,
                    obs.detail,
                )
            )
    controls_ok = None if control_entry is None else bool(control_entry["ok"])
    if observations:
        verdict, note = trusted(aggregate(o.verdict for o in observations), controls_ok)
    else:
        verdict, note = (Verdict.CLEAN if controls_ok else Verdict.INCONCLUSIVE), ""
    return CommitProbe(sha, verdict, note, tuple(observations), control_entry)


@contextmanager
def _scratch(state_dir: Path | None) -> Iterator[Path]:
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
        yield state_dir
    else:
        with tempfile.TemporaryDirectory(prefix="bisect-probe-") as tmp:
            yield Path(tmp)
