"""The op check's schema-planned cases (issue 40): vLLM's quantized RMSNorm ops (#48997) and the
fused-MoE path's compiled ops (#57016). No GPU and no torch here, so the plans are checked
against the real schema texts as plain values, and the case runner runs whole on a small numpy
stand-in for the few torch calls it makes, with ops whose reduction depends on the launch size
the way the seed's kernel did (the GPU run is scripts/gpu/issue40.sh's `ops` step)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bisect_tool.interfaces import ProbeResult, SwapSet
from bisect_tool.probes.op import CHILD_SCRIPT, OpProbe
from bisect_tool.probes.op_cases import (
    GROUP_SIZE,
    TOPK,
    VLLM_SCHEMAS,
    Arg,
    PlanError,
    parse_schema,
    plan_call,
    run_schema_case,
)
from bisect_tool.probes.op_child import compare_rows
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict

# As torch prints a registered schema (str(op.default._schema)): aliases instead of bare "!"
TORCH_PRINTED = (
    "_C::rms_norm_per_block_quant(Tensor(a!) result, Tensor input, Tensor weight, "
    "Tensor(b!) scale, float epsilon, Tensor? scale_ub, Tensor(c!)? residual, SymInt group_size, "
    "bool is_scale_transposed) -> ()"
)


def test_the_schemas_read_as_the_bindings_define_them_and_as_torch_prints_them() -> None:
    name, args = parse_schema(VLLM_SCHEMAS["fused_add_rms_norm_static_fp8_quant"])
    assert name == "fused_add_rms_norm_static_fp8_quant"
    assert [(a.name, a.written) for a in args] == [
        ("result", True), ("input", False), ("residual", True), ("weight", False),
        ("scale", False), ("epsilon", False)]
    name, args = parse_schema(TORCH_PRINTED)
    assert name == "_C::rms_norm_per_block_quant"
    assert [a.name for a in args if a.written] == ["result", "scale", "residual"]
    assert Arg("residual", "Tensor?", True) in args and Arg("scale_ub", "Tensor?", False) in args
    _, args = parse_schema(
        "topk_softmax(Tensor! topk_weights, Tensor! topk_indices, Tensor gating_output, "
        "bool renormalize, float moe_softcapping, Tensor? correction_bias) -> ()")
    assert [a.name for a in args] == ["topk_weights", "topk_indices", "gating_output",
                                      "renormalize", "moe_softcapping", "correction_bias"]
    with pytest.raises(PlanError, match="cannot read argument"):
        parse_schema("f(Tensor! , int x) -> ()")


def test_the_schemas_read_as_torch_2_11_prints_a_stable_abi_op() -> None:
    # as the H100 printed vLLM 0.26.0's (docs/bench/gpu-2026-12-07b-h100): the alias set holds
    # "->", and the three quant ops went unchecked before
    printed = ("_C::rms_norm_per_block_quant(Tensor($0! -> ) result, Tensor input, Tensor weight, "
               "Tensor($1! -> ) scale, float epsilon, Tensor? scale_ub, Tensor($2! -> )? residual, "
               "int group_size, bool is_scale_transposed) -> ()")
    name, args = parse_schema(printed)
    assert name == "_C::rms_norm_per_block_quant"
    assert [a.name for a in args if a.written] == ["result", "scale", "residual"]
    assert Arg("residual", "Tensor?", True) in args and len(args) == 9
    _, args = parse_schema("_C::rms_norm_static_fp8_quant(Tensor($0! -> ) result, Tensor input, "
                           "Tensor weight, Tensor scale, float epsilon) -> ()")
    assert [(a.name, a.written) for a in args] == [
        ("result", True), ("input", False), ("weight", False), ("scale", False),
        ("epsilon", False)]
    # the MoE pair, as printed there too: optional arguments with defaults
    _, args = parse_schema("_moe_C::moe_sum(Tensor input, Tensor($0! -> ) output, Tensor? "
                           "topk_ids=None, Tensor? expert_map=None) -> ()")
    assert [(a.name, a.type, a.written) for a in args] == [
        ("input", "Tensor", False), ("output", "Tensor", True), ("topk_ids", "Tensor?", False),
        ("expert_map", "Tensor?", False)]


def test_a_call_follows_the_registered_schema_and_compares_what_it_writes() -> None:
    values = {"result": "R", "input": "X", "weight": "W", "scale": "S", "epsilon": 1e-6,
              "residual": None, "scale_ub": None, "group_size": 128,
              "is_scale_transposed": False}
    _, args = parse_schema(TORCH_PRINTED)
    call, written = plan_call("rms_norm_per_block_quant", args, values)
    assert call == ["R", "X", "W", "S", 1e-6, None, None, 128, False]
    assert written == ["result", "scale"]  # no residual passed: nothing of it to compare
    _, args = parse_schema(VLLM_SCHEMAS["rms_norm_static_fp8_quant"])
    call, written = plan_call("rms_norm_static_fp8_quant", args, values)
    assert call == ["R", "X", "W", "S", 1e-6] and written == ["result"]
    # a commit whose schema asks for something the check cannot give says so, naming it
    _, args = parse_schema("rms_norm_static_fp8_quant(Tensor! result, Tensor input, "
                           "Tensor weight, Tensor scale, float epsilon, int num_sms) -> ()")
    with pytest.raises(PlanError, match="no value for argument 'num_sms' \\(int\\)"):
        plan_call("rms_norm_static_fp8_quant", args, values)


def test_topk_softmax_s_launch_sized_indices_are_not_compared() -> None:
    """vLLM writes ``token_expert_indices`` as ``k_idx * num_rows + row``: it differs between a
    255-row and a 300-row launch on every build (the H100 read it as a divergence, 8 of 8, on
    0.26.0 and 0.27.0 alike). The weights and the experts chosen are compared."""
    _, args = parse_schema(VLLM_SCHEMAS["topk_softmax"])
    values = {a.name: a.name.upper() for a in args}
    _, written = plan_call("_moe_C::topk_softmax", args, values)
    assert "token_expert_indices" not in written
    assert {"topk_weights", "topk_indices"} <= set(written)


# ---- the whole case on a numpy stand-in of the torch calls it makes ----------------------------


class T(np.ndarray):
    """An ndarray with the few tensor methods the case runner calls."""

    def clone(self) -> T:
        return self.copy()

    def to(self, device: str | None = None, dtype: Any = None) -> T:
        return self.astype(dtype).view(T) if dtype is not None else self


class Gen:
    def manual_seed(self, seed: int) -> Gen:
        self.rng = np.random.default_rng(seed)
        return self


class FakeTorch:
    float32, float16, int32 = np.float32, np.float16, np.int32
    bfloat16 = np.float32  # numpy has no bf16: what is checked here is the plumbing
    float8_e4m3fn = np.float16

    @staticmethod
    def Generator(device: str = "cpu") -> Gen:  # noqa: N802 (torch's name)
        return Gen()

    @staticmethod
    def randn(*shape: int, generator: Gen) -> T:
        return generator.rng.standard_normal(shape).astype(np.float32).view(T)

    @staticmethod
    def empty(*shape: int, device: str = "cpu", dtype: Any = np.float32) -> T:
        fill = np.nan if np.issubdtype(dtype, np.floating) else -1
        return np.full(shape, fill, dtype=dtype).view(T)

    @staticmethod
    def tensor(data: list[float], device: str = "cpu", dtype: Any = np.float32) -> T:
        return np.asarray(data, dtype=dtype).view(T)


def launch_sized_norm(x: np.ndarray) -> np.ndarray:
    """1/rms of each row, reduced in blocks chosen by the launch size (the seed's heuristic:
    1024 lanes below 256 rows, 256 from there on)."""
    block = 1024 if len(x) < 256 else 256
    squares = (x.astype(np.float32) ** 2)
    partial = [squares[:, i::block].sum(axis=1, dtype=np.float32) for i in range(block)]
    total = np.zeros(len(x), np.float32)
    for p in partial:
        total += p
    return 1.0 / np.sqrt(total / np.float32(x.shape[1]) + np.float32(1e-6))


def static_quant(pinned: bool) -> Any:
    """rms_norm_static_fp8_quant's stand-in: pinned, each row's reduction is the same in any
    launch (the fix); else it follows the launch size (the bug)."""
    def op(result: T, x: T, weight: T, scale: T, eps: float) -> None:
        if pinned:
            inv = 1.0 / np.sqrt((x.astype(np.float32) ** 2).mean(axis=1) + np.float32(eps))
        else:
            inv = launch_sized_norm(x)
        result[...] = (x * inv[:, None] * weight / scale[0]).astype(result.dtype)
    return op


def per_block(result: T, x: T, weight: T, scale: T, eps: float, scale_ub: Any, residual: Any,
              group_size: int, transposed: bool) -> None:
    y = x * launch_sized_norm(x)[:, None] * weight
    groups = y.reshape(len(y), -1, group_size)
    s = np.abs(groups).max(axis=2) / np.float32(448.0)
    scale[...] = s
    result[...] = (groups / s[:, :, None]).reshape(y.shape).astype(result.dtype)


def topk_softmax(weights: T, indices: T, token_expert: T, gating: T, renormalize: bool) -> None:
    p = np.exp(gating - gating.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    idx = np.argsort(-p, axis=1, kind="stable")[:, : weights.shape[1]]
    weights[...] = np.take_along_axis(p, idx, 1)
    indices[...] = idx
    token_expert[...] = idx


def run(op: str, fn: Any, schema: str, hidden: int = 512) -> tuple[bool, float]:
    return run_schema_case(FakeTorch, fn, op, schema, np.float32, hidden, 0, (255, 300), 1e-6,
                           "cpu", compare_rows, np.asarray)


def test_a_kernel_that_reduces_by_launch_size_is_caught_in_every_written_output() -> None:
    schema = VLLM_SCHEMAS["rms_norm_static_fp8_quant"]
    assert run("rms_norm_static_fp8_quant", static_quant(pinned=True), schema) == (True, 0.0)
    equal, diff = run("rms_norm_static_fp8_quant", static_quant(pinned=False), schema, 4096)
    assert not equal and diff > 0
    # per-block: the scales (float32 per 128-wide group) move even where fp8 codes round alike
    equal, _ = run("rms_norm_per_block_quant", per_block, TORCH_PRINTED, 4096)
    assert not equal and 4096 % GROUP_SIZE == 0
    # the router's top-k is row by row: the same in any launch
    assert run("_moe_C::topk_softmax", topk_softmax, VLLM_SCHEMAS["topk_softmax"]) == (True, 0.0)


def test_an_op_that_writes_nothing_cannot_be_checked() -> None:
    with pytest.raises(PlanError, match="writes none of its arguments"):
        run("moe_sum", lambda inp, out: None, "moe_sum(Tensor input, Tensor output) -> ()")


def test_moe_sum_adds_the_top_k_experts_of_each_token() -> None:
    def moe_sum(inp: T, out: T) -> None:
        out[...] = inp.sum(axis=1)

    assert run("_moe_C::moe_sum", moe_sum, VLLM_SCHEMAS["moe_sum"]) == (True, 0.0)
    assert TOPK == 8


# ---- the child and the evaluator carry the other extensions ------------------------------------


def test_the_child_refuses_an_op_it_has_no_check_for_before_loading_torch(tmp_path: Path) -> None:
    lib = tmp_path / "x.so"
    lib.write_bytes(b"")
    proc = subprocess.run(
        [sys.executable, "-I", str(CHILD_SCRIPT), "--json", "--library", str(lib), "--abi",
         "ctypes", "--dtypes", "float32", "--ops", "rms_norm_static_fp8_quant"],
        capture_output=True, text=True, check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == 2 and "cannot load" in report["error"]


def test_the_command_loads_the_swap_sets_other_extensions(tmp_path: Path) -> None:
    s = ProbeSettings(ops=("rms_norm", "_moe_C::moe_sum"), dtypes=("bfloat16",))
    cmd = " ".join(OpProbe(s, python="/opt/py").command(tmp_path / "_C.so",
                                                        [tmp_path / "_moe_C.so"]))
    assert f"--library {tmp_path / '_C.so'}" in cmd
    assert f"--also-load {tmp_path / '_moe_C.so'}" in cmd
    assert "--ops rms_norm _moe_C::moe_sum" in cmd
    assert "--also-load" not in " ".join(OpProbe(s).command(tmp_path / "_C.so"))


def test_the_op_evaluator_hands_the_other_extensions_over(tmp_path: Path) -> None:
    from bisect_tool.evaluate import OpEvaluator

    files = {name: tmp_path / name for name in ("_C.abi3.so", "_moe_C.abi3.so", "model.py")}
    for f in files.values():
        f.write_bytes(b"x")
    seen: list[tuple[Path, list[Path]]] = []

    class Given:
        def get(self, commit: str, tags: object = ()) -> SwapSet:
            return SwapSet(commit, {f"vllm/{k}": v for k, v in files.items()})

        def prefetch(self, commits: object, tags: object) -> None:
            return None

    class Probe:
        def run_extension(self, path: Path, env: object = None,
                          also: list[Path] | None = None) -> ProbeResult:
            seen.append((path, list(also or [])))
            return ProbeResult(Verdict.CLEAN, {}, "")

    OpEvaluator(Given(), Probe(), {}, {}).evaluate("c" * 40, "l")  # type: ignore[arg-type]
    assert seen == [(files["_C.abi3.so"], [files["_moe_C.abi3.so"]])]


def test_an_optional_op_that_cannot_run_is_named_and_the_rest_stands() -> None:
    import argparse

    from bisect_tool.probes.op import op_verdict, summarize_cases
    from bisect_tool.probes.op_child import _run_cases
    from bisect_tool.probes.render import render_op_detail

    args = argparse.Namespace(dtypes=["bfloat16"], hidden=[512], seeds=2,
                              optional_ops=["rms_norm_per_block_quant"])

    def run_case(name: str, dtype: str, hidden: int, seed: int) -> tuple[bool, float]:
        if name == "rms_norm_per_block_quant":
            raise RuntimeError("no kernel for this group size on this device")
        return name != "fused_add_rms_norm", 0.0 if name == "rms_norm" else 1e-3

    report: dict[str, Any] = {"cases": []}
    ops = ["rms_norm", "fused_add_rms_norm", "rms_norm_per_block_quant"]
    assert _run_cases(args, report, ops, run_case, str, "cuda",
                      checked=("rms_norm", "fused_add_rms_norm", "rms_norm_per_block_quant")) == 0
    assert {c["op"] for c in report["cases"]} == {"rms_norm", "fused_add_rms_norm"}
    assert "no kernel for this group size" in report["not_checked"]["rms_norm_per_block_quant"]
    summary = summarize_cases(report["cases"])
    summary["not_checked"] = report["not_checked"]
    verdict, message = op_verdict(summary)
    assert verdict is Verdict.DIVERGENT and "fused_add_rms_norm bfloat16 h512: 2/2" in message
    assert "could not be checked: rms_norm_per_block_quant" in message
    assert "Could not be checked: rms_norm_per_block_quant" in render_op_detail(summary)
    # a required op that fails still fails the whole check
    report = {"cases": []}
    assert _run_cases(argparse.Namespace(dtypes=["float16"], hidden=[512], seeds=1),
                      report, ["rms_norm_per_block_quant"], run_case, str, "cuda",
                      checked=("rms_norm_per_block_quant",)) == 2
    assert "no kernel" in report["error"]


def test_the_moe_recipes_op_check_asks_for_the_moe_ops_beside_the_norms(tmp_path: Path) -> None:
    from bisect_tool.recipes import recipe

    probe = recipe.load("batch-invariance-moe").probe
    cmd = OpProbe(probe, python="/opt/py").command(tmp_path / "_C.so", [tmp_path / "_moe_C.so"])
    joined = " ".join(cmd)
    assert "--ops rms_norm fused_add_rms_norm --optional-ops _moe_C::topk_softmax _moe_C::moe_sum" \
        in joined
    assert f"--also-load {tmp_path / '_moe_C.so'}" in joined and "--dtypes bfloat16" in joined
    # each planned against its vLLM schema with the values the check gives
    for op in probe.optional_ops:
        _, args = parse_schema(VLLM_SCHEMAS[op.split("::")[-1]])
        assert any(a.written for a in args)
