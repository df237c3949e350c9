"""What one server lifetime's repeats mean: the co-residency every repeat must reach, the probe
settings that can tell anything at all, and the lifetime's verdict (``decide``).

Verdicts: a differing pair -> DIVERGENT; none, and every repeat reached the target co-residency
-> CLEAN; none but the target was missed -> INCONCLUSIVE (a lifetime that never formed the batch
says nothing about the bug). UNTESTABLE (the server died or rejected the probe) is the probe's
own (``bisect_tool.probes.server``), never DIVERGENT.
"""

from __future__ import annotations

from collections.abc import Sequence

from bisect_tool.errors import RecipeError
from bisect_tool.probes.compare import Comparison
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict


def target_coresidency(settings: ProbeSettings, sequential: bool = False) -> int:
    """The co-residency every repeat must reach before a clean lifetime may be called CLEAN.

    Exactly ``target_coresidency``, or all M+F requests when it is 0. No fraction is applied on
    purpose: in the seed, 36 co-resident sequences were clean and 44 diverged, so "90% of the
    batch" could silently accept batches below the trigger; a recipe that wants less says so
    with an explicit number. Sequential mode (the negative control) has no target: one request
    at a time is the point.
    """
    if sequential:
        return 0
    total = settings.requests + settings.fillers
    return settings.target_coresidency or total


def validate_settings(settings: ProbeSettings) -> None:
    total = settings.requests + settings.fillers
    if settings.requests < 0 or settings.fillers < 0 or total < 1:
        raise RecipeError("probe.requests + probe.fillers must be at least 1")
    if settings.repeats < 2:
        raise RecipeError(
            f"probe.repeats is {settings.repeats}; at least 2 are needed to compare repeats"
        )
    if settings.max_tokens < 1:
        raise RecipeError("probe.max_tokens must be at least 1")
    if settings.target_coresidency > total:
        raise RecipeError(
            f"probe.target_coresidency ({settings.target_coresidency}) exceeds requests + fillers "
            f"({total}): it could never be reached; lower it or add fillers"
        )
    if settings.jitter_ms < 0:
        raise RecipeError("probe.jitter_ms must be >= 0")


def decide(
    comparison: Comparison, peaks: Sequence[int | None], target: int
) -> tuple[Verdict, str]:
    """The lifetime's verdict from the all-pairs comparison and each repeat's peak co-residency."""
    if comparison.divergent:
        pairs = " ".join(f"({i},{j})" for i, j in comparison.differing_pairs)
        what = "tokens moved" if comparison.tokens_moved else "only logprobs moved"
        return Verdict.DIVERGENT, (
            f"{comparison.distinct_outputs} distinct outputs in {comparison.repeats} repeats; "
            f"pairs {pairs} differ in {comparison.diverging_observations} (request, pair) "
            f"observations, max |delta logprob| {comparison.max_abs_logprob_delta:.3e}, {what}"
        )
    known = [p for p in peaks if p is not None]
    top = max(known, default=None)
    if target <= 0:
        return Verdict.CLEAN, f"{comparison.repeats} repeats bitwise identical (sequential)"
    if len(known) < len(peaks):
        return Verdict.INCONCLUSIVE, (
            "repeats identical, but /metrics gave no vllm:num_requests_running during some "
            "repeats, so the co-residency reached is unknown; check the server exposes /metrics"
        )
    missed = {i: p for i, p in enumerate(peaks) if p is None or p < target}
    if missed:
        where = ", ".join(f"repeat {i}: {p}" for i, p in missed.items())
        return Verdict.INCONCLUSIVE, (
            f"repeats identical, but co-residency stayed below the target {target} ({where}): "
            "the batch never formed (raise --max-num-seqs, lower jitter or the target)"
        )
    return Verdict.CLEAN, (
        f"{comparison.repeats} repeats bitwise identical at co-residency {top} (target {target})"
    )
