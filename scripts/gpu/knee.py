"""Where co-residency falls as servers are added to one GPU (issue 39, item 2): the knee that
``[runtime] lifetimes_per_gpu = "auto"`` stops at (``bisect_tool.runtime.sizing``).

    python scripts/gpu/knee.py RECIPE [--counts 1,2,4,6,8,10,12] [--gpu 0] [--out DIR]
    python scripts/gpu/knee.py RECIPE --counts 4 --gpu 0,1,2,3     (issue 44: k GPUs at once)

For each count n: n fresh server lifetimes of the recipe's pinned stack at once on one GPU (its
own extension in place: a clean or buggy verdict is beside the point here), each server told
the KV cache size and memory share "auto" would give n of them, each running the recipe's
probe. Printed per n, and written to DIR/knee.tsv: how many lifetimes reached the target
co-residency in every repeat, the least and median peak co-residency, the mean boot and probe
seconds, the round's wall time, lifetimes per hour at that count (n x 3600 / round seconds),
and the memory each server held (nvidia-smi, used memory over the round's peak / n). Nothing
backs off while it measures. Each lifetime's verdict, message and probe detail go to
DIR/lifetimes.jsonl. Run by scripts/gpu/knee.sh on the GPU machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bisect_tool.recipes import recipe as recipe_mod  # noqa: E402
from bisect_tool.evaluate.server import server_evaluator  # noqa: E402
from bisect_tool.interfaces import SwapSet  # noqa: E402
from bisect_tool.runtime.gpus import GpuPool  # noqa: E402
from bisect_tool.runtime.local import LocalBackend  # noqa: E402
from bisect_tool.runtime.sizing import GIB, read_cards, size  # noqa: E402
from bisect_tool.runtime.weights import resolve_weights  # noqa: E402
from bisect_tool.values import Verdict  # noqa: E402


class _Given:
    def __init__(self, swap: SwapSet) -> None:
        self.swap = swap

    def get(self, commit: str, tags: object = ()) -> SwapSet:
        return self.swap

    def prefetch(self, commits: object, tags: object) -> None:
        return None


def _used_mib(gpu: str) -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "-i", gpu, "--query-gpu=memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20, check=False).stdout
        return int(out.strip().splitlines()[0])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


class _Peak:
    """The GPU's used memory, sampled every second while a round runs."""

    def __init__(self, gpu: str) -> None:
        self.gpu, self.peak, self._stop = gpu, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.peak = max(self.peak, _used_mib(self.gpu) or 0)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def one_round(recipe: Any, gpus: list[str], n: int, log_dir: Path) -> dict[str, Any]:
    """``n`` lifetimes a GPU on each of ``gpus`` at once (issue 44: k GPUs against one)."""
    runtime = recipe.runtime
    gpu = gpus[0]
    cards = read_cards(gpus, runtime.interpreter(), runtime.env)
    found = size(runtime, recipe.probe, cards, most=n)
    args = found.server_args(runtime.server_args) if found is not None else runtime.server_args
    runtime = dataclasses.replace(runtime, gpus=tuple(gpus), lifetimes_per_gpu=n,
                                  server_args=args)
    pool = GpuPool(tuple(gpus), per_gpu=n)
    n *= len(gpus)
    backend = LocalBackend(runtime, session=f"knee{n}", log_dir=log_dir)
    pinned = backend.package_dir("vllm") / "_C_stable_libtorch.abi3.so"
    swap = SwapSet("pinned" + "0" * 34, {"vllm/_C_stable_libtorch.abi3.so": pinned})
    evaluator = server_evaluator(dataclasses.replace(recipe, runtime=runtime), _Given(swap),
                                 backend, session=f"knee{n}", log_dir=log_dir, tags={},
                                 gpu_lease=pool.lease)
    base = _used_mib(gpu) or 0
    started = time.monotonic()
    try:
        with _Peak(gpu) as peak, ThreadPoolExecutor(n) as threads:
            results = list(threads.map(
                lambda i: evaluator.run_lifetime(swap, f"knee-{n}-{i}", {}, sequential=False),
                range(n)))
    finally:
        backend.close()
    wall = time.monotonic() - started
    # each lifetime's verdict, message and probe detail, one line each (the table keeps counts)
    with (log_dir.parent / "lifetimes.jsonl").open("a") as f:
        for i, r in enumerate(results):
            f.write(json.dumps({"servers": n, "lifetime": i, "verdict": str(r.verdict),
                                "message": r.message, "detail": r.detail}, default=str) + "\n")
    peaks = [min((p for p in r.detail.get("coresidency_per_repeat") or [] if p is not None),
                 default=0) for r in results]
    target = int(results[0].detail.get("target_coresidency") or 0)
    timing = [r.detail.get("timing") or {} for r in results]
    return {
        "servers": n,
        "reached": sum(1 for p in peaks if p >= target),
        "target": target,
        "least": min(peaks),
        "median": statistics.median(peaks),
        "verdicts": ",".join(sorted({str(r.verdict) for r in results})),
        "untestable": sum(r.verdict is Verdict.UNTESTABLE for r in results),
        "boot_s": statistics.mean(float(t.get("boot_s") or 0) for t in timing),
        "probe_s": statistics.mean(float(t.get("probe_s") or 0) for t in timing),
        "round_s": wall,
        "per_hour": n * 3600 / wall,
        "mib_per_server": (peak.peak - base) / n if peak.peak else float("nan"),
        "kv_gib": (found.kv_cache_bytes / GIB) if found is not None else float("nan"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/gpu/knee.py")
    parser.add_argument("recipe")
    parser.add_argument("--counts", default="1,2,4,6,8,10,12")
    parser.add_argument("--gpu", default="0",
                        help="the GPU, or several (0,1,2,3): COUNT lifetimes on each at once")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    recipe = resolve_weights(recipe_mod.load(args.recipe), progress=print)
    args.out.mkdir(parents=True, exist_ok=True)
    cols = ("servers", "reached", "target", "least", "median", "verdicts", "untestable",
            "boot_s", "probe_s", "round_s", "per_hour", "mib_per_server", "kv_gib")
    table = args.out / "knee.tsv"
    table.write_text("\t".join(cols) + "\n")
    print("servers  reached/target  least  median  boot_s  probe_s  round_s  lifetimes/h  "
          "MiB/server  verdicts", flush=True)
    for n in (int(c) for c in args.counts.split(",") if c):
        row = one_round(recipe, args.gpu.split(","), n, args.out / f"logs-{n}")
        with table.open("a") as f:
            f.write("\t".join(f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c])
                              for c in cols) + "\n")
        print(f"{n:7d}  {row['reached']:3d}/{n:<3d} of {row['target']:<3d}  {row['least']:5d}  "
              f"{row['median']:6.1f}  {row['boot_s']:6.1f}  {row['probe_s']:7.1f}  "
              f"{row['round_s']:7.1f}  {row['per_hour']:11.0f}  {row['mib_per_server']:10.0f}  "
              f"{row['verdicts']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
