"""The ledger: the search rebuilt from its journal, and nothing else. It changes only by
``apply(entry)`` (``replay`` applies a journal; a live run each entry once journaled), so
``resume`` after a crash (even SIGKILL) loses nothing and counts nothing twice; the designs
only read it. How an entry counts is one named policy each (below); where the search stands
is one frozen value, ``Standing`` (``Ledger.standing``).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Collection, Mapping, Sequence
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
from bisect_tool.strategy.ends import checks_seen, doubts
from bisect_tool.strategy.tiers import (
    MixturePrior,
    Phase,
    Sides,
    Tier,
    mixture_prior,
    narrow_priors,
    stand_in_probability,
)
from bisect_tool.values import Direction, Observation, Standing, Verdict, short
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


# -- how an entry counts: one policy each ---------------------------------------------------


def evidence_of(verdict: Verdict, detail: Mapping[str, Any], boot_failures_before: int) -> Evidence:
    """What one journaled lifetime says about its candidate (``verdict.evidence``), except that
    a candidate's first server to die at boot is no evidence: it may be the candidate's fault
    or the machine's (seen on the H200: two vLLM servers profiling one GPU at once left one
    with "Available KV cache memory: -0.67 GiB"), so only ``BOOT_TRIES`` in a row make the
    candidate untestable. ``boot_failures_before``: its boot deaths in a row before this one."""
    seen = evidence(verdict)
    if seen is Evidence.CANNOT_RUN and detail.get("stage") == "boot" \
            and boot_failures_before + 1 < BOOT_TRIES:
        return Evidence.NOTHING
    return seen


def shared_failure(detail: Mapping[str, Any]) -> bool:
    """Whether a candidate that cannot run failed for both tiers: its artifact is missing or
    does not build (``SHARED_STAGES``), rather than its probe or server failing."""
    return detail.get("stage") in SHARED_STAGES


def gate_refused(tier: Tier, detail: Mapping[str, Any]) -> bool:
    """The fast probe ran, but the pinned stack rejects the candidate's extension (the op is
    named in the gate's message): the faithful tier cannot run it."""
    return tier is Tier.NARROW and detail.get("gate") not in (None, "ok")


def gives_up(inconclusive_in_a_row: int) -> bool:
    """A candidate where the probe can never decide (the target batch never forms, say) is not
    retried forever: after ``MAX_INCONCLUSIVE_STREAK`` inconclusive lifetimes in a row it is
    retired (its conclusive lifetimes kept) or, with none, untestable."""
    return inconclusive_in_a_row >= MAX_INCONCLUSIVE_STREAK


def lifetime_key(commit: str, tier: Tier) -> str:
    """How the ledger counts a candidate's lifetimes of ``tier`` (and numbers their ids)."""
    return f"{tier}:{commit}" if tier is Tier.NARROW else commit


@dataclass
class TierTimes:
    """What a tier's work took, from its journaled observations (seconds)."""

    lifetime_s: list[float] = dataclasses.field(default_factory=list)  # without the artifact
    artifact_s: list[float] = dataclasses.field(default_factory=list)  # first fetch/build only


@dataclass
class Ledger:
    """The search rebuilt from a journal: ``replay`` builds it, ``apply`` counts each entry
    after it is journaled, and nothing else changes it (the designs read it; what they hand
    out but the journal does not hold yet, they pass along themselves).

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
        """Count one journal entry: the only way the ledger changes."""
        self.count(entries.parse(entry))

    def count(self, read: entries.Entry) -> None:
        """``apply`` of an entry already read as its kind's value."""
        match read:
            case entries.Observed() as seen:
                if seen.lifetime_id and seen.lifetime_id in self.seen_lifetimes:
                    return  # idempotent: a retried lifetime is not counted twice
                self.seen_lifetimes.add(seen.lifetime_id)
                self._observe(seen)
            case entries.Refused(position=at, message=message):
                self.verdicts.setdefault(at, []).append(Verdict.UNTESTABLE)
                self.strategy.mark_untestable(at)
                self.untestable_why.setdefault(at, one_line(message, 300))
                self.gated.add(at)
            case entries.GateLetThrough(position=at):
                self.gated.add(at)
            case entries.ControlsRan(untestable=True, commit=commit, entry=raw):
                # the candidate could not run the controls (the gate refused it, its server
                # never booted): it is untestable for lifetimes, and the controls move on
                self.controls_refused.append(dict(raw))
                position = self.position_of(commit)
                if position is not None and not self.strategy.summary().total[position]:
                    self.strategy.mark_untestable(position)
            case entries.ControlsRan(entry=raw):
                self.controls = dict(raw)
            case entries.PhaseChanged() as changed:
                self._enter(changed)
            case entries.Ended(entry=raw):
                self.end = dict(raw)
            case entries.Other():
                pass  # the environment, a newer tool's kind: nothing the search counts

    def _observe(self, seen: entries.Observed) -> None:
        tier, pos, detail = seen.tier, seen.position, seen.detail
        strategy = self.strategy_for(tier)
        key = lifetime_key(seen.commit, tier)
        self.lifetimes_by_commit[key] = self.lifetimes_by_commit.get(key, 0) + 1
        self.runs[tier] += 1
        (self.narrow_verdicts if tier is Tier.NARROW else self.verdicts).setdefault(
            pos, []).append(seen.verdict)
        self._time(seen)
        # the run's own costs as measured so far choose its next candidates (the recipe's
        # until then): set here, from the journal, so that no decision changes the strategy
        strategy.set_costs(self.measured_costs(tier))
        died_before = self.boot_failures.get((tier, pos), 0)
        counts = evidence_of(seen.verdict, detail, died_before)
        if evidence(seen.verdict) is not Evidence.CANNOT_RUN:
            self.boot_failures.pop((tier, pos), None)
        else:
            # why, in one line, for an end that turns out untestable (the build's failure, the
            # gate's verdict, the first error of a dead server's log): never the log tail itself
            self.untestable_why.setdefault(pos, one_line(seen.message, 300))
            if detail.get("stage") == "boot":
                self.boot_failures[(tier, pos)] = died_before + 1
        if counts is not Evidence.CANNOT_RUN or not shared_failure(detail):
            # its artifacts are at hand: the other tier switches to it for free
            for other in (self.strategy, self.narrow):
                if other is not None:
                    other.mark_prepared(pos)
        if gate_refused(tier, detail) and not self.strategy.summary().total[pos]:
            self.strategy.mark_untestable(pos)
        if counts is Evidence.NOTHING:
            self._no_evidence(strategy, tier, pos)
            return
        self.inconclusive_streak[(tier, pos)] = 0
        if counts is Evidence.BUG:
            strategy.record(pos, True)
        elif counts is Evidence.NO_BUG:
            strategy.record(pos, False)
        elif counts is Evidence.CANNOT_RUN:
            # A candidate that never gave a conclusive lifetime is untestable (no artifact,
            # build or boot failure, incompatible ops). One that already did keeps its
            # evidence: a later crash says nothing about the bug either way.
            both = (self.strategy, self.narrow) if shared_failure(detail) else ()
            for each in (strategy, *both):
                if each is not None and not each.summary().total[pos]:
                    each.mark_untestable(pos)

    def _no_evidence(self, strategy: BayesianStrategy, tier: Tier, pos: int) -> None:
        streak = self.inconclusive_streak.get((tier, pos), 0) + 1
        self.inconclusive_streak[(tier, pos)] = streak
        if gives_up(streak):
            if strategy.summary().total[pos]:
                strategy.retire(pos)  # keep the conclusive lifetimes it gave
            else:
                strategy.mark_untestable(pos)

    def _time(self, seen: entries.Observed) -> None:
        """The run's own costs (``measured_costs``): what a lifetime took beyond its artifact,
        and what getting a candidate's artifact took the first time (later ones hit the
        cache, which ``mark_prepared`` already prices at nothing)."""
        raw = seen.detail.get("timing")
        timing: dict[str, Any] = raw if isinstance(raw, dict) else {}
        try:
            artifact = float(timing.get("artifacts_s") or 0.0)
        except (TypeError, ValueError):
            return
        if seen.duration_s <= 0:
            return
        times = self.times[seen.tier]
        times.lifetime_s.append(max(seen.duration_s - artifact, 0.0))
        if seen.position not in self._fetched:
            self._fetched.add(seen.position)
            times.artifact_s.append(artifact)

    def _enter(self, changed: entries.PhaseChanged) -> None:
        if changed.phase is Phase.CONFIRM:
            assert changed.bad_side is not None and changed.good_side is not None  # checked
            self.sides = Sides(changed.bad_side, changed.good_side)
            narrow = self.strategy_for(Tier.NARROW)
            self.prior = mixture_prior(
                narrow, self.settings.stand_in_prior, self.settings.end_doubt
            )
            self.strategy.set_prior(self.prior.in_range, self.prior.ends)
        self.phase = changed.phase
        self.phases.append(dict(changed.entry))

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
        self, commit: str, count: int = 1, tier: Tier = Tier.FAITHFUL,
        taken: Collection[str] = (),
    ) -> list[str]:
        """Stable ids ``<sha12>-<n>`` (``<sha12>-narrow-<n>`` for the fast probe's runs): a
        resumed run never reuses one already journaled, nor one in ``taken`` (those under way
        or already handed to the batch being made)."""
        ids: list[str] = []
        n = self.lifetimes_by_commit.get(lifetime_key(commit, tier), 0)
        infix = "-narrow" if tier is Tier.NARROW else ""
        while len(ids) < count:
            lid = f"{short(commit)}{infix}-{n}"
            n += 1
            if lid not in self.seen_lifetimes and lid not in taken:
                ids.append(lid)
        return ids

    def standing(self) -> Standing:
        """Where the search stands, with SHAs instead of positions: what `status`, the end
        entry and the report read."""
        s = self.strategy.summary()
        rates = self.strategy.rates()
        # a good end that showed the bug may not be a good end at all, and the commits before
        # the flip may show it at a lower rate (bisect_tool.strategy.ends): the stated
        # confidence is P(the flip AND both ends as given), the good side's check counted only
        # where the stop rules weigh it (the plain search)
        seen = doubts(s, good_side=self.phase is Phase.FAITHFUL)
        sha = [c.sha for c in self.candidates]
        flip_block = tuple(sha[f] for f in s.block)
        checks = checks_seen(s, seen)
        return Standing(
            state=self.end["state"] if self.end else str(EndState.RUNNING),
            direction=str(self.direction),
            flip_block=flip_block,
            confidence=seen.held(s.confidence),
            credible_set=tuple(sha[f] for f in s.credible_set),
            p_median=rates.p_median,
            p_interval=rates.p_interval,
            q_median=rates.q_median,
            q_interval=rates.q_interval,
            evaluations=s.evaluations,
            candidates_tested=s.candidates_tested,
            posterior=(0.0, *(float(x) for x in self.strategy.posterior())),
            good_end_doubt=s.good_end_doubt + (1 - s.good_end_doubt) * seen.not_good,
            bad_end_doubt=s.bad_end_doubt,
            tiers=self._tier_facts(),
            candidates=len(self.candidates),
            message=str((self.end or {}).get("message", "")),
            level=str(self.header.get("level") or "commit"),
            flip_provenance={c.sha: c.provenance() for c in self.candidates
                             if c.sha in flip_block and c.provenance()},
            checks={
                **{k: v for k, v in checks.items() if k not in ("good_side_diverged", "clean")},
                "good_side_diverged": [[sha[i], d, t] for i, d, t in checks["good_side_diverged"]],
                "clean": [[sha[i], n] for i, n in checks["clean"]],
            },
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


def replay(contents: JournalContents, priors: Priors | None = None) -> Ledger:
    """The ledger of ``contents``, every entry applied in order. ``priors``: a bench's what-if
    only (the search told p and q, bench/cost_bounds.py); a run always starts from the
    recipe's."""
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
            priors=(Priors(end_doubt=settings.end_doubt,
                           clean_against_rate=settings.clean_against_rate) if priors is None
                    # the what-if's p and q, the run's own floor
                    else dataclasses.replace(
                        priors, clean_against_rate=settings.clean_against_rate)),
        )

    state = Ledger(header, candidates, new_strategy(), settings, {}, set())
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
