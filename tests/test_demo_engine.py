"""demollm: speaks vLLM's API, and is batch-invariant everywhere except the planted RMSNorm.

The proof: with the fixed kernel (v0.27.0, switch on) a request's output is bitwise the same
alone, among 40 others in one big step, and under various arrival timings; with the pinned
(v0.26.0) kernel it changes exactly when one of its steps crosses 256 tokens. The device clock
(engine.DeviceTiming) only decides when steps start and which arrivals they admit; its tests run
it on model time (an injected clock), never against this machine's speed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bisect_tool.demo.calibrate import demo_server
from bisect_tool.demo.history import generate
from bisect_tool.demo.pinned import STACK_DIR, ensure_pinned_build, run_build
from bisect_tool.interfaces import ServerHandle
from bisect_tool.probes.metrics import STEP_TOKENS, StepBucket, parse
from bisect_tool.probes.render import render_server_detail
from bisect_tool.probes.server import ServerDeterminismProbe
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict

sys.path.insert(0, str(STACK_DIR))
from demollm._custom_ops import Kernels  # noqa: E402
from demollm.engine import (  # noqa: E402
    DeviceTiming,
    EngineOptions,
    LLMEngine,
    Request,
    SchedulerConfig,
)
from demollm.loop import EngineLoop  # noqa: E402
from demollm.model import DemoModel, ModelConfig  # noqa: E402
from demollm.server import ApiServer  # noqa: E402

_n = 0


@pytest.fixture(scope="module")
def sos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("engine")
    history = generate(root / "repo", commits=80)
    tree = root / "fixed"
    subprocess.run(
        ["git", "-C", str(history.repo), "worktree", "add", "-q", str(tree), history.good_tag],
        check=True,
    )
    return {"pre": ensure_pinned_build(), "post": run_build(tree)}


def engine(
    so: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch, invariant: bool = True,
    options: EngineOptions | None = None,
) -> LLMEngine:
    global _n
    _n += 1
    copy = tmp / f"e{_n}.so"
    shutil.copyfile(so, copy)
    if invariant:
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    kernels = Kernels(copy)
    kernels.rms_norm(np.ones((1, 8), np.float32), None, 1e-6)  # caches the switch now
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    # The matmuls follow the same switch as the kernels (demollm.server.build_engine does so).
    return LLMEngine(DemoModel(ModelConfig(batch_invariant=invariant), kernels), SchedulerConfig(),
                     options)


def prompt(seed: int, n: int = 24) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 1500, n)]


def outcome(r: Request) -> list[tuple[int, float, list[tuple[int, float]]]]:
    return [(o.token_id, o.logprob, o.top) for o in r.outputs]


def run(
    e: LLMEngine, arrivals: list[list[list[int]]], target_step: int
) -> tuple[Request, list[int]]:
    """Admit arrivals[i] before step i; the target (prompt(0)) arrives before `target_step`.
    Returns the target and the sizes of the steps it took part in."""
    target = e.make_request(prompt(0), 6, 5)
    sizes: list[int] = []
    step = 0
    while step < len(arrivals) or e.has_work() or not target.outputs:
        for p in arrivals[step] if step < len(arrivals) else []:
            e.add_request(e.make_request(p, 6, 5))
        if step == target_step:
            e.add_request(target)
        was_in = target in e.running or target in e.waiting
        e.step()
        if was_in or (step == target_step):
            sizes.append(e.step_sizes[-1])
        step += 1
        if len(target.outputs) == 6 and step >= len(arrivals):
            break
    while e.has_work():
        e.step()
    return target, sizes


OTHERS = [prompt(s) for s in range(1, 41)]
COMPOSITIONS = {
    "alone": ([], 0),
    "among 40 in one step": ([OTHERS], 0),  # 41 * 24 = 984 tokens: a step far above 256
    "after 20, before 20": ([OTHERS[:20], [], OTHERS[20:]], 1),
    "trickle": ([[p] for p in OTHERS], 7),
    "small groups": ([OTHERS[i : i + 3] for i in range(0, 40, 3)], 4),
}


@pytest.mark.slow  # exhaustive: the fixed kernel over many step shapes
def test_fixed_kernel_is_bitwise_batch_invariant(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = {}
    for name, (arrivals, at) in COMPOSITIONS.items():
        target, sizes = run(engine(sos["post"], tmp_path, monkeypatch), arrivals, at)
        results[name] = (outcome(target), max(sizes))
    assert results["among 40 in one step"][1] >= 256 and results["alone"][1] < 256
    reference = results["alone"][0]
    for name, (out, _) in results.items():
        assert out == reference, f"{name} differs from alone"


def test_pinned_kernel_diverges_only_when_a_step_crosses_256(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone, _ = run(engine(sos["pre"], tmp_path, monkeypatch), [], 0)
    for name, (arrivals, at) in COMPOSITIONS.items():
        target, sizes = run(engine(sos["pre"], tmp_path, monkeypatch), arrivals, at)
        crossed = max(sizes) >= 256
        same = outcome(target) == outcome(alone)
        assert same != crossed, f"{name}: steps {sizes}, same={same}"
        if not same:  # logprobs move in the last bits; the tokens stay (as in issue 51187)
            assert [o[0] for o in outcome(target)] == [o[0] for o in outcome(alone)]


def test_without_the_switch_the_fixed_kernel_still_diverges(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone, _ = run(engine(sos["post"], tmp_path, monkeypatch, invariant=False), [], 0)
    crowd, _ = run(engine(sos["post"], tmp_path, monkeypatch, invariant=False), [OTHERS], 0)
    assert outcome(alone) != outcome(crowd)


def test_without_the_switch_small_steps_diverge_too(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Split-K below 64 tokens: alone (24-token steps) vs among 4 others (120 tokens), both far
    # below 256, differ with the switch off and agree with it on: what makes the positive
    # control diverge in almost every lifetime while the planted bug stays intermittent.
    crowd = [OTHERS[:4]]
    off = [run(engine(sos["post"], tmp_path, monkeypatch, invariant=False), a, 0)
           for a in ([], crowd)]
    on = [run(engine(sos["post"], tmp_path, monkeypatch), a, 0) for a in ([], crowd)]
    assert max(off[1][1]) < 256 and outcome(off[0][0]) != outcome(off[1][0])
    assert outcome(on[0][0]) == outcome(on[1][0])


class ModelClock:
    """Model time for the device clock: compute takes ``compute_s`` per step, sleeps advance."""

    def __init__(self, compute_s: float = 0.0) -> None:
        self.now, self.compute_s, self.slept = 100.0, compute_s, 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


def clocked(e: LLMEngine, clock: ModelClock, timing: DeviceTiming) -> EngineLoop:
    loop = EngineLoop(e, timing, clock=clock, sleep=clock.sleep)
    step = e.step

    def computing(admit_until: float | None = None) -> list[Request]:
        clock.now += clock.compute_s  # the step's compute, on model time
        return step(admit_until)

    e.step = computing  # type: ignore[method-assign]
    return loop


def test_steps_last_their_modelled_time_and_admit_by_arrival_on_the_device_clock(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(sos["post"], tmp_path, monkeypatch)
    clock = ModelClock(compute_s=0.001)
    timing = DeviceTiming(launch_overhead_ms=20.0, per_token_ms=0.05)
    loop = clocked(e, clock, timing)
    t0 = clock.now
    # Three requests are already queued when the first step starts, but only one had arrived
    # by then on the device clock: the others wait for the step that starts after them.
    for p, at in ((OTHERS[0], t0), (OTHERS[1], t0 + 0.010), (OTHERS[2], t0 + 0.030)):
        e.add_request(e.make_request(p, 2, arrival=at))
    loop.timed_step()
    assert e.step_sizes == [24] and clock.now == pytest.approx(t0 + timing.step_seconds(24))
    loop.timed_step()  # starts at 21.2 ms: the 10 ms arrival joins, the 30 ms one does not
    assert e.step_sizes == [24, 25]
    loop.timed_step()
    assert e.step_sizes == [24, 25, 25]
    assert loop.overruns == 0 and clock.slept > 0


def test_an_overrun_is_counted_but_does_not_stretch_the_device_clock(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(sos["post"], tmp_path, monkeypatch)
    clock = ModelClock(compute_s=0.050)  # every step computes longer than its 20-21 ms
    loop = clocked(e, clock, DeviceTiming(20.0, 0.05))
    t0 = clock.now
    e.add_request(e.make_request(OTHERS[0], 3, arrival=t0))
    e.add_request(e.make_request(OTHERS[1], 3, arrival=t0 + 0.030))
    loop.timed_step()  # device 0..21.2 ms, done at 50 ms of real time
    loop.timed_step()  # device 21.2..42.4 ms: the 30 ms arrival is still not admitted
    assert e.step_sizes == [24, 1] and loop.overruns == 2 and clock.slept == 0
    loop.timed_step()  # device 42.4 ms: now it is
    assert e.step_sizes == [24, 1, 25]
    assert loop.overrun_s == pytest.approx(3 * 0.050 - (0.0212 + 0.02005 + 0.02125))


def test_a_declared_arrival_holds_the_device_the_admission_lag_behind_real_time(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(sos["post"], tmp_path, monkeypatch)
    clock = ModelClock()
    timing = DeviceTiming(20.0, 0.05, admission_lag_ms=100.0)
    loop = clocked(e, clock, timing)
    t0 = clock.now
    loop.add(e.make_request(OTHERS[0], 2, arrival=t0, declared=True))
    assert loop.due() == pytest.approx(t0 + 0.100)  # formed once its start is 100 ms past
    clock.now = t0 + 0.100
    loop.timed_step()  # device 0..21.2 ms; its answers are handed back 100 ms after that
    assert clock.now == pytest.approx(t0 + timing.step_seconds(24) + 0.100)
    loop.timed_step()
    loop.timed_step()  # idle again: a client that declares nothing gets no lag
    loop.add(e.make_request(OTHERS[1], 2, arrival=clock.now))
    assert loop.due() == pytest.approx(clock.now)


def test_a_request_handed_over_after_its_step_formed_is_a_late_arrival(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(sos["post"], tmp_path, monkeypatch)
    clock = ModelClock()
    loop = clocked(e, clock, DeviceTiming(20.0, 0.05, admission_lag_ms=0.0))
    t0 = clock.now
    loop.add(e.make_request(OTHERS[0], 3, arrival=t0))
    loop.timed_step()  # formed at device time t0
    # Arrived at t0 (declared), handed over after the t0 step formed: it missed that step.
    loop.add(e.make_request(OTHERS[1], 3, arrival=t0, declared=True))
    assert loop.late_arrivals == 1
    assert loop.max_arrival_delay_s == pytest.approx(clock.now - t0)
    loop.add(e.make_request(OTHERS[2], 3, arrival=clock.now))  # after that step: in time
    assert loop.late_arrivals == 1


def _submit_declared(loop: EngineLoop, e: LLMEngine, p: list[int], arrival: float) -> Request:
    request = e.make_request(p, 2, arrival=arrival, declared=True)
    loop.submit(request)
    return request


def test_a_request_that_comes_in_late_still_joins_the_step_it_arrived_for(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real loop thread on the real clock. Two requests meant to arrive together; the second
    # is handed over 0.3 s late (a starved timer or HTTP thread). With a 1 s admission lag the
    # first step still holds both; with none it formed without the second, which is counted.
    sizes = {}
    for lag_ms in (1000.0, 0.0):
        e = engine(sos["post"], tmp_path, monkeypatch)
        loop = EngineLoop(e, DeviceTiming(20.0, 0.05, admission_lag_ms=lag_ms))
        loop.start()
        try:
            t = time.monotonic()
            first = _submit_declared(loop, e, OTHERS[0], t)
            time.sleep(0.3)
            second = _submit_declared(loop, e, OTHERS[1], t)
            first.future.result(timeout=30), second.future.result(timeout=30)
        finally:
            loop.stop()
        sizes[lag_ms] = (e.step_sizes[0], loop.late_arrivals)
    assert sizes[1000.0] == (48, 0)
    assert sizes[0.0] == (24, 1)


def test_scheduler_respects_max_num_seqs_and_token_budget(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(sos["pre"], tmp_path, monkeypatch)
    e.config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=100)
    for p in OTHERS[:12]:
        e.add_request(e.make_request(p, 3))
    e.step()
    assert len(e.running) == 4 and e.step_sizes[-1] == 96  # 4 prompts of 24 fit in 100
    while e.has_work():
        e.step()
        assert len(e.running) <= 8


# --- the HTTP API, on a real server process --------------------------------------------------


def post(url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def server(sos: dict[str, Path]) -> Iterator[str]:
    # Eager: the tests below compare a first request with a later one (CUDA graphs' warm-up
    # would make them differ; tests/test_demo_modes.py shows it does)
    args = ("--max-num-seqs", "16", "--step-overhead-ms", "0", "--step-per-token-ms", "0",
            "--enforce-eager")
    with demo_server(sos["pre"], {"VLLM_BATCH_INVARIANT": "1"}, args) as url:
        yield url


def test_completions_answer_in_vllms_shape(server: str) -> None:
    status, body = post(
        server,
        {
            "model": "demo",
            "prompt": prompt(3),
            "max_tokens": 5,
            "temperature": 0,
            "seed": 0,
            "logprobs": 3,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        },
    )
    assert status == 200
    choice = body["choices"][0]  # type: ignore[index]
    lp = choice["logprobs"]
    assert len(choice["token_ids"]) == 5 and choice["prompt_token_ids"] == prompt(3)
    assert lp["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert len(lp["token_logprobs"]) == 5 and all(x <= 0 for x in lp["token_logprobs"])
    assert all(3 <= len(top) <= 4 for top in lp["top_logprobs"])
    assert all(k.startswith("token_id:") for top in lp["top_logprobs"] for k in top)
    assert lp["text_offset"][0] == 0 and choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 24, "total_tokens": 29, "completion_tokens": 5}
    again = post(
        server,
        {
            "prompt": prompt(3),
            "max_tokens": 5,
            "temperature": 0,
            "logprobs": 3,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        },
    )[1]
    assert again["choices"] == body["choices"]  # type: ignore[index]


def test_bad_requests_get_400(server: str) -> None:
    assert post(server, {"prompt": "hello", "max_tokens": 2, "temperature": 0})[0] == 400
    assert post(server, {"prompt": [5000], "max_tokens": 2, "temperature": 0})[0] == 400
    status, body = post(server, {"prompt": [1] * 1000, "max_tokens": 100, "temperature": 0})
    assert status == 400 and "maximum context length" in body["error"]["message"]  # type: ignore[index]


def test_health_and_metrics(server: str) -> None:
    assert urllib.request.urlopen(server + "/health", timeout=10).status == 200
    text = urllib.request.urlopen(server + "/metrics", timeout=10).read().decode()
    page = parse(text)  # prometheus_client's parser, as for a real vLLM page
    assert page.value("vllm:num_requests_running") == 0.0
    assert page.value("vllm:num_requests_waiting") == 0.0
    assert page.value("vllm:prefix_cache_hits") == 0.0  # a counter, by its family name
    steps = page.histograms[STEP_TOKENS]
    # The demo splits vLLM's 256 bucket at 255 so a step of exactly 256 tokens shows.
    assert [le for le, _ in steps.buckets][6:8] == [255.0, 256.0]
    assert steps.buckets[-1] == (float("inf"), steps.count)
    assert 'vllm:num_requests_running{engine="0",model_name="demo"} 0.0' in text
    assert 'vllm:num_requests_waiting{engine="0",model_name="demo"} 0.0' in text
    assert "vllm:iteration_tokens_total_count" in text
    assert "# TYPE demollm:step_overruns_total counter" in text
    assert 'demollm:step_overruns_total{engine="0",model_name="demo"} ' in text
    assert 'demollm:late_arrivals_total{engine="0",model_name="demo"} 0.0' in text


def test_probe_reports_the_largest_step_the_demo_engine_took(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    e = engine(sos["post"], tmp_path, monkeypatch)
    loop = EngineLoop(e)
    loop.start()
    srv = ApiServer(("127.0.0.1", 0), loop, "demo")
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    settings = ProbeSettings(
        requests=6, fillers=2, prefix_tokens=16, prompt_tokens=24, filler_tokens=20,
        vocab_size=2048, repeats=2, max_tokens=3, logprobs=2, jitter_ms=0.0,
        target_coresidency=1, request_timeout_s=60.0,
    )
    try:
        result = ServerDeterminismProbe(settings).run(
            ServerHandle(url=url, lifetime_id="demo-0", log_path=tmp_path / "none.log")
        )
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()
        loop.stop()
    assert result.verdict is not Verdict.UNTESTABLE, result.message
    d = result.detail
    passes = [d["priming_step_tokens"], *d["step_tokens_per_repeat"]]
    buckets = [StepBucket.from_detail(p) for p in passes]
    assert all(b is not None for b in buckets) and len(buckets) == 3
    # However the arrivals split into steps, the largest step the engine really took lies in
    # the largest bucket reported over the passes (every step belongs to exactly one pass).
    largest = max(buckets, key=lambda b: b.at_most)  # type: ignore[union-attr]
    assert largest is not None and largest.above < max(e.step_sizes) <= largest.at_most
    assert StepBucket.from_detail(d["max_step_tokens"]) == max(
        buckets[1:], key=lambda b: b.at_most  # type: ignore[union-attr]
    )
    assert "largest engine step" in render_server_detail(d)


PROBE = ProbeSettings(requests=4, fillers=2, prefix_tokens=8, prompt_tokens=8, filler_tokens=8,
                      vocab_size=2048, repeats=2, max_tokens=3, logprobs=2, jitter_ms=5.0,
                      target_coresidency=1, request_timeout_s=30.0)


def test_probe_reports_overruns_which_only_delay_the_answers(sos: dict[str, Path]) -> None:
    # A microsecond per step: no real compute fits, so every step overruns, on any machine.
    args = ("--step-overhead-ms", "0.001", "--step-per-token-ms", "0")
    with demo_server(sos["post"], {"VLLM_BATCH_INVARIANT": "1"}, args) as url:
        result = ServerDeterminismProbe(PROBE).run(ServerHandle(url, "t", Path(os.devnull)))
    # The fixed kernel with the switch on never diverges (INCONCLUSIVE if a 20 ms metrics poll
    # missed a repeat that short), however slow the steps.
    assert result.verdict in (Verdict.CLEAN, Verdict.INCONCLUSIVE), result.message
    assert result.detail["step_overruns"] > 0
    assert "ran slower than modelled" in render_server_detail(result.detail)
    assert isinstance(result.detail["jitter_seed"], int)


def test_probe_says_when_requests_came_in_after_their_step(sos: dict[str, Path]) -> None:
    with demo_server(sos["post"], {"VLLM_BATCH_INVARIANT": "1"}) as url:
        body = {"prompt": OTHERS[0], "max_tokens": 2, "temperature": 0}
        meant = time.monotonic()
        assert post(url, body)[0] == 200  # its steps formed at and after `meant`
        # Declared to have arrived at `meant` too, but handed over only now: late.
        late = urllib.request.Request(
            url + "/v1/completions", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "X-Bisect-Arrival": f"{meant:.6f}"},
        )
        with urllib.request.urlopen(late, timeout=60) as resp:
            assert resp.status == 200
        result = ServerDeterminismProbe(PROBE).run(ServerHandle(url, "t", Path(os.devnull)))
    assert result.detail["late_arrivals"] >= 1
    assert "reached the engine after the step they arrived for" in result.message
    assert "came in after their step formed" in render_server_detail(result.detail)


def test_probe_notes_nothing_when_the_clock_kept_up(server: str) -> None:
    # Zero step times turn the clock off: the counters stay 0, so no note. (A server without
    # the counters, vLLM, gives None: tests/test_probe_server.py's servers have none.)
    result = ServerDeterminismProbe(PROBE).run(ServerHandle(server, "t", Path(os.devnull)))
    assert result.detail["step_overruns"] in (0, None)
    assert result.detail["late_arrivals"] in (0, None)
    assert "reached the engine after" not in result.message


def test_health_is_503_once_the_engine_dies(
    sos: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = EngineLoop(engine(sos["pre"], tmp_path, monkeypatch))
    loop.start()
    srv = ApiServer(("127.0.0.1", 0), loop, "demo")
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        assert urllib.request.urlopen(url + "/health", timeout=10).status == 200
        # A request that skipped validation crashes the step, as a real engine bug would.
        doomed = Request("cmpl-x", [10**9], 2, 0)
        with pytest.raises(RuntimeError, match="engine is dead"):
            loop.submit(doomed).result(timeout=30)
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(url + "/health", timeout=10)
        assert info.value.code == 503
        assert post(url, {"prompt": [1, 2], "max_tokens": 1, "temperature": 0})[0] == 503
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()
        loop.stop()
