"""Reading the co-residency a lifetime reached from vLLM's Prometheus ``/metrics`` text."""

from __future__ import annotations

RUNNING = "vllm:num_requests_running"
# demollm's device clock: engine steps whose compute outlasted their modelled time (a counter).
STEP_OVERRUNS = "demollm:step_overruns_total"


def gauge_sum(text: str, name: str = RUNNING) -> float | None:
    """The sum of ``name`` over all its label sets (one per engine/model), None when absent.

    Label values may hold spaces, braces or escaped quotes, so the label block is skipped by
    scanning quotes rather than by splitting on whitespace.
    """
    total: float | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith(name) or line.startswith("#"):
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            end = _label_end(rest)
            if end < 0:
                continue
            rest = rest[end + 1 :]
        elif not rest[:1].isspace():
            continue  # a longer metric name with the same prefix
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        total = value if total is None else total + value
    return total


def _label_end(s: str) -> int:
    in_quotes = False
    escaped = False
    for i, ch in enumerate(s):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            in_quotes = not in_quotes
        elif ch == "}" and not in_quotes:
            return i
    return -1
