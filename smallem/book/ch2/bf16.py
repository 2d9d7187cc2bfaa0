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
            "ch2.amx_of_probe")
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
    return {"ch2.has_amx": True, "ch2.amx_gops": g, "ch2.amx_size": f"{M}×{K}×{N}",
            "ch2.amx_vs_f32": g / f32, "ch2.amx_probe": probe,
            "ch2.amx_of_probe": g / probe if probe else None}


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

