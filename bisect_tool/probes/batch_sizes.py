"""vLLM's own definition of batch invariance (``[probe] mode = "bs1-vs-bsN"``): each prompt alone
(batch size 1) against the same prompt inside a batch of N, tokens and logprobs bitwise.

This is what vLLM's maintainers test (``tests/v1/determinism/test_online_batch_invariance.py``);
#51187's probe (``server.py``) compares repeats of one workload with each other instead, so it
sees only what varies between repeats. Here a batch that is stable but different from one
request alone shows too.

One lifetime: the warm-up requests (``[probe] warmup_requests``, reported apart), a priming
batch of the largest size (discarded, as the repeats probe discards its first pass), the
compared prompts one at a time, then for each batch size N ``repeats`` passes of the first N
prompts at once (arrivals jittered as the recipe says), each compared with the prompts' answers
alone. ``needles`` compares only the first few prompts of every batch: issue 43's probe (a
needle alone against itself in batches of 17 and 65, as vLLM's TP test does) is this probe
with ``needles = 1`` and ``batch_sizes = [17, 65]``.

Verdicts: a compared prompt whose batched answer differs from its answer alone -> DIVERGENT;
none, and every batch pass reached its co-residency (the recipe's target, at most N) -> CLEAN;
else INCONCLUSIVE. Sequential (the negative control): the "batches" go one request at a time,
so they must match the prompts alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from bisect_tool.interfaces import ServerProbe
from bisect_tool.probes.compare import DELTA_SCOPE, Sample, diff_samples
from bisect_tool.probes.metrics import StepBucket
from bisect_tool.probes.monitor import MetricsMonitor
from bisect_tool.probes.server import ServerDeterminismProbe
from bisect_tool.probes.server_http import device_clock, resolve_model, step_detail
from bisect_tool.probes.workload import request_body
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict

MODE = "bs1-vs-bsN"


@dataclass(frozen=True)
class BatchPass:
    """One batch of ``size`` prompts compared with the same prompts alone."""

    size: int
    index: int  # which pass of this size
    differing: tuple[int, ...]  # compared prompts whose batched answer differs from alone
    coresidency: int | None  # the peak vllm:num_requests_running during the pass
    max_abs_delta: float
    tokens_moved: bool
    first_position: int | None  # the first position that differed, over the prompts
    first_token_position: int | None  # the first position whose emitted token differed


def compare_pass(
    size: int, index: int, alone: Sequence[Sample], batched: Sequence[Sample],
    compared: int, coresidency: int | None,
) -> BatchPass:
    """The first ``compared`` prompts of a batch against their answers alone (pure)."""
    differing: list[int] = []
    delta, moved = 0.0, False
    first: int | None = None
    first_token: int | None = None
    for i in range(compared):
        d = diff_samples(alone[i], batched[i])
        if d is None:
            continue
        differing.append(i)
        delta = max(delta, d.max_abs_delta)
        first = d.first_position if first is None else min(first, d.first_position)
        if d.tokens_moved:
            moved = True
            pos = next((k for k, (x, y) in enumerate(zip(alone[i].token_ids,
                                                         batched[i].token_ids, strict=False))
                        if x != y), min(len(alone[i].token_ids), len(batched[i].token_ids)))
            first_token = pos if first_token is None else min(first_token, pos)
    return BatchPass(size, index, tuple(differing), coresidency, delta, moved, first,
                     first_token)


def batch_verdict(passes: Sequence[BatchPass], target: Callable[[int], int]) -> tuple[Verdict, str]:
    """The lifetime's verdict from its batch passes; ``target(N)``: the co-residency a pass of
    N prompts must reach before a clean one counts (0: none, the negative control)."""
    bad = [p for p in passes if p.differing]
    if bad:
        prompts = sorted({i for p in bad for i in p.differing})
        where = ", ".join(f"batch {p.size} pass {p.index}: {len(p.differing)}" for p in bad)
        moved = "tokens moved" if any(p.tokens_moved for p in bad) else "only logprobs moved"
        delta = max(p.max_abs_delta for p in bad)
        return Verdict.DIVERGENT, (
            f"{len(prompts)} prompts answered differently alone and in a batch ({where}), "
            f"max |delta logprob| {delta:.3e}, {moved}"
        )
    sizes = sorted({p.size for p in passes})
    if not passes:
        return Verdict.INCONCLUSIVE, "no batch pass ran"
    missed = [p for p in passes
              if target(p.size) and (p.coresidency is None or p.coresidency < target(p.size))]
    if missed:
        where = ", ".join(f"batch {p.size} pass {p.index}: {p.coresidency} of "
                          f"{target(p.size)}" for p in missed)
        return Verdict.INCONCLUSIVE, (
            f"every prompt answered alike alone and batched, but the batches never formed "
            f"({where}): raise --max-num-seqs, lower jitter or the target"
        )
    how = "sequential" if not any(target(s) for s in sizes) else (
        f"co-residency {max((p.coresidency or 0) for p in passes)}")
    return Verdict.CLEAN, (
        f"every prompt bitwise the same alone and in batches of {', '.join(map(str, sizes))} "
        f"({len(passes)} passes, {how})"
    )


def batch_detail(passes: Sequence[BatchPass]) -> dict[str, Any]:
    """The passes as detail fields; the ones the report reads of the repeats probe keep their
    meaning (``max_abs_logprob_delta``, ``tokens_moved``, ``coresidency_per_repeat``)."""
    bad = [p for p in passes if p.differing]
    peaks = [p.coresidency for p in passes]
    known = [p for p in peaks if p is not None]
    firsts = [p.first_position for p in bad if p.first_position is not None]
    tokens = [p.first_token_position for p in bad if p.first_token_position is not None]
    return {
        "batch_passes": [
            {"batch_size": p.size, "pass": p.index, "differing_prompts": list(p.differing),
             "coresidency": p.coresidency}
            for p in passes
        ],
        "differing_prompts": sorted({i for p in bad for i in p.differing}),
        "repeats": len(passes),
        "max_abs_logprob_delta": max((p.max_abs_delta for p in bad), default=0.0),
        "max_abs_logprob_delta_scope": DELTA_SCOPE,
        "tokens_moved": any(p.tokens_moved for p in bad),
        "logprobs_only": bool(bad) and not any(p.tokens_moved for p in bad),
        "first_divergent_position": min(firsts, default=None),
        "first_token_divergence_position": min(tokens, default=None),
        "coresidency_per_repeat": peaks,
        "max_coresidency": max(known, default=None),
    }


class BatchSizeProbe(ServerDeterminismProbe):
    """``[probe] mode = "bs1-vs-bsN"``: the plumbing of the repeats probe (clients, jitter,
    /metrics, redone passes, a dead server is UNTESTABLE), another comparison."""

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(self.settings.batch_sizes) or (self.workload.size,)

    def compared(self, size: int) -> int:
        return min(self.settings.needles or size, size)

    def pass_target(self, size: int) -> int:
        return min(self.target, size)

    async def _run(
        self,
        client: httpx.AsyncClient,
        slots: Sequence[httpx.AsyncClient],
        url: str,
        is_alive: Callable[[], bool] | None,
        detail: dict[str, Any],
    ) -> tuple[Verdict, str]:
        s = self.settings
        model = self.model or await resolve_model(client, url, is_alive)
        detail.update({"model": model, "comparison": MODE, "batch_sizes": list(self.sizes),
                       "needles": s.needles})
        bodies = [request_body(p, model, s.max_tokens, s.logprobs) for p in self.workload.prompts]
        biggest = max(self.sizes)
        first = await self._first_after_start(client, slots, url, bodies, is_alive, detail)
        passes: list[BatchPass] = []
        steps: list[StepBucket | None] = []
        with MetricsMonitor(url, self.poll_interval_s) as monitor:
            await self._attempts(client, slots[:biggest], url, bodies[:biggest], "priming",
                                 monitor, is_alive, detail)
            alone = await self._one_by_one(
                client, slots, url, bodies[: max(self.compared(n) for n in self.sizes)],
                "the prompts alone", is_alive, detail,
            )
            for size in self.sizes:
                for index in range(s.repeats):
                    batched, peak, step = await self._attempts(
                        client, slots[:size], url, bodies[:size], f"batch {size} pass {index}",
                        monitor, is_alive, detail,
                    )
                    passes.append(compare_pass(size, index, alone, batched,
                                               self.compared(size), peak))
                    steps.append(step)
            detail["metrics_samples"] = monitor.samples
        await self._apart(client, slots, url, bodies, first, is_alive, detail)
        detail.update(batch_detail(passes))
        detail["target_coresidency"] = self.target
        detail["target_reached_repeats"] = sum(
            1 for p in passes if p.coresidency is not None
            and p.coresidency >= self.pass_target(p.size))
        detail["step_tokens_per_repeat"] = [step_detail(b) for b in steps]
        seen = [b for b in steps if b is not None]
        detail["max_step_tokens"] = step_detail(max(seen, key=lambda b: b.at_most, default=None))
        detail.update(await device_clock(client, url))
        target = (lambda _n: 0) if self.sequential else self.pass_target
        verdict, message = batch_verdict(passes, target)
        return verdict, message + self._notes(detail)


def server_probe(
    settings: ProbeSettings, *, model: str | None = None, sequential: bool = False,
    **options: Any,
) -> ServerProbe:
    """The server probe a recipe's ``[probe] mode`` asks for."""
    if settings.mode == MODE:
        return BatchSizeProbe(settings, model=model, sequential=sequential, **options)
    return ServerDeterminismProbe(settings, model=model, sequential=sequential, **options)


__all__ = ["MODE", "BatchPass", "BatchSizeProbe", "batch_detail", "batch_verdict",
           "compare_pass", "server_probe"]
