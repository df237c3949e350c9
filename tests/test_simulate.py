"""`bisect simulate`: the benchmark's definitions and its command line."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from bisect_tool.cli.simulate import simulate_command
from bisect_tool.designs.simulate import simulate, wilson_interval
from bisect_tool.errors import UsageError
from bisect_tool.strategy import Costs
from bisect_tool.strategy.simhistories import channel_capacity, lower_bound


def test_classic_bisection_cost_is_the_documented_formula() -> None:
    """Classic: one lifetime at each end, then one lifetime per midpoint, each candidate 10."""
    r = simulate(64, 1.0, 0.0, 20, processes=1)
    classic = r.strategies["classic"]
    assert classic.accuracy == 1.0
    assert classic.mean_evaluations == 2 + math.log2(64)
    assert classic.mean_cost == (2 + math.log2(64)) * 11


def test_channel_capacity_and_lower_bound() -> None:
    assert channel_capacity(1.0, 0.0) == pytest.approx(1.0, abs=1e-3)
    assert channel_capacity(0.5, 0.01) == pytest.approx(0.286, abs=0.002)  # search-notes.md
    lb = lower_bound(512, 0.5, 0.01, Costs())
    assert lb.evaluations == pytest.approx(30.9, abs=0.2)
    assert lb.cost == pytest.approx(119.2, abs=0.5)


def test_result_does_not_depend_on_the_number_of_processes() -> None:
    one = simulate(32, 0.5, 0.01, 6, seed=3, processes=1)
    two = simulate(32, 0.5, 0.01, 6, seed=3, processes=2)
    assert one == two


def test_bayes_beats_classic_on_an_intermittent_bug() -> None:
    r = simulate(64, 0.5, 0.01, 16, seed=5)
    assert r.strategies["bayes"].accuracy >= 0.9
    assert r.strategies["classic"].accuracy < 0.5


def test_json_output_has_the_documented_shape() -> None:
    out = CliRunner().invoke(
        simulate_command, ["--candidates", "32", "--p", "1", "--q", "0", "--trials", "4", "--json"]
    )
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert set(data["lower_bound"]) >= {"evaluations", "cost"}
    assert set(data["strategies"]) == {"bayes", "classic", "fixed_repeats"}
    for stats in data["strategies"].values():
        assert set(stats) >= {"accuracy", "mean_evaluations", "p95_evaluations", "mean_cost"}
    assert data["strategies"]["bayes"]["accuracy"] == 1.0


def test_table_output_names_the_ratios() -> None:
    out = CliRunner().invoke(
        simulate_command, ["-n", "16", "--p", "0.8", "--q", "0.01", "--trials", "3"]
    )
    assert out.exit_code == 0, out.output
    assert "bayes cost / lower bound" in out.output
    assert "bayes cost / classic cost" in out.output
    for name in ("bayes", "classic", "fixed_repeats", "lower bound"):
        assert name in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--p", "0"], "'--p': 0.0 is not in the range 0<x<=1"),
        (["--p", "0.5", "--q", "0.6"], "--q 0.6 must be below --p 0.5"),
        (["--trials", "0"], "'--trials': 0 is not in the range x>=1"),
        (["--confidence", "1"], "'--confidence': 1.0 is not in the range"),
        (["--rate-step", "17,0.15"], "'--rate-step': '17,0.15' is not A,P1,B (e.g. 17,0.15,26)"),
        (["--rate-step", "9,0.5,3"], "need 0 <= A < B and 0 < P1 <= 1"),
        (["--rate-step", "3,0.5,9"], "a rate step needs 0 <= 3 < 9 <= 8"),
        (["--flaky-good-end", "0"], "'--flaky-good-end': 0.0 is not in the range 0<x<=1"),
        (["--flaky-good-end", "0.5", "--good-end-bad"], "give one of --good-end-bad,"),
    ],
)
def test_bad_input_is_a_one_line_usage_error(args: list[str], message: str) -> None:
    from gitrepos import run_cli

    code, _, err = run_cli("simulate", "-n", "8", "--trials", "1", *args)
    assert code == UsageError.exit_code
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bisect: ") and message in lines[0], err


def test_accuracy_comes_with_its_error_count_and_interval() -> None:
    """A reader of the grid can tell sampling noise from a miss: 98 of 100 is compatible with
    a true 0.99, 980 of 1000 is not."""
    assert wilson_interval(98, 100)[1] > 0.99
    assert wilson_interval(980, 1000)[1] < 0.99
    lo, hi = wilson_interval(100, 100)
    assert hi == pytest.approx(1.0) and 0.95 < lo < 0.97
    r = simulate(32, 0.5, 0.01, 10, seed=1, processes=1)
    for stats in r.strategies.values():
        assert stats.errors == round((1 - stats.accuracy) * 10)
        assert stats.accuracy_interval[0] <= stats.accuracy <= stats.accuracy_interval[1]


@pytest.mark.slow
def test_grid_runs_every_target_cell_with_the_asked_trials() -> None:
    from bisect_tool.designs.simulate import GRID_FLAKY_GOOD_END, GRID_GOOD_END_BAD, GRID_RATE_STEP

    out = CliRunner().invoke(simulate_command, ["--grid", "--trials", "1", "--json"])
    assert out.exit_code == 0, out.output
    cells = json.loads(out.output)["cells"]
    plain = [c for c in cells if not c["shape"]]
    assert {(c["candidates"], c["p"], c["q"]) for c in plain} == {
        (n, p, q) for n in (64, 512, 4096) for p in (0.3, 0.5, 0.8, 1.0) for q in (0.0, 0.01)
    }
    shapes = [c["shape"] for c in cells if c["shape"]]
    assert shapes == (["good end bad"] * len(GRID_GOOD_END_BAD)
                      + [f"step {p1:g}@{a} {p:g}@{b}" for _, a, p1, b, p, _ in GRID_RATE_STEP]
                      + [f"good end at {r:g}" for *_, r in GRID_FLAKY_GOOD_END])
    assert "step 0.15@17 1@26" in shapes  # issue 38's own history
    assert all(c["trials"] == 1 for c in cells)
    assert all(set(c["ratios"]) == {"bayes_over_lower_bound", "bayes_over_classic"} for c in cells)


# ---- the simulation is the product's own search (issue 42, item 1) ---------------------------


@pytest.mark.slow  # statistical: many simulated searches
def test_a_quiet_bad_end_stops_the_simulated_search_as_it_stops_a_run() -> None:
    """A bad end that never shows the bug: the run's rule stops after its 12 lifetimes without
    an answer (the hand copy searched on to its budget), and ``simulate`` counts such runs
    apart from the wrong answers, with the lifetimes they took."""
    from bisect_tool.designs.simulate import Outcome, run_design, search_header
    from bisect_tool.recipes.recipe import SearchSettings
    from bisect_tool.strategy.simhistories import History, Lifetimes
    from bisect_tool.values import Direction
    from bisect_tool.verdict import EndState

    quiet = History((0.0,) * 33, Direction.FIX, 16)
    lifetimes = Lifetimes(quiet, np.random.default_rng(0))
    run = run_design(search_header(quiet), lifetimes)
    assert (run.end, run.outcome) == (EndState.BAD_END_NEVER, Outcome.NO_ANSWER)
    assert lifetimes.count == SearchSettings().max_end_lifetimes == 12
    r = simulate(16, 0.1, 0.0, 20, seed=2, processes=1)
    bayes = r.strategies["bayes"]
    assert 0 < bayes.no_answer < 20 and bayes.no_answer_evaluations >= 12
    assert bayes.errors + bayes.no_answer + round(bayes.accuracy * 20) == 20


def test_a_good_end_that_fails_every_lifetime_is_said_so_not_explained_away() -> None:
    """Issue 30's history (a real flip inside, the given good end failing too): right is the
    stop that names the good end, never the flip."""
    r = simulate(40, 1.0, 0.0, 12, seed=0, processes=1, flaky_good_end_rate=1.0)
    assert r.shape == "good end at 1"
    assert r.strategies["bayes"].accuracy == 1.0
    assert r.strategies["bayes"].errors == 0


def test_the_harness_names_the_flip_of_a_history_in_either_direction() -> None:
    from bisect_tool.designs.simulate import Outcome, run_design, search_header
    from bisect_tool.strategy.simhistories import Lifetimes, step
    from bisect_tool.values import Direction

    for direction in Direction:
        history = step(40, 13, 1.0, 0.0, direction)
        lifetimes = Lifetimes(history, np.random.default_rng(0))
        run = run_design(search_header(history), lifetimes)
        assert (run.outcome, run.block, str(run.end)) == (Outcome.RIGHT, (13,), "done")
        assert run.confidence >= 0.99
        assert run.lifetimes == lifetimes.count


def test_the_tiered_search_is_right_with_a_fast_probe_that_flips_elsewhere() -> None:
    r = simulate(32, 0.8, 0.0, 6, seed=1, processes=1, tiered=True, stand_in_wrong=True)
    assert r.strategies["tiered"].accuracy == 1.0
    assert r.strategies["tiered"].mean_cost > 0


def test_the_new_shapes_from_the_command_line() -> None:
    """Issue 38's two histories, as a user runs them: the table names the shape and counts the
    runs that stopped without an answer apart from the wrong ones."""
    out = CliRunner().invoke(simulate_command, ["-n", "30", "--rate-step", "17,0.5,26", "--p",
                                                "1", "--q", "0", "--trials", "4", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["shape"] == "step 0.5@17 1@26"
    bayes = data["strategies"]["bayes"]
    assert bayes["errors"] + bayes["no_answer"] + round(bayes["accuracy"] * 4) == 4
    out = CliRunner().invoke(simulate_command, ["-n", "30", "--flaky-good-end", "0.5", "--p",
                                                "1", "--q", "0", "--trials", "3"])
    assert out.exit_code == 0, out.output
    assert "(good end at 0.5)" in out.output.splitlines()[0]


def test_a_good_end_that_fails_half_its_lifetimes_is_said_so_in_simulation() -> None:
    """Issue 38: accepted after one clean lifetime in 4 of 14 runs; named a commit in 24 of 40
    simulated runs before the good end had to run clean 8 times."""
    r = simulate(30, 1.0, 0.0, 30, seed=3, processes=1, flaky_good_end_rate=0.5)
    assert r.strategies["bayes"].errors == 0
    assert r.strategies["bayes"].accuracy == 1.0


def test_the_floor_from_the_command_line_goes_through_the_header() -> None:
    """`bisect simulate --clean-against 0.15` sets what `bisect start --clean-against 0.15`
    sets: the header's [search] clean_against_rate, which the design replays."""
    from bisect_tool.designs import ledger
    from bisect_tool.designs.simulate import search_header
    from bisect_tool.journal import JournalContents
    from bisect_tool.strategy.simhistories import rate_step

    header = search_header(rate_step(30, (17, 0.15), (26, 1.0), 0.0), clean_against_rate=0.15)
    assert header["recipe"]["search"]["clean_against_rate"] == 0.15
    state = ledger.replay(JournalContents(header, ()))
    assert state.strategy.summary().priors.clean_against_rate == 0.15
    out = CliRunner().invoke(simulate_command, ["-n", "30", "--rate-step", "17,0.15,26", "--p",
                                                "1", "--q", "0", "--trials", "2",
                                                "--clean-against", "0.15"])
    assert out.exit_code == 0, out.output
    assert "clean-against=0.15" in out.output.splitlines()[0]
    out = CliRunner().invoke(simulate_command, ["--clean-against", "1", "--trials", "1"])
    assert out.exit_code == 2 and "--clean-against" in out.output


def test_a_bug_at_0_15_before_the_flip_is_not_blamed_on_the_flip_with_the_floor_at_0_15() -> None:
    """Issue 38's own history: wrong in 99 of 300 runs at the default floor (0.5), in 51 of 300
    with the floor at 0.15 alone (the commit next to the flip showed the bug once and was let
    off), in none of 300 once a candidate that showed it must rule out the floor too. The first
    40 of those 300 runs (the same seeds): none wrong."""
    r = simulate(30, 1.0, 0.0, 40, processes=2, rate_step_at=(17, 0.15, 26),
                 clean_against_rate=0.15)
    assert r.clean_against_rate == 0.15
    assert r.strategies["bayes"].errors == 0
