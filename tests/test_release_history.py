"""The headline command on a history shaped like vLLM's (issue 37): every release on a branch
of its own, cut from main, with an RC tag, a bump and cherry-picks main never gets back
(/work/shared/vllm-facts.md, "How releases sit in the history": vLLM's RELEASE.md, #25476), so
no two release tags are on one line of history. Real git repositories
(``gitrepos.release_branches``) and real ``--run`` probes that judge a candidate by its files,
as a build's behaviour follows its sources; the CLI as a user types it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from gitrepos import ReleaseRepo, bisect, release_branches, run_cli, write_content_probe

from bisect_tool import journal as journal_mod
from bisect_tool.errors import NoAnswer, RangeError
from bisect_tool.range import resolve_range
from bisect_tool.values import Direction


@pytest.fixture(scope="module")
def vllm_like(tmp_path_factory: pytest.TempPathFactory) -> ReleaseRepo:
    return release_branches(tmp_path_factory.mktemp("releases") / "repo")


def test_release_tags_are_not_on_one_line_as_in_a_real_clone(vllm_like: ReleaseRepo) -> None:
    # the premise: `git merge-base --is-ancestor v0.26.0 v0.27.0` is false (vLLM #25476)
    import subprocess

    proc = subprocess.run(["git", "-C", str(vllm_like.path), "merge-base", "--is-ancestor",
                           "v0.26.0", "v0.27.0"], check=False)
    assert proc.returncode == 1


def test_release_tags_map_to_where_their_branches_left_main(vllm_like: ReleaseRepo) -> None:
    at = vllm_like.at
    for good, bad, direction in (("v0.27.0", "v0.26.0", Direction.FIX),
                                 ("v0.26.0", "v0.27.0", Direction.REGRESSION)):
        r = resolve_range(vllm_like.path, good, bad)
        assert r.direction is direction
        # the merge base (where v0.26.0's branch left main) stands in for the older end, then
        # main's first-parent commits up to v0.27.0's branch point, then v0.27.0's own branch
        expected = [at[f"m{i}"] for i in range(6, 15)] + [at["rc27"], at["pick15"], at["bump27"]]
        assert [c.sha for c in r.candidates] == expected
        assert r.merge_base == at["m6"] and r.old_end.stands_for == "v0.26.0"
        assert r.mainline == "refs/heads/main"
        assert [c.sha for c in r.tail] == [at["rc27"], at["pick15"], at["bump27"]]
        assert {c.branch for c in r.tail} == {"releases/v0.27.0"}
        assert all(c.on_mainline for c in r.candidates[:-3])
        # the cherry-pick without a trailer is found by its patch id
        assert r.candidates[-2].picked_from == at["m15"]
        assert r.new_end.tags == ("v0.27.0",) and r.candidates[-3].tags == ("v0.27.0rc1",)


def test_a_trailer_names_the_original_of_a_cherry_pick(vllm_like: ReleaseRepo) -> None:
    # v0.26.0 -> v0.26.1 is one release branch (a post release reuses it): one line
    r = resolve_range(vllm_like.path, "v0.26.1", "v0.26.0")
    assert r.merge_base == "" and r.direction is Direction.FIX
    assert [c.sha for c in r.candidates] == [vllm_like.at[k] for k in
                                             ("bump26", "pick10", "bump261")]
    assert r.candidates[1].picked_from == vllm_like.at["m10"]
    assert "the cherry-pick of " + vllm_like.at["m10"][:12] in r.candidates[1].provenance()


def test_the_path_filter_keeps_a_tails_compiled_change(vllm_like: ReleaseRepo) -> None:
    r = resolve_range(vllm_like.path, "v0.27.0", "v0.26.0", ["csrc/"])
    at = vllm_like.at
    assert [c.sha for c in r.candidates] == [at["m6"], at["m10"], at["m12"], at["pick15"],
                                             at["bump27"]]
    assert r.left_out == (("touch none of csrc/", 7),)


def test_mainline_is_chosen_as_documented(vllm_like: ReleaseRepo, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    import subprocess

    subprocess.run(["git", "clone", "-q", str(vllm_like.path), str(clone)], check=True)
    # a clone's main is the remote's: origin/HEAD names origin/main
    r = resolve_range(clone, "v0.27.0", "v0.26.0")
    assert r.mainline == "refs/remotes/origin/main" and r.merge_base == vllm_like.at["m6"]
    explicit = resolve_range(clone, "v0.27.0", "v0.26.0", mainline="origin/main")
    assert explicit.candidates == r.candidates
    with pytest.raises(RangeError,
                       match="--mainline: unknown ref 'origin/mian'; did you mean origin/main"):
        resolve_range(clone, "v0.27.0", "v0.26.0", mainline="origin/mian")


def _start(repo: ReleaseRepo, tmp_path: Path, good: str, bad: str, probe: str,
           *flags: str, process: bool = False) -> tuple[int, str, str, Path]:
    """``bisect start`` as typed (``process``: in a process of its own, whose argv the journal
    keeps, so the commands it prints are the user's)."""
    state = tmp_path / "state"
    argv = ("start", "--good", good, "--bad", bad, "--run", probe, "--repo", str(repo.path),
            "--state-dir", str(state), "-q", *flags)
    if process:
        proc = bisect(*argv)
        return proc.returncode, proc.stdout, proc.stderr, state
    code, out, err = run_cli(*argv)
    return code, out, err, state


@pytest.mark.parametrize("flags", [(), ("--deterministic",)])
@pytest.mark.parametrize(("good", "bad", "means", "word"), [
    ("v0.27.0", "v0.26.0", "good", "first good commit"),  # the fix (as #48391)
    ("v0.26.0", "v0.27.0", "bad", "first bad commit"),  # the same commit as a regression
])
def test_the_headline_command_names_the_main_commit(
    vllm_like: ReleaseRepo, tmp_path: Path, good: str, bad: str, means: str, word: str,
    flags: tuple[str, ...]
) -> None:
    probe = write_content_probe(tmp_path / "probe.py", marker_means=means)
    code, out, err, state = _start(vllm_like, tmp_path, good, bad, probe, *flags)
    assert code == 0, err
    assert out.startswith(f"{word}: {vllm_like.at['m10']}")
    runs = journal_mod.read(state / journal_mod.JOURNAL_NAME)
    # git's order: the merge base, standing in for the older end, is tested (v0.26.0 is not)
    tested = {o["commit"] for o in runs.observations}
    assert vllm_like.at["m6"] in tested and vllm_like.at["bump26"] not in tested
    assert runs.header["merge_base"] == vllm_like.at["m6"]


@pytest.mark.slow  # a whole intermittent bisect over the release history
def test_an_intermittent_probe_names_it_too(vllm_like: ReleaseRepo, tmp_path: Path) -> None:
    probe = write_content_probe(tmp_path / "probe.py", marker_means="good", p=0.6)
    code, out, err, _ = _start(vllm_like, tmp_path, "v0.27.0", "v0.26.0", probe)
    assert code == 0, err
    assert out.startswith(f"first good commit: {vllm_like.at['m10']}")


@pytest.mark.slow  # whole bisects over the release history
def test_a_fix_cherry_picked_onto_a_release_branch_is_named_with_its_main_original(
    vllm_like: ReleaseRepo, tmp_path: Path
) -> None:
    at = vllm_like.at
    # the fp8 fix landed on main after v0.27.0's cut and was picked onto its branch
    probe = write_content_probe(tmp_path / "probe.py", marker_means="good", marker="fp8 fix")
    code, out, err, _ = _start(vllm_like, tmp_path, "v0.27.0", "v0.26.0", probe)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"first good commit: {at['pick15']}")
    assert lines[1] == (f"  on releases/v0.27.0, not on the main line; the cherry-pick of "
                        f"{at['m15'][:12]}")
    code, report, err = run_cli("report", "--state-dir", str(tmp_path / "state"))
    assert code == 0, err
    assert (f"on `releases/v0.27.0`, not on the main line: the cherry-pick of "
            f"`{at['m15'][:7]}`") in report.splitlines()[2]
    assert (f"v0.26.0 (bad) .. v0.27.0 (good) from their merge base {at['m6'][:7]} (where "
            "v0.26.0's branch left main; git tests it first)") in report
    # and onto the older release's branch: v0.26.0 -> v0.26.1
    probe = write_content_probe(tmp_path / "probe2.py", marker_means="good")
    code, out, err, _ = _start(vllm_like, tmp_path / "b", "v0.26.1", "v0.26.0", probe)
    assert code == 0, err
    assert out.splitlines()[0].startswith(f"first good commit: {at['pick10']}")
    assert f"the cherry-pick of {at['m10'][:12]}" in out


def _printed_command(message: str) -> list[str]:
    return shlex.split(message.split("`")[1])


@pytest.mark.slow  # whole bisects over the release history
def test_a_merge_base_that_is_new_stops_and_names_the_branch_to_bisect(
    vllm_like: ReleaseRepo, tmp_path: Path
) -> None:
    # the bug is a change only v0.26.0's branch has (its bump sets branch.txt): the merge
    # base does not show it, so nothing between it and v0.27.0 fixed it (git: "the merge base
    # is new")
    at = vllm_like.at
    probe = write_content_probe(tmp_path / "probe.py", marker_means="bad", file="branch.txt",
                                marker="bug")
    code, out, err, _ = _start(vllm_like, tmp_path, "v0.27.0", "v0.26.0", probe, process=True)
    assert code == NoAnswer.exit_code == 9, err
    assert "the merge base is new" in err and f"the merge base {at['m6'][:12]}" in err
    assert err.count("\n") == 1
    # the command it prints runs as printed (the run's own flags, the ends swapped for the
    # merge base and v0.26.0) and finds the branch's own commit
    argv = _printed_command(err)
    assert argv[:2] == ["bisect", "start"] and argv[argv.index("--bad") + 1] == "v0.26.0"
    proc = bisect(*argv[1:])
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, err
    assert out.startswith(f"first bad commit: {at['bump26']}")


@pytest.mark.slow  # whole bisects over the release history
def test_a_merge_base_that_is_bad_stops_and_names_the_fix_on_the_older_branch(
    vllm_like: ReleaseRepo, tmp_path: Path
) -> None:
    # the bug is there until the fix; v0.26.1 has it picked, main's m9 does not: the merge
    # base m6 is bad (git: "the merge base is bad"), the fix is on v0.26.1's branch
    at = vllm_like.at
    probe = write_content_probe(tmp_path / "probe.py", marker_means="good")
    code, out, err, _ = _start(vllm_like, tmp_path, "v0.26.1", at["m9"], probe, process=True)
    assert code == 9, err
    assert "the merge base is bad" in err
    proc = bisect(*_printed_command(err)[1:])
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, err
    assert out.startswith(f"first good commit: {at['pick10']}")
    assert f"the cherry-pick of {at['m10'][:12]}" in out


def test_a_change_of_the_wheels_cuda_is_kept_by_the_recipes_path_filter(tmp_path: Path) -> None:
    # vLLM #39878 changed every wheel from the release pipeline, touching no source file: the
    # recipes' filters keep what a build reads, not only csrc/ (issue 37, item 4)
    from bisect_tool.demo.history import generate
    from bisect_tool.recipes import recipe as recipe_mod

    history = generate(tmp_path / "repo", commits=80)
    for name in ("demo", "demo-op", "demo-python"):
        paths = recipe_mod.load(name).range.paths
        shas = {c.sha for c in resolve_range(history.repo, "v0.27.0", "v0.26.0", paths)
                .candidates}
        assert history.cuda_switch in shas, name
    for name in ("batch-invariance", "batch-invariance-op"):
        paths = recipe_mod.load(name).range.paths
        assert {".buildkite/release-pipeline.yaml", "requirements/cuda.txt",
                "docker/Dockerfile", "csrc/"} <= set(paths)


def test_plan_says_where_the_range_sits(vllm_like: ReleaseRepo) -> None:
    code, out, err = run_cli("plan", "--good", "v0.27.0", "--bad", "v0.26.0", "--run", "true",
                             "--repo", str(vllm_like.path), "--path", "csrc/")
    assert code == 0, err
    lines = out.splitlines()
    assert "the bisect starts at their merge base " + vllm_like.at["m6"][:12] in lines[1]
    assert lines[2].startswith("  2 of 5 candidates live on releases/v0.27.0, not on main "
                               "(1 of them a cherry-pick of a main commit)")
    assert lines[3] == ("  left out 7 commits that touch none of csrc/: nothing a build reads "
                        "changed there, so their compiled files are their parent's")
    pick = next(line for line in lines if vllm_like.at["pick15"][:12] in line)
    assert pick.endswith(f"[on releases/v0.27.0, not on the main line; the cherry-pick of "
                         f"{vllm_like.at['m15'][:12]}]")


def test_the_next_step_after_releases_uses_the_recipe_that_reaches_commits() -> None:
    # a release-level run keeps only release wheels in its header's recipe; the command it
    # prints for the commits between two releases must name the recipe as the user gave it
    # (issue 41: "its recipe's sources refuse every commit without a release tag")
    from bisect_tool.recipes import recipe as recipe_mod
    from bisect_tool.report import span
    from bisect_tool.report.markdown import _next_line

    bundled = recipe_mod.load("batch-invariance").to_dict()
    run_copy = {**bundled, "artifacts": {**bundled["artifacts"], "sources": ["release", "local"]}}
    commits = [{"sha": "vllm-0.26.0", "tags": ["v0.26.0"], "index": 0},
               {"sha": "vllm-0.27.0", "tags": ["v0.27.0"], "index": 1}]
    answer = {"state": "done", "flip_block": [{"index": 1}], "direction": "fix"}
    header = {"commit_sources": bundled["artifacts"]["sources"]}
    got = span.releases(header, commits, answer, run_copy, bundled, "release")
    step = got["next_step"]
    assert step["command"] == ("bisect start --good v0.27.0 --bad v0.26.0 --recipe "
                               "batch-invariance") and step["reaches_commits"]
    # a recipe of the user's own that names no per-commit source: the line says what to add
    own = {**run_copy, "name": "mine", "source": "/home/u/mine.toml"}
    got = span.releases({}, commits, answer, own, None, "release")
    line = _next_line({"releases": got})
    assert "--recipe mine.toml" in line and 'add "wheel-index" or "source-build"' in line


def test_a_run_knows_which_commits_the_main_line_holds(vllm_like: ReleaseRepo) -> None:
    # the run's provider is given no facts: it asks the clone which commits main holds, so a
    # release branch's commit is "not on main" (#16217) and a main commit's 404 stays "not
    # published"; [range] mainline names another main line
    from bisect_tool.artifacts import commit_facts

    facts = commit_facts(vllm_like.path)
    at = vllm_like.at
    assert facts(at["m10"]).on_mainline is True
    assert facts(at["pick15"]).on_mainline is False
    assert facts(at["m10"]).committed_at  # read from the clone too
    on_release = commit_facts(vllm_like.path, mainline="releases/v0.27.0")
    assert on_release(at["pick15"]).on_mainline is True and not on_release(at["m15"]).on_mainline
    assert commit_facts(vllm_like.path / "nowhere")(at["m10"]).on_mainline is None
