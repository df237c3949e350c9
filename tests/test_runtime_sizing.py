"""``[runtime] lifetimes_per_gpu = "auto"`` (issue 39, item 2): how many servers a card holds
from its free memory, what each server is told, and the back-off when the probe's co-residency
falls with the servers sharing a card, on real demo servers sharing one fake GPU."""

from __future__ import annotations

import os
import stat
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bisect_tool.recipes.recipe import ProbeSettings, Recipe, RuntimeSettings
from bisect_tool.run.wiring import gpu_pool, sized
from bisect_tool.runtime.gpus import KV_CACHE_SIZE_FLAG, GpuPool
from bisect_tool.runtime.sizing import (
    AUTO_MOST_PER_GPU,
    AUTO_MOST_SERVERS_PER_GPU,
    GIB,
    SERVER_OVERHEAD_BYTES,
    UTILIZATION_FLAG,
    Card,
    kv_bytes_needed,
    read_cards,
    size,
)
from bisect_tool.values import Verdict

QWEN = Path(__file__).resolve().parents[1] / "bisect_tool" / "recipes" / "models" / "qwen3-0.6b"
H100 = Card("0", int(79.2 * GIB), int(79.6 * GIB))


def checkpoint(tmp_path: Path, weights: int) -> Path:
    """A model folder: the bundled Qwen3-0.6B config and a weights file of ``weights`` bytes."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text((QWEN / "config.json").read_text())
    with (folder / "model.safetensors").open("wb") as f:
        f.truncate(weights)
    return folder


def test_auto_fills_an_h100_up_to_the_most_the_probe_has_shown_to_hold(tmp_path: Path) -> None:
    """A 0.6B model on an 80 GiB card: memory holds a dozen servers; "auto" puts at most
    AUTO_MOST_PER_GPU (on the H100, 4 kept their co-residency, 8 did not), gives the controls'
    three negative-control servers slots of their own, and splits the card's usable memory
    (vLLM's 10 % margin kept) into equal budgets, each server told its KV cache and its share."""
    model = checkpoint(tmp_path, int(1.1 * GIB))
    runtime = RuntimeSettings(gpus=("0",), model=str(model),
                              server_args=("--max-model-len", "1024"))
    found = size(runtime, ProbeSettings(negative_servers=3), [H100])
    assert found is not None
    assert found.per_gpu == AUTO_MOST_PER_GPU and found.controls_own_slot
    budget = int(H100.free - 0.1 * H100.total) // (AUTO_MOST_PER_GPU + 3)
    assert found.kv_cache_bytes == budget - int(1.1 * GIB) - SERVER_OVERHEAD_BYTES
    # the workload's 44 sequences, twice over, fit in what each is told
    needed = kv_bytes_needed(str(model), ProbeSettings(), ("--max-model-len", "1024"))
    assert found.kv_cache_bytes > needed
    args = found.server_args(runtime.server_args)
    assert args[args.index(KV_CACHE_SIZE_FLAG) + 1] == str(found.kv_cache_bytes)
    # vLLM refuses to boot with less than this share of the card free: one budget
    assert float(args[args.index(UTILIZATION_FLAG) + 1]) * H100.total <= budget
    assert "6 lifetimes a GPU" in found.why and "3 more servers for the controls" in found.why


def test_a_small_card_holds_what_its_memory_does_and_keeps_the_recipes_kv_size(
    tmp_path: Path,
) -> None:
    model = checkpoint(tmp_path, 3 * GIB)  # a bigger model on a 24 GiB card
    card = Card("0", 23 * GIB, 24 * GIB)
    runtime = RuntimeSettings(gpus=("0",), model=str(model),
                              server_args=(KV_CACHE_SIZE_FLAG, str(4 * GIB)))
    found = size(runtime, ProbeSettings(), [card])
    assert found is not None
    # (23 - 2.4) GiB usable over 3 + 2 + 4 GiB a server: two fit, none left for the controls
    assert (found.per_gpu, found.controls_own_slot) == (2, False)
    assert found.kv_cache_bytes == 4 * GIB
    assert found.server_args(runtime.server_args).count(KV_CACHE_SIZE_FLAG) == 1
    tiny = size(runtime, ProbeSettings(), [Card("0", 6 * GIB, 8 * GIB)])
    assert tiny is not None and tiny.per_gpu == 1  # never none: one a GPU, as without "auto"
    assert size(runtime, ProbeSettings(), []) is None


def fake_nvidia_smi(folder: Path, free_mib: int, total_mib: int) -> Path:
    """An ``nvidia-smi`` that answers the one query the tool makes, exactly as the real one
    prints it (csv, noheader, nounits), and fails on any other."""
    exe = folder / "nvidia-smi"
    exe.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--query-gpu=index,uuid,memory.free,memory.total" ] && \\
           [ "$2" = "--format=csv,noheader,nounits" ] && [ $# -eq 2 ]; then
          echo "0, GPU-4a3c1f2e-0000-1111-2222-333344445555, {free_mib}, {total_mib}"
          echo "1, GPU-9b8d7c6e-0000-1111-2222-333344445555, {total_mib}, {total_mib}"
          exit 0
        fi
        echo "unexpected arguments: $*" >&2
        exit 9
        """))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_the_cards_are_read_with_nvidia_smi_by_index_or_uuid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvidia_smi(tmp_path, 81_100, 81_559)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    cards = read_cards(["0", "GPU-9b8d7c6e-0000-1111-2222-333344445555"], "python3", {})
    assert [(c.gpu, c.free // 1024**2, c.total // 1024**2) for c in cards] == [
        ("0", 81_100, 81_559), ("GPU-9b8d7c6e-0000-1111-2222-333344445555", 81_559, 81_559)]


def test_a_run_sizes_auto_from_the_card_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bisect_tool.events import Note

    fake_nvidia_smi(tmp_path, 81_100, 81_559)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    model = checkpoint(tmp_path, int(1.1 * GIB))
    recipe = Recipe("r", runtime=RuntimeSettings(gpus=("0",), model=str(model)))
    notes: list[str] = []
    out = sized(recipe, lambda e: notes.append(e.text) if isinstance(e, Note) else None)
    assert out.runtime.lifetimes_per_gpu == AUTO_MOST_PER_GPU
    assert KV_CACHE_SIZE_FLAG in out.runtime.server_args
    assert any("6 lifetimes a GPU" in n for n in notes)
    # and no more than the H100's knee on the card at once, the controls' servers counted
    assert out.runtime.most_servers_per_gpu == AUTO_MOST_SERVERS_PER_GPU == 8
    assert gpu_pool(out.runtime, out.probe).most_servers == 8
    # no GPU listed (the demo's CPU engine, a CPU probe): one slot, nothing read
    plain = sized(Recipe("r"))
    assert plain.runtime.lifetimes_per_gpu == 1 and plain.runtime.server_args == ()
    # a card that cannot be read: one a GPU, said
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    notes.clear()
    blind = sized(recipe, lambda e: notes.append(e.text) if isinstance(e, Note) else None,
                  read=lambda gpus, python, env: [])
    assert blind.runtime.lifetimes_per_gpu == 1 and "could not be read" in notes[0]


def test_back_off_lowers_a_cards_share_to_one_less_than_shared_it() -> None:
    pool = GpuPool(["0", "1"], per_gpu=6)
    assert pool.size == 12
    assert pool.back_off("0", 6) and pool.capacity("0") == 5 and pool.size == 11
    assert not pool.back_off("0", 7)  # a lifetime that saw more than the card holds now
    assert not pool.back_off("0", 1)  # alone on its card: crowding is not why
    assert pool.back_off("0", 2) and pool.capacity("0") == 1
    assert not pool.back_off("0", 2)  # never below one


@pytest.mark.slow
def test_on_one_fake_gpu_the_coresidency_falls_as_demo_servers_are_added_and_auto_backs_off(
    tmp_path: Path,
) -> None:
    """Real demo servers (the pinned demollm stack) leasing one fake GPU, "0". demollm models
    crowding (``--crowd-ms``, demollm.server.HandOver): each request's hand-over to its engine
    costs 8 ms for every other demo server registered on the device, one request at a time, so
    a burst spreads as servers are added (no jitter: the burst's spread is the model's alone).
    The probe's 12 requests live ~150 ms of the modelled device: two servers keep all 12 in
    the engine at once (the last is handed over ~90 ms after the first), three (~180 ms) or
    four do not. Four lifetimes at once miss the target
    and lower the card's share to 3, three at once to 2, and two at once are CLEAN at the
    target: the co-residency falls with the servers, and the pool stops where it holds."""
    from bisect_tool.demo.pinned import SERVER_MODULE, STACK_DIR, SWAP_PATH, ensure_pinned_build
    from bisect_tool.evaluate.server import server_evaluator
    from bisect_tool.interfaces import SwapSet
    from bisect_tool.runtime.local import LocalBackend

    kernels = ensure_pinned_build()
    probe = ProbeSettings(requests=8, fillers=4, prefix_tokens=4, prompt_tokens=8,
                          filler_tokens=8, vocab_size=2048, repeats=2, max_tokens=16,
                          logprobs=2, jitter_ms=0.0, request_timeout_s=30.0)
    runtime = RuntimeSettings(
        pinned_package_dir=str(STACK_DIR), server_module=SERVER_MODULE, model="demo",
        server_args=("--step-overhead-ms", "8", "--step-per-token-ms", "0.2",
                     "--admission-lag-ms", "300", "--crowd-ms", "8"),
        env={"VLLM_BATCH_INVARIANT": "1", "DEMOLLM_DEVICE_DIR": str(tmp_path / "device")},
        gpus=("0",), lifetimes_per_gpu=4, boot_timeout_s=60.0)
    pool = GpuPool(runtime.gpus, per_gpu=4)
    swap = SwapSet("d" * 40, {SWAP_PATH: kernels})

    class Given:
        def get(self, commit: str, tags: object = ()) -> SwapSet:
            return swap

        def prefetch(self, commits: object, tags: object) -> None:
            return None

    backend = LocalBackend(runtime, session="crowd", log_dir=tmp_path / "logs", grace_s=5.0)
    evaluator = server_evaluator(Recipe("crowd", runtime=runtime, probe=probe), Given(),
                                 backend, session="crowd", log_dir=tmp_path / "logs", tags={},
                                 gpu_lease=pool.lease, crowding=pool)
    seen: dict[int, list[tuple[Verdict, int]]] = {}
    try:
        for servers in (4, 3, 2):
            assert pool.capacity("0") == servers
            ids = [f"crowd-{servers}-{n}" for n in range(servers)]
            with ThreadPoolExecutor(servers) as lifetimes:
                done = list(lifetimes.map(
                    lambda lid: evaluator.run_lifetime(swap, lid, {}, sequential=False), ids))
            seen[servers] = [(r.verdict, int(r.detail["max_coresidency"])) for r in done]
            assert all(r.detail["gpu"]["servers"] == servers for r in done), seen
    finally:
        backend.close()
    assert {v for v, _ in seen[4]} == {v for v, _ in seen[3]} == {Verdict.INCONCLUSIVE}, seen
    assert seen[2] == [(Verdict.CLEAN, 12)] * 2, seen
    assert pool.capacity("0") == 2
    assert max(c for _, c in seen[4]) <= min(c for _, c in seen[3]) < 12, seen


def test_lifetimes_spread_over_every_gpu_of_the_host_several_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44: `--gpus 0,1` with "auto": each card holds what its memory allows, and leases
    go to the least crowded card first, so the first lifetimes take one GPU each, then share."""
    from bisect_tool.run.wiring import gpu_pool

    fake_nvidia_smi(tmp_path, 81_100, 81_559)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    model = checkpoint(tmp_path, int(1.1 * GIB))
    recipe = sized(Recipe("r", runtime=RuntimeSettings(gpus=("0", "1"), model=str(model))))
    pool = gpu_pool(recipe.runtime, recipe.probe)
    assert recipe.runtime.lifetimes_per_gpu == AUTO_MOST_PER_GPU
    assert pool.size == 2 * AUTO_MOST_PER_GPU
    with pool.lease() as a, pool.lease() as b, pool.lease() as c, pool.lease() as d:
        assert (a, b, c, d) == ("0", "1", "0", "1")
        assert pool.sharing("0") == pool.sharing("1") == 2
