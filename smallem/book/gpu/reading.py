"""The GPU's records read into the pages' tables, figures and values (a page says 'not
measured' where there is no record)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from smallem.plumbing.build import ROOT
from .. import figures, records
from .measuring import CH1, CH2, CHECK_ROWS, NOT_MEASURED, GiB, KiB, MiB


# ---------------------------------------------------------------- reading the records

def load(name: str, rec_dir=None) -> dict | None:
    try:
        return records.load(name, rec_dir)
    except records.RecordError:
        return None


# the GPU's records' folder rule lives with the records (chapter 4's balance sheet reads it too)
from ..records import BOOK_RECORDS, GPU_NAMES, gpu_dir, load_gpu  # noqa: E402,F401


def gpu_line(rec: dict) -> str:
    g = rec["machine"].get("gpu", {})
    cc = g.get("compute_capability", "?")
    rt = g.get("runtime")  # CUDA's runtime, whose cuBLAS the peers' products are: 13020 is 13.2
    cuda = f"CUDA {rt // 1000}.{rt % 1000 // 10}, " if isinstance(rt, int) else ""
    return (f"{g.get('name', 'unknown GPU')} (compute capability {cc[:-1]}.{cc[-1:]}, "
            f"{g.get('sms', '?')} SMs, {cuda}CuPy {g.get('cupy', '?')}) on {rec['date'][:10]}, "
            f"commit {str(rec['commit'])[:7]}")


def l2_plateau(rec: dict) -> tuple[float, float]:
    """(L2 read GB/s, HBM read GB/s): medians over sets well inside / far outside L2."""
    l2 = rec["machine"].get("gpu", {}).get("l2_bytes") or 50 * MiB
    pts = records.results(rec, "read")
    inside = [records.median(p) for p in pts if 2 * MiB <= p["params"]["bytes"] <= l2 // 4]
    outside = [records.median(p) for p in pts if p["params"]["bytes"] >= 8 * l2]
    inside = inside or [records.median(p) for p in pts if p["params"]["bytes"] <= l2 // 2]
    med = lambda v: float(np.median(v)) if v else float("nan")
    return med(inside), med(outside)


def _best_cublas(rec: dict, dtype: str) -> float:
    return _best_cublas_at(rec, dtype)[0]


def _best_cublas_at(rec: dict, dtype: str) -> tuple[float, int | None]:
    """(cuBLAS's fastest rate in ``dtype`` over the sizes the record ran, that size n)."""
    runs = [(records.median(r), r["params"].get("n"))
            for r in records.results(rec, "cublas", dtype=dtype)]
    return max(runs, key=lambda x: x[0]) if runs else (float("nan"), None)


def _wgmma(rec: dict) -> float | None:
    """The wgmma probe's rate, where the record has one (compute capability 9.0)."""
    found = records.results(rec, "wgmma_peak")
    return records.median(found[0]) if found else None


def tensor_peak(rec: dict) -> float:
    """The tensor cores' peak: the faster of the two probes (wgmma where the card has it)."""
    return max(records.value(rec, "mma_peak"), _wgmma(rec) or 0.0)


def peaks_rows(rec: dict | None) -> list[list]:
    if rec is None:
        return [[NOT_MEASURED, "-", "-", "-"]]
    f = figures.fmt
    fma, mma = records.value(rec, "fma_peak"), records.value(rec, "mma_peak")
    (cb32, n32), (cb16, n16) = _best_cublas_at(rec, "f32"), _best_cublas_at(rec, "bf16")
    at = lambda n: f" (n = {n})" if n else ""
    ours, theirs = records.value(rec, "copy", impl="ours"), records.value(rec, "copy", impl="cupy")
    l2, hbm = l2_plateau(rec)
    pct = lambda a, b: f"{100 * a / b:.0f} %" if b == b and b else "-"
    wg = _wgmma(rec)
    return [
        ["f32 FMA, CUDA cores", f(fma, "Gop/s"), f"cuBLAS f32 {f(cb32, 'Gop/s')}{at(n32)}", pct(cb32, fma)],
        ["bf16 wmma, tensor cores", f(mma, "Gop/s"), f"cuBLAS bf16 {f(cb16, 'Gop/s')}{at(n16)}", pct(cb16, mma)],
        *([["bf16 wgmma, tensor cores (Hopper)", f(wg, "Gop/s"), f"cuBLAS bf16 {f(cb16, 'Gop/s')}{at(n16)}",
            pct(cb16, wg)]] if wg else []),
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
    return [[_bytes(p["params"]["bytes"]), figures.fmt(records.median(p))]
            for p in records.results(rec, "read")]


def _bytes(n: int) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def _err(x: float) -> str:
    """A relative error for the table: "0" for the same bits, else two digits (a tolerance's
    scale, 2.5e-06, where a reader reads the exponent)."""
    return "0" if x == 0 else f"{x:.1e}"


def gemm_rows(rec: dict | None) -> list[list]:
    if rec is None:
        return [[NOT_MEASURED, "-", "-", "-", "-", "-", "-"]]
    n = rec["settings"]["ladder_n"]
    rows = []
    for r in records.results(rec, "gemm"):
        p = r["params"]
        ref = records.value(rec, "cublas", dtype=p["dtype"], n=n)
        rows.append([p["number"], p["rung"], p["dtype"], figures.fmt(records.median(r)),
                     f"{100 * r['value']['median'] / ref:.0f} %", _err(p['max_rel_err']),
                     _err(p['max_rel_err_f64'])])
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
    ax.plot([p["params"]["bytes"] for p in pts], [records.median(p) for p in pts], marker=".",
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
    fma = records.value(rec, "fma_peak")
    l2, hbm = l2_plateau(rec)
    gname = rec["machine"]["gpu"]["name"]
    for bw, label, color in ((hbm, "HBM", "#e76f51"), (l2, "L2", "#8ab17d")):
        if bw == bw:
            ax.plot(x, np.minimum(bw * x, tensor_ceiling(rec)[0]), color=color, lw=1.6,
                    label=f"{gname} {label} {figures.fmt(bw, 'GB/s')}")
    top, by = tensor_ceiling(rec)
    ax.axhline(top, color="#264653", ls="--", lw=1.2,
               label=f"{gname} bf16 tensor cores {figures.fmt(top, 'Gop/s')} ({by})")
    ax.axhline(fma, color="#264653", lw=1.2, label=f"{gname} f32 {figures.fmt(fma, 'Gop/s')}")
    if cpu_rec is not None:
        try:
            from .. import ch1 as cpu
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
    vals = [records.median(r) for r in rows]
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
    """The GPU's chapter 1 and 2 tables, figures and values, from :func:`gpu_dir`'s records
    (the CPU roof of the roofline is ``rec_dir``'s chapter 1)."""
    ch1, ch2 = load_gpu(CH1, rec_dir), load_gpu(CH2, rec_dir)
    note1 = f"Measured on {gpu_line(ch1)}." if ch1 else ""
    note2 = (f"Every product is {ch2['settings']['ladder_n']}³ (n = m = k = "
             f"{ch2['settings']['ladder_n']}), measured on {gpu_line(ch2)}. Errors are the "
             f"largest difference from the reference over the largest reference magnitude; "
             f"against float64, on {CHECK_ROWS} rows computed on the host from the same inputs. "
             f"An error of 0 against cuBLAS means the same bits: for the f32 rungs, where it "
             f"does not split K, cuBLAS sums each element's products in k order with FMAs, as "
             f"these kernels do; for the bf16 rungs on the tensor cores the order of the sums "
             f"is the hardware's, which these records do not document, and here it came out "
             f"the same."
             if ch2 else "")
    figures.write_table("gpu_peaks", peaks_rows(ch1), PEAKS_HEADER, note1)
    figures.write_table("gpu_staircase", stair_rows(ch1), STAIR_HEADER, note1)
    figures.write_table("gpu_gemm", gemm_rows(ch2), GEMM_HEADER, note2)
    if ch1:
        staircase_figure(ch1)
        roofline_figure(ch1, load("ch1.machine", rec_dir))
    else:
        _placeholder("gpu_staircase", "GPU memory staircase")
        _placeholder("gpu_roofline", "GPU roofline")
    if ch2:
        gemm_figure(ch2)
    else:
        _placeholder("gpu_gemm", "GPU GEMM ladder")
    return {"gpu.ch1_line": gpu_line(ch1) if ch1 else NOT_MEASURED,
            "gpu.ch2_line": gpu_line(ch2) if ch2 else NOT_MEASURED,
            **peak_values(ch1), **gemm_values(ch2)}


# The H200's rated dense bf16 tensor rate (SXM; without 2:4 sparsity), bibliography [h200-specs]:
# a figure from elsewhere, beside the measured ones, never in place of them.
H200_RATED_BF16_GOPS = 989e3


def is_hopper(rec: dict) -> bool:
    return str(rec["machine"].get("gpu", {}).get("compute_capability", "")).startswith("9")


def tensor_ceiling(rec: dict) -> tuple[float, str]:
    """The highest bf16 rate measured on the tensor cores and what measured it: the faster of
    the probes, or cuBLAS's bf16 product where it ran faster than every probe (a record taken
    before the wgmma probe, on a Hopper card): the roof a reader may compare against."""
    probe, (cb16, n) = tensor_peak(rec), _best_cublas_at(rec, "bf16")
    if cb16 == cb16 and cb16 > probe:
        return cb16, "cuBLAS's bf16 product" + (f" at n = {n}" if n else "")
    return probe, "the wgmma probe" if _wgmma(rec) else "the wmma probe"


def peak_values(rec: dict | None) -> dict:
    """What the page says of the GPU's peaks, typed: the probes' rates (Gop/s), cuBLAS's over
    them (fractions), whether the record has the wgmma probe a Hopper card needs (an older
    record does not), and the rated bf16 figure where the card is an H200."""
    if rec is None:  # every key the page names, so that its untaken branches still render
        return {"gpu.measured": False, "gpu.is_h200": False, "gpu.cublas_beats_mma": False,
                "gpu.has_wgmma": False, "gpu.ch1_older": False,
                **{k: None for k in ("gpu.fma_peak", "gpu.mma_peak",
                                     "gpu.cublas_over_mma", "gpu.cublas_f32_over_fma",
                                     "gpu.tensor_ceiling", "gpu.tensor_ceiling_by",
                                     "gpu.rated_bf16", "gpu.mma_of_rated",
                                     "gpu.cublas_of_rated", "gpu.cublas_f32_n",
                                     "gpu.copy_ours", "gpu.copy_cupy", "gpu.hbm_read",
                                     "gpu.cublas_bf16_n")}}
    fma, mma = records.value(rec, "fma_peak"), tensor_peak(rec)
    (cb32, n32), (cb16, n16) = _best_cublas_at(rec, "f32"), _best_cublas_at(rec, "bf16")
    name = rec["machine"].get("gpu", {}).get("name", "GPU")
    h200 = "H200" in name
    rated = H200_RATED_BF16_GOPS
    hopper, wg = is_hopper(rec), _wgmma(rec) is not None
    ceiling, by = tensor_ceiling(rec)
    return {"gpu.measured": True, "gpu.is_h200": h200, "gpu.cublas_beats_mma": cb16 > mma,
            "gpu.has_wgmma": wg, "gpu.ch1_older": hopper and not wg,
            "gpu.fma_peak": fma, "gpu.mma_peak": mma, "gpu.cublas_over_mma": cb16 / mma,
            "gpu.cublas_f32_over_fma": cb32 / fma,
            # the size each cuBLAS figure was measured at (the fastest of the record's sizes)
            "gpu.cublas_f32_n": n32, "gpu.cublas_bf16_n": n16,
            "gpu.tensor_ceiling": ceiling, "gpu.tensor_ceiling_by": by,
            "gpu.rated_bf16": rated if h200 else None,
            "gpu.mma_of_rated": mma / rated if h200 else None,
            "gpu.cublas_of_rated": cb16 / rated if h200 else None,
            # the copy probe against CuPy's copy, and the read stream's HBM plateau (the roof)
            "gpu.copy_ours": records.value(rec, "copy", impl="ours"),
            "gpu.copy_cupy": records.value(rec, "copy", impl="cupy"),
            "gpu.hbm_read": l2_plateau(rec)[1]}


def gemm_values(rec: dict | None) -> dict:
    """The top of the GPU ladder against cuBLAS, typed, for the page's sentences; whether the
    record has the ladder's last rung (an older record stops before it)."""
    if rec is None:  # every key the page names, so that its untaken branches still render
        return {"gpu.gemm_measured": False, "gpu.ch2_older": False, "gpu.has_mma_rung": False,
                **{k: None for k in ("gpu.ladder_n", "gpu.ladder_last",
                                     *(f"gpu.top_{dt}{y}" for dt in ("f32", "bf16")
                                       for y in ("_rung", "", "_of_cublas")),
                                     "gpu.ladder_cublas_bf16", "gpu.sweep_cublas_bf16",
                                     "gpu.sweep_n")}}
    from smallem.plumbing import cuda

    n = rec["settings"]["ladder_n"]
    rungs = records.results(rec, "gemm")
    have = {r["params"]["rung"] for r in rungs}
    last = cuda.GPU_LADDER[-1].name
    out = {"gpu.gemm_measured": True, "gpu.ladder_n": n, "gpu.has_mma_rung": last in have,
           "gpu.ladder_last": last, "gpu.ch2_older": last not in have}
    for dt in ("f32", "bf16"):
        mine = [r for r in rungs if r["params"]["dtype"] == dt]
        top = max(mine, key=lambda r: r["params"]["number"]) if mine else None
        ref = records.value(rec, "cublas", dtype=dt, n=n)
        out[f"gpu.top_{dt}_rung"] = top["params"]["rung"] if top else None
        out[f"gpu.top_{dt}"] = records.median(top) if top else None
        out[f"gpu.top_{dt}_of_cublas"] = records.median(top) / ref if top else None
    # cuBLAS's bf16 at the ladder's size and at the sweep's largest: a rate depends on n
    big = max((r["params"]["n"] for r in records.results(rec, "cublas", dtype="bf16")),
              default=None)
    out["gpu.ladder_cublas_bf16"] = records.value(rec, "cublas", dtype="bf16", n=n)
    out["gpu.sweep_n"] = big if big and big != n else None
    out["gpu.sweep_cublas_bf16"] = (records.value(rec, "cublas", dtype="bf16", n=big)
                                    if out["gpu.sweep_n"] else None)
    return out
