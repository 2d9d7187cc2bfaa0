"""Chapter 2's bf16 section: the dtype table (f32 inputs beside each bf16 path), the AMX
path against chapter 1's tile probe, and the table of the second machine's record."""

from __future__ import annotations

from smallem.product.gemm import BF16_PATHS
from .. import ch1, figures, records
from .measuring import BF16_RECORD


def _bf16_value(rec: dict, path: str, M, K, N) -> float | None:
    for r in records.results(rec, "dtype", dtype="bf16", M=M, K=K, N=N):
        # records made before the two paths have one bf16 result, on the path the build had
        got = r["params"].get("path", "native" if rec["settings"]["native_bf16"] else "widen")
        if got == path:
            return records.median(r)
    return None



BF16_PATH_TEXT = {"widen": "bf16 widened to f32 in packing, the FMA micro-kernel",
                  "native": "vdpbf16ps on bf16 pairs", "amx": "AMX tiles (tdpbf16ps)"}



def _missing(rec: dict, path: str) -> str:
    """What a table says for a path a record has no result for."""
    have = rec["settings"].get({"native": "native_bf16", "amx": "amx_bf16"}[path])
    if path == "amx" and not rec["settings"]["native_bf16"]:
        have = False  # every CPU with AMX_BF16 has AVX512_BF16
    if have is False:
        return "no AVX512_BF16" if path == "native" else "no AMX"
    return "not measured"  # records from before the path existed



def dtype_rows(rec: dict, prefix: str = "ch2.bf16") -> tuple[list[list], dict]:
    f = figures.fmt
    rows, values = [], {}
    sizes = list(dict.fromkeys((r["params"]["M"], r["params"]["K"], r["params"]["N"])
                               for r in records.results(rec, "dtype")))
    chosen = rec["settings"]["bf16_path"]
    for M, K, N in sizes:
        g32 = records.value(rec, "dtype", dtype="f32", M=M, K=K, N=N)
        g16 = {p: _bf16_value(rec, p, M, K, N) for p in BF16_PATHS}
        cells = [f(g16[p], "Gop/s") if g16[p] is not None else _missing(rec, p)
                 for p in BF16_PATHS]
        best = g16[chosen]
        rows.append([f"{M}×{K}×{N}", f(g32, "Gop/s"), *cells, f"{100 * best / g32:.0f} %"])
    has = [x for x, key in (("AVX512_BF16", "native_bf16"), ("AMX", "amx_bf16"))
           if rec["settings"].get(key)]
    values[f"{prefix}_extensions"] = " and ".join(has) if has else "no AVX512_BF16"
    values[f"{prefix}_chosen"] = f"{chosen} ({BF16_PATH_TEXT[chosen]})"
    peaks = {k: records.results(rec, "peak", kind=k) for k in ("f32", "bf16")}
    if all(peaks.values()):  # the second machine's record times the probes beside it
        p32, p16 = (records.median(peaks[k][0]) for k in ("f32", "bf16"))
        values.update({f"{prefix}_f32_probe": f(p32, "Gop/s"),
                       f"{prefix}_bf16_probe": f(p16, "Gop/s")})
    return rows, values



DTYPE_HEADER = ["M×K×N", "f32 inputs", "bf16, widened", "bf16, vdpbf16ps", "bf16, AMX",
                "bf16 (path taken) / f32"]



def _print_dtype_rows(rows):
    for r in rows:
        print(f"  {r[0]:<18} f32 {r[1]:>12}  bf16 widened {r[2]:>12}  vdpbf16ps {r[3]:>14}"
              f"  AMX {r[4]:>12}  ({r[5]})")



def amx_values(rec: dict, rec_dir) -> dict:
    """The AMX path against the f32 inputs and against chapter 1's tile probe (typed; None
    where the record has no AMX result or chapter 1 no tile probe)."""
    keys = ("ch2.amx_gops", "ch2.amx_size", "ch2.amx_vs_f32", "ch2.amx_probe",
            "ch2.amx_of_probe", "ch2.amx_probe_vs_f32_peak")
    best = None
    for r in records.results(rec, "dtype", dtype="bf16"):
        p = r["params"]
        if p.get("path") == "amx" and (best is None or records.median(r) > best[0]):
            best = (records.median(r), p["M"], p["K"], p["N"])
    if best is None:
        return dict.fromkeys(keys) | {"ch2.has_amx": False}
    g, M, K, N = best
    f32 = records.value(rec, "dtype", dtype="f32", M=M, K=K, N=N)
    facts = ch1.facts(rec_dir)
    probe = (facts or {}).get("peak", {}).get(("amx_bf16", rec["settings"]["threads"]))
    f32_peak = (facts or {}).get("peak", {}).get(("f32", rec["settings"]["threads"]))
    return {"ch2.has_amx": True, "ch2.amx_gops": g, "ch2.amx_size": f"{M}×{K}×{N}",
            "ch2.amx_vs_f32": g / f32, "ch2.amx_probe": probe,
            "ch2.amx_of_probe": g / probe if probe else None,
            # chapter 1's two probes, the tiles' over the FMAs', on as many cores
            "ch2.amx_probe_vs_f32_peak": probe / f32_peak if probe and f32_peak else None}


def bf16_elsewhere(rec_dir) -> dict:
    """Table ch2_bf16_native and its values, from the second machine's record if any."""
    keys = ("ch2.bf16_native_machine", "ch2.bf16_native_threads", "ch2.bf16_native_extensions",
            "ch2.bf16_native_chosen", "ch2.bf16_native_f32_probe", "ch2.bf16_native_bf16_probe",
            "ch2.bf16_native_vdp_best", "ch2.bf16_native_vdp_size", "ch2.bf16_native_vdp_probe")
    if not records.exists(BF16_RECORD, rec_dir):
        figures.write_table("ch2_bf16_native", [["not measured yet"] + [""] * 5],
                            DTYPE_HEADER)
        # typed: no values, and the fact the page's section says once, at its head
        return dict.fromkeys(keys) | {"ch2.bf16_native_exists": False}
    rec = records.load(BF16_RECORD, rec_dir)
    rows, values = dtype_rows(rec, prefix="ch2.bf16_native")
    values.update(native_values(rec, rec_dir, "ch2.bf16_native_vdp"))
    figures.write_table("ch2_bf16_native", rows, DTYPE_HEADER,
                        note=f"Machine: {figures.machine_line(rec)}; "
                             f"bf16 path: {values['ch2.bf16_native_chosen']}.")
    return {"ch2.bf16_native_machine": figures.machine_line(rec),
            "ch2.bf16_native_threads": rec["settings"]["threads"], **values,
            "ch2.bf16_native_exists": True}


def native_values(rec: dict, rec_dir, prefix: str = "ch2.native") -> dict:
    """The fastest vdpbf16ps product against the bf16 dot probe on as many cores (typed; None
    where either is missing): chapter 1's probe, or, for a record that times the probes beside
    its products (the second machine's), its own. A product above the probe says the probe
    was not this run's ceiling."""
    best = None
    for r in records.results(rec, "dtype", dtype="bf16"):
        p = r["params"]
        if p.get("path") == "native" and (best is None or records.median(r) > best[0]):
            best = (records.median(r), p["M"], p["K"], p["N"])
    own = records.results(rec, "peak", kind="bf16")
    facts = None if own else ch1.facts(rec_dir)
    probe = (records.median(own[0]) if own else
             (facts or {}).get("peak", {}).get(("bf16", rec["settings"]["threads"])))
    keys = (f"{prefix}_best", f"{prefix}_size", f"{prefix}_probe")
    if best is None or not probe:
        return dict.fromkeys(keys)
    return dict(zip(keys, (best[0], f"{best[1]}×{best[2]}×{best[3]}", probe)))



# ---------------------------------------------------------------- the AMX ladder

AMX_TARGET = 0.5  # the AMX path's share of the tile probe timed in the same rounds (issue 66)
AMX_WHAT = {1: "the tiles, with the f32 model's blocks",
            2: "the AMX path's own blocks (A's panel in the L1, B's block in half the L2)",
            3: "C's last slice streamed to memory, its lines not read first"}


def amx_traffic(p: dict, geometry: dict) -> dict:
    """What a rung of the AMX ladder moves, from its blocks (the model the page states): K in
    ``slices`` equal slices; each slice reads C and writes it back (8 bytes an element), the
    last one writes only (4) where streamed; B's block (slice x N_C run, bf16) stays in the
    L2 where it fits half of it, else each 32-row panel of A streams it from the L3."""
    M, N, K, kc, nc = p["M"], p["N"], p["K"], p["kc"], p["nc"]
    slices = -(-K // kc)
    kslice = -(-K // slices)
    ncs = -(-N // min(nc, N))
    nrun = -(-(-(-N // ncs)) // 32) * 32  # N in equal slices, rounded up to 32 columns
    c_bytes = 8 * M * N * slices - (4 * M * N if p["epilogue"] == "stream" else 0)
    b_block = 2 * -(-kslice // 32) * 32 * min(nrun, -(-N // 32) * 32)
    b_in_l2 = b_block <= geometry["L2"]["bytes"] // 2
    b_l3 = 0 if b_in_l2 else 2 * K * N * -(-M // 32)
    return {"slices": slices, "kslice": kslice, "nrun": nrun, "c_bytes": c_bytes,
            "b_block": b_block, "b_in_l2": b_in_l2, "b_l3_bytes": b_l3}


def _amx_rows(rungs, probe, alone, geometry, dram, l3) -> tuple[list, dict]:
    """The ladder's table rows, and what the page says of them: each rung's model and
    bound, its gain over the one above, which rungs beat their bound."""
    from .. import compare
    f = figures.fmt
    p_rate, a_rate = records.median(probe), records.median(alone)
    rows, out, prev = [], {"beats": [], "gains": {}, "first": None}, None
    for r in rungs:
        p = r["params"]
        t = amx_traffic(p, geometry)
        gop = 2 * p["M"] * p["N"] * p["K"] / 1e9
        bounds = {"the tile probe": p_rate}
        if dram:
            bounds["C to and from memory"] = gop / (t["c_bytes"] / 1e9 / dram)
        if l3 and t["b_l3_bytes"]:
            bounds["B from the L3"] = gop / (t["b_l3_bytes"] / 1e9 / l3)
        if (-(-t["kslice"] // 32) * 32, t["nrun"]) == (alone["params"]["kp"],
                                                      32 * alone["params"]["panels"]):
            bounds["the tiles alone"] = a_rate  # measured with this rung's blocks
        what, bound = min(bounds.items(), key=lambda kv: kv[1])
        got = records.median(r)
        out["first"] = out["first"] or (what, got / bound, t["slices"], t["b_in_l2"])
        if got > bound * (1 + compare.SWEEP_NOISE):
            out["beats"].append(p["step"])
        gain = compare.difference(r, prev) if prev is not None else None
        if gain is not None:
            out["gains"][p["rung"]] = gain
        slices = f"{t['slices']} slice{'s' if t['slices'] > 1 else ''}"
        rows.append([f"{p['rung']}. {p['step']}", AMX_WHAT.get(p["rung"], ""),
                     f"{t['kslice']} × {t['nrun']} ({slices})", f(t["c_bytes"] / 1e6, "MB"),
                     "L2" if t["b_in_l2"] else f"L3, {f(t['b_l3_bytes'] / 1e9, 'GB')}",
                     f"{f(bound, 'Gop/s')} ({what})", f(got, "Gop/s"),
                     f"{100 * got / p_rate:.0f} %",
                     "" if gain is None else f"{gain.pct:+.0f} %"
                     + ("" if gain.sign else " (not told apart)")])
        prev = r
    rows.append(["the tiles alone", f"rung {rungs[-1]['params']['rung']}'s blocks, no packing, "
                 "no C", f"{alone['params']['kp']} × {32 * alone['params']['panels']}", "0",
                 "L2", "", f(a_rate, "Gop/s"), f"{100 * a_rate / p_rate:.0f} %", ""])
    rows.append(["the tile probe, in these rounds", "chapter 1's probe: tiles in registers, no loads", "", "0", "", "",
                 f(p_rate, "Gop/s"), "100 %", ""])
    return rows, out


def amx_ladder(rec: dict, rec_dir) -> dict:
    """Table ch2_amx_ladder and its values: each rung of the AMX ladder, what it moves, the
    bound chapter 1's bandwidths put on it, its rate and its gain, beside the tiles alone
    and the tile probe timed in the same rounds (typed; ch2.amx_ladder False where the
    record has none)."""
    from .. import compare
    rungs = sorted(records.results(rec, "amx_rung"), key=lambda r: r["params"]["rung"])
    probe, alone = records.results(rec, "amx_probe"), records.results(rec, "amx_alone")
    if not rungs or not probe or not alone:
        figures.write_table("ch2_amx_ladder", [["not measured"] + [""] * (len(AMX_HEADER) - 1)],
                            AMX_HEADER)
        return dict.fromkeys(AMX_KEYS) | {"ch2.amx_ladder": False, "ch2.amx_beats": [],
                                          "ch2.amx_blocks_gain_sign": 0,
                                          "ch2.amx_stream_gain_sign": 0}
    probe, alone, last = probe[0], alone[0], rungs[-1]
    cores = rec["settings"]["threads"]
    plateaus = ((ch1.facts(rec_dir) or {}).get("triad_plateaus") or {}).get(cores) or {}
    dram, l3 = plateaus.get("DRAM"), plateaus.get("L3")
    rows, said = _amx_rows(rungs, probe, alone, rec["settings"]["cache_geometry"], dram, l3)
    f = figures.fmt
    figures.write_table("ch2_amx_ladder", rows, AMX_HEADER, note=(
        f"Machine: {figures.machine_line(rec)}; {cores} threads; "
        f"{last['params']['M']}×{last['params']['K']}×{last['params']['N']}, bf16 in, f32 "
        "out. Every row timed in the same alternated rounds, medians. C's bytes: 8 an element "
        "for each slice of K (read, written back), 4 for a streamed last slice. Bounds: "
        "chapter 1's triad plateaus on as many cores "
        + (f"(memory {f(dram, 'GB/s')}, L3 {f(l3, 'GB/s')})" if dram and l3 else
           "(not in chapter 1's record)")
        + ", the probe and the tiles alone as timed here. Gain: over the rung above, "
        "two-sided signed-rank test on the rounds."))
    p_rate, a_rate, got = records.median(probe), records.median(alone), records.median(last)
    v = compare.against(last, probe, AMX_TARGET)
    p = last["params"]  # the bf16 table's reading of the same product, in its own rounds
    table = next((records.median(r) for r in records.results(rec, "dtype", dtype="bf16", M=p["M"],
                                                             K=p["K"], N=p["N"])
                  if r["params"].get("path") == "amx"), None)
    ch1_probe = ((ch1.facts(rec_dir) or {}).get("peak") or {}).get(("amx_bf16", cores))
    gains = said["gains"]
    return {"ch2.amx_ladder": True,
            "ch2.amx_ladder_size": f"{last['params']['M']}×{last['params']['K']}×{last['params']['N']}",
            "ch2.amx_alone_of_probe": a_rate / p_rate, "ch2.amx_last_of_alone": got / a_rate,
            "ch2.amx_target": v.text(f"{100 * v.ratio:.0f} % of the probe, target "
                                     f"{100 * AMX_TARGET:.0f} %"),
            "ch2.amx_beats": said["beats"], "ch2.amx_noise": compare.SWEEP_NOISE,
            "ch2.amx_first_bound": said["first"][0], "ch2.amx_first_of_bound": said["first"][1],
            "ch2.amx_first_slices": said["first"][2], "ch2.amx_first_b_in_l2": said["first"][3],
            "ch2.amx_last_slices": amx_traffic(last["params"], rec["settings"]["cache_geometry"])["slices"],
            "ch2.amx_blocks_gain": gains[2].pct / 100 if 2 in gains else None,
            "ch2.amx_blocks_gain_sign": gains[2].sign if 2 in gains else 0,
            "ch2.amx_stream_gain": gains[3].pct / 100 if 3 in gains else None,
            "ch2.amx_stream_gain_sign": gains[3].sign if 3 in gains else 0,
            "ch2.amx_epilogue": rec["settings"].get("amx_epilogue"),
            "ch2.amx_kc": last["params"]["kc"], "ch2.amx_nc": last["params"]["nc"],
            "ch2.amx_probe_turn": p_rate, "ch2.amx_probe_ch1": ch1_probe,
            "ch2.amx_last_gops": got, "ch2.amx_table_gops": table}


AMX_KEYS = ("ch2.amx_ladder_size", "ch2.amx_alone_of_probe", "ch2.amx_last_of_alone",
            "ch2.amx_target", "ch2.amx_noise", "ch2.amx_first_bound",
            "ch2.amx_first_of_bound", "ch2.amx_blocks_gain", "ch2.amx_stream_gain",
            "ch2.amx_first_slices", "ch2.amx_first_b_in_l2", "ch2.amx_last_slices",
            "ch2.amx_probe_turn", "ch2.amx_probe_ch1", "ch2.amx_last_gops", "ch2.amx_table_gops",
            "ch2.amx_epilogue", "ch2.amx_kc", "ch2.amx_nc")
AMX_HEADER = ["Rung", "what changes", "K slice × N_C run", "C to and from memory", "B's block in",
              "bound (what sets it)", "Gop/s", "of the probe", "gain"]
