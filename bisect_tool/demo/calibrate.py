"""Measure the demo target: how often a lifetime diverges, quiet and with both cores kept busy.

``python -m bisect_tool.demo.calibrate [--lifetimes 20] [--target bug|positive|fixed]
[--load quiet|loaded|both]`` boots fresh demollm servers exactly as ``bisect demo`` does (the
recipe's server arguments and environment) and runs the real server probe
(``bisect_tool.probes.server``) in each, then prints the divergent fraction p with its 95 %
Wilson interval, per load:

- ``bug`` (default): the pinned v0.26.0 kernels, switch on: the rate the search sees pre-fix;
- ``positive``: the v0.27.0 kernels with the switch off: the positive control;
- ``fixed``: the v0.27.0 kernels, switch on: must never diverge;
- ``positive-old``: the v0.26.0 sources with the switch off: ``demo-python``'s positive control
  (its good end is v0.26.0).

Every file of the recipe's swap set comes from that end's sources: with ``--recipe demo-python``
(which swaps ``demollm/model.py`` too) ``fixed`` runs v0.27.0's model with its Python-side
regression, and must then diverge, while ``bug`` (v0.26.0's sources, the pinned stack's own) must
never; with ``demo`` (the kernel alone) every target runs the pinned stack's model.

"loaded" runs the same lifetimes while a bounded CPU burner (one spinning process per core,
started and stopped here, each ending by itself after ``--burn-max-s``) keeps every core busy.
demollm's steps last a modelled device time and form from the probe's declared arrival times
(``demollm.engine``), so a lifetime's outcome is a function of its workload draw (the probe's
jitter seed), not of the load. Both loads run the same seeds (``--seed``, drawn when not given):
the "paired" line counts the lifetimes whose verdict the load changed, the direct test of that
claim; the late column counts lifetimes where a request reached the engine after its step had
formed (the one way left for the machine to matter).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bisect_tool.demo.history import generate
from bisect_tool.demo.pinned import STACK_DIR, SWAP_PATH, ensure_pinned_build, run_build
from bisect_tool.errors import BisectError, BootFailed
from bisect_tool.interfaces import ServerHandle
from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.values import Verdict

_PORT = re.compile(r"Starting vLLM API server 0 on http://127\.0\.0\.1:(\d+)")
TARGETS = ("bug", "positive", "fixed", "positive-old")
LOADS = ("quiet", "loaded")


@dataclass(frozen=True)
class LifetimeResult:
    verdict: Verdict
    min_coresidency: int | None  # lowest per-repeat peak (the target must hold in every repeat)
    overruns: int | None  # engine steps that outlasted their modelled time (None: not reported)
    wall_s: float  # boot + probe
    late_arrivals: int | None = None  # requests that came in after their step formed
    max_arrival_delay_s: float | None = None  # longest declared arrival -> engine hand-over
    jitter_seed: int | None = None  # the workload draw (same seed, same arrivals)

    @property
    def divergent(self) -> bool:
        return self.verdict is Verdict.DIVERGENT


@dataclass(frozen=True)
class Measurement:
    target: str
    load: str
    results: tuple[LifetimeResult, ...]

    @property
    def divergent(self) -> int:
        return sum(r.divergent for r in self.results)

    @property
    def p(self) -> float:
        return self.divergent / len(self.results) if self.results else 0.0

    @property
    def interval(self) -> tuple[float, float]:
        return wilson(self.divergent, len(self.results))

    @property
    def overran(self) -> int:
        """Lifetimes with at least one overrun step."""
        return sum(1 for r in self.results if r.overruns)

    @property
    def late(self) -> int:
        """Lifetimes where a request reached the engine after the step it arrived for."""
        return sum(1 for r in self.results if r.late_arrivals)

    def line(self) -> str:
        lo, hi = self.interval
        delays = [r.max_arrival_delay_s for r in self.results if r.max_arrival_delay_s is not None]
        walls = sorted(r.wall_s for r in self.results)
        inconclusive = sum(r.verdict is Verdict.INCONCLUSIVE for r in self.results)
        return (
            f"{self.target} {self.load}: p = {self.p:.2f} [{lo:.2f}, {hi:.2f}] (95% Wilson), "
            f"{self.divergent}/{len(self.results)} divergent, {inconclusive} inconclusive, "
            f"{self.overran} lifetimes overran the clock, {self.late} had late arrivals "
            f"(longest hand-over {_ms(max(delays, default=None))}), "
            f"median lifetime {walls[len(walls) // 2] if walls else 0.0:.2f}s"
        )


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1e3:.0f} ms"


def paired_changes(a: Measurement, b: Measurement) -> tuple[int, int]:
    """(lifetimes whose verdict differs, lifetimes compared) between two measurements of the
    same jitter seeds: how often the load, not the workload, decided a lifetime."""
    by_seed = {r.jitter_seed: r.verdict for r in a.results if r.jitter_seed is not None}
    pairs = [(by_seed[r.jitter_seed], r.verdict) for r in b.results if r.jitter_seed in by_seed]
    return sum(1 for x, y in pairs if x is not y), len(pairs)


def paired_line(quiet: Measurement, loaded: Measurement) -> str:
    changed, compared = paired_changes(quiet, loaded)
    return (f"the load changed the verdict of {changed} of {compared} lifetimes "
            "(same jitter seeds quiet and loaded)")


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a binomial rate k/n (95 % by default); (0, 1) when n = 0."""
    if n <= 0:
        return 0.0, 1.0
    phat = k / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


# Spins until its deadline (argv[1], seconds) even if its parent is killed without cleaning up.
_BURN = (
    "import sys, time\n"
    "end = time.monotonic() + float(sys.argv[1])\n"
    "while time.monotonic() < end: pass\n"
)


@contextmanager
def cpu_burner(workers: int | None = None, max_s: float = 900.0) -> Iterator[int]:
    """Keep every core busy while inside: one spinning process per core, each bounded by
    ``max_s`` seconds, all stopped on the way out. Yields how many were started."""
    n = workers or os.cpu_count() or 1
    procs = [
        subprocess.Popen([sys.executable, "-c", _BURN, str(max_s)], stdin=subprocess.DEVNULL)
        for _ in range(n)
    ]
    try:
        yield n
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def demo_server(
    kernels: Path,
    env: dict[str, str],
    args: Sequence[str] = (),
    swap: Mapping[str, Path] | None = None,
) -> Iterator[str]:
    """A fresh demollm process on loopback using ``kernels`` as its ``_kernels.so``, and each
    file of ``swap`` (stack-relative path -> file, e.g. ``demollm/model.py``) in place of the
    pinned stack's."""
    with tempfile.TemporaryDirectory(prefix="demollm-lifetime-") as tmp:
        root = Path(tmp)
        shutil.copytree(
            STACK_DIR / "demollm",
            root / "demollm",
            ignore=shutil.ignore_patterns("__pycache__", "_kernels.so*"),
        )
        shutil.copyfile(kernels, root / SWAP_PATH)
        for rel, path in (swap or {}).items():
            shutil.copyfile(path, root / rel)
        log = (root / "server.log").open("w+")
        proc = subprocess.Popen(
            [sys.executable, "-m", "demollm.server", "--host", "127.0.0.1", "--port", "0", *args],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root), **env},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                text = (root / "server.log").read_text()
                found = _PORT.search(text)
                if found:
                    break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise BootFailed(f"demollm did not start:\n{text[-2000:]}")
                time.sleep(0.02)
            yield f"http://127.0.0.1:{found.group(1)}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def run_lifetime(
    kernels: Path,
    r: recipe_mod.Recipe,
    env: dict[str, str],
    lifetime_id: str = "calibrate",
    swap: Mapping[str, Path] | None = None,
    jitter_seed: int | None = None,
) -> LifetimeResult:
    """One lifetime, probed by the real server probe with the recipe's settings (and the
    given workload draw; None: a fresh one)."""
    from bisect_tool.probes.server import ServerDeterminismProbe

    started = time.perf_counter()
    probe = ServerDeterminismProbe(r.probe, model=r.runtime.model or None, rng_seed=jitter_seed)
    with demo_server(kernels, env, r.runtime.server_args, swap) as url:
        result = probe.run(ServerHandle(url, lifetime_id, Path(os.devnull)))
    peaks = [p for p in result.detail.get("coresidency_per_repeat") or [] if p is not None]
    return LifetimeResult(
        verdict=result.verdict,
        min_coresidency=min(peaks) if peaks else None,
        overruns=result.detail.get("step_overruns"),
        wall_s=time.perf_counter() - started,
        late_arrivals=result.detail.get("late_arrivals"),
        max_arrival_delay_s=result.detail.get("max_arrival_delay_s"),
        jitter_seed=result.detail.get("jitter_seed"),
    )


def fixed_tree(workdir: Path) -> Path:
    """A worktree of the generated history's v0.27.0 with its ``_kernels.so`` built."""
    history = generate(workdir / "repo", commits=60)  # the smallest history allowed
    tree = workdir / "tree"
    subprocess.run(
        ["git", "-C", str(history.repo), "worktree", "add", "-q", str(tree), history.good_tag],
        check=True,
    )
    run_build(tree)
    return tree


@dataclass(frozen=True)
class TargetSetup:
    kernels: Path
    env: dict[str, str]
    swap: dict[str, Path]  # the swap set's other files (stack-relative path -> file)


def target_setup(target: str, r: recipe_mod.Recipe, workdir: Path) -> TargetSetup:
    """The sources and environment of one target (see the module docstring)."""
    env = dict(r.runtime.env)
    if target in ("positive", "positive-old"):
        env[r.probe.invariance_env] = "0"  # what ControlsRunner does
    if target in ("bug", "positive-old"):
        # The pinned stack is v0.26.0's sources: its own files are that end's swap set.
        return TargetSetup(ensure_pinned_build(), env, {})
    tree = fixed_tree(workdir)
    others = {rel: tree / rel for rel in r.artifacts.swap_set if rel != SWAP_PATH}
    return TargetSetup(tree / SWAP_PATH, env, others)


def measure(
    target: str,
    load: str,
    r: recipe_mod.Recipe,
    lifetimes: int,
    workdir: Path,
    progress: Callable[[str], None] = lambda _m: None,
    burn_max_s: float = 900.0,
    seed: int | None = None,
) -> Measurement:
    """``lifetimes`` fresh lifetimes of ``target`` under ``load``; lifetime n draws its workload
    from jitter seed ``seed + n`` (None: fresh draws)."""
    setup = target_setup(target, r, workdir)
    results: list[LifetimeResult] = []

    def run_all() -> None:
        for n in range(lifetimes):
            res = run_lifetime(
                setup.kernels, r, setup.env, f"calibrate-{target}-{load}-{n}", setup.swap,
                None if seed is None else seed + n,
            )
            results.append(res)
            progress(
                f"{target} {load} lifetime {n}: {res.verdict.value} min co-residency "
                f"{res.min_coresidency} overruns {res.overruns} late {res.late_arrivals} "
                f"(longest hand-over {_ms(res.max_arrival_delay_s)}) "
                f"seed {res.jitter_seed} wall {res.wall_s:.2f}s"
            )

    if load == "loaded":
        with cpu_burner(max_s=burn_max_s):
            run_all()
    else:
        run_all()
    return Measurement(target, load, tuple(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bisect_tool.demo.calibrate")
    parser.add_argument("--lifetimes", type=int, default=20, help="per target and load")
    parser.add_argument("--recipe", default="demo")
    parser.add_argument("--target", choices=[*TARGETS, "all"], default="bug")
    parser.add_argument("--load", choices=[*LOADS, "both"], default="both")
    parser.add_argument("--jitter-ms", type=float, default=None, help="override the recipe's")
    parser.add_argument("--quiet", action="store_true", help="only the summary lines")
    parser.add_argument("--burn-max-s", type=float, default=900.0,
                        help="the burner's own deadline (it is stopped sooner, when done)")
    parser.add_argument("--seed", type=int, default=None,
                        help="lifetime n of every load draws jitter seed SEED+n (default: random)")
    args = parser.parse_args(argv)
    if args.lifetimes < 1:
        raise SystemExit("calibrate: --lifetimes must be at least 1")
    try:
        r = recipe_mod.load(args.recipe).override("probe", jitter_ms=args.jitter_ms)
    except BisectError as exc:  # the project's error root: a one-line error, no traceback
        raise SystemExit(f"calibrate: {exc}") from None
    targets = TARGETS if args.target == "all" else (args.target,)
    loads = LOADS if args.load == "both" else (args.load,)
    progress: Callable[[str], None] = (
        (lambda _m: None) if args.quiet else (lambda m: print(m, flush=True))
    )
    seed = random.randrange(2**31) if args.seed is None else args.seed
    print(
        f"recipe {r.name}: jitter {r.probe.jitter_ms} ms, {r.probe.requests}+{r.probe.fillers} "
        f"requests, {r.probe.repeats} repeats, server {' '.join(r.runtime.server_args)}; "
        f"jitter seeds {seed}..{seed + args.lifetimes - 1} for every load",
        flush=True,
    )
    lines = []
    try:
        with tempfile.TemporaryDirectory(prefix="demo-calibrate-") as tmp:
            for target in targets:
                done: list[Measurement] = []
                for load in loads:
                    m = measure(target, load, r, args.lifetimes, Path(tmp) / f"{target}-{load}",
                                progress, args.burn_max_s, seed)
                    done.append(m)
                    lines.append(m.line())
                    print(m.line(), flush=True)
                if len(done) == 2:
                    line = f"{target} paired: {paired_line(*done)}"
                    lines.append(line)
                    print(line, flush=True)
    except BisectError as exc:
        raise SystemExit(f"calibrate: {exc}") from None
    if len(lines) > 1:
        print("\n".join(["summary:", *lines]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
