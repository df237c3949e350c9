"""demollm: speaks vLLM's API, and is batch-invariant everywhere except the planted RMSNorm.

The proof: with the fixed kernel (v0.27.0, switch on) a request's output is bitwise the same
alone, among 40 others in one big step, and under various arrival timings; with the pinned
(v0.26.0) kernel it changes exactly when one of its steps crosses 256 tokens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
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
from bisect_tool.recipe import ProbeSettings
from bisect_tool.values import Verdict

sys.path.insert(0, str(STACK_DIR))
from demollm._custom_ops import Kernels  # noqa: E402
from demollm.engine import EngineLoop, LLMEngine, Request, SchedulerConfig  # noqa: E402
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
    so: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch, invariant: bool = True
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
    return LLMEngine(DemoModel(ModelConfig(), kernels), SchedulerConfig())


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
    with demo_server(sos["pre"], {"VLLM_BATCH_INVARIANT": "1"}, ("--max-num-seqs", "16")) as url:
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
