"""``[probe] kind = "op"`` (and ``narrow = "op"``): the focused kernel check on a candidate's
extension, no server (``bisect_tool.probes.op``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bisect_tool.kinds.spec import ProbeSpec


def _abi(probe: Mapping[str, Any]) -> str:
    return str(probe.get("op_abi", "torch"))


def _through_torch(probe: Mapping[str, Any]) -> bool:
    """The extension is loaded into PyTorch (a GPU's kernels)."""
    return _abi(probe) == "torch"


def _through_ctypes(probe: Mapping[str, Any]) -> bool:
    """A plain C library loaded with ctypes (the demo's): it runs on the CPUs."""
    return _abi(probe) == "ctypes"


SPEC = ProbeSpec(
    name="op",
    deterministic=True,
    narrows=True,
    local_interpreter=True,
    needs_torch=_through_torch,
    on_cpu=_through_ctypes,
    size_head="Max abs diff between launch sizes",
    recipe_keys=("ops", "dtypes", "hidden_sizes", "seeds", "row_counts", "op_abi",
                 "invariance_env"),
)
