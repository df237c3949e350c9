"""The tiered search (issue 16): a fast probe narrows, faithful lifetimes confirm the flip on both
sides of it, and the run falls back to the plain search when the fast probe is no stand-in.

Scripted evaluators stand in for the op probe and the server (the real ones run in
tests/test_tiered_demo.py); the journal, the phases and the loop are the real ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bisect_tool import session
from bisect_tool.designs import Finish, Record
from bisect_tool.journal import Journal, read
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.recipe import Recipe, SearchSettings
from bisect_tool.run import Evaluators, bisect_loop
from bisect_tool.strategy import BayesianStrategy
from bisect_tool.strategy.evidence import Evidence
from bisect_tool.strategy.information import expected_information
from bisect_tool.strategy.posterior import FlipPosterior
from bisect_tool.strategy.values import Priors
from bisect_tool.tiers import DISAGREE_AT, Phase, Tier, mixture_prior, stand_in_probability
from bisect_tool.values import Direction, Observation, Verdict


def _range(n: int, direction: Direction = Direction.FIX) -> CommitRange:
    shas = [f"{i:040x}" for i in range(1, n + 1)]
    old, new = shas[0], shas[-1]
    good, bad = (new, old) if direction is Direction.FIX else (old, new)
    return CommitRange("good", "bad", good, bad, direction,
                       tuple(Candidate(s, f"commit {i}") for i, s in enumerate(shas)))


def _header(rng: CommitRange, narrow: str = "op", **search: Any) -> dict[str, Any]:
    recipe = Recipe("t").to_dict()
    recipe["probe"]["narrow"] = narrow
    recipe["search"].update(search)
    return session.header_for(rng, recipe=recipe, mode="recipe")


class Scripted:
    """A probe whose bad side is the old side below ``flip`` (a fix), showing the bug with
    probability ``p`` per lifetime (seeded: the same run every time)."""

    def __init__(self, shas: Sequence[str], flip: int, p: float, seed: int = 0,
                 seconds: float = 1.0, detail: dict[str, Any] | None = None) -> None:
        self.shas, self.flip, self.p = list(shas), flip, p
        self.rng = np.random.default_rng(seed)
        self.seconds = seconds
        self.detail = detail or {}
        self.calls: list[str] = []
        #: fixed answers for some candidates (True: divergent), whatever ``flip`` says
        self.outcomes: dict[str, bool] = {}

    def prepare(self, commits: object) -> None:
        return None

    def cancel(self) -> int:
        return 0

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        self.calls.append(commit)
        bad = self.shas.index(commit) < self.flip
        divergent = self.outcomes.get(commit, bad and self.rng.random() < self.p)
        detail = {"timing": {"artifacts_s": 0.0}, **self.detail.get(commit, {})}
        return Observation(commit, Verdict.DIVERGENT if divergent else Verdict.CLEAN,
                           lifetime_id, detail, "", self.seconds)


def _run(tmp_path: Path, rng: CommitRange, narrow: Any, faithful: Any,
         parallel: int = 1, controls: Any = None, **search: Any) -> tuple[dict[str, Any], Path]:
    """The tiered bisect over ``rng``; with ``controls``, the recipe asks for them too."""
    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        header = _header(rng, **search)
        if controls is not None:
            header["recipe"]["probe"]["controls"] = True
            evaluators = Evaluators(faithful, parallel, controls, narrow=narrow)
        else:
            evaluators = Evaluators(faithful, parallel, narrow=narrow)
        journal.append(header)
        state = session.replay(read(path))
        summary = bisect_loop(journal, state, evaluators, controls=controls is not None)
    return summary, path


def test_narrow_then_confirm_names_the_flip_with_lifetimes_only_beside_it(tmp_path: Path) -> None:
    rng = _range(120)
    shas = [c.sha for c in rng.candidates]
    flip = 71
    narrow = Scripted(shas, flip, 1.0)
    faithful = Scripted(shas, flip, 0.5, seed=3)
    summary, path = _run(tmp_path, rng, narrow, faithful, confidence=0.99)
    assert summary["state"] == "done" and summary["flip_commit"] == shas[flip]
    assert summary["confidence"] >= 0.99
    contents = read(path)
    tiers = {o.get("tier", "faithful") for o in contents.observations}
    assert tiers == {"narrow", "faithful"}
    # the faithful lifetimes ran only on the two sides of the fast probe's flip
    assert set(faithful.calls) == {shas[flip - 1], shas[flip]}
    phases = contents.of_type("phase")
    assert [p["phase"] for p in phases] == ["confirm"]
    assert (phases[0]["bad_side"], phases[0]["good_side"]) == (flip - 1, flip)
    state = session.replay(contents)
    assert state.phase is Phase.CONFIRM
    assert state.stand_in_probability() is not None and state.stand_in_probability() > 0.95
    # the narrow runs are journaled with their own lifetime ids
    assert all("-narrow-" in o["lifetime_id"] for o in contents.observations
               if o.get("tier") == "narrow")


def test_a_fast_probe_that_flips_elsewhere_falls_back_and_still_finds_the_flip(
    tmp_path: Path,
) -> None:
    rng = _range(60)
    shas = [c.sha for c in rng.candidates]
    narrow = Scripted(shas, 20, 1.0)  # the stand-in flips at 20; the bug really at 41
    faithful = Scripted(shas, 41, 0.7, seed=5)
    summary, path = _run(tmp_path, rng, narrow, faithful, confidence=0.99)
    contents = read(path)
    phases = [p["phase"] for p in contents.of_type("phase")]
    assert phases == ["confirm", "faithful"]
    assert "not a stand-in" in contents.of_type("phase")[1]["message"]
    assert summary["state"] == "done" and summary["flip_commit"] == shas[41]
    # nothing observed was dropped: every narrow run is still in the journal and the replay
    narrow_runs = [o for o in contents.observations if o.get("tier") == "narrow"]
    assert len(narrow_runs) == len(narrow.calls)
    assert session.replay(contents).runs[Tier.NARROW] == len(narrow.calls)


class QuietBadEnd(Scripted):
    """Scripted, except that the bad end itself never happens to show the bug."""

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        obs = super().evaluate(commit, lifetime_id, tags)
        if commit == self.shas[0]:
            return Observation(commit, Verdict.CLEAN, lifetime_id, obs.detail, "", obs.duration_s)
        return obs


def test_after_a_fall_back_a_quiet_bad_end_does_not_end_the_run_as_nothing_to_bisect(
    tmp_path: Path,
) -> None:
    """The confirm step already saw the bug inside the range, so the bad end's silence is luck
    (p = 0.3 leaves a bad end quiet for 16 lifetimes 0.3 % of the time), not "nothing to bisect":
    the search is not made to wait for the bad end and still names the flip."""
    rng = _range(60)
    shas = [c.sha for c in rng.candidates]
    narrow = Scripted(shas, 20, 1.0)  # the stand-in flips at 20; the bug really at 41
    faithful = QuietBadEnd(shas, 41, 0.7, seed=5)
    summary, path = _run(tmp_path, rng, narrow, faithful, confidence=0.99)
    assert [p["phase"] for p in read(path).of_type("phase")] == ["confirm", "faithful"]
    assert summary["state"] == "done" and summary["flip_commit"] == shas[41]
    assert faithful.calls.count(shas[0]) < 4  # checked, not hammered


def test_a_fast_probe_that_never_shows_the_bug_hands_over_to_lifetimes(tmp_path: Path) -> None:
    rng = _range(30)
    shas = [c.sha for c in rng.candidates]
    narrow = Scripted(shas, 0, 1.0)  # nothing is bad for it
    faithful = Scripted(shas, 12, 1.0)
    summary, path = _run(tmp_path, rng, narrow, faithful)
    phase = read(path).of_type("phase")
    assert [p["phase"] for p in phase] == ["faithful"]
    assert "could not narrow" in phase[0]["message"] and "never showed the bug" in phase[0][
        "message"]
    # the op check is deterministic: one clean run at the bad end, and one at the good end
    # (ends given the wrong way round would show the bug there), say it cannot show this bug
    assert len(narrow.calls) == 2
    assert summary["state"] == "done" and summary["flip_commit"] == shas[12]


def test_a_side_the_gate_rejects_moves_the_confirmation_outward(tmp_path: Path) -> None:
    """The fast probe runs on every candidate; the gate's verdict rides along, and the confirm
    step uses the nearest candidate the pinned stack accepts (a block answer, as git gives)."""
    rng = _range(40)
    shas = [c.sha for c in rng.candidates]
    flip = 25
    rejected = {shas[flip - 1]: {"gate": "op _C::rms_norm changed"}}
    narrow = Scripted(shas, flip, 1.0, detail=rejected)
    faithful = Scripted(shas, flip, 1.0)
    summary, path = _run(tmp_path, rng, narrow, faithful)
    confirm = read(path).of_type("phase")[0]
    assert (confirm["bad_side"], confirm["good_side"]) == (flip - 2, flip)
    assert shas[flip - 1] not in faithful.calls
    assert summary["state"] == "done"
    assert summary["flip_block"] == [shas[flip - 1], shas[flip]]


def test_resume_in_the_confirm_step_carries_on_where_it_stopped(tmp_path: Path) -> None:
    rng = _range(50)
    shas = [c.sha for c in rng.candidates]
    narrow, faithful = Scripted(shas, 30, 1.0), Scripted(shas, 30, 0.5, seed=1)
    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        journal.append(_header(rng))
        state = session.replay(read(path))

        class Crash(Exception):
            pass

        def crash_after_two(*_a: Any, **_k: Any) -> Observation:
            if len(faithful.calls) >= 2:
                raise Crash
            return Scripted.evaluate(faithful, *_a, **_k)

        faithful.evaluate = crash_after_two  # type: ignore[method-assign]
        with pytest.raises(Crash):
            bisect_loop(journal, state, Evaluators(faithful, narrow=narrow))
    resumed = session.replay(read(path))
    assert resumed.phase is Phase.CONFIRM and resumed.runs[Tier.FAITHFUL] == 2
    faithful2 = Scripted(shas, 30, 0.5, seed=2)
    with Journal(path) as journal:
        summary = bisect_loop(journal, resumed, Evaluators(faithful2, narrow=narrow))
    assert summary["state"] == "done" and summary["flip_commit"] == shas[30]
    ids = [o["lifetime_id"] for o in read(path).observations]
    assert len(ids) == len(set(ids))


def test_the_run_prices_candidates_and_lifetimes_by_what_it_measured(tmp_path: Path) -> None:
    rng = _range(20)
    shas = [c.sha for c in rng.candidates]
    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        journal.append(_header(rng, cost_new_candidate=10.0, cost_lifetime=1.0))
        state = session.replay(read(path))
        assert state.measured_costs(Tier.FAITHFUL).new_candidate == 10.0  # the recipe's guess
        for n, (sha, total, artifact) in enumerate(
            [(shas[0], 64.0, 4.0), (shas[0], 61.0, 0.0), (shas[-1], 70.0, 8.0)]
        ):
            obs = Observation(sha, Verdict.CLEAN, f"l{n}", {"timing": {"artifacts_s": artifact}},
                              "", total)
            state.apply(journal.append(session.observation_entry(obs, shas.index(sha))))
    costs = state.measured_costs(Tier.FAITHFUL)
    assert costs.lifetime == pytest.approx((60 + 61 + 62) / 3)
    assert costs.new_candidate == pytest.approx((4 + 8) / 2)  # first fetch of each candidate
    assert state.measured_costs(Tier.NARROW).lifetime == 1.0  # nothing measured: the guess


def test_untestable_bad_end_is_stood_in_for_by_its_nearest_testable_neighbour() -> None:
    s = BayesianStrategy(6, Direction.FIX)
    s.mark_untestable(0)
    s.mark_untestable(1)
    assert s.summary().ends == (2, 5)
    choice = s.select()
    assert choice.position == 2 and "bad end" in choice.reason
    for i in range(2, 5):
        s.mark_untestable(i)
    assert s.summary().ends == (None, 5)


def _posterior(
    direction: Direction, weights: np.ndarray, ends: tuple[float, float],
    more: tuple[int, int, int] = (0, 0, 0),
) -> FlipPosterior:
    """The flip's posterior over 13 positions after a few lifetimes, and ``more`` = (position,
    lifetimes, divergent) on top, with the prior ``weights`` and ``ends``."""
    evidence = Evidence(len(weights) + 1, direction)
    for pos, bug in [(0, 1), (0, 1), (12, 0), (5, 1), (7, 0)]:
        evidence.record(pos, bool(bug) if direction is Direction.FIX else not bool(bug))
    at, m, k = more
    evidence.total[at] += m
    evidence.divergent[at] += k
    post = FlipPosterior(evidence, Priors())
    post.set_prior(weights, ends)
    return post


def _entropy(t: FlipPosterior) -> float:
    post = np.concatenate([t.flips(), t.end_doubts()])
    post = post[post > 0]
    return float(-(post * np.log2(post)).sum())


def test_the_lookahead_with_a_mixture_prior_equals_brute_force() -> None:
    """The runs of equal likelihood carry the prior's weights exactly (issue 16's confirm
    step starts from a non-uniform prior)."""
    rng = np.random.default_rng(1)
    for direction in Direction:
        n = 12
        weights, ends = rng.random(n) ** 3, (0.03, 0.02)
        s = _posterior(direction, weights, ends)
        log_z = s.base().log_z
        for pos in range(n + 1):
            for m in (1, 3):
                expected_h = 0.0
                for k in range(m + 1):
                    t = _posterior(direction, weights, ends, (pos, m, k))
                    prob = math.exp(t.base().log_z - log_z) * math.comb(m, k)
                    expected_h += prob * _entropy(t)
                brute = max(_entropy(s) - expected_h, 0.0)
                assert expected_information(s, pos, m) == pytest.approx(brute, abs=1e-9)


def test_mixture_prior_and_the_stand_in_posterior() -> None:
    n = 40
    narrow = BayesianStrategy(n + 1, Direction.FIX)
    for pos, bug in [(0, 1), (0, 1), (0, 1), (n, 0), (20, 1), (21, 0)] * 2:
        narrow.record(pos, bool(bug))
    prior = mixture_prior(narrow, 0.5, 0.05)
    total = prior.in_range.sum() + sum(prior.ends)
    assert total == pytest.approx(1.0)
    assert prior.in_range[20] > 0.45  # flip 21 (index 20): half the mass rides on the stand-in
    faithful = BayesianStrategy(n + 1, Direction.FIX)
    faithful.set_prior(prior.in_range, prior.ends)
    assert stand_in_probability(faithful.summary(), prior) == pytest.approx(0.5, abs=1e-9)
    for _ in range(3):
        faithful.record(20, True)
    for _ in range(8):
        faithful.record(21, False)
    assert stand_in_probability(faithful.summary(), prior) > 0.9
    assert faithful.summary().block == (21,)
    # lifetimes that put the bad side clean say the stand-in is wrong there
    other = BayesianStrategy(n + 1, Direction.FIX)
    other.set_prior(prior.in_range, prior.ends)
    for _ in range(40):
        other.record(20, False)
    assert 1 - other.summary().bad_side[20] >= DISAGREE_AT
    assert stand_in_probability(other.summary(), prior) < 0.05


def test_one_server_that_dies_before_health_is_retried_not_a_verdict() -> None:
    """A boot failure may be the machine's (two servers profiling one GPU); the candidate is
    untestable only after a second one in a row."""
    rng = _range(10)
    state = session.replay(read_header(rng))
    sha = rng.candidates[5].sha

    def boot_failed(n: int) -> dict[str, Any]:
        obs = Observation(sha, Verdict.UNTESTABLE, f"b{n}", {"stage": "boot"}, "died")
        return session.observation_entry(obs, 5)

    state.apply(boot_failed(0))
    assert 5 not in state.strategy.summary().untestable
    state.apply(boot_failed(1))
    assert 5 in state.strategy.summary().untestable


def read_header(rng: CommitRange) -> Any:
    from bisect_tool.journal import JournalContents

    return JournalContents(_header(rng, narrow=""), ())


def test_the_deterministic_fast_probe_runs_each_candidate_once_and_splits_in_three(
    tmp_path: Path,
) -> None:
    """The op check gives the same rows in every run: with two slots it runs the two ends, then
    two candidates at a time that cut the range in three, never one candidate twice."""
    rng = _range(120)
    shas = [c.sha for c in rng.candidates]
    flip = 71
    narrow = Scripted(shas, flip, 1.0)
    faithful = Scripted(shas, flip, 0.5, seed=3)
    summary, path = _run(tmp_path, rng, narrow, faithful, parallel=2, confidence=0.99)
    assert summary["state"] == "done" and summary["flip_commit"] == shas[flip]
    assert len(narrow.calls) == len(set(narrow.calls))
    # 2 ends + 2 a round over a range that shrinks 3-fold a round (120 -> 1 in 5 rounds);
    # neighbours of one split (the old batch) took 2 a round over a 2-fold shrink: 16
    assert len(narrow.calls) <= 12
    first_split = {shas.index(c) for c in narrow.calls[2:4]}
    assert all(30 <= i <= 90 for i in first_split) and max(first_split) - min(first_split) > 20


def test_with_eight_slots_the_op_check_runs_what_splits_the_range_not_every_candidate(
    tmp_path: Path,
) -> None:
    """Issue 39: with 8 slots the op check ran 12 times over 12 candidates on the H100. A round
    runs both ends and splits that cut the range in k + 1, and the next round only what is
    left inside the bracket: 9 runs in 2 rounds here, not 12."""
    rng = _range(12)
    shas = [c.sha for c in rng.candidates]
    for flip in (3, 4):
        narrow = Scripted(shas, flip, 1.0)
        faithful = Scripted(shas, flip, 0.9, seed=flip)
        summary, _ = _run(tmp_path / str(flip), rng, narrow, faithful, parallel=8,
                          confidence=0.99)
        assert summary["state"] == "done" and summary["flip_commit"] == shas[flip]
        assert len(narrow.calls) == len(set(narrow.calls)) <= 9, narrow.calls
        # the second round runs only inside the bracket the first one left
        assert {shas.index(c) for c in narrow.calls[8:]} <= {flip - 1, flip}


def test_a_bracketed_flip_short_of_the_threshold_runs_a_neighbour_not_the_lifetimes() -> None:
    """The demo at 80 commits: the op check bracketed the fix between two adjacent candidates,
    but the model's false-alarm rate leaves ~1e-3 on the flip lying further back, short of
    0.9995. A deterministic probe may not rerun the bracket, so the next run is the nearest
    candidate not yet run, not a fall-back to lifetimes over the whole range."""
    narrow = session.narrow_strategy(32, Direction.FIX, SearchSettings(confidence=0.999))
    for position, divergent in [(31, False), (0, True), (11, True), (18, False), (25, False),
                                (12, False), (13, False), (14, False), (16, False)]:
        narrow.record(position, divergent)
    narrow.mark_untestable(21)
    assert narrow.summary().block == (12,) and not narrow.summary().done
    batch = narrow.select_batch(2)
    assert 10 in {c.position for c in batch}
    assert not {c.position for c in batch} & {0, 11, 12, 13, 14, 16, 18, 21, 25, 31}
    narrow.record(10, True)
    assert narrow.summary().block == (12,) and narrow.summary().done


@pytest.mark.slow
def test_the_fast_probe_hands_every_flip_of_a_short_range_to_the_confirm_step(
    tmp_path: Path,
) -> None:
    """Wherever the flip lies, a deterministic fast probe narrows to it and the confirm step
    runs lifetimes only beside it (no fall-back for want of a candidate to run)."""
    rng = _range(32)
    shas = [c.sha for c in rng.candidates]
    for flip in range(1, 32):
        narrow = Scripted(shas, flip, 1.0)
        faithful = Scripted(shas, flip, 0.5, seed=flip)
        summary, path = _run(tmp_path / str(flip), rng, narrow, faithful, parallel=2,
                             confidence=0.999)
        assert summary["state"] == "done" and summary["flip_commit"] == shas[flip], flip
        phases = [p["phase"] for p in read(path).of_type("phase")]
        assert phases == ["confirm"], (flip, phases)
        assert set(faithful.calls) <= {shas[flip - 1], shas[flip]}, flip


@pytest.mark.slow
def test_a_flaky_fast_probe_costs_lifetimes_not_the_answer(tmp_path: Path) -> None:
    """An op check that only shows the bug 60 % of the time brackets a wrong flip; the
    confirm step's lifetimes catch it and the answer is still the bug's flip."""
    rng = _range(60)
    shas = [c.sha for c in rng.candidates]
    paths = set()
    for seed in range(30, 40):  # seeded: the same runs every time
        narrow = Scripted(shas, 41, 0.6, seed=seed)
        faithful = Scripted(shas, 41, 0.7, seed=10 + seed)
        summary, path = _run(tmp_path / str(seed), rng, narrow, faithful, parallel=2,
                             confidence=0.99)
        assert summary["state"] == "done" and summary["flip_commit"] == shas[41], seed
        paths.add(tuple(p["phase"] for p in read(path).of_type("phase")))
        # a self-contradiction hands over when it shows, not after running every candidate
        assert len(narrow.calls) <= 12, (seed, len(narrow.calls))
    # a quiet bad end or a contradiction hands over at once; a right bracket is confirmed; a
    # wrong one is confirmed against and left
    assert paths == {("faithful",), ("confirm",), ("confirm", "faithful")}


def test_a_fast_probe_that_contradicts_itself_hands_over_in_one_line(tmp_path: Path) -> None:
    """The op check shows no bug at a candidate before the fix (9) and the bug at 11, farther
    from the bad end, in one round of two splits: no single flip explains that, so the run
    says so and goes on with lifetimes at once."""
    rng = _range(20)
    shas = [c.sha for c in rng.candidates]
    narrow = Scripted(shas, 12, 1.0)
    narrow.outcomes = {shas[9]: False}
    faithful = Scripted(shas, 12, 0.7, seed=3)
    summary, path = _run(tmp_path, rng, narrow, faithful, parallel=2, confidence=0.99)
    assert {shas[9], shas[11]} <= set(narrow.calls)
    phases = read(path).of_type("phase")
    assert [p["phase"] for p in phases] == ["faithful"]
    assert "contradicted itself" in phases[0]["message"]
    assert summary["state"] == "done" and summary["flip_commit"] == shas[12]


class _Controls:
    """Controls that hold until a fast-probe run meets them at ``together`` (so they pass only
    when they run beside the narrowing), and record which commits they ran on."""

    def __init__(self, together: Any, ran: list[str]) -> None:
        self.together, self.ran = together, ran

    def __call__(self, commit: str) -> _Controls:
        self.commit = commit
        return self

    def run(self) -> dict[str, Any]:
        self.ran.append(self.commit)
        if self.together is not None:
            self.together.wait()
        return {"type": "controls", "commit": self.commit, "ok": True, "problem": "",
                "positive": {"verdict": "divergent"}, "negative": {"verdict": "clean"}}


def test_the_controls_run_beside_the_fast_probe_once_it_has_checked_both_ends(
    tmp_path: Path,
) -> None:
    """Issue 31: the controls boot a server (a minute of vLLM) while the op check narrows in
    seconds a run, instead of before the first confirm lifetime. They meet a fast-probe run at
    a barrier, so the run finishes only if they ran side by side; the controls are journaled
    among the narrow runs, before the confirm step, on the good end."""
    import threading

    rng = _range(60)
    shas = [c.sha for c in rng.candidates]
    flip = 37
    together = threading.Barrier(2, timeout=30)
    met: list[str] = []

    class Narrow(Scripted):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            if len(self.calls) >= 2 and not met:  # a run after both ends were checked
                together.wait()
                met.append(commit)
            return super().evaluate(commit, lifetime_id, tags)

    ran: list[str] = []
    narrow = Narrow(shas, flip, 1.0)
    faithful = Scripted(shas, flip, 0.8, seed=2)
    summary, path = _run(tmp_path, rng, narrow, faithful, 1, _Controls(together, ran))
    assert met and summary["state"] == "done" and summary["flip_commit"] == shas[flip]
    assert ran == [rng.good]
    kinds = [e["type"] for e in read(path).entries]
    assert kinds.index("controls") < kinds.index("phase")


def test_ends_the_wrong_way_round_stop_before_the_controls_boot(tmp_path: Path) -> None:
    """The fast probe shows the bug at the good end and not at the bad one: the run stops in
    seconds, and no controls server was started for nothing."""
    rng = _range(30)
    shas = [c.sha for c in rng.candidates]
    narrow = Scripted(shas, 0, 1.0)
    narrow.outcomes = {rng.good: True, rng.bad: False}
    ran: list[str] = []
    path = tmp_path / "journal.jsonl"
    with Journal(path) as journal:
        journal.append(_header(rng))
        state = session.replay(read(path))
        summary = bisect_loop(journal, state, Evaluators(
            Scripted(shas, 0, 1.0), 1, _Controls(None, ran), narrow=narrow), controls=True)
    assert summary["state"] == "ends_contradict"
    assert ran == [] and len(narrow.calls) == 2


def test_the_controls_are_journaled_as_they_end_beside_a_running_lifetime(
    tmp_path: Path,
) -> None:
    """Two slots, the controls in the background: they end while a confirm lifetime still
    runs, and their entry is in the journal then, not once that lifetime has ended too (on
    the H100 it came 36 s after their server was down: docs/bench/gpu-2026-12-07-h100)."""
    import threading
    import time

    rng = _range(30)
    shas = [c.sha for c in rng.candidates]
    flip = 17
    path = tmp_path / "journal.jsonl"
    confirm_started = threading.Event()
    seen_while_running: list[bool] = []

    def controls_in() -> bool:
        return '"type": "controls"' in path.read_text()

    class Faithful(Scripted):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            # every lifetime under way when the controls end holds on until their entry is in
            if not controls_in():
                confirm_started.set()
                deadline = time.monotonic() + 10
                while not controls_in() and time.monotonic() < deadline:
                    time.sleep(0.02)
                seen_while_running.append(controls_in())
            return super().evaluate(commit, lifetime_id, tags)

    class Controls(_Controls):
        def run(self) -> dict[str, Any]:
            assert confirm_started.wait(20)  # they end while the first confirm lifetime runs
            return super().run()

    summary, _ = _run(tmp_path, rng, Scripted(shas, flip, 1.0), Faithful(shas, flip, 0.9, seed=4),
                      2, Controls(None, []))
    assert summary["state"] == "done" and summary["flip_commit"] == shas[flip]
    assert seen_while_running and all(seen_while_running), seen_while_running


def _confirming(n: int, flip: int, faithful: Sequence[tuple[int, bool]]) -> session.State:
    """A tiered run's state in its confirm step: the op check ran every candidate (the bug
    below ``flip``), the sides are ``flip - 1`` and ``flip``, then ``faithful`` lifetimes
    (position, divergent) came back."""
    from bisect_tool.journal import JournalContents

    rng = _range(n)
    shas = [c.sha for c in rng.candidates]

    def seen(pos: int, lid: str, divergent: bool, **more: Any) -> dict[str, Any]:
        return {"type": "observation", "lifetime_id": lid, "commit": shas[pos], "position": pos,
                "verdict": "divergent" if divergent else "clean", "detail": {}, "message": "",
                "duration_s": 50.0, **more}

    entries = [seen(i, f"op-{i}", i < flip, tier="narrow") for i in range(n)]
    entries.append({"type": "phase", "phase": "confirm", "message": "",
                    "bad_side": flip - 1, "good_side": flip})
    entries += [seen(pos, f"lifetime-{k}", d) for k, (pos, d) in enumerate(faithful)]
    return session.replay(JournalContents(_header(rng), tuple(entries)))


def test_the_confirm_step_starts_what_the_answer_is_expected_to_need_on_both_sides() -> None:
    """Issue 39, item 1: the confirm step fills the slots with the lifetimes the answer is
    expected to need, both sides at once. Eight slots at its start: several a side (the bad
    side's rate needs more than one lifetime; one bad-side lifetime beside seven good-side ones
    left the bad side to a later round); once two a side are in, the two more it expects, not
    eight."""
    from bisect_tool.designs.bisect import BisectDesign

    def started(state: session.State) -> dict[int, int]:
        step = BisectDesign(state, slots=8).next_step()
        assert not isinstance(step, (Finish, Record)), step
        counts: dict[int, int] = {}
        for item in step.items:
            counts[item.key[0]] = counts.get(item.key[0], 0) + 1
        return counts

    first = started(_confirming(10, 5, []))
    assert first[4] >= 2 and first[5] >= 2 and sum(first.values()) <= 8, first
    later = started(_confirming(10, 5, [(4, True), (4, True), (5, False), (5, False)]))
    assert later == {4: 1, 5: 1}, later


def test_a_slot_that_comes_back_in_the_confirm_step_takes_the_side_not_under_way() -> None:
    """Two slots, a bad-side lifetime under way: the slot that came back starts the good side's
    next lifetime, and none once those under way are expected to end the search."""
    from bisect_tool.designs import Item
    from bisect_tool.designs.bisect import BisectDesign

    state = _confirming(10, 5, [(4, True), (5, False)])
    design = BisectDesign(state, slots=2)
    bad = state.candidates[4].sha
    running = Item(str(Tier.FAITHFUL), bad, "running-0", (), (4, Tier.FAITHFUL))
    work = design.refill([running], 1)
    assert work is not None and [i.key[0] for i in work.items] == [5]
    assert all(i.lifetime_id != "running-0" for i in work.items)
    done_soon = _confirming(10, 5, [(4, True), (4, True), (4, True), *[(5, False)] * 4])
    running = Item(str(Tier.FAITHFUL), bad, "running-1", (), (4, Tier.FAITHFUL))
    assert BisectDesign(done_soon, slots=2).refill([running], 1) is None


class Gated(Scripted):
    """A faithful probe that can ask the compatibility gate alone (``interfaces.Gates``): it
    refuses ``refused`` (the pinned stack lacks an op of theirs), each check taking
    ``gate_s``; it records how many checks ran at once and whether any lifetime booted while
    one still ran."""

    def __init__(self, *args: Any, refused: Sequence[str] = (), gate_s: float = 0.2,
                 **kwargs: Any) -> None:
        import threading

        super().__init__(*args, **kwargs)
        self.refused, self.gate_s = set(refused), gate_s
        self.lock = threading.Lock()
        self.gating = self.peak = 0
        self.gated: list[str] = []
        self.booted_while_gating = False

    def gate_check(self, commit: str, tags: Sequence[str] = ()) -> Observation:
        import time

        with self.lock:
            self.gating += 1
            self.peak = max(self.peak, self.gating)
        time.sleep(self.gate_s)
        with self.lock:
            self.gating -= 1
            self.gated.append(commit)
        if commit in self.refused:
            return Observation(commit, Verdict.UNTESTABLE, f"gate-{commit}", {"stage": "gate"},
                               "candidate lacks op `_C::rms_norm`", self.gate_s)
        return Observation(commit, Verdict.CLEAN, f"gate-{commit}", {"stage": "gate"}, "",
                           self.gate_s)

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        with self.lock:
            self.booted_while_gating |= self.gating > 0
        assert commit not in self.refused, "a release the gate refused booted a lifetime"
        return super().evaluate(commit, lifetime_id, tags)


def _release_run(tmp_path: Path, rng: CommitRange, narrow: Any, faithful: Any, parallel: int,
                 controls: Any, notes: list[str] | None = None) -> tuple[dict[str, Any], Path]:
    """A release-level run (``level`` release) with the controls on a slot of their own; the
    notes it tells its observer go to ``notes``."""
    from bisect_tool.events import Note

    def observe(event: object) -> None:
        if notes is not None and isinstance(event, Note):
            notes.append(event.text)

    path = tmp_path / "journal.jsonl"
    recipe = Recipe("t").to_dict()
    recipe["probe"]["narrow"] = "op" if narrow is not None else ""
    recipe["probe"]["controls"] = True
    with Journal(path) as journal:
        journal.append(session.header_for(rng, recipe=recipe, mode="recipe", level="release"))
        state = session.replay(read(path))
        evaluators = Evaluators(faithful, parallel, controls, narrow=narrow,
                                controls_beside=True)
        summary = bisect_loop(journal, state, evaluators, controls=True, observer=observe)
    return summary, path


def test_every_release_is_gated_at_once_before_any_server_boots(tmp_path: Path) -> None:
    """Issue 39, item 3: with --no-narrow the controls looked for a testable release one at a
    time (the gate refused three in a row; the controls ended at 361 s of a 406 s run). Now
    every release is gated at once before the first boot, the refused ones journaled as
    untestable with the gate's reason, and the controls boot at once on the nearest testable
    release."""
    rng = _range(12)
    shas = [c.sha for c in rng.candidates]
    refused = shas[9:]  # a fix: the good end is the newest; the three newest are refused
    faithful = Gated(shas, 5, 1.0, refused=refused)
    ran: list[str] = []
    notes: list[str] = []
    summary, path = _release_run(tmp_path, rng, None, faithful, 2, _Controls(None, ran), notes)
    assert summary["state"] == "done" and summary["flip_commit"] == shas[5]
    assert "gating 12 releases at once before any server boots" in notes
    assert sum(n.startswith("the gate refused") and "rms_norm" in n for n in notes) == 3
    assert sorted(faithful.gated) == sorted(shas) and faithful.peak >= 4
    assert not faithful.booted_while_gating
    assert ran == [shas[8]]  # the controls, once, on the nearest testable release
    contents = read(path)
    untestable = contents.of_type("untestable")
    assert {e["commit"] for e in untestable} == set(refused)
    assert all(e["stage"] == "gate" and "rms_norm" in e["message"] for e in untestable)
    assert {e["commit"] for e in contents.of_type("gate")} == set(shas) - set(refused)


def test_the_op_check_narrows_beside_the_gates_sweep(tmp_path: Path) -> None:
    """A tiered release-level run: the op check's runs (they boot no server) go on while the
    sweep gates every release; the controls and the confirm lifetimes wait for it, and the
    confirm step's good side skips the refused release."""
    import threading

    rng = _range(10)
    shas = [c.sha for c in rng.candidates]
    flip = 6
    sweeping = threading.Event()

    class Narrow(Scripted):
        def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
            if faithful.gating:
                sweeping.set()
            return super().evaluate(commit, lifetime_id, tags)

    faithful = Gated(shas, flip, 0.9, seed=2, refused=[shas[flip]], gate_s=0.5)
    ran: list[str] = []
    summary, path = _release_run(tmp_path, rng, Narrow(shas, flip, 1.0), faithful, 2,
                                 _Controls(None, ran))
    assert sweeping.is_set() and not faithful.booted_while_gating
    # the refused release and the next one form the block the answer names
    assert summary["state"] == "done" and summary["flip_block"] == [shas[flip], shas[flip + 1]]
    assert shas[flip] not in faithful.calls and ran == [shas[-1]]
    phase = read(path).of_type("phase")[0]
    assert (phase["bad_side"], phase["good_side"]) == (flip - 1, flip + 1)
