"""The server determinism probe against real HTTP servers on loopback (tests/probe_servers.py)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest
from probe_servers import Behaviour, output_for, serve

from bisect_tool.interfaces import ServerHandle
from bisect_tool.probes.server import ServerDeterminismProbe
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict

W = 8  # 5 requests + 3 fillers
SETTINGS = ProbeSettings(
    requests=5,
    fillers=3,
    prefix_tokens=8,
    prompt_tokens=6,
    filler_tokens=5,
    vocab_size=50_000,
    repeats=3,
    max_tokens=4,
    logprobs=3,
    jitter_ms=0.0,
    request_timeout_s=10.0,
)


def handle(url: str) -> ServerHandle:
    return ServerHandle(url=url, lifetime_id="test-0", log_path=Path("/nonexistent"))


def test_deterministic_server_is_clean_and_traffic_is_byte_identical() -> None:
    with serve(Behaviour(workload_size=W, gather=W)) as server:
        result = ServerDeterminismProbe(SETTINGS).run(handle(server.url), server.is_alive)
        bodies = server.state.bodies
    assert result.verdict is Verdict.CLEAN, result.message
    d = result.detail
    assert d["distinct_outputs"] == 1 and d["differing_pairs"] == []
    assert d["coresidency_per_repeat"] == [W, W, W] and d["target_coresidency"] == W
    assert d["model"] == "test-model"
    # priming + 3 repeats, every request's body byte-identical each time
    assert len(bodies) == 4 * W
    assert sorted(Counter(bodies).values()) == [4] * W
    json.dumps(d, allow_nan=False)


def test_last_bit_moved_under_concurrency_is_divergent_with_the_exact_pairs() -> None:
    # Pass 2 = repeat 1 (pass 0 is the priming pass).
    with serve(Behaviour(workload_size=W, gather=W, perturb_passes=frozenset({2}))) as server:
        result = ServerDeterminismProbe(SETTINGS).run(handle(server.url), server.is_alive)
    assert result.verdict is Verdict.DIVERGENT, result.message
    d = result.detail
    assert d["differing_pairs"] == [[0, 1], [1, 2]]
    assert d["distinct_outputs"] == 2
    assert d["first_divergent_position"] == 2
    assert d["tokens_moved"] is False and d["logprobs_only"] is True
    assert 1 <= d["diverging_observations"] <= 2 * W
    # The move is one ulp of one of the server's logprobs.
    ulps = set()
    for prompt in ServerDeterminismProbe(SETTINGS).workload.prompts:
        lp = output_for(list(prompt), SETTINGS.max_tokens, SETTINGS.logprobs, 50_000)["chosen"][2]
        ulps.add(lp - math.nextafter(lp, -math.inf))
    assert d["max_abs_logprob_delta"] in ulps
    assert "(0,1) (1,2)" in result.message


def test_sequential_mode_is_clean_where_concurrency_diverges() -> None:
    behaviour = Behaviour(workload_size=W, hold_s=0.02, perturb_passes=frozenset({1, 2, 3}))
    with serve(behaviour) as server:
        result = ServerDeterminismProbe(SETTINGS, sequential=True).run(handle(server.url))
        max_running = server.state.max_running
    assert result.verdict is Verdict.CLEAN, result.message
    assert result.detail["mode"] == "sequential" and max_running == 1


def test_server_that_never_batches_is_inconclusive_not_clean() -> None:
    with serve(Behaviour(workload_size=W, serialize=True, hold_s=0.01)) as server:
        result = ServerDeterminismProbe(SETTINGS).run(handle(server.url), server.is_alive)
    assert result.verdict is Verdict.INCONCLUSIVE, result.message
    assert result.detail["max_coresidency"] <= 1
    assert result.detail["distinct_outputs"] == 1
    assert "never formed" in result.message


def test_dropped_connection_redoes_the_repeat_and_stays_clean() -> None:
    # Arrival 2W+3 is the 4th request of repeat 1; its connection closes with no response.
    with serve(Behaviour(workload_size=W, gather=W, drop_at=2 * W + 3)) as server:
        result = ServerDeterminismProbe(SETTINGS).run(handle(server.url), server.is_alive)
        dropped, completions = server.state.dropped, server.state.completions
    assert result.verdict is Verdict.CLEAN, result.message
    assert dropped == 1
    assert result.detail["redone_repeats"] == 1
    assert result.detail["redo_reasons"][0].startswith("repeat 1:")
    assert completions == 5 * W - 1  # priming, 3 repeats, and the failed attempt's other 7


@pytest.mark.parametrize("watch_process", [True, False])
def test_server_dying_mid_run_is_untestable_never_divergent(watch_process: bool) -> None:
    with serve(Behaviour(workload_size=W, gather=W, die_at=2 * W + 1)) as server:
        is_alive = server.is_alive if watch_process else None
        result = ServerDeterminismProbe(SETTINGS).run(handle(server.url), is_alive)
    assert result.verdict is Verdict.UNTESTABLE
    assert "died during repeat 1" in result.message
    expected = "process exited" if watch_process else "/health unreachable"
    assert expected in result.message


def test_rejected_request_is_untestable_with_the_server_message() -> None:
    with serve(Behaviour(workload_size=W, gather=W)) as server:
        result = ServerDeterminismProbe(SETTINGS, model="no-such-model").run(handle(server.url))
    assert result.verdict is Verdict.UNTESTABLE
    assert "HTTP 400" in result.message and "no-such-model" in result.message


def test_nothing_listening_is_untestable() -> None:
    with serve(Behaviour()) as server:
        url = server.url
    result = ServerDeterminismProbe(SETTINGS).run(handle(url))
    assert result.verdict is Verdict.UNTESTABLE and "cannot reach" in result.message


def test_explicit_lower_target_accepts_a_smaller_batch() -> None:
    # The server admits one at a time; target 1 says that is all this recipe needs.
    settings = ProbeSettings(**{**SETTINGS.__dict__, "target_coresidency": 1})
    with serve(Behaviour(workload_size=W, serialize=True, hold_s=0.03)) as server:
        result = ServerDeterminismProbe(settings).run(handle(server.url))
    assert result.verdict is Verdict.CLEAN, result.message
