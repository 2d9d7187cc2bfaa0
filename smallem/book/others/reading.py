"""The appendix's record read into its tables and values: each file's decode and prompt,
ours beside llama.cpp's, the bound its bytes set at the level of memory that holds them,
and each target's verdict."""

from __future__ import annotations

from smallem.plumbing import build
from smallem.generating.gguf_file import TYPES
from .. import ch1, compare, figures, records
from .measuring import CASES, RECORD

f = figures.fmt
MiB = 2 ** 20
# the targets: decode against llama.cpp and against the bound; the prompt's
TARGETS = {"Q8_0": 1.0, "Q4_K_M": 1.0, "Q4_0": 1.2}
BOUND_SHARE = 0.85
# the prompt against llama.cpp's: where the machine multiplies int8 with vpdpbusd (VNNI), and
# where with vpmaddubsw (AVX2)
PP_TARGETS = {"vnni": 2.0, "avx2": 1.3}
# the integer GEMM's prediction: per block of 32, 8 vpdpbusd and 3 float operations for the
# scales (convert, the two scales' product, the FMA), all on the same vector pipes
INT8_SHARE = 8 / 11
# the values the page quotes for each file (its numbers are in the table)
FIELDS = ("tg_vs_llama", "tg_vs_bound", "pp_vs_llama", "pp_bound", "gemm_rate", "pp_share",
          "tg_prefetch", "tg_rest")
# the decode's rates (arithmetic, memory, in turn, overlapped, the step): a table for every
# file, and values for the first file's, which the page works through
RATES = ("dot_rate", "mem_rate", "tg_none", "tg_full", "tg_rate", "tg_products")


def slug(shape: str, qtype: str) -> str:
    return f"{shape.split('-')[0].replace('.', '')}_{qtype.lower()}"


# what the page calls the stream a decode bound is read at (chapter 1's read-only stream where
# its record has it: a decoder reads its weights and writes little; else the triad)
STREAM_NAMES = {"read": "read-only stream", "triad": "triad"}


def keys() -> list[str]:
    return ([f"others.{slug(s, t)}.{k}" for s, t in CASES for k in FIELDS]
            + [f"others.{slug(*CASES[0])}.{k}" for k in RATES])


def _missing(note: str) -> dict:
    figures.write_table("others_speed", [], ["(nothing measured)"], note)
    figures.write_table("others_types", *types_table(None))
    figures.write_table("others_rates", [], ["(nothing measured)"], note)
    return {k: note for k in keys()} | {"others.prefetch_measured": False} | {"others.instruction": note, "others.llama": note,
                                        "others.rows": note, "others.rb": _rb(),
                                        "others.logits_tol": _logits_tol(),
                                        "others.prompt_int8": False, "others.int8_instruction": note,
                                        "others.int8_predicted": note,
                                        "others.pp_target": f"{PP_TARGETS['vnni']:g}"} | _ahead(None) | _tiles(None, None)


def _kib(n: int) -> str:
    return "none" if n == 0 else f"{n / 1024:g} KiB"


def _ahead(rec) -> dict:
    """The prefetch distances timed on the first file (measuring.AHEADS) beside the
    forward's own: a table, and the distance that ran fastest against the default."""
    from smallem.generating.forward import prefetch_ahead

    base = {"others.ahead": _kib(prefetch_ahead())}
    runs = records.results(rec, "decode_ahead") if rec else []
    if not runs:
        figures.write_table("others_ahead", [], ["(nothing measured)"],
                            "No prefetch distances in this record.")
        return base | {"others.ahead_swept": False, "others.ahead_file": "none",
                       "others.ahead_best": (records.not_measured(rec, "a record from before "
                                                                  "the prefetch") if rec else
                                             "not measured here (no record others.decode)"),
                       "others.ahead_default_best": False}
    shape, qtype = runs[0]["params"]["model"], runs[0]["params"]["type"]
    mine = _on_rows(rec, shape, qtype)
    same = [r for r in runs if r["params"]["model"] == shape and r["params"]["type"] == qtype]
    every = sorted(same + [mine], key=lambda r: r["params"]["ahead"])
    wb = mine["params"]["weight_bytes"]
    rows = [[_kib(r["params"]["ahead"]) + (" (the forward's)" if r is mine else ""),
             f(r["value"]["median"]), f(r["value"]["median"] * wb / 1e9),
             "—" if r is mine else compare.versus(r, mine)] for r in every]
    figures.write_table(
        "others_ahead", rows, ["prefetch distance", "decode (tokens/s)", "weights read (GB/s)",
                               "against the forward's"],
        f"{shape} {qtype}, the same decoder at each distance, timed in the same rounds "
        f"(medians). {figures.machine_line(rec)}.")
    best = max(every, key=lambda r: r["value"]["median"])
    return base | {"others.ahead_swept": True, "others.ahead_file": f"{shape} {qtype}",
                   "others.ahead_best": _kib(best["params"]["ahead"]),
                   "others.ahead_default_best": best is mine
                   or compare.difference(best, mine).sign <= 0}


def _logits_tol() -> str:
    """The tests' tolerance on the logits' distance from llama.cpp's, per type."""
    from ..ch4.llama import LOGITS_TOL

    return ", ".join(f"{t} {v:g}" for t, v in LOGITS_TOL.items())


def _rb() -> str:
    """Weight rows a prompt's block keeps in L1, as kernels_c/forward/blocks.c defines them."""
    return str(int(build.header_constant("RB", "forward/blocks.c")))


def types_table(facts, weights: int | None = None):
    """Each type's bytes per weight and, for ``weights`` parameters read per token, the
    decode bound at each level of the memory chapter 1 measured."""
    levels = ["L2", "L3", "DRAM"]
    head = ["type", "weights a block", "bytes a block", "bits a weight"]
    if facts and weights:
        head += [f"bound in {lv} (tokens/s)" for lv in levels]
    rows = []
    for t, (per, nbytes) in TYPES.items():
        row = [t, str(per), str(nbytes), f"{8 * nbytes / per:.2f}"]
        if facts and weights:
            th = facts["cores"]
            stairs = facts[f"{ch1.read_stream(facts)}_plateaus"]
            for lv in levels:
                bw = stairs[th if th in stairs else max(stairs)][lv]
                row.append(f(bw * 1e9 / (weights * nbytes / per)))
        rows.append(row)
    note = ("Bytes per weight are the formats' (ggml's block layouts). "
            + (f"The bounds: {f(weights / 1e6)} million weights read per token at chapter 1's "
               f"{STREAM_NAMES[ch1.read_stream(facts)]} bandwidth of each level on every core."
               if facts and weights else
               "No bounds: chapter 1's record is not here."))
    return rows, head, note


def _int8_predicted(facts, threads: int, instruction: str) -> str:
    """What the integer GEMM should reach: INT8_SHARE of chapter 1's int8 peak on the same
    threads, where it runs on vpdpbusd (chapter 1's int8 probe is that instruction)."""
    if "vpdpbusd" not in instruction:
        return f"no prediction ({instruction} takes four instructions where vpdpbusd takes one)"
    if not facts:
        return "no prediction (no chapter 1 record)"
    found = records.results(facts["record"], "peak", kind="int8", threads=threads)
    if not found:
        return "no prediction (chapter 1 did not measure its int8 peak on these threads)"
    peak = found[0]["value"]["max"]
    return f"{f(INT8_SHARE * peak, 'Gop/s')} ({INT8_SHARE:.0%} of chapter 1's int8 peak, {f(peak, 'Gop/s')})"


def _one(rec, name, **params):
    found = records.results(rec, name, **params)
    return found[0] if found else None


def _on_rows(rec, shape: str, qtype: str):
    """The file's decode on its rows: the decoder's own, or, where its Q8_0 matrices decode
    through tiles, the same decoder kept on the rows (timed in the same rounds)."""
    return (_one(rec, "decode_rows", model=shape, type=qtype)
            or _one(rec, "decode", model=shape, type=qtype))


def _tiles(rec, facts) -> dict:
    """Each file whose Q8_0 matrices decode through chapter 4's tiles, against the same
    decoder on the file's rows, in the same rounds: a table, and the first such file's
    values."""
    runs = records.results(rec, "decode_rows") if rec else []
    if not runs:
        figures.write_table("others_tiles", [], ["(nothing measured)"],
                            "No file decoded both ways in this record.")
        why = (records.not_measured(rec, "a record from before the tiles") if rec
               else "not measured here (no record others.decode)")
        return {"others.tiles_measured": False, "others.tiles_file": "none",
                "others.tiles_vs_rows": why, "others.tiles_dot": why, "others.rows_dot": why,
                "others.tiles_share": why, "others.rows_share": why}
    rows, values = [], {}
    for r in runs:
        p = r["params"]
        mine = _one(rec, "decode", model=p["model"], type=p["type"])
        dots = {t: _one(rec, "dot_rate", model=p["model"], type=p["type"], tiles=t)
                for t in (True, False)}
        wb = p["weight_bytes"]
        bw = (ch1.level_of(facts, wb, rec["settings"]["threads"], ch1.read_stream(facts))[1]
              if facts else None)
        share = (lambda x: f"{100 * x['value']['median'] * wb / 1e9 / bw:.0f} %") if bw else (
            lambda x: "no chapter 1 record")
        dot = {t: f(d["value"]["median"], "GB/s") if d else "not measured" for t, d in dots.items()}
        rows.append([f"{p['model']} {p['type']}", f(r["value"]["median"]),
                     f(mine["value"]["median"]), dot[False], dot[True],
                     share(r), share(mine), compare.versus(mine, r)])
        if not values:
            values = {"others.tiles_measured": True, "others.tiles_file": f"{p['model']} {p['type']}",
                      "others.tiles_vs_rows": compare.versus(mine, r),
                      "others.rows_dot": dot[False], "others.tiles_dot": dot[True],
                      "others.rows_share": share(r), "others.tiles_share": share(mine)}
    figures.write_table(
        "others_tiles", rows,
        ["file", "decode on the rows (tokens/s)", "decode in tiles (tokens/s)",
         "arithmetic on the rows", "arithmetic in tiles", "rows ÷ read bound",
         "tiles ÷ read bound", "tiles against rows"],
        "The same decoder, its Q8_0 matrices multiplied on the file's rows or on the tiles "
        "made from them once, timed in the same rounds (medians). Arithmetic: as in the rates "
        "table (GB/s of weights, the products over rows held in L2). The read bound: chapter "
        f"1's read-only stream at the level that holds the weights. {figures.machine_line(rec)}.")
    return values


RATE_FIELDS = (*RATES, "tg_rest", "tg_prefetch")


def _rates(rec, key: str, ours: dict, bw: float | None) -> dict:
    """One file's decode rates: with its prefetch against without, the arithmetic alone
    (dot_rate), the memory alone (``bw``, chapter 1's), the step, and what the two allow
    done in turn and perfectly overlapped, in GB/s of weights."""
    p = ours["params"]
    bare = _one(rec, "decode_ahead", model=p["model"], type=p["type"], ahead=0)
    rest = _one(rec, "decode_rest", model=p["model"], type=p["type"])
    step_s, rest_s = (1 / r["value"]["median"] if r else None for r in (ours, rest))
    dots = _one(rec, "dot_rate", model=p["model"], type=p["type"],
                **({"tiles": True} if p.get("tiles") else {}))
    no = records.not_measured(rec, "a record from before the prefetch")
    dot = dots["value"]["median"] if dots else None
    both = dot is not None and bw is not None
    return {key + "tg_prefetch": (compare.versus(_on_rows(rec, p["model"], p["type"]), bare)
                                  if bare else no),
            key + "dot_rate": f(dot, "GB/s") if dots else no,
            key + "tg_rate": f(ours["value"]["median"] * p["weight_bytes"] / 1e9, "GB/s"),
            key + "mem_rate": f(bw, "GB/s") if bw is not None else "no chapter 1 record",
            key + "tg_none": f(1 / (1 / dot + 1 / bw), "GB/s") if both else no,
            key + "tg_full": f(min(dot, bw), "GB/s") if both else no,
            key + "tg_rest": (f"{1e3 * rest_s:.2f} ms a token, {100 * rest_s / step_s:.0f} % of "
                              "the step" if rest else no),
            key + "tg_products": (f(p["weight_bytes"] / (step_s - rest_s) / 1e9, "GB/s")
                                  if rest and step_s > rest_s else no)}


def _rates_table(rec, rows: list, threads: int):
    figures.write_table(
        "others_rates", rows,
        ["file", "arithmetic alone", "memory alone", "the two in turn", "the two overlapped",
         "the step", "its products (the step less the rest)", "the rest",
         "the step against no prefetch"],
        "GB/s of weights a decode step reads. Arithmetic: each type's products over the first "
        "rows of one of its matrices in L2, on one core, weighted by the type's bytes in the "
        f"file, times {threads} cores. Memory: chapter 1's read-only stream at the level that "
        "holds the weights. In turn: one over the sum of their inverses; overlapped: the "
        "lower. The rest: the same step with every product writing zeros instead of reading "
        f"its weights, timed in the same rounds. {figures.machine_line(rec)}.")
    return bool(records.results(rec, "dot_rate"))


def report(rec_dir=None) -> dict:
    if not records.exists(RECORD, rec_dir):
        return _missing("not measured here (no record others.decode: run `smallem bench-others`)")
    rec = records.load(RECORD, rec_dir)
    s = rec["settings"]
    facts = ch1.facts(rec_dir)
    th = s["threads"]
    int8_ins = s.get("int8_instruction", s["instruction"])
    pp_target = PP_TARGETS["vnni" if "VNNI" in int8_ins else "avx2"]
    rows, values, rate_rows = [], {}, []
    weights = None
    for shape, qtype in CASES:
        key = f"others.{slug(shape, qtype)}."
        ours = _one(rec, "decode", model=shape, type=qtype)
        if ours is None:
            why = s.get("missing", {}).get(f"{shape} {qtype}", "not in this record")
            values.update({key + k: f"not measured here ({why})" for k in FIELDS})
            continue
        p = ours["params"]
        weights = weights or (p["params"] if qtype == "Q8_0" else None)
        wb = p["weight_bytes"]
        level, bw = (ch1.level_of(facts, wb, th, ch1.read_stream(facts)) if facts
                     else ("n/a", float("nan")))
        bound = bw * 1e9 / wb
        pre = _one(rec, "prefill", model=shape, type=qtype)
        lt, lp = (_one(rec, n, model=shape, type=qtype) for n in ("llama_tg", "llama_pp"))
        tv = compare.against(ours, lt, TARGETS[qtype]) if lt else None
        bv = compare.against_bound(ours, bound, BOUND_SHARE) if facts else None
        pv = compare.against(pre, lp, pp_target) if lp else None
        gm = _one(rec, "prompt_gemm", model=shape, type=qtype)
        per_token = pre["params"].get("products_per_token")
        pp_bound = (gm["value"]["max"] * 1e9 / (2 * per_token) if gm and per_token
                    else float("nan"))
        no = "not measured (no llama.cpp)"
        values.update({
            key + "tg_vs_llama": tv.text() if tv else no,
            key + "tg_vs_bound": (bv.text(f"{100 * bv.ratio:.0f} % of the bound, target "
                                          f"{100 * BOUND_SHARE:.0f} %") if bv else "no chapter 1 record"),
            key + "pp_vs_llama": pv.text() if pv else no,
            key + "pp_bound": f(pp_bound, "tokens/s") if gm else "not measured in this record",
            key + "gemm_rate": (f(gm["value"]["max"], "Gop/s") + f" ({pre['params']['prompt_dtype']})"
                                if gm else "not measured in this record"),
            key + "pp_share": (f"{100 * pre['value']['median'] / pp_bound:.0f} %" if gm
                               else "not measured in this record"),
        })
        rates = _rates(rec, key, ours, bw if facts else None)
        rate_rows.append([f"{shape} {qtype}"] + [rates[key + k] for k in RATE_FIELDS])
        values.update({k: v for k, v in rates.items()
                       if (shape, qtype) == CASES[0] or k in (key + "tg_prefetch", key + "tg_rest")})
        mix = ", ".join(f"{t} {100 * b / p['file_bytes']:.0f} %"
                        for t, b in sorted(p["type_bytes"].items(), key=lambda kv: -kv[1]))
        rows.append([f"{shape} {qtype}", f(wb / MiB), mix, level, f(bound),
                     f(ours["value"]["median"]), f(lt["value"]["median"]) if lt else "—",
                     f"{100 * ours['value']['median'] / bound:.0f} %",
                     f(pre["value"]["median"]), f(lp["value"]["median"]) if lp else "—",
                     f(pp_bound) if gm else "—"])
    figures.write_table(
        "others_speed", rows,
        ["file", "MiB a token reads", "types (share of the file)", "level (chapter 1)",
         "bound (tokens/s)", "decode, ours", "decode, llama.cpp", "ours ÷ bound",
         f"prompt of {s['pp']}, ours", "prompt, llama.cpp", "prompt bound (tokens/s)"],
        f"Tokens/s, medians of {s['rounds']} rounds in turn; decode: {s['feed']} tokens after "
        f"{s['prompt']} cached; {th} threads. The bound: the bytes a token reads over chapter "
        f"1's {STREAM_NAMES[ch1.read_stream(facts)] if facts else 'triad'} bandwidth of the "
        f"level that holds them. The prompt bound: chapter 2's GEMM "
        f"at the file's gate shape, timed in the same run on the same threads and inputs, over "
        f"two operations a weight a token. {figures.machine_line(rec)}."
        + figures.peer_notes(s.get("llama_cpp"), s.get("missing") or {}))
    figures.write_table("others_types", *types_table(facts, weights))
    values["others.prefetch_measured"] = _rates_table(rec, rate_rows, th)
    return values | _ahead(rec) | _tiles(rec, facts) | _settings(rec, facts, int8_ins, pp_target)


def _settings(rec, facts, int8_ins: str, pp_target: float) -> dict:
    """The values that come from the record's settings rather than its files' rows."""
    s = rec["settings"]
    ll = s.get("llama_cpp")
    return {
        "others.instruction": s["instruction"],
        "others.prompt_int8": any(r["params"].get("prompt_dtype") == "int8"
                                  for r in records.results(rec, "prefill")),
        "others.int8_instruction": int8_ins, "others.pp_target": f"{pp_target:g}",
        "others.int8_predicted": _int8_predicted(facts, s["threads"], int8_ins),
        "others.rows": str(s["rows_per_call"]), "others.rb": _rb(),
        "others.logits_tol": _logits_tol(),
        "others.llama": (f"llama.cpp {ll['version']}"
                         + (f" ({ll['flags_why']})" if ll.get("flags_why") else "")
                         if ll else s.get("missing", {}).get("llama.cpp", "not found"))}
