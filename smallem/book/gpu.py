"""The GPU side of chapters 1 and 2, measured through CuPy.

Chapter 1 (record ``ch1.gpu``): the f32 FMA peak of the CUDA cores, the bf16 peak of the
tensor cores, cuBLAS beside both, and the memory staircase (L2 and HBM read bandwidth over
working sets, a copy beside CuPy's). Chapter 2 (record ``ch2.gpu``): every rung of
:data:`smallem.cuda.GPU_LADDER` at one size, and the final kernels over sizes, each beside
cuBLAS measured in the same run.

GPU time is taken with CUDA events around each call (a host clock would time the launch,
not the kernel); samples are kept in a :class:`smallem.timing.Timing` like every other
measurement. Without a GPU, :func:`notebook_section` shows the last committed records and
:func:`report` writes tables that say nothing has been measured yet.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from .. import cuda, machine_info
from ..timing import Timing, quick_mode
from . import figures, records

CH1 = "ch1.gpu"
CH2 = "ch2.gpu"
RECORDS = (CH1, CH2)
NOT_MEASURED = "not measured on a GPU yet"
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


def machine() -> dict:
    return {**machine_info.fingerprint(), "gpu": cuda.device_info()}


# ---------------------------------------------------------------- chapter 1 probes

def fma_peak(iters: int) -> tuple[Timing, float]:
    """(timing, FLOP per call) of the f32 FMA probe filling every SM."""
    cp = cuda.require()
    sms = cuda.device_info()["sms"]
    blocks, threads = sms * 8, 256
    out = cp.empty(blocks * threads, dtype=cp.float32)
    k = cuda.kernel("probes", "fma_f32")
    t = gpu_measure(lambda: k((blocks,), (threads,),
                              (out, np.int32(iters), np.float32(0.999), np.float32(1e-3))))
    return t, 2.0 * 8 * 16 * iters * blocks * threads  # FMA_CHAINS=8, FMA_UNROLL=16


def mma_peak(iters: int) -> tuple[Timing, float]:
    """(timing, FLOP per call) of the bf16 tensor-core probe."""
    cp = cuda.require()
    sms = cuda.device_info()["sms"]
    blocks, threads = sms * 4, 256
    out = cp.empty(blocks * threads, dtype=cp.float32)
    k = cuda.kernel("probes", "mma_bf16")
    t = gpu_measure(lambda: k((blocks,), (threads,), (out, np.int32(iters), np.uint32(12345))))
    return t, 8192.0 * 4 * iters * blocks * threads / 32  # MMA_CHAINS=4, one mma = 8192 FLOP


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
        return {"quick": True, "fma_iters": 200, "mma_iters": 1000, "cublas_n": [512],
                "ws_bytes": [2**k for k in range(18, 27, 2)], "read_total_bytes": 64 * MiB,
                "copy_bytes": 64 * MiB}
    return {"quick": False, "fma_iters": 20000, "mma_iters": 100000, "cublas_n": [4096, 8192],
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
    say(f"peaks: f32 {figures.fmt(records.value(rec.data, 'fma_peak'), 'Gop/s')}, "
        f"bf16 {figures.fmt(records.value(rec.data, 'mma_peak'), 'Gop/s')}")
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
        from ..gemm import bf16_to_f32
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


# ---------------------------------------------------------------- reading the records

def _load(name: str, rec_dir=None) -> dict | None:
    try:
        return records.load(name, rec_dir)
    except records.RecordError:
        return None


def gpu_line(rec: dict) -> str:
    g = rec["machine"].get("gpu", {})
    cc = g.get("compute_capability", "?")
    return (f"{g.get('name', 'unknown GPU')} (compute capability {cc[:-1]}.{cc[-1:]}, "
            f"{g.get('sms', '?')} SMs), CuPy {g.get('cupy', '?')}; measured {rec['date'][:10]}, "
            f"commit {rec['commit']}")


def l2_plateau(rec: dict) -> tuple[float, float]:
    """(L2 read GB/s, HBM read GB/s): medians over sets well inside / far outside L2."""
    l2 = rec["machine"].get("gpu", {}).get("l2_bytes") or 50 * MiB
    pts = records.results(rec, "read")
    inside = [p["value"]["median"] for p in pts if 2 * MiB <= p["params"]["bytes"] <= l2 // 4]
    outside = [p["value"]["median"] for p in pts if p["params"]["bytes"] >= 8 * l2]
    inside = inside or [p["value"]["median"] for p in pts if p["params"]["bytes"] <= l2 // 2]
    med = lambda v: float(np.median(v)) if v else float("nan")
    return med(inside), med(outside)


def _best_cublas(rec: dict, dtype: str) -> float:
    vals = [r["value"]["median"] for r in records.results(rec, "cublas", dtype=dtype)]
    return max(vals) if vals else float("nan")


def peaks_rows(rec: dict | None) -> list[list]:
    if rec is None:
        return [[NOT_MEASURED, "-", "-", "-"]]
    f = figures.fmt
    fma, mma = records.value(rec, "fma_peak"), records.value(rec, "mma_peak")
    cb32, cb16 = _best_cublas(rec, "f32"), _best_cublas(rec, "bf16")
    ours, theirs = records.value(rec, "copy", impl="ours"), records.value(rec, "copy", impl="cupy")
    l2, hbm = l2_plateau(rec)
    pct = lambda a, b: f"{100 * a / b:.0f} %" if b == b and b else "-"
    return [
        ["f32 FMA, CUDA cores", f(fma, "Gop/s"), f"cuBLAS f32 {f(cb32, 'Gop/s')}", pct(cb32, fma)],
        ["bf16 wmma, tensor cores", f(mma, "Gop/s"), f"cuBLAS bf16 {f(cb16, 'Gop/s')}", pct(cb16, mma)],
        ["HBM copy (read + write)", f(ours, "GB/s"), f"CuPy copy {f(theirs, 'GB/s')}", pct(theirs, ours)],
        ["L2 read", f(l2, "GB/s"), "-", "-"],
        ["HBM read", f(hbm, "GB/s"), "-", "-"],
    ]


PEAKS_HEADER = ["what", "our probe", "reference, same run", "reference / probe"]
STAIR_HEADER = ["working set", "read GB/s"]
GEMM_HEADER = ["rung", "kernel", "inputs", "Gop/s", "% of cuBLAS (same inputs)",
               "max rel. error vs cuBLAS", "vs float64"]


def stair_rows(rec: dict | None) -> list[list]:
    if rec is None:
        return [[NOT_MEASURED, "-"]]
    return [[_bytes(p["params"]["bytes"]), figures.fmt(p["value"]["median"])]
            for p in records.results(rec, "read")]


def _bytes(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def gemm_rows(rec: dict | None) -> list[list]:
    if rec is None:
        return [[NOT_MEASURED, "-", "-", "-", "-", "-", "-"]]
    n = rec["settings"]["ladder_n"]
    rows = []
    for r in records.results(rec, "gemm"):
        p = r["params"]
        ref = records.value(rec, "cublas", dtype=p["dtype"], n=n)
        rows.append([p["number"], p["rung"], p["dtype"], figures.fmt(r["value"]["median"]),
                     f"{100 * r['value']['median'] / ref:.0f} %", f"{p['max_rel_err']:.1e}",
                     f"{p['max_rel_err_f64']:.1e}"])
    for dt in ("f32", "bf16"):
        rows.append(["-", f"cuBLAS ({'cupy.matmul' if dt == 'f32' else 'cublasGemmEx'})", dt,
                     figures.fmt(records.value(rec, "cublas", dtype=dt, n=n)), "100 %", "-", "-"])
    return rows


# ---------------------------------------------------------------- figures and tables

def _placeholder(name: str, title: str):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 1.6))
    ax.axis("off")
    ax.text(0.5, 0.5, f"{title}: {NOT_MEASURED}", ha="center", va="center", fontsize=11)
    figures.save(fig, name)


def staircase_figure(rec: dict, name: str = "gpu_staircase"):
    import matplotlib.pyplot as plt
    pts = records.results(rec, "read")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([p["params"]["bytes"] for p in pts], [p["value"]["median"] for p in pts], marker=".",
            label="read (ld.global.cg)")
    l2 = rec["machine"]["gpu"].get("l2_bytes")
    if l2:
        ax.axvline(l2, color="grey", ls=":", lw=1)
        ax.text(l2, 0.98, " L2", fontsize=8, color="grey", transform=ax.get_xaxis_transform(),
                va="top")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("working set (bytes)")
    ax.set_ylabel("GB/s")
    ax.set_title(f"GPU memory staircase: {rec['machine']['gpu']['name']}", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    figures.save(fig, name)


def roofline_figure(rec: dict, cpu_rec: dict | None, name: str = "gpu_roofline"):
    """The GPU's measured roofs, with the CPU's (chapter 1 record) beside them if present."""
    import matplotlib.pyplot as plt
    x = np.logspace(-2, 4, 400)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    fma, mma = records.value(rec, "fma_peak"), records.value(rec, "mma_peak")
    l2, hbm = l2_plateau(rec)
    gname = rec["machine"]["gpu"]["name"]
    for bw, label, color in ((hbm, "HBM", "#e76f51"), (l2, "L2", "#8ab17d")):
        if bw == bw:
            ax.plot(x, np.minimum(bw * x, mma), color=color, lw=1.6,
                    label=f"{gname} {label} {figures.fmt(bw, 'GB/s')}")
    ax.axhline(mma, color="#264653", ls="--", lw=1.2,
               label=f"{gname} bf16 tensor cores {figures.fmt(mma, 'Gop/s')}")
    ax.axhline(fma, color="#264653", lw=1.2, label=f"{gname} f32 {figures.fmt(fma, 'Gop/s')}")
    if cpu_rec is not None:
        try:
            from . import ch1 as cpu
            sm = cpu.summary(cpu_rec)
            cores = sm["cores"]
            f32 = sm["peak"][("f32", cores)]
            dram = sm["triad_plateaus"][cores]["DRAM"]
            ax.plot(x, np.minimum(dram * x, f32), color="#6c757d", lw=1.4,
                    label=f"CPU DRAM {figures.fmt(dram, 'GB/s')}, f32 {figures.fmt(f32, 'Gop/s')}")
        except Exception as e:  # a CPU record of another shape must not break the GPU figure
            print(f"gpu roofline: CPU roof left out ({type(e).__name__}: {e})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (operations per byte)")
    ax.set_ylabel("Gop/s")
    ax.set_title("Roofline: the GPU beside the CPU (measured ceilings)", fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="lower right")
    figures.save(fig, name)


def gemm_figure(rec: dict, name: str = "gpu_gemm"):
    import matplotlib.pyplot as plt
    n = rec["settings"]["ladder_n"]
    rows = records.results(rec, "gemm")
    labels = [f"{r['params']['number']} {r['params']['rung']}" for r in rows]
    vals = [r["value"]["median"] for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    ax.bar(labels, vals, color=["#2a9d8f" if r["params"]["dtype"] == "f32" else "#e76f51"
                                for r in rows])
    for dt, ls in (("f32", "-"), ("bf16", "--")):
        ax.axhline(records.value(rec, "cublas", dtype=dt, n=n), color="black", ls=ls, lw=1,
                   label=f"cuBLAS {dt}")
    ax.set_yscale("log")
    ax.set_ylabel("Gop/s")
    ax.set_title(f"The GPU ladder at {n}³ on {rec['machine']['gpu']['name']}", fontsize=10)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)
    figures.save(fig, name)


def report(rec_dir) -> dict:
    ch1, ch2 = _load(CH1, rec_dir), _load(CH2, rec_dir)
    note1 = f"Measured on {gpu_line(ch1)}." if ch1 else ""
    note2 = (f"Measured on {gpu_line(ch2)}. Errors are the largest difference from the "
             f"reference over the largest reference magnitude; against float64, on "
             f"{CHECK_ROWS} rows computed on the host from the same inputs. An error of 0 "
             f"against cuBLAS means the same bits: where it does not split K, cuBLAS sums "
             f"each element's products in k order with FMAs, as these kernels do."
             if ch2 else "")
    figures.write_table("gpu_peaks", peaks_rows(ch1), PEAKS_HEADER, note1)
    figures.write_table("gpu_staircase", stair_rows(ch1), STAIR_HEADER, note1)
    figures.write_table("gpu_gemm", gemm_rows(ch2), GEMM_HEADER, note2)
    if ch1:
        staircase_figure(ch1)
        roofline_figure(ch1, _load("ch1.machine", rec_dir))
    else:
        _placeholder("gpu_staircase", "GPU memory staircase")
        _placeholder("gpu_roofline", "GPU roofline")
    if ch2:
        gemm_figure(ch2)
    else:
        _placeholder("gpu_gemm", "GPU GEMM ladder")
    return {"gpu.ch1_line": gpu_line(ch1) if ch1 else NOT_MEASURED,
            "gpu.ch2_line": gpu_line(ch2) if ch2 else NOT_MEASURED}


# ---------------------------------------------------------------- notebooks

def _markdown(rows: list[list], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _show(text: str):
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
        if get_ipython() is not None:
            display(Markdown(text))
            return
    except ImportError:
        pass
    print(text)


def _show_svg(name: str):
    try:
        from IPython import get_ipython
        from IPython.display import SVG, display
        if get_ipython() is not None:
            display(SVG(filename=str(figures.figures_dir() / f"{name}.svg")))
    except ImportError:
        pass


def notebook_section(chapter: str, quick: bool | None = None):
    """The GPU part of a chapter's notebook: measure if there is a GPU, else show the records.

    With a GPU: in quick mode measure tiny sizes; otherwise reuse this GPU's record if one
    exists, else measure and save it. Without one: one line saying why, then the last
    committed records with their machine and date, or a line saying there are none yet.
    Returns the record shown (a dict) or None.
    """
    if chapter not in ("ch1", "ch2"):
        raise ValueError(f"chapter must be 'ch1' or 'ch2', got {chapter!r}")
    quick = quick_mode() if quick is None else quick
    name = CH1 if chapter == "ch1" else CH2
    reason = cuda.why_unavailable()
    rec = _load(name)
    if reason is None:
        here = cuda.device_info()["name"]
        if quick or rec is None or rec["machine"].get("gpu", {}).get("name") != here:
            run = run_ch1 if chapter == "ch1" else run_ch2
            r = run(quick=quick, progress=False)
            r.save()
            rec = r.data
    else:
        print(f"No GPU in this run ({reason}).")
        if rec is None:
            print(f"No GPU measurements have been recorded yet ({name}): {NOT_MEASURED}.")
            return None
        print(f"Showing the last recorded GPU measurements: {gpu_line(rec)}.")
    if chapter == "ch1":
        _show(_markdown(peaks_rows(rec), PEAKS_HEADER))
        _show(_markdown(stair_rows(rec), STAIR_HEADER))
        staircase_figure(rec)
        roofline_figure(rec, _load("ch1.machine"))
        _show_svg("gpu_staircase")
        _show_svg("gpu_roofline")
    else:
        _show(_markdown(gemm_rows(rec), GEMM_HEADER))
        gemm_figure(rec)
        _show_svg("gpu_gemm")
    if reason is None:
        print(f"Measured just now on {gpu_line(rec)}.")
    return rec


# ---------------------------------------------------------------- command line

def add_gpu_check_arguments(p):
    p.add_argument("--out", required=True, help="folder for the records (ch1.gpu.json, ch2.gpu.json)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds not minutes")
    p.add_argument("--only", choices=["ch1", "ch2"], help="measure one chapter only")


def cmd_gpu_check(args) -> int:
    reason = cuda.why_unavailable()
    if reason:
        print(f"smallem gpu-check: no GPU: {reason}")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quick = args.quick or quick_mode()
    print(f"GPU: {cuda.device_info()}")
    t0 = time.perf_counter()
    for name in cuda.kernel_names():  # compile first: a compiler error should stop us early
        cuda.module(name)
    print(f"compiled {', '.join(cuda.kernel_names())} in {time.perf_counter() - t0:.1f} s")
    recs = {}
    for chapter, run in (("ch1", run_ch1), ("ch2", run_ch2)):
        if args.only and args.only != chapter:
            continue
        t0 = time.perf_counter()
        rec = run(quick=quick)
        print(f"{chapter}: wrote {rec.save(out)} in {time.perf_counter() - t0:.0f} s")
        recs[chapter] = rec.data
    text = []
    if "ch1" in recs:
        text += ["## GPU peaks", _markdown(peaks_rows(recs["ch1"]), PEAKS_HEADER), "",
                 "## GPU staircase", _markdown(stair_rows(recs["ch1"]), STAIR_HEADER), ""]
    if "ch2" in recs:
        text += ["## GPU GEMM ladder", _markdown(gemm_rows(recs["ch2"]), GEMM_HEADER), ""]
    (out / "gpu_tables.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = {"gpu-check": (cmd_gpu_check, add_gpu_check_arguments,
                          "chapters 1-2 on the GPU: measure, write records to --out")}
MEASURE = None  # needs a GPU: `smallem gpu-check` runs on a lent machine (gpu_check.sh)  # the command `make book` runs
