"""Lifetimes spread over k GPUs (issue 44): lifetimes per hour on k GPUs against one, measured in
the same session, and the time to answer of the ten-release range with k GPUs.

    python bench/gpus.py [--gpus 1,2] [--lifetimes 8] [--seeds 8] [--scale 0.01]

Throughput: real demo lifetimes (the pinned demollm stack, the demo recipe's probe on its bad
end) through the local backend, the server evaluator and the GPU pool over k fake GPUs ("0",
"1", ...: the ids reach CUDA_VISIBLE_DEVICES, which demollm ignores; each demollm process models
its own device, its steps sleeping on its own clock), k lifetimes at once, after one untimed
lifetime a GPU. Printed: lifetimes per hour, and the ratio against one GPU over k (issue 44's
goal: at least 0.9). The demo's CPU side is real, so on a machine of few cores the cores bound
the ratio, not the pool; the same through Ray: ``python bench/ray_bench.py --gpus 1,2``.

Time to answer: the real engine and bisect design over the ten-release range (the op check
narrows, lifetimes confirm: bench/slots.py's simulation, each lifetime as long as one of the H100
record's, x ``--scale`` wall seconds a GPU second), with k GPUs of 1 and of 6 lifetimes each
(6: "auto"'s most on an H100, bisect_tool/runtime/sizing.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bisect_tool.demo.pinned import STACK_DIR, SWAP_PATH, ensure_pinned_build  # noqa: E402
from bisect_tool.evaluate.server import server_evaluator  # noqa: E402
from bisect_tool.interfaces import SwapSet  # noqa: E402
from bisect_tool.recipes import recipe as recipe_mod  # noqa: E402
from bisect_tool.runtime.gpus import GpuPool  # noqa: E402
from bisect_tool.runtime.local import LocalBackend  # noqa: E402


class _Given:
    def __init__(self, swap: SwapSet) -> None:
        self.swap = swap

    def get(self, commit: str, tags: object = ()) -> SwapSet:
        return self.swap

    def prefetch(self, commits: object, tags: object) -> None:
        return None


def throughput(gpus: int, lifetimes: int, workdir: Path) -> dict[str, Any]:
    """``lifetimes`` demo lifetimes over ``gpus`` fake GPUs, one a GPU, ``gpus`` at once."""
    recipe = recipe_mod.load("demo")
    ids = tuple(str(g) for g in range(gpus))
    runtime = dataclasses.replace(recipe.runtime, pinned_package_dir=str(STACK_DIR), gpus=ids,
                                  lifetimes_per_gpu=1)
    recipe = dataclasses.replace(recipe, runtime=runtime)
    swap = SwapSet("b" * 40, {SWAP_PATH: ensure_pinned_build()})
    pool = GpuPool(ids)
    backend = LocalBackend(runtime, session=f"gpus{gpus}", log_dir=workdir / "logs")
    evaluator = server_evaluator(recipe, _Given(swap), backend, session=f"gpus{gpus}",
                                 log_dir=workdir / "logs", tags={}, gpu_lease=pool.lease,
                                 crowding=pool)
    try:
        with ThreadPoolExecutor(gpus) as threads:
            list(threads.map(lambda i: evaluator.evaluate(swap.commit, f"warm-{i}"),
                             range(gpus)))
            started = time.monotonic()
            seen = list(threads.map(lambda i: evaluator.evaluate(swap.commit, f"l-{i}"),
                                    range(lifetimes)))
            wall = time.monotonic() - started
    finally:
        backend.close()
    return {
        "gpus": gpus,
        "per_hour": lifetimes * 3600 / wall,
        "lifetime_s": statistics.mean(o.duration_s for o in seen),
        "verdicts": sorted({str(o.verdict) for o in seen}),
        "on": sorted({str((o.detail.get("gpu") or {}).get("id")) for o in seen}),
    }


def time_to_answer(gpus: int, per_gpu: int, seeds: int, scale: float) -> list[dict[str, Any]]:
    import slots

    runs = []
    for seed in range(seeds):
        with tempfile.TemporaryDirectory(prefix="bench-gpus-") as tmp:
            runs.append(slots.slots_run(Path(tmp), gpus * per_gpu, seed, scale))
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/gpus.py")
    parser.add_argument("--gpus", default="1,2")
    parser.add_argument("--lifetimes", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--scale", type=float, default=0.01)
    args = parser.parse_args(argv)
    counts = [int(g) for g in args.gpus.split(",") if g]
    print(f"# python bench/gpus.py --gpus {args.gpus} --lifetimes {args.lifetimes} "
          f"--seeds {args.seeds} --scale {args.scale}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-gpus-") as tmp:
        for k in counts:
            rows.append(throughput(k, args.lifetimes, Path(tmp) / str(k)))
    base = next((r for r in rows if r["gpus"] == 1), rows[0])
    print(f"\ndemo lifetimes through --gpus, one a GPU, {args.lifetimes} a row after one warm-up "
          "a GPU (same session):")
    print("GPUs  lifetimes/h  vs 1 GPU  / k (goal >= 0.9)  lifetime s  GPUs used  verdicts")
    for r in rows:
        ratio = r["per_hour"] / base["per_hour"]
        print(f"{r['gpus']:4d}  {r['per_hour']:11.0f}  {ratio:8.2f}  {ratio / r['gpus']:15.2f}  "
              f"{r['lifetime_s']:10.1f}  {','.join(r['on']):>9}  {','.join(r['verdicts'])}")
    print(f"\ntime to answer, tiered, 10 releases, H100 lifetime lengths, {args.seeds} histories "
          "(GPU seconds, simulated):")
    for per_gpu in (1, 6):
        for k in sorted({1, *counts, 4, 8}):
            runs = time_to_answer(k, per_gpu, args.seeds, args.scale)
            secs = [r["seconds"] for r in runs]
            print(f"  {k} GPU(s) x {per_gpu} a GPU: mean {statistics.mean(secs):5.0f} s (median "
                  f"{statistics.median(secs):.0f}); lifetimes mean "
                  f"{statistics.mean(r['lifetimes'] for r in runs):.1f}; right "
                  f"{sum(r['right'] for r in runs)}/{len(runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
