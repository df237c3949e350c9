"""Markdown tables of what a probe saw (pure; the report reuses them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bisect_tool.probes.metrics import StepBucket


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "0" if value == 0 else f"{value:.3e}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _pairs(pairs: Sequence[Sequence[int]] | None) -> str:
    return " ".join(f"({p[0]},{p[1]})" for p in pairs or []) or "none"


def _step(value: Any) -> str:
    bucket = StepBucket.from_detail(value)
    return "-" if bucket is None else bucket.label()


def _steps(d: Mapping[str, Any]) -> str | None:
    """The histogram bucket of the largest step per repeat (``vllm:iteration_tokens_total``):
    says whether a big step formed, which co-residency alone cannot (a batch may be admitted
    over several small steps). None ("-") for details written before it was recorded."""
    per_repeat = d.get("step_tokens_per_repeat")
    if per_repeat is None:
        return None
    if all(v is None for v in per_repeat):
        return "- (no vllm:iteration_tokens_total on /metrics)"
    return f"{_step(d.get('max_step_tokens'))} ({', '.join(_step(v) for v in per_repeat)})"


def render_server_detail(detail: Mapping[str, Any]) -> str:
    """One lifetime of the server determinism probe as a two-column table."""
    d = detail
    per_repeat = d.get("coresidency_per_repeat")
    moved = None
    if d.get("differing_pairs"):
        moved = "tokens" if d.get("tokens_moved") else "logprobs only"
    rows: list[tuple[str, Any]] = [
        ("lifetime", d.get("lifetime_id") or d.get("url")),
        ("mode", d.get("mode")),
        ("workload", f"{d.get('requests')} requests + {d.get('fillers')} fillers, "
                     f"max_tokens {d.get('max_tokens')}, jitter {d.get('jitter_ms')} ms"),
        ("distinct outputs / repeats",
         f"{d.get('distinct_outputs', '-')} / {d.get('repeats', '-')}"),
        ("repeat pairs that differ", _pairs(d.get("differing_pairs"))
         if "differing_pairs" in d else None),
        ("diverging (request, pair) observations", d.get("diverging_observations")),
        ("max abs delta logprob", d.get("max_abs_logprob_delta")),
        ("first divergent position", d.get("first_divergent_position")),
        ("what moved", moved or ("nothing" if "differing_pairs" in d else None)),
        ("co-residency reached (per repeat)",
         f"{d.get('max_coresidency')} ({', '.join(_cell(p) for p in per_repeat)})"
         if per_repeat is not None else None),
        ("largest engine step, tokens (per repeat)", _steps(d)),
        ("target co-residency", d.get("target_coresidency") or "none (sequential)"),
        ("repeats redone", d.get("redone_repeats")),
    ]
    if d.get("comparison") == "bs1-vs-bsN":
        rows[3:6] = [
            ("compared", f"each prompt alone vs in batches of "
                         f"{', '.join(map(str, d.get('batch_sizes') or []))}"
                         + (f" ({d['needles']} needles)" if d.get("needles") else "")),
            ("prompts that differed alone vs batched",
             " ".join(map(str, d.get("differing_prompts") or [])) or "none"),
            ("batch passes", d.get("repeats")),
        ]
    rows += _apart_rows(d)
    if d.get("step_overruns"):
        rows.append(("ran slower than modelled", f"{d['step_overruns']} engine steps overran"))
    if d.get("late_arrivals"):
        rows.append(("batches moved by this machine",
                     f"{d['late_arrivals']} requests came in after their step formed"))
    if d.get("gate_reason"):
        rows.append(("gated", d["gate_reason"]))
    return _table(["", "value"], rows)


def _apart_rows(d: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """What the probe reported apart from its verdict: the first requests after start-up
    (vLLM #33537) and prefix caching cold against warm (#40896, #42019)."""
    rows: list[tuple[str, Any]] = []
    warm = d.get("warmup")
    if isinstance(warm, Mapping):
        n = len(warm.get("differing") or [])
        rows.append(("first requests after start-up (not counted)",
                     f"{n} of {warm.get('requests')} differed from themselves later"
                     if n else f"all {warm.get('requests')} the same later"))
    cache = d.get("prefix_cache")
    if isinstance(cache, Mapping):
        hits = cache.get("hit_tokens")
        seen = ("differs" if cache.get("differs") else "the same") + (
            "" if hits is None else f", {hits} tokens from the cache"
            + (" (prefix caching off)" if hits == 0 else ""))
        rows.append(("a prompt cold vs warm in the prefix cache (not counted)", seen))
    return rows


def _op_runtime(detail: Mapping[str, Any]) -> str:
    """What called the ops: PyTorch and its version, or ctypes (a C library, no torch)."""
    if detail.get("abi") == "ctypes":
        return "ctypes"
    return f"torch {detail.get('torch', '?')}"


def render_op_detail(detail: Mapping[str, Any]) -> str:
    """The op probe: one row per (op, dtype, hidden), differing cases / total and max |diff|."""
    rows = [
        (g["op"], g["dtype"], g["hidden"], f"{g['differing']}/{g['total']}",
         None if g.get("nonfinite") else g["max_abs_diff"])
        for g in detail.get("groups", [])
    ]
    small_big = detail.get("row_counts") or ["small", "big"]
    head = (f"Rows 0..{int(small_big[0]) - 1 if isinstance(small_big[0], int) else 'n'} of a "
            f"{small_big[0]}-row launch vs a {small_big[1]}-row launch, bitwise "
            f"(library `{detail.get('library', '?')}`, {_op_runtime(detail)}, "
            f"{detail.get('device', '?')}, env {detail.get('env', {})})")
    if not rows:
        return head + "\n\nno cases ran" + (f": {detail['error']}" if detail.get("error") else "")
    absent = detail.get("not_registered") or []
    tail = f"\n\nNot registered by this extension (not checked): {', '.join(absent)}" if absent \
        else ""
    for op, why in (detail.get("not_checked") or {}).items():
        tail += f"\n\nCould not be checked: {op}: {_cell(why)}"
    return head + "\n\n" + _table(["op", "dtype", "hidden", "differing", "max abs diff"],
                                    rows) + tail


def render_detail(detail: Mapping[str, Any]) -> str:
    """What one run of either probe saw, told apart by its shape: the op probe's detail has its
    ``groups`` (``bisect_tool.probes.op.summarize_cases``), a server lifetime's does not."""
    if detail.get("groups") is not None:
        return render_op_detail(detail)
    return render_server_detail(detail)
