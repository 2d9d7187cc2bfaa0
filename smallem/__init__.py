"""smallem: what a CPU can do for a small language model, measured.

Chapter by chapter the package grows: :mod:`smallem.machine` (chapter 1) measures
the machine, :mod:`smallem.gemm` (chapter 2) multiplies matrices, later modules
train and run a GPT. C kernels live in ``kernels_c/`` and are built on first use
(:mod:`smallem.build`); CUDA kernels in ``kernels_cuda/`` load through CuPy.
"""

__version__ = "0.1.0"


_LAZY = {"matmul": "smallem.gemm", "matmul_bf16": "smallem.gemm",
         "f32_to_bf16": "smallem.gemm", "bf16_to_f32": "smallem.gemm"}


def __getattr__(name):
    # ``import smallem`` stays light: the GEMM (and numpy, cffi) load on first use.
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # found once: later lookups skip this function (microseconds a call)
        return value
    raise AttributeError(f"module 'smallem' has no attribute {name!r}")
