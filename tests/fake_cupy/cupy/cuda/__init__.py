import ctypes
import numpy as np


class Device:
    id = 0
    compute_capability = "90"
    def __init__(self, i=0): pass
    def synchronize(self): pass
    def __enter__(self): return self
    def __exit__(self, *a): return False


class runtime:
    CUDA_R_16BF = 14; CUDA_R_32F = 0
    getDeviceCount = staticmethod(lambda: 1)
    getDeviceProperties = staticmethod(lambda i: {"name": b"Fake GPU", "multiProcessorCount": 4,
        "totalGlobalMem": 2**34, "l2CacheSize": 2**22, "sharedMemPerMultiprocessor": 2**17})
    driverGetVersion = staticmethod(lambda: 13000)
    runtimeGetVersion = staticmethod(lambda: 13000)


class Event:
    def __init__(self, *a, **k): pass
    def record(self, stream=None): pass
    def synchronize(self): pass


def get_elapsed_time(a, b): return 1.0


class Graph:
    """A captured sequence of kernel launches (and matmuls), replayed by launch()."""
    def __init__(self, steps): self.steps = steps
    def launch(self, stream=None):
        from .. import _no_capture
        _no_capture("Graph.launch")
        for step in self.steps:
            step()
    def upload(self, stream=None): pass


class Stream:
    null = None
    def __init__(self, null=False, non_blocking=False, ptds=False): self.capturing = False
    def __enter__(self):
        _STREAMS.append(self); return self
    def __exit__(self, *a):
        _STREAMS.pop(); return False
    def synchronize(self): pass
    def use(self):
        _STREAMS.append(self); return self
    def begin_capture(self, mode=None):
        from .. import _CAPTURE
        if _CAPTURE:
            raise RuntimeError("fake CuPy: a capture is already under way")
        _CAPTURE.append([])
        self.capturing = True
    def end_capture(self):
        from .. import _CAPTURE
        if not self.capturing:
            raise RuntimeError("fake CuPy: end_capture without begin_capture")
        self.capturing = False
        return Graph(_CAPTURE.pop())
    def is_capturing(self): return self.capturing


Stream.null = Stream()
_STREAMS = []


def get_current_stream():
    return _STREAMS[-1] if _STREAMS else Stream.null


class device:
    get_cublas_handle = staticmethod(lambda: 1)


class cublas:
    CUBLAS_COMPUTE_32F = 68; CUBLAS_GEMM_DEFAULT = -1; CUBLAS_POINTER_MODE_HOST = 0
    getPointerMode = staticmethod(lambda h: 0)
    setPointerMode = staticmethod(lambda h, m: None)
    @staticmethod
    def gemmEx(h, ta, tb, m, n, k, alpha, A, At, lda, B, Bt, ldb, beta, C, Ct, ldc, ct, algo):
        # column-major m x n = A(m x k) B(k x n); smallem passes B first for a row-major product
        arr = lambda p, cnt, t: np.ctypeslib.as_array((t * cnt).from_address(p))
        a = arr(A, m * k, ctypes.c_uint16).reshape(k, m)  # col-major m x k seen row-major
        b = arr(B, k * n, ctypes.c_uint16).reshape(n, k)
        c = arr(C, m * n, ctypes.c_float).reshape(n, m)
        f = lambda x: (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        c[...] = (f(b) @ f(a)).astype(np.float32)   # (A_cm B_cm)^T in row-major = b a
