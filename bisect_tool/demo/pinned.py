"""The demo's pinned stack: the ``demollm`` engine shipped in ``stack/``, at v0.26.0.

``stack/`` is laid out like a checkout of the generated history (``csrc/``, ``CMakeLists.txt``,
``setup.py``, ``demollm/``), so the pinned ``_kernels.so`` is built by the same command a
candidate is. It is not shipped prebuilt: :func:`ensure_pinned_build` compiles it with the system
C compiler the first time, and again whenever the sources change.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from filelock import FileLock

from bisect_tool.errors import BuildFailed, InfrastructureError

STACK_DIR = Path(__file__).parent / "stack"
SWAP_PATH = "demollm/_kernels.so"  # relative to a worktree root and to STACK_DIR alike
SERVER_MODULE = "demollm.server"
BUILD_COMMAND = "python3 setup.py build_ext --inplace"
BUILD_INPUTS = ("CMakeLists.txt", "setup.py", "csrc")
_STAMP_SUFFIX = ".source-sha256"


def source_digest(root: Path) -> str:
    """sha256 over the files the build reads (names and bytes), in a fixed order."""
    digest = hashlib.sha256()
    for name in BUILD_INPUTS:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()


def run_build(root: Path, python: str = sys.executable, timeout_s: float = 120.0) -> Path:
    """Build ``demollm/_kernels.so`` in ``root`` (a worktree or the pinned stack)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        raise InfrastructureError("no C compiler found: install one (apt-get install gcc)")
    command = [python, "setup.py", "build_ext", "--inplace"]
    try:
        result = subprocess.run(
            command, cwd=root, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"build in {root} took more than {timeout_s:.0f} s") from None
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise BuildFailed(f"build in {root} failed (exit {result.returncode}):\n{tail}")
    return root / SWAP_PATH


def ensure_pinned_build(stack_dir: Path = STACK_DIR) -> Path:
    """The pinned ``_kernels.so``, compiled into ``stack_dir/demollm`` if missing or stale.

    Safe to call from several processes at once (a file lock; the build replaces the file
    atomically). Raises ``InfrastructureError`` when the stack cannot be built: without its own
    extension the pinned stack cannot run at all, so no candidate could be judged.
    """
    target = stack_dir / SWAP_PATH
    stamp = target.with_name(target.name + _STAMP_SUFFIX)
    try:
        with FileLock(str(stack_dir / ".build.lock"), timeout=300):
            wanted = source_digest(stack_dir)
            if target.is_file() and stamp.is_file() and stamp.read_text().strip() == wanted:
                return target
            run_build(stack_dir)
            stamp.write_text(wanted + "\n")
    except BuildFailed as exc:
        raise InfrastructureError(f"the demo's pinned stack does not build: {exc}") from None
    except OSError as exc:
        raise InfrastructureError(
            f"cannot build the demo's pinned stack in {stack_dir} ({exc}); "
            "make that directory writable or install bisect-tool editable (pip install -e .)"
        ) from None
    return target


def read_op_schemas(so_path: Path) -> tuple[str, ...]:
    """The op schemas a demollm ``_kernels.so`` declares (``bisect_op_schemas()``), loaded from a
    private copy so that a later file at the same path is never served from dlopen's cache."""
    with tempfile.TemporaryDirectory(prefix="bisect-schemas-") as tmp:
        copy = Path(tmp) / "kernels.so"
        shutil.copyfile(so_path, copy)
        try:
            lib = ctypes.CDLL(str(copy))
        except OSError as exc:
            raise BuildFailed(f"{so_path} does not load: {exc}") from None
        try:
            fn = lib.bisect_op_schemas
        except AttributeError:
            return ()
        fn.restype = ctypes.c_char_p
        raw = fn() or b""
    return tuple(line.strip() for line in raw.decode().splitlines() if line.strip())
