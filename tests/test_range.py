"""The commit range on real git repositories: refs, direction, first-parent candidates, path
filter, and one-line errors for every bad range."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gitrepos import Repo, init, linear, with_merges

from bisect_tool.errors import RangeError
from bisect_tool.range import resolve_range
from bisect_tool.values import Direction


@pytest.fixture(scope="module")
def lin(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    repo = linear(tmp_path_factory.mktemp("lin") / "repo", 12, tag_every=4, touch=(6, 9))
    repo.git("branch", "feature", repo.main[9])
    return repo


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return with_merges(tmp_path_factory.mktemp("merged") / "repo")


def test_tags_branches_and_shas_resolve(lin: Repo) -> None:
    by_tag = resolve_range(lin.path, "v0.1.0", "v0.3.0")
    assert (by_tag.good, by_tag.bad) == (lin.main[3], lin.main[11])
    by_branch = resolve_range(lin.path, "v0.1.0", "feature")
    assert by_branch.bad == lin.main[9]
    short = resolve_range(lin.path, lin.main[1][:8], lin.main[5])
    assert (short.good, short.bad) == (lin.main[1], lin.main[5])
    assert short.good_ref == lin.main[1][:8]


def test_regression_candidates_are_the_range_old_end_first(lin: Repo) -> None:
    r = resolve_range(lin.path, "v0.1.0", "v0.3.0")
    assert r.direction is Direction.REGRESSION
    assert [c.sha for c in r.candidates] == lin.main[3:12]
    assert r.old_end.tags == ("v0.1.0",) and r.new_end.tags == ("v0.3.0",)
    assert r.candidates[1].subject == "commit 5 (#1005)" and r.candidates[1].pr == 1005


def test_good_newer_than_bad_is_a_fix(lin: Repo) -> None:
    # as `bisect start --good v0.27.0 --bad v0.26.0`: the bug was fixed in between
    r = resolve_range(lin.path, "v0.3.0", "v0.2.0")
    assert r.direction is Direction.FIX
    assert r.old_end.sha == lin.main[7] and r.new_end.sha == lin.main[11]
    assert [c.sha for c in r.candidates] == lin.main[7:12]


def test_merge_is_one_candidate_and_branch_commits_are_not(merged: Repo) -> None:
    r = resolve_range(merged.path, "v0.1.0", "v0.2.0")
    shas = [c.sha for c in r.candidates]
    assert shas == merged.main
    assert not set(shas) & set(merged.side)
    assert [c.pr for c in r.candidates if c.subject.startswith("Merge")] == [2000, 2001, 2002]


def test_path_filter_keeps_commits_touching_paths(lin: Repo, merged: Repo) -> None:
    r = resolve_range(lin.path, "v0.1.0", "v0.3.0", ["csrc/"])
    # the two ends always stay; in between only commits 6 and 9 touch csrc/
    assert [c.sha for c in r.candidates] == [lin.main[i] for i in (3, 5, 8, 11)]
    # a merge touches csrc/ through its branch: it is kept, its branch commits are not
    m = resolve_range(merged.path, "v0.1.0", "v0.2.0", ["csrc"])
    merge_of_b1 = merged.main[3]
    assert [c.sha for c in m.candidates] == [merged.main[0], merge_of_b1, merged.main[-1]]
    file_filter = resolve_range(lin.path, "v0.1.0", "v0.3.0", ["csrc/kernel.cu"])
    assert len(file_filter.candidates) == 4


def _one_line(exc: pytest.ExceptionInfo[RangeError]) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


def test_unknown_ref_suggests_near_tags(lin: Repo) -> None:
    with pytest.raises(RangeError) as exc:
        resolve_range(lin.path, "v0.2", "v0.3.0")
    text = _one_line(exc)
    assert "unknown ref 'v0.2'" in text and "did you mean v0.2.0" in text
    with pytest.raises(RangeError) as exc:
        resolve_range(lin.path, "v0.1.0", "deadbeef1234")
    assert "unknown ref 'deadbeef1234'" in _one_line(exc)


def test_same_commit_twice(lin: Repo) -> None:
    with pytest.raises(RangeError) as exc:
        resolve_range(lin.path, "v0.2.0", lin.main[7])
    assert "same commit" in _one_line(exc)


def test_diverged_ends_bisect_from_their_merge_base_as_git_does(tmp_path: Path) -> None:
    # neither end is an ancestor of the other: git bisect tests their merge base first and
    # the candidates are the commits reachable from the newer end only
    repo = linear(tmp_path / "repo", 3)
    repo.git("checkout", "-q", "-b", "other", repo.main[0])
    other = repo.commit("diverged", {"g": "1\n"})
    # "other" left main at its first commit, before main[2]: it is the older end (a fix
    # search, the bad end older), and main[0] stands in for it
    r = resolve_range(repo.path, repo.main[2], other)
    assert r.direction is Direction.FIX
    assert [c.sha for c in r.candidates] == repo.main[:3]
    assert r.merge_base == repo.main[0] and r.old_end.stands_for == other
    # the other way round, "other" is the newer end's branch and its tail is off main
    r = resolve_range(repo.path, other, repo.main[0])
    assert [c.sha for c in r.candidates] == [repo.main[0], other]
    assert r.merge_base == "" and r.new_end.branch == "other" and not r.old_end.branch


def test_ends_that_share_no_history(tmp_path: Path) -> None:
    repo = linear(tmp_path / "repo", 3)
    repo.git("checkout", "-q", "--orphan", "unrelated")
    other = repo.commit("a root of its own", {"g": "1\n"})
    with pytest.raises(RangeError) as exc:
        resolve_range(repo.path, repo.main[2], other)
    assert "share no history" in _one_line(exc)


def test_not_a_git_repository(tmp_path: Path) -> None:
    with pytest.raises(RangeError) as exc:
        resolve_range(tmp_path, "a", "b")
    assert "not a git repository" in _one_line(exc)


def test_path_filter_leaving_nothing(lin: Repo) -> None:
    with pytest.raises(RangeError) as exc:
        resolve_range(lin.path, "v0.1.0", "v0.3.0", ["no/such/dir"])
    assert "touches no/such/dir" in _one_line(exc)


def test_empty_repository_is_a_range_error(tmp_path: Path) -> None:
    repo = init(tmp_path / "empty")
    with pytest.raises(RangeError) as exc:
        resolve_range(repo.path, "main", "HEAD")
    assert "unknown ref" in _one_line(exc)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--good", "v0.2", "--bad", "v0.3.0"], "did you mean v0.2.0"),
        (["--good", "v0.2.0", "--bad", "v0.2.0"], "same commit"),
        (["--good", "v0.1.0", "--bad", "v0.3.0", "--path", "nothing/"], "touches nothing/"),
    ],
)
def test_cli_range_errors_are_one_line(lin: Repo, tmp_path: Path, args: list[str],
                                       needle: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bisect_tool", "start", *args, "--repo", str(lin.path),
         "--state-dir", str(tmp_path / "state")],
        capture_output=True, text=True,
    )
    assert proc.returncode == RangeError.exit_code
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_not_a_git_repository(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bisect_tool", "start", "--good", "a", "--bad", "b",
         "--repo", str(tmp_path)],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().startswith("bisect:") and "not a git repository" in proc.stderr
    assert proc.stderr.count("\n") == 1
