"""The loop that wires range, strategy, evaluator and journal. It never calls git, HTTP or
Docker itself: evaluators do, behind ``bisect_tool.interfaces.Evaluator``.

State is the journal: ``replay`` rebuilds the strategy from it, so ``resume`` after a crash (even
SIGKILL) continues where it stopped, losing nothing and counting nothing twice.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool import __version__
from bisect_tool.journal import JOURNAL_VERSION, Journal, JournalContents
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.recipe import SearchSettings
from bisect_tool.strategy import BayesianStrategy, Costs, NoCandidateLeft, Priors
from bisect_tool.values import Direction, Observation, SearchState, Verdict
from bisect_tool.verdict import (
    MAX_INCONCLUSIVE_STREAK,
    EndState,
    Evidence,
    aggregate,
    evidence,
)


def header_for(
    commit_range: CommitRange,
    *,
    session: str | None = None,
    recipe: dict[str, Any] | None = None,
    command: Sequence[str] = (),
    repo: Path | None = None,
    mode: str = "manual",
) -> dict[str, Any]:
    return {
        "type": "header",
        "version": JOURNAL_VERSION,
        "session": session or uuid.uuid4().hex[:12],
        "repo": str(repo) if repo else "",
        "good_ref": commit_range.good_ref,
        "bad_ref": commit_range.bad_ref,
        "good": commit_range.good,
        "bad": commit_range.bad,
        "direction": str(commit_range.direction),
        "paths": list(commit_range.paths),
        "candidates": [c.to_dict() for c in commit_range.candidates],
        "recipe": recipe or {},
        "mode": mode,
        "tool_version": __version__,
        "command": list(command),
    }


def search_settings(header: dict[str, Any]) -> SearchSettings:
    raw = (header.get("recipe") or {}).get("search") or {}
    known = {f.name for f in dataclasses.fields(SearchSettings)}
    return SearchSettings(**{k: v for k, v in raw.items() if k in known})


@dataclass
class State:
    """The search rebuilt from a journal."""

    header: dict[str, Any]
    candidates: tuple[Candidate, ...]
    strategy: BayesianStrategy
    settings: SearchSettings
    lifetimes_by_commit: dict[str, int]
    seen_lifetimes: set[str]
    end: dict[str, Any] | None = None
    controls: dict[str, Any] | None = None
    inconclusive_streak: dict[int, int] = dataclasses.field(default_factory=dict)
    verdicts: dict[int, list[Verdict]] = dataclasses.field(default_factory=dict)

    @property
    def direction(self) -> Direction:
        return Direction(self.header["direction"])

    def apply(self, entry: dict[str, Any]) -> None:
        kind = entry.get("type")
        if kind == "observation":
            lid = entry.get("lifetime_id", "")
            if lid and lid in self.seen_lifetimes:
                return  # idempotent: a retried lifetime is not counted twice
            self.seen_lifetimes.add(lid)
            pos = int(entry["position"])
            commit = entry["commit"]
            self.lifetimes_by_commit[commit] = self.lifetimes_by_commit.get(commit, 0) + 1
            self.verdicts.setdefault(pos, []).append(Verdict(entry["verdict"]))
            seen = evidence(Verdict(entry["verdict"]))
            if seen is Evidence.NOTHING:
                # No evidence either way; but a candidate where the probe can never decide
                # (e.g. the target batch never forms) must not be retried forever.
                streak = self.inconclusive_streak.get(pos, 0) + 1
                self.inconclusive_streak[pos] = streak
                if streak >= MAX_INCONCLUSIVE_STREAK:
                    if self.strategy.counts.total[pos]:
                        self.strategy.retire(pos)  # keep the conclusive lifetimes it gave
                    else:
                        self.strategy.mark_untestable(pos)
                return
            self.inconclusive_streak[pos] = 0
            if seen is Evidence.BUG:
                self.strategy.record(pos, True)
            elif seen is Evidence.NO_BUG:
                self.strategy.record(pos, False)
            elif seen is Evidence.CANNOT_RUN and not self.strategy.counts.total[pos]:
                # A candidate that never gave a conclusive lifetime is untestable (no artifact,
                # build or boot failure, incompatible ops). One that already did keeps its
                # evidence: a later crash says nothing about the bug either way.
                self.strategy.mark_untestable(pos)
        elif kind == "untestable":
            self.verdicts.setdefault(int(entry["position"]), []).append(Verdict.UNTESTABLE)
            self.strategy.mark_untestable(int(entry["position"]))
        elif kind == "controls":
            self.controls = entry
        elif kind == "end":
            self.end = entry

    def candidate_verdict(self, position: int) -> Verdict:
        """The candidate's verdict over its journaled lifetimes (``verdict.aggregate``)."""
        return aggregate(self.verdicts.get(position, ()))

    def next_lifetime_ids(self, commit: str, count: int = 1) -> list[str]:
        """Stable ids ``<sha12>-<n>``: a resumed run never reuses one already journaled."""
        ids: list[str] = []
        n = self.lifetimes_by_commit.get(commit, 0)
        while len(ids) < count:
            lid = f"{commit[:12]}-{n}"
            n += 1
            if lid not in self.seen_lifetimes:
                ids.append(lid)
        return ids

    def search_state(self) -> SearchState:
        """Where the search stands, with SHAs instead of positions (what the report renders)."""
        s = self.strategy.summary()
        return SearchState(
            state=self.end["state"] if self.end else str(EndState.RUNNING),
            direction=str(self.direction),
            flip_block=tuple(self.candidates[f].sha for f in s.block),
            confidence=s.confidence,
            credible_set=tuple(self.candidates[f].sha for f in s.credible_set),
            p_median=s.p_median,
            p_interval=s.p_interval,
            q_median=s.q_median,
            q_interval=s.q_interval,
            evaluations=s.evaluations,
            candidates_tested=s.candidates_tested,
            posterior=(0.0, *(float(x) for x in self.strategy.posterior())),
            good_end_doubt=s.good_end_doubt,
            bad_end_doubt=s.bad_end_doubt,
        )

    def summary(self) -> dict[str, Any]:
        """``status --json``: the search state under the names the CLI documents."""
        st = self.search_state()
        return {
            "state": st.state,
            "direction": st.direction,
            "flip_commit": st.flip_block[0] if len(st.flip_block) == 1 else None,
            "flip_block": list(st.flip_block),
            "confidence": st.confidence,
            "credible_set": list(st.credible_set),
            "evaluations": st.evaluations,
            "candidates_tested": st.candidates_tested,
            "candidates": len(self.candidates),
            "p_estimate": st.p_median,
            "p_interval": list(st.p_interval),
            "q_estimate": st.q_median,
            "q_interval": list(st.q_interval),
            "posterior": list(st.posterior),
            "good_end_doubt": st.good_end_doubt,
            "bad_end_doubt": st.bad_end_doubt,
            "message": (self.end or {}).get("message", ""),
        }


def replay(contents: JournalContents) -> State:
    header = contents.header
    candidates = tuple(Candidate.from_dict(c) for c in header["candidates"])
    settings = search_settings(header)
    strategy = BayesianStrategy(
        len(candidates),
        Direction(header["direction"]),
        costs=Costs(settings.cost_new_candidate, settings.cost_lifetime),
        confidence=settings.confidence,
        priors=Priors(end_doubt=settings.end_doubt),
    )
    state = State(header, candidates, strategy, settings, {}, set())
    for entry in contents.entries:
        state.apply(entry)
    return state


def observation_entry(obs: Observation, position: int) -> dict[str, Any]:
    return {
        "type": "observation",
        "lifetime_id": obs.lifetime_id,
        "commit": obs.commit,
        "position": position,
        "verdict": str(obs.verdict),
        "detail": obs.detail,
        "message": obs.message,
        "duration_s": round(obs.duration_s, 3),
    }


def stop_reason(state: State) -> tuple[EndState, str] | None:
    """Why the search should stop now, if it should."""
    s, settings = state.strategy, state.settings
    bad, good = s.bad_end, s.good_end
    counts = s.counts
    for end, name in ((bad, "bad"), (good, "good")):
        if end in counts.untestable:
            return EndState.END_UNTESTABLE, (
                f"the {name} end {state.candidates[end].sha[:12]} is untestable; pick another "
                f"--{name} commit"
            )
    if counts.divergent[bad] == 0 and counts.total[bad] >= settings.max_end_lifetimes:
        return EndState.BAD_END_NEVER, (
            f"the bad end {state.candidates[bad].sha[:12]} never showed the bug in "
            f"{counts.total[bad]} lifetimes: nothing to bisect (check the recipe, or raise "
            "max_end_lifetimes)"
        )
    contradicted = s.contradicted_end() if counts.total[bad] and counts.total[good] else None
    if contradicted is not None:
        return EndState.ENDS_CONTRADICT, ends_contradict_message(state, contradicted)
    if counts.total[bad] and counts.divergent[bad] and counts.total[good] and s.done():
        return EndState.DONE, "the flip holds the asked confidence"
    if len(state.seen_lifetimes) >= settings.max_evaluations:
        return EndState.BUDGET, f"budget of {settings.max_evaluations} lifetimes exhausted"
    return None


def ends_contradict_message(state: State, end: str) -> str:
    """One line: which end, what it saw, what to do."""
    s = state.strategy
    pos = s.good_end if end == "good" else s.bad_end
    sha = state.candidates[pos].sha[:12]
    d, t = int(s.counts.divergent[pos]), int(s.counts.total[pos])
    beyond, not_bad = s.end_doubts()
    if end == "good":
        older = "older" if state.direction is Direction.REGRESSION else "newer"
        return (
            f"the good end {sha} shows the bug ({d} of {t} lifetimes divergent; "
            f"P = {beyond:.3f} that the flip lies beyond it): give an {older} --good, or check "
            "that the probe can pass at all (a missing file or a broken command fails everywhere)"
        )
    return (
        f"the bad end {sha} does not show the bug ({d} of {t} lifetimes divergent; P = "
        f"{not_bad:.3f} that nothing in the range does): check the recipe reproduces it, or "
        "give another --bad"
    )


def finish(
    journal: Journal, state: State, state_name: EndState, message: str
) -> dict[str, Any]:
    """Journal the ``end`` entry (so `status` reports the outcome and a new `start` is allowed)
    and return the summary at that point."""
    summary = state.summary()
    summary["state"] = str(state_name)
    summary["message"] = message
    slim = {k: v for k, v in summary.items() if k != "posterior"}
    entry = journal.append(
        {"type": "end", "state": str(state_name), "message": message, "summary": slim}
    )
    state.apply(entry)
    return summary


def record_manual(
    journal: Journal, state: State, commit: str, verdict: Verdict, message: str = "manual"
) -> None:
    """``bisect good|bad|skip``: one observation given by hand."""
    position = next((i for i, c in enumerate(state.candidates) if c.sha == commit), None)
    if position is None:
        from bisect_tool.errors import UsageError

        raise UsageError(f"{commit[:12]} is not a candidate of this bisect; see `bisect log`")
    obs = Observation(
        commit, verdict, state.next_lifetime_ids(commit)[0], {"manual": True}, message
    )
    entry = journal.append(observation_entry(obs, position))
    state.apply(entry)


def next_manual_candidate(state: State) -> Candidate | None:
    reason = stop_reason(state)
    if reason is not None and reason[0] is not EndState.BAD_END_NEVER:
        return None
    try:
        return state.candidates[state.strategy.select().position]
    except NoCandidateLeft:
        return None
