"""The search core with plain values: posterior laws, selection rules, stopping, calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_tool.designs.simulate import Outcome, run_design, search_header
from bisect_tool.strategy import BayesianStrategy, Costs, NoCandidateLeft
from bisect_tool.strategy.evidence import Evidence
from bisect_tool.strategy.information import Plan, expected_information, plan_values
from bisect_tool.strategy.posterior import FlipPosterior
from bisect_tool.strategy.selection import BAD_END_LIFETIMES
from bisect_tool.strategy.simhistories import Lifetimes, step
from bisect_tool.strategy.values import Priors
from bisect_tool.values import Direction

evidence = st.lists(st.tuples(st.integers(0, 12), st.booleans()), max_size=30)


def _fed(size: int, direction: Direction, events: list[tuple[int, bool]]) -> BayesianStrategy:
    s = BayesianStrategy(size, direction)
    for pos, divergent in events:
        s.record(min(pos, size - 1), divergent)
    return s


@settings(max_examples=60, deadline=None)
@given(evidence, st.sampled_from(list(Direction)))
def test_posterior_is_a_distribution(events: list[tuple[int, bool]], direction: Direction) -> None:
    strategy = _fed(13, direction, events)
    post = strategy.posterior()
    assert post.shape == (12,)
    assert (post >= 0).all()
    # with the two end hypotheses ("the flip lies beyond the good end", "the bad end does not
    # show the bug"), the in-range flips and the ends' doubts make one distribution
    summary = strategy.summary()
    beyond, not_bad = summary.good_end_doubt, summary.bad_end_doubt
    assert beyond >= 0 and not_bad >= 0
    assert math.isclose(float(post.sum()) + beyond + not_bad, 1.0, rel_tol=1e-9)


@settings(max_examples=60, deadline=None)
@given(evidence)
def test_directions_mirror_each_other(events: list[tuple[int, bool]]) -> None:
    """A fix search on a history is a regression search on the reversed history."""
    fix = _fed(13, Direction.FIX, events)
    reg = _fed(13, Direction.REGRESSION, [(12 - min(p, 12), d) for p, d in events])
    np.testing.assert_allclose(fix.posterior(), reg.posterior()[::-1], rtol=1e-9, atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 11), st.integers(1, 5), st.integers(0, 3), st.sampled_from(list(Direction)))
def test_a_divergence_moves_mass_to_hypotheses_that_call_it_bad(
    i: int, bad_runs: int, good_runs: int, direction: Direction
) -> None:
    """With the ends labelled (bad end diverged, good end clean), a divergence at i raises the
    mass of the hypotheses that put i on the bad side, and a clean lifetime lowers it."""
    s = BayesianStrategy(13, direction)
    ends = s.summary()
    for _ in range(bad_runs):
        s.record(ends.bad_end, True)
    for _ in range(good_runs):
        s.record(ends.good_end, False)
    before = s.summary().bad_side[i]
    s.record(i, True)
    assert s.summary().bad_side[i] > before
    s2 = BayesianStrategy(13, direction)
    for _ in range(bad_runs):
        s2.record(ends.bad_end, True)
    for _ in range(good_runs):
        s2.record(ends.good_end, False)
    s2.record(i, False)
    assert s2.summary().bad_side[i] < before


@settings(max_examples=25, deadline=None)
@given(st.sets(st.integers(1, 15), max_size=10), st.sampled_from(list(Direction)), evidence)
def test_select_never_returns_an_untestable_position(
    untestable: set[int], direction: Direction, events: list[tuple[int, bool]]
) -> None:
    s = BayesianStrategy(17, direction)
    ends = s.summary()
    for u in untestable:
        s.mark_untestable(u)
    s.record(ends.bad_end, True)
    s.record(ends.good_end, False)
    for pos, divergent in events:
        if pos not in untestable:
            s.record(pos, divergent)
    for _ in range(3):
        try:
            choice = s.select()
        except NoCandidateLeft:
            return
        assert choice.position not in untestable
        assert 0 <= choice.position <= 16
        s.record(choice.position, choice.position != ends.good_end and direction is Direction.FIX)


def test_blocks_merge_across_untestable_commits() -> None:
    """Commits 4 and 5 cannot be built: flips at 4, 5 and 6 are one answer, as git reports."""
    s = BayesianStrategy(11, Direction.REGRESSION)  # positions 0..10, flips 1..10
    s.mark_untestable(4)
    s.mark_untestable(5)
    for _ in range(6):
        s.record(3, False)
        s.record(6, True)
        s.record(0, False)
        s.record(10, True)
    summary = s.summary()
    assert summary.block == (4, 5, 6)
    assert summary.confidence > 0.99


def test_only_untestables_separate_the_hypotheses_so_only_the_ends_are_run() -> None:
    """Nothing inside can narrow the block (1, 2, 3); what is left to learn is whether the ends
    behave as claimed: the search runs only the ends until that holds, then the block is the
    answer (as git bisect reports "the first bad commit could be any of")."""
    s = BayesianStrategy(4, Direction.REGRESSION)
    s.mark_untestable(1)
    s.mark_untestable(2)
    s.record(0, False)
    for _ in range(BAD_END_LIFETIMES):
        s.record(3, True)
    assert s.summary().block == (1, 2, 3)
    for _ in range(20):
        if s.summary().done:
            break
        choice = s.select()
        assert choice.position in (0, 3)
        s.record(choice.position, choice.position == 3)
    assert s.summary().done and s.summary().block == (1, 2, 3)


def test_no_candidate_left_when_nothing_is_testable() -> None:
    s = BayesianStrategy(4, Direction.REGRESSION)
    s.record(0, False)
    for _ in range(BAD_END_LIFETIMES):
        s.record(3, True)
    for position in range(4):
        s.mark_untestable(position)
    with pytest.raises(NoCandidateLeft):
        s.select()


def test_bad_end_that_never_diverges_keeps_the_search_at_the_bad_end() -> None:
    """No bisecting noise: until the bad end shows the bug, only the bad end is run (the loop
    stops the search when its lifetime allowance for the ends runs out)."""
    s = BayesianStrategy(100, Direction.FIX)
    for _ in range(10):
        choice = s.select()
        assert choice.position == s.summary().bad_end == 0
        s.record(choice.position, False)
    assert "bad end" in s.select().reason


def test_deterministic_bug_costs_about_what_classic_bisection_costs() -> None:
    """p = 1, q = 0: the right flip, at no more than 1.2x the cost of git bisect run (which
    also checks each end once: cost = 10 per new candidate + 1 per lifetime), plus the clean
    lifetimes the good end and the commit next to the flip must show before an answer (8 and 9,
    issue 38: a good end that fails in half its lifetimes is not accepted after one)."""
    n = 256
    classic = (2 + math.ceil(math.log2(n))) * 11
    costs = []
    for flip in (1, 17, 128, 200, 256):
        h = Lifetimes(step(n, flip, 1.0, 0.0), np.random.default_rng(flip))
        run = run_design(search_header(h.history), h)
        assert run.outcome is Outcome.RIGHT and run.block == (flip,)
        assert run.confidence >= 0.99
        costs.append(h.cost(Costs()))
    assert np.mean(costs) <= 1.2 * classic + 8 + 9, costs


@pytest.mark.slow
def test_reported_confidence_matches_observed_accuracy() -> None:
    """Calibration: over many simulated searches at N = 32, the share of right answers is at
    least the confidence reported at the stop, less a tolerance for the sample size."""
    rng = np.random.default_rng(2024)
    right, reported = [], []
    for p in (0.3, 0.5, 0.8, 1.0):
        for _ in range(40):
            flip = int(rng.integers(1, 33))
            h = Lifetimes(step(32, flip, p, 0.01), np.random.default_rng(int(rng.integers(2**32))))
            run = run_design(search_header(h.history, budget=2000), h)
            if run.outcome is Outcome.NO_ANSWER:
                continue  # no confidence stated: nothing to calibrate
            right.append(run.outcome is Outcome.RIGHT)
            reported.append(run.confidence)
    accuracy, mean_reported = float(np.mean(right)), float(np.mean(reported))
    assert mean_reported >= 0.99
    # 160 runs: one standard error at 0.99 is 0.008; allow three
    assert accuracy >= mean_reported - 0.025, (accuracy, mean_reported)


def test_summary_reports_rates_and_counts() -> None:
    s = BayesianStrategy(9, Direction.REGRESSION)
    for _ in range(8):
        s.record(8, True)
        s.record(0, False)
    for pos, div in [(4, True), (4, True), (2, False), (2, False), (3, True), (3, True)]:
        s.record(pos, div)
    summary, rates = s.summary(), s.rates()
    assert summary.evaluations == 22
    assert summary.candidates_tested == 5
    assert rates.p_median > 0.7
    assert rates.q_median < 0.1
    assert rates.p_interval[0] <= rates.p_median <= rates.p_interval[1]
    assert set(summary.credible_set) >= {summary.block[0]}


def test_select_prefers_another_lifetime_when_candidates_are_expensive() -> None:
    """Patch leaving: the same evidence, a costly switch keeps the search where it is."""

    def choose(cost_new: float) -> int:
        s = BayesianStrategy(65, Direction.FIX, costs=Costs(cost_new, 1.0))
        for _ in range(3):
            s.record(0, True)
        s.record(64, False)
        s.record(32, False)  # one clean lifetime at the midpoint: ambiguous at unknown p
        return s.select().position

    assert choose(1000.0) in (0, 32, 64)
    assert choose(0.0) not in (0, 64)


def test_select_batch_fills_every_slot_without_untestables() -> None:
    s = BayesianStrategy(65, Direction.FIX)
    for _ in range(3):
        s.record(0, True)
    s.record(64, False)
    s.mark_untestable(32)
    batch = s.select_batch(4)
    assert sum(c.lifetimes for c in batch) == 4
    positions = [c.position for c in batch]
    assert len(positions) == len(set(positions))  # one entry per position
    assert 32 not in positions
    assert batch[0] == s.select() or batch[0].position == s.select().position


def test_a_plan_that_stops_at_the_first_divergence_lists_every_way_it_can_end() -> None:
    assert Plan(3).outcomes() == [(1, 1), (1, 2), (1, 3), (0, 3)]
    assert Plan(2, until_divergent=False).outcomes() == [(0, 2), (1, 2), (2, 2)]


def test_a_likely_bad_candidate_is_expected_to_cost_fewer_lifetimes_than_planned() -> None:
    """Stopping at the first divergence: a candidate on the bad side is usually settled after a
    lifetime or two, so its expected lifetimes are fewer than the plan's cap; a fixed batch
    always costs all of them. The two plans' outcome probabilities each sum to one."""
    evidence = Evidence(65, Direction.FIX)
    post = FlipPosterior(evidence, Priors())
    for _ in range(3):
        evidence.record(0, True)
    evidence.record(64, False)
    for _ in range(6):
        evidence.record(40, False)  # 40 looks good: the flip is probably below it
    likely_bad, likely_good = 8, 39
    plans = (Plan(8), Plan(8, until_divergent=False))
    gains, lifetimes = plan_values(post, [likely_bad, likely_good], [plans, plans])
    assert lifetimes[0][1] == pytest.approx(8.0)
    assert lifetimes[1][1] == pytest.approx(8.0)
    assert lifetimes[0][0] < 4.0  # p is high here: the first divergence comes early
    assert lifetimes[0][0] < lifetimes[1][0] <= 8.0
    # stopping early gives up little information: one divergence already says "bad side"
    assert gains[0][0] == pytest.approx(gains[0][1], rel=0.35)
    assert expected_information(post, likely_bad, 8) == pytest.approx(float(gains[0][1]))


def test_one_log_beta_helper_serves_the_search_the_ends_the_matrix_and_the_report() -> None:
    """Issue 41: log B(a, b) was written out four times (ends, matrix, report, posterior)."""
    import ast
    from pathlib import Path

    from bisect_tool.strategy import log_beta, log_sequence

    assert log_beta(1.0, 1.0) == 0.0
    assert log_beta(2.0, 1.0) == pytest.approx(math.log(0.5))
    # k clean lifetimes under a uniform rate: 1 / (k + 1); under Beta(2, 1): 2 / ((k+1)(k+2))
    assert math.exp(log_sequence(0, 4, 1.0, 1.0)) == pytest.approx(1 / 5)
    assert math.exp(log_sequence(0, 4, 2.0, 1.0)) == pytest.approx(2 / 30)
    assert math.exp(log_sequence(3, 3, 2.0, 1.0)) == pytest.approx(2 / 5)

    def is_log_beta(node: ast.AST) -> bool:
        """lgamma(a) + lgamma(b) - lgamma(a + b), however a and b are spelled."""
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
                and isinstance(node.left, ast.BinOp) and isinstance(node.left.op, ast.Add)):
            return False
        parts = (node.left.left, node.left.right, node.right)
        if not all(isinstance(x, ast.Call) and ast.unparse(x.func).endswith("lgamma")
                   and len(x.args) == 1 for x in parts):
            return False
        a, b, ab = (ast.unparse(x.args[0]) for x in parts)  # type: ignore[attr-defined]
        return ab == f"{a} + {b}"

    root = Path(__file__).resolve().parents[1]
    written_out = [
        f"{path.relative_to(root)}:{node.lineno}"
        for path in [*(root / "bisect_tool").rglob("*.py"), *(root / "bench").rglob("*.py")]
        for node in ast.walk(ast.parse(path.read_text())) if is_log_beta(node)
    ]
    assert written_out == ["bisect_tool/strategy/beta.py:11"]
