"""smallem: what a CPU can do for a small language model, measured.

Chapter by chapter the package grows: :mod:`smallem.machine` (chapter 1) measures
the machine, :mod:`smallem.gemm` (chapter 2) multiplies matrices, later modules
train and run a GPT. C kernels live in ``kernels_c/`` and are built on first use
(:mod:`smallem.build`); CUDA kernels in ``kernels_cuda/`` load through CuPy.
"""

import os as _os

__version__ = "0.1.0"

# OpenMP threads that have finished a parallel region spin, by default, for a while before
# they sleep. On a machine whose cores are shared (two vCPUs on one physical core, or
# another process next door) that spinning halves what a single thread measures right
# after a multi-threaded kernel. Our kernels run long parallel regions, so waking sleeping
# threads costs them little; a reader who wants spinning sets OMP_WAIT_POLICY=active.
# (libgomp reads this once, when the first kernel loads it.)
_os.environ.setdefault("OMP_WAIT_POLICY", "passive")


_LAZY = {"matmul": "smallem.gemm", "matmul_bf16": "smallem.gemm",
         "f32_to_bf16": "smallem.gemm", "bf16_to_f32": "smallem.gemm"}


def __getattr__(name):
    # ``import smallem`` stays light: the GEMM (and numpy, cffi) load on first use.
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'smallem' has no attribute {name!r}")
