"""Chapter 2's measurement: the ladder, the block-size sweeps, the size sweep, the model's
products and their phases, all of B at once, the micro-kernel alone, bf16 and the thread pool,
each against its peer timed in turn (:func:`smallem.book.compare.paired`), into one record."""

from __future__ import annotations

import math
import os

import numpy as np

from smallem import checks
from smallem.cpu import isa
from smallem.product.gemm import (AMX_KB, LADDER, ORDERS, PHASES, kernels, amx_alone, amx_bf16,
                     amx_blocks, amx_epilogue, equal_slices, bf16_path, bf16_paths, empty_aligned,
                     cache_geometry, default_blocks, default_order, f32_to_bf16, feeds,
                     kernel_alone, l2_ways_for_a, ladder_blocks, loop_order, matmul, matmul_bf16,
                     native_bf16, order_blocks, phase_times, pool_ids)
from smallem.cpu.machine import measure_peak, peak_probe
from smallem.cpu.timing import Timing, measure, measure_interleaved, quick_mode
from .. import ch1, compare, records

RECORD = "ch2.gemm"
BF16_RECORD = "ch2.bf16"  # the f32/bf16 part alone, from a second CPU (`smallem gemm-bf16`)



def _measure_gops(fn, m, n, k, quick=False):
    """One slow function alone (the first rungs take seconds a call): two samples."""
    t = measure(fn, repeats=3 if quick else 2, warmup=1 if quick else 0)
    return {"value": t.rate(2.0 * m * n * k / 1e9), "seconds": t.stats()}



def _measure_whole_b(rec, lib, shapes, blocks, cores, quick, rng):
    """The package's GEMM with all of B packed first against one K slice at a time, on the first of
    the model's products where all of B fits (`gemm_b_whole`). ``nc = N`` keeps the
    same single block of columns but takes the slice-by-slice path: the two differ in
    that alone. "whole_b" results, ``b`` = "whole" or "slices"."""
    for sh in shapes:
        M, K, N = sh["M"], sh["K"], sh["N"]
        if not sh["ta"] and not sh["tb"] and lib.gemm_b_whole(N, K, blocks["kc"], blocks["nc"]):
            break
    else:
        return  # none fits (a quick run's shapes have one K slice): nothing to compare
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.empty((M, N), np.float32)
    res = compare.paired({"whole": lambda: matmul(a, b, out=c, blocks=blocks),
                    "slices": lambda: matmul(a, b, out=c, blocks={**blocks, "nc": N})},
                   M, N, K, quick=quick, pause=0.0)
    for way, r in res.items():
        rec.add("whole_b", "Gop/s", r["value"], seconds=r["seconds"], b=way, label=sh["label"],
                M=M, N=N, K=K, kc=blocks["kc"], threads=cores)



def _measure_orders(rec, cores, quick, rng):
    """The package's GEMM at 2048³ in both orders of the tiles, each with the model's blocks
    for it, timed in turn: "order" results."""
    n = 128 if quick else 2048
    a, b, c = _square(n, rng)
    res = compare.paired({o: (lambda o=o: matmul(a, b, out=c, blocks={"order": o}))
                          for o in ORDERS}, n, n, n, quick=quick)
    for order, r in res.items():
        rec.add("order", "Gop/s", r["value"], seconds=r["seconds"], order=order, n=n,
                threads=cores)



def _measure_phases(rec, a, b, c, params, quick):
    """Where the final GEMM's time goes on one product: "phase" results in ms per call,
    each phase of :data:`PHASES` as the mean over the threads, and "wall" (the call)."""
    calls = [phase_times(a, b, trans_a=params["trans_a"], trans_b=params["trans_b"], out=c)
             for _ in range(2 if quick else 7)]
    per = {p: [1e3 * sum(t[p] for t in r["threads"]) / len(r["threads"]) for r in calls]
           for p in PHASES}
    per["wall"] = [1e3 * r["wall"] for r in calls]
    for phase, ms in per.items():
        rec.add("phase", "ms", Timing(ms).stats(), phase=phase,
                **{**params, "threads": len(calls[-1]["threads"])})



def alone_slivers(kc: int, nr: int, geometry: dict | None = None,
                  reach: int | None = None) -> dict:
    """How many B slivers (kc x NR floats each) :func:`_measure_alone` gives each case:
    half an L2, which stays there, and for L3 a quarter of it, but at least four L2s (so
    that it cannot stay in one) and at most half the L3, and at most half of what the caches
    were measured to hold (``reach``: :func:`smallem.cpu.machine.cache_reach`; a virtual
    machine reports the whole socket's L3, of which a process gets a part)."""
    g = geometry or cache_geometry()
    sliver = kc * nr * 4
    l2, l3 = g["L2"]["bytes"], g["L3"]["bytes"]
    top = l3 // 2 if not reach else min(l3, reach) // 2
    return {"L2": max(1, l2 // 2 // sliver),
            "L3": max(2, min(top, max(l3 // 4, 4 * l2)) // sliver)}



def _measure_alone(rec, level, cores, quick):
    """The micro-kernel alone (:func:`kernel_alone`, rung 5's KC) with its B slivers in L2
    and in L3, on one core and on all: on all cores, from L3, either one block every thread
    reads (rung 5's way) or a block per thread. Each thread count is timed in turn with
    chapter 1's FMA probe on as many threads: "alone" and "alone_probe" results."""
    _, _, mr, nr, blocks, *_ = kernels(level)
    kc = blocks[1]
    slivers = alone_slivers(kc, nr, reach=feeds(level)["reach_bytes"])
    gop_per_thread = 0.05 if quick else 10.0  # a call of ~40 ms at 250 Gop/s a core
    for th in sorted({1, cores}):
        fns, work, cases = {}, {}, {}
        fns["probe"], work["probe"] = peak_probe("f32", th)
        for where, shared in [("L2", True), ("L3", True)] + ([("L3", False)] if th > 1 else []):
            key = f"{where} {'shared' if shared else 'own'}"
            per_pass = 2.0 * mr * nr * kc * slivers[where] / 1e9
            reps = max(1, math.ceil(gop_per_thread / per_pass))
            fns[key], work[key], _ = kernel_alone(kc, slivers[where], reps, th, shared, level)
            cases[key] = dict(b_in=where, shared_b=shared, slivers=slivers[where], kc=kc,
                              b_kib=slivers[where] * kc * nr * 4 / 1024, reps=reps)
        res = compare.paired(fns, 1, 1, 1, quick=quick, pause=0.0, work=work)
        rec.add("alone_probe", "Gop/s", res["probe"]["value"], seconds=res["probe"]["seconds"],
                kind="f32", threads=th)
        for key, params in cases.items():
            rec.add("alone", "Gop/s", res[key]["value"], seconds=res[key]["seconds"], **params,
                    threads=th)



def _square(n, rng):
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return a, b, np.empty((n, n), np.float32)



def model_shapes() -> list[dict]:
    """A GPT-2-small layer's feed-forward products at 8 x 1024 tokens (d=768, 4d=3072)."""
    T, d, f = 8192, 768, 3072
    return [
        {"label": "x W1 (8192x768 · 768x3072)", "M": T, "K": d, "N": f, "ta": False, "tb": False},
        {"label": "h W2 (8192x3072 · 3072x768)", "M": T, "K": f, "N": d, "ta": False, "tb": False},
        {"label": "dY W1ᵀ (8192x3072 · (768x3072)ᵀ)", "M": T, "K": f, "N": d,
         "ta": False, "tb": True},
        {"label": "xᵀ dY ((8192x768)ᵀ · 8192x3072)", "M": d, "K": T, "N": f,
         "ta": True, "tb": False},
    ]



def _measure_dtypes(rec, sizes, cores, quick, rng, step=lambda what: None):
    """f32 against bf16 inputs on each bf16 path this build has, same shapes and threads,
    timed in turn: "dtype" results (``path`` is one of BF16_PATHS for bf16)."""
    paths = bf16_paths()
    for M, K, N in sizes:
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        c = empty_aligned((M, N))  # on a line, as the package makes C: the AMX path streams it
        ha, hb = f32_to_bf16(a), f32_to_bf16(b)
        fns = {"f32": lambda: matmul(a, b, out=c)}
        for p in paths:
            fns[p] = lambda p=p: matmul_bf16(ha, hb, out=c, path=p)
        res = compare.paired(fns, M, N, K, quick=quick, pause=0.0)
        for kind, r in res.items():
            extra = {"dtype": "f32"} if kind == "f32" else {"dtype": "bf16", "path": kind}
            rec.add("dtype", "Gop/s", r["value"], seconds=r["seconds"], **extra, M=M, N=N, K=K,
                    threads=cores)
        step(f"f32, bf16 {M}x{K}x{N}")



# --8<-- [start:amx_rungs]
def amx_rungs(level: str | None = None) -> list[dict]:
    """The AMX ladder (chapter 2): each rung's blocks and how it writes C. 1: the tiles with
    the f32 model's blocks (the first AMX path); 2: the AMX path's own blocks (A's panel in
    the L1, B's block in half the L2: one K slice at K = 768 on a 48 KiB L1); 3: C's last
    slice streamed to memory, not read first."""
    f, a = default_blocks(level), amx_blocks()
    return [{"rung": 1, "step": "tiles", "kc": f["kc"], "nc": f["nc"], "epilogue": "vector"},
            {"rung": 2, "step": "AMX blocks", **a, "epilogue": "vector"},
            {"rung": 3, "step": "streamed C", **a, "epilogue": "stream"}]
# --8<-- [end:amx_rungs]


def _measure_amx_ladder(rec, cores, quick, rng, shape) -> None:
    """The AMX ladder's rungs at the first model product, and chapter 1's AMX bf16 probe on
    every core, in the same rounds ("amx_rung" results, one "amx_probe"): the probe's rate
    moves with the host (another guest's tiles on the core's sibling), so the share of it
    a rung reaches is taken round by round."""
    if "amx" not in bf16_paths():
        return
    M, K, N = shape["M"], shape["K"], shape["N"]
    ha = f32_to_bf16(rng.standard_normal((M, K), dtype=np.float32))
    hb = f32_to_bf16(rng.standard_normal((K, N), dtype=np.float32))
    c = empty_aligned((M, N))
    rungs = amx_rungs()
    fns = {r["step"]: (lambda r=r: matmul_bf16(ha, hb, out=c, path="amx", epilogue=r["epilogue"],
                                               blocks={"kc": r["kc"], "nc": r["nc"]}))
           for r in rungs}
    run_probe, gop = peak_probe("amx_bf16", cores)
    fns["probe"] = run_probe
    # the last rung's blocks with no packing and no C: its A panel and B block as the product
    # cuts them (K and N in equal slices), B in the L2
    kp = -(-equal_slices(K, rungs[-1]["kc"]) // AMX_KB) * AMX_KB
    panels = -(-equal_slices(N, rungs[-1]["nc"]) // 32)
    run_alone, gop_alone, _ = amx_alone(kp, panels, reps=2 if quick else 400, threads=cores)
    fns["alone"] = run_alone
    res = compare.paired(fns, M, N, K, quick=quick, pause=0.0,
                         work={"probe": gop, "alone": gop_alone})
    for r in rungs:
        got = res[r["step"]]
        rec.add("amx_rung", "Gop/s", got["value"], seconds=got["seconds"], rung=r["rung"],
                step=r["step"], kc=r["kc"], nc=r["nc"], epilogue=r["epilogue"], M=M, N=N, K=K,
                threads=cores)
    rec.add("amx_probe", "Gop/s", res["probe"]["value"], seconds=res["probe"]["seconds"],
            threads=cores)
    rec.add("amx_alone", "Gop/s", res["alone"]["value"], seconds=res["alone"]["seconds"],
            kp=kp, panels=panels, threads=cores)
    rec.data["settings"]["amx_epilogue"] = amx_epilogue(M, N, feeds()["reach_bytes"])


def run_bf16(quick: bool | None = None) -> records.Record:
    """Only the f32-against-bf16 products of :func:`run`, plus 2048³, and chapter 1's f32
    and bf16 probes on every core beside them: about a minute.

    For a second machine whose CPU has AVX512_BF16 when the book's own has not (the GPU
    check runs it on its host); chapter 2 shows this record beside its own bf16 table.
    """
    quick = quick_mode() if quick is None else quick
    cores = checks.threads(None)
    level = isa.selected()
    first = model_shapes()[0]
    sizes = ([(128, 128, 128), (first["M"] // 16, first["K"] // 16, first["N"] // 16)] if quick
             else [(1024, 1024, 1024), (2048, 2048, 2048), (first["M"], first["K"], first["N"])])
    rec = records.Record(BF16_RECORD, settings={
        "quick": quick, "threads": cores, "isa": level, "native_bf16": native_bf16(level),
        "amx_bf16": amx_bf16(level), "bf16_path": bf16_path(level),
        "blocks": default_blocks(level), "sizes": sizes})
    for kind in ("f32", "bf16"):
        m = measure_peak(kind, cores, repeats=3 if quick else 5)
        rec.add("peak", "Gop/s", m["value"], seconds=m["seconds"], kind=kind, threads=cores)
    _measure_dtypes(rec, sizes, cores, quick, np.random.default_rng(0))
    return rec



def _new_record(quick, cores, level, mr, nr, blocks, ladder, n_ladder, sweep) -> records.Record:
    return records.Record(RECORD, settings={
        "quick": quick, "threads": cores, "isa": level, "mr": mr, "nr": nr,
        "blocks": blocks, "blocks_ladder": ladder, "blocks_rows": order_blocks("rows", level),
        "cache_geometry": cache_geometry(), "n_ladder": n_ladder, "sweep": sweep,
        "blas": compare.blas_info(), "native_bf16": native_bf16(level), "amx_bf16": amx_bf16(level),
        "bf16_path": bf16_path(level), "order": default_order(level), "feeds": feeds(level),
        "blocks_reach": feeds(level)["reach_bytes"],
        "amx_blocks": amx_blocks(),
        "order_why": loop_order(mr, nr, feeds(level), threads=cores)[1],
        "order_model": kernels(level).order_model, "order_timed": kernels(level).order_timed,
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                               "OMP_NUM_THREADS", "SMALLEM_THREADS",
                                               "SMALLEM_GEMM_ORDER", "SMALLEM_BF16")}})


def _measure_peak(rec, cores, quick) -> None:
    peaks, warnings = ch1.measure_peaks(sorted({1, cores}), kinds=("f32",),
                                        pause=0.2 if quick else 2.0)
    peak = peaks["f32", cores]
    rec.add("peak_f32", "Gop/s", peak["value"], seconds=peak["seconds"], threads=cores)
    for w in warnings:
        rec.warn(w)


def _measure_ladder(rec, n, cores, quick, rng, step) -> None:
    """The slow rungs timed alone at one size; the fast ones in turn with numpy at their
    thread count (and, on one core, the final GEMM against OpenBLAS's)."""
    a, b, c = _square(n, rng)
    for rung in LADDER:
        if rung.slow:
            r = _measure_gops(lambda: rung(a, b, c, threads=1), n, n, n, quick=quick)
            rec.add("rung", "Gop/s", r["value"], seconds=r["seconds"], rung=rung.index,
                    kernel=rung.name, M=n, N=n, K=n, threads=1)
            step(rung.name)
    for th in sorted({1, cores}):
        fns = {"numpy": lambda: np.matmul(a, b, out=c)}
        fast = [r for r in LADDER if not r.slow and (cores if r.threaded else 1) == th]
        for rung in fast:
            fns[rung.name] = lambda rung=rung: rung(a, b, c, threads=th)
        if th == 1 < cores:  # the final GEMM on one core: its kernel against OpenBLAS's alone
            fns["final"] = lambda: matmul(a, b, out=c, threads=1)
        with compare.numpy_pinned(th):
            res = compare.paired(fns, n, n, n, quick=quick)
            rec.data["settings"].setdefault("blas_pinned", compare.blas_info())
        rec.add("numpy", "Gop/s", res["numpy"]["value"], seconds=res["numpy"]["seconds"],
                M=n, N=n, K=n, threads=th)
        if "final" in res:
            rec.add("final_one_core", "Gop/s", res["final"]["value"],
                    seconds=res["final"]["seconds"], M=n, N=n, K=n, threads=1)
        for rung in fast:
            r = res[rung.name]
            rec.add("rung", "Gop/s", r["value"], seconds=r["seconds"], rung=rung.index,
                    kernel=rung.name, M=n, N=n, K=n, threads=th)
            step(rung.name)


def _measure_mc_sweep(rec, mr, ladder, quick, rng) -> None:
    """M_C: rung 4 on one core, whose tiles go down the columns and so re-read the whole A
    block from L2 for each one (rung 5 reads each A sliver for one row of tiles only); the
    A block in more or fewer of the L2's ways."""
    n_mc = 128 if quick else 2048
    a, b, c = _square(n_mc, rng)
    packed = LADDER["packed"]
    g2 = cache_geometry()["L2"]
    way2 = g2["bytes"] // g2["ways"]
    mcs = {}
    for ways in sorted({1, 2, g2["ways"] // 4, l2_ways_for_a(g2["ways"]), g2["ways"] - 2} - {0}):
        mcs[ways] = max(mr, ways * way2 // (ladder["kc"] * 4) // mr * mr)
    res = compare.paired({w: (lambda mc=mc: packed(a, b, c, blocks={"mc": mc}, threads=1))
                          for w, mc in mcs.items()}, n_mc, n_mc, n_mc, quick=quick, pause=0.0)
    for ways, mc in mcs.items():
        rec.add("mc_sweep", "Gop/s", res[ways]["value"], seconds=res[ways]["seconds"], mc=mc,
                kc=ladder["kc"], l2_ways=ways, n=n_mc, threads=1, rung=packed.name)


def _measure_kc_sweep(rec, mr, cores, quick, rng) -> None:
    """K_C: the final GEMM on all cores in rung 5's order, with a C too large for the L3, so
    that every K_C slice is a pass over C in DRAM; A's sliver, the one rung 5 keeps in L1, in
    more or fewer of its ways."""
    n_kc = 128 if quick else 4096
    a, b, c = _square(n_kc, rng)
    g1 = cache_geometry()["L1d"]
    way1 = g1["bytes"] // g1["ways"]
    kcs = {ways: ways * way1 // (mr * 4) for ways in range(max(1, g1["ways"] // 4), g1["ways"] + 1)}
    res = compare.paired({w: (lambda kc=kc: matmul(a, b, out=c, blocks={"kc": kc, "order": "rows"}))
                          for w, kc in kcs.items()}, n_kc, n_kc, n_kc, quick=quick, pause=0.0)
    for ways, kc in kcs.items():
        rec.add("kc_sweep", "Gop/s", res[ways]["value"], seconds=res[ways]["seconds"], kc=kc,
                l1_ways=ways, sliver="A", n=n_kc, threads=cores)


def _measure_sweep(rec, sweep, cores, quick, rng, step) -> None:
    """The final GEMM against numpy over square sizes, with the FMA probe timed between the
    samples at the largest size up to 2048 (what the cores gave meanwhile)."""
    beside = max(x for x in sweep if x <= 2048)
    for s in sweep:
        a, b, c = _square(s, rng)
        fns = {"smallem": lambda: matmul(a, b, out=c), "numpy": lambda: np.matmul(a, b, out=c)}
        work = {}
        if s == beside:
            fns["peak"], work["peak"] = peak_probe("f32", cores)
        with compare.numpy_pinned(cores):
            res = compare.paired(fns, s, s, s, quick=quick, work=work)
        for impl in ("smallem", "numpy"):
            rec.add("sweep", "Gop/s", res[impl]["value"], seconds=res[impl]["seconds"],
                    impl=impl, n=s, threads=cores)
        if "peak" in res:
            rec.add("peak_beside", "Gop/s", res["peak"]["value"], seconds=res["peak"]["seconds"],
                    kind="f32", n=s, threads=cores)
        step(f"sweep {s}")


def _measure_call(rec, cores, quick, rng) -> None:
    """What a call costs before any arithmetic: a 1 x 1 product through each library."""
    a, b, c = _square(1, rng)
    with compare.numpy_pinned(cores):
        ts = measure_interleaved({"smallem": lambda: matmul(a, b, out=c),
                                  "numpy": lambda: np.matmul(a, b, out=c)},
                                 repeats=3 if quick else 15, warmup=100,
                                 min_sample=0.005 if quick else 0.02)
    for impl, t in ts.items():
        secs = {k: v * 1e6 for k, v in t.stats().items() if k != "n"}
        rec.add("call", "µs", {**secs, "n": t.stats()["n"]}, impl=impl, M=1, N=1, K=1)


def _measure_shapes(rec, shapes, cores, quick, rng, step) -> None:
    """The model's products (with their transposes) against numpy, and their phases."""
    for sh in shapes:
        M, K, N, ta, tb = sh["M"], sh["K"], sh["N"], sh["ta"], sh["tb"]
        a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
        c = np.empty((M, N), np.float32)
        opa, opb = (a.T if ta else a), (b.T if tb else b)
        with compare.numpy_pinned(cores):
            res = compare.paired({"smallem": lambda: matmul(a, b, trans_a=ta, trans_b=tb, out=c),
                                  "numpy": lambda: np.matmul(opa, opb, out=c)}, M, N, K,
                                 quick=quick)
        params = dict(label=sh["label"], M=M, N=N, K=K, trans_a=ta, trans_b=tb, threads=cores)
        for impl, r in res.items():
            rec.add("shape", "Gop/s", r["value"], seconds=r["seconds"], impl=impl, **params)
        _measure_phases(rec, a, b, c, params, quick)
        step(sh["label"])


def _measure_pool(rec, lib, cores, level, quick) -> None:
    """An empty parallel region against creating and joining the threads, and the team's
    thread ids on three calls."""
    reps = 50 if quick else 2000
    for name, fn in (("empty_region", lambda: lib.gemm_empty_regions(reps, cores)),
                     ("spawn_join", lambda: lib.gemm_spawn_join(reps // 10, cores))):
        t = measure(fn, repeats=5, warmup=1)
        per = reps if name == "empty_region" else reps // 10
        secs = {k: v / per * 1e6 for k, v in t.stats().items() if k != "n"}
        rec.add("pool", "µs", {**secs, "n": t.stats()["n"]}, what=name, threads=cores)
    rec.data["settings"]["pool_ids"] = [pool_ids(cores, level) for _ in range(3)]


def run(quick: bool | None = None, progress: bool = True) -> records.Record:
    """Measure the ladder, the sweep, the model shapes, bf16 and the pool; one record."""
    from tqdm import tqdm

    quick = quick_mode() if quick is None else quick
    cores = checks.threads(None)
    level = isa.selected()
    ffi, lib, mr, nr, *_ = kernels(level)
    blocks, ladder = default_blocks(level), ladder_blocks(level)
    n_ladder = 128 if quick else 1024
    sweep = [32, 64, 128, 256] if quick else [64, 128, 256, 512, 1024, 2048, 4096]
    shapes = model_shapes()
    if quick:  # the same products, every size divided by 16
        shapes = [dict(s, M=s["M"] // 16, K=s["K"] // 16, N=s["N"] // 16) for s in shapes]
    rec = _new_record(quick, cores, level, mr, nr, blocks, ladder, n_ladder, sweep)
    rng = np.random.default_rng(0)
    steps = 4 + len(LADDER) + len(sweep) + len(shapes) + 1 + 1 + 1 + 2 + 1 + 1
    bar = tqdm(total=steps, disable=not progress, desc="smallem gemm")

    def step(what):
        bar.set_postfix_str(what)
        bar.update(1)

    _measure_peak(rec, cores, quick)
    step("f32 peak")
    _measure_ladder(rec, n_ladder, cores, quick, rng, step)
    step("numpy")
    # each block-size sweep runs where its block matters
    _measure_mc_sweep(rec, mr, ladder, quick, rng)
    step("MC sweep")
    _measure_kc_sweep(rec, mr, cores, quick, rng)
    step("KC sweep")
    _measure_sweep(rec, sweep, cores, quick, rng, step)
    _measure_call(rec, cores, quick, rng)
    _measure_shapes(rec, shapes, cores, quick, rng, step)
    _measure_whole_b(rec, lib, shapes, blocks, cores, quick, rng)
    step("all of B at once")
    _measure_orders(rec, cores, quick, rng)
    step("both orders")
    _measure_alone(rec, level, cores, quick)
    step("the micro-kernel alone")
    first = shapes[0]
    _measure_dtypes(rec, [(n_ladder, n_ladder, n_ladder), (first["M"], first["K"], first["N"])],
                    cores, quick, rng, step)
    _measure_amx_ladder(rec, cores, quick, rng, first)
    step("AMX ladder")
    _measure_pool(rec, lib, cores, level, quick)
    step("thread pool")
    bar.close()
    return rec
