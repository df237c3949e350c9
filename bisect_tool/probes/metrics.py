"""What a lifetime's Prometheus ``/metrics`` page says: co-residency and the size of engine steps.

vLLM exports its metrics with prometheus_client, so the page is read with that library's own
text parser rather than a scanner of our own: label values holding spaces, braces or escaped
quotes, timestamps, ``_created`` series and new metric families all parse as the exporter meant.

Two readings matter to the server probe:

- ``vllm:num_requests_running`` (a gauge), summed over its label sets (one per engine): how many
  sequences are co-resident right now;
- ``vllm:iteration_tokens_total`` (a histogram of tokens per engine step): between two scrapes,
  the largest bucket any new step landed in says whether a big step (>= 256 tokens in the seed
  bug) formed at all, which co-residency alone cannot show (44 sequences may be admitted over
  several small steps).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

RUNNING = "vllm:num_requests_running"
STEP_TOKENS = "vllm:iteration_tokens_total"


class MetricsFormatError(ValueError):
    """The page is not Prometheus text (an HTML error page, a cut-off body)."""


@dataclass(frozen=True)
class Histogram:
    """One histogram summed over its label sets: cumulative counts per upper bound (``le``)."""

    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending
    count: float
    total: float  # the ``_sum`` series

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations made since ``earlier`` (histograms only ever grow within a lifetime).

        Bounds missing from ``earlier`` count as 0 there: a page scraped before the first
        observation may list no label set at all.
        """
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, n - before.get(le, 0.0)) for le, n in self.buckets),
            self.count - earlier.count,
            self.total - earlier.total,
        )

    def largest_bucket(self) -> StepBucket | None:
        """The bucket holding the largest observation, None when there was none.

        Buckets are cumulative, so the largest observation lies in the first bucket whose
        cumulative count already equals the total.
        """
        if not self.buckets or self.buckets[-1][1] <= 0:
            return None
        reached = self.buckets[-1][1]
        lower = -math.inf
        for le, n in self.buckets:
            if n >= reached:
                return StepBucket(lower, le)
            lower = le
        return None  # not reached: the +Inf bucket is last and holds every observation


@dataclass(frozen=True)
class StepBucket:
    """A histogram bucket ``(above, at_most]``; ``at_most`` is +inf for the overflow bucket."""

    above: float
    at_most: float

    def to_detail(self) -> list[float | str]:
        # JSON has no infinity: the bounds are written as Prometheus writes ``le``.
        return [_bound(self.above), _bound(self.at_most)]

    @staticmethod
    def from_detail(value: object) -> StepBucket | None:
        if not isinstance(value, list) or len(value) != 2:
            return None
        try:
            return StepBucket(float(value[0]), float(value[1]))
        except (TypeError, ValueError):
            return None

    def label(self) -> str:
        """Token counts are integers: ``(128, 256]`` reads ``129-256``, the demo's ``(255, 256]``
        reads ``256``, the overflow bucket ``>16384``, the first bucket ``<=1``."""
        if math.isinf(self.at_most):
            return f">{_num(self.above)}"
        if math.isinf(self.above):
            return f"<={_num(self.at_most)}"
        if not (float(self.above).is_integer() and float(self.at_most).is_integer()):
            return f"({_num(self.above)}, {_num(self.at_most)}]"
        low = self.above + 1
        return _num(self.at_most) if low == self.at_most else f"{_num(low)}-{_num(self.at_most)}"


def _bound(x: float) -> float | str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return x


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclass(frozen=True)
class Scrape:
    """One page: every plain sample summed over label sets, by sample name; every histogram."""

    values: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)

    def value(self, name: str) -> float | None:
        """A gauge, counter or untyped sample by name, summed over its label sets.

        A counter may be named as exported (``..._total``) or by its family name, as
        prometheus_client's own API names it; None when the page does not have it.
        """
        if name in self.values:
            return self.values[name]
        return self.values.get(name + "_total")


def parse(text: str, only: str | None = None) -> Scrape:
    """Every family on a Prometheus text page; a page that is not one -> MetricsFormatError.

    ``only``: parse just the lines that start with that metric name (and its HELP/TYPE
    comments). The co-residency poller reads one gauge every 20 ms while the probe's burst is
    in flight on the same cores; a whole vLLM page (~350 lines) costs ~4 ms to parse, its one
    gauge ~0.05 ms. The parser still decides what each kept line means (a longer name that
    shares the prefix stays its own family).
    """
    if only is not None:
        keep = (only, f"# HELP {only}", f"# TYPE {only}")
        text = "\n".join(line for line in text.splitlines() if line.startswith(keep)) + "\n"
    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    counts: dict[str, float] = {}
    sums: dict[str, float] = {}
    # Imported here: render.py (and so the op probe, run alone on a GPU machine) imports this
    # module for StepBucket only. Every vLLM install has prometheus_client (vLLM needs it).
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError) as exc:  # the parser's errors for a bad line
        raise MetricsFormatError(f"not Prometheus text: {exc}") from None
    for family in families:
        if family.type not in ("histogram", "gaugehistogram"):
            for s in family.samples:
                values[s.name] = values.get(s.name, 0.0) + float(s.value)
            continue
        name = family.name
        mine = buckets.setdefault(name, {})
        for s in family.samples:
            if s.name.endswith("_bucket") and "le" in s.labels:
                le = float(s.labels["le"])
                mine[le] = mine.get(le, 0.0) + float(s.value)
            elif s.name.endswith(("_count", "_gcount")):
                counts[name] = counts.get(name, 0.0) + float(s.value)
            elif s.name.endswith(("_sum", "_gsum")):
                sums[name] = sums.get(name, 0.0) + float(s.value)
    histograms = {
        name: Histogram(tuple(sorted(b.items())), counts.get(name, 0.0), sums.get(name, 0.0))
        for name, b in buckets.items()
    }
    return Scrape(values, histograms)

# demollm's device clock: engine steps whose compute outlasted their modelled time (a counter).
STEP_OVERRUNS = "demollm:step_overruns_total"
# ... and requests handed to its engine after a step they arrived in time for was formed: the
# lifetime's batches then depended on this machine's speed (a counter).
LATE_ARRIVALS = "demollm:late_arrivals_total"
# ... and the longest a declared arrival took to reach it (a gauge, seconds): what its admission
# lag must cover.
ARRIVAL_DELAY_MAX = "demollm:arrival_delay_max_seconds"


def gauge_sum(text: str, name: str = RUNNING) -> float | None:
    """The sum of ``name`` over all its label sets (one per engine/model), None when absent or
    when the page is not Prometheus text."""
    try:
        return parse(text, only=name).value(name)
    except MetricsFormatError:
        return None


def largest_step(
    before: Scrape | None, after: Scrape | None, name: str = STEP_TOKENS
) -> StepBucket | None:
    """The bucket of the largest engine step taken between two scrapes of one lifetime."""
    if before is None or after is None or name not in after.histograms:
        return None
    earlier = before.histograms.get(name, Histogram((), 0.0, 0.0))
    return after.histograms[name].minus(earlier).largest_bucket()
