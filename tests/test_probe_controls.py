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
from bisect_tool.recipe import ProbeSettings
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
