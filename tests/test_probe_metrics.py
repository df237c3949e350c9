"""Reading vLLM's /metrics with prometheus_client's parser: a vLLM 0.26 page kept as a fixture
(tests/fixtures/make_vllm_metrics.py says how it was made) and hand-written edge cases. The
demo server's own page is read in test_demo_engine.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bisect_tool.probes.metrics import (
    STEP_TOKENS,
    MetricsFormatError,
    StepBucket,
    gauge_sum,
    largest_step,
    parse,
)
from bisect_tool.probes.render import render_server_detail

FIXTURES = Path(__file__).parent / "fixtures"
BEFORE = (FIXTURES / "vllm-0.26-metrics-before.txt").read_text()
AFTER = (FIXTURES / "vllm-0.26-metrics-after.txt").read_text()


def test_vllm_page_gauges_counters_and_histograms() -> None:
    page = parse(AFTER)
    assert page.value("vllm:num_requests_running") == 0.0  # idle between repeats, not absent
    assert gauge_sum(AFTER) == 0.0
    # Counters by the name on the page and by their family name; summed over label sets
    # (request_success has one per finish reason).
    assert page.value("vllm:request_success_total") == 3 * 44
    assert page.value("vllm:request_success") == 3 * 44
    assert page.value("vllm:prompt_tokens") == 3 * 1448
    assert page.value("process_cpu_seconds_total") is not None  # any plain counter reads
    assert page.value("vllm:engine_sleep_state") == 1.0
    assert page.value("vllm:no_such_metric") is None
    steps = page.histograms[STEP_TOKENS]
    assert [le for le, _ in steps.buckets] == [
        1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, math.inf
    ]
    assert steps.count == 3 * 26 - 2  # priming: 1 prefill step; the repeats: 3 each, + decodes
    assert "vllm:iteration_tokens_total_created" not in page.histograms


def test_largest_step_between_two_scrapes() -> None:
    # One repeat: its burst was admitted over steps of 329, 497 and 703 tokens.
    bucket = largest_step(parse(BEFORE), parse(AFTER))
    assert bucket == StepBucket(512.0, 1024.0)
    assert bucket.label() == "513-1024"
    # From an empty page (the lifetime's start), the priming pass's one 1448-token step shows.
    since_start = largest_step(parse(""), parse(BEFORE))
    assert since_start is not None and since_start.label() == "1025-2048"
    # No new steps, or no page: unknown, not zero.
    assert largest_step(parse(AFTER), parse(AFTER)) is None
    assert largest_step(None, parse(AFTER)) is None
    assert largest_step(parse(BEFORE), parse("vllm:num_requests_running 3\n")) is None


def test_step_bucket_labels_and_json_round_trip() -> None:
    assert StepBucket(255.0, 256.0).label() == "256"  # the demo's bucket of exactly 256
    assert StepBucket(16384.0, math.inf).label() == ">16384"
    assert StepBucket(-math.inf, 1.0).label() == "<=1"
    assert StepBucket(0.5, 1.0).label() == "(0.5, 1]"
    overflow = StepBucket(16384.0, math.inf)
    assert overflow.to_detail() == [16384.0, "+Inf"]
    assert StepBucket.from_detail(overflow.to_detail()) == overflow
    assert StepBucket.from_detail(None) is None and StepBucket.from_detail(["x", 1]) is None


def test_label_values_with_braces_quotes_and_lookalike_names() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="a b}"} 30.0\n'
        'vllm:num_requests_running{engine="1",model_name="q\\"x"} 14.0 1712345678\n'
        'vllm:num_requests_running_total{engine="0"} 99.0\n'
        "# TYPE demollm:steps_overran counter\n"
        "demollm:steps_overran_total 4.0\n"
    )
    assert gauge_sum(text) == 44.0
    assert gauge_sum(text, "demollm:steps_overran_total") == 4.0
    assert parse(text).value("demollm:steps_overran") == 4.0
    assert gauge_sum(text, "vllm:num_requests_waiting") is None


@pytest.mark.parametrize(
    "page", ["<html><body>502 Bad Gateway</body></html>", 'vllm:x{a="1" 2\n']
)
def test_a_page_that_is_not_prometheus_text(page: str) -> None:
    with pytest.raises(MetricsFormatError, match="not Prometheus text"):
        parse(page)
    assert gauge_sum(page) is None  # the poller counts it as a failed sample


def test_the_lifetime_table_shows_the_step_bucket_next_to_coresidency() -> None:
    detail = {
        "mode": "concurrent", "requests": 31, "fillers": 13, "max_tokens": 24, "jitter_ms": 20,
        "coresidency_per_repeat": [44, 44], "max_coresidency": 44, "target_coresidency": 44,
        "step_tokens_per_repeat": [[512.0, 1024.0], [1024.0, 2048.0]],
        "max_step_tokens": [1024.0, 2048.0],
    }
    table = render_server_detail(detail).splitlines()
    row = next(i for i, line in enumerate(table) if "largest engine step" in line)
    assert "co-residency reached" in table[row - 1]
    assert "1025-2048 (513-1024, 1025-2048)" in table[row]
    detail["step_tokens_per_repeat"] = [None, None]
    assert "no vllm:iteration_tokens_total" in render_server_detail(detail)
    del detail["step_tokens_per_repeat"]  # a journal written before the field existed
    assert "| largest engine step, tokens (per repeat) | - |" in render_server_detail(detail)
