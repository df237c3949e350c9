"""What a server probe reports apart from its verdict (issue 40), as plain values: the first
requests after start-up against themselves later (graph capture and JIT warm-up, vLLM #33537)
and a prompt cold against warm in the prefix cache (#40896, #42019). Neither is the bug; a
maintainer must see them and not mistake them for it. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.probes.compare import Sample, diff_samples


def notes(detail: Mapping[str, Any]) -> str:
    """What the message adds to the verdict: what was reported apart, what this machine
    may have changed. None of it changes the verdict."""
    out = ""
    warm = detail.get("warmup") or {}
    if warm.get("differing"):
        out += (f"; warm-up: {len(warm['differing'])} of the first {warm['requests']} "
                "requests after start-up answered differently from themselves later "
                "(graph capture, JIT warm-up: vLLM #33537), reported apart, not counted")
    cache = detail.get("prefix_cache") or {}
    if cache.get("differs"):
        out += ("; prefix caching: a prompt answered differently cold and warm "
                f"({cache.get('hit_tokens')} tokens from the cache: vLLM #40896, "
                "#42019), reported apart, not counted")
    if detail.get("late_arrivals"):
        out += (
            f"; {detail['late_arrivals']} requests reached the engine after the step they "
            "arrived for had formed: how steps formed depended on this machine's speed"
        )
    return out


def pairs_apart(
    first: Sequence[Sample], later: Sequence[Sample], what: str
) -> dict[str, Any]:
    """Which of ``first`` answered differently from ``later`` (same order), bitwise, and by
    how much: the detail of something reported apart from the verdict."""
    differing: list[int] = []
    delta = 0.0
    moved = False
    for i, (a, b) in enumerate(zip(first, later, strict=True)):
        d = diff_samples(a, b)
        if d is None:
            continue
        differing.append(i)
        delta = max(delta, d.max_abs_delta)
        moved = moved or d.tokens_moved
    return {what: len(first), "differing": differing, "max_abs_logprob_delta": delta,
            "tokens_moved": moved}
