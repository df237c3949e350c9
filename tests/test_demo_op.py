"""The focused op check on the demo's compiled RMSNorm (``[probe] op_abi = "ctypes"``).

The same machinery as vLLM's op probe (OpProbe -> op_child.py -> the JSON report ->
summarize_cases / op_verdict) on real gcc builds of demollm's ``_kernels.so``: the first 255 rows
of a 255-row launch against the same rows of a 300-row launch, bitwise, the check that settled
vLLM issue #51187. Before the planted fix (PR #48391) the launcher's block size follows the
launch size, so rows differ; after it, ``VLLM_BATCH_INVARIANT=1`` pins the block and none do.
Then the demo-op recipe end to end: ``bisect probe --commit`` and ``bisect start`` on a generated
demo history.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bisect_tool import journal as journal_mod
from bisect_tool.cli import main
from bisect_tool.demo.history import _BLOCK_LINE, _FIXED_BLOCK, DemoHistory, generate
from bisect_tool.demo.pinned import STACK_DIR, run_build
from bisect_tool.errors import RecipeError
from bisect_tool.probes import op_child
from bisect_tool.probes.op import CHILD_SCRIPT, OpProbe
from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict

SWITCH = {"VLLM_BATCH_INVARIANT": "1"}


def _build(root: Path, fixed: bool) -> Path:
    """A real gcc build of the demo kernel, as shipped (pre-fix) or with the planted fix."""
    tree = root / ("fixed" if fixed else "shipped")
    shutil.copytree(STACK_DIR, tree, ignore=shutil.ignore_patterns("_kernels.so*", "__pycache__"))
    if fixed:
        kernel = tree / "csrc" / "layernorm_kernels.c"
        source = kernel.read_text()
        assert _BLOCK_LINE in source  # the planted fix must still apply to the shipped kernel
        kernel.write_text(source.replace(_BLOCK_LINE, _FIXED_BLOCK))
    return run_build(tree)


@pytest.fixture(scope="session")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("demo-op-shipped"), fixed=False)


@pytest.fixture(scope="session")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("demo-op-fixed"), fixed=True)


@pytest.fixture
def no_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child inherits this process's environment: only the probe's env may set the switch."""
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)


def demo_settings() -> ProbeSettings:
    return recipe_mod.load("demo-op").probe


def probe(path: Path, env: dict[str, str] | None = None) -> tuple[Verdict, str, dict]:
    result = OpProbe(demo_settings()).run_extension(path, env)
    return result.verdict, result.message, result.detail


def _compile(tmp: Path, source: str) -> Path:
    src = tmp / "lib.c"
    src.write_text(source)
    so = tmp / "_kernels.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    return so


# -- the recipes and the settings


def test_demo_recipes_carry_the_op_settings() -> None:
    demo, demo_op = recipe_mod.load("demo"), recipe_mod.load("demo-op")
    assert demo.probe.kind == "server"  # `make demo` still runs the server probe
    assert demo_op.probe.kind == "op"
    p = demo.probe
    assert (p.ops, p.op_namespace, p.op_abi, p.dtypes, p.row_counts) == (
        ("rms_norm", "fused_add_rms_norm"), "_C", "ctypes", ("float32",), (255, 300))
    # The launcher's block is min(hidden, 1024 or 256): every size must be above 256 to show it.
    assert p.hidden_sizes and min(p.hidden_sizes) > 256
    op_keys = ("ops", "op_namespace", "op_abi", "dtypes", "hidden_sizes", "seeds", "row_counts")
    assert {k: getattr(demo_op.probe, k) for k in op_keys} == {
        k: getattr(p, k) for k in op_keys}  # one check, two recipes: they must not drift apart
    for key in ("swap_set", "build_command", "build_executor", "sources", "package"):
        assert getattr(demo_op.artifacts, key) == getattr(demo.artifacts, key)
    assert demo_op.range == demo.range and demo_op.runtime.env == demo.runtime.env


def test_op_abi_defaults_to_torch_and_reaches_the_child(tmp_path: Path) -> None:
    assert ProbeSettings().op_abi == "torch"
    assert recipe_mod.load("batch-invariance-op").probe.op_abi == "torch"
    torch_cmd = OpProbe(ProbeSettings()).command(tmp_path / "x.so")
    ctypes_cmd = OpProbe(demo_settings()).command(tmp_path / "x.so")
    assert torch_cmd[torch_cmd.index("--abi") + 1] == "torch"
    assert ctypes_cmd[ctypes_cmd.index("--abi") + 1] == "ctypes"


@pytest.mark.parametrize("value", ["cuda", "CTYPES", ""])
def test_an_unknown_op_abi_is_one_line_naming_the_allowed_values(
    tmp_path: Path, value: str
) -> None:
    path = tmp_path / "r.toml"
    path.write_text(f'name = "x"\n[probe]\nkind = "op"\nop_abi = "{value}"\n')
    with pytest.raises(RecipeError) as exc:
        recipe_mod.load(str(path))
    message = str(exc.value)
    assert "\n" not in message and "probe.op_abi" in message and str(path) in message
    assert "'torch'" in message and "'ctypes'" in message
    with pytest.raises(RecipeError, match="'torch', 'ctypes'"):
        recipe_mod.load("demo-op").override("probe", op_abi=value or "none")


# -- the check on real builds of the demo kernel


def test_shipped_kernel_diverges_naming_ops_and_sizes(shipped: Path, no_switch: None) -> None:
    verdict, message, detail = probe(shipped, SWITCH)
    assert verdict is Verdict.DIVERGENT, message
    hidden = demo_settings().hidden_sizes
    seeds = demo_settings().seeds
    for op in ("rms_norm", "fused_add_rms_norm"):
        for h in hidden:
            assert f"{op} float32 h{h}: {seeds}/{seeds}" in message
    assert detail["abi"] == "ctypes" and "torch" not in detail
    assert detail["env"] == SWITCH  # as the child saw it
    assert detail["device"] == "cpu" and detail["rng"].startswith("numpy")
    # Last-bit differences, not another formula: the reduction order moved.
    assert all(0 < g["max_abs_diff"] < 1e-5 for g in detail["groups"])


@pytest.mark.slow  # exhaustive: every case of both kernels
def test_fixed_kernel_is_clean_in_every_case_and_both_are_deterministic(
    shipped: Path, fixed: Path, no_switch: None
) -> None:
    first = probe(fixed, SWITCH)
    assert first[0] is Verdict.CLEAN, first[1]
    assert first[2]["differing"] == 0 and first[2]["total"] == 2 * 2 * demo_settings().seeds
    assert all(g["max_abs_diff"] == 0 for g in first[2]["groups"])
    assert probe(fixed, SWITCH) == first  # same cases, same bits, every run
    shipped_first = probe(shipped, SWITCH)
    assert probe(shipped, SWITCH) == shipped_first


@pytest.mark.parametrize("env", [None, pytest.param({"VLLM_BATCH_INVARIANT": "0"},
                                                  marks=pytest.mark.slow)],
                         ids=["unset", "zero"])
def test_without_the_switch_both_kernels_diverge(
    shipped: Path, fixed: Path, no_switch: None, env: dict[str, str] | None
) -> None:
    # The launch-size heuristic is on by design without VLLM_BATCH_INVARIANT, as in vLLM: the fix
    # pins the block only in batch-invariant mode.
    for path in (shipped, fixed):
        verdict, message, detail = probe(path, env)
        assert verdict is Verdict.DIVERGENT, message
        assert detail["differing"] == detail["total"]


@pytest.mark.slow  # op-probe children on two builds
def test_the_switch_comes_from_the_probe_env_not_from_a_cached_library(
    fixed: Path, no_switch: None
) -> None:
    # The library reads the switch once per process: alternating runs must not leak it.
    assert [probe(fixed, env)[0] for env in (SWITCH, None, SWITCH)] == [
        Verdict.CLEAN, Verdict.DIVERGENT, Verdict.CLEAN]


def test_a_library_lacking_an_op_is_untestable_naming_it(tmp_path: Path) -> None:
    so = _compile(tmp_path, r'''
#include <stdint.h>
const char *bisect_op_schemas(void) {
  return "_C::rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()\n";
}
int rms_norm(float *r, const float *x, const float *w, float e, int64_t n, int64_t h) {
  return 0;
}
''')
    verdict, message, _ = probe(so, SWITCH)
    assert verdict is Verdict.UNTESTABLE
    assert "registers no op _C::fused_add_rms_norm" in message and "_C::rms_norm" in message
    assert "fix: check the recipe's op names" in message and "\n" not in message


def test_a_library_without_schemas_or_with_other_signatures_is_untestable(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    bare = _compile(tmp_path / "bare", "int rms_norm(void) { return 0; }\n")
    verdict, message, _ = probe(bare, SWITCH)
    assert verdict is Verdict.UNTESTABLE and "declares no ops" in message
    (tmp_path / "other").mkdir()
    other = _compile(tmp_path / "other", r'''
const char *bisect_op_schemas(void) {
  return "_C::rms_norm(Tensor! result, Tensor input, float epsilon) -> ()\n"
         "_C::fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon)"
         " -> ()\n";
}
''')
    # Calling a C function with arguments it does not take corrupts memory instead of raising:
    # a schema the check does not know is refused before any call.
    verdict, message, _ = probe(other, SWITCH)
    assert verdict is Verdict.UNTESTABLE
    assert "_C::rms_norm is declared as '_C::rms_norm(Tensor! result, Tensor input, float " \
        "epsilon) -> ()'" in message


def test_a_file_that_is_not_a_library_is_untestable_in_one_line(tmp_path: Path) -> None:
    for name, data in (("text.so", b"not a shared library\n" * 50), ("empty.so", b"")):
        path = tmp_path / name
        path.write_bytes(data)
        verdict, message, detail = probe(path, SWITCH)
        assert verdict is Verdict.UNTESTABLE
        assert message.startswith(f"cannot load {path}: OSError: "), message
        assert "\n" not in message and "fix: " in message
        assert "bisect-op-" not in message  # the private copy's path is not what the user gave
        assert detail["error"]


def test_a_dtype_other_than_float32_is_untestable_naming_the_fix(shipped: Path) -> None:
    settings = recipe_mod.load("demo-op").override("probe", dtypes=("float16",)).probe
    result = OpProbe(settings).run_extension(shipped, SWITCH)
    assert result.verdict is Verdict.UNTESTABLE
    assert "float32 rows only, not float16" in result.message
    assert 'dtypes = ["float32"]' in result.message


def test_the_ctypes_child_imports_no_torch(
    shipped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A torch that refuses to be imported, first on the child's path: the ctypes path must not
    # touch it (a demo machine has no torch; a vLLM machine's torch must not load a C library).
    poison = tmp_path / "poison"
    poison.mkdir()
    (poison / "torch.py").write_text("raise SystemExit('torch was imported')\n")
    monkeypatch.setenv("PYTHONPATH", str(poison))
    verdict, message, detail = probe(shipped, SWITCH)
    assert verdict is Verdict.DIVERGENT, message
    s = demo_settings()
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    proc = subprocess.run(
        [sys.executable, str(CHILD_SCRIPT), "--json", "--library", str(shipped), "--abi",
         "torch", "--dtypes", "float32", "--hidden", str(s.hidden_sizes[0]), "--seeds", "1"],
        capture_output=True, text=True, check=False)
    assert "torch was imported" in proc.stderr  # the poison works: the torch path does import


@pytest.mark.parametrize(("which", "expected"), [("shipped", False), ("fixed", True)])
def test_the_child_runs_on_the_stdlib_alone(
    request: pytest.FixtureRequest, which: str, expected: bool, no_switch: None
) -> None:
    # -I -S: no site-packages at all, so no numpy: array('f') rows and random.Random inputs.
    path = request.getfixturevalue(which)
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(CHILD_SCRIPT), "--json", "--abi", "ctypes",
         "--library", str(path), "--dtypes", "float32", "--hidden", "384", "--seeds", "2"],
        capture_output=True, text=True, check=False, env={**os.environ, **SWITCH})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["rng"] == "random.Random(seed).gauss" and report["abi"] == "ctypes"
    assert "torch" not in report
    assert [c["equal"] for c in report["cases"]] == [expected] * 4
    assert all((c["max_abs_diff"] == 0) == expected for c in report["cases"])


def test_a_rebuilt_library_at_the_same_path_is_not_served_stale(
    shipped: Path, fixed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In one process, dlopen of a path already loaded returns the old library: the child loads a
    # private copy, so two candidates written to one path in turn are each really checked. Each
    # is moved into place, as setup.py and the artifact cache do (a new inode: rewriting the
    # mapped file in place would crash a process that still maps it).
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    path = tmp_path / "_kernels.so"
    args = argparse.Namespace(
        library=str(path), abi="ctypes", namespace="_C", ops=["rms_norm"], dtypes=["float32"],
        hidden=[384], seeds=1, rows=[255, 300], eps=1e-6, device="auto",
        report_env=["VLLM_BATCH_INVARIANT"])
    equal = []
    for build in (shipped, fixed, shipped):
        shutil.copyfile(build, tmp_path / "next.so")
        os.replace(tmp_path / "next.so", path)
        code, report = op_child.run(args)
        assert code == 0, report.get("error")
        equal.append(report["cases"][0]["equal"])
    assert equal == [False, True, False]


# -- end to end on a generated demo history


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> DemoHistory:
    # The demo's own size (`bisect demo` generates 300 commits).
    return generate(tmp_path_factory.mktemp("demo-op-history") / "repo")


def _exit_code(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """The CLI's exit status (a command that returns normally exits 0)."""
    try:
        main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    else:
        code = 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(("ref", "code", "verdict"), [("v0.26.0", 1, "DIVERGENT"),
                                                      ("v0.27.0", 0, "CLEAN")])
def test_probe_commit_with_the_demo_op_recipe(
    history: DemoHistory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], ref: str, code: int, verdict: str
) -> None:
    monkeypatch.setenv("BISECT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)  # the recipe's env sets it
    got, out, err = _exit_code(["probe", "--commit", ref, "--recipe", "demo-op",
                                "--repo", str(history.repo)], capsys)
    assert got == code, out + err
    assert f"\n{verdict}: " in out and f"({ref}): 1 lifetime" in out
    assert "| rms_norm | float32 | 2048 |" in out and ", ctypes, cpu, " in out


def completed_demo_op_recipe(path: Path, cache_dir: Path) -> Path:
    """demo-op.toml with this run's cache, as `bisect demo`'s write_recipe completes demo.toml.
    The op check runs no server, so the pinned stack's location is not needed."""
    text = recipe_mod.find("demo-op").read_text()
    text, n = re.subn(r"(?m)^\[artifacts\]$", f'[artifacts]\ncache_dir = "{cache_dir}"', text)
    assert n == 1
    path.write_text(text)
    recipe_mod.load(str(path))
    return path


@pytest.mark.slow
def test_bisect_start_with_the_demo_op_recipe_finds_the_planted_fix(
    history: DemoHistory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    recipe = completed_demo_op_recipe(tmp_path / "demo-op.toml", tmp_path / "cache")
    state = tmp_path / "state"
    started = time.monotonic()
    code, out, err = _exit_code(
        ["start", "--good", history.good_tag, "--bad", history.bad_tag, "--recipe", str(recipe),
         "--repo", str(history.repo), "--state-dir", str(state)], capsys)
    wall = time.monotonic() - started
    assert code == 0, out + err
    contents = journal_mod.read(state / journal_mod.JOURNAL_NAME)
    summary = (contents.end or {}).get("summary", {})
    assert summary.get("flip_commit") == history.planted_commit
    # Every op run says what its commit's kernel is: divergent before the fix, clean from it on
    # (the check is deterministic), untestable only where the build is broken.
    fix_at = history.first_parent.index(history.planted_commit)
    first_runs: list[float] = []
    repeats: list[float] = []
    seen: set[str] = set()
    for o in contents.observations:
        if o["verdict"] == "untestable":
            assert o["commit"] in history.broken_commits, o["message"]
            continue
        after_fix = history.first_parent.index(o["commit"]) >= fix_at
        assert o["verdict"] == ("clean" if after_fix else "divergent"), o
        (repeats if o["commit"] in seen else first_runs).append(float(o["duration_s"]))
        seen.add(o["commit"])
    # Measured, not asserted (2 cores, a benchmark beside us): shown with -s.
    print(f"\ndemo-op bisect: {len(contents.observations)} op runs on {len(seen)} candidates "
          f"(+{sum(o['verdict'] == 'untestable' for o in contents.observations)} untestable), "
          f"wall {wall:.1f}s; build + check {statistics.median(first_runs):.2f}s, check alone "
          f"{statistics.median(repeats) if repeats else float('nan'):.2f}s (medians)")
