"""The run owner: one bisect from the range to its end.

``start`` writes the new journal (``bisect_tool.run.request``: the range resolved, the header) and
resumes it; ``resume`` continues a journal (that is all a run is: replaying the journal and
going on), opened as every run's is (``journal.open_journal``): the environment entry, then the
bisect design (``designs.bisect``: controls, the tiers, the end) carried out by the one engine
(``bisect_tool.run.engine``) with the evaluators the recipe describes (``bisect_tool.run.wiring``).
A
release-level run that found its flip goes on to the commits (``bisect_tool.run.handover``). The
CLIs (``bisect start/resume``, ``bisect demo``) only parse flags, call these, and print.
Progress goes to an observer as events (``bisect_tool.events``); the run never prints.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool import journal as journal_mod
from bisect_tool.cause import one_line, root_cause
from bisect_tool.designs import ledger
from bisect_tool.designs.bisect import BisectDesign
from bisect_tool.designs.manual import next_manual_candidate
from bisect_tool.errors import (
    BisectError,
    InfrastructureError,
    Interrupted,
    StateError,
    UsageError,
)
from bisect_tool.events import Note, Observer, RunStarted, ignore
from bisect_tool.interfaces import Evaluator, Gates
from bisect_tool.journal import Journal
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.run import handover
from bisect_tool.run.engine import ControlsRunner, Engine
from bisect_tool.run.request import StartRequest, create_journal
from bisect_tool.run.wiring import EvaluatorFactory, Evaluators, command_evaluator, open_evaluators
from bisect_tool.values import Observation, Verdict
from bisect_tool.verdict import EndState


@dataclass(frozen=True)
class Outcome:
    """How a run stands when ``start``/``resume`` return."""

    state: EndState
    message: str
    summary: dict[str, Any]  # ``Ledger.status()`` at the end (``status --json``'s names)
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
        from bisect_tool.run import preflight

        preflight.require(request.recipe)
    from bisect_tool.run.statedir import archive_previous

    path, commit_range = create_journal(request, observer, keep=archive_previous)
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
    state: ledger.Ledger,
    observer: Observer,
    evaluator_factory: EvaluatorFactory,
) -> Outcome | None:
    """A release-level run that found its flip goes on to the commits between the two
    adjacent releases (``bisect_tool.run.handover``); None when there is nothing to do."""
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
    from bisect_tool.recipes import recipe as recipe_mod

    handover.settle_handover(journal_path)
    contents = journal_mod.read(journal_path)
    state = ledger.replay(contents)
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
    with journal_mod.open_journal(journal_path) as opened:
        journal = opened.journal
        if mode == "run":
            from bisect_tool.range.newer_tests import NewerTests

            evaluator = command_evaluator(
                header["run_command"],
                float(header.get("run_timeout") or 0),
                repo=Path(header["repo"]),
                state_dir=journal_path.parent,
                session=str(header.get("session", "")),
                observer=observer,
                test_from=NewerTests.from_header(header.get("test_from")),
            )
            bisect_loop(journal, state, Evaluators(evaluator), observer=observer,
                        seen_causes=_journal_causes(contents))
            return _outcome(state)
        from bisect_tool.runtime.environment import environment_facts

        recipe = recipe_mod.from_dict_loose(header["recipe"])
        tags = {c.sha: c.tags for c in state.candidates}
        repo = Path(header["repo"]) if header.get("repo") else journal_path.parent
        with evaluator_factory(
            recipe, repo, header["session"], journal_path.parent, tags, observer
        ) as evaluators:
            written = opened.environment(lambda: environment_facts(recipe))
            if written is not None:
                state.apply(written)
            bisect_loop(
                journal, state, evaluators, observer=observer,
                controls=recipe.probe.controls and evaluators.has_controls,
                seen_causes=_journal_causes(contents),
            )
    onward = _continue_to_commits(journal_path, state, observer, evaluator_factory)
    return onward if onward is not None else _outcome(state)


def bisect_loop(
    journal: Journal,
    state: ledger.Ledger,
    evaluators: Evaluators,
    *,
    observer: Observer = ignore,
    controls: bool = False,
    seen_causes: Collection[str] = (),
) -> dict[str, Any]:
    """The bisect design run by the engine to its end; the summary there. A run whose
    lifetimes keep failing with one cause stops early (``_Watch``); ``seen_causes``: those the
    journal already holds, which a resumed run goes on past."""
    if state.tiered and evaluators.narrow is None:
        raise UsageError(
            "this run narrows with a fast probe, but its backend has none (the op probe runs "
            "with the local, docker or ray backend)"
        )
    capacity = evaluators.capacity
    design = BisectDesign(state, slots=capacity or evaluators.parallel, controls=controls,
                          controls_beside=evaluators.controls_beside,
                          gate_sweep=isinstance(evaluators.faithful, Gates))
    watch = _Watch(seen_causes)
    arms = {name: _watched(arm, watch) for name, arm in evaluators.arms().items()}

    def controls_for(commit: str) -> ControlsRunner | None:
        runner = evaluators.controls_for(commit)
        return None if runner is None else _WatchedControls(runner, watch, commit)

    Engine(
        journal, design, arms, parallel=evaluators.parallel,
        controls_for=controls_for, observer=observer, capacity=capacity,
    ).run()
    return state.standing().status()


# -- a broken environment stops the run early ------------------------------------------------------

#: candidates in a row that failed with one root cause, none running since, before a run stops
REPEATS_TO_STOP = 3


@dataclass(frozen=True)
class Attempt:
    """One lifetime's (or the controls') outcome, as the repeated-cause stop sees it."""

    commit: str
    cause: str | None  # why it could not run, in one line (``cause_of``); None: it ran
    shown: str = ""  # that cause as this attempt printed it (its own commit, port...)


def repeated_cause(
    attempts: Sequence[Attempt], seen: Collection[str] = (), at_least: int = REPEATS_TO_STOP
) -> tuple[str, int, int] | None:
    """(cause, lifetimes, candidates) when the attempts since the last one that ran all failed
    with one root cause at ``at_least`` candidates or more; else None. Pure.

    With a missing server module one run spent 120 lifetimes on 61 candidates, and the controls
    on 53 releases, each failing the same way (issue 38): the search takes a candidate that
    cannot run for a property of that candidate and moves on to the next. One cause at several
    candidates in a row, and nothing running between, is more likely the machine (a module, a
    disk, a driver) than the candidates. A stretch of commits that are broken in the same way
    looks alike; so the stop says both, and ``seen`` (the causes the journal already holds at
    that many candidates: the user was told and resumed) is gone on past."""
    streak: list[Attempt] = []
    for attempt in reversed(attempts):
        if attempt.cause is None or (streak and attempt.cause != streak[0].cause):
            break
        streak.append(attempt)
    if not streak:
        return None
    cause = streak[0].cause
    candidates = {a.commit for a in streak}
    if cause is None or cause in seen or len(candidates) < at_least:
        return None
    return cause, len(streak), len(candidates)


_VARYING = (
    (re.compile(r"\b[0-9a-f]{7,40}\b"), "<sha>"),  # the candidate's commit, a container id
    (re.compile(r"bisect-wt-[\w.-]+"), "bisect-wt-*"),  # its temporary worktree
    (re.compile(r"\b(pid[= ])?\d{4,}\b"), "<n>"),  # pids, ports, sizes
)


def root_of(message: str, log_tail: str = "") -> str:
    """The root cause a failure message names, in one line: the first error of the log it
    carries (``cause.root_cause``: a server's last lines, a probe's output), else its own
    first line."""
    _head, mark, tail = message.partition("; log tail:")
    found = root_cause(tail if mark else log_tail) if (mark or log_tail.strip()) else ""
    return found or one_line(message)


def cause_of(message: str, log_tail: str = "") -> str:
    """``root_of`` with what differs from one candidate or lifetime to the next (its commit,
    lifetime id, port, pid) taken out: the same failure at two candidates reads the same."""
    text = root_of(message, log_tail)
    for pattern, shown in _VARYING:
        text = pattern.sub(shown, text)
    return text


#: where a candidate failed for what it is, by nature: its artifacts (none to be had, or its
#: build failed: a stretch of broken builds is the range's, and ends as an untestable end) and
#: the gate (its ops differ from the pinned stack's)
_CANDIDATES_OWN = ("artifacts", "gate")


def failure_cause(obs: Observation) -> str | None:
    """The root cause (``cause_of``) of a lifetime that could not run; "" for one that is the
    candidate's own by nature (``_CANDIDATES_OWN``) or says nothing more than its exit code;
    None for one that ran."""
    found = _failure(obs)
    return found if found is None else cause_of(found) if found else ""


def _failure(obs: Observation) -> str | None:
    """``failure_cause`` before what differs per candidate is taken out."""
    if obs.verdict is not Verdict.UNTESTABLE:
        return None
    detail = obs.detail if isinstance(obs.detail, Mapping) else {}
    if detail.get("stage") in _CANDIDATES_OWN:
        return ""
    tail = detail.get("log_tail")
    if isinstance(tail, str) and obs.message.startswith("exit "):  # a --run probe's exit 125
        lines = [line for line in tail.splitlines()
                 if not line.startswith(("bisect: --run runs in", "["))]
        found = root_of("", "\n".join(lines))
        return f"{obs.message}: {found}" if found else ""
    return root_of(obs.message)


def _journal_causes(contents: journal_mod.JournalContents) -> set[str]:
    """The causes the journal already holds at ``REPEATS_TO_STOP`` candidates or more."""
    where: dict[str, set[str]] = {}
    for seen in contents.observed:
        obs = Observation(seen.commit, seen.verdict, seen.lifetime_id, dict(seen.detail),
                          seen.message)
        cause = failure_cause(obs)
        if cause:
            where.setdefault(cause, set()).add(obs.commit)
    return {cause for cause, commits in where.items() if len(commits) >= REPEATS_TO_STOP}


class _Watch:
    """This run's attempts; raises the stop at the next evaluation once ``repeated_cause`` says
    so (the failed lifetime itself is journaled first: nothing is lost)."""

    def __init__(self, seen: Collection[str]) -> None:
        self.seen = set(seen)
        self.attempts: list[Attempt] = []
        self._lock = threading.Lock()

    def check(self) -> None:
        with self._lock:
            found = repeated_cause(self.attempts, self.seen)
            last = self.attempts[-1].shown if self.attempts else ""
        if found is None:
            return
        cause, lifetimes, candidates = found
        raise InfrastructureError(
            f"{lifetimes} lifetimes at {candidates} candidates in a row failed the same way, "
            f"and none ran since: {last or cause}; that is most likely this machine, not the "
            "candidates: fix it, then `bisect resume` (if those commits are broken "
            "themselves, `bisect resume` goes on past them)"
        )

    def add(self, commit: str, failure: str | None) -> None:
        """``failure``: the root cause as printed (``root_of``); None: it ran."""
        if failure == "":
            return  # says nothing of the machine either way
        key = None if failure is None else cause_of(failure)
        with self._lock:
            self.attempts.append(Attempt(commit, key, failure or ""))


class _Watched:
    """An evaluator whose outcomes the watch sees."""

    def __init__(self, inner: Evaluator, watch: _Watch) -> None:
        self.inner, self.watch = inner, watch

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        self.watch.check()
        obs = self.inner.evaluate(commit, lifetime_id, tags)
        self.watch.add(commit, _failure(obs))
        return obs

    def prepare(self, commits: Sequence[str]) -> None:
        self.inner.prepare(commits)

    def cancel(self) -> int:
        return self.inner.cancel()


class _WatchedGates(_Watched):
    """A watched evaluator that can also ask the gate alone (the gate sweep): a gate's refusal
    is the candidate's own, so the watch does not count it."""

    def __init__(self, inner: Evaluator, watch: _Watch) -> None:
        assert isinstance(inner, Gates)
        super().__init__(inner, watch)
        self.gates = inner

    def gate_check(self, commit: str, tags: Sequence[str] = ()) -> Observation:
        return self.gates.gate_check(commit, tags)


def _watched(arm: Evaluator, watch: _Watch) -> _Watched:
    return _WatchedGates(arm, watch) if isinstance(arm, Gates) else _Watched(arm, watch)


class _WatchedControls:
    """The controls on one candidate, whose outcome the watch sees too: controls that could not
    boot at one candidate after another are the same failure as the lifetimes'."""

    def __init__(self, inner: ControlsRunner, watch: _Watch, commit: str) -> None:
        self.inner, self.watch, self.commit = inner, watch, commit

    def run(self) -> Mapping[str, Any]:
        self.watch.check()
        entry = self.inner.run()
        ran = not entry.get("untestable")
        self.watch.add(self.commit, None if ran else root_of(str(entry.get("problem") or "")))
        return entry


def end_leftovers(
    repo: Path | None, state_dir: Path, session_id: str, observer: Observer
) -> int:
    """End what a killed run left running (probe process groups, worktrees); say how many."""
    from bisect_tool.range.worktrees import remove_stale_worktrees
    from bisect_tool.run.statedir import copied_from
    from bisect_tool.runtime.children import end_all

    # a copy of a live state dir (`cp -a`) records the live run's processes, not its own
    ended = 0 if copied_from(state_dir) else end_all(state_dir, session_id)
    if ended:
        observer(Note(f"ended {ended} process group(s) left running by a killed run"))
    if repo is not None:  # a release-level run without a clone has no worktrees
        remove_stale_worktrees(repo)
    return ended


def _outcome(state: ledger.Ledger, next_candidate: Candidate | None = None) -> Outcome:
    summary = state.standing().status()
    end = state.end or {}
    end_state = EndState(end["state"]) if end else EndState.RUNNING
    return Outcome(end_state, str(end.get("message", "")), summary, next_candidate)
