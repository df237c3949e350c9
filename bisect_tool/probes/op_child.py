#!/usr/bin/env python3
"""Focused operator check, run in a child interpreter: ``python op_child.py --json --library X``.

Standalone on purpose (stdlib + torch, numpy when present): it runs on the GPU machine, whose
interpreter has PyTorch but not this tool's dependencies, and in a fresh process so that
``VLLM_BATCH_INVARIANT`` is in the environment before the extension loads (vLLM reads it with
getenv once and caches it: ``vllm::vllm_is_batch_invariant()`` in csrc/core/batch_invariant.hpp).

The check is the one that settled vLLM issue 51187: the RMSNorm launchers picked a block size by
``num_tokens < 256``, so the same row normalised differently in a 255-row launch and a 300-row
launch. Each case runs the op on ``x[:300]`` and ``x[:255]`` and compares the shared first 255
output rows bitwise. Prints one JSON object; exit 0 when the cases ran (whatever they found),
2 when they could not run (the object's ``error`` and ``fix`` say why).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any


def compare_rows(a: Any, b: Any) -> tuple[bool, float]:
    """(bitwise equal, max |a - b|) of two arrays: numpy arrays, anything ``np.asarray`` takes,
    or torch tensors. Bitwise means the bytes: fp16 compared as its 16-bit patterns, so a change
    in the last bit counts and two NaNs with the same bits match. ``max |a - b|`` is over
    finite pairs in float64 (inf when shapes or dtypes differ or a value went non-finite)."""
    if hasattr(a, "detach") and hasattr(b, "detach"):
        return _compare_torch(a, b)
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


def _host(t: Any) -> Any:
    """A CPU copy for ``compare_rows``: numpy when it is there (bf16 widened to fp32, which is
    exact, so bitwise equality is kept), else the tensor itself."""
    t = t.detach().cpu()
    try:
        import numpy  # noqa: F401
    except ImportError:
        return t
    import torch

    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


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


def run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    report: dict[str, Any] = {
        "python": sys.executable,
        "library": args.library,
        "env": {k: os.environ.get(k) for k in args.report_env},
        "cases": [],
    }
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
    try:
        torch.ops.load_library(args.library)
    except Exception as exc:  # any failure to load is the extension's, reported not raised
        report["error"] = f"cannot load {args.library}: {type(exc).__name__}: {exc}"[:2000]
        report["fix"] = "check the extension matches this PyTorch (ABI) and CUDA runtime"
        return 2, report
    namespace = getattr(torch.ops, args.namespace)
    ops = {}
    for name in args.ops:
        try:
            ops[name] = getattr(namespace, name)
        except (AttributeError, RuntimeError):
            report["error"] = f"the extension registers no torch.ops.{args.namespace}.{name}"
            report["fix"] = "check the recipe's op names and namespace for this commit"
            return 2, report
    for name, op in ops.items():
        if name not in ("rms_norm", "fused_add_rms_norm"):
            report["error"] = f"no check is defined for op '{name}'"
            report["fix"] = "use rms_norm or fused_add_rms_norm"
            return 2, report
        for dtype_name in args.dtypes:
            dtype = getattr(torch, dtype_name)
            for hidden in args.hidden:
                for seed in range(args.seeds):
                    try:
                        equal, diff = _run_case(torch, op, name, dtype, hidden, seed,
                                                tuple(args.rows), args.eps, device)
                    except Exception as exc:  # schema mismatch, no kernel for the device...
                        report["error"] = (
                            f"torch.ops.{args.namespace}.{name} failed ({dtype_name}, hidden "
                            f"{hidden}, {device}): {type(exc).__name__}: {exc}"
                        )[:2000]
                        report["fix"] = "check the op schema of this commit and the device"
                        return 2, report
                    report["cases"].append({
                        "op": name, "dtype": dtype_name, "hidden": hidden, "seed": seed,
                        "equal": equal, "max_abs_diff": diff if math.isfinite(diff) else None,
                    })
    return 0, report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--library", required=True)
    p.add_argument("--namespace", default="_C")
    p.add_argument("--ops", nargs="+", default=["rms_norm", "fused_add_rms_norm"])
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
