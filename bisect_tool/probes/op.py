"""The focused op probe: load a candidate's extension into PyTorch and check one kernel's rows.

With ``[probe] op_abi = "ctypes"`` the child loads a plain C library with ctypes instead (the
demo's ``demollm/_kernels.so``, which declares the same op schemas); same cases, same report.

The extension is loaded in a child interpreter (``op_child.py``, default ``sys.executable``,
normally the pinned stack's Python) so the environment, e.g. ``VLLM_BATCH_INVARIANT=1``, is set
before the library loads, and a crashing kernel takes down only the child.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bisect_tool.interfaces import ProbeResult
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict

CHILD_SCRIPT = Path(__file__).with_name("op_child.py")
# what is kept of the child's stdout and stderr each: its JSON report is its last line
_OUTPUT_CAP = 16 * 1024 * 1024


def summarize_cases(cases: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per (op, dtype, hidden): differing cases / total and the max |diff| (pure)."""
    groups: dict[tuple[str, str, int], dict[str, Any]] = {}
    for c in cases:
        key = (str(c["op"]), str(c["dtype"]), int(c["hidden"]))
        g = groups.setdefault(key, {"op": key[0], "dtype": key[1], "hidden": key[2],
                                    "differing": 0, "total": 0, "max_abs_diff": 0.0,
                                    "nonfinite": False})
        g["total"] += 1
        if not c["equal"]:
            g["differing"] += 1
            if c.get("max_abs_diff") is None:
                g["nonfinite"] = True
            else:
                g["max_abs_diff"] = max(g["max_abs_diff"], float(c["max_abs_diff"]))
    rows = list(groups.values())
    return {
        "groups": rows,
        "differing": sum(g["differing"] for g in rows),
        "total": sum(g["total"] for g in rows),
    }


def op_verdict(summary: Mapping[str, Any]) -> tuple[Verdict, str]:
    if summary["total"] == 0:
        return Verdict.UNTESTABLE, "no op case ran"
    absent = summary.get("not_registered") or []
    failed = summary.get("not_checked") or {}
    unchecked = f"; not registered here: {', '.join(absent)}" if absent else ""
    unchecked += f"; could not be checked: {', '.join(failed)}" if failed else ""
    if summary["differing"]:
        parts = [f"{g['op']} {g['dtype']} h{g['hidden']}: {g['differing']}/{g['total']}"
                 for g in summary["groups"] if g["differing"]]
        return Verdict.DIVERGENT, ("rows differ between launch sizes: " + ", ".join(parts)
                                   + unchecked)
    return Verdict.CLEAN, (f"all {summary['total']} cases bitwise identical across launch "
                           f"sizes{unchecked}")


class OpProbe:
    """Runs ``op_child.py`` with ``python`` against one extension file."""

    def __init__(
        self,
        settings: ProbeSettings,
        python: str | None = None,
        timeout_s: float = 600.0,
        device: str = "auto",
    ) -> None:
        small, big = settings.row_counts
        if not 0 < small < big:
            from bisect_tool.errors import RecipeError

            raise RecipeError(
                f"probe.row_counts must be [small, big] with 0 < small < big, got {[small, big]}"
            )
        self.settings = settings
        self.python = python or sys.executable
        self.timeout_s = timeout_s
        self.device = device

    def command(self, path: Path, also: Sequence[Path] = ()) -> list[str]:
        s = self.settings
        more = ["--also-load", *map(str, also)] if also else []
        return [
            self.python, str(CHILD_SCRIPT), "--json",
            "--library", str(path),
            "--namespace", s.op_namespace,
            "--ops", *s.ops,
            *(["--optional-ops", *s.optional_ops] if s.optional_ops else []),
            "--dtypes", *s.dtypes,
            "--hidden", *(str(h) for h in s.hidden_sizes),
            "--seeds", str(s.seeds),
            "--rows", *(str(r) for r in s.row_counts),
            "--device", self.device,
            "--report-env", s.invariance_env,
            # torch: a vLLM extension in torch.ops; ctypes: a C library declaring the same op
            # schemas (the demo's _kernels.so), checked with no torch in the child.
            "--abi", s.op_abi,
            *more,
        ]

    def run_extension(
        self, path: Path, env: Mapping[str, str] | None = None, also: Sequence[Path] = ()
    ) -> ProbeResult:
        """The op check on ``path``, with ``also`` (the swap set's other extensions: the
        ``_moe_C::`` ops live in ``_moe_C_stable_libtorch``) loaded beside it."""
        path = Path(path)
        detail: dict[str, Any] = {"library": str(path), "python": self.python,
                                  "env": dict(env or {})}
        if also:
            detail["also_loaded"] = [str(a) for a in also]
        if not path.is_file():
            return ProbeResult(Verdict.UNTESTABLE, detail, f"extension file not found: {path}")
        from bisect_tool.runtime.runprobe import run_group

        child_env = {**os.environ, **(env or {})}
        try:
            # its own process group, ended whole when it returns: subprocess.run waited for EOF
            # on the pipes, which a background child of the extension could hold open for ever
            ran = run_group(
                self.command(path, also), env=child_env, timeout_s=self.timeout_s,
                merge_stderr=False, tail_bytes=_OUTPUT_CAP,
            )
        except FileNotFoundError:
            return ProbeResult(Verdict.UNTESTABLE, detail,
                               f"python interpreter not found: {self.python}; fix --python")
        if ran.timed_out:
            return ProbeResult(Verdict.UNTESTABLE, detail,
                               f"op check timed out after {self.timeout_s:.0f} s")
        try:
            report = json.loads(ran.output.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            tail = "\n".join(ran.errors.strip().splitlines()[-5:])
            return ProbeResult(
                Verdict.UNTESTABLE, {**detail, "returncode": ran.code},
                f"op check exited {ran.code} without a result: {tail}",
            )
        detail.update({k: report.get(k) for k in ("torch", "abi", "rng", "device", "env",
                                                  "schemas", "not_registered", "not_checked")
                       if k in report})
        if report.get("error"):
            detail["error"] = report["error"]
            return ProbeResult(Verdict.UNTESTABLE, detail,
                               f"{report['error']}; fix: {report.get('fix', '')}")
        summary = summarize_cases(report["cases"])
        summary["not_registered"] = list(report.get("not_registered") or [])
        summary["not_checked"] = dict(report.get("not_checked") or {})
        detail.update(summary)
        detail["row_counts"] = list(self.settings.row_counts)
        verdict, message = op_verdict(summary)
        return ProbeResult(verdict, detail, message)
