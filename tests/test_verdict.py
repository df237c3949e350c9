"""One verdict policy: the search (journal replay), `bisect probe --commit` (the run owner) and
the report give a candidate the same verdict for the same lifetimes; old journals replay."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import gitrepos
import pytest

from bisect_tool import journal as journal_mod
from bisect_tool.designs import ledger
from bisect_tool.range import Candidate, CommitRange
from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.report import build_report
from bisect_tool.run import commit_probe
from bisect_tool.run import owner as run
from bisect_tool.values import Direction, Observation, Verdict
from bisect_tool.verdict import EndState, aggregate, end_state, trusted

# N: no evidence (INCONCLUSIVE)
C, D, N, U = Verdict.CLEAN, Verdict.DIVERGENT, Verdict.INCONCLUSIVE, Verdict.UNTESTABLE
CASES: list[tuple[list[Verdict], Verdict]] = [
    ([C, C], C),
    ([C, N], C),  # INCONCLUSIVE is no evidence either way
    ([N, C, N], C),
    ([D, C, U], D),  # intermittent: one divergent lifetime is the bug
    ([C, U], C),  # a crash after a conclusive lifetime says nothing about the bug
    ([U, U], U),
    ([N, U], N),
    ([N, N], N),
]
FIXTURES = Path(__file__).parent / "fixtures"


def test_aggregate_rule() -> None:
    for lifetimes, expected in CASES:
        assert aggregate(lifetimes) is expected, lifetimes
    assert aggregate([]) is Verdict.INCONCLUSIVE


def test_failed_controls_veto_only_clean() -> None:
    assert trusted(C, False)[0] is N and "controls failed" in trusted(C, False)[1]
    assert trusted(D, False) == (D, "")
    assert trusted(C, True) == (C, "") and trusted(C, None) == (C, "")


def _journal(tmp_path: Path, lifetimes: Sequence[Verdict]) -> Path:
    shas = [f"{i:040x}" for i in (1, 2, 3)]
    rng = CommitRange(
        good_ref="g", bad_ref="b", good=shas[0], bad=shas[-1], direction=Direction.REGRESSION,
        candidates=tuple(Candidate(sha, f"c{i}") for i, sha in enumerate(shas)), paths=(),
    )
    path = tmp_path / "journal.jsonl"
    journal_mod.create(path, ledger.header_for(rng))
    with journal_mod.Journal(path) as journal:
        for n, verdict in enumerate(lifetimes):
            obs = Observation(shas[1], verdict, f"lt-{n}", {}, str(verdict))
            journal.append(ledger.observation_entry(obs, 1))
    return path


class _Replay:
    """An evaluator that gives the lifetimes of a case, one per call."""

    def __init__(self, lifetimes: Sequence[Verdict]) -> None:
        self.lifetimes = list(lifetimes)

    def prepare(self, commits: Sequence[str]) -> None:
        return None

    def cancel(self) -> int:
        return 0

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        return Observation(commit, self.lifetimes.pop(0), lifetime_id, {}, "scripted")


@pytest.mark.parametrize(("lifetimes", "expected"), CASES)
def test_search_probe_and_report_agree(
    tmp_path: Path, lifetimes: list[Verdict], expected: Verdict
) -> None:
    # the search: the journal replayed
    path = _journal(tmp_path, lifetimes)
    contents = journal_mod.read(path)
    state = ledger.replay(contents)
    assert state.candidate_verdict(1) is expected
    # the report
    built = build_report(contents, state.standing())
    row = next(r for r in built["tested"] if r["index"] == 1)
    assert row["verdict"] == expected.value.upper()
    # `bisect probe --commit`: the run owner over the same lifetimes
    repo = gitrepos.linear(tmp_path / "repo", 2)

    @contextlib.contextmanager
    def factory(
        recipe: Any, repo_path: Path, session_id: str, state_dir: Path,
        tags: Mapping[str, Sequence[str]], observer: Any,
    ) -> Iterator[run.Evaluators]:
        yield run.Evaluators(_Replay(lifetimes))

    probed = commit_probe.probe_commit(
        repo.path, "HEAD", recipe_mod.load("demo"), lifetimes=len(lifetimes), controls=False,
        state_dir=tmp_path / "state", evaluator_factory=factory,
    )
    assert probed.verdict is expected


def test_every_end_state_reads_back() -> None:
    for state in EndState:
        assert end_state(str(state)) is state
    assert end_state("something_newer") is EndState.NO_CANDIDATE  # never read as an answer
    assert [s for s in EndState if s.answered] == [EndState.DONE]
