"""Bounded builds (issue 31): the run builds what the next decision needs, plus a lookahead of
at most K (``--prefetch``, ``[artifacts] prefetch``), never more than runs + K in all, starts no
build once the answer is decided, and stops the ones under way when it ends.

Real gcc builds in real git worktrees; each build announces itself on a FIFO (its commit and
pid), so the tests wait on that event, never on the clock. Then the demo-op recipe end to end,
counting its real source builds.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from pathlib import Path

import git
import pytest
from gitrepos import run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.artifacts import make_provider
from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.demo.history import DemoHistory, generate
from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.recipes.recipe import ArtifactSettings
from bisect_tool.strategy import BayesianStrategy, Costs, NoCandidateLeft, lookahead
from bisect_tool.strategy.tiers import Tier
from bisect_tool.values import Direction

SO = "demollm/_kernels.so"
MAKEFILE = "demollm/_kernels.so: kernels.c\n\tmkdir -p demollm\n\tgcc -O2 -shared -fPIC -o $@ $<\n"
#: a commit whose kernels.c holds this builds until it is killed
HANG = "/* HANG */"


class Announcements:
    """Reads the FIFO every build writes ``<commit> <pid>`` to, as the builds start."""

    def __init__(self, path: Path) -> None:
        os.mkfifo(path)
        self.path = path
        self.lines: list[tuple[str, int]] = []
        self._cond = threading.Condition()
        # O_RDWR: the reader never sees EOF between two builds, and opening does not block
        self._fd = os.open(path, os.O_RDWR)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with os.fdopen(self._fd, "r") as fifo:
            for line in fifo:
                commit, _, pid = line.strip().partition(" ")
                with self._cond:
                    self.lines.append((commit, int(pid)))
                    self._cond.notify_all()

    def started(self, commit: str) -> int:
        """The pid of ``commit``'s build, once it has started (fails after 5 minutes)."""
        with self._cond:
            found = self._cond.wait_for(
                lambda: any(c == commit for c, _ in self.lines), timeout=300
            )
            assert found, f"the build of {commit[:12]} never started: {self.lines}"
            return next(pid for c, pid in self.lines if c == commit)

    def commits(self) -> list[str]:
        with self._cond:
            return [c for c, _ in self.lines]


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A repo of six commits a..f; ``hang`` builds until killed."""
    path = tmp_path / "repo"
    repo = git.Repo.init(path)
    shas: dict[str, str] = {}
    with repo:
        repo.config_writer().set_value("user", "name", "t").release()
        repo.config_writer().set_value("user", "email", "t@example.com").release()
        (path / "Makefile").write_text(MAKEFILE)
        for i, name in enumerate(["a", "b", "c", "d", "e", "hang"]):
            marker = HANG if name == "hang" else ""
            (path / "kernels.c").write_text(f"{marker}int version(void) {{ return {i}; }}\n")
            repo.index.add(["Makefile", "kernels.c"])
            shas[name] = repo.index.commit(name).hexsha
    return path, shas


@pytest.fixture
def fifo(tmp_path: Path) -> Announcements:
    return Announcements(tmp_path / "builds.fifo")


def settings(tmp_path: Path, fifo: Announcements, prefetch: int) -> ArtifactSettings:
    announce = f'echo "$(git rev-parse HEAD) $$" > {fifo.path}'
    return ArtifactSettings(
        sources=("source-build",),
        swap_set=(SO,),
        build_executor="host",
        build_command=f"{announce} && if grep -q HANG kernels.c; then exec sleep 600; fi; make",
        cache_dir=str(tmp_path / "cache"),
        prefetch=prefetch,
    )


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def assert_nothing_left(tmp_path: Path, repo: Path, commit: str) -> None:
    cache = ArtifactCache(tmp_path / "cache")
    assert cache.lookup(commit, (SO,)) is None
    assert cache.manifest(commit) is None
    assert list(cache.dirs["tmp"].iterdir()) == []  # no worktree, no half-copied output
    with git.Repo(repo) as r:
        assert len(r.git.worktree("list").splitlines()) == 1


# -- the provider --------------------------------------------------------------------------------


def test_closing_stops_a_running_lookahead_build_and_leaves_nothing_behind(
    tmp_path: Path, project: tuple[Path, dict[str, str]], fifo: Announcements
) -> None:
    repo, shas = project
    logs = tmp_path / "logs"
    with make_provider(settings(tmp_path, fifo, 1), repo, log_dir=logs) as provider:
        provider.prefetch([shas["hang"]], {})
        assert provider.get(shas["a"]).files[SO].is_file()
        pid = fifo.started(shas["hang"])  # the lookahead, building while "a" would be probed
    # close() returned: the build's process group was killed and reaped, not waited for
    assert gone(pid)
    assert provider.counts.cancelled == 1
    assert_nothing_left(tmp_path, repo, shas["hang"])
    log = (logs / f"build-{shas['hang'][:12]}.log").read_text()
    assert log.rstrip().endswith("[bisect] build cancelled: the run no longer needs it")


def test_a_lookahead_the_search_moved_away_from_stops_at_the_next_demand(
    tmp_path: Path, project: tuple[Path, dict[str, str]], fifo: Announcements
) -> None:
    repo, shas = project
    with make_provider(settings(tmp_path, fifo, 1), repo, log_dir=tmp_path / "logs") as p:
        p.prefetch([shas["hang"]], {})
        p.get(shas["a"])
        pid = fifo.started(shas["hang"])
        p.prefetch([shas["c"]], {})  # the search now points elsewhere: "hang" was a miss
        assert p.counts.cancelled == 0  # still running: the demand may yet be for it
        p.get(shas["b"])  # it was not: stopped before "b" is built beside it
        assert p.counts.cancelled == 1
        assert fifo.commits()[:3] == [shas["a"], shas["hang"], shas["b"]]
    assert gone(pid)
    assert_nothing_left(tmp_path, repo, shas["hang"])


def test_a_lookahead_waits_for_the_demand_and_none_starts_once_decided(
    tmp_path: Path, project: tuple[Path, dict[str, str]], fifo: Announcements
) -> None:
    repo, shas = project
    with make_provider(settings(tmp_path, fifo, 2), repo, log_dir=tmp_path / "logs") as p:
        p.prefetch([shas["b"], shas["c"]], {})
        p.get(shas["a"])
        # the demanded build came first: the lookahead overlaps the probe, not the build
        assert fifo.commits()[0] == shas["a"]
        fifo.started(shas["b"])
        fifo.started(shas["c"])
        assert p.get(shas["b"]).files[SO].is_file()  # a hit: no second build of it
        p.prefetch([shas["d"]], {})
        p.prefetch([], {})  # what the run says once the answer is decided
        built = p.counts.builds
    assert built == 3
    assert shas["d"] not in fifo.commits()
    assert fifo.commits() == [shas["a"], shas["b"], shas["c"]]


def test_lookahead_builds_never_exceed_runs_plus_k(
    tmp_path: Path, project: tuple[Path, dict[str, str]], fifo: Announcements
) -> None:
    """K = 1: a miss is paid for once; a second miss in a row finds the budget spent (builds
    3 = demands 2 + K) and its candidate is built only when a run asks for it."""
    repo, shas = project
    with make_provider(settings(tmp_path, fifo, 1), repo, log_dir=tmp_path / "logs") as p:
        p.prefetch([shas["hang"]], {})
        p.get(shas["a"])  # demand 1, build 1; then the lookahead "hang": build 2
        fifo.started(shas["hang"])
        p.prefetch([shas["c"]], {})
        p.get(shas["b"])  # demand 2, build 3 ("hang" was a miss: stopped)
        p.settle()  # the lookahead of "c" asked to start: 4 > 2 + 1
        assert p.counts.builds == 3
        p.get(shas["c"])  # the lookahead of "c" was deferred: built now, on demand
        counts = p.counts
    assert counts.deferred == 1
    assert (counts.demands, counts.builds) == (3, 4)
    assert counts.builds <= counts.demands + 1
    assert fifo.commits() == [shas["a"], shas["hang"], shas["b"], shas["c"]]


def test_a_lookahead_asked_again_after_it_failed_answers_anew(
    tmp_path: Path, project: tuple[Path, dict[str, str]], fifo: Announcements
) -> None:
    """A lookahead build that failed is kept as the demand's answer, until the search asks
    for the commit again: then the new attempt's answer counts."""
    repo, shas = project
    ready = tmp_path / "ready"
    base = settings(tmp_path, fifo, 2)
    command = f"test -e {ready} || exit 4; {base.build_command}"
    flaky = dataclasses.replace(base, build_command=command)
    with make_provider(flaky, repo, log_dir=tmp_path / "logs") as p:
        ready.touch()
        p.get(shas["a"])
        ready.unlink()
        p.prefetch([shas["c"]], {})
        p.get(shas["a"])
        p.settle()  # the lookahead of "c" failed (exit 4)
        ready.touch()
        p.prefetch([shas["c"]], {})
        p.get(shas["b"])
        p.settle()  # and built this time
        assert p.get(shas["c"]).files[SO].is_file()


# -- K and the lookahead, in plain values ------------------------------------------------------


def test_k_is_zero_where_source_builds_compete_with_the_probe() -> None:
    demo_op = recipe_mod.load("demo-op").to_dict()
    demo = recipe_mod.load("demo").to_dict()
    vllm = recipe_mod.load("batch-invariance").to_dict()
    recipe_costs = Costs(new_candidate=2.0, lifetime=1.0)
    # the op check through ctypes runs on the CPUs the host builds need: no build machine idle
    assert lookahead.build_facts(demo_op, Tier.FAITHFUL).competes
    assert lookahead.depth(-1, lookahead.build_facts(demo_op, Tier.FAITHFUL), recipe_costs) == 0
    assert lookahead.depth(-1, lookahead.build_facts(demo, Tier.NARROW), recipe_costs) == 0
    # server lifetimes (a GPU's work) leave the build machine idle: one build overlaps each
    assert lookahead.depth(-1, lookahead.build_facts(demo, Tier.FAITHFUL), recipe_costs) == 1
    # vLLM's op check runs on the GPU through torch
    assert lookahead.depth(-1, lookahead.build_facts(vllm, Tier.NARROW), Costs(3600, 1)) == 1
    # downloads that take less than half a lifetime: both outcomes of the candidate under test
    downloads = {**vllm, "artifacts": {**vllm["artifacts"], "sources": ["wheel-index"]}}
    assert lookahead.depth(-1, lookahead.build_facts(downloads, Tier.FAITHFUL),
                           Costs(new_candidate=10, lifetime=45)) == 2
    # the flag (or [artifacts] prefetch) wins
    assert lookahead.depth(3, lookahead.build_facts(demo_op, Tier.FAITHFUL), recipe_costs) == 3


@pytest.mark.parametrize("deterministic", [True, False])
def test_the_lookahead_holds_what_the_search_asks_next(deterministic: bool) -> None:
    """With K = 2 (both outcomes) every new candidate the search asks for was fetched ahead."""
    import numpy as np

    rng = np.random.default_rng(7)
    s = BayesianStrategy(65, Direction.FIX, confidence=0.99, deterministic=deterministic)
    flip = 23
    ahead: list[int] = []
    new_picks = hits = 0
    for _ in range(80):
        summary = s.summary()
        if summary.done and summary.total[0] and summary.total[64]:
            break
        try:
            choice = s.select()
        except NoCandidateLeft:  # bracketed: a deterministic probe has nothing left to run
            break
        if choice.position not in summary.at_hand:
            new_picks += 1
            hits += choice.position in ahead
        ahead = lookahead.picks_after(s, choice.position, 2, skip=[choice.position])
        assert len(ahead) <= 2 and choice.position not in ahead
        bug = choice.position < flip and (deterministic or rng.random() < 0.7)
        s.record(choice.position, bug)
    assert new_picks >= 5
    assert hits == new_picks - 1  # all but the very first, which nothing came before


# -- the demo-op recipe end to end --------------------------------------------------------------


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> DemoHistory:
    return generate(tmp_path_factory.mktemp("builds-history") / "repo")


def counting_recipe(tmp_path: Path, state: Path) -> tuple[Path, Path]:
    """demo-op.toml whose build command first notes its commit and whether the journal already
    holds the run's end (then it started after the answer was decided)."""
    counter = tmp_path / "builds.txt"
    text = recipe_mod.find("demo-op").read_text()
    text = re.sub(r"(?m)^\[artifacts\]$", f'[artifacts]\ncache_dir = "{tmp_path / "cache"}"',
                  text)
    # the brackets keep the pattern from matching itself in the journal's copy of the recipe
    ended = f"$(grep -c 'typ[e]..: .en[d].' {state}/journal.jsonl)"
    note = f"echo $(git rev-parse HEAD) {ended} >> {counter}; "
    text, n = re.subn(r'(?m)^build_command = "', f'build_command = "{note}', text)
    assert n == 1
    path = tmp_path / "demo-op.toml"
    path.write_text(text)
    recipe_mod.load(str(path))
    return path, counter


def _ends(state: Path) -> int:
    return sum(1 for e in journal_mod.read(state / journal_mod.JOURNAL_NAME).entries
               if e.get("type") == "end")


@pytest.mark.parametrize("prefetch", [None, 2], ids=["default", "prefetch-2"])
@pytest.mark.slow
def test_demo_op_builds_at_most_runs_plus_k_and_none_after_the_answer(
    history: DemoHistory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefetch: int | None
) -> None:
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    state = tmp_path / "state"
    recipe, counter = counting_recipe(tmp_path, state)
    flags = [] if prefetch is None else ["--prefetch", str(prefetch)]
    code, out, err = run_cli(
        "start", "--good", history.good_tag, "--bad", history.bad_tag, "--recipe", str(recipe),
        "--repo", str(history.repo), "--state-dir", str(state), "-q", *flags,
    )
    assert code == 0, out + err
    contents = journal_mod.read(state / journal_mod.JOURNAL_NAME)
    assert (contents.end or {}).get("summary", {}).get("flip_commit") == history.planted_commit
    builds = [line.split() for line in counter.read_text().splitlines()]
    runs = len(contents.observations)
    k = 0 if prefetch is None else prefetch  # demo-op's K: 0 (the op check keeps the CPUs busy)
    assert len(builds) <= runs + k, (len(builds), runs)
    assert all(after == "0" for _, after in builds), builds  # none began after the answer
    # every candidate that ran was built once, at most; no build was repeated
    run_commits = {o["commit"] for o in contents.observations}
    built = [sha for sha, _ in builds]
    assert len(built) == len(set(built))
    assert run_commits - set(history.broken_commits) <= set(built)
    if prefetch is None:
        assert set(built) <= run_commits  # no lookahead at all: only what a run asked for
    assert not list((tmp_path / "cache" / "tmp").iterdir())  # a cancelled build left nothing
    assert _ends(state) == 1
