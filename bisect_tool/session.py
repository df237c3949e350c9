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
from bisect_tool.errors import StateError
from bisect_tool.journal import JOURNAL_VERSION, Journal, JournalContents
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.recipe import SearchSettings
from bisect_tool.strategy import BayesianStrategy, Costs, NoCandidateLeft, Priors
from bisect_tool.tiers import (
    NARROW_END_RUNS,
    MixturePrior,
    Phase,
    Sides,
    Tier,
    confirm_sides,
    disagreement,
    mixture_prior,
    narrow_priors,
    stand_in_probability,
)
from bisect_tool.values import Direction, Observation, SearchState, Verdict, short
from bisect_tool.verdict import (
    MAX_INCONCLUSIVE_STREAK,
    EndState,
    Evidence,
    aggregate,
    evidence,
)

#: an UNTESTABLE lifetime's stage (its detail's ``stage``) that makes the candidate untestable
#: for both tiers: the artifact itself is missing or does not build
SHARED_STAGES = ("artifacts",)
#: boots of a candidate that may fail in a row before it is untestable
BOOT_TRIES = 2


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
class TierTimes:
    """What a tier's work took, from its journaled observations (seconds)."""

    lifetime_s: list[float] = dataclasses.field(default_factory=list)  # without the artifact
    artifact_s: list[float] = dataclasses.field(default_factory=list)  # first fetch/build only


@dataclass
class State:
    """The search rebuilt from a journal.

    ``strategy`` is the faithful search (the recipe's own probe: server lifetimes, a ``--run``
    command, manual verdicts). A tiered recipe (``[probe] narrow``) also has ``narrow``, the
    fast probe's search, and moves through the phases of ``bisect_tool.tiers``.
    """

    header: dict[str, Any]
    candidates: tuple[Candidate, ...]
    strategy: BayesianStrategy
    settings: SearchSettings
    lifetimes_by_commit: dict[str, int]
    seen_lifetimes: set[str]
    end: dict[str, Any] | None = None
    controls: dict[str, Any] | None = None
    inconclusive_streak: dict[tuple[Tier, int], int] = dataclasses.field(default_factory=dict)
    verdicts: dict[int, list[Verdict]] = dataclasses.field(default_factory=dict)
    narrow: BayesianStrategy | None = None
    phase: Phase = Phase.FAITHFUL
    sides: Sides | None = None  # the confirm step's two candidates
    prior: MixturePrior | None = None  # the faithful prior from the confirm step on
    phases: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    narrow_verdicts: dict[int, list[Verdict]] = dataclasses.field(default_factory=dict)
    times: dict[Tier, TierTimes] = dataclasses.field(
        default_factory=lambda: {Tier.NARROW: TierTimes(), Tier.FAITHFUL: TierTimes()}
    )
    runs: dict[Tier, int] = dataclasses.field(
        default_factory=lambda: {Tier.NARROW: 0, Tier.FAITHFUL: 0}
    )
    _fetched: set[int] = dataclasses.field(default_factory=set)
    boot_failures: dict[tuple[Tier, int], int] = dataclasses.field(default_factory=dict)

    @property
    def direction(self) -> Direction:
        return Direction(self.header["direction"])

    @property
    def tiered(self) -> bool:
        return self.narrow is not None

    def strategy_for(self, tier: Tier) -> BayesianStrategy:
        if tier is Tier.NARROW:
            if self.narrow is None:
                raise StateError("the journal has a narrow-tier entry but no narrow tier")
            return self.narrow
        return self.strategy

    def apply(self, entry: dict[str, Any]) -> None:
        kind = entry.get("type")
        if kind == "observation":
            lid = entry.get("lifetime_id", "")
            if lid and lid in self.seen_lifetimes:
                return  # idempotent: a retried lifetime is not counted twice
            self.seen_lifetimes.add(lid)
            tier = Tier(entry.get("tier") or Tier.FAITHFUL)
            self._observe(tier, entry)
        elif kind == "untestable":
            self.verdicts.setdefault(int(entry["position"]), []).append(Verdict.UNTESTABLE)
            self.strategy.mark_untestable(int(entry["position"]))
        elif kind == "controls":
            self.controls = entry
        elif kind == "phase":
            self._enter(entry)
        elif kind == "end":
            self.end = entry

    def _observe(self, tier: Tier, entry: dict[str, Any]) -> None:
        strategy = self.strategy_for(tier)
        pos = int(entry["position"])
        commit = entry["commit"]
        key = f"{tier}:{commit}" if tier is Tier.NARROW else commit
        self.lifetimes_by_commit[key] = self.lifetimes_by_commit.get(key, 0) + 1
        self.runs[tier] += 1
        verdict = Verdict(entry["verdict"])
        (self.narrow_verdicts if tier is Tier.NARROW else self.verdicts).setdefault(
            pos, []).append(verdict)
        raw = entry.get("detail")
        detail: dict[str, Any] = raw if isinstance(raw, dict) else {}
        self._time(tier, pos, entry, detail)
        seen = evidence(verdict)
        if seen is Evidence.CANNOT_RUN and detail.get("stage") == "boot":
            # A server that died before /health may be the candidate's fault or the machine's
            # (seen on the H200: two vLLM servers profiling one GPU at once left one with
            # "Available KV cache memory: -0.67 GiB"): the first such failure is no evidence,
            # the second in a row makes the candidate untestable.
            failures = self.boot_failures.get((tier, pos), 0) + 1
            self.boot_failures[(tier, pos)] = failures
            if failures < BOOT_TRIES:
                seen = Evidence.NOTHING
        elif seen is not Evidence.CANNOT_RUN:
            self.boot_failures.pop((tier, pos), None)
        if seen is not Evidence.CANNOT_RUN or detail.get("stage") not in SHARED_STAGES:
            # its artifacts are at hand: the other tier switches to it for free
            for other in (self.strategy, self.narrow):
                if other is not None:
                    other.artifacts_ready.add(pos)
        rejected = tier is Tier.NARROW and detail.get("gate") not in (None, "ok")
        if rejected and not self.strategy.counts.total[pos]:
            # The fast probe ran, but the pinned stack rejects this candidate's extension: the
            # faithful tier cannot run it (the op is named in the gate's message).
            self.strategy.mark_untestable(pos)
        if seen is Evidence.NOTHING:
            # No evidence either way; but a candidate where the probe can never decide
            # (e.g. the target batch never forms) must not be retried forever.
            streak = self.inconclusive_streak.get((tier, pos), 0) + 1
            self.inconclusive_streak[(tier, pos)] = streak
            if streak >= MAX_INCONCLUSIVE_STREAK:
                if strategy.counts.total[pos]:
                    strategy.retire(pos)  # keep the conclusive lifetimes it gave
                else:
                    strategy.mark_untestable(pos)
            return
        self.inconclusive_streak[(tier, pos)] = 0
        if seen is Evidence.BUG:
            strategy.record(pos, True)
        elif seen is Evidence.NO_BUG:
            strategy.record(pos, False)
        elif seen is Evidence.CANNOT_RUN:
            # A candidate that never gave a conclusive lifetime is untestable (no artifact,
            # build or boot failure, incompatible ops). One that already did keeps its
            # evidence: a later crash says nothing about the bug either way.
            shared = detail.get("stage") in SHARED_STAGES
            for each in (strategy, *((self.strategy, self.narrow) if shared else ())):
                if each is not None and not each.counts.total[pos]:
                    each.mark_untestable(pos)

    def _time(self, tier: Tier, pos: int, entry: dict[str, Any], detail: dict[str, Any]) -> None:
        """The run's own costs (``measured_costs``): what a lifetime took beyond its artifact,
        and what getting a candidate's artifact took the first time (later ones hit the
        cache, which ``artifacts_ready`` already prices at nothing)."""
        raw = detail.get("timing")
        timing: dict[str, Any] = raw if isinstance(raw, dict) else {}
        try:
            total = float(entry.get("duration_s") or 0.0)
            artifact = float(timing.get("artifacts_s") or 0.0)
        except (TypeError, ValueError):
            return
        if total <= 0:
            return
        times = self.times[tier]
        times.lifetime_s.append(max(total - artifact, 0.0))
        if pos not in self._fetched:
            self._fetched.add(pos)
            times.artifact_s.append(artifact)

    def _enter(self, entry: dict[str, Any]) -> None:
        phase = Phase(entry["phase"])
        if phase is Phase.CONFIRM:
            self.sides = Sides(int(entry["bad_side"]), int(entry["good_side"]))
            narrow = self.strategy_for(Tier.NARROW)
            self.prior = mixture_prior(
                narrow, self.settings.stand_in_prior, self.settings.end_doubt
            )
            self.strategy.set_prior(self.prior.in_range, self.prior.ends)
        self.phase = phase
        self.phases.append(entry)

    def measured_costs(self, tier: Tier) -> Costs:
        """The costs the strategy chooses by: the recipe's only until the run measured its own
        (seconds per lifetime, per new candidate's artifact)."""
        guess = Costs(self.settings.cost_new_candidate, self.settings.cost_lifetime)
        times = self.times[tier]
        if not times.lifetime_s:
            return guess
        lifetime = max(sum(times.lifetime_s) / len(times.lifetime_s), 1e-3)
        if times.artifact_s:
            new = sum(times.artifact_s) / len(times.artifact_s)
        else:
            new = lifetime * guess.new_candidate / guess.lifetime
        return Costs(new_candidate=new, lifetime=lifetime)

    def stand_in_probability(self) -> float | None:
        """P(the fast probe is a valid stand-in | the faithful lifetimes), once confirming."""
        if self.prior is None:
            return None
        return stand_in_probability(self.strategy, self.prior)

    def candidate_verdict(self, position: int) -> Verdict:
        """The candidate's verdict over its journaled lifetimes (``verdict.aggregate``)."""
        return aggregate(self.verdicts.get(position, ()))

    def next_lifetime_ids(
        self, commit: str, count: int = 1, tier: Tier = Tier.FAITHFUL
    ) -> list[str]:
        """Stable ids ``<sha12>-<n>`` (``<sha12>-narrow-<n>`` for the fast probe's runs): a
        resumed run never reuses one already journaled."""
        ids: list[str] = []
        key = f"{tier}:{commit}" if tier is Tier.NARROW else commit
        n = self.lifetimes_by_commit.get(key, 0)
        infix = "-narrow" if tier is Tier.NARROW else ""
        while len(ids) < count:
            lid = f"{short(commit)}{infix}-{n}"
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
            tiers=self._tier_facts(),
        )

    def _tier_facts(self) -> dict[str, Any] | None:
        if self.narrow is None:
            return None
        block, mass = self.narrow.top_block()
        return {
            "kind": narrow_kind(self.header),
            "phase": str(self.phase),
            "narrow_flip": self.candidates[block[0]].sha,
            "narrow_confidence": mass,
            "narrow_runs": self.runs[Tier.NARROW],
            "faithful_lifetimes": self.runs[Tier.FAITHFUL],
            "sides": None if self.sides is None else [self.sides.bad, self.sides.good],
            "stand_in_prior": self.settings.stand_in_prior,
            "stand_in_probability": self.stand_in_probability(),
        }

    def summary(self) -> dict[str, Any]:
        """``status --json``: the search state under the names the CLI documents."""
        st = self.search_state()
        return {
            "tiers": st.tiers,
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
            "level": str(self.header.get("level") or "commit"),
        }


def narrow_kind(header: dict[str, Any]) -> str:
    """The fast probe a recipe run narrows with ("" = none): ``[probe] narrow``."""
    if header.get("mode") != "recipe":
        return ""
    probe = (header.get("recipe") or {}).get("probe") or {}
    return str(probe.get("narrow") or "")


def narrow_strategy(size: int, direction: Direction, settings: SearchSettings) -> BayesianStrategy:
    """The fast probe's search: a deterministic probe (``tiers.narrow_priors``), one run a
    candidate. If it is in fact intermittent, its flip is only where the confirm step looks,
    and the confirm step's faithful lifetimes catch a wrong one."""
    strategy = BayesianStrategy(
        size,
        direction,
        costs=Costs(settings.cost_new_candidate, settings.cost_lifetime),
        confidence=settings.confidence,
        priors=narrow_priors(settings.end_doubt),
    )
    strategy.deterministic = True
    strategy.bad_end_lifetimes = 1
    return strategy


def replay(contents: JournalContents) -> State:
    header = contents.header
    candidates = tuple(Candidate.from_dict(c) for c in header["candidates"])
    settings = search_settings(header)

    def new_strategy() -> BayesianStrategy:
        return BayesianStrategy(
            len(candidates),
            Direction(header["direction"]),
            costs=Costs(settings.cost_new_candidate, settings.cost_lifetime),
            confidence=settings.confidence,
            priors=Priors(end_doubt=settings.end_doubt),
        )

    state = State(header, candidates, new_strategy(), settings, {}, set())
    if narrow_kind(header):
        state.narrow = narrow_strategy(len(candidates), Direction(header["direction"]), settings)
        state.phase = Phase.NARROW
    for entry in contents.entries:
        state.apply(entry)
    return state


def observation_entry(
    obs: Observation, position: int, tier: Tier = Tier.FAITHFUL
) -> dict[str, Any]:
    entry = {
        "type": "observation",
        "lifetime_id": obs.lifetime_id,
        "commit": obs.commit,
        "position": position,
        "verdict": str(obs.verdict),
        "detail": obs.detail,
        "message": obs.message,
        "duration_s": round(obs.duration_s, 3),
    }
    if tier is not Tier.FAITHFUL:  # absent = faithful: journals before tiers read the same
        entry["tier"] = str(tier)
    return entry


@dataclass(frozen=True)
class Run:
    """Next: lifetimes of ``tier``, chosen ``within`` two candidates or over the range."""

    tier: Tier
    within: tuple[int, int] | None = None


@dataclass(frozen=True)
class Stop:
    state: EndState
    message: str


@dataclass(frozen=True)
class Switch:
    """Next: journal this ``phase`` entry (the tiered search moves on), then decide again."""

    entry: dict[str, Any]


Step = Run | Stop | Switch


def next_step(state: State) -> Step:
    """What the run does next: the one place that decides between the tiers' phases."""
    if state.phase is Phase.NARROW:
        return _narrow_step(state)
    if state.phase is Phase.CONFIRM:
        return _confirm_step(state)
    reason = stop_reason(state)
    return Run(Tier.FAITHFUL) if reason is None else Stop(*reason)


def _narrow_step(state: State) -> Step:
    narrow = state.strategy_for(Tier.NARROW)
    settings = dataclasses.replace(
        state.settings, max_end_lifetimes=min(state.settings.max_end_lifetimes, NARROW_END_RUNS)
    )
    runs = state.runs[Tier.NARROW]
    kind = narrow_kind(state.header) or "fast"
    contradiction = narrow.self_contradiction() if narrow.deterministic else None
    if contradiction is not None:
        # The op check runs fixed inputs: a clean run on the bad side of a divergent one is the
        # probe failing its premise (a flaky check, say), and a posterior that explains it with
        # false alarms would only send it on to run every candidate. Hand over at once.
        clean, divergent = (state.candidates[i] for i in contradiction)
        return Switch({"type": "phase", "phase": str(Phase.FAITHFUL), "message": (
            f"the {kind} probe contradicted itself (the bug at {divergent.label}, none at "
            f"{clean.label} nearer the bad end): it does not behave deterministically for this "
            "bug here; going on with lifetimes over the whole range, every observation kept")})
    reason = _stop_reason(state, narrow, settings, runs, "runs of the fast probe")
    if reason is None and not narrow.counts.total.any() and len(narrow.counts.untestable) >= 2:
        # Two candidates in a row the fast probe could not run, and none it could: it cannot
        # run here (no PyTorch for the op check, say), not a property of those candidates.
        reason = (EndState.NO_CANDIDATE,
                  f"it ran on none of {len(narrow.counts.untestable)} candidates; `bisect log` "
                  "has its messages")
    if reason is None:
        return Run(Tier.NARROW)
    end, message = reason
    if end is EndState.DONE:
        sides = confirm_sides(narrow, state.strategy)
        block, mass = narrow.top_block()
        flip = state.candidates[block[0]]
        if sides is not None:
            bad, good = (state.candidates[sides.bad], state.candidates[sides.good])
            return Switch({
                "type": "phase",
                "phase": str(Phase.CONFIRM),
                "bad_side": sides.bad,
                "good_side": sides.good,
                "narrow_flip": flip.sha,
                "narrow_confidence": mass,
                "message": (
                    f"the {kind} probe put the flip at {flip.label} ({mass:.1%}) in "
                    f"{state.runs[Tier.NARROW]} runs; confirming with lifetimes on both sides: "
                    f"{bad.label} (bug expected) and {good.label} (none expected)"
                ),
            })
        message = "no candidate beside its flip can run with the faithful probe"
    return Switch({
        "type": "phase",
        "phase": str(Phase.FAITHFUL),
        "message": (
            f"the {kind} probe could not narrow the range ({message}); going on with "
            "lifetimes over the whole range"
        ),
    })


def _confirm_step(state: State) -> Step:
    s, sides = state.strategy, state.sides
    assert sides is not None
    budget = state.settings.max_evaluations
    if sides.bad in s.counts.untestable or sides.good in s.counts.untestable:
        moved = confirm_sides(state.strategy_for(Tier.NARROW), s)
        if moved is not None and moved != sides:
            bad, good = state.candidates[moved.bad], state.candidates[moved.good]
            return Switch({
                "type": "phase", "phase": str(Phase.CONFIRM),
                "bad_side": moved.bad, "good_side": moved.good,
                "message": (f"a side of the flip cannot run with the faithful probe; confirming "
                            f"at {bad.label} and {good.label} instead"),
            })
        return Switch({"type": "phase", "phase": str(Phase.FAITHFUL), "message": (
            "no candidate beside the fast probe's flip can run with the faithful probe; going "
            "on with lifetimes over the whole range")})
    # Both sides must have spoken: the prior alone (the fast probe's flip) is never the answer.
    if s.counts.divergent[sides.bad] and s.counts.total[sides.good] and s.done():
        return Stop(EndState.DONE, "the flip holds the asked confidence")
    which = disagreement(s, sides)
    d_bad, t_bad = int(s.counts.divergent[sides.bad]), int(s.counts.total[sides.bad])
    if which is None and not d_bad and t_bad >= state.settings.max_end_lifetimes:
        # With no divergence seen anywhere, clean lifetimes cannot rule out a rare bug: after as
        # many as the bad end gets, the confirm step stops waiting for one.
        which = "bad"
    if which is not None:
        pos = sides.bad if which == "bad" else sides.good
        d, t = int(s.counts.divergent[pos]), int(s.counts.total[pos])
        saw = (f"did not show the bug at {state.candidates[pos].label}, where the fast probe "
               f"did ({d} of {t} lifetimes divergent)" if which == "bad" else
               f"showed the bug at {state.candidates[pos].label}, where the fast probe did not "
               f"({d} of {t} lifetimes divergent)")
        return Switch({"type": "phase", "phase": str(Phase.FAITHFUL), "message": (
            f"the faithful probe {saw}: the fast probe is not a stand-in for this bug here; "
            "going on with lifetimes over the whole range, every observation kept")})
    if state.runs[Tier.FAITHFUL] >= budget:
        return Stop(EndState.BUDGET, f"budget of {budget} lifetimes exhausted")
    return Run(Tier.FAITHFUL, sides.as_tuple())


def stop_reason(state: State) -> tuple[EndState, str] | None:
    """Why the (faithful) search should stop now, if it should."""
    return _stop_reason(
        state, state.strategy, state.settings, state.runs[Tier.FAITHFUL], "lifetimes"
    )


def _stop_reason(
    state: State,
    s: BayesianStrategy,
    settings: SearchSettings,
    spent: int,
    unit: str,
) -> tuple[EndState, str] | None:
    counts = s.counts
    bad, good = s.effective_ends()
    for end, name in ((bad, "bad"), (good, "good")):
        if end is None:
            nominal = s.bad_end if name == "bad" else s.good_end
            return EndState.END_UNTESTABLE, (
                f"the {name} end {state.candidates[nominal].label} is untestable and so is "
                f"every candidate next to it; pick another --{name}"
            )
    assert bad is not None and good is not None
    stand_in = "" if bad == s.bad_end else (
        f" (standing in for the untestable bad end {state.candidates[s.bad_end].label})")
    if (counts.divergent[bad] == 0 and counts.total[bad] >= settings.max_end_lifetimes
            and not counts.divergent.any()):
        return EndState.BAD_END_NEVER, (
            f"the bad end {state.candidates[bad].label}{stand_in} never showed the bug in "
            f"{counts.total[bad]} {unit}: nothing to bisect (check the recipe, or raise "
            "max_end_lifetimes)"
        )
    contradicted = s.contradicted_end() if counts.total[bad] and counts.total[good] else None
    if contradicted is not None:
        return EndState.ENDS_CONTRADICT, ends_contradict_message(state, contradicted, s)
    if counts.total[bad] and counts.total[good] and s.done() and s.bug_shown():
        return EndState.DONE, "the flip holds the asked confidence"
    if spent >= settings.max_evaluations:
        return EndState.BUDGET, f"budget of {settings.max_evaluations} {unit} exhausted"
    return None


def ends_contradict_message(
    state: State, end: str, strategy: BayesianStrategy | None = None
) -> str:
    """One line: which end, what it saw, what to do."""
    s = strategy or state.strategy
    bad, good = s.effective_ends()
    pos = (good if end == "good" else bad)
    if pos is None:
        pos = s.good_end if end == "good" else s.bad_end
    sha = state.candidates[pos].label
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

        raise UsageError(f"{short(commit)} is not a candidate of this bisect; see `bisect log`")
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
