"""The op evaluator: artifacts -> the focused op check on the candidate's extension."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bisect_tool.errors import (
    IncompatibleExtension,
    UntestableError,
)
from bisect_tool.evaluate.base import (
    _ArtifactEvaluator,
    observed,
    swap_facts,
    untestable,
)
from bisect_tool.interfaces import (
    ArtifactProvider,
    SwapSet,
)
from bisect_tool.values import Observation, Verdict


class OpEvaluator(_ArtifactEvaluator):
    """Artifacts -> the focused op probe on the candidate's extension (no server, no model).

    As the tiered search's fast probe it is given the faithful tier's ``gate`` too: the op
    check needs no pinned Python, but the confirm step must know which candidates the pinned
    stack would reject, so each candidate's gate result rides in its detail (``gate``: "ok" or
    the op that differs); the op verdict stands either way."""

    def __init__(
        self,
        provider: ArtifactProvider,
        op_probe: Any,
        env: Mapping[str, str],
        tags: Mapping[str, Sequence[str]],
        gate: Callable[[SwapSet], None] | None = None,
    ) -> None:
        super().__init__(provider, tags)
        self.op_probe = op_probe
        self.env = dict(env)
        self.gate = gate
        self._gate_results: dict[str, str] = {}

    def _gate_result(self, swap: SwapSet) -> str | None:
        if self.gate is None:
            return None
        with self._lock:
            known = self._gate_results.get(swap.commit)
        if known is None:
            try:
                self.gate(swap)
                known = "ok"
            except IncompatibleExtension as exc:
                known = str(exc)
            with self._lock:
                self._gate_results[swap.commit] = known
        return known

    def evaluate(self, commit: str, lifetime_id: str, tags: Sequence[str] = ()) -> Observation:
        started = time.monotonic()
        try:
            swap = self._swap(commit, tags or self.tags.get(commit, ()))
        except UntestableError as exc:
            return untestable(commit, lifetime_id, exc, started)
        artifacts_s = time.monotonic() - started
        self._announce(commit, artifacts_s)
        path, *others = swap.files.values()
        # the swap set's other extensions load beside the first (the MoE recipe's _moe_C ops)
        also = [p for p in others if ".so" in p.name]
        probing = time.monotonic()
        # The gate and the op check each load the extension in a fresh interpreter (seconds
        # of torch import each): side by side, a candidate costs the longer of the two.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bisect-gate") as aside:
            gated = aside.submit(self._gate_result, swap)
            result = self.op_probe.run_extension(path, self.env, also) if also else (
                self.op_probe.run_extension(path, self.env))
            gate = gated.result()
        detail: dict[str, Any] = {**result.detail, **swap_facts(swap)}
        detail["timing"] = {
            "artifacts_s": round(artifacts_s, 3),
            "probe_s": round(time.monotonic() - probing, 3),
        }
        if gate is not None:
            detail["gate"] = gate
        if result.verdict is Verdict.UNTESTABLE:
            detail.setdefault("stage", "probe")
        return observed(commit, lifetime_id, result, detail, started)


