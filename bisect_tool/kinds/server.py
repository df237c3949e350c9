"""``[probe] kind = "server"``: determinism across the repeats of a concurrent workload, one
fresh server per lifetime (``bisect_tool.probes.server``, ``bisect_tool.probes.batch_sizes``)."""

from __future__ import annotations

from bisect_tool.kinds.spec import ProbeSpec

SPEC = ProbeSpec(
    name="server",
    boots_server=True,
    has_controls=True,
    local_interpreter=True,
    noun="lifetime",
    recipe_keys=("requests", "fillers", "repeats", "max_tokens", "logprobs", "jitter_ms",
                 "target_coresidency", "invariance_env"),
)
