"""A numpy-backed stand-in for CuPy (tests only): runs smallem's GPU orchestration - launches,
records, cuBLAS calls, tables, training steps, the decoder - without a GPU.

Kernels of kernels_cuda/gemm.cu, mma.cu and probes.cu are emulated by name with numpy (they are
large and have their own emulator tests); every other kernel runs its own CUDA C++ on the CPU through
tests/cuda_emu/emulator.py, so the orchestration is checked against the real kernels.

Host transfers are counted in ``_TRANSFERS`` ("to_device": asarray of a host array; "to_host":
asnumpy, .get(), float(), int(), .item(), .tolist()). CUDA-graph capture is modelled: while a
stream captures, kernel launches and ``matmul`` are recorded (not run) and replayed by
``Graph.launch``; any other operation on a fake array during capture raises, as it would
not be captured on a GPU."""
import ctypes
import functools
import re
import sys
from pathlib import Path

import numpy as np

__version__ = "fake"
float32, float64, uint16, uint32 = np.float32, np.float64, np.uint16, np.uint32
_TRANSFERS = {"to_device": 0, "to_host": 0}
_CAPTURE = []  # the graph being captured: a list of closures, or nothing


def _no_capture(what):
    if _CAPTURE:
        raise RuntimeError(f"fake CuPy: {what} during CUDA-graph capture (only kernel launches "
                           f"and matmul are captured)")


class _Dev:
    id = 0


class _Data:
    def __init__(self, a): self.ptr = a.ctypes.data


class ndarray(np.ndarray):
    @property
    def device(self): return _Dev()

    @property
    def data(self): return _Data(self)

    def get(self, stream=None, out=None):
        _no_capture("get()")
        _TRANSFERS["to_host"] += 1
        return np.asarray(self).view(np.ndarray).copy()

    def __float__(self):
        _no_capture("float()")
        _TRANSFERS["to_host"] += 1
        return float(np.asarray(self).view(np.ndarray))

    def __int__(self):
        _no_capture("int()")
        _TRANSFERS["to_host"] += 1
        return int(np.asarray(self).view(np.ndarray))

    def item(self, *a):
        _no_capture("item()")
        _TRANSFERS["to_host"] += 1
        return np.asarray(self).view(np.ndarray).item(*a)

    def tolist(self):
        _no_capture("tolist()")
        _TRANSFERS["to_host"] += 1
        return np.asarray(self).view(np.ndarray).tolist()

    def __setitem__(self, key, value):
        _no_capture("an assignment into an array")
        if isinstance(value, np.ndarray) and not isinstance(value, ndarray):
            _TRANSFERS["to_device"] += 1
        super().__setitem__(key, value)

    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        _no_capture(f"numpy ufunc {ufunc.__name__}")
        plain = lambda x: np.asarray(x).view(np.ndarray) if isinstance(x, ndarray) else x  # noqa: E731
        outs = kw.get("out")
        if outs is not None:
            kw["out"] = tuple(plain(o) for o in outs)
        r = getattr(ufunc, method)(*[plain(x) for x in inputs], **kw)
        if outs is not None:
            return outs[0] if len(outs) == 1 else outs
        return _wrap(r)


def _wrap(r):
    if isinstance(r, tuple):
        return tuple(_wrap(x) for x in r)
    if isinstance(r, np.ndarray):
        return r.view(ndarray)
    if isinstance(r, np.generic):  # cupy reductions return 0-d device arrays
        return np.asarray(r).view(ndarray)
    return r


def _w(f):
    @functools.wraps(f)
    def g(*a, **k):
        _no_capture(getattr(f, "__name__", "an operation"))
        return _wrap(f(*a, **k))
    return g


empty, zeros, ones, empty_like = _w(np.empty), _w(np.zeros), _w(np.ones), _w(np.empty_like)
zeros_like, ones_like, full = _w(np.zeros_like), _w(np.ones_like), _w(np.full)
abs = _w(np.abs)


def asarray(x, dtype=None):
    _no_capture("asarray")
    if not isinstance(x, ndarray):
        _TRANSFERS["to_device"] += 1
    return np.array(x, dtype=dtype).view(ndarray)


array = asarray


def asnumpy(x, stream=None):
    _no_capture("asnumpy")
    if isinstance(x, ndarray):
        _TRANSFERS["to_host"] += 1
    return np.asarray(x).view(np.ndarray).copy()


def get_array_module(*args):
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def _matmul_now(a, b, out):
    r = (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(np.float32)
    if out is None:
        return r.view(ndarray)
    np.ndarray.__setitem__(out, Ellipsis, r)
    return out


def matmul(a, b, out=None):
    if _CAPTURE:
        if out is None:
            raise RuntimeError("fake CuPy: matmul without out= during capture")
        _CAPTURE[-1].append(lambda: _matmul_now(a, b, out))
        return out
    return _matmul_now(a, b, out)


def copyto(dst, src):
    _no_capture("copyto")
    np.ndarray.__setitem__(dst, Ellipsis, src)


def ascontiguousarray(x): return _w(np.ascontiguousarray)(x)


def __getattr__(name):  # cupy.exp, cupy.sum, ...: numpy's, returning fake device arrays
    f = getattr(np, name)
    return _w(f) if callable(f) and not isinstance(f, type) else f


class _Pool:
    def free_all_blocks(self): pass
    def used_bytes(self): return 0


def get_default_memory_pool(): return _Pool()


class _Gen:
    def __init__(self, seed): self.g = np.random.default_rng(seed)
    def standard_normal(self, shape, dtype=np.float64): return self.g.standard_normal(shape).astype(dtype).view(ndarray)


class random:
    default_rng = staticmethod(lambda seed=None: _Gen(seed))


# ---------------------------------------------------------------- kernels

def _gemm(name, M, N, K, A, B, C):
    A, B = np.asarray(A), np.asarray(B)
    if name.startswith("hgemm"):
        A = (A.astype(np.uint32) << 16).view(np.float32); B = (B.astype(np.uint32) << 16).view(np.float32)
    if name.endswith("_tn"): A = A.T
    if name.endswith("_nt"): B = B.T
    assert A.shape == (M, K) and B.shape == (K, N), (name, A.shape, B.shape, M, N, K)
    np.ndarray.__setitem__(C, Ellipsis, (A.astype(np.float64) @ B.astype(np.float64)).astype(np.float32))


_EMU = Path(__file__).resolve().parents[2] / "cuda_emu"
_GLOBAL = re.compile(r'extern\s+"C"\s+__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s+)?'
                     r'(?:void\s+)?(\w+)\s*\(')
_NUMPY_NAMES = set()  # the kernels of gemm.cu, mma.cu and probes.cu, emulated with numpy here
for _f in ("gemm.cu", "mma.cu", "probes.cu"):
    _p = _EMU.parents[1] / "kernels_cuda" / _f
    if _p.exists():
        _NUMPY_NAMES |= set(_GLOBAL.findall(_p.read_text()))


def _numpy_kernel(n, args):
    if "gemm" in n:
        _gemm(n, *[int(a) if isinstance(a, np.integer) else a for a in args[:3]], *args[3:])
    elif n == "f32_to_bf16":
        from smallem.plumbing.cuda import bf16_bits
        np.ndarray.__setitem__(args[1], Ellipsis, bf16_bits(np.asarray(args[0])))
    elif n == "copy_f32x4":
        np.ndarray.__setitem__(args[1], Ellipsis, args[0])
    else:
        assert n in ("fma_f32", "mma_bf16", "read_f32x4", "wgmma_bf16"), n


class _Kernel:
    max_dynamic_shared_size_bytes = 0

    def __init__(self, name, emu=None): self.name, self.emu = name, emu

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        assert shared_mem <= 48 * 1024 or self.max_dynamic_shared_size_bytes >= shared_mem
        grid = grid if isinstance(grid, tuple) else (grid,)
        block = block if isinstance(block, tuple) else (block,)
        assert all(isinstance(g, int) and g > 0 for g in grid), grid
        assert all(isinstance(b, int) and b > 0 for b in block) and np.prod(block) <= 1024, block
        for a in args:  # what CuPy accepts: device arrays and numpy scalars
            assert isinstance(a, (ndarray, np.generic)) or a is None, (self.name, type(a))
        if self.emu is None:
            run = lambda: _numpy_kernel(self.name, args)  # noqa: E731
        else:
            plain = tuple(np.asarray(a).view(np.ndarray) if isinstance(a, ndarray) else a
                          for a in args)
            run = lambda: self.emu.launch(self.name, grid, block, plain, shared_mem)  # noqa: E731
        if _CAPTURE:
            _CAPTURE[-1].append(run)
        else:
            run()


class RawModule:
    def __init__(self, code=None, options=(), name_expressions=None, path=None, **kw):
        assert (code is None) != (path is None), "RawModule takes code or path"
        self.code, self.path, self._emu = code, path, None

    def compile(self): pass

    def get_function(self, name):
        if self.path is not None:  # machine code (probes.cu for sm_90a): numpy's stand-ins
            assert Path(self.path).stat().st_size > 0 and name in _NUMPY_NAMES, name
            return _Kernel(name)
        assert f'"C" __global__' in self.code and name in self.code, name
        if name in _NUMPY_NAMES:
            return _Kernel(name)
        if self._emu is None:
            sys.path.insert(0, str(_EMU))
            try:
                from emulator import Emulator
            finally:
                sys.path.remove(str(_EMU))
            self._emu = Emulator(self.code)
        if name not in self._emu.names:
            raise AttributeError(f"fake CuPy: no kernel {name!r} in this module")
        return _Kernel(name, self._emu)


from . import cuda  # noqa: E402
