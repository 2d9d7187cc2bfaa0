"""Chapter 1's record read: the levels a working set sits in (the staircase's plateaus and
where each ends: :mod:`.staircase`), the ridges, the table, the figures and the page's values,
and :func:`facts`, through which later chapters read this machine's peaks and bandwidths."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np

from smallem.cpu import isa, machine
from smallem.cpu.machine import (FMA_PIPES, MUL_LATENCY, STREAM_KERNELS, GiB, KiB, MiB, core_facts,
                                 peak_theory)
from .. import compare, figures, records, reference
from .measuring import (AMX_KINDS, CLOCK_AGREEMENT, DOT_FALLBACK, DOT_INSTRUCTION,
                        ONE_THREAD_FLOOR, RECORD, SCALING_FLOOR, THEORY_BAND)
from .disturbed import PEAK_NAMES, disturbed, unscaled_peaks, disturbed_note as _disturbed_note  # noqa: F401
from .roofline import roofline_figure  # noqa: F401  (later chapters place their kernels on it)
from .staircase import (DISTINCT, LEVELS, level_sizes, plateaus, spans,  # noqa: F401
                        staircase_close, staircase_distinct)


STAIR_KERNELS = ("triad", "read")  # the staircases levels are read from: every write, none


# ---------------------------------------------------------------- reading the record

def facts(rec_dir=None) -> dict | None:
    """This machine's measured limits for every later chapter: :func:`summary` of the
    ``ch1.machine`` record in ``rec_dir`` (default: the records folder), with the record
    itself under "record"; None where there is no such record. Each version of the file is
    read once per process."""
    path = Path(rec_dir or records.records_dir()) / f"{RECORD}.json"
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return None
    return _facts(str(path.parent), stamp)


@functools.lru_cache(maxsize=8)
def _facts(folder: str, stamp: int) -> dict:
    rec = records.load(RECORD, folder)
    return {**summary(rec), "record": rec}


def record_identity(fingerprint: dict) -> dict | None:
    """What a record's machine fingerprint says of its CPU, in
    :func:`smallem.cpu.isa.parse_cpuinfo`'s shape, for the FMA table's cross-check (flags: those
    its ISA levels and extensions need, all a record keeps); None where the record kept no
    vendor (older records)."""
    if not fingerprint.get("vendor"):
        return None
    found = fingerprint.get("isa", {})
    flags = set(found.get("extensions", ()))
    for level in found.get("supported", ()):
        flags |= isa.REQUIRED.get(level, set())
    return {"vendor": fingerprint["vendor"], "family": fingerprint.get("family", -1),
            "model": fingerprint.get("model", -1), "model_name": fingerprint.get("cpu", ""),
            "flags": frozenset(flags)}


def theory(rec: dict) -> dict:
    """The theoretical f32 peak of a ``ch1.machine`` record, computed again from its measured
    clocks and f32 probes (:func:`smallem.cpu.machine.peak_theory`), not read from the record's
    settings: every record, however old, gets today's theory."""
    s = rec["settings"]
    cores = max(s["threads"])
    physical = min(cores, s.get("physical_cores") or rec["machine"].get("physical_cores") or cores)
    mul = records.results(rec, "clock_mul")
    return peak_theory(records.value(rec, "clock") * 1e9,
                       records.median(mul[0]) * 1e9 if mul else math.nan,
                       records.value(rec, "peak", kind="f32", threads=1) * 1e9,
                       records.value(rec, "peak", kind="f32", threads=cores) * 1e9,
                       physical, s["isa"], record_identity(rec["machine"]))


OLD_DOT_CHAINS = 24  # the dot probes' one count before they chose among several


def summary(rec: dict) -> dict:
    """The chapter's numbers, derived from one ``ch1.machine`` record."""
    s = rec["settings"]
    cores = max(s["threads"])
    caches = rec["machine"]["caches"]
    peak = {(r["params"]["kind"], r["params"]["threads"]): r
            for r in records.results(rec, "peak")}
    found = {}  # kernel -> (plateaus, spans) per thread count, for the triad and the read
    for kernel in STAIR_KERNELS:
        stairs, extents = {}, {}
        for th in s["threads"]:
            pts = records.results(rec, "stream", kernel=kernel, threads=th)
            if pts:
                extents[th] = spans(pts, caches, th)
                stairs[th] = {lv: span["bw"] for lv, span in extents[th].items()}
        if extents:
            found[kernel] = stairs, extents
    stairs, extents = found["triad"]
    clock_mul = records.results(rec, "clock_mul")
    out = {
        "cores": cores,
        "clock_ghz": records.value(rec, "clock"),
        "clock_mul_ghz": records.median(clock_mul[0]) if clock_mul else math.nan,
        "theory": theory(rec),
        "peak": {k: records.median(v) for k, v in peak.items()},
        "native": {k[0]: v["params"]["native"] for k, v in peak.items()},
        # the dot probes' accumulators on all cores (records before the probe chose: 24)
        "chains": {k[0]: v["params"].get("chains", OLD_DOT_CHAINS) for k, v in peak.items()
                   if k[0] in ("bf16", "int8") and k[1] == cores},
        "caches": caches,  # the sizes the OS reports: no level holds more (level_of)
        "triad_plateaus": stairs,
        "triad_spans": extents,
        # the read-only stream, where the record has it (records before it: absent)
        **{f"{k}_{what}": v[i] for k, v in found.items() if k != "triad"
           for i, what in enumerate(("plateaus", "spans"))},
        "numpy_copy": records.value(rec, "numpy_copy"),
        "naive_gops": records.value(rec, "gemm_naive"),
        "naive_n": s["gemm_naive_n"],
    }
    # the clock at which one thread's f32 probe would run at exactly the whole pipes' FMAs
    # per cycle: against the chains' clock, a check of the rounding and of the probe
    out["clock_f32_ghz"] = out["peak"][("f32", 1)] / out["theory"]["flops_per_cycle_per_core"]
    # one core's triad in the bytes it moves (a write-allocating triad moves 32 for the 24
    # STREAM counts) against numpy's one-thread copy, which moves what it counts
    out["dram_moved_vs_numpy"] = stairs[1]["DRAM"] * 32 / 24 / out["numpy_copy"]
    out["f32_fraction_of_theory"] = out["peak"][("f32", cores)] / out["theory"]["gops_all"]
    out["naive_below_peak"] = out["peak"][("f32", cores)] / out["naive_gops"]
    out["naive_below_core"] = out["peak"][("f32", 1)] / out["naive_gops"]  # it runs on one core
    return out


def read_stream(facts: dict) -> str:
    """The stream a kernel that reads much and writes little (a decoder's weights) is bound
    by: "read" where chapter 1's record has the read-only stream, else "triad"."""
    return "read" if "read_spans" in facts else "triad"


STREAM_NAMES = {"read": "read-only stream", "triad": "triad"}  # for prose


def read_stream_name(facts) -> str:
    """:func:`read_stream` for prose: "read-only stream", or "triad" in a record from before
    it (the read-only stream's name where there are no facts at all)."""
    return STREAM_NAMES[read_stream(facts)] if facts else STREAM_NAMES["read"]


def level_of(facts: dict, nbytes: float, threads: int,
             stream: str = "triad") -> tuple[str, float]:
    """(the level of the measured staircase that holds a working set of ``nbytes`` on
    ``threads`` threads, its bandwidth in GB/s): the first level whose plateau, as
    chapter 1 measured it with ``stream`` ("triad" or "read", see :func:`read_stream`) at
    that many threads (or the most threads measured), still ran at that size, that is whose
    largest working set inside its stretch is at least ``nbytes``, and whose reported size
    (:func:`level_sizes`) holds it; DRAM beyond the last. The sizes the OS reports do not
    place a plateau's end (a VM's share of an L3, or a victim cache, moves it away from the
    nominal size, and the staircase's grid of sizes is coarse), but a level holds no more
    than its size: past it, a plateau that still runs fast is the next level answering."""
    if f"{stream}_spans" not in facts:
        raise ValueError(f"stream: chapter 1's record has no {stream!r} staircase")
    ext = facts[f"{stream}_spans"]
    th = threads if threads in ext else max(ext)
    sizes = level_sizes(facts["caches"], th) if facts.get("caches") else {}
    for lv in LEVELS[:-1]:
        span = ext[th][lv]
        if span["bw"] == span["bw"] and nbytes <= min(span["last"], sizes.get(lv) or math.inf):
            return lv, span["bw"]
    return "DRAM", ext[th]["DRAM"]["bw"]


def ridges(sm: dict, threads: int | None = None, stream: str = "triad") -> dict:
    """The ridge point of each level, f32 peak over its ``stream`` bandwidth (op/byte), on
    ``threads`` cores (default: all of them); a level whose plateau was not reached is
    left out. ``sm`` is :func:`summary`'s (or :func:`facts`') dict."""
    plateaus = sm[f"{stream}_plateaus"]
    th = threads if threads in plateaus else sm["cores"]
    peak = sm["peak"][("f32", th)] if ("f32", th) in sm["peak"] else sm["peak"][("f32", sm["cores"])]
    return {lv: peak / bw for lv in LEVELS if (bw := plateaus[th].get(lv)) == bw and bw}


def _listing(words: list[str]) -> str:
    if not words:
        return "none measured"
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def ridge_position(sm: dict, intensity: float, threads: int | None = None,
                   stream: str = "triad") -> str:
    """Where ``intensity`` (op/byte) sits against each level's ridge (on ``stream``), as
    words for a sentence: "left of the DRAM, L3 and L2 ridges (7.76, 1.27 and 1.03
    op/byte), right of the L1's (0.45)"."""
    r = ridges(sm, threads, stream)
    order = [lv for lv in reversed(LEVELS) if lv in r]  # DRAM first: the highest ridge
    left = [lv for lv in order if intensity < r[lv]]
    right = [lv for lv in order if intensity >= r[lv]]
    parts = []
    for side, lvs in (("left", left), ("right", right)):
        if lvs:
            nums = _listing([figures.fmt(r[lv]) for lv in lvs])
            what = (f"the {_listing(lvs)} ridges" if len(lvs) > 1 else f"the {lvs[0]}'s ridge")
            parts.append(f"{side} of {what} ({nums} op/byte)")
    return ", ".join(parts) or "n/a (no plateau measured)"


def column_lines_held(cache_bytes: int, ways: int, stride_bytes: int, line: int = 64) -> int:
    """How many lines of a column ``stride_bytes`` apart a cache can hold at once (0: unknown).

    A line's set is its address / line, modulo the number of sets; lines a multiple of
    the sets' span apart fall into one set, whose ways are all the cache has for them.
    """
    if not cache_bytes or not ways:
        return 0
    sets = cache_bytes // (ways * line)
    return ways * (sets // math.gcd(sets, max(1, stride_bytes // line)))


def naive_gemm_intensity(n: int) -> float:
    """Flop per byte if each matrix crossed the memory bus once: 2n^3 / (3 n^2 x 4 bytes)."""
    return 2.0 * n**3 / (3 * n * n * 4)


def staircase_figure(rec: dict, name: str = "ch1_staircase"):
    import matplotlib.pyplot as plt

    s = rec["settings"]
    caches = rec["machine"]["caches"]
    fig, axes = plt.subplots(1, len(s["threads"]), figsize=(11, 4.2), sharey=True, squeeze=False)
    for ax, th in zip(axes[0], s["threads"]):
        for kernel in STREAM_KERNELS:
            pts = records.results(rec, "stream", kernel=kernel, threads=th)
            ax.plot([p["params"]["bytes"] for p in pts], [records.median(p) for p in pts],
                    marker=".", label=kernel)
        for level, key in (("L1", "L1d_bytes"), ("L2", "L2_bytes"), ("L3", "L3_bytes")):
            size = caches[key] * (min(th, caches["L3_instances"]) if level == "L3" else th)
            ax.axvline(size, color="grey", ls=":", lw=1)
            ax.text(size, 0.98, f" {level}", fontsize=8, color="grey",
                    transform=ax.get_xaxis_transform(), va="top")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("working set (bytes)")
        ax.set_title(f"{th} thread{'s' if th > 1 else ''}", fontsize=10)
        ax.grid(True, which="both", alpha=0.25)
    axes[0][0].set_ylabel("GB/s (STREAM counting)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"The memory staircase: {rec['machine']['cpu']}", fontsize=10)
    return figures.save(fig, name)


def table_rows(rec: dict) -> tuple[list[list], dict]:
    """The chapter-1 table and the values the prose quotes."""
    sm = summary(rec)
    return _table(rec, sm), _values(rec, sm)


def _bandwidth_text(sm: dict, top: int, th: int, level: str, kernel: str = "triad") -> str:
    """A plateau's bandwidth for the table and the prose, or that it was not reached."""
    f = figures.fmt
    bw = sm[f"{kernel}_plateaus"][th][level]
    return (f"not reached (largest working set {f(top / MiB)} MiB)" if math.isnan(bw)
            else f(bw, "GB/s"))


def _table(rec: dict, sm: dict) -> list[list]:
    """The chapter-1 table's rows: clocks, peaks, plateaus, numpy's copy, the naive product."""
    cores = sm["cores"]
    th = sm["theory"]
    f = figures.fmt

    low, unscaled = disturbed(sm), unscaled_peaks(sm)

    def peak_row(kind, what):
        nat = "" if sm["native"][kind] else f": {fallback_name(kind)}"
        mark = " †" if kind in low else ""
        short = " ‡" if kind in unscaled else ""
        return [f"{what}{nat}", f(sm["peak"][(kind, 1)], "Gop/s") + mark,
                f(sm["peak"][(kind, cores)], "Gop/s") + short]

    none = ["—", "—"]  # the reference published no such figure
    ref_peak = [f(reference.CH1_F32_PEAK_GOPS / reference.CORES, "Gop/s"),
                f(reference.CH1_F32_PEAK_GOPS, "Gop/s")]
    rows = [
        ["Clock, chain of adds", f(sm["clock_ghz"], "GHz"), ""] + none,
        ["Clock, chain of multiplies", f(sm["clock_mul_ghz"], "GHz"), ""] + none,
        ["Clock the f32 probe implies", f(sm["clock_f32_ghz"], "GHz"), ""] + none,
        ["f32 FMA peak, theoretical", f(th["gops_per_core"], "Gop/s"),
         f(th["gops_all"], "Gop/s")] + none,
        peak_row("f32", "f32 FMA peak, measured") + ref_peak,
        peak_row("bf16", "bf16 dot peak" + (f" ({DOT_INSTRUCTION['bf16']})"
                                             if sm["native"]["bf16"] else "")) + none,
        peak_row("int8", "int8 dot peak" + (f" ({DOT_INSTRUCTION['int8']})"
                                             if sm["native"]["int8"] else "")) + none,
    ]
    rows += [peak_row(k, f"AMX {k[4:]} tile peak ({DOT_INSTRUCTION[k]})") + none
             for k in AMX_KINDS if (k, 1) in sm["peak"]]
    top = rec["settings"]["stream_sizes"][-1]


    def bandwidth(th, level, kernel="triad"):
        return _bandwidth_text(sm, top, th, level, kernel)

    for level in LEVELS:
        rows.append([f"{level} bandwidth (triad)", bandwidth(1, level), bandwidth(cores, level)]
                    + none)
    if "read_plateaus" in sm:
        for level in LEVELS:
            rows.append([f"{level} bandwidth (read only)", bandwidth(1, level, "read"),
                         bandwidth(cores, level, "read")] + none)
    rows.append([f"numpy copy, {f(rec['settings']['stream_sizes'][-1] / GiB)} GiB",
                 f(sm["numpy_copy"], "GB/s"), ""] + none)
    n = sm["naive_n"]
    rows.append([f"Naive {n}³ product, one thread", f(sm["naive_gops"], "Gop/s"), "",
                 f(reference.CH2_GEMM_1024_NAIVE_GOPS, "Gop/s"), ""])
    return rows


def _values(rec: dict, sm: dict) -> dict:
    """The values chapter 1's page quotes."""
    cores = sm["cores"]
    th = sm["theory"]
    caches = rec["machine"]["caches"]
    f = figures.fmt
    top = rec["settings"]["stream_sizes"][-1]
    n = sm["naive_n"]

    def bandwidth(th, level, kernel="triad"):
        return _bandwidth_text(sm, top, th, level, kernel)

    # numpy's copy: one array into another, the two together the largest working set
    copy = records.results(rec, "numpy_copy")
    copy_bytes = copy[0]["params"].get("bytes", top) if copy else top
    # a write-allocating triad moves 32 bytes for the 24 STREAM counts (the written line is
    # read first); numpy's copy of a large array is glibc's memmove with non-temporal
    # stores, which moves what it counts
    moved = sm["dram_moved_vs_numpy"] * sm["numpy_copy"]
    values = {
        "ch1.cores": str(cores),
        "ch1.scaling_floor": f"{100 * SCALING_FLOOR:.0f} %",
        "ch1.one_thread_floor": f"{100 * ONE_THREAD_FLOOR:.0f} %",
        "ch1.theory_band": f"{100 * THEORY_BAND[0]:.0f} % and {100 * THEORY_BAND[1]:.0f} %",
        # typed: this run's all-core probe outside the band the tests ask of the captured runs
        "ch1.outside_band": not THEORY_BAND[0] <= sm["f32_fraction_of_theory"] <= THEORY_BAND[1],
        "ch1.clock": f(sm["clock_ghz"], "GHz"),
        "ch1.clock_mul": f(sm["clock_mul_ghz"], "GHz"),
        "ch1.clock_agreement": f"{100 * CLOCK_AGREEMENT:.0f} %",
        "ch1.mul_latency": str(MUL_LATENCY),
        **_theory_values(th, cores),
        # the caches' inclusivity is the table's and chapter 2's (through hw_values), no page's
        **{k: v for k, v in hw_values(rec, th).items() if not k.endswith("_inclusive")},
        "ch1.f32_peak_core": f(sm["peak"][("f32", 1)], "Gop/s"),
        "ch1.f32_peak_all": f(sm["peak"][("f32", cores)], "Gop/s"),
        "ch1.f32_fraction": f"{100 * sm['f32_fraction_of_theory']:.0f} %",
        "ch1.f32_fraction_n": sm["f32_fraction_of_theory"],
        "ch1.bf16_peak_all": f(sm["peak"][("bf16", cores)], "Gop/s"),
        "ch1.int8_peak_all": f(sm["peak"][("int8", cores)], "Gop/s"),
        "ch1.bf16_native": "native" if sm["native"]["bf16"] else "emulated (no AVX512_BF16 here)",
        "ch1.int8_native": "native" if sm["native"]["int8"] else "emulated (no AVX512_VNNI here)",
        "ch1.naive_n": str(n),
        "ch1.naive_gops": f(sm["naive_gops"], "Gop/s"),
        "ch1.naive_below_peak": f(sm["naive_below_peak"]),
        "ch1.naive_below_core": f(sm["naive_below_core"]),
        "ch1.naive_ai": f(naive_gemm_intensity(n), "op/byte"),
        "ch1.naive_stride": f"{4 * n // KiB} KiB" if 4 * n >= KiB else f"{4 * n} bytes",
        "ch1.numpy_copy": f(sm["numpy_copy"], "GB/s"),
        "ch1.numpy_copy_size": (f"{f(copy_bytes / GiB)} GiB" if copy_bytes >= GiB
                                else f"{f(copy_bytes / MiB)} MiB"),
        "ch1.dram_core_moved": f(moved, "GB/s"),
        "ch1.dram_moved_vs_numpy": (f"{100 * moved / sm['numpy_copy']:.0f} %" if moved == moved
                                    else "n/a (no DRAM plateau)"),
        "ch1.staircase_close": ", ".join(staircase_close(sm["triad_plateaus"][cores])) or "none",
        "ch1.distinct": f"{100 * (DISTINCT - 1):.0f} %",
        "ch1.stream_top": f"{f(top / MiB)} MiB",
        "ch1.machine": figures.machine_line(rec),
        "ch1.disturbed": [PEAK_NAMES[k] for k in disturbed(sm)],
        **reference_values(),
        "ch1.ridge": f(sm["peak"][("f32", cores)] / sm["triad_plateaus"][cores]["DRAM"], "op/byte"),
        "ch1.ridges": _listing([f"{lv} {f(x, 'op/byte')}" for lv, x in ridges(sm).items()]),
    }
    values.update(_typed_values(rec, sm))
    for kind, paths in narrow_paths(sm).items():
        values[f"ch1.{kind}_fastest"] = paths[-1][0]
        values[f"ch1.{kind}_fastest_all"] = f(paths[-1][2], "Gop/s")
        values[f"ch1.{kind}_fastest_vs_f32"] = f(paths[-1][2] / sm["peak"]["f32", cores])
    values.update(_plateau_values(sm, top))
    return values


def hw_values(rec: dict, th: dict | None = None) -> dict:
    """The core's hardware facts every page states, typed (``ch1.hw.*``): the FMAs of the
    kernels' vector width one core starts a cycle, measured (the f32 lanes a cycle of
    :func:`smallem.cpu.machine.peak_theory` over the lanes of one instruction), and the rest
    from the one table of the vendors' manuals (:data:`smallem.cpu.machine.CORE_FACTS`) for the
    record's vendor, family and ISA features; None where the table has no row or no such fact."""
    th = th or theory(rec)
    ident = record_identity(rec["machine"])
    row = core_facts(ident) if ident is not None else None
    lanes = th["vector_bits"] // 32

    def table(key):
        return None if row is None else row[key]

    return {"ch1.hw.core": table("core"), "ch1.hw.vendor": table("vendor"),
            "ch1.hw.cite": table("cite"), "ch1.hw.pipes": table("pipes"),
            "ch1.hw.pipe_bits": table("pipe_bits"),
            "ch1.hw.vector_bits": th["vector_bits"], "ch1.hw.lanes": lanes,
            "ch1.hw.fmas_per_cycle": max(1, th["lanes"] // lanes),
            "ch1.hw.loads_per_cycle": table("loads_per_cycle"),
            "ch1.hw.load_bits": table("load_bits"),
            "ch1.hw.l2_inclusive": table("l2_inclusive"),
            "ch1.hw.l3_inclusive": table("l3_inclusive")}


def reference_values() -> dict:
    """The reference series' figures the pages quote (published, not measured here: they
    need no record)."""
    f = figures.fmt
    return {
        "ref.machine": reference.MACHINE,
        "ref.ch1_f32_peak": f(reference.CH1_F32_PEAK_GOPS, "Gop/s"),
        "ref.ch2_naive": f(reference.CH2_GEMM_1024_NAIVE_GOPS, "Gop/s"),
        "ref.ch2_final": f(reference.CH2_GEMM_1024_FINAL_GOPS, "Gop/s"),
        "ref.ch2_naive_below_peak": f(reference.CH1_F32_PEAK_GOPS
                                      / reference.CH2_GEMM_1024_NAIVE_GOPS)}


def _typed_values(rec: dict, sm: dict) -> dict:
    """The page's typed values (numbers, booleans, names; the page formats them): the clock
    under the FMA probe against the peak's, the model number's row of the table, the theory's
    factors, and (:func:`_dot_values`, :func:`_scaling_values`) each dot probe's accumulators
    and instructions a cycle, AMX against the vendor's rate, and each level's scaling from one
    core to all."""
    cores, th = sm["cores"], sm["theory"]
    caches = rec["machine"]["caches"]
    ghz = th["clock_ghz"]  # the peak's clock: the larger of the two chains'
    table = th["table"]  # the row the model number alone finds (None: no row)
    peak = sm["peak"]
    out = {
        "ch1.clock_peak": ghz,
        # the naive product's column of B in the L1 and the L2 (None: the ways not recorded)
        "ch1.naive.l1_lines": column_lines_held(caches["L1d_bytes"], caches.get("L1d_ways", 0),
                                                4 * sm["naive_n"]) or None,
        "ch1.naive.l2_lines": column_lines_held(caches["L2_bytes"], caches.get("L2_ways", 0),
                                                4 * sm["naive_n"]) or None,
        "ch1.naive.l1_ways": caches.get("L1d_ways") or None,
        "ch1.clock_mul_ghz": sm["clock_mul_ghz"] if sm["clock_mul_ghz"] == sm["clock_mul_ghz"] else None,
        "ch1.clock_f32_ghz": sm["clock_f32_ghz"],
        "ch1.clock_f32_ratio": sm["clock_f32_ghz"] / ghz,
        # the FMA probe's clock more than the noise (5 %) below the chains': say so
        "ch1.clock_f32_low": sm["clock_f32_ghz"] < 0.95 * ghz,
        "ch1.model.core": table and table["core"],
        "ch1.model.agrees": None if table is None else bool(table["agrees"]),
        "ch1.model.family": None if table is None else table["family"],
        "ch1.model.number": None if table is None else table["model"],
        "ch1.model.flops_per_cycle": None if table is None else table["flops_per_cycle_per_core"],
        "ch1.flops_per_cycle_n": th["flops_per_cycle_per_core"],
        "ch1.flops_per_cycle_measured_n": th["measured_flops_per_cycle"],
        "ch1.theory_probe_gops_n": th["probe_gops_core"],
        "ch1.probe_one_thread": th["probe_from"] == "one thread",
        "ch1.has_read": "read_plateaus" in sm,
        "ch1.amx_measured": ("amx_bf16", 1) in peak,
    }
    out.update(_dot_values(rec, sm))
    out.update(_scaling_values(sm))
    return out


def _dot_values(rec: dict, sm: dict) -> dict:
    """The dot probes' accumulators each run kept (one core's, all cores') and the
    instructions one core started a cycle at the peak's clock; AMX's tiles against the
    vendor's rate, at the peak's clock and at the clock the FMA probe implies. A core's rate
    is the f32 peak's (:func:`smallem.cpu.machine.peak_theory`): the better of one thread's
    rate and all cores' rate over the physical cores, so that one disturbed probe cannot
    halve it; ``*_from_all`` says which it took."""
    cores, th, peak = sm["cores"], sm["theory"], sm["peak"]
    ghz = th["clock_ghz"]
    out = {}
    runs = {(r["params"]["kind"], r["params"]["threads"]): r["params"]
            for r in records.results(rec, "peak")}

    def per_core(kind):  # (operations a second on one core, taken from all cores' run)
        one = peak[kind, 1]
        every = peak.get((kind, cores), math.nan) / th["cores"]
        return (every, True) if every > one else (one, False)

    for kind in ("bf16", "int8"):
        native = bool(sm["native"].get(kind)) and th["vector_bits"] == 512
        for who, t in (("one", 1), ("all", cores)):
            chains = runs.get((kind, t), {}).get("chains") if native else None
            out[f"ch1.chains.{kind}_{who}"] = chains
        rate, from_all = per_core(kind) if native else (None, None)
        out[f"ch1.dot.{kind}_per_cycle"] = rate / DOT_OPS[kind] / ghz if native else None
        out[f"ch1.dot.{kind}_from_all"] = from_all
    for kind in AMX_KINDS:
        key = kind[4:]
        have = (kind, 1) in peak
        rate, from_all = per_core(kind) if have else (None, None)
        rated = machine.AMX_OPS_PER_CYCLE[kind]
        out[f"ch1.tiles.{key}_all"] = peak[kind, cores] if have else None
        out[f"ch1.tiles.{key}_from_all"] = from_all
        out[f"ch1.tiles.{key}_per_cycle"] = rate / ghz if have else None
        out[f"ch1.tiles.{key}_rated"] = rated if have else None
        out[f"ch1.tiles.{key}_of_rated"] = rate / ghz / rated if have else None
        # the same at the clock the FMA probe implies (the chains' clock may not be the one
        # a core keeps under heavy vector or tile work)
        out[f"ch1.tiles.{key}_of_rated_f32_clock"] = (
            rate / sm["clock_f32_ghz"] / rated if have else None)
        # the clock at which Intel's rate would give the measured one (GHz)
        out[f"ch1.tiles.{key}_clock_to_close_ghz"] = rate / rated if have else None
    return out


def _scaling_values(sm: dict) -> dict:
    """Each level's triad plateau, all cores over one, and whether it fell short of the
    cores' count; the read-only stream from DRAM against the triad's counted and moved
    bytes."""
    cores = sm["cores"]
    out = {}
    stairs = sm["triad_plateaus"]
    for lv in LEVELS:
        one, every = stairs[1][lv], stairs[cores][lv]
        r = every / one if one == one and every == every and one else None
        out[f"ch1.scale.triad_{lv.lower()}"] = r
        # a level that gave less than cores x one core's, by more than the noise (5 %)
        out[f"ch1.scale.{lv.lower()}_short"] = r is not None and r < 0.95 * cores
    # the same cores' FMA probe and read-only stream from L1, beside the triad's private levels
    fma = sm["peak"].get(("f32", cores), math.nan) / sm["peak"][("f32", 1)]
    out["ch1.scale.fma"] = fma if fma == fma else None
    out["ch1.scale.fma_short"] = fma == fma and fma < 0.95 * cores
    read = sm.get("read_plateaus")
    r = read[cores]["L1"] / read[1]["L1"] if read and cores in read and 1 in read else math.nan
    out["ch1.scale.read_l1"] = r if r == r else None
    # a private level whose all-core plateau fell below one core's alone (by more than the
    # noise): no sharing explains it, the all-core run was disturbed
    below, above = [], []
    for kernel, name in (("triad", "triad"), ("read", "read-only stream")):
        st = sm.get(f"{kernel}_plateaus")
        if not st or cores not in st or 1 not in st or cores == 1:
            continue
        for lv in ("L1", "L2"):
            one, every = st[1][lv], st[cores][lv]
            if one == one and every == every and every < 0.95 * one:
                below.append(f"{lv} {name}")
            # more than cores x one core's, by more than the noise: the one-core run was low
            if one == one and every == every and every > 1.05 * cores * one:
                above.append(f"{lv} {name}")
    out["ch1.scale.below_one"] = below
    out["ch1.scale.above_cores"] = above
    for who, t in (("core", 1), ("all", cores)):
        if "read_plateaus" in sm:
            read, triad = sm["read_plateaus"][t]["DRAM"], sm["triad_plateaus"][t]["DRAM"]
            out[f"ch1.dram_read.{who}_vs_counted"] = read / triad if triad == triad else None
            out[f"ch1.dram_read.{who}_vs_moved"] = (read / (triad * 32 / 24) if triad == triad
                                                    else None)
        else:
            out[f"ch1.dram_read.{who}_vs_counted"] = out[f"ch1.dram_read.{who}_vs_moved"] = None
    for who, key in (("core", "below_moved"), ("all", "all_below_moved")):
        moved = out[f"ch1.dram_read.{who}_vs_moved"]  # below by more than the noise (5 %)
        out[f"ch1.dram_read.{key}"] = moved is not None and moved < 0.95
    return out

DOT_OPS = {"bf16": 64, "int8": 128}  # operations one 512-bit vdpbf16ps / vpdpbusd does


def _theory_values(th: dict, cores: int) -> dict:
    """The theoretical peak's factors as the page quotes them, and the table's cross-check."""
    f = figures.fmt
    return {
        "ch1.flops_per_cycle": str(th["flops_per_cycle_per_core"]),
        "ch1.theory_clock": f(th["clock_ghz"], "GHz"),
        "ch1.theory_clock_chain": {"add": "adds", "mul": "multiplies"}[th["clock_chain"]],
        "ch1.f32_theory_core": f(th["gops_per_core"], "Gop/s"),
        "ch1.f32_theory_all": f(th["gops_all"], "Gop/s"),
        **_table_values(th)}


def _table_values(th: dict) -> dict:
    """The cross-check against the table of vendors' manuals: its row for the record's model
    number, and a sentence that says where it disagrees with the measurement (where it
    agrees, or has no row, a short one that says so: every value of a page is a non-empty
    string, so that a missing one shows)."""
    table = th["table"]
    if table is None:
        return {"ch1.fma_table": "no row (the record names no model, or one the table lacks)",
                "ch1.fma_table_check": "The measurement stands alone."}
    check = "The measurement agrees with it." if table["agrees"] else (
        f"The measurement says {th['flops_per_cycle_per_core']} operations per cycle, not "
        f"{table['flops_per_cycle_per_core']}: the hypervisor may mask the model (this core "
        f"reports family {table['family']}, model {table['model']}).")
    return {"ch1.fma_table": f"“{table['source']}”, {table['flops_per_cycle_per_core']} "
                             f"operations per cycle",
            "ch1.fma_table_check": check}


def _plateau_values(sm: dict, top: int) -> dict:
    """Each level's triad and read-only plateau on one core and on all, and the read
    stream against the triad's counted bytes from DRAM."""
    f = figures.fmt
    values = {}
    for th in (1, sm["cores"]):
        who = "core" if th == 1 else "all"
        for level in LEVELS:
            values[f"ch1.{level.lower()}_{who}"] = _bandwidth_text(sm, top, th, level)
            values[f"ch1.{level.lower()}_read_{who}"] = (
                _bandwidth_text(sm, top, th, level, "read") if "read_plateaus" in sm
                else "not measured (a record from before the read-only stream)")
            # the largest working set inside the level's stretch (where later chapters read
            # that a level "holds" a size, at most its reported size: level_of)
            held = level_sizes(sm["caches"], th).get(level) if sm.get("caches") else None
            for kernel, key in (("triad", ""), ("read", "read_")):
                span = sm.get(f"{kernel}_spans", {}).get(th, {}).get(level)
                end = span["last"] if span and span["last"] == span["last"] else None
                values[f"ch1.{level.lower()}_{key}{who}_end"] = (
                    "—" if end is None else compare.size(end / KiB) + (
                        f" (past the {compare.size(held / KiB)} it holds)"
                        if held and end > held else ""))
    values.update(_l1_read_values(sm))
    return values


def _l1_read_values(sm: dict) -> dict:
    """One core's L1 read-only stream against the triad's counted figure: the triad counts
    its store's bytes too (12 of every 12 bytes it moves, 4 of them stored), and a store goes
    through a port of its own beside the loads, so the triad's loads alone ran at two thirds
    of its figure; and both as bytes a cycle at the peak's clock (the larger chain's)."""
    f = figures.fmt
    try:
        read, triad = sm["read_plateaus"][1]["L1"], sm["triad_plateaus"][1]["L1"]
        ghz = sm["theory"]["clock_ghz"]  # the peak's clock, as the page says
    except (KeyError, TypeError):
        return {"ch1.l1_read_below_triad": False, "ch1.l1_read_below_loads": False,
                "ch1.l1_triad_loads": "n/a",
                "ch1.l1_read_bytes_cycle": "n/a", "ch1.l1_triad_loads_cycle": "n/a"}
    return {"ch1.l1_read_below_triad": 2 * triad / 3 <= read < triad,
            "ch1.l1_read_below_loads": read < 2 * triad / 3,
            "ch1.l1_triad_loads": f(2 * triad / 3, "GB/s"),
            "ch1.l1_read_bytes_cycle": f(read / ghz, "bytes"),
            "ch1.l1_triad_loads_cycle": f(2 * triad / 3 / ghz, "bytes")}




def table_markdown(rec: dict) -> str:
    rows, _ = table_rows(rec)
    cores = max(rec["settings"]["threads"])
    return figures.table_markdown(
        rows, ["Measure", "This machine, 1 core", f"This machine, {cores} cores",
               "Reference, per core", f"Reference, {reference.CORES} cores"],
        note=f"This machine: {figures.machine_line(rec)}. " + _disturbed_note(summary(rec)) +
             f"Reference: {reference.MACHINE.split(' vs ')[0]}, as published in {reference.CITE}; "
             f"its per-core figure is its {reference.CORES}-core figure "
             f"divided by {reference.CORES}, except the naive product's, which is one "
             f"thread's.")


def fallback_name(kind: str) -> str:
    """What the bf16 or int8 dot probe timed on a CPU without the instruction."""
    return f"{DOT_FALLBACK[kind]} (the probe's fallback: no {DOT_INSTRUCTION[kind]})"


def narrow_paths(sm: dict) -> dict:
    """For bf16 and int8: [(path, Gop/s on one core, on all cores)] measured here, fastest last.

    bf16 can always be widened to f32 for the FMAs (the f32 peak bounds that path); its dot
    instruction runs where the CPU has it, else the probe times the widening fallback.
    """
    cores = sm["cores"]
    out = {}
    for kind in ("bf16", "int8"):
        rows = []
        if kind == "bf16" and sm["native"][kind]:  # else the probe timed the widening itself
            rows.append((f"{DOT_FALLBACK[kind]} (at most the f32 peak)", sm["peak"]["f32", 1],
                         sm["peak"]["f32", cores]))
        dot = DOT_INSTRUCTION[kind] if sm["native"][kind] else fallback_name(kind)
        rows.append((dot, sm["peak"][kind, 1], sm["peak"][kind, cores]))
        if ("amx_" + kind, 1) in sm["peak"]:
            rows.append((f"AMX tiles, {DOT_INSTRUCTION['amx_' + kind]}",
                         sm["peak"]["amx_" + kind, 1], sm["peak"]["amx_" + kind, cores]))
        out[kind] = sorted(rows, key=lambda r: r[2])
    return out


def fma_pipes_rows(this_core: str | None, model_core: str | None = None) -> list[list]:
    """The table of core facts (:data:`smallem.cpu.machine.CORE_FACTS`), one row a core:
    this CPU's row marked, and the row its model number alone reads as where that differs
    (a masked model)."""
    def known(x, yes="yes", no="no"):
        return "—" if x is None else (yes if x is True else no if x is False else str(x))

    rows = []
    for name, row in machine.CORE_FACTS.items():
        f32_widest = 2 * row["pipes"] * min(row["pipe_bits"], 512) // 32
        mark = (f"**{name}** (this CPU)" if name == this_core else
                f"{name} (this CPU's model number)" if name == model_core else name)
        loads = ("—" if row["loads_per_cycle"] is None
                 else f"{row['loads_per_cycle']} × {row['load_bits']} bits")
        rows.append([mark, f"{row['pipes']} × {row['pipe_bits']} bits", row["how"] or "—",
                     str(f32_widest), loads, known(row["l2_inclusive"]),
                     known(row["l3_inclusive"]),
                     f"[{row['vendor']}](bibliography.md#{row['cite']})"])
    return rows


def report(rec_dir) -> dict:
    """Chapter 1's tables and figures and the page's values; none without its record (the
    book then leaves the chapter out)."""
    if not records.exists(RECORD, rec_dir):
        return reference_values()
    rec = records.load(RECORD, rec_dir)
    f = figures.fmt
    _, values = table_rows(rec)
    figures.write(figures.tables_dir() / "ch1_machine.md", table_markdown(rec))
    cores = max(rec["settings"]["threads"])
    figures.write_table(
        "ch1_narrow", [[kind, path, f(one, "Gop/s"), f(all_, "Gop/s")]
                       for kind, paths in narrow_paths(summary(rec)).items()
                       for path, one, all_ in paths],
        ["Numbers", "Path (slowest first)", "1 core", f"{cores} cores"],
        note=f"This machine: {figures.machine_line(rec)}.")
    table = summary(rec)["theory"]["table"]
    model_core = table and table["core"]
    figures.write_table(
        "ch1_fma_pipes", fma_pipes_rows(values["ch1.hw.core"], model_core),
        ["Core", "FMA pipes", "Wider vectors", "f32 operations a cycle (widest vectors)",
         "L1 vector loads a cycle", "L2 inclusive of L1", "L3 inclusive", "Source"],
        note="—: the source does not settle it for every core of the row.")
    staircase_figure(rec)
    n = rec["settings"]["gemm_naive_n"]
    roofline_figure([(f"naive {n}³ product", naive_gemm_intensity(n),
                      records.value(rec, "gemm_naive"))], "ch1_roofline",
                    {**summary(rec), "record": rec})
    return values


def summary_lines(data: dict) -> list[str]:
    """What `smallem machine` prints of a ``ch1.machine`` record: the machine, the
    theoretical peak's source and the table's cross-check, the table's rows and the figures
    a reader checks first."""
    rows, values = table_rows(data)
    width = max(len(r[0]) for r in rows)
    return ([figures.machine_line(data),
             f"theoretical f32 peak: {summary(data)['theory']['source']}; "
             f"the table of vendors' manuals: {values['ch1.fma_table']}"]
            + ([values["ch1.fma_table_check"]] if values["ch1.fma_table_check"] else [])
            + [f"  {r[0]:<{width}}  " + "  ".join(f"{c:>14}" for c in r[1:]) for r in rows]
            + [f"  DRAM triad (one core, bytes moved) vs numpy's copy: "
               f"{values['ch1.dram_moved_vs_numpy']}; f32 measured / theoretical: "
               f"{values['ch1.f32_fraction']}; staircase: levels close or not reached: "
               f"{values['ch1.staircase_close']}"])
