"""The demo's compiled RMSNorm: the block size really changes float32 results, the switch pins it
only after the fix, and the pinned stack builds itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bisect_tool.demo.history import generate
from bisect_tool.demo.model_facts import DEMO_HIDDEN_SIZE
from bisect_tool.demo.pinned import (
    STACK_DIR,
    ensure_pinned_build,
    read_op_schemas,
    run_build,
)
from bisect_tool.errors import BuildFailed

sys.path.insert(0, str(STACK_DIR))
from demollm._custom_ops import REQUIRED_SCHEMAS, Kernels, KernelsUnavailable  # noqa: E402


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = tmp_path_factory.mktemp("kernels")
    history = generate(root / "repo", commits=80)
    out = {"pre": ensure_pinned_build()}
    tree = root / "fixed"
    subprocess.run(
        ["git", "-C", str(history.repo), "worktree", "add", "-q", str(tree), history.good_tag],
        check=True,
    )
    out["post"] = run_build(tree)
    yield out


_copies = 0


def load(so: Path, tmp: Path, monkeypatch: pytest.MonkeyPatch, invariant: bool) -> Kernels:
    """A private copy: the switch is read once per loaded library, so each setting needs its own."""
    global _copies
    _copies += 1
    copy = tmp / f"k{_copies}" / "_kernels.so"
    copy.parent.mkdir()
    shutil.copyfile(so, copy)
    if invariant:
        monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    else:
        monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    kernels = Kernels(copy)
    kernels.rms_norm(np.ones((1, 8), np.float32), None, 1e-6)  # first call caches the switch
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    return kernels


def differing_cases(kernels: Kernels, hidden: int, seeds: int = 16) -> tuple[int, int]:
    """(rms_norm, fused_add_rms_norm) cases where the first 255 rows of a 255-row launch differ
    from the same rows in a 300-row launch: the focused check from vLLM issue 51187."""
    rms = fused = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((300, hidden), dtype=np.float32)
        res = rng.standard_normal((300, hidden), dtype=np.float32)
        w = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
        small = kernels.rms_norm(np.ascontiguousarray(x[:255]), w, 1e-6)
        big = kernels.rms_norm(x, w, 1e-6)
        rms += not np.array_equal(small, big[:255])
        xs, rs = x[:255].copy(), res[:255].copy()
        xb, rb = x.copy(), res.copy()
        kernels.fused_add_rms_norm(xs, rs, w, 1e-6)
        kernels.fused_add_rms_norm(xb, rb, w, 1e-6)
        fused += not np.array_equal(xs, xb[:255])
    return rms, fused


def test_block_size_follows_vllms_launcher(
    builds: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    k = load(builds["pre"], tmp_path, monkeypatch, invariant=True)
    assert [k.block_size(n, 4096) for n in (1, 255, 256, 300)] == [1024, 1024, 256, 256]
    assert [k.block_size(n, DEMO_HIDDEN_SIZE) for n in (255, 256)] == [DEMO_HIDDEN_SIZE, 256]
    fixed = load(builds["post"], tmp_path, monkeypatch, invariant=True)
    assert [fixed.block_size(n, 4096) for n in (255, 256)] == [1024, 1024]


@pytest.mark.parametrize("hidden", [DEMO_HIDDEN_SIZE, 512, 4096])
def test_two_block_sizes_give_different_float32_rows(
    builds: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hidden: int
) -> None:
    pre = load(builds["pre"], tmp_path, monkeypatch, invariant=True)
    rms, fused = differing_cases(pre, hidden, seeds=4)
    assert rms > 0 and fused > 0  # the mechanism is real: same rows, other launch, other bits
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, hidden), dtype=np.float32)
    a, b = pre.rms_norm(x[:255].copy(), None, 1e-6), pre.rms_norm(x, None, 1e-6)[:255]
    rows = np.flatnonzero((a != b).any(axis=1))
    assert 0 < len(rows) < 255
    assert np.max(np.abs(a - b)) < 1e-5  # last-bit differences, not a different formula


def test_switch_pins_the_block_size_only_after_the_fix(
    builds: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hidden = 512
    pre_on = differing_cases(load(builds["pre"], tmp_path, monkeypatch, True), hidden)
    post_on = differing_cases(load(builds["post"], tmp_path, monkeypatch, True), hidden)
    post_off = differing_cases(load(builds["post"], tmp_path, monkeypatch, False), hidden)
    assert min(pre_on) > 0  # v0.26.0: the switch only disables vectorised loads
    assert post_on == (0, 0)  # v0.27.0: pinned
    assert min(post_off) > 0  # the heuristic stays on without the switch (the positive control)


def test_op_schemas_are_exported(builds: dict[str, Path]) -> None:
    for so in builds.values():
        assert read_op_schemas(so) == REQUIRED_SCHEMAS


def test_engine_refuses_an_extension_without_its_ops(tmp_path: Path) -> None:
    src = tmp_path / "other.c"
    src.write_text(
        'const char *bisect_op_schemas(void) { return "_C::rms_norm(Tensor x) -> ()"; }\n'
    )
    so = tmp_path / "_kernels.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    with pytest.raises(KernelsUnavailable, match=r"does not provide the op .*_C::rms_norm"):
        Kernels(so)
    with pytest.raises(KernelsUnavailable, match="not found"):
        Kernels(tmp_path / "missing.so")


def test_pinned_build_is_reused_and_rebuilt_when_stale(tmp_path: Path) -> None:
    stack = tmp_path / "stack"
    shutil.copytree(STACK_DIR, stack, ignore=shutil.ignore_patterns("_kernels.so*", "__pycache__"))
    built = ensure_pinned_build(stack)
    first = built.stat().st_mtime_ns
    assert ensure_pinned_build(stack).stat().st_mtime_ns == first  # fresh: not rebuilt
    kernel = stack / "csrc" / "layernorm_kernels.c"
    kernel.write_text(kernel.read_text() + "\n// touched\n")
    assert ensure_pinned_build(stack).stat().st_mtime_ns != first  # stale: rebuilt
    kernel.write_text(kernel.read_text() + "\nthis is not C\n")
    with pytest.raises(Exception, match="pinned stack does not build"):
        ensure_pinned_build(stack)


def test_build_failure_names_the_compiler_error(tmp_path: Path) -> None:
    stack = tmp_path / "stack"
    shutil.copytree(STACK_DIR, stack, ignore=shutil.ignore_patterns("_kernels.so*", "__pycache__"))
    (stack / "csrc" / "layernorm_kernels.c").write_text("int broken(void) { return 1 }\n")
    with pytest.raises(BuildFailed, match="error"):
        run_build(stack)
