"""smallem: what a CPU can do for a small language model, measured.

The library's folders read as the book: :mod:`smallem.cpu` measures the machine (chapter
1), :mod:`smallem.product` multiplies matrices (chapter 2), :mod:`smallem.training` trains a
GPT (chapter 3), :mod:`smallem.generating` generates text from it and from others' GGUF
files (chapter 4, appendix B), and :mod:`smallem.plumbing` builds and threads the kernels.
C kernels live in ``kernels_c/`` and are built on first use (:mod:`smallem.plumbing.build`);
CUDA kernels in ``kernels_cuda/`` load through CuPy. The book itself (each chapter's
measuring and reading) is :mod:`smallem.book`, which the library never imports.
"""

__version__ = "0.1.0"


_LAZY = {"matmul": "smallem.product.gemm", "matmul_bf16": "smallem.product.gemm",
         "f32_to_bf16": "smallem.product.gemm", "bf16_to_f32": "smallem.product.gemm"}


def __getattr__(name):
    # ``import smallem`` stays light: the GEMM (and numpy, cffi) load on first use.
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # found once: later lookups skip this function (microseconds a call)
        return value
    raise AttributeError(f"module 'smallem' has no attribute {name!r}")
