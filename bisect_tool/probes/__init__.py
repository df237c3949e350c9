"""Probes stage: decides what one lifetime saw.

- ``ServerDeterminismProbe`` (server.py): the concurrent repeat workload of vLLM issue 51187;
  ``BatchSizeProbe`` (batch_sizes.py): vLLM's own bs=1 vs bs=N check (``[probe] mode``); what
  both report apart from the verdict (apart.py: warm-up, prefix caching cold and warm).
- ``run_controls`` / ``ControlsResult`` / ``gate`` (controls.py): positive and negative controls.
- ``OpProbe`` (op.py, child script op_child.py): RMSNorm rows in 255- vs 300-row launches.
- ``render_server_detail`` / ``render_op_detail`` / ``render_detail`` (either, by the detail's
  shape) (render.py): Markdown tables for the report.

Names are imported lazily so that ``python -m bisect_tool.probes --extension`` needs no httpx.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ServerDeterminismProbe": "server",
    "target_coresidency": "server_verdict",
    "ControlsResult": "controls",
    "run_controls": "controls",
    "gate": "controls",
    "may_report_clean": "controls",
    "may_report_divergent": "controls",
    "OpProbe": "op",
    "summarize_cases": "op",
    "render_server_detail": "render",
    "render_op_detail": "render",
    "render_detail": "render",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"bisect_tool.probes.{_EXPORTS[name]}"), name)
    raise AttributeError(name)
