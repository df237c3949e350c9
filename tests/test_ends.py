"""Honest ends: an end that contradicts its role stops the run (exit 9, one line), and the
confidence covers the ends (issue: "never a confident wrong answer")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gitrepos import Repo, linear, run_cli, write_probe

from bisect_tool.simulate import simulate

N = 30


@pytest.fixture()
def repo(tmp_path: Path) -> Repo:
    return linear(tmp_path / "repo", N, tag_every=10)


def test_a_probe_that_fails_everywhere_names_no_commit(repo: Repo, tmp_path: Path) -> None:
    # `--run false`: the good end shows "the bug" too. Before: first bad commit at 99.9%, exit 0.
    state = tmp_path / "state"
    code, out, err = run_cli("start", "--good", repo.main[0], "--bad", repo.main[-1],
                             "--run", "false", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 9, (out, err)
    assert "first bad commit" not in out
    last = err.strip().splitlines()[-1]
    assert last.startswith("bisect: stopped without an answer (ends_contradict)")
    assert f"the good end {repo.main[0][:12]} shows the bug" in last
    assert "check that the probe can pass at all" in last
    code, out, _ = run_cli("status", "--json", "--state-dir", str(state), "--repo", str(repo.path))
    assert code == 0 and json.loads(out)["state"] == "ends_contradict"


def test_an_intermittent_good_end_that_is_bad_is_said_so(repo: Repo, tmp_path: Path) -> None:
    # The flip lies before the given good end: every commit fails half of its lifetimes.
    command = write_probe(tmp_path / "probe.py", flip=0, p=0.5)
    code, out, err = run_cli("start", "--good", repo.main[0], "--bad", repo.main[-1],
                             "--run", command, "--repo", str(repo.path),
                             "--state-dir", str(tmp_path / "state"))
    assert code == 9, (out, err)
    assert "the good end" in err.strip().splitlines()[-1]


def test_a_clean_good_end_costs_little_and_the_answer_stands(repo: Repo, tmp_path: Path) -> None:
    command = write_probe(tmp_path / "probe.py", flip=17, p=1.0)
    code, out, err = run_cli("start", "--good", repo.main[0], "--bad", repo.main[-1],
                             "--run", command, "--repo", str(repo.path),
                             "--state-dir", str(tmp_path / "state"))
    assert code == 0, err
    assert out.startswith(f"first bad commit: {repo.main[16]}")


def test_two_candidates_confidence_is_not_certainty_before_the_good_end_earned_it() -> None:
    # The shape of docs/h200: a fix range of two releases, 3 divergent lifetimes of the bad end
    # and 1 clean of the good end. Before: 100%. Now the good end's own doubt counts.
    from bisect_tool.strategy import BayesianStrategy
    from bisect_tool.values import Direction

    s = BayesianStrategy(2, Direction.FIX)
    for _ in range(3):
        s.record(0, True)
    s.record(1, False)
    beyond, _ = s.end_doubts()
    assert 0.001 < beyond < 0.05
    assert s.summary().confidence == pytest.approx(1 - sum(s.end_doubts()))
    assert not s.done()  # it keeps testing the good end
    assert s.select().position == 1


def test_simulated_good_end_bad_is_said_so_not_named() -> None:
    for p, q in ((0.5, 0.01), (1.0, 0.0)):
        r = simulate(64, p, q, 40, seed=0, good_end_bad=True, processes=1)
        assert r.strategies["bayes"].accuracy == 1.0, (p, q)
