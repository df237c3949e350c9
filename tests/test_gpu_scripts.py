"""Issue 40's device scripts, as far as they run off the GPU: release_range.sh completes each of
issue 40's recipes for the machine (the sampler at 0 in [runtime.env] alone, the suspects
dropped: FlashInfer is not carried), and issue40.sh says what is missing instead of failing."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from bisect_tool.recipes import recipe

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "scripts" / "gpu"


@pytest.mark.parametrize("name", ["batch-invariance-compiled", "batch-invariance-bs1",
                                  "batch-invariance-moe"])
def test_release_range_completes_issue_40s_recipes(tmp_path: Path, name: str) -> None:
    done = subprocess.run(
        ["bash", str(GPU / "release_range.sh"), "recipe"], cwd=ROOT, capture_output=True,
        text=True, timeout=60,
        env={**os.environ, "DEV": str(tmp_path), "PY": sys.executable, "RECIPE": name},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    path = tmp_path / f"{name}-range.toml"
    written, bundled = tomllib.loads(path.read_text()), recipe.load(name)
    assert written["runtime"]["env"] == {"VLLM_BATCH_INVARIANT": "1",
                                         "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert "suspects" not in written["probe"]
    loaded = recipe.load(str(path))  # checked whole, as the run loads it
    assert loaded.runtime.pinned_package_dir == str(tmp_path / "site")
    assert loaded.probe.mode == bundled.probe.mode
    assert loaded.runtime.server_args[: len(bundled.runtime.server_args)] == (
        bundled.runtime.server_args)
    assert Path(loaded.runtime.weights.split(":", 1)[1]).is_dir()  # the bundled config's folder


def test_issue40_script_names_what_is_missing(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(GPU / "issue40.sh"), "ops", "moe-ops", "report"], cwd=ROOT,
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "DEV": str(tmp_path), "OUT": str(tmp_path / "out"),
             "PY": sys.executable},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "ops: 0.26.0's extension is not placed" in out
    assert "moe-ops: 0.27.0 needs .devcarry/moe-0.27.0.xz" in out
    assert "report: tiered-compiled has no journal" in out
    assert (tmp_path / "out" / "record40.tgz").is_file()
    bad = subprocess.run(["bash", str(GPU / "issue40.sh"), "nope"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "DEV": str(tmp_path)})
    assert bad.returncode == 2 and "unknown step nope" in bad.stderr
