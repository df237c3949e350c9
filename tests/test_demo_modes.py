"""demollm's switches that vLLM has too (issue 40): CUDA graphs' warm-up, the FlashInfer-like
sampler, prefix caching. Each changes a request's numbers in its own way, and only in its own
way: with all three off the engine is the batch-invariant engine of tests/test_demo_engine.py.

Every step here stays below 256 tokens, so the pinned (v0.26.0) kernel with the invariance
switch on is batch-invariant in them: what moves a row is the switch under test, nothing else.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from bisect_tool.demo.calibrate import demo_server
from bisect_tool.demo.pinned import STACK_DIR, ensure_pinned_build

sys.path.insert(0, str(STACK_DIR))
from demollm._custom_ops import Kernels  # noqa: E402
from demollm.engine import (  # noqa: E402
    PREFIX_BLOCK,
    SAMPLER_SPLIT_ROWS,
    WARMUP_STEPS,
    EngineOptions,
    LLMEngine,
    SchedulerConfig,
)
from demollm.model import DemoModel, ModelConfig  # noqa: E402

_n = 0


@pytest.fixture(scope="module")
def kernels_so() -> Path:
    return ensure_pinned_build()


def engine(so: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch,
           options: EngineOptions | None = None) -> LLMEngine:
    global _n
    _n += 1
    copy = tmp / f"m{_n}.so"
    shutil.copyfile(so, copy)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    kernels = Kernels(copy)
    kernels.rms_norm(np.ones((1, 8), np.float32), None, 1e-6)  # caches the switch now
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    return LLMEngine(DemoModel(ModelConfig(batch_invariant=True), kernels), SchedulerConfig(),
                     options)


def prompt(seed: int, n: int = 8) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(100, 1500, n)]


Out = list[tuple[int, float, list[tuple[int, float]]]]


def serve(e: LLMEngine, prompts: list[list[int]], max_tokens: int = 4) -> list[Out]:
    """All of ``prompts`` admitted in one step, run to the end; each one's tokens and logprobs."""
    requests = [e.make_request(p, max_tokens, 3) for p in prompts]
    for r in requests:
        e.add_request(r)
    while e.has_work():
        e.step()
    assert max(e.step_sizes) < 256  # the pinned kernel stays batch-invariant
    return [[(o.token_id, o.logprob, o.top) for o in r.outputs] for r in requests]


def test_cuda_graphs_warm_up_moves_the_first_request_after_start_only(
    kernels_so: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = engine(kernels_so, tmp_path, monkeypatch, EngineOptions(WARMUP_STEPS))
    first, = serve(compiled, [prompt(1)])
    later, = serve(compiled, [prompt(1)])
    # Its prefill and first decode ran before "graph capture": their logprobs moved, and so
    # did every later position's, which reads the running sums (its "KV cache") they wrote;
    # the tokens stayed. Once warmed up, the same request answers the same every time.
    assert compiled.steps > WARMUP_STEPS
    assert first[0][1:] != later[0][1:] and first != later
    assert [t for t, _, _ in first] == [t for t, _, _ in later]
    assert serve(compiled, [prompt(1)]) == [later]
    eager = engine(kernels_so, tmp_path, monkeypatch)
    assert serve(eager, [prompt(1)]) == serve(eager, [prompt(1)]) == [later]


def test_the_flashinfer_sampler_makes_a_row_depend_on_how_many_share_its_step(
    kernels_so: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crowd = [prompt(s) for s in range(2, 2 + SAMPLER_SPLIT_ROWS)]  # 8 + 1 rows: tiled
    few = crowd[: SAMPLER_SPLIT_ROWS - 2]  # 6 + 1 rows: not tiled
    on = EngineOptions(flashinfer_sampler=True)
    alone = serve(engine(kernels_so, tmp_path, monkeypatch, on), [prompt(1)])[0]
    among_few = serve(engine(kernels_so, tmp_path, monkeypatch, on), [prompt(1), *few])[0]
    among_many = serve(engine(kernels_so, tmp_path, monkeypatch, on), [prompt(1), *crowd])[0]
    assert among_few == alone
    assert among_many != alone  # its first step held 9 rows
    assert [t for t, _, _ in among_many] == [t for t, _, _ in alone]  # last bits, as in #51187
    # off (the demo's default, VLLM_USE_FLASHINFER_SAMPLER=0): the same row either way
    off = [serve(engine(kernels_so, tmp_path, monkeypatch), ps)[0]
           for ps in ([prompt(1)], [prompt(1), *crowd])]
    assert off[0] == off[1]


def test_prefix_caching_a_warm_prompt_differs_from_its_cold_self(
    kernels_so: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    long = prompt(7, 3 * PREFIX_BLOCK)  # 48 tokens: 32 cacheable, the last block computed
    cached = engine(kernels_so, tmp_path, monkeypatch, EngineOptions(prefix_caching=True))
    cold, = serve(cached, [long])
    assert cached.prefix_hits == 0 and cached.step_sizes[0] == len(long)
    warm, = serve(cached, [long])
    assert cached.prefix_hits == 2 * PREFIX_BLOCK  # two blocks came from the cache
    assert cached.step_sizes[len(cold)] == PREFIX_BLOCK  # its prefill computed one block
    assert warm != cold  # the cached blocks' sums meet the new ones in another order
    assert serve(cached, [long]) == [warm]  # warm is reproducible
    # a prompt sharing only the first block hits that block
    other = long[:PREFIX_BLOCK] + prompt(8, 2 * PREFIX_BLOCK)
    serve(cached, [other])
    assert cached.prefix_hits == 2 * 2 * PREFIX_BLOCK + PREFIX_BLOCK
    plain = engine(kernels_so, tmp_path, monkeypatch)  # off: every request is cold
    assert serve(plain, [long]) == serve(plain, [long]) == [cold]
    assert plain.prefix_hits == 0


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


@pytest.mark.parametrize("eager", [False, True])
def test_the_server_warms_up_unless_enforce_eager_as_vllm(kernels_so: Path, eager: bool) -> None:
    body = {"prompt": prompt(3), "max_tokens": 4, "temperature": 0, "logprobs": 2}
    args = ["--step-overhead-ms", "0", "--step-per-token-ms", "0"] + (
        ["--enforce-eager"] if eager else [])
    with demo_server(kernels_so, {"VLLM_BATCH_INVARIANT": "1"}, args) as url:
        first, second, third = (post(url, body)["choices"] for _ in range(3))
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    assert second == third
    assert (first == second) is eager
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="demo"} 0.0' in metrics


def test_the_server_reads_the_sampler_flag_and_the_prefix_caching_flag(kernels_so: Path) -> None:
    body = {"prompt": prompt(4, 3 * PREFIX_BLOCK), "max_tokens": 2, "temperature": 0,
            "logprobs": 2}
    args = ["--step-overhead-ms", "0", "--step-per-token-ms", "0", "--enforce-eager"]
    env = {"VLLM_BATCH_INVARIANT": "1"}
    with demo_server(kernels_so, env, args) as url:
        plain = post(url, body)["choices"]
    with demo_server(kernels_so, {**env, "VLLM_USE_FLASHINFER_SAMPLER": "1"}, args) as url:
        sampled = post(url, body)["choices"]
    with demo_server(kernels_so, env, [*args, "--enable-prefix-caching"]) as url:
        cold, warm = (post(url, body)["choices"] for _ in range(2))
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    assert sampled != plain  # renormalised by the sampler
    assert cold == plain and warm != cold
    assert f'vllm:prefix_cache_hits_total{{engine="0",model_name="demo"}} {2 * PREFIX_BLOCK}.0' \
        in metrics

