"""The generated demo history has the promised shape, and the build command works on it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from bisect_tool.demo.history import (
    BAD_TAG,
    CUDA_SWITCH_TIME,
    GOOD_TAG,
    MODEL,
    PIPELINE,
    PLANTED_SUBJECT,
    default_cuda,
    generate,
    split_lm_head,
)
from bisect_tool.demo.ordinary import KERNEL
from bisect_tool.demo.pinned import STACK_DIR, ensure_pinned_build, read_op_schemas, run_build
from bisect_tool.errors import BuildFailed, UsageError

_BLOCK_HEURISTIC = "int max_block_size = (num_tokens < 256) ? 1024 : 256;"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return generate(tmp_path_factory.mktemp("hist") / "repo", seed=0, commits=300)


def checkout(history, ref: str, where: Path) -> Path:  # type: ignore[no-untyped-def]
    git(history.repo, "worktree", "add", "-q", "--detach", str(where), ref)
    return where


def test_shape_tags_merges_and_pr_numbers(history) -> None:  # type: ignore[no-untyped-def]
    repo = history.repo
    assert git(repo, "tag").split() == [BAD_TAG, f"{BAD_TAG}rc1", GOOD_TAG, f"{GOOD_TAG}rc1"]
    assert int(git(repo, "rev-list", "--count", "--all")) == 300
    assert git(repo, "rev-parse", "HEAD").strip() == history.main_commits[-1]
    main = git(repo, "rev-list", "--first-parent", "--reverse", "main").split()
    assert tuple(main) == history.main_commits
    line = git(repo, "rev-list", "--first-parent", "--reverse", GOOD_TAG).split()
    assert tuple(line) == history.first_parent
    merges = git(repo, "rev-list", "--merges", f"{BAD_TAG}..{GOOD_TAG}").split()
    assert len(merges) >= 5
    subjects = git(repo, "log", "--first-parent", "--format=%s", f"{BAD_TAG}..{GOOD_TAG}")
    with_pr = [
        s for s in subjects.splitlines()
        if re.search(r"\(#\d{5}\)$|^Merge pull request #|^\[Release\] Bump version to", s)
    ]
    assert len(with_pr) == len(subjects.splitlines())
    python_only = git(
        repo,
        "log",
        "--first-parent",
        "--format=%H",
        f"{BAD_TAG}..{GOOD_TAG}",
        "--",
        "demollm/",
        "docs/",
    ).split()
    compiled = set(
        git(
            repo,
            "log",
            "--first-parent",
            "--format=%H",
            f"{BAD_TAG}..{GOOD_TAG}",
            "--",
            "csrc/",
            "CMakeLists.txt",
            "setup.py",
        ).split()
    )
    assert len([c for c in python_only if c not in compiled]) > 50
    assert 60 < len(compiled) < 200
    # The Python-side regression is Python-only; the kernel fix is compiled.
    assert history.python_commit in python_only and history.python_commit not in compiled
    assert history.planted_commit in compiled


def test_releases_sit_on_branches_of_their_own_as_vllms_do(history) -> None:  # type: ignore[no-untyped-def]
    # vLLM's RELEASE.md (vllm-facts.md): each release is tagged on a branch cut from main, with
    # an RC tag, a bump and cherry-picks main never gets back; no two tags on one line
    repo = history.repo
    on_one_line = subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor",
                                  BAD_TAG, GOOD_TAG], check=False)
    assert on_one_line.returncode == 1
    assert git(repo, "merge-base", BAD_TAG, GOOD_TAG).strip() == history.merge_base
    assert git(repo, "merge-base", BAD_TAG, "main").strip() == history.merge_base
    for tag in (BAD_TAG, GOOD_TAG):
        branch = history.release_commits[tag]
        assert len(branch) == 3
        assert git(repo, "rev-parse", f"{tag}rc1^{{}}").strip() == branch[0]
        assert git(repo, "rev-parse", f"{tag}^{{}}").strip() == branch[-1]
        assert git(repo, "branch", "--contains", branch[-1]).split()[-1] == f"releases/{tag}"
        assert not set(branch) & set(history.main_commits)
    picks = dict(history.picks)
    (pick26,) = (c for c in picks if c in history.release_commits[BAD_TAG])
    (pick27,) = (c for c in picks if c in history.release_commits[GOOD_TAG])
    # 0.26's pick carries `git cherry-pick -x`'s trailer; 0.27's does not, but copies the patch
    assert f"(cherry picked from commit {picks[pick26]})" in git(repo, "log", "-1", pick26)
    assert "cherry picked" not in git(repo, "log", "-1", pick27)
    assert git(repo, "diff", f"{pick27}^", pick27) == git(repo, "diff", f"{picks[pick27]}^",
                                                          picks[pick27])
    assert picks[pick27] in history.main_commits  # landed on main after v0.27.0's cut
    cut = history.main_commits.index(git(repo, "merge-base", GOOD_TAG, "main").strip())
    assert history.main_commits.index(picks[pick27]) == cut + 1


def test_the_wheels_default_cuda_switches_once(history) -> None:  # type: ignore[no-untyped-def]
    # vLLM PR #39878 (2026-04-15): the default wheels went from CUDA 12.9 to 13.0
    repo = history.repo
    cuda = [default_cuda(git(repo, "show", f"{c}:{PIPELINE}")) for c in history.first_parent]
    at = history.first_parent.index(history.cuda_switch)
    assert cuda == ["12.9"] * at + ["13.0"] * (len(cuda) - at)
    when = int(git(repo, "log", "-1", "--format=%ct", history.cuda_switch))
    assert CUDA_SWITCH_TIME <= when < CUDA_SWITCH_TIME + 2 * 86_400
    merge_base = history.first_parent.index(history.merge_base)
    assert merge_base < at < history.first_parent.index(git(repo, "merge-base", GOOD_TAG,
                                                            "main").strip())


@pytest.mark.slow
def test_exactly_one_commit_pins_the_block_size(history) -> None:  # type: ignore[no-untyped-def]
    repo = history.repo
    flips = []
    for parent, child in zip(history.first_parent, history.first_parent[1:], strict=False):
        before = _BLOCK_HEURISTIC in git(repo, "show", f"{parent}:{KERNEL}")
        after = _BLOCK_HEURISTIC in git(repo, "show", f"{child}:{KERNEL}")
        if before != after:
            flips.append(child)
    assert flips == [history.planted_commit]
    guarded = [
        c
        for c in history.first_parent
        if "vllm_is_batch_invariant() ? 1024" in git(repo, "show", f"{c}:{KERNEL}")
    ]
    assert guarded[0] == history.planted_commit
    assert guarded == list(history.first_parent[history.first_parent.index(guarded[0]) :])
    assert git(repo, "log", "-1", "--format=%s", history.planted_commit).strip() == PLANTED_SUBJECT
    position = history.first_parent.index(history.planted_commit) / len(history.first_parent)
    assert 0.3 < position < 0.7


def test_old_end_is_the_pinned_stack(history) -> None:  # type: ignore[no-untyped-def]
    for name in (
        "csrc/layernorm_kernels.c",
        "csrc/batch_invariant.h",
        "setup.py",
        "CMakeLists.txt",
        MODEL,  # the stack ships without the Python-side regression
    ):
        assert git(history.repo, "show", f"{BAD_TAG}:{name}") == (STACK_DIR / name).read_text()


def test_new_end_has_the_python_side_regression(history) -> None:  # type: ignore[no-untyped-def]
    # v0.27.0's model.py is the stack's with exactly the planted edit (no other commit touches
    # it), and that edit is the generator's, PR number and all.
    text = git(history.repo, "show", f"{GOOD_TAG}:{MODEL}")
    subject = git(history.repo, "log", "-1", "--format=%s", history.python_commit)
    pr = int(re.findall(r"#(\d+)", subject)[-1])
    shipped = (STACK_DIR / MODEL).read_text()
    assert text == split_lm_head(shipped, pr) != shipped
    touching = git(history.repo, "log", "--format=%H", f"{BAD_TAG}..{GOOD_TAG}", "--", MODEL)
    assert touching.split() == [history.python_commit]


def test_the_python_change_asserts_its_anchors() -> None:
    with pytest.raises(AssertionError, match="anchor"):
        split_lm_head("SPLIT_K_BELOW = 64\n", 47001)


def test_build_command_works_on_both_tags(history, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert history.build_command == "python3 setup.py build_ext --inplace"
    built = {}
    for tag in (BAD_TAG, GOOD_TAG):
        tree = checkout(history, tag, tmp_path / tag)
        subprocess.run(history.build_command, shell=True, cwd=tree, check=True, capture_output=True)
        built[tag] = (tree / history.swap_set[0]).read_bytes()
        assert len(read_op_schemas(tree / history.swap_set[0])) == 2
    assert built[BAD_TAG] != built[GOOD_TAG]
    assert built[BAD_TAG] == ensure_pinned_build().read_bytes()  # same sources, same bytes


def test_some_commits_do_not_build(history, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert 2 <= len(history.broken_commits) <= 8
    assert history.planted_commit not in history.broken_commits
    for n, commit in enumerate(history.broken_commits[:2] + history.broken_commits[-1:]):
        tree = checkout(history, commit, tmp_path / f"b{n}")
        with pytest.raises(BuildFailed):
            run_build(tree)
    tree = checkout(history, history.planted_commit, tmp_path / "planted")
    assert run_build(tree).is_file()


def test_harmless_kernel_commits_give_distinct_binaries(history, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    revs = git(
        history.repo,
        "log",
        "--first-parent",
        "--format=%H",
        "--grep=launcher",
        f"{BAD_TAG}..{GOOD_TAG}",
    ).split()
    revs = [c for c in revs if c not in history.broken_commits][:3]
    digests = set()
    for n, commit in enumerate(revs):
        digests.add(run_build(checkout(history, commit, tmp_path / f"r{n}")).read_bytes())
    assert len(digests) == len(revs) >= 2


def test_deterministic_for_a_seed(history, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    again = generate(tmp_path / "again", seed=0, commits=300)
    assert again.first_parent == history.first_parent
    assert again.planted_commit == history.planted_commit
    assert again.python_commit == history.python_commit
    other = generate(tmp_path / "other", seed=1, commits=300)
    assert other.planted_commit != history.planted_commit
    assert other.python_commit != history.python_commit


def test_refuses_a_non_empty_directory_and_tiny_histories(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "file").write_text("")
    with pytest.raises(UsageError, match="not empty"):
        generate(tmp_path / "x")
    with pytest.raises(UsageError, match="at least 60"):
        generate(tmp_path / "y", commits=10)
