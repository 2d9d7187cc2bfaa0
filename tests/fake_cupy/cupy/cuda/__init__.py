import ctypes
import numpy as np
class Device:
    id = 0
    compute_capability = "90"
    def __init__(self, i=0): pass
    def synchronize(self): pass
class runtime:
    CUDA_R_16BF = 14; CUDA_R_32F = 0
    getDeviceCount = staticmethod(lambda: 1)
    getDeviceProperties = staticmethod(lambda i: {"name": b"Fake GPU", "multiProcessorCount": 4,
        "totalGlobalMem": 2**34, "l2CacheSize": 2**22, "sharedMemPerMultiprocessor": 2**17})
    driverGetVersion = staticmethod(lambda: 13000)
    runtimeGetVersion = staticmethod(lambda: 13000)
class Event:
    def record(self): pass
    def synchronize(self): pass
def get_elapsed_time(a, b): return 1.0
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
