"""Issue 31's cost figures, each against its limit, with a baseline measured in the same run.

    python bench/cost_bounds.py [--trials 200] [--seeds 8] [--skip-demo] [--quick]

1. **Deterministic runs** (``--deterministic``): the most runs over every flip of a range of N
   = 60 and 252 candidates, by the run's own decision code (``designs.bisect`` driven by
   ``designs.drive``, as ``--run`` sets it up) and by manual mode's (``bisect good|bad``),
   against ceil(log2 N) + 2 and against classic bisection on the same flips.
2. **The same probe without the flag**: a probe that never contradicts itself, against
   2 ceil(log2 N).
3. **Noisy cost**: N = 512, p = 0.5, q = 0.01 (a new candidate 10, a lifetime 1): the search's
   mean cost over ``--trials`` x ``--seeds`` simulated histories, with its 95% interval, over
   the Fano lower bound, against 1.25; beside it, in the same run, the search told p and q and
   classic bisection.
4. **The demo** (``--skip-demo`` to leave out; about two minutes): ``bisect plan`` and ``bisect
   start`` of the demo-op recipe on the generated history, with and without ``--deterministic``:
   runs against the two limits, source builds against runs + K.
5. **The GPU record** (``docs/h200/releases/journal.jsonl``, 5 releases on an H200): the fast
   probe's runs and the lifetimes it recorded against the limits, and what the search would do
   now on that range (``bisect plan``'s simulation of its header).

A bench, not a test: it prints figures; ``make test`` holds the bounds themselves
(tests/test_deterministic.py, tests/test_builds.py, tests/test_plan.py).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: the GPU records: the five releases of 2026-12-04 (H200) and the ten of 2026-12-07 (H100,
#: issue 31's range; bench/gpu_record.py prints its time to answer against the 300 s limit)
GPU_RECORDS = (ROOT / "docs" / "h200" / "releases" / "journal.jsonl",
               ROOT / "docs" / "bench" / "gpu-2026-12-07-h100" / "journal-tiered.jsonl")


def log2_ceil(n: int) -> int:
    return math.ceil(math.log2(n))


# -- 1 and 2: a probe that never contradicts itself, every flip -------------------------------


def _header(n: int, deterministic: bool, mode: str) -> dict[str, Any]:
    from bisect_tool.designs import ledger

    return {
        "direction": "regression", "mode": mode,
        "candidates": [{"sha": f"{i:040x}", "subject": ""} for i in range(n)],
        "recipe": ledger.header_recipe(None, {}, deterministic=deterministic),
    }


def _runs(args: tuple[int, int, bool, str]) -> tuple[int, bool]:
    """(runs, named the flip) of one search over ``n`` candidates whose probe fails at every
    position >= ``flip`` and nowhere else (a deterministic probe)."""
    from bisect_tool.designs import Item, drive, ledger, manual
    from bisect_tool.designs.bisect import BisectDesign
    from bisect_tool.journal import JournalContents
    from bisect_tool.values import Observation, Verdict

    n, flip, deterministic, mode = args
    state = ledger.replay(JournalContents(_header(n, deterministic, mode), ()))

    def verdict(position: int) -> Verdict:
        return Verdict.DIVERGENT if position >= flip else Verdict.CLEAN

    if mode == "manual":  # what `bisect good|bad` does, one answer at a time
        runs = 0
        while (nxt := manual.next_manual_candidate(state)) is not None and runs < 400:
            position = state.candidates.index(nxt)
            state.apply(manual.manual_entry(state, nxt.sha, verdict(position)))
            runs += 1
    else:
        def evaluate(item: Item) -> Observation:
            position, _ = item.key
            return Observation(item.commit, verdict(position), item.lifetime_id)

        drive(BisectDesign(state), evaluate)
        runs = len(state.seen_lifetimes)
    return runs, state.strategy.summary().block == (flip,)


def _classic(n: int, flip: int) -> int:
    """git bisect run with its two end checks: runs to bracket ``flip``."""
    lo, hi, runs = 0, n - 1, 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        runs += 1
        lo, hi = (lo, mid) if mid >= flip else (mid, hi)
    return runs


def deterministic_bounds(sizes: Sequence[int], flips_cap: int | None) -> None:
    print("1-2. a probe that never contradicts itself (every flip; the run's own decision code)")
    print(f"{'N':>5} {'mode':<7} {'flag':<6} {'mean':>6} {'max':>4} {'limit':>6} {'max/limit':>10} "
          f"{'classic max':>12} {'max/classic':>12} {'right':>6}")
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool() as pool:
        for n in sizes:
            flips = list(range(1, n))
            if flips_cap and len(flips) > flips_cap:
                flips = [int(f) for f in np.linspace(1, n - 1, flips_cap)]
            classic = max(_classic(n, f) for f in flips)
            for mode in ("run", "manual"):
                for flag in (True, False):
                    rows = pool.map(_runs, [(n, f, flag, mode) for f in flips], chunksize=4)
                    runs = np.array([r for r, _ in rows])
                    right = sum(ok for _, ok in rows)
                    limit = log2_ceil(n) + 2 if flag else 2 * log2_ceil(n)
                    print(f"{n:>5} {mode:<7} {'yes' if flag else 'no':<6} {runs.mean():>6.2f} "
                          f"{runs.max():>4} {limit:>6} {runs.max() / limit:>10.2f} "
                          f"{classic:>12} {runs.max() / classic:>12.2f} {right:>3}/{len(rows)}",
                          flush=True)


# -- 3: the noisy cost ----------------------------------------------------------------------------


def noisy_cost(trials: int, seeds: int) -> None:
    from bisect_tool.designs.simulate import simulate
    from bisect_tool.strategy import Priors

    print(f"\n3. noisy cost: N=512 p=0.5 q=0.01, {trials} trials x {seeds} seeds "
          "(a new candidate 10, a lifetime 1)")
    told = Priors(p_point_mass=0.0, p_alpha=5000.0, p_beta=5000.0, q_alpha=100.0, q_beta=9900.0)
    for name, priors in (("search", None), ("told p, q", told)):
        costs: list[float] = []
        wrong = 0
        lower = classic = 0.0
        for seed in range(seeds):
            r = simulate(512, 0.5, 0.01, trials, seed=seed, priors=priors)
            b = r.strategies["bayes"]
            costs.append(b.mean_cost)
            wrong += b.errors
            lower, classic = r.lower_bound.cost, r.strategies["classic"].mean_cost
        # each seed's mean is one batch: the interval is over the batch means
        mean = float(np.mean(costs))
        spread = float(np.std(costs, ddof=1)) / math.sqrt(seeds) if seeds > 1 else float("nan")
        print(f"  {name:<10} cost {mean:7.1f} +- {1.96 * spread:4.1f} (95%, {seeds} seeds); "
              f"wrong {wrong}/{trials * seeds}; / lower bound {lower:.1f} = "
              f"{mean / lower:.3f} [{(mean - 1.96 * spread) / lower:.3f}, "
              f"{(mean + 1.96 * spread) / lower:.3f}] (limit 1.25); / classic {classic:.1f} = "
              f"{mean / classic:.2f}", flush=True)


# -- 4: the demo --------------------------------------------------------------------------------


def _bisect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bisect_tool", *args], capture_output=True,
                          text=True, timeout=1800)


def demo(workdir: Path) -> None:
    from bisect_tool import journal as journal_mod
    from bisect_tool.demo.history import generate
    from bisect_tool.recipes import recipe as recipe_mod

    print("\n4. the demo: the demo-op recipe on the generated history (real host builds)")
    history = generate(workdir / "repo")
    for flag in (False, True):
        tag = "det" if flag else "plain"
        counter, state, cache = (workdir / f"builds-{tag}.txt", workdir / f"state-{tag}",
                                 workdir / f"cache-{tag}")
        text = recipe_mod.find("demo-op").read_text()
        text = re.sub(r"(?m)^\[artifacts\]$", f'[artifacts]\ncache_dir = "{cache}"', text)
        text = re.sub(r'(?m)^build_command = "',
                      f'build_command = "echo $(git rev-parse HEAD) >> {counter}; ', text)
        text = re.sub(r"(?m)^deterministic = .*$", "", text)
        recipe = workdir / f"demo-op-{tag}.toml"
        recipe.write_text(text)
        args = ["--good", history.good_tag, "--bad", history.bad_tag, "--recipe", str(recipe),
                "--repo", str(history.repo), "--state-dir", str(state),
                *(["--deterministic"] if flag else [])]
        planned = _bisect("plan", "--json", *args)
        plan = json.loads(planned.stdout) if planned.returncode == 0 else {}
        e = plan.get("expected", {})
        n = len(plan.get("candidates", []))
        done = _bisect("start", *args, "-q")
        contents = journal_mod.read(state / journal_mod.JOURNAL_NAME)
        obs = contents.observations
        untestable = sum(1 for o in obs if o.get("verdict") == "untestable")
        runs = len(obs) - untestable
        builds = len(counter.read_text().splitlines()) if counter.exists() else 0
        k = int(e.get("prefetch", 0))
        found = (contents.end or {}).get("summary", {}).get("flip_commit") == \
            history.planted_commit
        limit = log2_ceil(n) + 2 if flag else 2 * log2_ceil(n)
        print(f"  {'--deterministic' if flag else 'no flag':<16} N={n}: exit {done.returncode}, "
              f"found the fix: {found}; runs {runs} (+{untestable} untestable) / limit {limit} "
              f"= {runs / limit:.2f}; builds {builds} <= runs + K = {len(obs) + k}: "
              f"{builds <= len(obs) + k}; plan expected {e.get('op_runs', 0):.1f} op runs, "
              f"{e.get('builds', 0):.1f} builds (runs / plan "
              f"{runs / max(e.get('op_runs', 1), 1):.2f})", flush=True)


# -- 5: the GPU record --------------------------------------------------------------------------


def gpu_record(record: Path) -> None:
    from bisect_tool import journal as journal_mod
    from bisect_tool.run import plan as plan_mod

    print(f"\n5. the GPU record: {record.relative_to(ROOT)}")
    contents = journal_mod.read(record)
    header = contents.header
    n = len(header["candidates"])
    narrow = [o for o in contents.observations if o.get("tier") == "narrow"]
    faithful = [o for o in contents.observations if o.get("tier") != "narrow"]
    limit = log2_ceil(n) + 2
    print(f"  recorded: {len(narrow)} fast-probe (op) runs over {n} releases, limit "
          f"ceil(log2 N) + 2 = {limit}: {len(narrow) / limit:.2f}; distinct candidates "
          f"{len({o['commit'] for o in narrow})}; {len(faithful)} server lifetimes to confirm")
    expected = plan_mod.simulate(header, p=0.75, q=0.0, trials=64)
    print(f"  the search now, on that header (64 simulated runs, op check p=1, lifetimes p=0.75): "
          f"op runs {expected.op_runs:.1f} (limit {limit}: {expected.op_runs / limit:.2f}), "
          f"lifetimes {expected.lifetimes:.1f}, right {expected.right:.0%}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/cost_bounds.py")
    parser.add_argument("--trials", type=int, default=200, help="simulated histories a seed")
    parser.add_argument("--seeds", type=int, default=8,
                        help="batches of --trials: the interval is over their means")
    parser.add_argument("--quick", action="store_true",
                        help="40 flips a range instead of every one, 100 trials x 4 seeds")
    parser.add_argument("--skip-demo", action="store_true")
    args = parser.parse_args(argv)
    trials, seeds = (100, 4) if args.quick else (args.trials, args.seeds)
    deterministic_bounds((60, 252), 40 if args.quick else None)
    noisy_cost(trials, seeds)
    if not args.skip_demo:
        with tempfile.TemporaryDirectory(prefix="bench-bounds-") as tmp:
            demo(Path(tmp))
    for record in GPU_RECORDS:
        gpu_record(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
