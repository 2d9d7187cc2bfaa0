"""The GPU's measurements: chapter 1's probes (record ``ch1.gpu``) and chapter 2's ladder
beside cuBLAS (``ch2.gpu``), timed with CUDA events."""

from __future__ import annotations

import time

import numpy as np

from smallem.plumbing import build, cuda
from smallem.cpu import machine_info
from smallem.cpu.timing import Timing, quick_mode
from .. import figures, records

CH1 = "ch1.gpu"
CH2 = "ch2.gpu"
RECORDS = (CH1, CH2)
NOT_MEASURED = records.NOT_ON_GPU
KiB, MiB, GiB = 1024, 1024**2, 1024**3


# ---------------------------------------------------------------- timing

def gpu_measure(fn, *, repeats: int = 10, warmup: int = 2, max_time: float | None = 2.0) -> Timing:
    """Time ``fn()`` on the GPU with CUDA events: ``warmup`` calls, then ``repeats`` samples."""
    cp = cuda.require()
    for _ in range(warmup):
        fn()
    cp.cuda.Device().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    out = Timing()
    t0 = time.perf_counter()
    for i in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.seconds.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        if max_time is not None and time.perf_counter() - t0 > max_time and i >= 2:
            break
    return out


def gpu_rounds(cases: dict, rounds: int, warmup: int = 1) -> dict:
    """Paired rounds on the GPU: one CUDA-event sample of every case a round, the order
    alternating from round to round, ``warmup`` untimed calls of each before the first.
    Returns {case: [seconds, one a round]}, for :func:`smallem.book.compare.against`."""
    samples = {k: [] for k in cases}
    for i in range(rounds):
        for k in (list(cases) if i % 2 == 0 else list(cases)[::-1]):
            samples[k] += gpu_measure(cases[k], repeats=1, warmup=warmup if i == 0 else 0).seconds
    return samples


def machine() -> dict:
    return {**machine_info.fingerprint(), "gpu": cuda.device_info()}


# ---------------------------------------------------------------- chapter 1 probes

def probe_flop(kernel: str, iters: int, blocks: int, threads: int) -> float:
    """FLOP one launch of a compute probe does, from the constants in its own source
    (kernels_cuda/probes.cu): "fma_f32", 2 FLOP an FMA, FMA_CHAINS x FMA_UNROLL of them a
    thread and iteration; "mma_bf16", MMA_CHAINS products of 16 x 16 x 16 (2 x 16^3 FLOP)
    a warp and iteration; "wgmma_bf16", WG_CHAINS x WG_UNROLL products of WG_M x WG_N x WG_K
    a warpgroup (128 threads) and iteration."""
    const = lambda name: build.header_constant(name, "probes.cu", cuda.KERNELS_DIR)  # noqa: E731
    if kernel == "fma_f32":
        return 2.0 * const("FMA_CHAINS") * const("FMA_UNROLL") * iters * blocks * threads
    if kernel == "mma_bf16":
        return 2.0 * 16**3 * const("MMA_CHAINS") * iters * blocks * threads / 32
    if kernel == "wgmma_bf16":
        shape = const("WG_M") * const("WG_N") * const("WG_K")
        return 2.0 * shape * const("WG_CHAINS") * const("WG_UNROLL") * iters * blocks * threads / 128
    raise ValueError(f"kernel: expected 'fma_f32', 'mma_bf16' or 'wgmma_bf16', got {kernel!r}")


def _peak(kernel: str, blocks_per_sm: int, iters: int, *args) -> tuple[Timing, float]:
    """(timing, FLOP per call) of a compute probe on blocks_per_sm blocks of 256 threads
    per SM, launched as kernel(out, iters, *args)."""
    cp = cuda.require()
    blocks, threads = cuda.device_info()["sms"] * blocks_per_sm, 256
    out = cp.empty(blocks * threads, dtype=cp.float32)
    k = cuda.kernel("probes", kernel)
    t = gpu_measure(lambda: k((blocks,), (threads,), (out, np.int32(iters), *args)))
    return t, probe_flop(kernel, iters, blocks, threads)


def fma_peak(iters: int) -> tuple[Timing, float]:
    """(timing, FLOP per call) of the f32 FMA probe filling every SM."""
    return _peak("fma_f32", 8, iters, np.float32(0.999), np.float32(1e-3))


def mma_peak(iters: int) -> tuple[Timing, float]:
    """(timing, FLOP per call) of the bf16 tensor-core probe (warp-level wmma, any GPU)."""
    return _peak("mma_bf16", 4, iters, np.uint32(12345))


def has_wgmma() -> bool:
    """Whether the device runs wgmma (compute capability 9.0: H100, H200), for which
    :func:`smallem.plumbing.cuda.module` builds probes.cu for sm_90a."""
    return str(cuda.device_info()["compute_capability"]) == "90"


def wgmma_peak(iters: int) -> tuple[Timing, float]:
    """(timing, FLOP per call) of the Hopper tensor-core probe (warpgroup wgmma): one block of
    two warpgroups per SM. RuntimeError if the device has no wgmma, or if the probe was built
    without it (it then writes NaN instead of its sums)."""
    if not has_wgmma():
        raise RuntimeError(f"wgmma_bf16 needs compute capability 9.0, the device has "
                           f"{cuda.device_info()['compute_capability']}")
    cp = cuda.require()
    blocks, threads = cuda.device_info()["sms"], 256
    out = cp.zeros(blocks * threads, dtype=cp.float32)
    k = cuda.kernel("probes", "wgmma_bf16")
    t = gpu_measure(lambda: k((blocks,), (threads,), (out, np.int32(iters), np.uint32(12345))))
    if np.isnan(cp.asnumpy(out)).any():
        raise RuntimeError("wgmma_bf16 ran its stub: probes.cu was not built for sm_90a")
    return t, probe_flop("wgmma_bf16", iters, blocks, threads)


def read_bandwidth(x, ws_bytes: int, total_bytes: int) -> tuple[Timing, float]:
    """(timing, bytes per call) reading the first ``ws_bytes`` of ``x`` until ``total_bytes``."""
    cp = cuda.require()
    n4 = ws_bytes // 16
    if n4 < 1 or n4 & (n4 - 1):
        raise ValueError(f"working set must be a power of two of at least 16 bytes, got {ws_bytes}")
    total = max(total_bytes, ws_bytes) // 16
    sms = cuda.device_info()["sms"]
    sink = cp.zeros(1, dtype=cp.float32)
    k = cuda.kernel("probes", "read_f32x4")
    t = gpu_measure(lambda: k((sms * 8,), (256,), (x, np.int64(n4), np.int64(total), sink)))
    return t, float(total * 16)


def copy_bandwidth(src, dst, impl: str) -> tuple[Timing, float]:
    """(timing, bytes read + written) copying ``src`` to ``dst`` with our kernel or CuPy's."""
    cp = cuda.require()
    n4 = src.size // 4
    if impl == "ours":
        sms = cuda.device_info()["sms"]
        k = cuda.kernel("probes", "copy_f32x4")
        t = gpu_measure(lambda: k((sms * 8,), (256,), (src, dst, np.int64(n4))))
    else:
        t = gpu_measure(lambda: cp.copyto(dst, src))
    return t, 2.0 * src.nbytes


def random_matrix(shape, seed: int):
    """Standard-normal float32 drawn by numpy on the host, copied to the GPU.

    The same seed gives the same matrices with any CuPy version or GPU, as on the CPU.
    """
    cp = cuda.require()
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    return cp.asarray(x)


def cublas_gemm(dtype: str, n: int) -> tuple[Timing, float]:
    """cuBLAS on n x n x n: f32 through cupy.matmul, bf16 (f32 sums) through cublasGemmEx."""
    cp = cuda.require()
    A, B = random_matrix((n, n), 0), random_matrix((n, n), 1)
    C = cp.empty((n, n), dtype=cp.float32)
    if dtype == "f32":
        t = gpu_measure(lambda: cp.matmul(A, B, out=C))
    else:
        a, b = cuda.to_bf16(A), cuda.to_bf16(B)
        t = gpu_measure(lambda: cublas_bf16(a, b, C))
    return t, 2.0 * n**3


def cublas_bf16(A, B, C):
    """C = A B for row-major bf16 A (M x K), B (K x N), f32 C, with cuBLAS's tensor-core GEMM.

    cuBLAS is column-major: a row-major C is a column-major C^T = B^T A^T, so we pass B
    first and swap M and N.
    """
    cp = cuda.require()
    from cupy.cuda import cublas, runtime
    M, K = A.shape
    N = B.shape[1]
    bf16 = getattr(runtime, "CUDA_R_16BF", 14)
    f32 = getattr(runtime, "CUDA_R_32F", 0)
    compute = getattr(cublas, "CUBLAS_COMPUTE_32F", 68)
    algo = getattr(cublas, "CUBLAS_GEMM_DEFAULT", -1)
    one, zero = np.ones(1, np.float32), np.zeros(1, np.float32)
    handle = cp.cuda.device.get_cublas_handle()
    mode = cublas.getPointerMode(handle)
    cublas.setPointerMode(handle, getattr(cublas, "CUBLAS_POINTER_MODE_HOST", 0))
    try:
        cublas.gemmEx(handle, 0, 0, N, M, K, one.ctypes.data, B.data.ptr, bf16, N,
                      A.data.ptr, bf16, K, zero.ctypes.data, C.data.ptr, f32, N, compute, algo)
    finally:
        cublas.setPointerMode(handle, mode)
    return C


def ch1_settings(quick: bool) -> dict:
    if quick:
        return {"quick": True, "fma_iters": 200, "mma_iters": 1000, "wgmma_iters": 100,
                "cublas_n": [512],
                "ws_bytes": [2**k for k in range(18, 27, 2)], "read_total_bytes": 64 * MiB,
                "copy_bytes": 64 * MiB}
    return {"quick": False, "fma_iters": 20000, "mma_iters": 100000, "wgmma_iters": 20000,
            "cublas_n": [4096, 8192],
            "ws_bytes": [2**k for k in range(18, 33)], "read_total_bytes": 2 * GiB,
            "copy_bytes": 1 * GiB}


def run_ch1(quick: bool | None = None, progress: bool = True) -> records.Record:
    cp = cuda.require()
    quick = quick_mode() if quick is None else quick
    s = ch1_settings(quick)
    rec = records.Record(CH1, settings=s, machine=machine())
    say = print if progress else (lambda *a, **k: None)

    t, flop = fma_peak(s["fma_iters"])
    rec.add("fma_peak", "Gop/s", t.rate(flop / 1e9), seconds=t.stats(), kind="f32")
    t, flop = mma_peak(s["mma_iters"])
    rec.add("mma_peak", "Gop/s", t.rate(flop / 1e9), seconds=t.stats(), kind="bf16")
    peaks = f"bf16 {figures.fmt(records.value(rec.data, 'mma_peak'), 'Gop/s')}"
    if has_wgmma():  # Hopper: the warpgroup instruction, beside the warp one
        t, flop = wgmma_peak(s["wgmma_iters"])
        rec.add("wgmma_peak", "Gop/s", t.rate(flop / 1e9), seconds=t.stats(), kind="bf16")
        peaks += f", bf16 wgmma {figures.fmt(records.value(rec.data, 'wgmma_peak'), 'Gop/s')}"
    say(f"peaks: f32 {figures.fmt(records.value(rec.data, 'fma_peak'), 'Gop/s')}, {peaks}")
    for n in s["cublas_n"]:
        for dt in ("f32", "bf16"):
            t, flop = cublas_gemm(dt, n)
            rec.add("cublas", "Gop/s", t.rate(flop / 1e9), seconds=t.stats(), dtype=dt, n=n)
    cp.get_default_memory_pool().free_all_blocks()

    biggest = max(s["ws_bytes"])
    x = cp.ones(biggest // 4, dtype=cp.float32)
    for ws in s["ws_bytes"]:
        t, nbytes = read_bandwidth(x, ws, s["read_total_bytes"])
        rec.add("read", "GB/s", t.rate(nbytes / 1e9), seconds=t.stats(), bytes=ws)
    del x
    cp.get_default_memory_pool().free_all_blocks()
    src = cp.ones(s["copy_bytes"] // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    for impl in ("ours", "cupy"):
        t, nbytes = copy_bandwidth(src, dst, impl)
        rec.add("copy", "GB/s", t.rate(nbytes / 1e9), seconds=t.stats(), impl=impl,
                bytes=s["copy_bytes"])
    del src, dst
    cp.get_default_memory_pool().free_all_blocks()
    say(f"staircase: {len(s['ws_bytes'])} working sets, copy ours "
        f"{figures.fmt(records.value(rec.data, 'copy', impl='ours'), 'GB/s')}")
    return rec


# ---------------------------------------------------------------- chapter 2: the ladder

def ch2_settings(quick: bool) -> dict:
    if quick:
        return {"quick": True, "ladder_n": 256, "sweep_n": [128, 256]}
    return {"quick": False, "ladder_n": 4096, "sweep_n": [1024, 2048, 4096, 8192]}


def _max_rel_err(got, want) -> float:
    """Largest |got - want| over the largest |want|; CuPy or numpy arrays alike."""
    scale = float(abs(want).max())
    if not scale > 0:  # also NaN
        raise ValueError(f"the reference product's largest magnitude is {scale}: its inputs "
                         f"were not random normal matrices, so nothing would be checked")
    return float(abs(got - want).max()) / scale


CHECK_ROWS = 16  # rows of C checked against float64 on the host


def _f64_rows(data: dict, dtype: str):
    """(row indices, those rows of A B in float64 on the host), for the inputs of ``dtype``:
    an answer no GPU summation order shares. cuBLAS can: where it does not split K, its
    f32 kernels sum each element's products in k order with FMAs, as ours do, and give
    the same bits."""
    key = f"f64_{dtype}"
    if key not in data:
        cp = cuda.require()
        from smallem.product.gemm import bf16_to_f32
        A, B = (data["a16"], data["b16"]) if dtype == "bf16" else (data["A"], data["B"])
        rows = np.linspace(0, A.shape[0] - 1, CHECK_ROWS).astype(np.int64)
        a, b = cp.asnumpy(A[rows]), cp.asnumpy(B)
        if dtype == "bf16":
            a, b = bf16_to_f32(a), bf16_to_f32(b)
        data[key] = rows, a.astype(np.float64) @ b.astype(np.float64)
    return data[key]


def measure_rung(rung: cuda.Rung, n: int, data: dict) -> tuple[Timing, float, float]:
    """Time one rung on n x n x n: (timing, max relative error against cuBLAS on the same
    inputs, the same against float64 on CHECK_ROWS rows). ``data`` caches the inputs and
    the answers."""
    A, B = (data["a16"], data["b16"]) if rung.dtype == "bf16" else (data["A"], data["B"])
    C = data["C"]
    C.fill(np.nan)  # a rung that writes nothing cannot pass for one that is right
    t = gpu_measure(lambda: cuda.gemm(rung.name, A, B, out=C),
                    repeats=3 if rung.number < 2 else 10, warmup=1)
    want = data["ref_bf16"] if rung.dtype == "bf16" else data["ref_f32"]
    rows, ref64 = _f64_rows(data, rung.dtype)
    got = cuda.require().asnumpy(C[rows]).astype(np.float64)
    return t, _max_rel_err(C, want), _max_rel_err(got, ref64)


def _inputs(n: int) -> dict:
    cp = cuda.require()
    A, B = random_matrix((n, n), 2), random_matrix((n, n), 3)
    d = {"A": A, "B": B, "C": cp.empty((n, n), dtype=cp.float32)}
    d["a16"], d["b16"] = cuda.to_bf16(A), cuda.to_bf16(B)
    d["ref_f32"] = cp.matmul(A, B)
    d["ref_bf16"] = cublas_bf16(d["a16"], d["b16"], cp.empty((n, n), dtype=cp.float32))
    return d


def run_ch2(quick: bool | None = None, progress: bool = True) -> records.Record:
    cp = cuda.require()
    quick = quick_mode() if quick is None else quick
    s = ch2_settings(quick)
    rec = records.Record(CH2, settings=s, machine=machine())
    say = print if progress else (lambda *a, **k: None)
    n = s["ladder_n"]
    data = _inputs(n)
    for dt in ("f32", "bf16"):
        t, flop = cublas_gemm(dt, n)
        rec.add("cublas", "Gop/s", t.rate(flop / 1e9), seconds=t.stats(), dtype=dt, n=n)
    for rung in cuda.GPU_LADDER:
        t, err, err64 = measure_rung(rung, n, data)
        rec.add("gemm", "Gop/s", t.rate(2.0 * n**3 / 1e9), seconds=t.stats(), rung=rung.name,
                number=rung.number, dtype=rung.dtype, n=n, max_rel_err=err,
                max_rel_err_f64=err64)
        say(f"  {rung.number} {rung.name:10s} {figures.fmt(t.rate(2.0 * n**3 / 1e9)['median'], 'Gop/s'):>14}"
            f"  max rel. error: against cuBLAS {err:.1e}, against float64 {err64:.1e}")
    del data
    cp.get_default_memory_pool().free_all_blocks()
    for m in s["sweep_n"]:
        data = _inputs(m)
        for dt, name in (("f32", cuda.FINAL_F32), ("bf16", cuda.FINAL_BF16)):
            if m != n:
                t, flop = cublas_gemm(dt, m)
                rec.add("cublas", "Gop/s", t.rate(flop / 1e9), seconds=t.stats(), dtype=dt, n=m)
            t, err, err64 = measure_rung(cuda.RUNGS[name], m, data)
            rec.add("sweep", "Gop/s", t.rate(2.0 * m**3 / 1e9), seconds=t.stats(), rung=name,
                    dtype=dt, n=m, max_rel_err=err, max_rel_err_f64=err64)
        del data
        cp.get_default_memory_pool().free_all_blocks()
    return rec
