"""`bisect locate` driven through its evaluator seam (issue 42): a small clone, and evaluators
of plain values that say divergent or clean per (Python side, compiled side). What a user sees
is checked: the side it names, the next step, the journal it leaves (header, environment entry,
lifetimes, end) and what `bisect replay` reads from it; and the one journal opener: an
unfinished locate goes on, one of other ends is refused, a finished one starts afresh."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from gitrepos import linear, run_cli

from bisect_tool.errors import AbortError, UsageError
from bisect_tool.range import Candidate
from bisect_tool.recipes.recipe import Recipe
from bisect_tool.run.locate import LocateRequest, Sides, locate, render
from bisect_tool.strategy.matrix import Explanation
from bisect_tool.values import Observation, Verdict

#: (Python side, compiled side's commit) -> divergent?
Truth = Callable[[str, str], bool]


class PlainSide:
    """One Python side's evaluator: the verdict ``truth`` gives its compiled side's commit."""

    def __init__(self, side: str, truth: Truth, calls: list[tuple[str, str]],
                 stop_after: int | None = None) -> None:
        self.side, self.truth, self.calls, self.stop_after = side, truth, calls, stop_after

    def prepare(self, commits: object) -> None:
        return None

    def cancel(self) -> int:
        return 0

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        if self.stop_after is not None and len(self.calls) >= self.stop_after:
            raise AbortError("stopped from outside")
        self.calls.append((self.side, commit))
        verdict = Verdict.DIVERGENT if self.truth(self.side, commit) else Verdict.CLEAN
        return Observation(commit, verdict, lifetime_id, {}, "", 0.1)


class Fake:
    """The seam: opens ``PlainSide``s, and counts how often the environment was asked."""

    def __init__(self, truth: Truth, stop_after: int | None = None) -> None:
        self.truth, self.stop_after = truth, stop_after
        self.calls: list[tuple[str, str]] = []
        self.environments = 0
        self.sessions: list[str] = []

    def environment(self) -> dict[str, Any]:
        self.environments += 1
        return {"machine": "plain values", "sides": {"good": {"files": {}},
                                                     "bad": {"files": {}}}}

    @contextmanager
    def __call__(self, request: LocateRequest, good: Candidate, bad: Candidate, session: str,
                 observer: object) -> Iterator[Sides]:
        self.sessions.append(session)
        arms = {side: PlainSide(side, self.truth, self.calls, self.stop_after)
                for side in ("good", "bad")}
        yield Sides(arms, 1, environment=self.environment)


@pytest.fixture
def ends(tmp_path: Path) -> tuple[Path, str, str]:
    """The clone, its good end v0.1.0 and its bad end v0.3.0 (v0.2.0 between them)."""
    repo = linear(tmp_path / "repo", 3, tag_every=1)
    return repo.path, repo.main[0], repo.main[2]


def _request(ends: tuple[Path, str, str], state: Path, **kw: Any) -> LocateRequest:
    repo, good, bad = ends
    recipe = Recipe("t").override("probe", controls=False)
    return LocateRequest(kw.pop("good", good), kw.pop("bad", bad), recipe, state, repo=repo,
                         **kw)


def _journal(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "locate.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("carrier", ["compiled", "python"])
def test_locate_names_the_side_whose_change_the_evaluators_show(
    ends: tuple[Path, str, str], tmp_path: Path, carrier: str
) -> None:
    _repo, good, bad = ends
    if carrier == "compiled":  # the bad end's compiled files diverge, under either Python side
        fake = Fake(lambda side, commit: commit == bad)
    else:  # the bad end's Python side diverges, over either end's compiled files
        fake = Fake(lambda side, commit: side == "bad")
    state = tmp_path / "state"
    outcome = locate(_request(ends, state), sides=fake)

    assert outcome.finding.decided
    assert outcome.finding.explanation is Explanation(carrier)
    shown = render(outcome)
    assert shown.splitlines()[0].startswith(f"locate v0.3.0 (bad) .. v0.1.0 (good): {carrier} (")
    words = {"compiled": "the compiled side", "python": "the Python side"}[carrier]
    assert f"{words} carries the change" in shown
    if carrier == "compiled":
        assert "Next, the commits between them: bisect start --good" in outcome.next_step
    else:
        assert "Next, whole commits" in outcome.next_step
        assert "bisect start --locate --good" in outcome.next_step
    # every cell ran (both Python sides over both ends' compiled files)
    assert {(s, c) for s, c in fake.calls} == {(s, c) for s in ("good", "bad")
                                              for c in (good, bad)}

    journal = _journal(state)
    header = journal[0]
    assert header["mode"] == "locate" and (header["good"], header["bad"]) == (good, bad)
    assert fake.sessions == [header["session"]]
    assert [e["type"] for e in journal[1:2]] == ["environment"]  # before the first lifetime
    assert journal[1]["machine"] == "plain values" and fake.environments == 1
    observations = [e for e in journal if e["type"] == "observation"]
    assert len(observations) == outcome.lifetimes == len(fake.calls)
    assert journal[-1]["type"] == "end"
    assert journal[-1]["finding"]["explanation"] == carrier

    # `bisect replay` reads the journal as a locate, to the same answer
    code, out, err = run_cli("replay", str(state / "locate.jsonl"), "--json")
    assert code == 0, err
    replayed = json.loads(out)
    assert replayed["kind"] == "locate" and replayed["explanation"] == carrier


def test_one_opener_goes_on_refuses_other_ends_and_starts_a_finished_one_afresh(
    ends: tuple[Path, str, str], tmp_path: Path
) -> None:
    _repo, _good, bad = ends
    state = tmp_path / "state"

    def truth(side: str, commit: str) -> bool:
        return commit == bad

    stopped = Fake(truth, stop_after=3)
    with pytest.raises(AbortError):
        locate(_request(ends, state), sides=stopped)
    first = _journal(state)
    assert [e["type"] for e in first] == ["header", "environment", *["observation"] * 3]

    # an unfinished locate of other ends is refused, and its journal is left as it was
    other = Fake(truth)
    with pytest.raises(UsageError, match="a locate of other ends is in progress"):
        locate(_request(ends, state, bad="v0.2.0"), sides=other)
    assert _journal(state) == first and other.calls == []

    # the same ends go on: the same session, no second environment entry, nothing run twice
    resumed = Fake(truth)
    outcome = locate(_request(ends, state), sides=resumed)
    after = _journal(state)
    assert after[: len(first)] == first
    assert resumed.sessions == [first[0]["session"]] and resumed.environments == 0
    assert [e["type"] for e in after].count("environment") == 1
    assert outcome.lifetimes == 3 + len(resumed.calls)
    assert outcome.finding.explanation is Explanation.COMPILED

    # a finished locate is started afresh: a new session, its own environment entry
    again = Fake(truth)
    locate(_request(ends, state), sides=again)
    fresh = _journal(state)
    assert fresh[0]["session"] != first[0]["session"]
    assert [e["type"] for e in fresh[:2]] == ["header", "environment"]
    assert again.environments == 1


def test_a_python_side_is_the_ends_package_with_its_own_compiled_files(tmp_path: Path) -> None:
    """``CachingProvider.python_side``, the typed way locate takes a Python side: the clone's
    package at the end, its own swap set laid in, cached under its key."""
    from gitrepos import init

    from bisect_tool.artifacts.cache import ArtifactCache
    from bisect_tool.artifacts.provider import CachingProvider
    from bisect_tool.artifacts.sources import LocalSource

    repo = init(tmp_path / "repo")
    sha = repo.commit("the end", {"pkg/__init__.py": "VERSION = 1\n", "pkg/model.py": "x = 1\n"})
    built = tmp_path / "built"
    (built / "pkg").mkdir(parents=True)
    (built / "pkg" / "_ext.so").write_bytes(b"the end's kernel")
    swap_set = ["pkg/_ext.so"]
    with CachingProvider(ArtifactCache(tmp_path / "cache"), swap_set,
                         [LocalSource({sha[:12]: str(built)}, swap_set)]) as provider:
        side = provider.python_side(sha, (), key="end-t", package="pkg", clone=repo.path)
        assert (side / "pkg" / "model.py").read_text() == "x = 1\n"
        assert (side / "pkg" / "_ext.so").read_bytes() == b"the end's kernel"
        # cached: a second ask is the same folder, not a new archive
        (side / "pkg" / "model.py").write_text("kept\n")
        again = provider.python_side(sha, (), key="end-t", package="pkg", clone=repo.path)
        assert again == side and (again / "pkg" / "model.py").read_text() == "kept\n"
