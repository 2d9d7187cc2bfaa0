"""smallem: what a CPU can do for a small language model, measured.

Chapter by chapter the package grows: :mod:`smallem.machine` (chapter 1) measures
the machine, :mod:`smallem.gemm` (chapter 2) multiplies matrices, later modules
train and run a GPT. C kernels live in ``kernels_c/`` and are built on first use
(:mod:`smallem.build`); CUDA kernels in ``kernels_cuda/`` load through CuPy.
"""

__version__ = "0.1.0"
