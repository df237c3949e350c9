"""The compiled ops, loaded with ctypes from ``_kernels.so`` in this package's directory.

Like vLLM's ``vllm/_custom_ops.py`` calling ``torch.ops._C.rms_norm``: the Python side needs
ops with exact schemas, so a swapped extension whose schemas differ fails at import, loudly.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

import numpy as np

KERNELS_PATH = Path(__file__).with_name("_kernels.so")

REQUIRED_SCHEMAS = (
    "_C::rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()",
    "_C::fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()",
)

_F32P = ctypes.POINTER(ctypes.c_float)


class KernelsUnavailable(ImportError):
    """``_kernels.so`` is missing, does not load, or lacks an op the engine calls."""


def read_schemas(lib: ctypes.CDLL) -> tuple[str, ...]:
    try:
        fn = lib.bisect_op_schemas
    except AttributeError:
        return ()
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    raw = fn() or b""
    return tuple(line.strip() for line in raw.decode().splitlines() if line.strip())


class Kernels:
    """The loaded extension. Rows are float32, C-contiguous, ``(num_tokens, hidden)``."""

    def __init__(self, path: Path = KERNELS_PATH) -> None:
        if not path.is_file():
            raise KernelsUnavailable(
                f"{path} not found: build it (python3 setup.py build_ext --inplace)"
            )
        try:
            self._lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise KernelsUnavailable(f"{path} does not load: {exc}") from None
        self.path = path
        self.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        self.schemas = read_schemas(self._lib)
        missing = [s for s in REQUIRED_SCHEMAS if s not in self.schemas]
        if missing:
            raise KernelsUnavailable(
                f"{path} does not provide the op this engine calls: {missing[0]} "
                f"(it provides: {'; '.join(self.schemas) or 'no schemas'})"
            )
        for name, first in (("rms_norm", _F32P), ("fused_add_rms_norm", _F32P)):
            fn = getattr(self._lib, name)
            fn.restype = ctypes.c_int
            fn.argtypes = [first, _F32P, _F32P, ctypes.c_float, ctypes.c_int64, ctypes.c_int64]
        self._block = getattr(self._lib, "demollm_rms_norm_block_size", None)
        if self._block is not None:
            self._block.restype = ctypes.c_int
            self._block.argtypes = [ctypes.c_int64, ctypes.c_int64]

    def block_size(self, num_tokens: int, hidden: int) -> int | None:
        """The block size the launcher picks (None when the build does not say)."""
        return None if self._block is None else int(self._block(num_tokens, hidden))

    @staticmethod
    def _ptr(array: np.ndarray | None) -> ctypes._Pointer | None:
        return None if array is None else array.ctypes.data_as(_F32P)

    @staticmethod
    def _check(array: np.ndarray) -> None:
        if array.dtype != np.float32 or array.ndim != 2 or not array.flags.c_contiguous:
            raise ValueError("rows must be a C-contiguous float32 (num_tokens, hidden) array")

    def rms_norm(self, x: np.ndarray, weight: np.ndarray | None, eps: float) -> np.ndarray:
        self._check(x)
        out = np.empty_like(x)
        rc = self._lib.rms_norm(
            self._ptr(out), self._ptr(x), self._ptr(weight), eps, x.shape[0], x.shape[1]
        )
        if rc != 0:
            raise RuntimeError(f"rms_norm failed ({rc})")
        return out

    def fused_add_rms_norm(
        self, x: np.ndarray, residual: np.ndarray, weight: np.ndarray | None, eps: float
    ) -> None:
        """In place: residual += x; x = rms_norm(residual) * weight."""
        self._check(x)
        self._check(residual)
        rc = self._lib.fused_add_rms_norm(
            self._ptr(x), self._ptr(residual), self._ptr(weight), eps, x.shape[0], x.shape[1]
        )
        if rc != 0:
            raise RuntimeError(f"fused_add_rms_norm failed ({rc})")
