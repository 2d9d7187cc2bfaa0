"""Chapter 1's measurement: the clock, the peaks, the memory staircase, numpy's copy and the
naive product, into one record, ``ch1.machine`` (:func:`run`)."""

from __future__ import annotations

import math

import numpy as np

from smallem.plumbing import build
from smallem.cpu import isa, machine, machine_info
from smallem.product.gemm import LADDER
from smallem.cpu.machine import (MUL_LATENCY, STREAM_KERNELS, GiB, KiB, MiB, Stream, amx_kinds,
                        measure_clock, measure_peak, measure_stream_point, native, peak_theory,
                        settle)
from smallem.cpu.timing import measure, quick_mode
from .. import records

RECORD = "ch1.machine"
RECORDS = (RECORD,)

PEAK_KINDS = ("f32", "bf16", "int8")
AMX_KINDS = ("amx_bf16", "amx_int8")  # measured where the CPU has AMX
DOT_INSTRUCTION = {"bf16": "vdpbf16ps", "int8": "vpdpbusd",
                   "amx_bf16": "tdpbf16ps", "amx_int8": "tdpbssd"}
# what the dot probes time where the CPU lacks the instruction (kernels_c/probes.c's fallbacks)
DOT_FALLBACK = {"bf16": "widened to f32, FMAs", "int8": "vpmaddubsw, vpmaddwd, vpaddd"}
CLOCK_AGREEMENT = 0.10  # the two clocks, and the clock the f32 probe implies, agree this well
SCALING_FLOOR = 0.75  # all cores below this share of cores x one core: somebody else was running
ONE_THREAD_FLOOR = 0.85  # one thread below this share of all cores' rate per core: disturbed
# the all-core f32 probe against the theoretical peak on every captured machine (the tests)
THEORY_BAND = (0.85, 1.05)


def poorly_scaled(peaks: dict, cores: int, kinds=PEAK_KINDS, physical: int | None = None) -> list[str]:
    """The probes whose all-thread rate fell below SCALING_FLOOR x physical cores x their
    one-thread rate.

    Each probe keeps its data in registers, so its cores share nothing: a shortfall means
    another process (or a hypervisor's neighbour) took some of the cores during the run.
    SMT siblings share one core's pipes, so ``cores`` threads on ``physical`` cores can
    scale only to the physical count (default: every thread its own core).
    """
    scale = min(cores, physical or cores)
    if scale == 1:
        return []
    return [k for k in kinds if (k, 1) in peaks and (k, cores) in peaks
            and records.median(peaks[k, cores])
            < SCALING_FLOOR * scale * records.median(peaks[k, 1])]


def slow_one_thread(peaks: dict, cores: int, kinds=PEAK_KINDS,
                    physical: int | None = None) -> list[str]:
    """The probes whose one-thread rate fell below ONE_THREAD_FLOOR x their all-thread rate
    per physical core.

    One thread has a core to itself and, on a machine that boosts, a clock at least as high
    as with every core busy, so it should reach at least a core's share of the all-core
    rate: a shortfall means something else (a compiler, a neighbour) ran on its core.
    """
    scale = min(cores, physical or cores)
    if scale == 1:
        return []
    return [k for k in kinds if (k, 1) in peaks and (k, cores) in peaks
            and records.median(peaks[k, 1])
            < ONE_THREAD_FLOOR * records.median(peaks[k, cores]) / scale]


def measure_peaks(thread_counts: list[int], measure_one=None, retries: int = 2,
                  pause: float = 2.0, kinds=PEAK_KINDS,
                  physical: int | None = None) -> tuple[dict, list[str]]:
    """Every probe on every thread count, remeasured while the cores do not scale, and a
    one-thread probe slower than its share of all cores (:func:`slow_one_thread`) measured
    once more.

    Returns ``{(kind, threads): measurement}`` and the warnings left after ``retries``.
    """
    measure_one = measure_one or measure_peak
    cores = max(thread_counts)
    peaks = {(kind, th): measure_one(kind, th)
             for th in thread_counts for kind in kinds}  # one thread first: see settle()
    for _ in range(retries):
        busy = poorly_scaled(peaks, cores, kinds, physical)
        if not busy:
            break
        settle(pause)
        for kind in busy:
            peaks[kind, 1] = measure_one(kind, 1)
        for kind in busy:
            peaks[kind, cores] = measure_one(kind, cores)
    slow = slow_one_thread(peaks, cores, kinds, physical)
    if slow:
        settle(pause)
        for kind in slow:
            peaks[kind, 1] = measure_one(kind, 1)
    scale = min(cores, physical or cores)

    def ratio(kind):
        return records.median(peaks[kind, cores]) / records.median(peaks[kind, 1])

    warnings = [
        f"{kind} peak: {cores} threads reached only {ratio(kind):.2f}x one thread's rate "
        f"(expected close to {scale}x): another process was probably using the cores; "
        f"measure again on a quiet machine"
        for kind in poorly_scaled(peaks, cores, kinds, physical)]
    warnings += [
        f"{kind} peak: one thread reached only {scale / ratio(kind):.2f} of the {cores} "
        f"threads' rate per core, measured twice: something else was probably running on "
        f"its core; measure again on a quiet machine"
        for kind in slow_one_thread(peaks, cores, kinds, physical)]
    return peaks, warnings


def _feeds_checked(rec, level: str, cores: int, tries: int = 3) -> dict:
    """:func:`machine.feeds`, measured again while its L3 rate per core is below half of what
    this run's own triad gave on all cores at the nearest working set (up to ``tries``): one
    disturbed reading there would decide chapter 2's loop order for every process."""
    for i in range(tries):
        fd = machine.feeds(level, refresh=True)
        pts = records.results(rec.data, "stream", kernel="triad", threads=cores)
        if not pts:
            return fd
        near = min(pts, key=lambda r: abs(math.log(r["params"]["bytes"] / fd["working_set"])))
        if fd["l3_gbs_core"] >= 0.5 * records.median(near) / cores:
            return fd
        settle()
    rec.warn(f"the GEMM's model's L3 reading stayed below half of this run's triad "
             f"({fd['l3_gbs_core']:.3g} GB/s a core) in {tries} tries")
    return fd


def stream_sizes(quick: bool, caches: dict | None = None, memory: int | None = None) -> list[int]:
    """Working sets, in bytes, by factors of 2 from 4 KiB (well inside any L1, so that a thread
    has a few KiB even with several) to 1 GiB, or further: to at least 4 x the L3 (the plateau
    past a cache starts some way beyond its size), as long as the three arrays fit in a quarter
    of the memory. Quick: 4 KiB to 64 MiB."""
    caches = caches or machine_info.caches()
    memory = machine_info.memory_bytes() if memory is None else memory
    want = 64 * MiB if quick else max(GiB, 4 * caches["L3_bytes"] * caches["L3_instances"])
    room = memory / 4 / 2 if memory and not quick else math.inf  # Stream's arrays: 2 x
    sizes = [4 * KiB]
    while sizes[-1] < want and (2 * sizes[-1] <= room or sizes[-1] < 64 * MiB):
        sizes.append(2 * sizes[-1])
    return sizes


def measure_numpy_copy(ws_bytes: int, repeats: int = 5) -> dict:
    """numpy's copy of one array into another: the peer for the DRAM plateau."""
    n = ws_bytes // 16
    src = np.ones(n)
    dst = np.zeros(n)
    t = measure(lambda: np.copyto(dst, src), repeats=repeats)
    return {"value": t.rate(16.0 * n / 1e9), "seconds": t.stats()}


# ---------------------------------------------------------------- the naive product

def measure_naive_gemm(n: int, repeats: int = 3) -> dict:
    """Chapter 2's rung 0 on one thread: the starting point of the climb."""
    naive = LADDER["naive"]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)
    t = measure(lambda: naive(a, b, c, threads=1), repeats=repeats, warmup=0, max_time=30)
    return {"value": t.rate(2.0 * n**3 / 1e9), "seconds": t.stats()}


# ---------------------------------------------------------------- the whole chapter

def theory(data: dict, clock: dict, clock_mul: dict, physical: int, level: str) -> dict:
    """The theoretical f32 peak of this run (:func:`smallem.cpu.machine.peak_theory`), every factor
    measured: the pipes belong to physical cores (SMT siblings share them), and this CPU's
    identity gives the table of vendors' manuals beside it, as a cross-check."""
    cores = max(data["settings"]["threads"])
    f32 = [records.value(data, "peak", kind="f32", threads=th) * 1e9 for th in (1, cores)]
    return peak_theory(clock["median"], clock_mul["median"], *f32, physical, level,
                       machine_info.cpu_identity())


def run(quick: bool | None = None, progress: bool = True) -> records.Record:
    """Measure everything chapter 1 shows; returns the (unsaved) record."""
    from tqdm import tqdm

    quick = quick_mode() if quick is None else quick
    cores = machine_info.usable_cores()
    thread_counts = sorted({1, cores})
    level = isa.selected()
    sizes = stream_sizes(quick)
    gemm_n = 256 if quick else 1024
    rec = records.Record(RECORD, settings={
        "quick": quick, "threads": thread_counts, "isa": level, "gemm_naive_n": gemm_n,
        "stream_sizes": sizes, "compiler": build.compiler_version(build.compiler()),
        "cflags": build.BASE_FLAGS + build.tuning_flags(build.compiler())
        + isa.compile_flags(level, isa.extensions(level))})

    steps = 1 + (len(PEAK_KINDS) + len(amx_kinds(level))) * len(thread_counts) + len(sizes) * len(STREAM_KERNELS) * len(thread_counts) + 2
    bar = tqdm(total=steps, desc="chapter 1", disable=not progress, unit="probe")

    clock = measure_clock()
    rec.add("clock", "GHz", {k: (v / 1e9 if k != "n" else v) for k, v in clock.items()},
            chain="add")
    clock_mul = measure_clock(chain="mul")
    rec.add("clock_mul", "GHz", {k: (v / 1e9 if k != "n" else v) for k, v in clock_mul.items()},
            chain="mul", latency=MUL_LATENCY)
    if abs(clock_mul["median"] / clock["median"] - 1) > CLOCK_AGREEMENT:
        rec.warn(f"the add chain measured {clock['median'] / 1e9:.2f} GHz and the multiply "
                 f"chain {clock_mul['median'] / 1e9:.2f} GHz: one of them does not take the "
                 f"cycles it is supposed to on this core")
    bar.update()
    counted = set()

    def peak_with_progress(kind, th):
        bar.set_postfix_str(f"{kind} peak, {th} thread(s)")
        if (kind, th) not in counted:  # a second measurement is not a new step
            counted.add((kind, th))
            bar.update()
        return measure_peak(kind, th)

    kinds = PEAK_KINDS + amx_kinds(level)
    physical = min(cores, machine_info.physical_cores())
    rec.data["settings"]["physical_cores"] = physical
    peaks, warnings = measure_peaks(thread_counts, peak_with_progress, pause=0.2 if quick else 2.0,
                                    kinds=kinds, physical=physical)
    for (kind, th), r in peaks.items():
        rec.add("peak", "Gop/s", r["value"], seconds=r["seconds"], kind=kind, threads=th,
                native=native(kind), **({"chains": r["chains"]} if "chains" in r else {}))
    for w in warnings:
        rec.warn(w)

    stream = Stream(max(sizes), cores)
    settle()
    for th in thread_counts:
        for kernel in STREAM_KERNELS:
            for ws in sizes:
                bar.set_postfix_str(f"{kernel} {ws // KiB} KiB, {th} thread(s)")
                r = measure_stream_point(stream, kernel, ws, th)
                rec.add("stream", "GB/s", r["value"], seconds=r["seconds"], kernel=kernel,
                        threads=th, bytes=ws, reps=r["reps"])
                bar.update()
    del stream

    settle()
    r = measure_numpy_copy(max(sizes))
    rec.add("numpy_copy", "GB/s", r["value"], seconds=r["seconds"], bytes=max(sizes), threads=1)
    bar.update()
    bar.set_postfix_str(f"naive {gemm_n}^3 product")
    r = measure_naive_gemm(gemm_n)
    rec.add("gemm_naive", "Gop/s", r["value"], seconds=r["seconds"], M=gemm_n, N=gemm_n, K=gemm_n,
            threads=1)
    bar.update()
    bar.close()

    rec.data["settings"]["theory"] = theory(rec.data, clock, clock_mul, physical, level)
    if not quick:  # the GEMM's choices are made from this quiet run, not from an older cache
        rec.data["settings"]["feeds"] = _feeds_checked(rec, level, cores)
        machine.forget_kept()  # and the decoders' thresholds and paths measured again, quietly
    return rec
