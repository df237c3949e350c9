"""``--deterministic`` (issue 31): git bisect's contract, one run a candidate, at most
ceil(log2 N) + 2 runs; a run that contradicts itself stops with exit 9 and says to drop the flag.
Without the flag a probe that never contradicts itself still costs a bounded number of runs.

Real ``--run`` probes in real git repositories (``gitrepos.long_linear``), the CLI as a user
runs it, and manual mode answered by a script the way a person would.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from gitrepos import Repo, long_linear, run_cli, write_probe

from bisect_tool import journal as journal_mod
from bisect_tool.designs import ledger
from bisect_tool.errors import NoAnswer
from bisect_tool.recipes.recipe import from_dict
from bisect_tool.strategy.tiers import Tier

#: without the flag, a never-contradicting probe's runs at N = 252 and 60: the honest search's
#: worst case over every flip (bench/cost_bounds.py prints it against 2 ceil(log2 N)); 20 and
#: 17 before the good end and the commit next to the flip had to run clean 8 and 9 times (issue
#: 38: a good end failing half its lifetimes was accepted after one clean one)
UNFLAGGED_MAX = {252: 30, 60: 28}


@pytest.fixture(scope="module")
def repo252(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return long_linear(tmp_path_factory.mktemp("det252") / "repo", 252)


@pytest.fixture(scope="module")
def repo60(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return long_linear(tmp_path_factory.mktemp("det60") / "repo", 60)


def _bisect_run(repo: Repo, tmp_path: Path, flip: int, *flags: str) -> tuple[int, str, str, list]:
    command = write_probe(tmp_path / "probe.py", flip=flip)
    state = tmp_path / "state"
    code, out, err = run_cli("start", "--good", repo.main[0], "--bad", repo.main[-1],
                             "--run", command, "--repo", str(repo.path), "--state-dir",
                             str(state), "-q", *flags)
    runs = journal_mod.read(state / journal_mod.JOURNAL_NAME).observations
    return code, out, err, runs


@pytest.mark.parametrize("flip", [2, pytest.param(100, marks=pytest.mark.slow),
                                  pytest.param(200, marks=pytest.mark.slow), 252])
def test_deterministic_runs_each_candidate_once_within_log2_n_plus_2(
    repo252: Repo, tmp_path: Path, flip: int
) -> None:
    code, out, err, runs = _bisect_run(repo252, tmp_path, flip, "--deterministic")
    assert code == 0, err
    assert out.startswith(f"first bad commit: {repo252.main[flip - 1]}")
    assert len(runs) <= math.ceil(math.log2(252)) + 2 == 10
    commits = [o["commit"] for o in runs]
    assert len(commits) == len(set(commits))  # no candidate ran twice


@pytest.mark.slow  # a whole bisect over 252 commits, counted
def test_without_the_flag_a_never_contradicting_probe_costs_a_bounded_number_of_runs(
    repo252: Repo, tmp_path: Path
) -> None:
    code, out, err, runs = _bisect_run(repo252, tmp_path, 100)
    assert code == 0, err
    assert out.startswith(f"first bad commit: {repo252.main[99]}")
    assert len(runs) <= UNFLAGGED_MAX[252]


@pytest.mark.parametrize(("command", "state", "says"), [
    ("true", "bad_end_never_reproduced", "did not show the bug in its run"),
    ("false", "ends_contradict", "the good end"),
])
def test_ends_that_contradict_a_deterministic_probe_stop_with_exit_9_and_the_way_out(
    repo60: Repo, tmp_path: Path, command: str, state: str, says: str
) -> None:
    code, _, err = run_cli("start", "--good", repo60.main[0], "--bad", repo60.main[-1],
                           "--run", command, "--repo", str(repo60.path), "--state-dir",
                           str(tmp_path / "state"), "-q", "--deterministic")
    assert code == NoAnswer.exit_code == 9
    line = err.strip().splitlines()[-1]
    assert f"({state})" in line and says in line and "drop --deterministic" in line
    assert "Traceback" not in err
    runs = journal_mod.read(tmp_path / "state" / journal_mod.JOURNAL_NAME).observations
    assert len({o["commit"] for o in runs}) == len(runs) <= 2  # each end once, no more


def _manual(repo: Repo, state: Path, flip: int, *flags: str) -> tuple[int, int, str, str]:
    """A person answering every candidate the search asks for: (answers, exit code, out, err)."""
    where = ["--repo", str(repo.path), "--state-dir", str(state)]
    code, out, err = run_cli("start", "--good", repo.main[0], "--bad", repo.main[-1], *where,
                             *flags)
    answers = 0
    while code == 0 and out.startswith("next:"):
        index = repo.main.index(out.split()[1]) + 1
        answers += 1
        code, out, err = run_cli("bad" if index >= flip else "good", *where)
    return answers, code, out, err


@pytest.mark.parametrize("flip", [2, 31, 60])
def test_manual_mode_follows_the_same_rules(repo60: Repo, tmp_path: Path, flip: int) -> None:
    answers, code, out, err = _manual(repo60, tmp_path / "det", flip, "--deterministic")
    assert code == 0, err
    assert out.startswith(f"first bad commit: {repo60.main[flip - 1]}")
    assert answers <= math.ceil(math.log2(60)) + 2 == 8
    answers, code, out, err = _manual(repo60, tmp_path / "plain", flip)
    assert code == 0, err
    assert out.startswith(f"first bad commit: {repo60.main[flip - 1]}")
    assert answers <= UNFLAGGED_MAX[60]


def test_a_candidate_given_both_answers_by_hand_stops_with_exit_9(
    repo60: Repo, tmp_path: Path
) -> None:
    where = ["--repo", str(repo60.path), "--state-dir", str(tmp_path / "state")]
    code, out, _ = run_cli("start", "--good", repo60.main[0], "--bad", repo60.main[-1], *where,
                           "--deterministic")
    assert code == 0 and out.startswith("next:")
    assert run_cli("good", repo60.main[30], *where)[0] == 0
    code, _, err = run_cli("bad", repo60.main[30], *where)
    assert code == 9
    assert "(probe_contradicted)" in err and "both answers" in err
    assert "drop --deterministic" in err
    code, out, _ = run_cli("status", "--json", *where)
    assert code == 0 and '"probe_contradicted"' in out


def test_the_recipe_key_makes_the_search_deterministic() -> None:
    recipe = from_dict({"name": "t", "probe": {"deterministic": True}})
    assert recipe.probe.deterministic
    header = {"candidates": [{"sha": f"{i:040x}", "subject": ""} for i in range(9)],
              "direction": "regression", "mode": "recipe",
              "recipe": ledger.header_recipe(recipe)}
    from bisect_tool.journal import JournalContents

    state = ledger.replay(JournalContents(header, ()))
    assert state.strategy_for(Tier.FAITHFUL).summary().deterministic
    plain = ledger.replay(JournalContents(header | {"recipe": ledger.header_recipe(
        from_dict({"name": "t"}))}, ()))
    assert not plain.strategy.summary().deterministic


def test_a_recipe_whose_deterministic_key_is_not_a_boolean_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.toml"
    path.write_text('name = "r"\n[probe]\ndeterministic = "yes"\n')
    code, _, err = run_cli("plan", "--good", "a", "--bad", "b", "--recipe", str(path))
    assert code == 4, err
    assert "'probe.deterministic' must be true or false" in err
