"""Ray backend throughput: demo-target lifetimes per minute on 1, 2 and 4 logical GPUs.

    sudo-less root: .venv/bin/python bench/ray_bench.py [--lifetimes 8] [--gpus 1,2,4]

For each GPU count a fresh one-node Ray cluster (``--num-gpus G``) runs ``lifetimes`` lifetimes of
the demo's bad end through ``RayEvaluator``, G at a time, after one untimed warm-up lifetime per
GPU (Ray worker start, the pinned schema dump). The baseline is the same lifetimes through the
local backend in-process, one at a time, measured in the same run. Printed: lifetimes per minute,
the ratio against 1 Ray GPU, and the scheduling overhead per lifetime (task wall on the driver
minus the lifetime's own wall on the node). Everything runs in a loopback-only network namespace
(see tests/test_ray.py for why). The demo engine is CPU-bound, so on a 2-core machine the scaling
ratio is bounded by the cores, not by Ray; the overhead is the figure that carries over.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PORT = 6392


def _prepare(workdir: Path) -> tuple[Path, Path, str]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_ray import _demo_recipe

    from bisect_tool.demo.history import generate

    history = generate(workdir / "repo", seed=0, commits=60)
    recipe = _demo_recipe(workdir)
    sha = subprocess.run(
        ["git", "-C", str(workdir / "repo"), "rev-parse", f"{history.bad_tag}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return workdir / "repo", recipe, sha


def inner(workdir: Path, gpus: int, lifetimes: int, out: Path) -> None:
    from bisect_tool.artifacts import make_provider
    from bisect_tool.evaluate.ray import _node_evaluator, ray_evaluator
    from bisect_tool.recipes import recipe as recipe_mod

    recipe = recipe_mod.load(str(workdir / "demo-recipe.toml"))
    sha = (workdir / "sha").read_text().strip()
    session = f"bench{gpus}"
    row: dict[str, Any] = {"gpus": gpus, "lifetimes": lifetimes}
    with make_provider(recipe.artifacts, workdir / "repo", log_dir=workdir / "logs") as provider:
        swap = provider.get(sha)
        if gpus == 0:  # baseline: the local backend in this process, one at a time
            local = _node_evaluator(recipe.runtime, recipe.probe, session, swap)
            local.evaluate(sha, "warm-0")
            started = time.monotonic()
            walls = [local.evaluate(sha, f"{sha[:12]}-{i}").duration_s for i in range(lifetimes)]
            row.update(wall_s=time.monotonic() - started, lifetime_s=statistics.mean(walls))
        else:
            with ray_evaluator(provider, recipe, session=session, tags={}) as ev:
                assert ev.parallel == gpus, (ev.parallel, gpus)
                with ThreadPoolExecutor(gpus) as pool:
                    list(pool.map(lambda i: ev.evaluate(sha, f"warm-{i}"), range(gpus)))
                    started = time.monotonic()
                    obs = list(
                        pool.map(lambda i: ev.evaluate(sha, f"{sha[:12]}-{i}"), range(lifetimes))
                    )
                    wall = time.monotonic() - started
            timing = [o.detail["timing"] for o in obs]
            row.update(
                wall_s=wall,
                lifetime_s=statistics.mean(t["task_s"] - t["schedule_s"] for t in timing),
                schedule_s=statistics.mean(t["schedule_s"] for t in timing),
                schedule_max_s=max(t["schedule_s"] for t in timing),
                verdicts=sorted({str(o.verdict) for o in obs}),
            )
    row["per_min"] = 60.0 * lifetimes / row["wall_s"]
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


def outer(lifetimes: int, gpu_counts: list[int]) -> None:
    with tempfile.TemporaryDirectory(prefix="rbench") as tmp:
        workdir = Path(tmp) / "w"
        workdir.mkdir()
        _repo, _recipe, sha = _prepare(workdir)
        (workdir / "sha").write_text(sha)
        out = workdir / "rows.jsonl"
        me = Path(__file__).resolve()
        py = sys.executable
        steps = [f"{py} {me} inner --workdir {workdir} --gpus 0 -n {lifetimes} --out {out}"]
        for g in gpu_counts:
            steps.append(
                f"ray start --head --port {PORT} --node-ip-address 127.0.0.1 --num-cpus 8 "
                f"--num-gpus {g} --include-dashboard=false --disable-usage-stats "
                f"--temp-dir {tmp}/ray >/dev/null || exit 3\n"
                f"RAY_ADDRESS=127.0.0.1:{PORT} {py} {me} inner --workdir {workdir} --gpus {g} "
                f"-n {lifetimes} --out {out}; rc=$?\n"
                "ray stop --force >/dev/null 2>&1; [ $rc = 0 ] || exit $rc"
            )
        script = textwrap.dedent(
            f"""\
            ip link set lo up
            export PATH={Path(py).parent}:$PATH RAY_USAGE_STATS_ENABLED=0
            """
        ) + "\n".join(steps)
        proc = subprocess.run(
            ["unshare", "--net", "--pid", "--fork", "--mount-proc", "bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=1200,
            cwd=ROOT,
        )
        if proc.returncode != 0:
            sys.exit(
                f"bench failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
            )
        rows = [json.loads(line) for line in out.read_text().splitlines()]
    base = next(r for r in rows if r["gpus"] == 1)
    local = next(r for r in rows if r["gpus"] == 0)
    print(f"demo lifetimes, {lifetimes} per row (after warm-up), bad end {sha[:12]}")
    print("backend   GPUs  lifetimes/min  vs 1 GPU  lifetime s  sched. overhead s (mean/max)")
    print(
        f"local        1  {local['per_min']:13.1f}  {local['per_min'] / base['per_min']:8.2f}"
        f"  {local['lifetime_s']:10.2f}  -"
    )
    for r in rows:
        if r["gpus"] == 0:
            continue
        print(
            f"ray       {r['gpus']:4d}  {r['per_min']:13.1f}  {r['per_min'] / base['per_min']:8.2f}"
            f"  {r['lifetime_s']:10.2f}  {r['schedule_s']:.3f} / {r['schedule_max_s']:.3f}"
            f"  {','.join(r['verdicts'])}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", default="outer", choices=["outer", "inner"])
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--gpus", default="1,2,4")
    parser.add_argument("-n", "--lifetimes", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.mode == "inner":
        inner(args.workdir, int(args.gpus), args.lifetimes, args.out)
    else:
        outer(args.lifetimes, [int(g) for g in args.gpus.split(",")])


if __name__ == "__main__":
    main()
