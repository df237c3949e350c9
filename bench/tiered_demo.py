"""The tiered search against lifetimes only, on the demo: time to answer and lifetimes booted.

    python bench/tiered_demo.py [--runs 5] [--commits 300] [--keep DIR]

Each round runs ``bisect demo --json`` twice over the same generated history (same seed): once
as shipped (the op check narrows, server lifetimes confirm: ``[probe] narrow = "op"``) and once
with ``--lifetimes-only``, the order alternating between rounds so that drift in the machine's
load hits both alike. Both must name the planted fix. Prints each run, then the medians and the
ratio lifetimes-only / tiered of the wall time and of the lifetimes booted (issue 16's target:
>= 5x less time). A ratio in one run, not a timed test: the machine's load moves both sides.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def phase_seconds(journal: Path) -> dict[str, float]:
    """Seconds from the run's start to its controls' end and to the confirm step's start (the
    tiered run's time before its first lifetime), from the journal's entry times."""
    out: dict[str, float] = {}
    start: float | None = None
    for line in journal.read_text().splitlines():
        entry = json.loads(line)
        at = entry.get("time")
        if not isinstance(at, (int, float)):
            continue
        if start is None:
            start = float(at)
        if entry.get("type") == "controls":
            out["controls_s"] = float(at) - start
        if entry.get("type") == "phase" and entry.get("phase") == "confirm":
            out.setdefault("before_confirm_s", float(at) - start)
    return out


def demo(workdir: Path, commits: int, lifetimes_only: bool) -> dict[str, Any]:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "bisect_tool", "demo", "--workdir", str(workdir), "--json",
         "--commits", str(commits), *(["--lifetimes-only"] if lifetimes_only else [])],
        capture_output=True, text=True, timeout=1800,
    )
    out: dict[str, Any] = {"rc": proc.returncode, "wall_s": time.monotonic() - started}
    if "{" in proc.stdout:
        out.update(json.loads(proc.stdout[proc.stdout.index("{"):]))
    else:
        out["error"] = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    journal = workdir / "state" / "journal.jsonl"
    if journal.is_file():
        out.update(phase_seconds(journal))
    out["found"] = out.get("flip_commit") == out.get("planted_commit") and bool(
        out.get("planted_commit"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/tiered_demo.py")
    parser.add_argument("--runs", type=int, default=5, help="rounds (each runs both searches)")
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--keep", type=Path, default=None,
                        help="copy the state dir of any run that did not find the fix here")
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {"tiered": [], "lifetimes only": []}
    for n in range(args.runs):
        order = [False, True] if n % 2 == 0 else [True, False]
        for lifetimes_only in order:
            name = "lifetimes only" if lifetimes_only else "tiered"
            with tempfile.TemporaryDirectory(prefix="bench-tiered-") as tmp:
                r = demo(Path(tmp) / "demo", args.commits, lifetimes_only)
                if not r["found"] and args.keep is not None:
                    dest = args.keep / f"{name.replace(' ', '-')}-{n}"
                    shutil.copytree(Path(tmp) / "demo" / "state", dest, dirs_exist_ok=True)
            results[name].append(r)
            print(f"round {n} {name}: rc={r['rc']} found={r['found']} confidence="
                  f"{r.get('confidence')} lifetimes={r.get('lifetimes')} op runs="
                  f"{r.get('narrow_runs', 0)} wall={float(r['wall_s']):.1f}s controls="
                  f"{r.get('controls_s', 0.0):.1f}s"
                  + (f" before the first lifetime={r['before_confirm_s']:.1f}s"
                     if "before_confirm_s" in r else ""), flush=True)
    med: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        walls = [float(r["wall_s"]) for r in runs]
        lives = [float(r.get("lifetimes") or 0) for r in runs]
        ops = [float(r.get("narrow_runs") or 0) for r in runs]
        found = sum(1 for r in runs if r["found"])
        med[name] = {"wall": statistics.median(walls), "lifetimes": statistics.median(lives)}
        print(f"{name}: found {found}/{len(runs)}; median wall {med[name]['wall']:.1f}s "
              f"(min {min(walls):.1f}, max {max(walls):.1f}); median lifetimes "
              f"{med[name]['lifetimes']:.0f}; median op runs {statistics.median(ops):.0f}")
    t, p = med["tiered"], med["lifetimes only"]
    print(f"lifetimes only / tiered: time {p['wall'] / t['wall']:.2f}x, lifetimes booted "
          f"{p['lifetimes'] / max(t['lifetimes'], 1):.2f}x (target: >= 5x less time)")
    # What a confirm step of no lifetimes at all would give: the tiered run's controls and
    # narrow step alone, against the same round's lifetimes-only run. No confirm step can do
    # better, so this is the ceiling the target is up against.
    ceilings = [float(lo["wall_s"]) / float(ti["before_confirm_s"])
                for ti, lo in zip(results["tiered"], results["lifetimes only"], strict=True)
                if ti.get("before_confirm_s")]
    if ceilings:
        before = statistics.median(float(r["before_confirm_s"]) for r in results["tiered"]
                                   if r.get("before_confirm_s"))
        print(f"tiered before its first lifetime (controls + narrow step): median {before:.1f}s; "
              f"lifetimes only / that: median {statistics.median(ceilings):.2f}x (the ratio with "
              "a free confirm step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
