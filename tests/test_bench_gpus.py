"""bench/gpus.py runs real demo lifetimes over k fake GPUs through the GPU pool (issue 44): a
short run spreads them over every GPU and answers (it prints the ratio; this holds what it
rests on, not a timing)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gpus", ROOT / "bench" / "gpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpus"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_demo_lifetimes_spread_over_every_fake_gpu(tmp_path: Path) -> None:
    row = _bench().throughput(2, 2, tmp_path)
    assert row["on"] == ["0", "1"] and row["per_hour"] > 0
    assert set(row["verdicts"]) <= {"clean", "divergent", "inconclusive"}


def test_the_range_is_answered_with_k_gpus() -> None:
    runs = _bench().time_to_answer(2, 6, seeds=1, scale=0.001)
    assert runs[0]["right"] and runs[0]["lifetimes"] >= 2
