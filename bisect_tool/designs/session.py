"""The loop that wires range, strategy, evaluator and journal. It never calls git, HTTP or
Docker itself: evaluators do, behind ``bisect_tool.interfaces.Evaluator``.

State is the journal: ``replay`` rebuilds the strategy from it, so ``resume`` after a crash (even
SIGKILL) continues where it stopped, losing nothing and counting nothing twice.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_tool import __version__
from bisect_tool.cause import one_line
from bisect_tool.errors import StateError
from bisect_tool.journal import JournalContents, entries
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.recipes.recipe import Recipe, SearchSettings
from bisect_tool.strategy import BayesianStrategy, Costs, Priors
from bisect_tool.strategy.ends import answer_doubt, good_end_not_good
from bisect_tool.strategy.tiers import (
    MixturePrior,
    Phase,
    Sides,
    Tier,
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
    **more: Any,
) -> entries.HeaderEntry:
    """A bisect journal's header: the range resolved, the recipe, how it was started (``more``:
    the other fields ``entries.HeaderEntry`` names)."""
    return entries.header(
        session=session or uuid.uuid4().hex[:12],
        mode=mode,
        candidates=[c.to_dict() for c in commit_range.candidates],
        direction=str(commit_range.direction),
        good=commit_range.good,
        bad=commit_range.bad,
        good_ref=commit_range.good_ref,
        bad_ref=commit_range.bad_ref,
        repo=str(repo) if repo else "",
        recipe=recipe,
        command=command,
        paths=commit_range.paths,
        tool_version=__version__,
        **more,
    )


def header_recipe(
    recipe: Recipe | None,
    search_overrides: Mapping[str, Any] | None = None,
    *,
    deterministic: bool = False,
) -> dict[str, Any]:
    """The header's ``recipe``: the recipe whole, or without one (``--run``, manual) the search
    flags; ``[probe] deterministic`` either way when ``--deterministic`` was given.

    Without a recipe nothing is fetched or built: a new candidate costs what another run of one
    does (a ``--run`` measures it so; a verdict given by hand is one run either way), so the
    search spends runs as git bisect does unless ``--cost-new`` says otherwise."""
    out = recipe.to_dict() if recipe else {
        "search": {"cost_new_candidate": 0.0, **dict(search_overrides or {})}}
    if deterministic:
        out.setdefault("probe", {})["deterministic"] = True
    return out


def deterministic_probe(header: Mapping[str, Any]) -> bool:
    """``[probe] deterministic`` (``--deterministic``): one run a candidate."""
    probe = (header.get("recipe") or {}).get("probe") or {}
    return bool(probe.get("deterministic"))


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
    fast probe's search, and moves through the phases of ``bisect_tool.strategy.tiers``.
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
    #: why each candidate that could not run could not (the first line of its first failure)
    untestable_why: dict[int, str] = dataclasses.field(default_factory=dict)
    #: controls entries of candidates that could not run them (the controls moved on)
    controls_refused: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: candidates the gate's sweep settled (let through, or refused: ``untestable`` entries)
    gated: set[int] = dataclasses.field(default_factory=set)

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

    def apply(self, entry: Mapping[str, Any]) -> None:
        kind = entry.get("type")
        if kind == "observation":
            lid = entry.get("lifetime_id", "")
            if lid and lid in self.seen_lifetimes:
                return  # idempotent: a retried lifetime is not counted twice
            self.seen_lifetimes.add(lid)
            tier = Tier(entry.get("tier") or Tier.FAITHFUL)
            self._observe(tier, entry)
        elif kind == "untestable":
            at = int(entry["position"])
            self.verdicts.setdefault(at, []).append(Verdict.UNTESTABLE)
            self.strategy.mark_untestable(at)
            self.untestable_why.setdefault(at, one_line(str(entry.get("message") or ""), 300))
            self.gated.add(at)
        elif kind == "gate":
            self.gated.add(int(entry["position"]))
        elif kind == "controls":
            if entry.get("untestable"):
                # the candidate could not run the controls (the gate refused it, its server
                # never booted): it is untestable for lifetimes, and the controls move on
                self.controls_refused.append(dict(entry))
                position = self.position_of(str(entry.get("commit", "")))
                if position is not None and not self.strategy.summary().total[position]:
                    self.strategy.mark_untestable(position)
            else:
                self.controls = dict(entry)
        elif kind == "phase":
            self._enter(entry)
        elif kind == "end":
            self.end = dict(entry)

    def _observe(self, tier: Tier, entry: Mapping[str, Any]) -> None:
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
        if seen is Evidence.CANNOT_RUN:
            # why, in one line, for an end that turns out untestable (the build's failure, the
            # gate's verdict, the first error of a dead server's log): never the log tail itself
            self.untestable_why.setdefault(pos, one_line(str(entry.get("message") or ""), 300))
        seen = self._boot_tries(tier, pos, seen, detail)
        if seen is not Evidence.CANNOT_RUN or detail.get("stage") not in SHARED_STAGES:
            # its artifacts are at hand: the other tier switches to it for free
            for other in (self.strategy, self.narrow):
                if other is not None:
                    other.mark_prepared(pos)
        rejected = tier is Tier.NARROW and detail.get("gate") not in (None, "ok")
        if rejected and not self.strategy.summary().total[pos]:
            # The fast probe ran, but the pinned stack rejects this candidate's extension: the
            # faithful tier cannot run it (the op is named in the gate's message).
            self.strategy.mark_untestable(pos)
        if seen is Evidence.NOTHING:
            self._inconclusive(strategy, tier, pos)
            return
        self.inconclusive_streak[(tier, pos)] = 0
        self._record(strategy, pos, seen, detail)

    def _boot_tries(
        self, tier: Tier, pos: int, seen: Evidence, detail: Mapping[str, Any]
    ) -> Evidence:
        """``seen``, except that a candidate's first server to die at boot is no evidence."""
        if seen is Evidence.CANNOT_RUN and detail.get("stage") == "boot":
            # A server that died before /health may be the candidate's fault or the machine's
            # (seen on the H200: two vLLM servers profiling one GPU at once left one with
            # "Available KV cache memory: -0.67 GiB"): the first such failure is no evidence,
            # the second in a row makes the candidate untestable.
            failures = self.boot_failures.get((tier, pos), 0) + 1
            self.boot_failures[(tier, pos)] = failures
            if failures < BOOT_TRIES:
                return Evidence.NOTHING
        elif seen is not Evidence.CANNOT_RUN:
            self.boot_failures.pop((tier, pos), None)
        return seen

    def _inconclusive(self, strategy: BayesianStrategy, tier: Tier, pos: int) -> None:
        """No evidence either way; but a candidate where the probe can never decide (e.g. the
        target batch never forms) must not be retried forever."""
        streak = self.inconclusive_streak.get((tier, pos), 0) + 1
        self.inconclusive_streak[(tier, pos)] = streak
        if streak >= MAX_INCONCLUSIVE_STREAK:
            if strategy.summary().total[pos]:
                strategy.retire(pos)  # keep the conclusive lifetimes it gave
            else:
                strategy.mark_untestable(pos)

    def _record(
        self, strategy: BayesianStrategy, pos: int, seen: Evidence, detail: Mapping[str, Any]
    ) -> None:
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
                if each is not None and not each.summary().total[pos]:
                    each.mark_untestable(pos)

    def _time(
        self, tier: Tier, pos: int, entry: Mapping[str, Any], detail: Mapping[str, Any]
    ) -> None:
        """The run's own costs (``measured_costs``): what a lifetime took beyond its artifact,
        and what getting a candidate's artifact took the first time (later ones hit the
        cache, which ``mark_prepared`` already prices at nothing)."""
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

    def _enter(self, entry: Mapping[str, Any]) -> None:
        phase = Phase(entry["phase"])
        if phase is Phase.CONFIRM:
            self.sides = Sides(int(entry["bad_side"]), int(entry["good_side"]))
            narrow = self.strategy_for(Tier.NARROW)
            self.prior = mixture_prior(
                narrow, self.settings.stand_in_prior, self.settings.end_doubt
            )
            self.strategy.set_prior(self.prior.in_range, self.prior.ends)
        self.phase = phase
        self.phases.append(dict(entry))

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

    def position_of(self, commit: str) -> int | None:
        return next((i for i, c in enumerate(self.candidates) if c.sha == commit), None)

    def stand_in_probability(self) -> float | None:
        """P(the fast probe is a valid stand-in | the faithful lifetimes), once confirming."""
        if self.prior is None:
            return None
        return stand_in_probability(self.strategy.summary(), self.prior)

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
        rates = self.strategy.rates()
        # a good end that showed the bug may not be a good end at all, and the commits before
        # the flip may show it at a lower rate (bisect_tool.strategy.ends): the answer's confidence
        # is
        # P(the flip AND both ends as given), so it takes those doubts too
        not_good = good_end_not_good(s)
        return SearchState(
            state=self.end["state"] if self.end else str(EndState.RUNNING),
            direction=str(self.direction),
            flip_block=tuple(self.candidates[f].sha for f in s.block),
            # the good side's check only where the stop rules apply it: the plain search
            confidence=s.confidence * (1 - answer_doubt(s, self.phase is Phase.FAITHFUL)),
            credible_set=tuple(self.candidates[f].sha for f in s.credible_set),
            p_median=rates.p_median,
            p_interval=rates.p_interval,
            q_median=rates.q_median,
            q_interval=rates.q_interval,
            evaluations=s.evaluations,
            candidates_tested=s.candidates_tested,
            posterior=(0.0, *(float(x) for x in self.strategy.posterior())),
            good_end_doubt=s.good_end_doubt + (1 - s.good_end_doubt) * not_good,
            bad_end_doubt=s.bad_end_doubt,
            tiers=self._tier_facts(),
        )

    def _tier_facts(self) -> dict[str, Any] | None:
        if self.narrow is None:
            return None
        narrow = self.narrow.summary()
        block, mass = narrow.block, narrow.confidence
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
            # a flip off the main line (a release branch's bump or cherry-pick): where it lives
            # and the main commit it copies
            "flip_provenance": {c.sha: c.provenance() for c in self.candidates
                                if c.sha in st.flip_block and c.provenance()},
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
    return BayesianStrategy(
        size,
        direction,
        costs=Costs(settings.cost_new_candidate, settings.cost_lifetime),
        confidence=settings.confidence,
        priors=dataclasses.replace(narrow_priors(settings.end_doubt),
                                   clean_against_rate=settings.clean_against_rate),
        deterministic=True,
    )


def replay(contents: JournalContents) -> State:
    header = contents.header
    candidates = tuple(Candidate.from_dict(c) for c in header["candidates"])
    settings = search_settings(header)

    def new_strategy() -> BayesianStrategy:
        if deterministic_probe(header):
            # git bisect's contract: the same model as the fast probe's (p = 1, false alarms
            # all but impossible), one run a candidate
            return narrow_strategy(len(candidates), Direction(header["direction"]), settings)
        return BayesianStrategy(
            len(candidates),
            Direction(header["direction"]),
            costs=Costs(settings.cost_new_candidate, settings.cost_lifetime),
            confidence=settings.confidence,
            priors=Priors(end_doubt=settings.end_doubt,
                          clean_against_rate=settings.clean_against_rate),
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
) -> entries.ObservationEntry:
    return entries.observation(obs, position, tier=tier)
