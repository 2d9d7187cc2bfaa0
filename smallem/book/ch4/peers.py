"""Chapter 4's ladder table below its rungs: the f32 decoder on rung 4's threads (with its
bound, as the rungs'), llama.cpp, PyTorch; and the note for two rows that print one rate."""

from __future__ import annotations

from .. import compare, figures, records, reference
from .balance import _one
from .levels import _kv_bytes, holding

f = figures.fmt


def _equal_cells(rows) -> str:
    """A note where two rows print the same rate in one column (different programs agreeing
    to the figures shown by chance), so that a reader does not take it for a copied cell."""
    out = ""
    for col, name in ((2, "decode"), (6, "prompt")):
        seen = {}
        for r in rows:
            if r[col] not in ("—", "") and r[col] in seen:
                out += (f" Rows “{seen[r[col]]}” and “{r[1]}” print the same {name} rate, "
                        f"{r[col]}: two programs timed apart in the same rounds, equal to the "
                        f"figures shown by chance.")
            seen.setdefault(r[col], r[1])
    return out


def peer_rows(rec, facts=None, s=None, values=None) -> list[list[str]]:
    """f32 on rung 4's threads (with its decode bound, as the rungs'), llama.cpp (its f32 row
    against the same bound: the same weights in f32, read once a token), PyTorch, and the
    reference series. ``values`` takes "ch4.llama_f32_share", llama.cpp's f32 decode over
    that bound (None where either is missing)."""
    rows = []
    llama_bound = None  # (tokens/s of the f32 bound, its text) for llama.cpp's f32 row
    r32 = _one(rec, "decode", case="f32-threads")
    if r32:
        wb, th = r32["params"]["weight_bytes"], r32["params"].get("threads", rec["settings"]["threads"])
        data = wb + _kv_bytes(s, s["decode_tokens"]) if s else None
        h = holding(facts, data, th) if facts and data else None
        bound = "—"
        if h and not h["gap_bw"]:
            share = records.median(r32) * data / h["bw"]
            bound = (f"{f(h['bw'] / data, 'tokens/s')}: {100 * share:.0f} % of it "
                     f"({compare.size(data / 1024)} in the {h['level']} on "
                     f"{figures.plural(th, 'thread')}"
                     + ("; above it: part of the bytes stayed in a closer level" if share > 1.05
                        else "") + ")")
            llama_bound = (h["bw"] / data, f"{compare.size(data / 1024)} in the {h['level']}")
        rows.append(["", "f32 with rung 4's threads (for comparison; its prompt through the f32 "
                     "tiles in blocks of rows, as rung 2's tokens, not through the GEMM)",
                     f(records.median(r32), "tokens/s"), "—",
                     compare.size(wb / 1024), bound,
                     f(records.median(_one(rec, "prefill", case="f32-threads")), "tokens/s"),
                     "—"])
    for dtype, label in (("q8_0", "llama.cpp, Q8_0"), ("f32", "llama.cpp, f32")):
        tg, pp = _one(rec, "llama_tg", dtype=dtype), _one(rec, "llama_pp", dtype=dtype)
        if tg:
            cell = "—"
            if dtype == "f32" and llama_bound:  # the same weights in f32, a token's read
                share = records.median(tg) / llama_bound[0]
                cell = (f"{f(llama_bound[0], 'tokens/s')}: {100 * share:.0f} % of it (as ours "
                        f"above, {llama_bound[1]})")
                if values is not None:
                    values["ch4.llama_f32_share"] = share
            rows.append(["peer", f"{label} (same file, same threads, same rounds)",
                         f(records.median(tg), "tokens/s"), "—", "—", cell,
                         f(records.median(pp), "tokens/s") if pp else "—", "—"])
    for kind, label in (("torch-f32", "PyTorch eager, f32, KV cache"),
                        ("torch-int8", "PyTorch eager, dynamic int8 (quantize_dynamic)")):
        t = _one(rec, "decode", case=kind)
        if t:
            rows.append(["peer", label, f(records.median(t), "tokens/s"),
                         "—", "—", "—", "—", "—"])
    rows.append(["ref.", f"the reference series, one sequence ({reference.CITE}, "
                 f"{reference.MACHINE})", f"{reference.CH4_GEN_BEFORE_TOKS} → "
                 f"{f(reference.CH4_GEN_AFTER_TOKS)} tokens/s", "—", "—", "—", "—", "—"])
    return rows
