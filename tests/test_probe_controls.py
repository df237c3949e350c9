"""Controls against real loopback servers whose behaviour follows the invariance switch, and the
pure gate that decides which verdicts may be reported."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from probe_servers import Behaviour, serve

from bisect_tool.errors import BootFailed
from bisect_tool.interfaces import ProbeResult, ServerHandle
from bisect_tool.probes.controls import (
    ControlsResult,
    gate,
    may_report_clean,
    may_report_divergent,
    run_controls,
)
from bisect_tool.probes.server import ServerDeterminismProbe
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict

W = 6
SETTINGS = ProbeSettings(requests=4, fillers=2, prefix_tokens=6, prompt_tokens=4,
                         filler_tokens=4, vocab_size=50_000, repeats=2, max_tokens=3,
                         logprobs=2, jitter_ms=0.0, request_timeout_s=10.0)


def factory(sequential: bool) -> ServerDeterminismProbe:
    return ServerDeterminismProbe(SETTINGS, sequential=sequential)


def booter(switch_works: bool, log: list[dict[str, str]]):
    """boot(env): a lifetime whose outputs move under concurrency when invariance is off
    (``switch_works``), or never (like --load-format dummy weights, where perturbations fall
    below float resolution and the positive control cannot diverge)."""

    @contextlib.contextmanager
    def boot(env: Mapping[str, str]) -> Iterator[ServerHandle]:
        log.append(dict(env))
        invariant = env.get("VLLM_BATCH_INVARIANT") != "0" or not switch_works
        b = Behaviour(workload_size=W, gather=W, hold_s=0.08, invariant=invariant)
        with serve(b) as server:
            yield ServerHandle(server.url, "ctl-0", Path("/nonexistent"))

    return boot


@pytest.mark.slow  # real demo servers under the controls
def test_controls_hold_when_the_switch_exposes_divergence() -> None:
    log: list[dict[str, str]] = []
    controls = run_controls(factory, booter(True, log))
    assert controls.positive.verdict is Verdict.DIVERGENT, controls.positive.message
    assert controls.negative.verdict is Verdict.CLEAN, controls.negative.message
    assert controls.ok and controls.problem == ""
    assert log == [{"VLLM_BATCH_INVARIANT": "0"}]  # one shared lifetime, switch off
    clean = ProbeResult(Verdict.CLEAN, {}, "identical")
    assert gate(clean, controls) is clean


@pytest.mark.slow
def test_separate_lifetimes_boot_the_negative_control_with_the_recipe_env() -> None:
    log: list[dict[str, str]] = []
    controls = run_controls(factory, booter(True, log), share_lifetime=False)
    assert controls.ok
    assert log == [{"VLLM_BATCH_INVARIANT": "0"}, {}]


@pytest.mark.slow
def test_positive_control_that_cannot_diverge_blocks_clean() -> None:
    controls = run_controls(factory, booter(False, []))
    assert controls.positive.verdict is Verdict.CLEAN
    assert not controls.ok and "positive control" in controls.problem
    assert "dummy" in controls.problem  # names the likely fix
    gated = gate(ProbeResult(Verdict.CLEAN, {"x": 1}, "identical"), controls)
    assert gated.verdict is Verdict.INCONCLUSIVE
    assert gated.detail["gated_from"] == "clean" and gated.detail["x"] == 1
    assert not may_report_clean(controls)


def test_boot_failure_makes_untestable_controls() -> None:
    @contextlib.contextmanager
    def boot(env: Mapping[str, str]) -> Iterator[ServerHandle]:
        raise BootFailed("server exited with code 1: CUDA error")
        yield  # pragma: no cover

    controls = run_controls(factory, boot)
    assert controls.positive.verdict is Verdict.UNTESTABLE
    assert "CUDA error" in controls.positive.message and not controls.ok


def result(v: Verdict) -> ProbeResult:
    return ProbeResult(v, {}, v.value)


def test_gate_rules() -> None:
    good = ControlsResult(positive=result(Verdict.DIVERGENT), negative=result(Verdict.CLEAN))
    no_pos = ControlsResult(positive=result(Verdict.INCONCLUSIVE), negative=result(Verdict.CLEAN))
    bad_neg = ControlsResult(positive=result(Verdict.DIVERGENT),
                             negative=result(Verdict.DIVERGENT))
    assert may_report_clean(good) and not may_report_clean(no_pos)
    assert not may_report_clean(bad_neg)
    assert not may_report_clean(None) and may_report_clean(None, require_controls=False)
    assert may_report_divergent(no_pos) and not may_report_divergent(bad_neg)
    assert gate(result(Verdict.DIVERGENT), bad_neg).verdict is Verdict.INCONCLUSIVE
    assert gate(result(Verdict.DIVERGENT), no_pos).verdict is Verdict.DIVERGENT
    assert gate(result(Verdict.CLEAN), None).verdict is Verdict.INCONCLUSIVE
    assert gate(result(Verdict.CLEAN), None, require_controls=False).verdict is Verdict.CLEAN
    assert gate(result(Verdict.UNTESTABLE), no_pos).verdict is Verdict.UNTESTABLE
    assert "negative control" in bad_neg.problem


def test_the_negative_control_spread_over_servers_sends_each_request_alone_once() -> None:
    """Issue 39, item 3: the negative control's pass, every request one at a time, took 119 s
    on the H100. Spread over three servers booted at once (all with the switch off), each
    server gets a third of the requests, each sent alone and compared with itself over the same
    repeats: the same comparisons, a third of the time. The positive control runs on the first
    server, and both controls hold as they do on one."""
    import threading

    up, peak, lock = [0], [0], threading.Lock()
    envs: list[dict[str, str]] = []

    @contextlib.contextmanager
    def boot(env: Mapping[str, str], part: int = 0) -> Iterator[ServerHandle]:
        envs.append(dict(env))
        b = Behaviour(workload_size=W, gather=W, hold_s=0.08,
                      invariant=env.get("VLLM_BATCH_INVARIANT") != "0")
        with serve(b) as server:
            with lock:
                up[0] += 1
                peak[0] = max(peak[0], up[0])
            try:
                yield ServerHandle(server.url, f"ctl-0-s{part}", Path("/nonexistent"))
            finally:
                with lock:
                    up[0] -= 1

    controls = run_controls(factory, boot, spread=3)
    assert controls.ok, controls.problem
    assert controls.positive.verdict is Verdict.DIVERGENT
    assert controls.negative.verdict is Verdict.CLEAN
    assert envs == [{"VLLM_BATCH_INVARIANT": "0"}] * 3 and peak[0] == 3
    parts = controls.negative.detail["parts"]
    assert sorted(p["requests_sent"] for p in parts) == [2, 2, 2]  # W = 6 over 3 servers
    assert controls.negative.detail["servers"] == 3
    # each share: a priming pass and the repeats, every request of it sent alone
    assert all(p["mode"] == "sequential" and p["repeats"] == SETTINGS.repeats for p in parts)


def test_a_negative_control_share_that_diverges_fails_the_whole_control() -> None:
    from bisect_tool.probes.controls import merged

    clean = ProbeResult(Verdict.CLEAN, {"distinct_outputs": 1, "differing_pairs": []}, "same")
    moved = ProbeResult(Verdict.DIVERGENT, {"distinct_outputs": 2, "differing_pairs": [[0, 1]]},
                        "repeats 0 and 1 differ")
    out = merged([clean, moved, clean])
    assert out.verdict is Verdict.DIVERGENT and out.detail["distinct_outputs"] == 2
    assert "server 2 of 3" in out.message
    assert merged([clean, ProbeResult(Verdict.UNTESTABLE, {}, "boot failed")]).verdict \
        is Verdict.UNTESTABLE
    assert merged([clean, clean]).verdict is Verdict.CLEAN
