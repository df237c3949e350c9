"""demollm: a tiny engine shaped like vLLM, the built-in target of `bisect demo`.

Stdlib + numpy. Everything is batch-invariant except the RMSNorm in the compiled extension
``_kernels.so`` (loaded from this directory, so swapping that file swaps the kernel).
"""

import os

# One BLAS thread: the per-row matrix-vector products must not depend on how a thread pool split
# the work, and small products are faster on one thread anyway. Set before numpy loads OpenBLAS.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

__version__ = "0.26.0"
