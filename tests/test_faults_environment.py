"""Issue 38: a broken environment must not burn the whole range. With a missing server module one
run spent 120 lifetimes on 61 candidates, and the controls on 53 releases, repeating one cause.
Lifetimes (and controls) that fail with one root cause at several candidates in a row, none
running between, stop the run with exit 8 and that cause in one line, with its count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gitrepos import Repo, linear, run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.designs import ledger
from bisect_tool.errors import InfrastructureError, NoAnswer
from bisect_tool.journal import Journal
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.recipes.recipe import Recipe
from bisect_tool.run.owner import Attempt, bisect_loop, failure_cause, repeated_cause
from bisect_tool.run.wiring import Evaluators
from bisect_tool.values import Direction, Observation, Verdict

N = 30
MISSING = "ModuleNotFoundError: No module named 'vllm.entrypoints.openai.api_server'"


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert lines and lines[-1].startswith("bisect: "), err
    return lines[-1]


# ---- the rule, on plain values ----------------------------------------------------------------


def test_one_cause_at_three_candidates_in_a_row_stops() -> None:
    a = [Attempt("c30", "X"), Attempt("c30", "X"), Attempt("c29", "X")]
    assert repeated_cause(a) is None  # two candidates
    assert repeated_cause([*a, Attempt("c28", "X")]) == ("X", 4, 3)


def test_a_lifetime_that_ran_or_another_cause_breaks_the_row() -> None:
    ran = [Attempt("c1", "X"), Attempt("c2", "X"), Attempt("c3", None), Attempt("c4", "X")]
    assert repeated_cause(ran) is None
    mixed = [Attempt("c1", "X"), Attempt("c2", "Y"), Attempt("c3", "X")]
    assert repeated_cause(mixed) is None
    after = [Attempt("c0", None), Attempt("c1", "X"), Attempt("c2", "X"), Attempt("c3", "X")]
    assert repeated_cause(after) == ("X", 3, 3)  # the machine broke mid-run


def test_a_cause_the_user_resumed_past_is_gone_on_past() -> None:
    row = [Attempt(f"c{i}", "X") for i in range(5)]
    assert repeated_cause(row, seen={"X"}) is None and repeated_cause(row, seen={"Y"})


def _untestable(commit: str, message: str, **detail: Any) -> Observation:
    return Observation(commit, Verdict.UNTESTABLE, f"{commit[:12]}-0", dict(detail), message)


def test_the_cause_is_the_first_error_of_the_log_without_what_differs_per_candidate() -> None:
    """A boot failure carries its commit, lifetime id and port; the key is its root cause."""
    messages = [
        f"lifetime {sha[:12]}-{n}: server exited with code 1 before /health (port {port}); "
        f"log tail:\nINFO starting\nTraceback (most recent call last):\n  File \"x.py\"\n    y\n"
        f"{MISSING}\n"
        for sha, n, port in (("a1b2c3d4e5f6" * 3, 0, 38001), ("0f9e8d7c6b5a" * 3, 1, 41234))
    ]
    causes = {failure_cause(_untestable("a" * 40, m, stage="boot")) for m in messages}
    assert causes == {MISSING}
    controls = ("the controls could not run: boot failed: lifetime control-a1b2c3d4e5f6-0: "
                f"server exited with code 1 before /health; log tail:\n{MISSING}")
    from bisect_tool.run.owner import cause_of

    assert cause_of(controls) == MISSING  # the controls' failure is the lifetimes' one
    # the gate's refusal and a missing artifact or failed build are the candidate's own; a
    # bare exit 125 says nothing more
    assert failure_cause(_untestable("a" * 40, "op x differs", stage="gate")) == ""
    assert failure_cause(_untestable("a" * 40, "build of a failed", stage="artifacts")) == ""
    assert failure_cause(_untestable("a" * 40, "exit 125", log_tail="")) == ""
    assert failure_cause(Observation("a" * 40, Verdict.CLEAN)) is None


# ---- a --run probe on a machine that lacks what it needs ----------------------------------------


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("environment") / "repo", N, tag_every=10)


BROKEN = f'echo "{MISSING}" >&2; exit 125'


def test_a_probe_that_fails_the_same_way_everywhere_stops_after_three_candidates(
    repo: Repo, tmp_path: Path
) -> None:
    state = tmp_path / "st"
    code, out, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.3.0", "--run", BROKEN,
                             "--repo", str(repo.path), "--state-dir", str(state), "-q")
    assert code == InfrastructureError.exit_code == 8, out + err
    line = one_line(err)
    assert "3 lifetimes at 3 candidates in a row failed the same way" in line
    assert MISSING in line and "`bisect resume`" in line
    observed = journal_mod.read(state / "journal.jsonl").observations
    assert len(observed) == 3 and all(o["verdict"] == "untestable" for o in observed)
    # before: every candidate of the range, one after the other (20 here)

    # told, the user resumes: the run goes on past that cause, as before
    code, out, err = run_cli("resume", "--repo", str(repo.path), "--state-dir", str(state), "-q")
    assert code == NoAnswer.exit_code and "untestable" in one_line(err)


# ---- a recipe run: the controls and the lifetimes, every boot failing ---------------------------


def _range(n: int) -> CommitRange:
    shas = [f"{i:040x}" for i in range(1, n + 1)]
    return CommitRange("good", "bad", shas[0], shas[-1], Direction.REGRESSION,
                       tuple(Candidate(s, f"commit {i}") for i, s in enumerate(shas)))


class _NoServer:
    """Every boot dies on the missing module, as the local backend reports it."""

    def __init__(self) -> None:
        self.lifetimes = 0

    def prepare(self, commits: object) -> None:
        return None

    def cancel(self) -> int:
        return 0

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        self.lifetimes += 1
        message = (f"lifetime {lifetime_id}: server exited with code 1 before /health; log "
                   f"tail:\n(APIServer pid={4000 + self.lifetimes}) {MISSING}")
        return Observation(commit, Verdict.UNTESTABLE, lifetime_id, {"stage": "boot"}, message)


class _NoControls:
    def __init__(self) -> None:
        self.ran: list[str] = []

    def __call__(self, commit: str) -> _NoControls:
        self.commit = commit
        return self

    def run(self) -> dict[str, Any]:
        self.ran.append(self.commit)
        problem = (f"the controls could not run: boot failed: lifetime control-"
                   f"{self.commit[:12]}-0: server exited with code 1 before /health; log tail:"
                   f"\n{MISSING}")
        return {"type": "controls", "commit": self.commit, "ok": False, "problem": problem,
                "positive": {"verdict": "untestable"}, "negative": {"verdict": "untestable"},
                "attempts": 1, "untestable": True}


def test_a_missing_server_module_stops_the_run_within_a_few_boots(tmp_path: Path) -> None:
    """The issue's run: 61 candidates, the controls first, every server dying on one missing
    module. Before: 120 lifetimes and the controls on 53 candidates."""
    rng = _range(61)
    path = tmp_path / "journal.jsonl"
    server, controls = _NoServer(), _NoControls()
    with Journal(path) as journal:
        recipe = Recipe("t").to_dict()
        recipe["probe"]["controls"] = True
        journal.append(ledger.header_for(rng, recipe=recipe, mode="recipe"))
        state = ledger.replay(journal_mod.read(path))
        with pytest.raises(InfrastructureError) as stopped:
            bisect_loop(journal, state, Evaluators(server, 1, controls), controls=True)
    assert MISSING in str(stopped.value) and "in a row failed the same way" in str(stopped.value)
    assert len(controls.ran) + server.lifetimes <= 4, (controls.ran, server.lifetimes)
    kept = journal_mod.read(path)
    assert len(kept.of_type("controls")) == len(controls.ran)  # every attempt is journaled
    assert len(kept.observations) == server.lifetimes
