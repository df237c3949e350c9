"""Tensor-parallel lifetimes (issue 43): ``[runtime] gpus_per_lifetime`` GPUs of one host a
lifetime, ``--tensor-parallel-size`` passed, the NCCL settings of vLLM's batch-invariance mode
kept, and a GPU pool that packs lifetimes of several GPUs beside single-GPU ones. On fake GPUs:
the ids reach ``CUDA_VISIBLE_DEVICES`` of real server processes, which report what they got."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from bisect_tool.errors import RecipeError
from bisect_tool.interfaces import ProbeResult, ServerHandle, SwapSet
from bisect_tool.recipes.recipe import Recipe, RuntimeSettings, from_dict
from bisect_tool.run.wiring import TP_DETERMINISM_ENV, gpu_pool, tensor_parallel
from bisect_tool.runtime.gpus import GpuPool
from bisect_tool.values import Verdict

SERVER = textwrap.dedent("""
    import json, os, signal, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b""
            if self.path == "/whoami":
                body = json.dumps({"argv": argv, "env": dict(os.environ)}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
""")


def test_a_lifetime_wider_than_the_gpus_listed_is_one_line() -> None:
    with pytest.raises(RecipeError, match="gpus_per_lifetime' is 4 but 'runtime.gpus' lists 2"):
        from_dict({"name": "r", "runtime": {"gpus": ["0", "1"], "gpus_per_lifetime": 4}})
    with pytest.raises(RecipeError, match="gpus_per_lifetime' must be >= 1"):
        from_dict({"name": "r", "runtime": {"gpus_per_lifetime": 0}})


def test_the_pool_leases_a_lifetimes_gpus_together_and_packs_narrow_ones_beside() -> None:
    pool = GpuPool(["0", "1", "2", "3"], width=2)
    assert pool.size == 2
    with pool.lease() as a, pool.lease() as b:
        assert (a, b) == ("0,1", "2,3")
        with pytest.raises(TimeoutError), pool.lease(timeout=0.01):
            pass
    shared = GpuPool(["0", "1"], per_gpu=2, width=2)
    assert shared.size == 2
    with shared.lease() as a, shared.lease() as b:
        assert a == b == "0,1" and shared.sharing("0,1") == 2
    mixed = GpuPool(["0", "1", "2"], width=2)
    with mixed.lease(width=1) as one:
        assert one == "0"
        with mixed.lease() as two:  # the two GPUs with the most shares left
            assert two == "1,2"
            with pytest.raises(TimeoutError), mixed.lease(timeout=0.01, width=1):
                pass


def test_a_wide_lease_is_not_starved_by_narrow_ones() -> None:
    """Leases are granted in the order they were asked for: a TP lifetime waiting for two GPUs
    gets them before a single-GPU lease asked after it, which would otherwise take each GPU as
    it frees."""
    pool = GpuPool(["0", "1"])
    order: list[str] = []
    with pool.lease(width=1):
        wide_waiting = threading.Event()

        def wide() -> None:
            wide_waiting.set()
            with pool.lease(timeout=10, width=2):
                order.append("wide")

        def narrow() -> None:
            with pool.lease(timeout=10, width=1):
                order.append("narrow")

        first = threading.Thread(target=wide)
        first.start()
        assert wide_waiting.wait(5)
        deadline = time.monotonic() + 5
        while not pool._queue and time.monotonic() < deadline:  # noqa: SLF001 (it queued)
            time.sleep(0.01)
        second = threading.Thread(target=narrow)
        second.start()
    first.join(10)
    second.join(10)
    assert order == ["wide", "narrow"]


def test_tp_lifetimes_get_their_gpus_the_tp_size_and_vllms_nccl_settings(tmp_path: Path) -> None:
    """Two TP=2 lifetimes at once on four fake GPUs: each server process sees its two GPUs in
    CUDA_VISIBLE_DEVICES, --tensor-parallel-size 2, and every NCCL setting vLLM's
    batch-invariance mode sets (vllm/model_executor/layers/batch_invariant.py,
    override_envs_for_invariance); a setting the recipe gives wins."""
    from bisect_tool.evaluate.server import server_evaluator
    from bisect_tool.runtime.local import LocalBackend

    site = tmp_path / "site"
    (site / "tpstack").mkdir(parents=True)
    (site / "tpstack" / "__init__.py").write_text("")
    (site / "tpstack" / "server.py").write_text(SERVER)
    kernels = tmp_path / "_kernels.so"
    kernels.write_bytes(b"\0" * 16)
    runtime = RuntimeSettings(
        python=sys.executable, pinned_package_dir=str(site), server_module="tpstack.server",
        gpus=("0", "1", "2", "3"), gpus_per_lifetime=2, lifetimes_per_gpu=1,
        env={"VLLM_BATCH_INVARIANT": "1", "NCCL_MAX_NCHANNELS": "2"}, boot_timeout_s=30.0)
    recipe = tensor_parallel(Recipe("tp", runtime=runtime))
    pool = gpu_pool(recipe.runtime)
    swap = SwapSet("e" * 40, {"tpstack/_kernels.so": kernels})

    class Given:
        def get(self, commit: str, tags: object = ()) -> SwapSet:
            return swap

        def prefetch(self, commits: object, tags: object) -> None:
            return None

    class WhoAmI:
        def run(self, server: ServerHandle, is_alive: object = None) -> ProbeResult:
            seen = httpx.get(server.url + "/whoami", timeout=10).json()
            return ProbeResult(Verdict.CLEAN, {"seen": seen}, "")

    backend = LocalBackend(recipe.runtime, session="tp", log_dir=tmp_path / "logs")
    evaluator = server_evaluator(recipe, Given(), backend, session="tp",
                                 log_dir=tmp_path / "logs", tags={}, gpu_lease=pool.lease)
    evaluator.probe_factory = lambda sequential: WhoAmI()
    both = threading.Barrier(2, timeout=20)

    def lifetime(lid: str) -> dict[str, Any]:
        with evaluator.boot(swap, lid, {}):
            both.wait()  # the two lifetimes hold their GPUs at once
        result = evaluator.run_lifetime(swap, lid + "-probe", {}, sequential=False)
        return dict(result.detail["seen"])

    try:
        with ThreadPoolExecutor(2) as threads:
            seen = list(threads.map(lifetime, ["tp-a", "tp-b"]))
    finally:
        backend.close()
    assert sorted(s["env"]["CUDA_VISIBLE_DEVICES"] for s in seen) == ["0,1", "2,3"]
    for s in seen:
        argv, env = s["argv"], s["env"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
        expected = {**TP_DETERMINISM_ENV, "NCCL_MAX_NCHANNELS": "2"}
        assert {k: env.get(k) for k in expected} == expected
    assert json.dumps(TP_DETERMINISM_ENV)  # plain strings, as an environment takes them


def test_auto_sizing_counts_a_tp_servers_share_of_the_weights_per_gpu(tmp_path: Path) -> None:
    from bisect_tool.recipes.recipe import ProbeSettings
    from bisect_tool.runtime.sizing import GIB, Card, size

    model = tmp_path / "model"
    model.mkdir()
    with (model / "model.safetensors").open("wb") as f:
        f.truncate(16 * GIB)  # 16 GiB of weights, 8 a GPU at TP 2
    card = Card("0", 39 * GIB, 40 * GIB)
    one = size(RuntimeSettings(gpus=("0",), model=str(model)), ProbeSettings(), [card])
    two = size(RuntimeSettings(gpus=("0", "1"), gpus_per_lifetime=2, model=str(model)),
               ProbeSettings(), [card, Card("1", 39 * GIB, 40 * GIB)])
    assert one is not None and two is not None
    # 35 GiB usable a card: one server of 16 + 2 + 3 GiB, or two of 8 + 2 + 3
    assert one.per_gpu == 1 and two.per_gpu == 2
