#!/usr/bin/env python3
"""Focused operator check, run in a child interpreter: ``python op_child.py --json --library X``.

Standalone on purpose (stdlib + torch, numpy when present): it runs on the GPU machine, whose
interpreter has PyTorch but not this tool's dependencies, and in a fresh process so that
``VLLM_BATCH_INVARIANT`` is in the environment before the extension loads (vLLM reads it with
getenv once and caches it: ``vllm::vllm_is_batch_invariant()`` in csrc/core/batch_invariant.hpp).

Two ways to call the ops (``--abi``): ``torch`` loads a vLLM extension with
``torch.ops.load_library`` and calls ``torch.ops.<namespace>.<op>``; ``ctypes`` loads a plain C
library (the demo engine's ``demollm/_kernels.so``) that declares the same op schemas through
``bisect_op_schemas()`` and takes float32 rows, and imports no torch at all (numpy when present,
else the stdlib's ``array`` and ``random``).

The check is the one that settled vLLM issue 51187: the RMSNorm launchers picked a block size by
``num_tokens < 256``, so the same row normalised differently in a 255-row launch and a 300-row
launch. Each case runs the op on ``x[:300]`` and ``x[:255]`` and compares the shared first 255
output rows bitwise. Prints one JSON object; exit 0 when the cases ran (whatever they found),
2 when they could not run (the object's ``error`` and ``fix`` say why).
"""

from __future__ import annotations

import argparse
import array
import json
import math
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


def load_op_cases() -> ModuleType:
    """``op_cases.py`` beside this script, loaded by its path: the script stands alone
    (``python -I op_child.py``: no package, no script folder on sys.path)."""
    import importlib.util

    name = "bisect_op_cases"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(os.path.abspath(__file__)), "op_cases.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def compare_rows(a: Any, b: Any) -> tuple[bool, float]:
    """(bitwise equal, max |a - b|) of two arrays: numpy arrays, anything ``np.asarray`` takes,
    or torch tensors. Bitwise means the bytes: fp16 compared as its 16-bit patterns, so a change
    in the last bit counts and two NaNs with the same bits match. ``max |a - b|`` is over
    finite pairs in float64 (inf when shapes or dtypes differ or a value went non-finite).
    Two ``array.array`` (the ctypes path without numpy) are compared by the same rule."""
    if hasattr(a, "detach") and hasattr(b, "detach"):
        return _compare_torch(a, b)
    if isinstance(a, array.array) and isinstance(b, array.array):
        return _compare_flat(a, b)
    import numpy as np

    x, y = np.asarray(a), np.asarray(b)
    if x.shape != y.shape or x.dtype != y.dtype:
        return False, math.inf
    if x.tobytes() == y.tobytes():
        return True, 0.0
    xv, yv = x.astype(np.float64), y.astype(np.float64)
    finite = np.isfinite(xv) & np.isfinite(yv)
    both_nan = np.isnan(xv) & np.isnan(yv)
    if bool(np.any(~finite & ~both_nan & (xv != yv))):
        return False, math.inf
    diff = np.abs(xv[finite] - yv[finite])
    return False, float(diff.max()) if diff.size else 0.0


def _compare_torch(a: Any, b: Any) -> tuple[bool, float]:
    # Used only where numpy is missing next to torch: same rule as the numpy path.
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False, math.inf
    ints = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    if torch.equal(a.contiguous().view(ints), b.contiguous().view(ints)):
        return True, 0.0
    xv, yv = a.double(), b.double()
    finite = torch.isfinite(xv) & torch.isfinite(yv)
    both_nan = torch.isnan(xv) & torch.isnan(yv)
    if bool((~finite & ~both_nan & (xv != yv)).any()):
        return False, math.inf
    diff = (xv[finite] - yv[finite]).abs()
    return False, float(diff.max()) if diff.numel() else 0.0


def _compare_flat(a: array.array, b: array.array) -> tuple[bool, float]:
    # Used only where numpy is missing (the ctypes path): same rule as the numpy path.
    if len(a) != len(b) or a.typecode != b.typecode:
        return False, math.inf
    if a.tobytes() == b.tobytes():
        return True, 0.0
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        if math.isfinite(x) and math.isfinite(y):
            worst = max(worst, abs(x - y))
        elif x != y and not (math.isnan(x) and math.isnan(y)):
            return False, math.inf
    return False, worst


def _host(t: Any) -> Any:
    """A CPU copy for ``compare_rows``: numpy when it is there (bf16 and the fp8 types, which
    numpy lacks, widened to fp32, which is exact, so bitwise equality is kept), else the tensor
    itself."""
    t = t.detach().cpu()
    try:
        import numpy  # noqa: F401
    except ImportError:
        return t
    import torch

    narrow = t.dtype == torch.bfloat16 or (t.is_floating_point() and t.element_size() == 1)
    return (t.float() if narrow else t).numpy()


def _run_case(torch: Any, op: Any, name: str, dtype: Any, hidden: int, seed: int,
              rows: tuple[int, int], eps: float, device: str) -> tuple[bool, float]:
    small, big = rows
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(big, hidden, generator=gen).to(device=device, dtype=dtype)
    weight = (1.0 + 0.1 * torch.randn(hidden, generator=gen)).to(device=device, dtype=dtype)
    if name == "rms_norm":
        # rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon)
        outs = []
        for n in (big, small):
            out = torch.empty(n, hidden, device=device, dtype=dtype)
            op(out, x[:n].clone(), weight, eps)
            outs.append(out)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return compare_rows(_host(outs[0][:small]), _host(outs[1]))
    # fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon):
    # both are updated in place, so both are compared.
    residual = torch.randn(big, hidden, generator=gen).to(device=device, dtype=dtype)
    results = []
    for n in (big, small):
        inp, res = x[:n].clone(), residual[:n].clone()
        op(inp, res, weight, eps)
        results.append((inp, res))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    eq_in, d_in = compare_rows(_host(results[0][0][:small]), _host(results[1][0]))
    eq_res, d_res = compare_rows(_host(results[0][1][:small]), _host(results[1][1]))
    return eq_in and eq_res, max(d_in, d_res)


# A case: (op name, dtype name, hidden, seed) -> (bitwise equal, max |diff|).
CaseRunner = Callable[[str, str, int, int], tuple[bool, float]]


RMS_NORM_PAIR = ("rms_norm", "fused_add_rms_norm")


def _run_cases(args: argparse.Namespace, report: dict[str, Any], ops: list[str],
               run_case: CaseRunner, label: Callable[[str], str], device: str,
               checked: tuple[str, ...] = RMS_NORM_PAIR) -> int:
    """Every (op, dtype, hidden, seed) case into ``report["cases"]``; 2 with the report's
    ``error`` and ``fix`` at the first op without a check or the first case that raised."""
    optional = set(getattr(args, "optional_ops", None) or ())
    for name in ops:
        if name.split("::", 1)[-1] not in checked:
            report["error"] = f"no check is defined for op '{name}' here"
            report["fix"] = f"use {', '.join(checked)}"
            return 2
        cases = [(d, h, s) for d in args.dtypes for h in args.hidden for s in range(args.seeds)]
        done: list[dict[str, Any]] = []
        for dtype_name, hidden, seed in cases:
            try:
                equal, diff = run_case(name, dtype_name, hidden, seed)
            except Exception as exc:  # schema mismatch, no kernel for the device...
                why = (f"{label(name)} failed ({dtype_name}, hidden {hidden}, {device}): "
                       f"{type(exc).__name__}: {exc}")[:2000]
                if name in optional:
                    # an op checked where it can be: named, its cases left out, the rest stands
                    report.setdefault("not_checked", {})[name] = why
                    done = []
                    break
                report["error"] = why
                report["fix"] = "check the op schema of this commit and the device"
                return 2
            done.append({
                "op": name, "dtype": dtype_name, "hidden": hidden, "seed": seed,
                "equal": equal, "max_abs_diff": diff if math.isfinite(diff) else None,
            })
        report["cases"] += done
    return 0


def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    report: dict[str, Any] = {
        "python": sys.executable,
        "library": args.library,
        "abi": args.abi,
        "env": {k: os.environ.get(k) for k in args.report_env},
        "cases": [],
    }
    if args.abi == "ctypes":
        return run_ctypes(args, report)
    try:
        import torch
    except ImportError as exc:
        report["error"] = f"PyTorch is not importable by {sys.executable}: {exc}"
        report["fix"] = "point --python at an interpreter with PyTorch (>= 2.10 for abi3 builds)"
        return 2, report
    report["torch"] = torch.__version__
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    report["device"] = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    for library in [args.library, *args.also_load]:
        try:
            torch.ops.load_library(library)
        except Exception as exc:  # any failure to load is the extension's, reported not raised
            report["error"] = f"cannot load {library}: {type(exc).__name__}: {exc}"[:2000]
            report["fix"] = "check the extension matches this PyTorch (ABI) and CUDA runtime"
            return 2, report
    report["also_loaded"] = list(args.also_load)
    ops = {}
    report["not_registered"] = []
    for name in [*args.ops, *args.optional_ops]:
        # "_moe_C::moe_sum" names its namespace; a bare name is in the recipe's op_namespace
        namespace, _, bare = name.rpartition("::")
        namespace = namespace or args.namespace
        try:
            ops[name] = getattr(getattr(torch.ops, namespace), bare)
        except (AttributeError, RuntimeError):
            if name in args.optional_ops:  # checked where the candidate registers it
                report["not_registered"].append(name)
                continue
            report["error"] = f"the extension registers no torch.ops.{namespace}.{bare}"
            report["fix"] = "check the recipe's op names and namespace for this commit"
            return 2, report

    def run_case(name: str, dtype_name: str, hidden: int, seed: int) -> tuple[bool, float]:
        dtype = getattr(torch, dtype_name)
        if name.split("::", 1)[-1] in RMS_NORM_PAIR:
            return _run_case(torch, ops[name], name, dtype, hidden, seed, tuple(args.rows),
                             args.eps, device)
        # the quantized RMSNorm ops and the MoE ops: planned from the schema it registers
        op_cases = load_op_cases()
        schema = str(ops[name].default._schema)
        report.setdefault("schemas", {})[name] = schema
        return op_cases.run_schema_case(torch, ops[name], name, schema, dtype, hidden, seed,
                                        tuple(args.rows), args.eps, device, compare_rows, _host)

    code = _run_cases(args, report, list(ops), run_case,
                      lambda name: f"torch.ops.{args.namespace}.{name}" if "::" not in name
                      else f"torch.ops.{name.replace('::', '.')}", device,
                      checked=(*RMS_NORM_PAIR, *sorted(load_op_cases().CHECKED)))
    return code, report


# ---- --abi ctypes: a plain C library that declares the same op schemas (demollm/_kernels.so) ----

# The schema (namespace left out) each op must be declared with for the C call this check makes:
#   rms_norm(float *result, const float *input, const float *weight, float eps,
#            int64_t num_tokens, int64_t hidden)
#   fused_add_rms_norm(float *input, float *residual, const float *weight, float eps,
#                      int64_t num_tokens, int64_t hidden)
# float32 rows, (num_tokens, hidden), C-contiguous; 0 on success. A library declaring another
# schema takes other arguments, and a ctypes call with the wrong ones corrupts memory instead
# of raising, so such a library is refused before any call.
CTYPES_SCHEMAS = {
    "rms_norm": "rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()",
    "fused_add_rms_norm": (
        "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()"
    ),
}


def declared_ops(schemas: str) -> dict[str, str]:
    """``{"_C::rms_norm": "_C::rms_norm(Tensor! result, ...) -> ()"}`` from the text a library's
    ``bisect_op_schemas()`` returns (one schema a line, whitespace normalised)."""
    out: dict[str, str] = {}
    for line in schemas.splitlines():
        schema = " ".join(line.split())
        if schema:
            out[schema.split("(", 1)[0].strip()] = schema
    return out


class _Buffers:
    """float32 rows for the C calls: numpy arrays when numpy is importable, else ``array('f')``
    with the stdlib's generator. Both are C-contiguous ``num_tokens * hidden`` floats, so the
    library sees the same layout; only the random inputs differ (``rng`` says which)."""

    def __init__(self) -> None:
        try:
            import numpy
        except ImportError:
            self.np: Any = None
            self.rng = "random.Random(seed).gauss"
        else:
            self.np = numpy
            self.rng = "numpy.random.default_rng(seed)"

    def inputs(self, seed: int, rows: int, hidden: int) -> tuple[Any, Any, Any]:
        """(x, weight, residual) for one case, drawn in that order from a generator seeded with
        the case's seed, like the torch path: x and residual standard normal, weight 1 + 0.1 N."""
        np = self.np
        if np is not None:
            gen = np.random.default_rng(seed)
            x = gen.standard_normal((rows, hidden), dtype=np.float32)
            weight = (1.0 + 0.1 * gen.standard_normal(hidden)).astype(np.float32)
            residual = gen.standard_normal((rows, hidden), dtype=np.float32)
            return x, weight, residual
        import random

        r = random.Random(seed)
        x = array.array("f", (r.gauss(0.0, 1.0) for _ in range(rows * hidden)))
        weight = array.array("f", (1.0 + 0.1 * r.gauss(0.0, 1.0) for _ in range(hidden)))
        residual = array.array("f", (r.gauss(0.0, 1.0) for _ in range(rows * hidden)))
        return x, weight, residual

    def head(self, rows: Any, n: int, hidden: int) -> Any:
        """A contiguous copy of the first ``n`` rows (a launch of ``n`` tokens owns its input)."""
        return rows[:n].copy() if self.np is not None else rows[: n * hidden]

    def empty(self, n: int, hidden: int) -> Any:
        if self.np is not None:
            return self.np.empty((n, hidden), dtype=self.np.float32)
        return array.array("f", bytes(4 * n * hidden))

    def pointer(self, rows: Any) -> Any:
        import ctypes

        f32p = ctypes.POINTER(ctypes.c_float)
        if self.np is not None:
            return rows.ctypes.data_as(f32p)
        return ctypes.cast((ctypes.c_float * len(rows)).from_buffer(rows), f32p)


def _run_ctypes_case(buffers: _Buffers, fn: Any, name: str, hidden: int, seed: int,
                     rows: tuple[int, int], eps: float) -> tuple[bool, float]:
    small, big = rows
    x, weight, residual = buffers.inputs(seed, big, hidden)
    w = buffers.pointer(weight)

    def call(*pointers: Any, n: int) -> None:
        rc = fn(*pointers, w, eps, n, hidden)
        if rc != 0:
            raise RuntimeError(f"{name} returned {rc} for {n} x {hidden} rows")

    if name == "rms_norm":
        outs = []
        for n in (big, small):
            out, inp = buffers.empty(n, hidden), buffers.head(x, n, hidden)
            call(buffers.pointer(out), buffers.pointer(inp), n=n)
            outs.append(out)
        return compare_rows(buffers.head(outs[0], small, hidden), outs[1])
    # fused_add_rms_norm updates input and residual in place, so both are compared.
    results = []
    for n in (big, small):
        inp, res = buffers.head(x, n, hidden), buffers.head(residual, n, hidden)
        call(buffers.pointer(inp), buffers.pointer(res), n=n)
        results.append((inp, res))
    eq_in, d_in = compare_rows(buffers.head(results[0][0], small, hidden), results[1][0])
    eq_res, d_res = compare_rows(buffers.head(results[0][1], small, hidden), results[1][1])
    return eq_in and eq_res, max(d_in, d_res)


def run_ctypes(args: argparse.Namespace, report: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The same cases on a C library loaded with ctypes: no torch is imported."""
    import ctypes
    import shutil
    import tempfile

    if args.device not in ("auto", "cpu"):
        report["error"] = f"--abi ctypes runs the library's C kernels on the CPU, not {args.device}"
        report["fix"] = "use --device auto (or cpu) with op_abi = \"ctypes\""
        return 2, report
    report["device"] = "cpu"
    other = [d for d in args.dtypes if d != "float32"]
    if other:
        report["error"] = f"the ctypes ops take float32 rows only, not {', '.join(other)}"
        report["fix"] = 'set [probe] dtypes = ["float32"] in the recipe'
        return 2, report
    buffers = _Buffers()
    report["rng"] = buffers.rng
    # A private copy: dlopen returns the library already loaded from a path, so a later build
    # written to the same path could otherwise be served stale (and the copy's name is unique).
    with tempfile.TemporaryDirectory(prefix="bisect-op-") as tmp:
        copy = os.path.join(tmp, os.path.basename(args.library) or "library.so")
        try:
            shutil.copyfile(args.library, copy)
            lib = ctypes.CDLL(copy)
        except OSError as exc:
            why = " ".join(str(exc).replace(copy, args.library).split())
            report["error"] = f"cannot load {args.library}: {type(exc).__name__}: {why}"[:2000]
            report["fix"] = "give a shared library built for this machine (the build's .so)"
            return 2, report
        try:
            schemas_fn = lib.bisect_op_schemas
        except AttributeError:
            text = ""
        else:
            schemas_fn.restype = ctypes.c_char_p
            schemas_fn.argtypes = []
            text = (schemas_fn() or b"").decode(errors="replace")
        declared = declared_ops(text)
        report["schemas"] = list(declared.values())
        f32p = ctypes.POINTER(ctypes.c_float)
        fns: dict[str, Any] = {}
        for name in args.ops:
            qualified = f"{args.namespace}::{name}"
            if qualified not in declared:
                report["error"] = (
                    f"the extension registers no op {qualified} (its bisect_op_schemas() "
                    f"declares {', '.join(declared) or 'no ops'})"
                )
                report["fix"] = "check the recipe's op names and namespace for this commit"
                return 2, report
            wanted = f"{args.namespace}::{CTYPES_SCHEMAS[name]}" if name in CTYPES_SCHEMAS else ""
            if wanted and declared[qualified] != wanted:
                report["error"] = (f"{qualified} is declared as '{declared[qualified]}', not as "
                                   f"'{wanted}', the C signature the ctypes check calls")
                report["fix"] = "use op_abi = \"torch\" or an op whose schema the check knows"
                return 2, report
            try:
                fn = getattr(lib, name)
            except AttributeError:
                report["error"] = f"{args.library} declares {qualified} but exports no '{name}'"
                report["fix"] = "rebuild the library: its symbols must match bisect_op_schemas()"
                return 2, report
            fn.restype = ctypes.c_int
            fn.argtypes = [f32p, f32p, f32p, ctypes.c_float, ctypes.c_int64, ctypes.c_int64]
            fns[name] = fn

        def run_case(name: str, dtype_name: str, hidden: int, seed: int) -> tuple[bool, float]:
            return _run_ctypes_case(buffers, fns[name], name, hidden, seed, tuple(args.rows),
                                    args.eps)

        code = _run_cases(args, report, list(args.ops), run_case,
                          lambda name: f"{args.namespace}::{name}", "cpu")
    return code, report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--library", required=True)
    p.add_argument("--also-load", nargs="*", default=[],
                   help="more libraries to load first (torch): the swap set's other extensions, "
                   "e.g. _moe_C_stable_libtorch.abi3.so for _moe_C:: ops")
    p.add_argument("--abi", choices=["torch", "ctypes"], default="torch",
                   help="how the ops are called: torch.ops (a vLLM extension) or ctypes (a C "
                   "library declaring the same schemas, float32 rows; no torch)")
    p.add_argument("--namespace", default="_C")
    p.add_argument("--ops", nargs="+", default=["rms_norm", "fused_add_rms_norm"])
    p.add_argument("--optional-ops", nargs="*", default=[],
                   help="ops checked where the extension registers them (torch)")
    p.add_argument("--dtypes", nargs="+", default=["float16"])
    p.add_argument("--hidden", nargs="+", type=int, default=[512, 4096])
    p.add_argument("--seeds", type=int, default=16)
    p.add_argument("--rows", nargs=2, type=int, default=[255, 300])
    p.add_argument("--eps", type=float, default=1e-6)
    p.add_argument("--device", default="auto")
    p.add_argument("--report-env", nargs="*", default=["VLLM_BATCH_INVARIANT"])
    args = p.parse_args(argv)
    code, report = run(args)
    if args.json:
        print(json.dumps(report))
    else:
        print(report.get("error") or f"{sum(not c['equal'] for c in report['cases'])} differ")
    return code


if __name__ == "__main__":
    sys.exit(main())
