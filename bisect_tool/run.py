"""The run owner: one bisect from the range to its end.

``start`` writes the new journal (``bisect_tool.request``: the range resolved, the header) and
resumes it; ``resume`` continues a journal (that is all a run is: replaying the journal and
going on): the environment entry, then the bisect design (``designs.bisect``: controls, the
tiers, the end) carried out by the one engine (``bisect_tool.engine``) with the evaluators the
recipe describes (``bisect_tool.wiring``). A release-level run that found its flip goes on to
the commits (``bisect_tool.handover``). The CLIs (``bisect start/resume``, ``bisect demo``)
only parse flags, call these, and print. Progress goes to an observer as events
(``bisect_tool.events``); the run never prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool import entries, handover, session
from bisect_tool import journal as journal_mod
from bisect_tool.designs.bisect import BisectDesign
from bisect_tool.designs.manual import next_manual_candidate
from bisect_tool.engine import Engine, journaled
from bisect_tool.errors import BisectError, Interrupted, StateError, UsageError
from bisect_tool.events import Note, Observer, RunStarted, ignore
from bisect_tool.interfaces import Gates
from bisect_tool.journal import Journal
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.recipe import Recipe
from bisect_tool.request import StartRequest, create_journal
from bisect_tool.verdict import EndState
from bisect_tool.wiring import EvaluatorFactory, Evaluators, command_evaluator, open_evaluators


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
    path, commit_range = create_journal(request)
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


def _continue_to_commits(
    journal_path: Path,
    state: session.State,
    observer: Observer,
    evaluator_factory: EvaluatorFactory,
) -> Outcome | None:
    """A release-level run that found its flip goes on to the commits between the two
    adjacent releases (``bisect_tool.handover``); None when there is nothing to do."""
    request = handover.commit_request(journal_path, state, observer)
    if request is None:
        return None
    path, commit_range = create_journal(request)
    handover.take_over(journal_path, path)
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

    handover.settle_handover(journal_path)
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
    capacity = evaluators.capacity
    design = BisectDesign(state, slots=capacity or evaluators.parallel, controls=controls,
                          controls_beside=evaluators.controls_beside,
                          gate_sweep=isinstance(evaluators.faithful, Gates))
    Engine(
        journal, design, evaluators.arms(), parallel=evaluators.parallel,
        controls_for=evaluators.controls_for, observer=observer, capacity=capacity,
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
