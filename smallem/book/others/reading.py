"""The appendix's record read into its tables and values: each file's decode and prompt,
ours beside llama.cpp's, the bound its bytes set at the level of memory that holds them,
and each target's verdict."""

from __future__ import annotations

from smallem.plumbing import build
from smallem.generating.gguf_file import TYPES
from .. import ch1, compare, figures, records
from ..ch4 import llama
from .measuring import CASES, RECORD

f = figures.fmt
MiB = 2 ** 20
# the targets: decode against llama.cpp and against the bound; the prompt's
TARGETS = {"Q8_0": 1.0, "Q4_K_M": 1.0, "Q4_0": 1.2}
SHOWN = {"qwen2.5-0.5b": "Qwen2.5-0.5B", "smollm2-135m": "SmolLM2-135M"}  # as the page names them
BOUND_SHARE = 0.85
# the prompt against llama.cpp's: where the machine multiplies int8 with vpdpbusd (VNNI), and
# where with vpmaddubsw (AVX2)
PP_TARGETS = {"amx": 3.0, "vnni": 2.0, "avx2": 1.3}
# the integer GEMM's prediction: per block of 32, 8 vpdpbusd and 3 float operations for the
# scales (convert, the two scales' product, the FMA), all on the same vector pipes
INT8_SHARE = 8 / 11
# the values the page quotes for each file (its numbers are in the table)
FIELDS = ("tg_vs_llama", "tg_vs_bound", "pp_vs_llama", "pp_bound", "gemm_best", "gemm_dtype",
          "pp_share", "tg_prefetch", "tg_rest_ms", "tg_rest_share")
# the decode's rates (arithmetic, memory, in turn, overlapped, the step): a table for every
# file, and values for the first file's, which the page works through
RATES = ("dot_rate", "mem_rate", "tg_none", "tg_full", "tg_rate", "tg_products")


def slug(shape: str, qtype: str) -> str:
    return f"{shape.split('-')[0].replace('.', '')}_{qtype.lower()}"


# what the page calls the stream a decode bound is read at (chapter 1's read-only stream where
# its record has it: a decoder reads its weights and writes little; else the triad)


def fields(shape: str) -> tuple[str, ...]:
    """A file's fields: its prompt GEMM's own reading too where another file makes the same
    call (the page sets the two readings side by side)."""
    shared = sum(s == shape for s, _ in CASES) > 1
    return FIELDS + (("gemm_rate",) if shared else ())


def keys() -> list[str]:
    return ([f"others.{slug(s, t)}.{k}" for s, t in CASES for k in fields(s)]
            + [f"others.{slug(*CASES[0])}.{k}" for k in RATES])


SETTINGS_KEYS = ("others.instruction", "others.prompt_int8", "others.prompt_float_dtype",
                 "others.rate_int8", "others.rate_float", "others.int8_instruction",
                 "others.pp_target", "others.rows", "others.bf16_path", "others.prefetch_measured",
                 "others.rate_int8_vector", "others.int8_vector_instruction",
                 "others.amx_predates", "others.vnni", "others.intel")


def _missing(note: str) -> dict:
    """No record: every value the page names, None, and ``others.measured`` False (each
    section that quotes the record says so once, at its head)."""
    figures.write_table("others_speed", [], ["(nothing measured)"], note)
    figures.write_table("others_types", *types_table(None))
    figures.write_table("others_rates", [], ["(nothing measured)"], note)
    return ({k: None for k in (*keys(), *SETTINGS_KEYS)}
            | {"others.measured": False, "others.rb": _rb(), "others.logits_tol": _logits_tol()}
            | _tol_values()
            | _int8_predicted(None, 0, "") | llama_values(None, {}, 0)
            | _ahead(None) | _tiles(None, None)
            | {"others.llama_amx_partial": [], "others.llama_amx_types": None}
            | {"others.prefetch_gains": 0, "others.prefetch_losses": 0, "others.commit": None,
               "others.prefetch_gain_least": None,
               "others.prefetch_loss_most": None, "others.prompt_amx_files": None,
               "others.ch1_measured": False,
               "others.below_rest": None, "others.below_model": None}
            | _tile_values(None) | _parts(None) | _above_bound(None, None))


# the parts of a step (measuring.measure_parts; the C side's PART_*), as the page names them
PART_NAMES = {"products": "the products' parallel regions", "attend": "the attention",
              "norm": "the norms and residual adds", "round": "the rounding of the products' inputs",
              "positions": "the biases, heads' norms and RoPE", "activation": "the MLP's activation",
              "embed": "the embedding", "call": "the call around them (Python's step, the head's last lines)"}


def _parts(rec) -> dict:
    """The rest of each file's step part by part (``decode_parts``: the products-off decoder
    in the rounds, its parts summed by the C forward's clock): the table, and for the page
    each file's largest part of the rest but its regions, and its share, the regions a token
    that met as a team, one meeting's cost there (the regions' time in the rest, where they
    only write zeros, over their count) beside the fork-join timed alone, and the meetings'
    share of the step."""
    rows, values, any_, n_rounds = [], {}, False, None
    for shape, qtype in CASES:
        key = f"others.{slug(shape, qtype)}."
        rest = _one(rec, "decode_parts", model=shape, type=qtype) if rec else None
        step = _one(rec, "decode", model=shape, type=qtype) if rec else None
        quoted = (shape, qtype) == PARTS_QUOTED  # the file the page's sentences take
        if not rest or not step:
            values.update({key + k: None for k in PART_FIELDS} if quoted else {})
            continue
        any_, n_rounds = True, rest["value"]["n"]
        rp, n, fj = rest["params"]["parts"], rest["params"]["teamed"], rest["params"]["fork_join"]
        whole, step_s = sum(rp.values()), 1 / records.median(step)
        largest = max((k for k in rp if k != "products"), key=rp.get)
        meeting = rp["products"] / n if n >= 1 else None
        values.update({} if not quoted else {key + "rest_largest": PART_NAMES[largest],
                       key + "rest_largest_share": rp[largest] / whole if whole else None,
                       key + "regions": n, key + "meeting_us": 1e6 * meeting if meeting else None,
                       key + "fork_join_us": 1e6 * fj if fj else None,
                       key + "meetings_share": rp["products"] / step_s})
        rows.append([f"{shape} {qtype}", f(1e6 * step_s), f(1e6 * whole)]
                    + [f(1e6 * rp[k]) for k in PART_NAMES] + [f(n)]
                    + [f(1e6 * meeting) if meeting else "—", f(1e6 * fj) if fj else "—"])
    if rec is None or not rows:
        figures.write_table("others_parts", [], ["(nothing measured)"],
                            "no record of the step's parts here")
    else:
        figures.write_table(
            "others_parts", rows,
            ["file", "the forward's step (µs)", "the rest (µs)",
             *(PART_NAMES[k].replace("the ", "", 1) for k in PART_NAMES),
             "regions met as a team", "one meeting in the rest (µs)", "a fork-join alone (µs)"],
            f"Microseconds a token, medians of the {n_rounds} rounds of the table of rates above "
            f"({rec['settings']['feed']} decode steps each). The forward's step: the decoder as "
            "the forward makes it, in tiles where it has them (the rates table sets the rest "
            "against the step on the file's rows); the rest: "
            "the same decoder with every product writing zeros instead of reading its weights "
            "(the same regions, the same threads), its parts summed by the C forward, which "
            "reads the clock at the start and the end of each; its regions then hold the "
            "threads' meetings and the zeros' writes, and the call is the rest less its parts. "
            "One meeting: the regions' time over their count. A fork-join alone: the team "
            f"around an empty region in a tight loop, the best of 9 runs of 500. "
            f"{figures.machine_line(rec)}.")
    values["others.parts_measured"] = any_
    # the keys a pass of the decode step's attention (kernels_c/forward/attend.c's AT_KEYS)
    values["others.at_keys"] = int(build.header_constant("AT_KEYS", "forward/attend.c"))
    return values


PARTS_QUOTED = ("smollm2-135m", "Q4_0")  # the file whose rest the page's sentences take
PART_FIELDS = ("rest_largest", "rest_largest_share", "regions", "meeting_us", "fork_join_us",
               "meetings_share")


def _tile_values(rec) -> dict:
    """Whether the record's tiles took the rows' prefetch (older records: no), and the types
    its forward decoded through tiles."""
    from smallem.generating.forward import TILE_TYPE_NAMES

    had = record_tile_types(rec)
    return {"others.record_tile_types": had,
            # the types the forward takes through tiles now that this record's did not
            "others.tiles_predate": ([t for t in TILE_TYPE_NAMES if t not in had] or None)
            if rec else None,
            "others.tiles_prefetch": bool((rec or {}).get("settings", {}).get("tiles_prefetch"))}


def _kib(n: int) -> str:
    return "none" if n == 0 else f"{n / 1024:g} KiB"


def _ahead(rec, facts=None) -> dict:
    """The prefetch distances timed on the first file (measuring.AHEADS) beside the
    forward's own: a table, and the distance that ran fastest against the default."""
    from smallem.generating.forward import prefetch_ahead

    base = {"others.ahead": _kib(prefetch_ahead())}
    runs = records.results(rec, "decode_ahead") if rec else []
    if not runs:
        figures.write_table("others_ahead", [], ["(nothing measured)"],
                            "No prefetch distances in this record.")
        return base | {"others.ahead_swept": False, "others.ahead_file": None,
                       "others.ahead_best": None, "others.ahead_default_best": False}
    shape, qtype = runs[0]["params"]["model"], runs[0]["params"]["type"]
    mine = _on_rows(rec, shape, qtype)
    same = [r for r in runs if r["params"]["model"] == shape and r["params"]["type"] == qtype]
    every = sorted(same + [mine], key=lambda r: r["params"]["ahead"])
    wb = mine["params"]["weight_bytes"]
    bw = (ch1.level_of(facts, wb, rec["settings"]["threads"], ch1.read_stream(facts))[1]
          if facts else None)  # the memory's rate the rates table takes, GB/s
    fastest = max(records.median(r) * wb / 1e9 for r in every)
    beyond = (f" Where a distance read faster than chapter 1's read-only stream ({f(bw, 'GB/s')}), "
              "part of the weights stayed in a cache between tokens or the memory gave more in "
              "these rounds than in chapter 1's run (after the table of speeds, how much the "
              "cache can explain)." if bw and fastest > bw else "")
    rows = [[_kib(r["params"]["ahead"]) + (" (the forward's distance)" if r is mine else ""),
             f(records.median(r)), f(records.median(r) * wb / 1e9),
             "—" if r is mine else _bare(compare.versus(r, mine))] for r in every]
    figures.write_table(
        "others_ahead", rows, ["prefetch distance", "decode (tokens/s)", "weights read (GB/s)",
                               "against the forward's"],
        f"{shape} {qtype}, the same decoder at each distance, every matrix read on the file's "
        "rows "
        + ("(the tiles take the same distance), " if (rec or {}).get("settings", {}).get("tiles_prefetch")
           else "(the prefetch is the rows' reading; the tiles stream on their own), ")
        + f"timed in the same rounds (medians).{beyond} {TEST_NOTE} {figures.machine_line(rec)}.")
    best = max(every, key=records.median)
    return base | {"others.ahead_swept": True, "others.ahead_file": f"{shape} {qtype}",
                   "others.ahead_best": _kib(best["params"]["ahead"]),
                   "others.ahead_default_best": best is mine
                   or compare.difference(best, mine).sign <= 0}


def _logits_tol() -> str:
    """The tests' tolerance on the logits' distance from llama.cpp's, per type."""
    from ..ch4.llama import LOGITS_TOL

    return ", ".join(f"{t} {v:g}" for t, v in LOGITS_TOL.items())


def _tol_values() -> dict:
    from ..ch4.llama import LOGITS_TOL

    return {"others.tol_f32": LOGITS_TOL["F32"], "others.tol_max": max(LOGITS_TOL.values())}


def _rb() -> str:
    """Weight rows a prompt's block keeps in L1, as kernels_c/forward/blocks.c defines them."""
    return str(int(build.header_constant("RB", "forward/blocks.c")))


def types_table(facts, weights: int | None = None, threads: int | None = None):
    """Each type's bytes per weight and, for ``weights`` parameters read per token, the
    decode bound at the level of chapter 1's staircase that holds the model in that type
    (the level's end from chapter 1's plateaus, the model's bytes from the type)."""
    head = ["type", "weights a block", "bytes a block", "bits a weight"]
    if facts and weights:
        head += ["MiB a token reads", "level that holds them (chapter 1)", "bound (tokens/s)"]
    rows = []
    th = threads or (facts or {}).get("cores")
    for t, (per, nbytes) in TYPES.items():
        row = [t, str(per), str(nbytes), f"{8 * nbytes / per:.2f}"]
        if facts and weights:
            wb = weights * nbytes / per
            level, bw = ch1.level_of(facts, wb, th, ch1.read_stream(facts))
            row += [f(wb / MiB), level, f(bw * 1e9 / wb)]
        rows.append(row)
    note = ("Bytes per weight are the formats' (ggml's block layouts). "
            + (f"The bounds: {f(weights / 1e6)} million weights read per token at chapter 1's "
               f"{ch1.read_stream_name(facts)} bandwidth, on {th} threads, of the level "
               f"whose plateau still ran at that many bytes."
               if facts and weights else
               "No bounds: chapter 1's record is not here." if not facts else
               "No bounds: no model's decode is measured here."))
    return rows, head, note


# The tiles' integer GEMM a block of 16 rows by 16 columns by 32 of k (kernels_c/forward/
# qgemm.c, qg_amx_rows; a test reads these counts there): one tdpbssd at half its depth, and
# three vector instructions a row (the conversion, the scales' product, the multiply-add).
AMX_BLOCK_OPS = 2 * 16 * 16 * 32
AMX_PROBE_OPS = 2 * 16 * 16 * 64  # one tdpbssd at its full depth, as chapter 1's probe runs it
AMX_BLOCK_VECTOR = 3 * 16
F32_LANES = 16                    # the tiles come with AVX-512: 16 floats a vector


def _int8_amx_predicted(facts, threads: int) -> dict:
    """What the tiles' integer GEMM should reach on ``threads`` cores, from chapter 1's probes:
    each block's tdpbssd costed as a whole one at the AMX int8 probe's rate, its vector
    instructions at the rate the f32 probe issues its FMAs (two operations a lane), the two
    in turn (lo) or overlapped (hi); None where chapter 1 has no AMX int8 probe."""
    none = dict.fromkeys(("others.amx_pred_lo", "others.amx_pred_hi", "others.amx_probe",
                          "others.amx_f32_probe", "others.amx_tile_ns", "others.amx_vector_ns"))
    amx = facts["peak"].get(("amx_int8", threads)) if facts else None
    f32 = facts["peak"].get(("f32", threads)) if facts else None
    if not amx or not f32:
        return none | {"others.amx_block_vector": AMX_BLOCK_VECTOR}
    tile = AMX_PROBE_OPS / (amx * 1e9)                        # s a block, over the team
    vector = AMX_BLOCK_VECTOR / (f32 * 1e9 / (2 * F32_LANES))
    return {"others.amx_pred_lo": AMX_BLOCK_OPS / (tile + vector) / 1e9,
            "others.amx_pred_hi": AMX_BLOCK_OPS / max(tile, vector) / 1e9,
            "others.amx_probe": amx, "others.amx_f32_probe": f32,
            "others.amx_block_vector": AMX_BLOCK_VECTOR,
            # one core's time a block: the team's time a block times its threads
            "others.amx_tile_ns": 1e9 * tile * threads, "others.amx_vector_ns": 1e9 * vector * threads}


def _int8_predicted(facts, threads: int, instruction: str) -> dict:
    """What the integer GEMM should reach: INT8_SHARE of chapter 1's int8 peak on the same
    threads (the median chapter 1 quotes), where it runs on vpdpbusd (chapter 1's int8 probe
    is that instruction), or :func:`_int8_amx_predicted` where it runs on the tiles; None
    where there is no such prediction."""
    out = {"others.int8_share": INT8_SHARE, "others.int8_peak": None, "others.int8_predicted": None,
           # chapter 1's one-core int8 probe where it times the AVX2 fallback the GEMM runs on
           "others.int8_probe_one": (facts["peak"].get(("int8", 1)) if facts and "vpmaddubsw"
                                     in instruction else None)}
    out |= _int8_amx_predicted(facts if "tdpbssd" in instruction else None, threads)
    if "vpdpbusd" not in instruction or not facts:
        return out
    peak = facts["peak"].get(("int8", threads))
    if peak is None:
        return out
    return out | {"others.int8_peak": peak, "others.int8_predicted": INT8_SHARE * peak}


def _bare(text: str) -> str:
    """A verdict without its statistics, for a table cell (the caption names the test)."""
    return figures.NOTE.sub("", text)


TEST_NOTE = ("Against: the ratio of the two medians, \"within the noise\" where the "
             "two-sided signed-rank test on the per-round ratios' logs does not pass at 5 %.")


def _one(rec, name, **params):
    found = records.results(rec, name, **params)
    return found[0] if found else None


def _on_rows(rec, shape: str, qtype: str):
    """The file's decode on its rows: the decoder's own, or, where its Q8_0 or Q4_0 matrices
    decode through tiles, the same decoder kept on the rows (timed in the same rounds)."""
    return (_one(rec, "decode_rows", model=shape, type=qtype)
            or _one(rec, "decode", model=shape, type=qtype))


def record_tile_types(rec) -> list[str]:
    """The types a record's forward decoded through tiles (older records: Q8_0 alone)."""
    return list((rec or {}).get("settings", {}).get("tile_types") or ["Q8_0"])


def _tiles(rec, facts) -> dict:
    """Each file whose Q8_0 or Q4_0 matrices decode through chapter 4's tiles, against the same
    decoder on the file's rows, in the same rounds: a table, and the first such file's
    values."""
    runs = records.results(rec, "decode_rows") if rec else []
    if not runs:
        figures.write_table("others_tiles", [], ["(nothing measured)"],
                            "No file decoded both ways in this record.")
        return {"others.tiles_measured": False, "others.tiles_file": None,
                "others.tiles_vs_rows": None, "others.tiles_dot": None, "others.rows_dot": None,
                "others.tiles_share": None, "others.rows_share": None,
                "others.tiles_faster": 0, "others.tiles_slower": 0, "others.tiles_files": 0,
                "others.tiles_sign": 0, "others.tiles_mem": None, "others.near_share": BOUND_SHARE}
    rows, values, signs, medians = [], {}, [], []
    for r in runs:
        p = r["params"]
        mine = _one(rec, "decode", model=p["model"], type=p["type"])
        d = compare.difference(mine, r)
        signs.append(d.sign)  # the rounds' test
        medians.append((d.pct > 0) - (d.pct < 0))  # the medians alone, as the page counts them
        dots = {t: _one(rec, "dot_rate", model=p["model"], type=p["type"], tiles=t)
                for t in (True, False)}
        wb = p["weight_bytes"]
        bw = (ch1.level_of(facts, wb, rec["settings"]["threads"], ch1.read_stream(facts))[1]
              if facts else None)
        share = (lambda x: records.median(x) * wb / 1e9 / bw) if bw else (lambda x: None)
        dot = {t: records.median(d) if d else None for t, d in dots.items()}
        rows.append([f"{p['model']} {p['type']}", f(records.median(r)),
                     f(records.median(mine)), *(f(dot[t], "GB/s") if dot[t] else "—"
                                                   for t in (False, True)),
                     *(figures.pct(share(x), 3) if bw else "—" for x in (r, mine)),
                     _bare(compare.versus(mine, r))])
        if not values:
            values = {"others.tiles_measured": True, "others.tiles_file": f"{p['model']} {p['type']}",
                      "others.tiles_vs_rows": compare.versus(mine, r),
                      "others.tiles_sign": signs[-1],
                      "others.rows_dot": dot[False], "others.tiles_dot": dot[True],
                      "others.rows_share": share(r), "others.tiles_share": share(mine),
                      "others.tiles_mem": bw, "others.near_share": BOUND_SHARE}
    values |= {"others.tiles_faster": medians.count(1), "others.tiles_slower": medians.count(-1),
               "others.tiles_files": len(signs)}
    figures.write_table(
        "others_tiles", rows,
        ["file", "decode on the rows (tokens/s)", "decode in tiles (tokens/s)",
         "arithmetic on the rows", "arithmetic in tiles", "rows ÷ read bound",
         "tiles ÷ read bound", "tiles against rows"],
        f"The same decoder, its {compare.listing(record_tile_types(rec), '')} matrices multiplied on "
        "the file's rows or on the tiles made from them once, timed in the same rounds "
        "(medians). Arithmetic: as in the rates "
        "table (GB/s of weights, the products over rows held in L2). The read bound: chapter "
        f"1's read-only stream at the level that holds the weights. {TEST_NOTE} "
        f"{figures.machine_line(rec)}.")
    return values


RATE_FIELDS = (*RATES, "tg_rest_ms", "tg_prefetch")


def _rates(rec, key: str, ours: dict, bw: float | None) -> dict:
    """One file's decode rates on its rows, the path the prefetch serves (where the forward
    decodes Q8_0 through tiles, the same decoder kept on the rows, timed in the same rounds):
    with its prefetch against without, the arithmetic alone (dot_rate on the rows), the
    memory alone (``bw``, chapter 1's), the step, and what the two allow done in turn and
    perfectly overlapped, in GB/s of weights. The tiles' figures are in the tiles table."""
    p = ours["params"]
    bare = _one(rec, "decode_ahead", model=p["model"], type=p["type"], ahead=0)
    rest = _one(rec, "decode_rest", model=p["model"], type=p["type"])
    rows_r = _on_rows(rec, p["model"], p["type"])
    step_s, rest_s = (1 / records.median(r) if r else None for r in (rows_r, rest))
    dots = _one(rec, "dot_rate", model=p["model"], type=p["type"],
                **({"tiles": False} if p.get("tiles") else {}))
    dot = records.median(dots) if dots else None
    both = dot is not None and bw is not None
    return {key + "tg_prefetch": compare.versus(rows_r, bare) if bare else None,
            key + "prefetch_sign": compare.difference(rows_r, bare).sign if bare else None,
            key + "prefetch_change": (records.median(rows_r) / records.median(bare) - 1
                                      if bare else None),
            key + "dot_rate": dot,
            key + "tg_rate": records.median(rows_r) * p["weight_bytes"] / 1e9,
            key + "mem_rate": bw,
            key + "tg_none": 1 / (1 / dot + 1 / bw) if both else None,
            key + "tg_full": min(dot, bw) if both else None,
            key + "tg_rest_ms": 1e3 * rest_s if rest else None,
            key + "tg_rest_share": rest_s / step_s if rest else None,
            key + "tg_products": (p["weight_bytes"] / (step_s - rest_s) / 1e9
                                  if rest and step_s > rest_s else None)}


def _rates_table(rec, rows: list, threads: int):
    figures.write_table(
        "others_rates", rows,
        ["file", "arithmetic alone", "memory alone", "the two in turn", "the two overlapped",
         "the step", "its products (the step less the rest)", "the rest",
         "the step against no prefetch"],
        "GB/s of weights a decode step reads, every matrix on the file's rows, the path the "
        f"prefetch's distance is timed on (where the forward decodes "
        f"{compare.listing(record_tile_types(rec), '')} through tiles, the same decoder kept on "
        "the rows, timed in the same rounds; the tiles' figures are in the table of rows against "
        "tiles). Arithmetic: each type's products over the first "
        "rows of one of its matrices in L2, on one core, weighted by the type's bytes in the "
        f"file, times {threads} cores. Memory: chapter 1's read-only stream at the level that "
        "holds the weights. In turn: one over the sum of their inverses; overlapped: the "
        "lower. The rest: the same step with every product writing zeros instead of reading "
        f"its weights, timed in the same rounds. {TEST_NOTE} {figures.machine_line(rec)}.")
    return bool(records.results(rec, "dot_rate"))


def _gemm_best(rec, shape: str, qtype: str) -> float | None:
    """The prompt GEMM's rate (Gop/s) for a file: the best reading of that call, the same
    shape and dtype, over every file of the run that timed it (a bound is the best the call
    reached; a slower reading of the same call was a disturbed one)."""
    gm = _one(rec, "prompt_gemm", model=shape, type=qtype)
    if not gm:
        return None
    dtype = gm["params"].get("prompt_dtype")
    same = [r["value"]["max"] for r in records.results(rec, "prompt_gemm")
            if r["params"].get("model") == shape and r["params"].get("prompt_dtype") == dtype]
    return max(same + [gm["value"]["max"]])


def _pp_bound(rec, shape: str, qtype: str, pre: dict) -> float | None:
    """The prompt bound (tokens/s): chapter 2's GEMM at the file's gate shape (its best
    reading, :func:`_gemm_best`) over two operations a weight a prompt token, the output head
    counted once a prompt."""
    s = rec["settings"]
    gm = _gemm_best(rec, shape, qtype)
    per_token = pre["params"].get("products_per_token")
    shp = s.get("shapes", {}).get(shape, {})
    head = shp.get("vocab", 0) * shp.get("d", 0)  # the output head: the last row only
    pp_ops = (2 * ((per_token - head) * s["pp"] + head) / s["pp"]
              if gm and per_token else None)       # operations a prompt token
    return gm * 1e9 / pp_ops if pp_ops else None


def _case(rec, facts, key: str, ours: dict, pp_target: float) -> tuple[dict, list, dict]:
    """One file's values the page quotes, its row of the speed table, and its decode rates
    (less the prefetch's sign, which :func:`report` counts)."""
    p = ours["params"]
    shape, qtype, wb = p["model"], p["type"], p["weight_bytes"]
    level, bw = (ch1.level_of(facts, wb, rec["settings"]["threads"], ch1.read_stream(facts))
                 if facts else (None, None))       # no bound without chapter 1's record
    bound = bw * 1e9 / wb if facts else None
    pre = _one(rec, "prefill", model=shape, type=qtype)
    lt, lp = (_one(rec, n, model=shape, type=qtype) for n in ("llama_tg", "llama_pp"))
    tv = compare.against(ours, lt, TARGETS[qtype]) if lt else None
    bv = compare.against_bound(ours, bound, BOUND_SHARE) if facts else None
    pv = compare.against(pre, lp, pp_target) if lp else None
    gm = _one(rec, "prompt_gemm", model=shape, type=qtype)
    pp_bound = _pp_bound(rec, shape, qtype, pre)
    no = "not measured (no llama.cpp)"
    values = {
        key + "tg_vs_llama": tv.text() if tv else no,
        key + "tg_vs_bound": (bv.text(f"{100 * bv.ratio:.0f} % of the bound, target "
                                      f"{100 * BOUND_SHARE:.0f} %") if bv else "—"),
        key + "pp_vs_llama": pv.text() if pv else no,
        key + "pp_bound": pp_bound,
        key + "gemm_best": _gemm_best(rec, shape, qtype),
        **({key + "gemm_rate": gm["value"]["max"] if gm else None}
           if "gemm_rate" in fields(shape) else {}),
        key + "gemm_dtype": pre["params"].get("prompt_dtype"),
        key + "pp_share": records.median(pre) / pp_bound if pp_bound else None,
    }
    rates = _rates(rec, key, ours, bw if facts else None)
    values.update({k: v for k, v in rates.items() if k[len(key):] not in (
        "prefetch_sign", "prefetch_change") and (
        (shape, qtype) == CASES[0]
        or k[len(key):] in ("tg_prefetch", "tg_rest_ms", "tg_rest_share"))})
    mix = ", ".join(f"{t} {100 * b / p['file_bytes']:.0f} %"
                    for t, b in sorted(p["type_bytes"].items(), key=lambda kv: -kv[1]))
    row = [f"{shape} {qtype}", f(wb / MiB), mix, level or "—", f(bound) if bound else "—",
           f(records.median(ours)), f(records.median(lt)) if lt else "—",
           f"{100 * ours['value']['median'] / bound:.0f} %" if bound else "—",
           f(records.median(pre)), f(records.median(lp)) if lp else "—",
           f(pp_bound) if pp_bound else "—"]
    return values, row, rates


def _rate_row(name: str, key: str, rates: dict) -> list:
    """One file's row of the rates table."""
    cellv = {k: (f(rates[key + k], "GB/s") if rates[key + k] is not None else "—")
             for k in RATES}
    return [name, *(cellv[k] for k in RATES),
            (f"{rates[key + 'tg_rest_ms']:.2f} ms a token, "
             f"{figures.pct(rates[key + 'tg_rest_share'], 2)} of the step"
             if rates[key + "tg_rest_ms"] is not None else "—"),
            _bare(rates[key + "tg_prefetch"] or "—")]


def _speed_table(rec, facts, rows: list) -> None:
    s = rec["settings"]
    figures.write_table(
        "others_speed", rows,
        ["file", "MiB a token reads", "types (share of the file)", "level (chapter 1)",
         "bound (tokens/s)", "decode, ours", "decode, llama.cpp", "ours ÷ bound",
         f"prompt of {s['pp']}, ours", "prompt, llama.cpp", "prompt bound (tokens/s)"],
        f"Tokens/s, medians of {s['rounds']} rounds in turn; decode: {s['feed']} tokens after "
        f"{s['prompt']} cached; {s['threads']} threads. "
        + (f"The bound: the bytes a token reads over chapter 1's "
           f"{ch1.read_stream_name(facts)} bandwidth of the level that holds them. "
           if facts else "No bound on decoding: chapter 1's record is not here. ")
        + f"The prompt bound: the prompt's own GEMM (the integer GEMM on Q8_0 blocks where "
        f"the prompt takes int8, chapter 2's float GEMM otherwise) "
        f"at the file's gate shape, timed in the same run on the same threads and inputs, over "
        f"two operations a weight a token, the output head counted once a prompt (the prompt "
        f"computes the logits of its last row only). llama.cpp: one llama-bench repetition a "
        f"round, after its own untimed warm-up run. {figures.machine_line(rec)}."
        + figures.peer_notes(s.get("llama_cpp"), s.get("missing") or {}))


def _above_bound(rec, facts) -> dict:
    """The files whose decode ran faster than their read bound, the most by which one did,
    the level the bound read them from, and the share of that file's bytes the level above
    it holds (what could have stayed there from one token to the next); None where none did."""
    none = dict.fromkeys(("others.above_bound", "others.above_bound_of", "others.above_level",
                          "others.above_inner", "others.above_inner_share"))
    if not facts:
        return none
    th, found = rec["settings"]["threads"], []
    for shape, qtype in CASES:  # the forward's decode, and the same decoder on the rows
        for name, how in (("decode", ""), ("decode_rows", " on the file's rows")):
            ours = _one(rec, name, model=shape, type=qtype)
            if ours is None:
                continue
            wb = ours["params"]["weight_bytes"]
            level, bw = ch1.level_of(facts, wb, th, ch1.read_stream(facts))
            ratio = records.median(ours) * wb / (bw * 1e9)
            if ratio > 1:
                found.append((f"{shape} {qtype}{how}", ratio, wb, level))
    if not found:
        return none
    name, ratio, wb, level = max(found, key=lambda x: x[1])
    inner = ch1.LEVELS[ch1.LEVELS.index(level) - 1] if level in ch1.LEVELS[1:] else None
    held = ch1.level_sizes(facts["caches"], th).get(inner) if inner and facts.get("caches") else None
    return {"others.above_bound": " and ".join(n for n, *_ in found),
            "others.above_bound_of": ratio, "others.above_level": level,
            "others.above_inner": inner if held else None,
            "others.above_inner_share": min(1.0, held / wb) if held else None}


def report(rec_dir=None) -> dict:
    if not records.exists(RECORD, rec_dir):
        return _missing("not measured here (no record others.decode: run `smallem bench-others`)")
    rec = records.load(RECORD, rec_dir)
    s = rec["settings"]
    facts = ch1.facts(rec_dir)
    int8_ins = s.get("int8_instruction", s["instruction"])
    pp_target = PP_TARGETS["amx" if "AMX" in int8_ins else "vnni" if "VNNI" in int8_ins
                           else "avx2"]
    rows, values, rate_rows, signs, changes = [], {}, [], [], []
    below: dict = {"rest": [], "model": []}
    weights = None
    for shape, qtype in CASES:
        key = f"others.{slug(shape, qtype)}."
        ours = _one(rec, "decode", model=shape, type=qtype)
        if ours is None:
            values.update({key + k: None for k in fields(shape)})
            continue
        weights = weights or (ours["params"]["params"] if qtype == "Q8_0" else None)
        found, row, rates = _case(rec, facts, key, ours, pp_target)
        values.update(found)
        rows.append(row)
        signs.append(rates[key + "prefetch_sign"])
        changes.append(rates[key + "prefetch_change"])
        turn, prod = rates[key + "tg_none"], rates[key + "tg_products"]
        near = 1 - compare.SWEEP_NOISE  # below the two in turn by more than the noise
        if turn and rates[key + "tg_rate"] < near * turn:
            below["rest" if prod and prod >= near * turn else "model"].append(f"{shape} {qtype}")
        rate_rows.append(_rate_row(f"{shape} {qtype}", key, rates))
    _speed_table(rec, facts, rows)
    values.update(_above_bound(rec, facts))
    values.update(_llama_amx_share(rec))
    figures.write_table("others_types", *types_table(facts, weights, s["threads"]))
    values["others.prefetch_gains"] = signs.count(1)
    values["others.prefetch_losses"] = signs.count(-1)
    # the sizes of the changes the test told apart: the least gain, the largest loss
    gains = [c for g, c in zip(signs, changes) if g == 1 and c is not None]
    losses = [-c for g, c in zip(signs, changes) if g == -1 and c is not None]
    values["others.prefetch_gain_least"] = min(gains) if gains else None
    values["others.prefetch_loss_most"] = max(losses) if losses else None
    values["others.commit"] = rec.get("commit", "")[:7]
    values["others.ch1_measured"] = facts is not None  # the bounds need chapter 1's record
    values["others.below_rest"] = " and ".join(below["rest"]) or None
    values["others.below_model"] = " and ".join(below["model"]) or None
    values["others.prefetch_measured"] = _rates_table(rec, rate_rows, s["threads"])
    values["others.bf16_path"] = (records.load("ch2.gemm", rec_dir)["settings"].get("bf16_path")
                                  if records.exists("ch2.gemm", rec_dir) else None)
    # the files whose prompt took the float GEMM on bf16 inputs where chapter 2's bf16 path is
    # AMX's tiles: their prompt ratios set AMX against a llama.cpp built without it
    # ... and those whose prompt took the integer GEMM where it ran on AMX's tiles
    int8_amx = rec["settings"].get("int8_path") == "amx"
    amx = [f"{SHOWN.get(sh, sh)} {qt}" for sh, qt in CASES
           if (values.get(f"others.{slug(sh, qt)}.gemm_dtype") == "bf16"
               and values["others.bf16_path"] == "amx")
           or (values.get(f"others.{slug(sh, qt)}.gemm_dtype") == "int8" and int8_amx)]
    timed = [c for c in CASES if values.get(f"others.{slug(*c)}.gemm_dtype") is not None]
    values["others.prompt_amx_files"] = (
        None if not amx else "every file" if len(amx) == len(timed) > 1
        else ", ".join(amx[:-1]) + " and " + amx[-1] if len(amx) > 1 else amx[0])
    return (values | _ahead(rec, facts) | _tiles(rec, facts) | _parts(rec)
            | _settings(rec, facts, int8_ins, pp_target))


def _llama_amx_share(rec) -> dict:
    """The files whose weights llama.cpp's AMX kernels take only in part (less than nine
    tenths of their bytes: llama.AMX_TYPES), with that share and the types left out (typed:
    a list of [file, share, types]; [] where every file is theirs)."""
    partial = []
    for shape, qtype in CASES:
        ours = _one(rec, "decode", model=shape, type=qtype)
        mix = (ours or {}).get("params", {}).get("type_bytes") or {}
        total = sum(mix.values())
        if not total:
            continue
        share = sum(b for t, b in mix.items() if t in llama.AMX_TYPES) / total
        if share < 0.9:
            rest = [t for t, _ in sorted(mix.items(), key=lambda kv: -kv[1])
                    if t not in llama.AMX_TYPES and t not in ("F32", "F16")]
            partial.append([f"{shape} {qtype}", share, ", ".join(rest)])
    return {"others.llama_amx_partial": partial, "others.llama_amx_types": list(llama.AMX_TYPES)}


def llama_values(ll: dict | None, missing: dict, threads: int, has_amx: bool = False) -> dict:
    """How llama.cpp ran, typed: its source (the llama-cpp-python release that bundles it,
    and llama.cpp's own commit), the instruction sets its build switched on, AMX (on, or why
    off: :func:`smallem.book.ch4.llama.amx_off_reason`), whether llama-bench ran without its
    repacked buffers, and the threads. None where the record does not hold it."""
    out = {"others.llama_ran": bool(ll), "others.llama_missing": missing.get("llama.cpp"),
           "others.llama_bundle": None, "others.llama_commit": None, "others.llama_isa": None,
           "others.llama_amx": None, "others.llama_amx_off": None,
           "others.llama_safe": None, "others.llama_safe_why": None,
           "others.threads": threads}
    if not ll:
        return out
    b = ll.get("build") or {}
    opts = b.get("options") or []
    on = [o[len("-DGGML_"):-len("=ON")].replace("_", "-") for o in opts
          if o.startswith("-DGGML_") and o.endswith("=ON")]
    commit = ll.get("version", "").rsplit("commit ", 1)
    return out | {
        "others.llama_bundle": f"llama-cpp-python {b['version']}" if b.get("version") else None,
        "others.llama_commit": commit[1].rstrip(")").strip() if len(commit) == 2 else None,
        "others.llama_isa": ", ".join(on) if on else None,
        "others.llama_amx": llama.amx_on(opts) if opts else None,
        "others.llama_amx_off": llama.amx_off_reason(opts, has_amx, bool(b.get("safe_build"))),
        "others.llama_safe": bool(ll.get("flags")) or bool(b.get("safe_build")),
        "others.llama_safe_why": ll.get("flags_why") or b.get("why") or None}


def _settings(rec, facts, int8_ins: str, pp_target: float) -> dict:
    """The values that come from the record's settings rather than its files' rows."""
    s = rec["settings"]
    rates = s.get("prompt_rates") or {}
    return {
        "others.measured": True,
        **_tile_values(rec),
        "others.instruction": s["instruction"],
        "others.vnni": "vpdpbusd" in s["instruction"],  # else AVX2's vpmaddubsw, or plain C
        # the prefetch paragraph cites Intel's manual: on Intel's cores only it applies as is
        "others.intel": rec["machine"].get("vendor") == "GenuineIntel",
        "others.prompt_int8": any(r["params"].get("prompt_dtype") == "int8"
                                  for r in records.results(rec, "prefill")),
        "others.prompt_float_dtype": next((r["params"]["prompt_dtype"] for r in
                                           records.results(rec, "prefill")
                                           if r["params"].get("prompt_dtype") != "int8"), None),
        # the rate of the integer GEMM's path the forward took, and, where that was the
        # tiles, the vector kernel's beside it
        "others.rate_int8": rates.get("amx" if s.get("int8_path") == "amx" else "int8"),
        "others.rate_int8_vector": rates.get("int8") if s.get("int8_path") == "amx" else None,
        # a CPU with AMX_INT8 whose record timed no AMX candidate: made before that path
        "others.amx_predates": ("amx_int8" in rec["machine"]["isa"].get("extensions", [])
                                and "amx" not in rates),
        "others.int8_vector_instruction": s.get("int8_vector_instruction"),
        "others.rate_float": rates.get("float"),
        "others.int8_instruction": int8_ins, "others.pp_target": pp_target,
        **_int8_predicted(facts, s["threads"], int8_ins),
        "others.rows": s["rows_per_call"], "others.rb": _rb(),
        "others.logits_tol": _logits_tol(), **_tol_values(),
        **llama_values(s.get("llama_cpp"), s.get("missing") or {}, s["threads"],
                       any("amx" in x for x in rec["machine"]["isa"].get("extensions", [])))}
