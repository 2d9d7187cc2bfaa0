"""A numpy-backed stand-in for CuPy (tests only): runs smallem's GPU orchestration - launches,
records, cuBLAS calls, tables - without a GPU. Kernels are emulated by name with numpy: this
checks the Python around the kernels, never the kernels themselves."""
import ctypes
import numpy as np
__version__ = "fake"
float32, float64, uint16, uint32 = np.float32, np.float64, np.uint16, np.uint32

class _Dev:
    id = 0
class _Data:
    def __init__(self, a): self.ptr = a.ctypes.data
class ndarray(np.ndarray):
    @property
    def device(self): return _Dev()
    @property
    def data(self): return _Data(self)

def _w(f):
    return lambda *a, **k: np.asarray(f(*a, **k)).view(ndarray)
empty, zeros, ones, empty_like = _w(np.empty), _w(np.zeros), _w(np.ones), _w(np.empty_like)
asarray = _w(lambda x, dtype=None: np.array(x, dtype=dtype))
abs = _w(np.abs)
def asnumpy(x): return np.asarray(x).view(np.ndarray).copy()
def matmul(a, b, out=None):
    r = (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(np.float32)
    if out is None: return r.view(ndarray)
    out[...] = r; return out
def copyto(dst, src): dst[...] = src
def ascontiguousarray(x): return np.ascontiguousarray(x).view(ndarray)
class _Pool:
    def free_all_blocks(self): pass
def get_default_memory_pool(): return _Pool()
class _Gen:
    def __init__(self, seed): self.g = np.random.default_rng(seed)
    def standard_normal(self, shape, dtype=np.float64): return self.g.standard_normal(shape).astype(dtype).view(ndarray)
class random:
    default_rng = staticmethod(lambda seed=None: _Gen(seed))

def _gemm(name, M, N, K, A, B, C):
    A, B = np.asarray(A), np.asarray(B)
    if name.startswith("hgemm"):
        A = (A.astype(np.uint32) << 16).view(np.float32); B = (B.astype(np.uint32) << 16).view(np.float32)
    if name.endswith("_tn"): A = A.T
    if name.endswith("_nt"): B = B.T
    assert A.shape == (M, K) and B.shape == (K, N), (name, A.shape, B.shape, M, N, K)
    C[...] = (A.astype(np.float64) @ B.astype(np.float64)).astype(np.float32)

class _Kernel:
    max_dynamic_shared_size_bytes = 0
    def __init__(self, name): self.name = name
    def __call__(self, grid, block, args, shared_mem=0):
        assert shared_mem <= 48 * 1024 or self.max_dynamic_shared_size_bytes >= shared_mem
        assert all(isinstance(g, int) and g > 0 for g in grid), grid
        n = self.name
        if "gemm" in n: _gemm(n, *[int(a) if isinstance(a, np.integer) else a for a in args[:3]], *args[3:])
        elif n == "f32_to_bf16":
            from smallem.plumbing.cuda import bf16_bits
            args[1][...] = bf16_bits(np.asarray(args[0]))
        elif n == "copy_f32x4": args[1][...] = args[0]
        else: assert n in ("fma_f32", "mma_bf16", "read_f32x4"), n

class RawModule:
    def __init__(self, code, options=(), name_expressions=None): self.code = code
    def compile(self): pass
    def get_function(self, name):
        assert f'"C" __global__' in self.code and name in self.code, name
        return _Kernel(name)
from . import cuda
