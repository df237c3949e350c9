"""`bisect plan` (= `bisect start --dry-run`) on the demo history, and starts that fail before
their first observation leaving nothing that refuses the next one (issue 31)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from gitrepos import run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.demo import pinned
from bisect_tool.demo.cli import write_recipe
from bisect_tool.demo.history import DemoHistory, generate
from bisect_tool.errors import InfrastructureError, NoAnswer
from bisect_tool.range import resolve_range
from bisect_tool.recipes import recipe as recipe_mod

SO = pinned.SWAP_PATH
#: a demo kernel whose rms_norm takes no weight: the pinned stack's gate must refuse it
OTHER_SCHEMA = r'''
const char *bisect_op_schemas(void) {
  return "_C::rms_norm(Tensor! result, Tensor input, float epsilon) -> ()\n"
         "_C::fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon)"
         " -> ()\n";
}
'''


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> DemoHistory:
    return generate(tmp_path_factory.mktemp("plan-history") / "repo")


@pytest.fixture
def demo(tmp_path: Path, history: DemoHistory) -> tuple[Path, list[str], str]:
    """The demo recipe over a cache holding both ends (the pinned build of the kernel) and one
    candidate in between whose kernel declares another rms_norm schema."""
    pinned.ensure_pinned_build()
    recipe = write_recipe(tmp_path / "demo.toml", tmp_path / "cache")
    shas = [c.sha for c in resolve_range(history.repo, history.good_tag, history.bad_tag,
                                         recipe_mod.load("demo").range.paths).candidates]
    cache = ArtifactCache(tmp_path / "cache")
    kernel = pinned.STACK_DIR / SO
    for sha in (shas[0], shas[-1]):
        cache.import_paths(sha, [kernel], [SO])
    other = tmp_path / "other" / "_kernels.so"
    other.parent.mkdir()
    (other.parent / "k.c").write_text(OTHER_SCHEMA)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(other), str(other.parent / "k.c")],
                   check=True)
    rejected = shas[len(shas) // 2]
    cache.import_paths(rejected, [other], [SO])
    return recipe, shas, rejected


def _files(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in root.rglob("*")}


# `plan` and `start --dry-run` on the demo's 300-commit history, each playing the run forward 16
# times: 13 s since the confirm step waits for the lifetimes' own evidence (the demo's p is low).
# The fast tier keeps test_plan_json_says_the_same_for_machines.
@pytest.mark.slow
def test_plan_lists_every_candidate_its_origin_the_gate_the_cost_and_the_environment(
    tmp_path: Path, history: DemoHistory, demo: tuple[Path, list[str], str]
) -> None:
    recipe, shas, rejected = demo
    state = tmp_path / "state"
    before = _files(tmp_path / "cache")
    args = ["--good", history.good_tag, "--bad", history.bad_tag, "--recipe", str(recipe),
            "--repo", str(history.repo), "--state-dir", str(state)]
    code, out, err = run_cli("plan", *args)
    assert code == 0, out + err
    lines = out.splitlines()
    assert lines[0].startswith(f"plan: {len(shas)} candidates from {history.good_tag} (good) "
                               f"to {history.bad_tag} (bad), looking for the first good one")
    rows = {line.split()[1]: line for line in lines if re.match(r"^\s+\d+ [0-9a-f]{12} ", line)}
    assert len(rows) == len(shas)  # every candidate, once
    for i, sha in enumerate(shas):
        row = rows[sha[:12]]
        assert row.split()[0] == str(i)
        if sha in (shas[0], shas[-1]):
            assert " cache " in row and row.endswith("gate: ok"), row
        elif sha == rejected:
            assert " cache " in row and "gate REJECTS" in row and "_C::rms_norm" in row, row
        else:
            assert " source build " in row and "gate" not in row, row
    assert f"  artifacts: 0 with a wheel, {len(shas) - 3} need a source build, 3 cache" in lines
    expected = "\n".join(lines[lines.index("") + 1:])
    assert "assumed p = 0.73, q = 0.01" in expected
    for what in ("op runs", "lifetimes", "(+1 for the controls)", "builds", "downloads",
                 "wall time about", "--prefetch 0"):
        assert what in expected, what
    env = {line.split()[0]: line for line in lines if line.startswith("  ") and ": " in line
           and line.split()[0] in ("interpreter", "pinned", "build")}
    assert set(env) == {"interpreter", "pinned", "build"}
    assert all(" ok: " in line for line in env.values()), env
    assert lines[-1] == "ready: `bisect start` with the same flags runs this"
    # nothing written: no state dir, no cache entry, not even the LRU stamps moved
    assert not state.exists()
    assert _files(tmp_path / "cache") == before
    # `start --dry-run` is the same command
    code, dry, err = run_cli("start", "--dry-run", *args)
    assert code == 0, err
    assert dry == out
    assert not state.exists()


def test_plan_json_says_the_same_for_machines(
    tmp_path: Path, history: DemoHistory, demo: tuple[Path, list[str], str]
) -> None:
    recipe, shas, rejected = demo
    code, out, err = run_cli(
        "plan", "--json", "--good", history.good_tag, "--bad", history.bad_tag, "--recipe",
        str(recipe), "--repo", str(history.repo), "--state-dir", str(tmp_path / "state"),
        "--p", "0.5", "--trials", "4",
    )
    assert code == 0, err
    plan = json.loads(out)
    assert plan["ready"] is True and plan["direction"] == "fix" and plan["level"] == "commit"
    assert [c["sha"] for c in plan["candidates"]] == shas
    origins = {c["sha"]: (c["origin"], c["gate"]) for c in plan["candidates"]}
    assert origins[shas[0]] == ("cache", "ok") and origins[shas[1]] == ("source build", "")
    assert origins[rejected][0] == "cache" and "_C::rms_norm" in origins[rejected][1]
    e = plan["expected"]
    assert e["trials"] == 4 and e["p"] == 0.5 and e["prefetch"] == 0
    assert e["op_runs"] > 0 and e["lifetimes"] > 0 and e["builds"] <= e["candidates"]
    assert {c["name"] for c in plan["environment"]} >= {"interpreter", "pinned stack"}


@pytest.mark.slow
def test_plan_of_the_demo_op_recipe_expects_what_a_run_spends(
    tmp_path: Path, history: DemoHistory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The op check is deterministic: the plan assumes p = 1 and counts op runs, no lifetimes;
    a real run of the recipe then spends about that (the same search)."""
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    from test_demo_op import completed_demo_op_recipe

    recipe = completed_demo_op_recipe(tmp_path / "demo-op.toml", tmp_path / "cache")
    args = ["--good", history.good_tag, "--bad", history.bad_tag, "--recipe", str(recipe),
            "--repo", str(history.repo), "--state-dir", str(tmp_path / "state")]
    code, out, err = run_cli("plan", "--json", *args)
    assert code == 0, err
    e = json.loads(out)["expected"]
    assert (e["p"], e["q"], e["lifetimes"], e["controls"]) == (1.0, 0.0, 0.0, 0)
    code, _, err = run_cli("start", *args, "-q")
    assert code == 0, err
    contents = journal_mod.read(tmp_path / "state" / journal_mod.JOURNAL_NAME)
    runs = len(contents.observations)
    # one flip, against the mean over flips anywhere: the same order, not the same number
    assert e["op_runs"] / 2 <= runs <= e["op_runs"] * 2, (runs, e["op_runs"])
    # the recipe is deterministic ([probe] deterministic): git bisect's bound, planned and spent
    n = len(json.loads(out)["candidates"])
    conclusive = [o for o in contents.observations if o["verdict"] != "untestable"]
    assert e["op_runs"] <= math.ceil(math.log2(n)) + 2
    assert len(conclusive) <= math.ceil(math.log2(n)) + 2, (len(conclusive), n)
    assert len({o["commit"] for o in contents.observations}) == runs  # none ran twice


def test_plan_of_a_run_command_lists_the_candidates(tmp_path: Path) -> None:
    from gitrepos import linear, write_probe

    repo = linear(tmp_path / "repo", 12, tag_every=4)
    command = write_probe(tmp_path / "probe.py", flip=7)
    code, out, err = run_cli("plan", "--good", "v0.1.0", "--bad", "v0.3.0", "--run",
                             command, "--repo", str(repo.path))
    assert code == 0, err
    assert "a worktree runs --run" in out and "(run mode)" in out
    assert "environment:" not in out  # nothing of a recipe's to check
    assert not (repo.path / ".git" / "bisect-tool").exists()


# -- the environment, and starts that fail before their first observation -------------------


def test_a_start_that_cannot_work_here_says_why_and_writes_no_journal(
    tmp_path: Path, history: DemoHistory
) -> None:
    from test_demo_op import completed_demo_op_recipe

    recipe = completed_demo_op_recipe(tmp_path / "demo-op.toml", tmp_path / "cache")
    text = recipe.read_text().replace("[runtime]\n", '[runtime]\npython = "/nonexistent/python3"\n')
    assert "/nonexistent/python3" in text
    recipe.write_text(text)
    state = tmp_path / "state"
    args = ["--good", history.good_tag, "--bad", history.bad_tag, "--repo", str(history.repo),
            "--state-dir", str(state)]
    code, out, err = run_cli("start", *args, "--recipe", str(recipe))
    assert code == InfrastructureError.exit_code, out + err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "interpreter: /nonexistent/python3 does not run; fix: set [runtime] python" in err
    assert not (state / journal_mod.JOURNAL_NAME).exists()
    # the plan says the same, as a line of its environment, and exits 8 too
    code, out, err = run_cli("plan", *args, "--recipe", str(recipe))
    assert code == InfrastructureError.exit_code
    assert "interpreter  missing: /nonexistent/python3 does not run" in out
    assert "not ready" in out and err.startswith("bisect: not ready: interpreter")
    # nothing refuses the next start
    code, out, err = run_cli("start", *args)
    assert code == 0, err
    assert out.startswith("next: ")


@pytest.mark.skipif(
    bool(importlib.util.find_spec("torch") and importlib.util.find_spec("transformers")),
    reason="this interpreter can make the random checkpoint",
)
def test_a_random_checkpoint_without_torch_is_refused_before_the_journal(
    tmp_path: Path, history: DemoHistory
) -> None:
    """Issue 31's case: the run wrote its journal, then failed for lack of torch (exit 8), and
    the next start was refused until `bisect reset`."""
    pinned.ensure_pinned_build()
    recipe = write_recipe(tmp_path / "demo.toml", tmp_path / "cache")
    text = recipe.read_text()
    text = re.sub(r"(?m)^\[runtime\]$", '[runtime]\nweights = "random:models/qwen3-0.6b"', text)
    recipe.write_text(text)
    state = tmp_path / "state"
    args = ["--good", history.good_tag, "--bad", history.bad_tag, "--repo", str(history.repo),
            "--state-dir", str(state)]
    code, _, err = run_cli("start", *args, "--recipe", str(recipe))
    assert code == InfrastructureError.exit_code, err
    assert "weights: the random checkpoint from" in err and "pip install" in err
    assert not (state / journal_mod.JOURNAL_NAME).exists()
    code, out, err = run_cli("start", *args)
    assert code == 0 and out.startswith("next: "), err


@pytest.mark.slow
def test_a_start_whose_builds_all_fail_says_why_and_blocks_no_next_start(
    tmp_path: Path, history: DemoHistory
) -> None:
    """The environment is fine, but every build fails: the fast probe finds every candidate
    untestable before any lifetime boots, and the run ends naming the build's failure (the
    journal keeps those observations, with an end entry, so nothing refuses the next start)."""
    pinned.ensure_pinned_build()
    recipe = write_recipe(tmp_path / "demo.toml", tmp_path / "cache")
    text = re.sub(r'(?m)^build_command = .*$', 'build_command = "exit 3"', recipe.read_text())
    recipe.write_text(text)
    state = tmp_path / "state"
    args = ["--good", history.good_tag, "--bad", history.bad_tag, "--repo", str(history.repo),
            "--state-dir", str(state)]
    code, _, err = run_cli("start", *args, "--recipe", str(recipe), "-q")
    assert code == NoAnswer.exit_code and "Traceback" not in err, err
    assert "untestable (" in err and "build of" in err and "failed (exit 3)" in err
    assert (state / "logs").is_dir()  # the build logs stay: they say why
    code, out, err = run_cli("start", *args)
    assert code == 0 and out.startswith("next: "), err


def test_a_start_with_observations_keeps_its_journal_for_resume(tmp_path: Path) -> None:
    """The other side of the line: once something was observed, a failure keeps the journal
    (`bisect resume` goes on from it), as before."""
    from gitrepos import linear

    repo = linear(tmp_path / "repo", 8, tag_every=4)
    marker = tmp_path / "ran-once"
    # the first run answers; the second kills itself: abort (exit >= 128), as git bisect run
    command = f"if [ -e {marker} ]; then kill -9 $$; fi; touch {marker}; exit 0"
    state = tmp_path / "state"
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--run",
                           command, "--repo", str(repo.path), "--state-dir", str(state))
    assert code != 0 and "killed by SIGKILL" in err, err
    contents = journal_mod.read(state / journal_mod.JOURNAL_NAME)
    assert len(contents.observations) == 1


@pytest.mark.slow
def test_plan_of_a_release_bisect_names_each_release_wheel_and_downloads_none(
    tmp_path: Path, demollm_index: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each release's wheel is named from the index's listing; none is downloaded."""
    from test_release_run import release_recipe

    monkeypatch.setenv("PIP_INDEX_URL", demollm_index.index_url)
    recipe = release_recipe(tmp_path, tmp_path / "cache")
    args = ["--releases", "--good", "0.27.0", "--bad", "v0.25.0", "--recipe", str(recipe),
            "--state-dir", str(tmp_path / "state")]
    code, out, err = run_cli("plan", "--json", *args)
    assert code == 0, out + err
    plan = json.loads(out)
    assert plan["level"] == "release"
    assert [c["sha"] for c in plan["candidates"]] == [
        "demollm-0.25.0", "demollm-0.25.1", "demollm-0.26.0", "demollm-0.27.0"]
    for c in plan["candidates"]:
        assert c["origin"] == "release wheel" and c["detail"].endswith(".whl"), c
    assert not [p for p in demollm_index.gets if p.endswith(".whl")]  # nothing downloaded
    assert not (tmp_path / "state").exists()
    assert plan["expected"]["downloads"] > 0 and plan["expected"]["builds"] == 0


@pytest.mark.slow  # statistical: simulated searches of the H100 record
def test_the_plan_counts_the_controls_off_the_lifetimes_slots_where_they_have_their_own() -> None:
    """The H100 record's header, planned on two slots: with ``controls_own_slot`` the controls'
    lifetime leaves the lifetimes' slots alone, so the expected wall time drops by half a
    lifetime (and nothing else changes)."""
    import copy

    from bisect_tool.run.plan import simulate

    record = Path(__file__).parents[1] / "docs/bench/gpu-2026-12-07-h100/journal-tiered.jsonl"
    header = journal_mod.read(record).header
    own = copy.deepcopy(dict(header))
    own["recipe"]["runtime"]["controls_own_slot"] = True
    shared = simulate(header, p=0.75, q=0.0, trials=16, slots=2)
    apart = simulate(own, p=0.75, q=0.0, trials=16, slots=2)
    assert (shared.lifetimes, shared.controls) == (apart.lifetimes, apart.controls)
    cost = float(header["recipe"]["search"]["cost_lifetime"])
    assert shared.wall_s - apart.wall_s == pytest.approx(cost / 2)


@pytest.mark.slow  # a whole `plan` of the demo recipe over a real index, searches simulated
def test_plan_says_which_candidates_have_a_wheel_which_need_a_build_and_the_bytes(
    tmp_path: Path, history: DemoHistory, demo: tuple[Path, list[str], str],
    demollm_wheels: Any,
) -> None:
    """Issue 37: `bisect plan` over a per-commit wheel index laid out as vLLM's (some commits
    published, others not): one metadata.json a candidate, how many have a wheel and how many
    need a build, and the bytes the member fetch will move, read from one central directory."""
    from wheelindex import make_demollm_wheel

    from bisect_tool.artifacts.wheelhost import HostedCommit, WheelHost

    recipe, shas, _ = demo
    text = recipe.read_text().replace('sources = ["source-build"]',
                                      'sources = ["wheel-index", "source-build"]')
    built = tmp_path / "built"

    def build(commit: str, variant: str) -> Path:
        return make_demollm_wheel("0.27.0.dev5", demollm_wheels.kernels["prefix"],
                                  built / commit[:8])

    published = shas[1:5]
    with WheelHost(build, package="demollm") as host:
        host.add(*(HostedCommit(sha) for sha in published))
        recipe.write_text(text.replace("[artifacts]", f'[artifacts]\nwheel_index_url = '
                                       f'"{host.url}"', 1))
        code, out, err = run_cli(
            "plan", "--good", history.good_tag, "--bad", history.bad_tag, "--recipe",
            str(recipe), "--repo", str(history.repo), "--state-dir", str(tmp_path / "state"))
        asked = host.asked()
        ranges = host.ranges()
    assert code == 0, out + err
    lines = out.splitlines()
    # the ends and the rejected one are in the cache: every other candidate asked once
    uncached = len(shas) - 3
    assert sum(p.endswith("/demollm/metadata.json") for p in asked) == uncached
    assert f"  artifacts: {len(published)} with a wheel, {uncached - len(published)} need a " \
        "source build, 3 cache" in lines
    # v0.27.0's branch holds one candidate beside its tagged end: vLLM publishes no wheel for it
    assert any(line.startswith(f"    no wheel (not published): {uncached - len(published) - 1}"
                               ", e.g. no wheel at ") for line in lines), out
    assert "    no wheel (not on main): 1, e.g. not on main: vLLM publishes per-commit wheels " \
        "for main's commits only (vLLM #16217)" in lines, out
    assert ranges[0] == "bytes=-42" and len(ranges) == 2  # one central directory, no member
    wheel = build(published[0], "")
    with zipfile.ZipFile(wheel) as archive:
        member = archive.getinfo(SO).compress_size
    fetch_line = next(line for line in lines if line.startswith("  bytes to fetch: about "))
    assert f"for {len(published)} candidate(s)" in fetch_line
    assert f"{member / 1000:.1f} KB of swap-set members" in fetch_line
    assert f"an estimate: read from the wheel of {published[0][:12]}" in fetch_line


@pytest.mark.slow  # a whole `plan` of the demo recipe, its searches simulated
def test_plan_run_inside_a_clone_checks_the_pinned_stack_not_the_clones_package(
    tmp_path: Path, history: DemoHistory, demo: tuple[Path, list[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 41: `bisect plan` asked the pinned interpreter from the caller's folder, so inside a
    clone (`python -c` puts the cwd first on sys.path) it found the clone's own uncompiled
    package and said "ready" where `start` then failed. It asks as the runtime does."""
    from bisect_tool.recipes import recipe as recipe_mod
    from bisect_tool.run import preflight
    from bisect_tool.runtime.environment import environment_facts

    recipe_path, _, _ = demo
    clone = tmp_path / "clone"
    (clone / "demollm").mkdir(parents=True)
    (clone / "demollm" / "__init__.py").write_text("# the clone's sources: nothing compiled\n")
    (clone / "demollm-9.9.dist-info").mkdir()
    (clone / "demollm-9.9.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: demollm\nVersion: 9.9\n")
    monkeypatch.chdir(clone)
    recipe = recipe_mod.load(str(recipe_path))
    stack = next(c for c in preflight.environment(recipe) if c.name == "pinned stack")
    assert stack.ok and str(pinned.STACK_DIR) in stack.detail, stack.line()
    assert str(clone) not in stack.detail, stack.line()
    # the report's environment block asks the same way: not the clone's version
    assert environment_facts(recipe).get("pinned_version") != "9.9"
    code, out, err = run_cli("plan", "--good", history.good_tag, "--bad", history.bad_tag,
                             "--recipe", str(recipe_path), "--repo", str(history.repo),
                             "--state-dir", str(tmp_path / "state"))
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.strip().startswith("pinned stack"))
    assert str(clone) not in line and str(pinned.STACK_DIR) in line, line
