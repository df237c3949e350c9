"""The focused op probe: the pure row comparison, the summary, and the child process on a
machine without PyTorch (the real extension check runs on the lent GPU)."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bisect_tool.probes.op import CHILD_SCRIPT, OpProbe, op_verdict, summarize_cases
from bisect_tool.probes.op_child import compare_rows
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict

PROBES = Path(__file__).resolve().parents[1] / "bisect_tool" / "probes"


def rows(seed: int, n: int = 255, hidden: int = 512) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, hidden)).astype(np.float16)


def test_identical_rows_are_equal() -> None:
    a = rows(0)
    assert compare_rows(a, a.copy()) == (True, 0.0)


def test_one_ulp_in_one_fp16_element_is_found() -> None:
    a = rows(1)
    b = a.copy()
    b[254, 511] = np.nextafter(b[254, 511], np.float16(np.inf))
    equal, diff = compare_rows(a, b)
    assert not equal
    assert diff == float(abs(np.float64(b[254, 511]) - np.float64(a[254, 511]))) > 0


def test_bits_not_values_decide_equality() -> None:
    a = np.array([0.0, np.nan], dtype=np.float16)
    assert compare_rows(a, np.array([-0.0, np.nan], dtype=np.float16)) == (False, 0.0)
    assert compare_rows(a, a.copy())[0]
    assert compare_rows(a, np.array([np.inf, np.nan], dtype=np.float16)) == (False, math.inf)
    assert compare_rows(a, a.astype(np.float32)) == (False, math.inf)  # dtype mismatch
    assert compare_rows([1.0, 2.0], [1.0, 2.5]) == (False, 0.5)  # anything np.asarray takes


def test_summary_counts_differing_cases_per_group() -> None:
    cases = [{"op": "rms_norm", "dtype": "float16", "hidden": h, "seed": s,
              "equal": h == 512 or s % 2 == 0, "max_abs_diff": 0.0 if h == 512 else 1e-3 * s}
             for h in (512, 4096) for s in range(16)]
    summary = summarize_cases(cases)
    by_hidden = {g["hidden"]: g for g in summary["groups"]}
    assert (by_hidden[512]["differing"], by_hidden[512]["total"]) == (0, 16)
    assert (by_hidden[4096]["differing"], by_hidden[4096]["total"]) == (8, 16)
    assert by_hidden[4096]["max_abs_diff"] == pytest.approx(0.015)
    assert summary["differing"] == 8 and summary["total"] == 32
    verdict, message = op_verdict(summary)
    assert verdict is Verdict.DIVERGENT and "rms_norm float16 h4096: 8/16" in message
    clean = summarize_cases([c | {"equal": True} for c in cases])
    assert op_verdict(clean)[0] is Verdict.CLEAN
    json.dumps(summary, allow_nan=False)


def test_without_torch_the_probe_is_untestable_and_names_the_fix(tmp_path: Path) -> None:
    lib = tmp_path / "_C_stable_libtorch.abi3.so"
    lib.write_bytes(b"\x7fELF")
    result = OpProbe(ProbeSettings()).run_extension(lib, {"VLLM_BATCH_INVARIANT": "1"})
    assert result.verdict is Verdict.UNTESTABLE
    assert "PyTorch is not importable" in result.message and "--python" in result.message
    assert result.detail["env"] == {"VLLM_BATCH_INVARIANT": "1"}  # as the child saw it


def test_missing_file_and_interpreter_are_untestable(tmp_path: Path) -> None:
    missing = OpProbe(ProbeSettings()).run_extension(tmp_path / "nope.so")
    assert missing.verdict is Verdict.UNTESTABLE and "not found" in missing.message
    lib = tmp_path / "x.so"
    lib.write_bytes(b"")
    probe = OpProbe(ProbeSettings(), python=str(tmp_path / "no-python"))
    result = probe.run_extension(lib)
    assert result.verdict is Verdict.UNTESTABLE and "--python" in result.message


def test_child_command_carries_the_settings(tmp_path: Path) -> None:
    s = ProbeSettings(dtypes=("float16", "bfloat16"), hidden_sizes=(512, 4096), seeds=4,
                      row_counts=(255, 300))
    cmd = OpProbe(s, python="/opt/py").command(tmp_path / "x.so")
    assert cmd[:3] == ["/opt/py", str(CHILD_SCRIPT), "--json"]
    joined = " ".join(cmd)
    assert "--ops rms_norm fused_add_rms_norm" in joined
    assert "--dtypes float16 bfloat16" in joined and "--hidden 512 4096" in joined
    assert "--rows 255 300" in joined and "--seeds 4" in joined


def test_child_script_runs_isolated_from_this_package(tmp_path: Path) -> None:
    # -I: no site-packages, no cwd on sys.path: the script must stand alone (the GPU machine
    # lacks gitpython/docker/tenacity, and it must not need this package either).
    lib = tmp_path / "x.so"
    lib.write_bytes(b"")
    proc = subprocess.run([sys.executable, "-I", str(CHILD_SCRIPT), "--json", "--library",
                           str(lib)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    report = json.loads(proc.stdout)
    assert "PyTorch is not importable" in report["error"] and report["cases"] == []


ALLOWED = {"click", "httpx", "numpy", "bisect_tool"}


@pytest.mark.parametrize("path", sorted(PROBES.glob("*.py")), ids=lambda p: p.name)
def test_probe_modules_import_only_stdlib_click_httpx_numpy(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in tree.body:  # top level only: lazy imports inside functions are the point
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            root = name.split(".")[0]
            assert root in sys.stdlib_module_names or root in ALLOWED, f"{path.name}: {name}"
            if root == "bisect_tool":
                assert name in {"bisect_tool.errors", "bisect_tool.values",
                                "bisect_tool.recipes.recipe", "bisect_tool.interfaces",
                                "bisect_tool.clitypes",
                                } or name.startswith("bisect_tool.probes"), f"{path.name}: {name}"
    if path.name == "op_child.py":
        assert not any(isinstance(n, ast.ImportFrom) and n.module and
                       n.module.startswith("bisect_tool") for n in ast.walk(tree))


def test_the_gate_and_the_op_check_of_a_candidate_run_side_by_side(tmp_path: Path) -> None:
    """Each loads the extension in a fresh interpreter (seconds of torch import on the GPU
    machine): the op evaluator runs them at once, so they meet at a barrier; the gate's
    verdict still rides in the observation's detail."""
    import threading

    from bisect_tool.errors import IncompatibleExtension
    from bisect_tool.evaluate import OpEvaluator
    from bisect_tool.interfaces import ProbeResult, SwapSet
    from bisect_tool.values import Verdict

    lib = tmp_path / "ext.so"
    lib.write_bytes(b"x")
    together = threading.Barrier(2, timeout=10)

    class Given:
        def get(self, commit: str, tags: object = ()) -> SwapSet:
            return SwapSet(commit, {"pkg/ext.so": lib})

        def prefetch(self, commits: object, tags: object) -> None:
            return None

    class Probe:
        def run_extension(self, path: Path, env: object = None) -> ProbeResult:
            together.wait()
            return ProbeResult(Verdict.DIVERGENT, {}, "rows differ")

    def gate(swap: SwapSet) -> None:
        together.wait()
        raise IncompatibleExtension("candidate lacks op `_C::rms_norm`")

    evaluator = OpEvaluator(Given(), Probe(), {}, {}, gate=gate)  # type: ignore[arg-type]
    seen = evaluator.evaluate("c" * 40, "l-narrow-0")
    assert seen.verdict is Verdict.DIVERGENT
    assert seen.detail["gate"] == "candidate lacks op `_C::rms_norm`"
