"""bench/slots.py's controls comparison runs the real engine, design and GPU pool: a short run
of it names the flip, and with the controls on their own slot three servers are up at once
(the bench prints the time ratio; this holds what it rests on, not a timing)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_slots", ROOT / "bench" / "slots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_slots"] = module
    spec.loader.exec_module(module)
    return module


def test_the_controls_on_their_own_slot_free_a_lifetime_slot(tmp_path: Path) -> None:
    bench = _bench()
    shared = bench.controls_run(tmp_path / "shared", False, seed=0, scale=0.001, slots=2)
    own = bench.controls_run(tmp_path / "own", True, seed=0, scale=0.001, slots=2)
    assert shared["right"] and own["right"]
    assert shared["lifetimes"] == own["lifetimes"]  # the same history, the same decisions
    # the controls (223 GPU seconds) beside lifetimes of 44-92 s: on a lifetime's slot the two
    # slots are all there is; on their own, both lifetimes run beside them
    assert (shared["peak_servers"], own["peak_servers"]) == (2, 3)


def test_issue_39s_run_with_the_controls_off_the_critical_path(tmp_path: Path) -> None:
    """bench/slots.py --issue39: on issue 39's run (the three newest of 12 releases refused by
    the gate), the controls on the critical path are refused before they run (the issue saw
    three in a row); off it, every release is gated before the first boot, the controls run
    once, on their own slots, their negative pass on 3 servers at once (two slots hold all
    there is on the critical path)."""
    bench = _bench()
    on = bench.critical_path_run(tmp_path / "on", False, seed=1, scale=0.001)
    off = bench.critical_path_run(tmp_path / "off", True, seed=1, scale=0.001)
    assert on["right"] and off["right"]
    assert on["refused_controls"] >= 1 and off["refused_controls"] == 0
    assert on["peak_servers"] == 2 and off["peak_servers"] >= 3
