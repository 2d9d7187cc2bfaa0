"""Chapter 2's record read into the page's tables, figures and values."""

from __future__ import annotations

import math

from smallem.plumbing import build
from smallem.product.gemm import (FMA_LATENCY, FMA_PIPES, LADDER, PHASES, REGISTER_FILE,
                                  THREAD_MIN_OPS, cache_geometry)
from .. import ch1, compare, figures, records, reference
from .measuring import RECORD, model_shapes
from .bf16 import DTYPE_HEADER, amx_ladder, amx_values, bf16_elsewhere, dtype_rows, native_values
from .diffs import RUNG_SECTIONS, snippet, write_rung_diffs  # noqa: F401 (the page's)
from .blocks import PREDATES_ROWS, b_packed_whole, kc_rows, rows_fed, sweep_values as _sweep_values
from .order import order_values
from .kernel import block_values, latency_values
from .alone import NOISE, _plateau_of, alone_rows as _alone_rows  # noqa: F401
from .phases import block_width, pack_a_expect, pack_b_expect, phase_gap as _phase_gap

# what a value needs that a record made before rung 5 had blocks of its own lacks


def same_product_values(rec: dict) -> dict:
    """The first of the model's products as each run on the page timed it (typed Gop/s, None
    where a run lacks it): beside numpy ("shape"), the phase entry point (2MNK over its
    median call), all of B at once and a slice at a time, the dtype table's f32 inputs; and
    the spread of those rates (largest over smallest, minus one)."""
    pairs = shape_pairs(rec)
    if not pairs:
        return dict.fromkeys(["ch2.same_label", "ch2.same_spread", "ch2.cube_spread"]
                             + [f"ch2.same_{k}" for k in ("shape", "phase", "whole", "slices",
                                                           "dtype")]
                             + [f"ch2.cube_{k}" for k in ("rung5", "sweep", "dtype")])
    label, ours, _ = pairs[0]
    p = records.results(rec, "shape", impl="smallem", label=label)[0]["params"]
    M, N, K = p["M"], p["N"], p["K"]
    wall = records.results(rec, "phase", label=label, phase="wall")
    whole = {r["params"]["b"]: records.median(r) for r in records.results(rec, "whole_b")
             if r["params"]["label"] == label}
    dtype = records.results(rec, "dtype", dtype="f32", M=M, K=K, N=N)
    runs = {"shape": ours,
            "phase": (2.0 * M * N * K / 1e9 / (records.median(wall[0]) / 1e3)
                      if wall and records.median(wall[0]) > 0 else None),
            "whole": whole.get("whole"), "slices": whole.get("slices"),
            "dtype": records.median(dtype[0]) if dtype else None}
    got = [v for v in runs.values() if v]
    # the ladder's size n³ likewise: rung 5 in the ladder, the package's matmul in the sizes
    # sweep, the dtype table's f32 inputs
    n = rec["settings"]["n_ladder"]

    def one(kind, **kw):
        found = records.results(rec, kind, **kw)
        return records.median(found[0]) if found else None
    cube = {"rung5": one("rung", rung=5, M=n), "sweep": one("sweep", impl="smallem", n=n),
            "dtype": one("dtype", dtype="f32", M=n, K=n, N=n)}
    have = [v for v in cube.values() if v]
    return {"ch2.same_label": _short(label),
            **{f"ch2.same_{k}": v for k, v in runs.items()},
            "ch2.same_spread": max(got) / min(got) - 1 if len(got) > 1 else None,
            **{f"ch2.cube_{k}": v for k, v in cube.items()},
            "ch2.cube_spread": max(have) / min(have) - 1 if len(have) > 1 else None}


def whole_b_values(rec: dict) -> dict:
    """The chapter's words on packing all of B at once, from the "whole_b" results."""
    f = figures.fmt
    found = {r["params"]["b"]: r for r in records.results(rec, "whole_b")}
    if set(found) != {"whole", "slices"}:  # no product's B was small enough at these blocks
        return dict.fromkeys(("ch2.whole_b_label", "ch2.whole_b_mib", "ch2.whole_b_slices",
                              "ch2.whole_b_gops", "ch2.slices_gops", "ch2.whole_b_vs"))
    p, w, s = found["whole"]["params"], found["whole"]["value"], found["slices"]["value"]
    return {"ch2.whole_b_label": _short(p["label"]),
            "ch2.whole_b_mib": f"{p['K'] * p['N'] * 4 / 2**20:.0f} MiB",
            "ch2.whole_b_slices": str(math.ceil(p["K"] / p["kc"])),
            "ch2.whole_b_gops": f(w["median"], "Gop/s"),
            "ch2.slices_gops": f(s["median"], "Gop/s"),
            "ch2.whole_b_vs": compare.versus(found["whole"], found["slices"])}


def _phase_calls(rec: dict) -> str:
    found = records.results(rec, "phase", phase="wall")
    return str(found[0]["value"]["n"]) if found else "n/a"


def phase_rows(rec: dict) -> tuple[list[list], dict]:
    """Table ch2_phases: each model product's time per call and its shares by phase."""
    rows, shares, a_shares = [], {}, {}
    for label, *_ in shape_pairs(rec):
        found = {r["params"]["phase"]: r for r in records.results(rec, "phase", label=label)}
        if set(found) != {*PHASES, "wall"}:
            continue
        p = found["wall"]["params"]
        ms = {k: records.median(r) for k, r in found.items()}
        busy = sum(ms[k] for k in PHASES)
        pct = {k: 100 * ms[k] / busy for k in PHASES}
        wait = pct["wait after packing B"] + pct["wait at the end"]
        name, mib = _short(label), p["K"] * p["N"] * 4 / 2**20
        shares[name], a_shares[name] = (pct["pack B"], mib, p["M"]), (pct["pack A"],
                                                                      block_width(rec, p["N"]))
        rows.append([name, f"{p['M']}", figures.fmt(mib, "MiB"),
                     figures.fmt(ms["wall"], "ms"), f"{pct['pack B']:.1f} %",
                     f"{pct['pack A']:.1f} %", f"{pct['tiles']:.1f} %", f"{wait:.1f} %"])
    if not shares:
        na = "n/a (not measured in this record)"
        return rows, {k: na for k in ("ch2.phase_most", "ch2.phase_most_pct", "ch2.phase_most_m",
                                      "ch2.phase_most_mib", "ch2.phase_least",
                                      "ch2.phase_least_pct", "ch2.phase_least_m",
                                      "ch2.phase_least_mib")} | dict.fromkeys(
            ("ch2.phase_a_narrow", "ch2.phase_a_narrow_n", "ch2.phase_a_narrow_pct",
             "ch2.phase_a_wide", "ch2.phase_a_wide_n", "ch2.phase_a_wide_pct",
             "ch2.phase_a_follows", "ch2.phase_a_odd", "ch2.phase_a_odd_n", "ch2.phase_a_odd_pct",
             "ch2.phase_a_odd_expect_lo", "ch2.phase_a_odd_expect_hi",
             "ch2.phase_most_expect_lo", "ch2.phase_most_expect_hi", "ch2.phase_others_spread",
             "ch2.phase_most_share"))
    most = max(shares, key=lambda k: shares[k][0])
    least = min(shares, key=lambda k: shares[k][0])
    # the product whose share of packing A lies furthest above 1/N: the largest share x N,
    # set against what 1/N scales from each other product's share
    a_odd = max(a_shares, key=lambda k: a_shares[k][0] * a_shares[k][1])
    a_expect = pack_a_expect(a_shares, a_odd)
    # the 1/N rule shown on the narrowest and the widest product (by N), and whether the
    # measured shares fall in that order
    narrow = min(a_shares, key=lambda k: a_shares[k][1])
    wide = max(a_shares, key=lambda k: a_shares[k][1])
    values = pack_b_expect(shares, most) | {"ch2.phase_a_narrow": narrow, "ch2.phase_a_narrow_n": a_shares[narrow][1],
              "ch2.phase_a_narrow_pct": a_shares[narrow][0] / 100,
              "ch2.phase_a_wide": wide, "ch2.phase_a_wide_n": a_shares[wide][1],
              "ch2.phase_a_wide_pct": a_shares[wide][0] / 100,
              "ch2.phase_a_follows": a_shares[narrow][0] >= a_shares[wide][0],
              # shown where it is neither product the 1/N sentence names and its share is
              # more than what 1/N scales from every other product's
              "ch2.phase_a_odd": (a_odd if a_odd not in (narrow, wide)
                                  and a_expect["ch2.phase_a_odd_expect_hi"] is not None
                                  and a_shares[a_odd][0] > 100 * a_expect["ch2.phase_a_odd_expect_hi"]
                                  else None),
              "ch2.phase_a_odd_n": a_shares[a_odd][1],
              "ch2.phase_a_odd_pct": a_shares[a_odd][0] / 100} | a_expect
    for key, name in (("most", most), ("least", least)):
        pct, mib, m = shares[name]
        values.update({f"ch2.phase_{key}": name, f"ch2.phase_{key}_pct": f"{pct:.1f} %",
                       f"ch2.phase_{key}_m": str(m), f"ch2.phase_{key}_mib": figures.fmt(mib, "MiB")})
    return rows, values


def _peak(rec: dict, rec_dir) -> tuple[float, str]:
    """The page's one f32 peak on all cores: chapter 1's FMA probe from its record (the peak
    its roofline and the home page show, the run of :func:`_peak_core`), else this run's."""
    facts = ch1.facts(rec_dir)
    if facts is None:
        return records.value(rec, "peak_f32"), "this run's probe"
    return facts["peak"][("f32", facts["cores"])], "chapter 1's record"


def _peak_core(rec: dict, rec_dir) -> float:
    """One core's f32 peak: chapter 1's one-core probe, else the page's peak over the cores."""
    facts = ch1.facts(rec_dir)
    if facts is None:
        return _peak(rec, rec_dir)[0] / rec["settings"]["threads"]
    return facts["peak"][("f32", 1)]


def blocking_verdict(gain: float) -> str:
    """What rung 2 (blocking alone, expected to change little) did, from its measured gain."""
    return ("is slower here" if gain < 0.95 else "buys little" if gain <= 1.1 else
            "helps a little" if gain <= 1.3 else "helps somewhat" if gain <= 1.6 else
            "helps a great deal here")


def predicted(rec: dict, facts: dict | None) -> dict[int, tuple[float, str]]:
    """What the hardware predicts for each rung on the ladder's n^3 product: rung index ->
    (Gop/s, the bound that sets it), from chapter 1's measurements (clock, one core's and all
    cores' f32 peaks, each level's bandwidth, read-only where chapter 1 measured it, and where
    its plateau ends) and the
    kernel's shape; {} without chapter 1's record. Each bound is the tightest of a few limits:

    - rung 0: the chain ``sum += a * b`` completes one FMA (2 operations) per FMA latency;
      and each step fetches one 64-byte line of B's column, from the first level whose sets
      hold the whole column at its 4n-byte stride (chapter 1's ``column_lines_held``);
    - rungs 1 and 2: 4 bytes of B per FMA from the level that holds what the inner loops
      sweep per row of A (all of B; the K_C x N_C block), and one vector store of C per
      vector FMA, at one store a cycle;
    - rung 3: the micro-kernel's FMAs against its loads (M_R broadcasts and N_R / V vectors
      per step, two loads a cycle): one core's measured peak unless the loads bind;
    - rung 4: one core's measured peak; rung 5: all cores' (:func:`_peak`), or the feed of its
      block of B where that binds first (:func:`.blocks.rows_fed`)."""
    if facts is None:
        return {}
    s = rec["settings"]
    n, mr, nr = s["n_ladder"], s["mr"], s["nr"]
    vec = REGISTER_FILE[s["isa"]][0]
    ghz = facts["theory"]["clock_ghz"]  # the peak's clock: the larger of chapter 1's two chains
    one, cores = facts["peak"][("f32", 1)], facts["peak"][("f32", facts["cores"])]
    caches = facts["record"]["machine"]["caches"]
    out = {}
    chain = 2 * ghz / FMA_LATENCY
    level = "L3"
    for lv, key in (("L1", "L1d"), ("L2", "L2")):
        if ch1.column_lines_held(caches.get(f"{key}_bytes", 0), caches.get(f"{key}_ways", 0),
                                 4 * n) >= n:
            level = lv
            break
    stream = ch1.read_stream(facts)  # B is only read: the read-only stream where measured
    lines = facts[f"{stream}_plateaus"][1][level] * 2 / 64
    out[0] = ((chain, f"one FMA per {FMA_LATENCY} cycles (the chain)") if chain <= lines else
              (lines, f"a 64-byte line of B per FMA from {level}"))
    stores = 2 * vec * ghz
    ladder = s["blocks_ladder"]
    for i, swept in ((1, 4 * n * n), (2, 4 * ladder["kc"] * min(ladder["nc"], n))):
        lv, bw = ch1.level_of(facts, swept, 1, stream)
        b_bound = bw * 2 / 4
        out[i] = ((b_bound, f"4 bytes of B per FMA from {lv}") if b_bound <= stores else
                  (stores, "one store of C per vector FMA"))
    fmas, loads = mr * nr / vec, mr + nr / vec
    share = min(1.0, (fmas / FMA_PIPES) / (loads / 2))
    out[3] = (one * share, "one core's peak" if share == 1 else "the micro-kernel's loads")
    out[4] = (one, "one core's peak")
    out[5] = min((cores, f"{facts['cores']} cores' peak"), rows_fed(s, facts, stream) or (math.inf, ""))
    return out


def ladder_rows(rec: dict, rec_dir=None) -> tuple[list[list], dict]:
    """Chapter 2's ladder table (numpy, each rung with its gain and its prediction, the
    peak) and the values the page quotes."""
    f = figures.fmt
    s = rec["settings"]
    n = s["n_ladder"]
    cores = s["threads"]
    ladder = s["blocks_ladder"]
    rows5 = s.get("blocks_rows")
    no5 = records.not_measured(rec, PREDATES_ROWS)
    peak, peak_src = _peak(rec, rec_dir)
    numpy_all = records.value(rec, "numpy", threads=cores, M=n)
    numpy_one = records.value(rec, "numpy", threads=1, M=n)
    pred = predicted(rec, ch1.facts(rec_dir))
    rows, gains = _ladder_table(rec, n, cores, peak, peak_src, pred, numpy_all, numpy_one,
                                _peak_core(rec, rec_dir))
    final = records.value(rec, "rung", rung=LADDER["threads"].index, M=n)
    naive = records.value(rec, "rung", rung=LADDER["naive"].index, M=n)
    values = {
        "ch2.n": str(n),
        "ch2.column_stride": compare.size(4 * n / 1024),  # rung 0's step down a column of B
        "ch2.threads": str(cores),
        "ch2.mr": str(s["mr"]), "ch2.nr": str(s["nr"]),
        "ch2.mc": str(ladder["mc"]), "ch2.kc": str(ladder["kc"]), "ch2.nc": str(ladder["nc"]),
        "ch2.nc_taken": (s.get("blocks") or ladder)["nc"], "ch2.kc_taken": (s.get("blocks") or ladder)["kc"],
        "ch2.widest_n": str(max(s["sweep"])),
        # typed facts the page chooses its sections by: an older record lacks rung 5's blocks
        "ch2.has_rows_blocks": rows5 is not None,
        "ch2.record_commit": str(rec.get("commit") or "unknown")[:7],
        "ch2.kc5": str(rows5["kc"]) if rows5 else no5,
        "ch2.nc5": str(rows5["nc"]) if rows5 else no5,
        "ch2.peak": f(peak, "Gop/s"), "ch2.peak_source": peak_src,
        "ch2.final_gops": f(final, "Gop/s"),
        "ch2.final_pct_peak": f"{100 * final / peak:.0f} %",
        "ch2.final_over_peak": final / peak,
        "ch2.final_vs_numpy": f"{100 * final / numpy_all:.0f} %",
        "ch2.final_vs_numpy_test": compare.versus(
            records.results(rec, "rung", rung=LADDER["threads"].index, M=n)[0],
            records.results(rec, "numpy", threads=cores, M=n)[0]),
        "ch2.naive_gops": f(naive, "Gop/s"),
        "ch2.climb": f(final / naive),
        "ch2.machine": figures.machine_line(rec),
        "ch2.samples": str(records.results(rec, "rung", rung=LADDER["threads"].index)[0]["value"]["n"]),
        "ch2.blas": _blas_line(rec),
    }
    for rung in LADDER:
        g = records.value(rec, "rung", rung=rung.index, M=n)
        values[f"ch2.rung{rung.index}_gops"] = f(g, "Gop/s")
        if 0 < rung.index < len(LADDER) - 1:  # rung 5's gain is the page's one-core comparison
            values[f"ch2.rung{rung.index}_gain"] = f(gains[rung.index])
    values["ch2.rung2_verdict"] = blocking_verdict(gains[LADDER["blocked"].index])
    values.update(_prediction_values(rec, n, pred))
    values.update(_levels(rec, rec_dir))
    values.update(block_values(s, n, no5))
    values.update(latency_values(s, rec_dir))
    values.update(_load_values(s, values["ch2.hw_load_bits"], values["ch2.fmas_per_cycle"]))
    packed = records.value(rec, "rung", rung=LADDER["packed"].index, M=n)
    values["ch2.peak_core"] = f(_peak_core(rec, rec_dir), "Gop/s")
    values["ch2.packed_pct_core"] = figures.pct(packed / _peak_core(rec, rec_dir))
    values.update(_one_core_values(rec, n, final, numpy_all, numpy_one))
    return rows, values


def _prediction_values(rec: dict, n: int, pred: dict) -> dict:
    """Each rung measured over its prediction (typed; None without chapter 1's record), and
    the facts the page's sentences choose by: which rungs beat their model by more than the
    noise, and which of rungs 1 and 2 fell short of theirs or came within it."""
    ratio = {i: records.value(rec, "rung", rung=i, M=n) / gops for i, (gops, _) in pred.items()}
    values = {f"ch2.rung{i}_of_predicted": ratio.get(i) for i in range(len(LADDER))}
    values["ch2.has_predictions"] = bool(pred)
    values["ch2.rung0_by_chain"] = bool(pred) and pred[0][1].startswith("one FMA per")
    values["ch2.rung5_fed"] = bool(pred) and pred[5][1].startswith("a sliver")
    above = [i for i in sorted(ratio) if ratio[i] > 1 + NOISE]
    values["ch2.any_above_model"] = bool(above)
    values["ch2.rung2_above_model"] = 2 in above  # typed: rung 2's prose then says so
    values["ch2.above_model"] = compare.listing([f"rung {i}" for i in above], "none")
    short = [i for i in (1, 2) if i in ratio and ratio[i] < 1 - NOISE]
    close = [i for i in (1, 2) if i in ratio and abs(ratio[i] - 1) <= NOISE]
    for key, rungs in (("short", short), ("close", close)):
        values[f"ch2.loops_{key}"] = (("rung " if len(rungs) == 1 else "rungs ")
                                      + " and ".join(map(str, rungs))) if rungs else None
        values[f"ch2.loops_{key}_n"] = len(rungs)
    values["ch2.noise"] = NOISE
    return values


def _load_values(s: dict, bits: int | None, fmas_per_cycle: float) -> dict:
    """Loads a cycle the micro-kernel asks of the L1 at the FMA rate: per step N_R / V
    vectors of B, M_R broadcasts of A and a prefetch per line of B's row PF_B_BYTES ahead
    (kernels_c/gemm.c) for M_R N_R / V FMAs (a vector load wider than the L1's loads, in the
    one core table, counts as several)."""
    vec = REGISTER_FILE[s["isa"]][0]
    split = max(1, 32 * vec // bits) if bits else 1
    ahead = build.header_constant("PF_B_BYTES", "gemm.c")
    lines = -(-4 * s["nr"] // 64)
    return {"ch2.load_split": split, "ch2.pf_b_kib": ahead / 1024, "ch2.pf_b_lines": lines,
            "ch2.pf_b_steps": int(ahead // (4 * s["nr"])),
            "ch2.loads_per_cycle_needed": ((s["nr"] / vec * split + s["mr"] + lines)
                                           * fmas_per_cycle / (s["mr"] * s["nr"] / vec))}


def _levels(rec: dict, rec_dir) -> dict:
    """Where rungs 1 and 2 find B: the level of chapter 1's one-core staircase whose plateau
    still ran at the size their inner loops sweep per row of A (all of B; one K_C x N_C
    block), and where the L2's plateau ends (typed; None without chapter 1's record)."""
    facts = ch1.facts(rec_dir)
    s = rec["settings"]
    n, b = s["n_ladder"], s["blocks_ladder"]
    if facts is None:  # the sizes the OS reports, the only ones there are
        g = s["cache_geometry"]

        def reported(nbytes):
            return next((lv for lv, k in (("L1", "L1d"), ("L2", "L2"), ("L3", "L3"))
                         if nbytes <= g[k]["bytes"]), "DRAM")
        lv2 = reported(4 * b["kc"] * min(b["nc"], n))
        return {"ch2.rung1_level": reported(4 * n * n), "ch2.rung2_level": lv2,
                "ch2.b_block_level": lv2, "ch2.l2_plateau_end": None}
    stream = ch1.read_stream(facts)  # B is only read (as :func:`predicted` charges it)
    lv1, _ = ch1.level_of(facts, 4 * n * n, 1, stream)
    lv2, _ = ch1.level_of(facts, 4 * b["kc"] * min(b["nc"], n), 1, stream)
    end = facts[f"{stream}_spans"][1]["L2"]["last"]
    return {"ch2.rung1_level": lv1, "ch2.rung2_level": lv2, "ch2.b_block_level": lv2,
            "ch2.l2_plateau_end": compare.size(end / 1024)}


def _ladder_table(rec, n, cores, peak, peak_src, pred, numpy_all, numpy_one, peak_one):
    """The ladder's rows (each share of its cores' peak), each rung's gain over the last."""
    f = figures.fmt
    rows = [[f"numpy (OpenBLAS), {cores} threads", f(numpy_all, "Gop/s"),
             f"{100 * numpy_all / peak:.0f} %", "", "—", "—", "—", "—"]]
    if cores != 1:
        rows.append([f"numpy (OpenBLAS), 1 thread", f(numpy_one, "Gop/s"),
                     f"{100 * numpy_one / peak_one:.0f} %", "", "—", "—", "—", "—"])
    prev = None
    ref = {LADDER["naive"].index: reference.CH2_GEMM_1024_NAIVE_GOPS,
           LADDER["threads"].index: reference.CH2_GEMM_1024_FINAL_GOPS}
    gains = {}
    for rung in LADDER:
        g = records.value(rec, "rung", rung=rung.index, M=n)
        gains[rung.index] = g / prev if prev else float("nan")
        th = cores if rung.threaded else 1
        of = g / (peak if th > 1 else peak_one)
        rows.append([f"{rung.label}, {th} thread{'s' if th > 1 else ''}", f(g, "Gop/s"),
                     f"{100 * of:.1f} %" if of < 0.1 else f"{100 * of:.0f} %",
                     f"× {f(g / prev)}" if prev else "",
                     f"{f(pred[rung.index][0], 'Gop/s')} ({pred[rung.index][1]})"
                     if rung.index in pred else "no chapter 1 record",
                     figures.pct(g / pred[rung.index][0]) if rung.index in pred else "—",
                     # the reference's final rung ran on its 8 cores, its naive one on one
                     f(ref[rung.index] / (reference.CORES if rung.threaded else 1), "Gop/s")
                     if rung.index in ref else "—",
                     f(ref[rung.index], "Gop/s") if rung.index in ref and rung.threaded else "—"])
        prev = g
    rows.append([f"f32 FMA peak, {cores} cores ({peak_src})", f(peak, "Gop/s"), "100 %", "",
                 "—", "—", f(reference.CH1_F32_PEAK_GOPS / reference.CORES, "Gop/s"),
                 f(reference.CH1_F32_PEAK_GOPS, "Gop/s")])
    return rows, gains


def _one_core_values(rec: dict, n: int, final: float, numpy_all: float, numpy_one: float) -> dict:
    """The final GEMM on one core beside numpy on one core, and what threads add to each."""
    f = figures.fmt
    found = records.results(rec, "final_one_core", M=n)
    if not found:  # one core: rung 5's row is that comparison
        return {k: "n/a (one core)" for k in ("ch2.one_core_gops", "ch2.one_core_vs_numpy",
                                              "ch2.one_core_vs", "ch2.one_core_gain",
                                              "ch2.numpy_thread_gain", "ch2.numpy_1t_gops")
                } | {"ch2.one_core_gain_x": None}
    one = records.median(found[0])
    theirs = records.results(rec, "numpy", threads=1, M=n)[0]
    return {"ch2.one_core_gops": f(one, "Gop/s"),
            "ch2.one_core_vs_numpy": f"{100 * one / numpy_one:.1f} %",
            "ch2.one_core_vs": compare.versus(found[0], theirs),
            "ch2.one_core_gain": f(final / one), "ch2.one_core_gain_x": final / one,
            "ch2.numpy_thread_gain": f(numpy_all / numpy_one),
            "ch2.numpy_1t_gops": f(numpy_one, "Gop/s")}


def _blas_line(rec: dict) -> str:
    blas = [b for b in rec["settings"].get("blas_pinned", rec["settings"]["blas"])
            if b.get("user_api") == "blas"]
    if not blas:
        return "unknown BLAS"
    b = blas[0]
    layer = f", threading: {b['threading_layer']}" if b.get("threading_layer") else ""
    return f"{b.get('internal_api')} {b.get('version')}, kernel {b.get('architecture')}{layer}"


def sweep_rows(rec: dict, rec_dir=None) -> tuple[list[list], dict]:
    f = figures.fmt
    rows, values = [], {}
    peak, _ = _peak(rec, rec_dir)
    for s in (1024, 2048, 4096):  # keys the chapter quotes exist even for a quick run
        values[f"ch2.sweep_ratio_{s}"] = "n/a (not measured)"
    values["ch2.sweep_pct_peak_2048"] = "n/a (not measured)"
    values["ch2.sweep_over_peak_2048"] = None
    sizes = rec["settings"]["sweep"]
    for s in sizes:
        ours = records.value(rec, "sweep", impl="smallem", n=s)
        theirs = records.value(rec, "sweep", impl="numpy", n=s)
        rows.append([f"{s}³", f(ours, "Gop/s"), f(theirs, "Gop/s"),
                     f"{100 * ours / theirs:.1f} %", compare.rounds_text(_pair_rounds(rec, "sweep", n=s))])
        if s in (1024, 2048, 4096):
            values[f"ch2.sweep_ratio_{s}"] = f"{100 * ours / theirs:.0f} %"
        if s == 2048:
            values["ch2.sweep_pct_peak_2048"] = f"{100 * ours / peak:.0f} %"
            values["ch2.sweep_over_peak_2048"] = ours / peak
    # each size by the page's own rule: faster or slower where the test says so, else tied
    calls = {"faster": [], "tied": [], "slower": []}
    for size in sizes:
        d = _pair_difference(rec, "sweep", n=size)
        calls[{1: "faster", -1: "slower"}.get(d.sign if d else 0, "tied")].append(f"{size}³")
    for k, sz in calls.items():
        values[f"ch2.sweep_{k}"] = compare.listing(sz, "none of the sizes")
    values["ch2.sweep_any_slower"] = bool(calls["slower"])
    # the ladder's size is timed twice (the ladder's rounds and the sweep's): where the two
    # runs of rounds call it differently, the page says so
    n = rec["settings"]["n_ladder"]
    top = records.results(rec, "rung", rung=LADDER["threads"].index, M=n)
    ref = records.results(rec, "numpy", threads=rec["settings"]["threads"], M=n)
    ladder = compare.difference(top[0], ref[0]) if top and ref else None
    d = _pair_difference(rec, "sweep", n=n)
    values["ch2.sweep_n_disagrees"] = bool(ladder and d and ladder.sign != d.sign)
    # the two runs of rounds at that size: numpy's rate in each, and whether they differ by
    # more than 1 % (then the page's two ratios to numpy at that size differ, and it says why)
    ladder_np = records.value(rec, "numpy", threads=rec["settings"]["threads"], M=n) if ref else None
    sweep_np = (records.value(rec, "sweep", impl="numpy", n=n)
                if records.results(rec, "sweep", impl="numpy", n=n) else None)
    values["ch2.ladder_numpy_gops"] = ladder_np
    values["ch2.sweep_numpy_gops"] = sweep_np
    values["ch2.numpy_runs_differ"] = bool(ladder_np and sweep_np
                                           and abs(ladder_np / sweep_np - 1) > 0.01)
    # the ladder's rung 5 walks the tiles in rows; the package's GEMM takes the order the
    # loop-order model chose: where that is the columns, the two are different code paths
    values["ch2.sweep_path_differs"] = rec["settings"].get("order", "rows") != "rows"
    small = sizes[0]
    for impl, key in (("smallem", "ch2.call_us"), ("numpy", "ch2.numpy_call_us")):
        values[key] = f(records.value(rec, "call", impl=impl), "µs")
    values["ch2.smallest"] = f"{small}³"
    # matmul's own rule (auto_threads): a small product runs on fewer threads than the cores
    values["ch2.smallest_threads"] = max(1, min(rec["settings"]["threads"],
                                                2 * small ** 3 // THREAD_MIN_OPS))
    # The FMA probe timed between one size's samples: the product's share of it separates
    # a slow product from cores the host gave less of at the time.
    beside = records.results(rec, "peak_beside")[0]
    s, probe = beside["params"]["n"], records.median(beside)
    values["ch2.beside_n"] = f"{s}³"
    values["ch2.beside_peak"] = f(probe, "Gop/s")
    values["ch2.beside_over_peak"] = probe / peak if peak else None  # the host gave this run more
    for impl, key in (("smallem", "ch2.beside_pct"), ("numpy", "ch2.beside_numpy_pct")):
        values[key] = f"{100 * records.value(rec, 'sweep', impl=impl, n=s) / probe:.0f} %"
    for impl, key in (("smallem", "ch2.smallest_us"), ("numpy", "ch2.numpy_smallest_us")):
        values[key] = f(1e6 * records.results(rec, "sweep", impl=impl, n=small)[0]
                        ["seconds"]["median"], "µs")
    values["ch2.call_share"] = (records.value(rec, "call", impl="smallem") / 1e6  # two runs
                                / records.results(rec, "sweep", impl="smallem", n=small)[0]["seconds"]["median"])
    return rows, values


def _pair_difference(rec: dict, name: str, **params) -> compare.Difference | None:
    ours = records.results(rec, name, impl="smallem", **params)
    theirs = records.results(rec, name, impl="numpy", **params)
    return compare.difference(ours[0], theirs[0]) if ours and theirs else None


def _pair_rounds(rec: dict, name: str, **params) -> tuple[int, int] | None:
    ours = records.results(rec, name, impl="smallem", **params)
    theirs = records.results(rec, name, impl="numpy", **params)
    return compare.rounds_ahead(ours[0], theirs[0]) if ours and theirs else None


ROUNDS_HEADER = "rounds smallem ahead"


def shape_pairs(rec: dict) -> list[tuple[str, float, float]]:
    """(label, smallem's Gop/s, numpy's) for each of the model's products in a record."""
    labels = dict.fromkeys(r["params"]["label"] for r in records.results(rec, "shape"))
    return [(label, records.value(rec, "shape", impl="smallem", label=label),
             records.value(rec, "shape", impl="numpy", label=label)) for label in labels]


def shape_rows(rec: dict) -> tuple[list[list], dict]:
    f = figures.fmt
    rows, values = [], {}
    # the weights' gradient, xᵀ dY: its B is dY (the tokens by the hidden width)
    grad = next((sh for sh in model_shapes() if sh["ta"]), None)
    values["ch2.grad_b_whole"] = (b_packed_whole(rec, grad["N"], grad["K"]) if grad else None)
    for label, ours, theirs in shape_pairs(rec):
        p = records.results(rec, "shape", impl="smallem", label=label)[0]["params"]
        rows.append([label, f"{p['M']}×{p['K']}×{p['N']}", f(ours, "Gop/s"), f(theirs, "Gop/s"),
                     f"{100 * ours / theirs:.1f} %",  # a decimal: 99.6 % is not 100 %
                     compare.rounds_text(_pair_rounds(rec, "shape", label=label))])
    values.update(_shape_verdicts(rec))
    return rows, values


def _short(label: str) -> str:
    """A model product's name without its shapes: "x W1 (8192x768 · 768x3072)" -> "x W1"."""
    return label.split(" (")[0]


def _shape_verdicts(rec: dict) -> dict:
    """Which of the model's products the signed-rank test calls faster, slower, or a tie."""
    groups = {"faster": [], "slower": [], "tied": []}
    for label, ours, theirs in shape_pairs(rec):
        d = _pair_difference(rec, "shape", label=label)
        if d is None or d.rounds is None:
            return {f"ch2.shapes_{k}": "n/a (a record without samples)" for k in groups}
        groups[{1: "faster", -1: "slower"}.get(d.sign, "tied")].append(_short(label))
    return {f"ch2.shapes_{k}": compare.listing(v, "none") for k, v in groups.items()}


def pool_values(rec: dict, rec_dir=None) -> dict:
    f = figures.fmt
    empty = records.value(rec, "pool", what="empty_region")
    spawn = records.value(rec, "pool", what="spawn_join")
    ids = rec["settings"]["pool_ids"]
    same = all(i == ids[0] for i in ids)
    return {"ch2.pool_region_us": f(empty, "µs"), "ch2.pool_spawn_us": f(spawn, "µs"),
            "ch2.pool_ratio": f(spawn / empty),
            "ch2.pool_same": "the same" if same else "not the same",
            "ch2.pool_calls": str(len(ids)),
            "ch2.thread_min_mop": f"{THREAD_MIN_OPS / 1e6:.1f} million",
            # at the page's one-core peak
            "ch2.thread_min_us": f(THREAD_MIN_OPS / (_peak_core(rec, rec_dir) * 1e9) * 1e6, "µs")}


def cpu_title(rec: dict, rec_dir=None) -> str:
    """The CPU as a figure's title names it: the name written when a machine was captured
    (its folder's name.txt, beside the records: a hypervisor may mask the model string),
    else the model string the record holds."""
    from pathlib import Path
    if rec_dir is not None:
        p = Path(rec_dir).parent / "name.txt"
        if p.is_file() and p.read_text().strip():
            return p.read_text().strip()
    return rec["machine"]["cpu"]


def ladder_figure(rec: dict, peak: float, name: str = "ch2_ladder", rec_dir=None):
    import matplotlib.pyplot as plt

    n = rec["settings"]["n_ladder"]
    cores = rec["settings"]["threads"]
    labels = [r.label for r in LADDER]
    vals = [records.value(rec, "rung", rung=r.index, M=n) for r in LADDER]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    bars = ax.barh(labels[::-1], vals[::-1], color="#457b9d")
    for bar_, v in zip(bars, vals[::-1]):
        ax.text(v * 1.08, bar_.get_y() + bar_.get_height() / 2, figures.fmt(v, "Gop/s"),
                va="center", fontsize=8)
    ax.axvline(peak, color="black", lw=1.2, label=f"f32 peak, {cores} cores")
    ax.axvline(records.value(rec, "numpy", threads=cores, M=n), color="#e76f51", ls="--", lw=1.2,
               label=f"numpy, {cores} threads")
    ax.set_xscale("log")
    ax.set_xlim(min(vals) / 2, peak * 3)
    ax.set_xlabel(f"Gop/s, {n}³ f32 product (log scale)")
    ax.set_title(f"The ladder: {cpu_title(rec, rec_dir)}", fontsize=10)
    # the top of the plot holds rung 0, the shortest bar: the legend goes there, clear of
    # rung 5's bar and value at the bottom
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(True, axis="x", which="both", alpha=0.25)
    return figures.save(fig, name)


def sweep_figure(rec: dict, peak: float, name: str = "ch2_sweep"):
    import matplotlib.pyplot as plt

    sizes = rec["settings"]["sweep"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for impl, style in (("smallem", "o-"), ("numpy", "s--")):
        ax.plot(sizes, [records.value(rec, "sweep", impl=impl, n=s) for s in sizes], style,
                label="smallem.matmul" if impl == "smallem" else "numpy (OpenBLAS)")
    ax.axhline(peak, color="black", lw=1, label="f32 peak")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (n×n times n×n, f32)")
    ax.set_ylabel("Gop/s")
    top = max([peak] + [records.median(r) for r in records.results(rec, "sweep")])
    ax.set_ylim(0, top * 1.1)
    ax.set_title(f"Size sweep, {rec['settings']['threads']} threads", fontsize=10)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=8)
    return figures.save(fig, name)


def roofline_points(rec: dict, rec_dir=None) -> list[tuple[str, float, float]]:
    """Each rung at its intensity against the cache level that feeds its innermost loop.

    - rung 0: each multiply-add (2 operations) misses for a new 64-byte line of B, which
      the column's stride keeps out of L1 and most of L2 (chapter 1): from L3;
    - rungs 1, 2: each multiply-add reads 4 bytes of B, from the level of chapter 1's
      staircase that holds what their inner loops sweep (L3 without chapter 1's record);
    - rungs 3 and 4: each step of the micro-kernel does 2 MR NR operations and reads an MR
      sliver of A (4 MR bytes) from L2; B's sliver stays in L1: NR / 2 operations per byte;
    - rung 5 (the row order): A's sliver stays in L1 and each step reads an NR sliver of B
      (4 NR bytes) from L2 and L3: MR / 2 operations per byte.
    """
    n = rec["settings"]["n_ladder"]
    nr, mr = rec["settings"]["nr"], rec["settings"]["mr"]
    lv = _levels(rec, rec_dir)
    where = {0: (2 / 64, "B lines from L3"), 1: (2 / 4, f"B from {lv['ch2.rung1_level'] or 'L3'}"),
             2: (2 / 4, f"B from {lv['ch2.rung2_level'] or 'L3'}"),
             3: (nr / 2, "A from L2"), 4: (nr / 2, "A from L2"), 5: (mr / 2, "B from L2 and L3")}
    # each label starts with the rung's number: the figure marks the dot with it
    rates = {r.index: records.value(rec, "rung", rung=r.index, M=n) for r in LADDER}
    return [(f"{r.index} {r.name.replace('_', ' ')} ({where[r.index][1]}"
             f"{'' if r.threaded else ', 1 core'})", where[r.index][0], rates[r.index])
            for r in LADDER]


def dram_intensity(n: int) -> float:
    """Operations per byte of an n^3 product if each matrix crosses DRAM once: n / 6."""
    return 2.0 * n**3 / (3 * n * n * 4)


def roofline(rec: dict, rec_dir, name: str = "ch2_roofline"):
    """Chapter 1's roofline with the rungs on it, or a small stand-in if chapter 1 has no record."""
    points = roofline_points(rec, rec_dir)
    facts = ch1.facts(rec_dir)
    if facts is not None:
        # the rungs' bounds read B from the read-only stream where measured: so do its roofs
        return ch1.roofline_figure(points, name, facts, ch1.read_stream(facts))
    import matplotlib.pyplot as plt  # stand-in: the peak only, no bandwidth slopes

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    peak, src = _peak(rec, rec_dir)
    ax.axhline(peak, color="black", label=f"f32 peak ({src})")
    for label, x, y in points:
        ax.plot([x], [y], "o")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operations per byte")
    ax.set_ylabel("Gop/s")
    ax.legend(fontsize=8)
    return figures.save(fig, name)


def chapter1_links(rec: dict, rec_dir) -> dict:
    """Bounds that chapter 1's measurements put on the rungs (n/a without its record)."""
    f = figures.fmt
    sm = ch1.facts(rec_dir)
    if sm is None:
        return {"ch2.l3_core_bw": "n/a", "ch2.rung1_l3_bound": "n/a", "ch2.rung1_stream": None}
    n = rec["settings"]["n_ladder"]
    stream = ch1.read_stream(sm)  # rung 1 only reads B; C's row stays in L1
    _, l3 = ch1.level_of(sm, 4 * n * n, 1, stream)  # the level that holds all of B
    # rung 1 reads one 4-byte float of B from there per multiply-add (2 operations)
    return {"ch2.l3_core_bw": f(l3, "GB/s"), "ch2.rung1_l3_bound": f(l3 * 2 / 4, "Gop/s"),
            "ch2.rung1_stream": stream}


def mc_rows(rec: dict) -> tuple[list[list], dict]:
    """The MC sweep: rung 4, the model's KC, A's block in more or fewer L2 ways."""
    pts = records.results(rec, "mc_sweep")
    chosen = rec["settings"]["blocks_ladder"]["mc"]
    rows = [[f"{p['params']['l2_ways']}" + (" (model)" if p["params"]["mc"] == chosen else ""),
             f"{p['params']['mc']} × {p['params']['kc']}",
             f"{p['params']['mc'] * p['params']['kc'] * 4 / 1024:.0f} KiB",
             figures.fmt(records.median(p), "Gop/s")] for p in pts]
    th = pts[0]["params"]["threads"]
    rung = [r.index for r in LADDER if r.name == pts[0]["params"]["rung"]]
    values = {"ch2.mc_n": str(pts[0]["params"]["n"]),
              "ch2.mc_threads": f"{th} thread{'s' if th != 1 else ''}",
              "ch2.mc_rung": str(rung[0]), **_sweep_values(pts, "mc", chosen, "ch2.mc",
                                                             typed=("spread", "model_gap"))}
    return rows, values


def alone_rows(rec: dict, rec_dir=None) -> tuple[list[list], dict, int]:
    """Table ch2_alone and its values (:mod:`.alone`), with the rate of the tiles inside the
    model's products: 2MNK over each thread's time in its tiles."""
    rows, values, kc = _alone_rows(rec, rec_dir)
    f = figures.fmt
    # the tiles inside the model's products: 2MNK over each thread's time in its tiles
    tiles = []
    for label, *_ in shape_pairs(rec):
        t = records.results(rec, "phase", label=label, phase="tiles")
        if t and records.median(t[0]) > 0:
            q = t[0]["params"]
            tiles.append(2.0 * q["M"] * q["N"] * q["K"] / 1e9 / (records.median(t[0]) / 1e3))
    values["ch2.tiles_range"] = (f"{f(min(tiles))} to {f(max(tiles), 'Gop/s')}" if tiles
                                 else "n/a (no phase results in this record)")
    return rows, values, kc


def _sweep_tables(rec: dict, rec_dir, note: str, cores: int) -> dict:
    """The M_C and K_C sweeps' tables, and their values."""
    r, values = mc_rows(rec)
    figures.write_table("ch2_mc", r, ["L2 ways for A", "MC × KC", "A block",
                                      f"rung {values['ch2.mc_rung']}, Gop/s at "
                                      f"{values['ch2.mc_n']}³, {values['ch2.mc_threads']}"],
                        note=note)
    r, v = kc_rows(rec, rec_dir)
    values.update(v)
    figures.write_table("ch2_kc", r, ["L1 ways for A", "KC (→ the slice run)", "A sliver",
                                      f"passes over C at {values['ch2.kc_n']}³",
                                      f"B block at {values['ch2.kc_n']}³",
                                      f"Gop/s, {cores} threads"],
                        note=note + " The driver cuts K into equal slices of at most K_C, so a "
                        "K_C that does not divide K runs as the slice after the arrow; the "
                        "sliver and the block are the slice's." + (
                            "" if "blocks_rows" in rec["settings"] else
                            " This record predates rung 5's own K_C: no row is the model's."))
    return values


def report(rec_dir) -> dict:
    write_rung_diffs()  # from the source, not the record: always possible
    if not records.exists(RECORD, rec_dir):
        print(f"chapter 2: no record {RECORD} in {rec_dir}; run `smallem gemm` (skipped)")
        return {}
    rec = records.load(RECORD, rec_dir)
    peak, _ = _peak(rec, rec_dir)
    cores = rec["settings"]["threads"]
    note = f"This machine: {figures.machine_line(rec)}; numpy: {_blas_line(rec)}."
    rows, values = ladder_rows(rec, rec_dir)
    figures.write_table("ch2_ladder", rows,
                        ["Rung", f"Gop/s, {rec['settings']['n_ladder']}³", "of its cores' peak", "gain",
                         "predicted (what bounds it)", "of predicted", "Reference, per core",
                         f"Reference: {reference.MACHINE.split(' vs ')[0]}, "
                         f"{reference.CORES} threads"],
                        note=note + f" Reference: quoted from {reference.CITE}, measured on that machine.")
    r, v = sweep_rows(rec, rec_dir)
    values.update(v)
    figures.write_table("ch2_sweep", r, ["Size", f"smallem, up to {cores} threads",
                                         f"numpy, {cores} threads", "smallem / numpy",
                                         ROUNDS_HEADER],
                        note=note + f" smallem's `matmul` gives a thread at least "
                        f"{THREAD_MIN_OPS / 1e6:.1f} million operations, so the smaller sizes "
                        f"run on fewer threads.")
    r, v = shape_rows(rec)
    values.update(v)
    values.update(whole_b_values(rec))
    values.update(same_product_values(rec))
    figures.write_table("ch2_shapes", r,
                        ["Product", "M×K×N", "smallem", "numpy", "smallem / numpy",
                         ROUNDS_HEADER], note=note)
    r, v = phase_rows(rec)
    values.update(v)
    figures.write_table("ch2_phases", r,
                        ["Product", "M", "B", "per call", "pack B", "pack A", "tiles",
                         "waiting"],
                        note=note + f" Medians of {_phase_calls(rec)} calls; each share is a "
                        "phase's part of the time in the parallel region (each phase the mean "
                        "over the threads, the shares of their sum), which the call's own time "
                        "exceeds by the region's start and end: a phase's time is its share of "
                        "that sum, not of the call."
                        + (f" The calls ran in a run of their own, after the products table's rounds: a "
                           f"product's time per call here lies up to {figures.pct(gap, 2)} from the time "
                           f"its rate there gives." if (gap := _phase_gap(rec, shape_pairs(rec))) else ""))
    r, v, kc = alone_rows(rec, rec_dir)
    values.update(v)
    figures.write_table("ch2_alone", r,
                        ["B's slivers in", "B", "threads", "the micro-kernel alone",
                         "FMA probe, in turn", "of the probe"],
                        note=note + f" K_C = {kc}, full tiles, no packing and "
                        "no barriers; medians of samples taken in turn with the probe.")
    r, v = dtype_rows(rec)
    values.update(v)
    figures.write_table("ch2_bf16", r, DTYPE_HEADER,
                        note=note + f" bf16 path: {values['ch2.bf16_chosen']}.")
    values.update(bf16_elsewhere(rec_dir))
    values.update(amx_values(rec, rec_dir))
    values.update(amx_ladder(rec, rec_dir))
    values.update(native_values(rec, rec_dir))
    values.update(_sweep_tables(rec, rec_dir, note, cores))
    values.update(pool_values(rec, rec_dir))
    values.update(order_values(rec, ch1.facts(rec_dir)))
    values.update(chapter1_links(rec, rec_dir))
    ladder_figure(rec, peak, rec_dir=rec_dir)
    sweep_figure(rec, peak)
    roofline(rec, rec_dir)
    values["ch2.ai"] = figures.fmt(dram_intensity(rec["settings"]["n_ladder"]), "op/byte")
    pts = roofline_points(rec, rec_dir)
    values["ch2.ai_naive"] = figures.fmt(pts[0][1], "op/byte")
    values["ch2.ai_loop"] = figures.fmt(pts[1][1], "op/byte")
    values["ch2.ai_kernel"] = figures.fmt(pts[3][1], "op/byte")
    values["ch2.ai_kernel_rows"] = figures.fmt(pts[5][1], "op/byte")
    return values
