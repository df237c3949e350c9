"""Several lifetimes at once: a slot refilled as soon as its lifetime ends, against whole batches.

    python bench/slots.py [--seeds 24] [--scale 0.002] [--slots 2] [--controls-only]

On the lent H100 (docs/bench/gpu-2026-12-07-h100, the --no-narrow run) the first batch was the
controls and the bad end's first lifetime: the gate refused that release in 11 s, and the
other slot then stood idle until the controls ended at 199 s, since the next lifetimes started
only once the whole batch had. This runs the real engine and the real bisect design
(``bisect_tool.run.engine``, ``designs.bisect``) over the same simulated histories twice, once as
shipped (``refill``) and once with whole batches (``refill`` returning None, the engine before),
with lifetimes as long as that record's were once they had a GPU (44-92 s; ``--scale`` wall
seconds per GPU second) and showing the bug as often (p = 0.9 on the bad side, q = 0.01): the
tiered run (the op check narrows 10 releases, then lifetimes confirm) and a lifetimes-only run
of 60 commits. No controls: what it measures is lifetimes of unequal length.

Prints time to answer, lifetimes and right answers per mode, and the ratio batches / refill
measured in the same run (a ratio, not a timed test: the machine's load moves both sides).

Then the controls (``[runtime] controls_own_slot``): the tiered run again, with the controls in
the background as the engine starts them, holding a GPU lease for as long as the H100's did
(223 s from their start to their server's end), once on one of the lifetimes' slots (the
record's setup) and once on a slot of their own. Lifetimes and controls lease the real
``GpuPool`` (``wiring.gpu_pool``); the engine waits for the controls before it ends, as it does.

Then issue 39 (``--issue39``): the slots (item 1: the tiered run with 1, 2 and 4 slots, the
time with 1 over the time with k measured in the same run), and the controls off the critical
path (item 3) on issue 39's two-slot run: 12 releases, the gate refusing the three newest (the
good end's side, as there), a gate check 9 s, a boot 45 s, the positive control 5 s, the
negative control's pass 119 s on one server. On the critical path: no sweep (a refused release
is found when the op check or the controls reach it, one at a time), the controls on a
lifetime's slot, the negative pass on one server. Off it: every release gated at once before
the first boot, the controls on slots of their own, the negative pass dealt over 3 servers.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bisect_tool.designs import (  # noqa: E402
    Item,
    Work,
    ledger,  # noqa: E402
)
from bisect_tool.designs.bisect import BisectDesign  # noqa: E402
from bisect_tool.journal import Journal, entries, read  # noqa: E402
from bisect_tool.range import Candidate, CommitRange  # noqa: E402
from bisect_tool.recipes.recipe import ProbeSettings, Recipe, RuntimeSettings  # noqa: E402
from bisect_tool.run.engine import Engine  # noqa: E402
from bisect_tool.run.wiring import Evaluators, gpu_pool  # noqa: E402
from bisect_tool.runtime.gpus import GpuPool  # noqa: E402
from bisect_tool.values import Direction, Observation, Verdict  # noqa: E402

#: the H100 record's server lifetimes once they had a GPU, seconds (docs/bench/gpu-2026-12-07-h100:
#: tiered, then no-narrow; two at a time; the seconds spent waiting for the GPU slot the
#: controls' server held are left out)
H100_LIFETIMES_S = (91.8, 56.2, 51.0, 44.3, 47.7, 49.3, 78.4, 80.5, 71.3, 72.9, 68.2, 71.4,
                    83.2, 89.1, 78.8, 80.6, 59.7, 65.3, 61.1, 61.3)
OP_RUN_S = 8.0  # an op check run on that card: 7.3-11.8 s
#: the H100 record's controls, from their start (17 s) to their server's end (240 s): the boot
#: beside the first lifetime's (99 s), the positive control (5 s), the negative one's 155
#: requests one at a time (119 s)
H100_CONTROLS_S = 223.0


class Batches(BisectDesign):
    """The engine before refill: the next lifetimes start once every running one has ended."""

    def refill(self, running: Sequence[Item], free: int) -> Work | None:
        return None


class Simulated:
    """A probe over a history that flips at ``flip`` (a fix: older than ``flip`` is bad), each
    lifetime's verdict and length drawn from its own id, so both modes meet the same luck."""

    def __init__(self, shas: Sequence[str], flip: int, p: float, q: float, seed: int,
                 scale: float, seconds: Sequence[float]) -> None:
        self.shas, self.flip, self.p, self.q = list(shas), flip, p, q
        self.seed, self.scale, self.seconds = seed, scale, list(seconds)

    def _draw(self, lifetime_id: str, what: str) -> float:
        key = f"{self.seed}/{lifetime_id}/{what}".encode()
        return zlib.crc32(key) / 2**32

    def prepare(self, commits: object) -> None:
        return None

    def cancel(self) -> int:
        return 0

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        length = self.seconds[int(self._draw(lifetime_id, "length") * len(self.seconds))]
        time.sleep(length * self.scale)
        bad = self.shas.index(commit) < self.flip
        shows = self._draw(lifetime_id, "verdict") < (self.p if bad else self.q)
        return Observation(commit, Verdict.DIVERGENT if shows else Verdict.CLEAN, lifetime_id,
                           duration_s=length)


class Servers:
    """How many servers are up at once on the GPU, and the most there ever were."""

    def __init__(self) -> None:
        self.now = self.peak = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def up(self) -> Iterator[None]:
        with self._lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            with self._lock:
                self.now -= 1


class Leased(Simulated):
    """A lifetime whose server is up while it holds one of ``pool``'s GPU slots."""

    def __init__(self, pool: GpuPool, servers: Servers, *args: Any) -> None:
        super().__init__(*args)
        self.pool, self.servers = pool, servers

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        with self.pool.lease(), self.servers.up():
            return super().evaluate(commit, lifetime_id, tags)


class HeldControls:
    """The controls on ``commit``: they pass, their server up on the controls' lease for
    ``seconds``."""

    def __init__(self, pool: GpuPool, servers: Servers, commit: str, seconds: float) -> None:
        self.pool, self.servers, self.commit, self.seconds = pool, servers, commit, seconds

    def run(self) -> dict[str, Any]:
        with self.pool.controls_lease(), self.servers.up():
            time.sleep(self.seconds)
        return dict(entries.controls(self.commit, True, "", {}, attempts=1))


def _range(n: int) -> CommitRange:
    shas = [f"{i:040x}" for i in range(1, n + 1)]
    return CommitRange("good", "bad", shas[-1], shas[0], Direction.FIX,
                       tuple(Candidate(s, f"commit {i}") for i, s in enumerate(shas)))


def one_run(folder: Path, n: int, tiered: bool, design_class: type[BisectDesign], seed: int,
            scale: float, slots: int) -> dict[str, Any]:
    rng = _range(n)
    shas = [c.sha for c in rng.candidates]
    flip = 1 + zlib.crc32(f"flip/{seed}".encode()) % (n - 1)
    recipe = Recipe("bench").to_dict()
    if tiered:
        recipe["probe"]["narrow"] = "op"
    path = folder / "journal.jsonl"
    faithful = Simulated(shas, flip, 0.9, 0.01, seed, scale, H100_LIFETIMES_S)
    narrow = Simulated(shas, flip, 1.0, 0.0, seed, scale, (OP_RUN_S,)) if tiered else None
    evaluators = Evaluators(faithful, slots, narrow=narrow)
    started = time.perf_counter()
    with Journal(path) as journal:
        journal.append(ledger.header_for(rng, recipe=recipe, mode="recipe"))
        state = ledger.replay(read(path))
        Engine(journal, design_class(state, slots=slots), evaluators.arms(),
               parallel=slots).run()
    seconds = (time.perf_counter() - started) / scale
    summary = state.standing().status()
    observed = read(path).observations
    return {
        "seconds": seconds,
        "lifetimes": sum(1 for o in observed if o.get("tier") != "narrow"),
        "right": summary.get("flip_commit") == shas[flip],
    }


def controls_run(folder: Path, own_slot: bool, seed: int, scale: float,
                 slots: int) -> dict[str, Any]:
    """The tiered run over 10 releases with the controls beside the lifetimes, on one of their
    slots or on their own."""
    n = 10
    rng = _range(n)
    shas = [c.sha for c in rng.candidates]
    flip = 1 + zlib.crc32(f"flip/{seed}".encode()) % (n - 1)
    recipe = Recipe("bench").to_dict()
    recipe["probe"]["narrow"] = "op"
    pool = gpu_pool(RuntimeSettings(gpus=("0",), lifetimes_per_gpu=slots,
                                    controls_own_slot=own_slot))
    servers = Servers()
    faithful = Leased(pool, servers, shas, flip, 0.9, 0.01, seed, scale, H100_LIFETIMES_S)
    narrow = Simulated(shas, flip, 1.0, 0.0, seed, scale, (OP_RUN_S,))

    def controls_for(commit: str) -> HeldControls:
        return HeldControls(pool, servers, commit, H100_CONTROLS_S * scale)

    evaluators = Evaluators(faithful, slots, controls_for=controls_for, narrow=narrow)
    path = folder / "journal.jsonl"
    started = time.perf_counter()
    with Journal(path) as journal:
        journal.append(ledger.header_for(rng, recipe=recipe, mode="recipe"))
        state = ledger.replay(read(path))
        design = BisectDesign(state, slots=slots, controls=True)
        Engine(journal, design, evaluators.arms(), parallel=slots,
               controls_for=evaluators.controls_for).run()
    observed = read(path).observations
    return {
        "seconds": (time.perf_counter() - started) / scale,
        "lifetimes": sum(1 for o in observed if o.get("tier") != "narrow"),
        "right": state.standing().status().get("flip_commit") == shas[flip],
        "peak_servers": servers.peak,
    }


def compare_controls(seeds: int, scale: float, slots: int) -> None:
    results: dict[str, list[dict[str, Any]]] = {"shared": [], "own": []}
    for seed in range(seeds):
        modes = (("shared", False), ("own", True))
        for name, own in modes if seed % 2 == 0 else modes[::-1]:
            with tempfile.TemporaryDirectory(prefix="bench-controls-") as tmp:
                results[name].append(controls_run(Path(tmp), own, seed, scale, slots))
    print(f"\ntiered, 10 releases, {slots} lifetime slots, the controls beside them "
          f"({H100_CONTROLS_S:.0f} s on a GPU), {seeds} histories (GPU seconds):")
    _compare({"controls on a lifetime's slot": results["shared"],
              "controls on their own slot": results["own"]}, "shared / own")


#: issue 39's figures from the H100 (the record and the issue): a gate check (a schema dump),
#: a lifetime's boot alone, the positive control, the negative control's pass on one server
GATE_S, BOOT_S, POSITIVE_S, NEGATIVE_S = 9.0, 45.0, 5.0, 119.0


class GatedOp(Simulated):
    """The op check, which gates each candidate it runs beside it (``OpEvaluator``): a refused
    one's run says so in its detail, and takes as long as the gate when that is longer."""

    def __init__(self, refused: set[str], *args: Any) -> None:
        super().__init__(*args)
        self.refused = refused

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        obs = super().evaluate(commit, lifetime_id, tags)
        time.sleep(max(0.0, GATE_S - OP_RUN_S) * self.scale)
        gate = "candidate lacks op `_C::rms_norm`" if commit in self.refused else "ok"
        return Observation(obs.commit, obs.verdict, lifetime_id, {"gate": gate}, "",
                           obs.duration_s)


class GatedLifetimes(Leased):
    """Lifetimes whose gate refuses ``refused`` before any boot (a lifetime asked for one is
    UNTESTABLE after the gate's seconds); ``gate_check``: the gate alone (the sweep)."""

    def __init__(self, refused: set[str], *args: Any) -> None:
        super().__init__(*args)
        self.refused = refused

    def gate_check(self, commit: str, tags: object = ()) -> Observation:
        time.sleep(GATE_S * self.scale)
        if commit in self.refused:
            return Observation(commit, Verdict.UNTESTABLE, f"gate-{commit}", {"stage": "gate"},
                               "candidate lacks op `_C::rms_norm`", GATE_S)
        return Observation(commit, Verdict.CLEAN, f"gate-{commit}", {"stage": "gate"}, "",
                           GATE_S)

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> Observation:
        if commit in self.refused:
            return self.gate_check(commit)
        return super().evaluate(commit, lifetime_id, tags)


class SpreadControls:
    """The controls on ``commit``: gated first (a refused one answers untestable after the
    gate's seconds); then ``spread`` servers boot at once on the controls' leases, the first
    runs the positive control, and the negative pass is dealt over all of them."""

    def __init__(self, pool: GpuPool, servers: Servers, commit: str, refused: set[str],
                 spread: int, scale: float) -> None:
        self.pool, self.servers, self.commit = pool, servers, commit
        self.refused, self.spread, self.scale = refused, spread, scale

    def _server(self, part: int) -> None:
        with self.pool.controls_lease(), self.servers.up():
            time.sleep((BOOT_S + (POSITIVE_S if part == 0 else 0.0)
                        + NEGATIVE_S / self.spread) * self.scale)

    def run(self) -> dict[str, Any]:
        time.sleep(GATE_S * self.scale)
        if self.commit in self.refused:
            return dict(entries.controls(self.commit, False, "the controls could not run: "
                                         "candidate lacks op `_C::rms_norm`", {}, attempts=0,
                                         untestable=True))
        threads = [threading.Thread(target=self._server, args=(i,))
                   for i in range(self.spread)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return dict(entries.controls(self.commit, True, "", {}, attempts=1))


def critical_path_run(folder: Path, off: bool, seed: int, scale: float,
                      slots: int = 2) -> dict[str, Any]:
    """Issue 39's run: 12 releases, the three newest refused by the gate, two lifetime slots;
    the controls on the critical path (``off`` False) or off it."""
    n = 12
    rng = _range(n)
    shas = [c.sha for c in rng.candidates]
    refused = set(shas[-3:])
    flip = 1 + zlib.crc32(f"flip/{seed}".encode()) % (n - 4)
    recipe = Recipe("bench").to_dict()
    recipe["probe"]["narrow"] = "op"
    spread = 3 if off else 1
    pool = gpu_pool(RuntimeSettings(gpus=("0",), lifetimes_per_gpu=slots, controls_own_slot=off),
                    ProbeSettings(negative_servers=spread))
    servers = Servers()
    faithful = GatedLifetimes(refused, pool, servers, shas, flip, 0.9, 0.01, seed, scale,
                              H100_LIFETIMES_S)
    narrow = GatedOp(refused, shas, flip, 1.0, 0.0, seed, scale, (OP_RUN_S,))

    def controls_for(commit: str) -> SpreadControls:
        return SpreadControls(pool, servers, commit, refused, spread, scale)

    evaluators = Evaluators(faithful, slots, controls_for=controls_for, narrow=narrow)
    path = folder / "journal.jsonl"
    started = time.perf_counter()
    with Journal(path) as journal:
        journal.append(ledger.header_for(rng, recipe=recipe, mode="recipe", level="release"))
        state = ledger.replay(read(path))
        design = BisectDesign(state, slots=slots, controls=True, controls_beside=off,
                              gate_sweep=off)
        Engine(journal, design, evaluators.arms(), parallel=slots,
               controls_for=evaluators.controls_for).run()
    contents = read(path)
    return {
        "seconds": (time.perf_counter() - started) / scale,
        "lifetimes": sum(1 for o in contents.observations
                         if o.get("tier") != "narrow" and o.get("verdict") != "untestable"),
        "right": state.standing().status().get("flip_commit") == shas[flip],
        "refused_controls": sum(1 for c in contents.of_type("controls") if c.get("untestable")),
        "peak_servers": servers.peak,
    }


def slots_run(folder: Path, slots: int, seed: int, scale: float) -> dict[str, Any]:
    """The tiered run over 10 releases on ``slots`` slots, no controls (item 1)."""
    return one_run(folder, 10, True, BisectDesign, seed, scale, slots)


def issue39(seeds: int, scale: float) -> None:
    results: dict[int, list[dict[str, Any]]] = {1: [], 2: [], 4: []}
    for seed in range(seeds):
        for k in (1, 2, 4) if seed % 2 == 0 else (4, 2, 1):
            with tempfile.TemporaryDirectory(prefix="bench-slots-") as tmp:
                results[k].append(slots_run(Path(tmp), k, seed, scale))
    print(f"\nissue 39, item 1: tiered, 10 releases, 1, 2 and 4 slots, {seeds} histories "
          "(GPU seconds):")
    _compare({"1 slot": results[1], "2 slots": results[2]}, "1 slot / 2 slots")
    _compare({"1 slot": results[1], "4 slots": results[4]}, "1 slot / 4 slots")
    paths: dict[str, list[dict[str, Any]]] = {"on": [], "off": [], "off, 6 slots": []}
    modes = (("on", False, 2), ("off", True, 2), ("off, 6 slots", True, 6))
    for seed in range(seeds):
        for name, off, k in modes if seed % 2 == 0 else modes[::-1]:
            with tempfile.TemporaryDirectory(prefix="bench-controls-") as tmp:
                paths[name].append(critical_path_run(Path(tmp), off, seed, scale, k))
    print(f"\nissue 39, item 3: tiered, 12 releases (3 refused by the gate), the controls on "
          f"and off the critical path, {seeds} histories (GPU seconds):")
    _compare({"on, 2 slots": paths["on"], "off, 2 slots": paths["off"]}, "on / off")
    _compare({"on, 2 slots": paths["on"], "off, 6 slots (auto's most)": paths["off, 6 slots"]},
             "on, 2 slots / off, 6 slots")
    for name, runs in paths.items():
        print(f"  {name}: controls refused before they ran "
              f"{statistics.mean(r['refused_controls'] for r in runs):.1f} times a run; "
              f"most servers up at once {max(r['peak_servers'] for r in runs)}")


def _compare(modes: dict[str, list[dict[str, Any]]], ratio_name: str) -> None:
    """Each mode's time to answer, lifetimes and right answers, then the first's time over the
    second's, paired by history."""
    width = max(len(name) for name in modes)
    for name, runs in modes.items():
        secs = [r["seconds"] for r in runs]
        print(f"  {name:<{width}} time to answer mean {statistics.mean(secs):6.0f} s "
              f"(median {statistics.median(secs):.0f}, max {max(secs):.0f}); lifetimes mean "
              f"{statistics.mean(r['lifetimes'] for r in runs):.1f}; right "
              f"{sum(r['right'] for r in runs)}/{len(runs)}")
    first, second = modes.values()
    ratio = [a["seconds"] / b["seconds"] for a, b in zip(first, second, strict=True)]
    print(f"  {ratio_name}, paired: time {statistics.mean(ratio):.2f}x "
          f"(median {statistics.median(ratio):.2f}x)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/slots.py")
    parser.add_argument("--seeds", type=int, default=24)
    parser.add_argument("--scale", type=float, default=0.002,
                        help="wall seconds per GPU second (0.002: a 90 s lifetime in 0.18 s)")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--controls-only", action="store_true",
                        help="only the controls' comparison (shared slot against their own)")
    parser.add_argument("--issue39", action="store_true",
                        help="only issue 39's: 1, 2, 4 slots; the controls on and off the "
                        "critical path")
    args = parser.parse_args(argv)
    print(f"# python bench/slots.py --seeds {args.seeds} --scale {args.scale} "
          f"--slots {args.slots}" + (" --controls-only" if args.controls_only else "")
          + (" --issue39" if args.issue39 else ""))
    if args.issue39:
        issue39(args.seeds, args.scale)
        return 0
    for label, n, tiered in () if args.controls_only else (
            ("tiered, 10 releases", 10, True), ("lifetimes only, 60 commits", 60, False)):
        results: dict[str, list[dict[str, Any]]] = {"refill": [], "batches": []}
        for seed in range(args.seeds):
            # alternate the order so that drift in the machine's load hits both alike
            modes = (("refill", BisectDesign), ("batches", Batches))
            for name, design_class in modes if seed % 2 == 0 else modes[::-1]:
                with tempfile.TemporaryDirectory(prefix="bench-slots-") as tmp:
                    results[name].append(one_run(Path(tmp), n, tiered, design_class, seed,
                                                 args.scale, args.slots))
        print(f"\n{label}, {args.slots} slots, {args.seeds} histories (GPU seconds):")
        _compare({"batches": results["batches"], "refill": results["refill"]},
                 "batches / refill")
    compare_controls(args.seeds, args.scale, args.slots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
