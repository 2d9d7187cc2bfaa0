"""Chapter 4's records read into the page's tables, figures and values."""

from __future__ import annotations

import math
import re

import numpy as np

from smallem.plumbing import build
from smallem.generating import decode, quant
from .. import ch1, compare, figures, records, reference
from . import llama
from .balance import AT, _one, balance, top_rung  # noqa: F401  (AT, top_rung: read by others)
from .levels import _kv_bytes, _l3_end, core_holding, holding, level_ends, stream_name  # noqa: F401
from .levels import attention_from, one_core_bytes, study_above, threshold_fork_join
from .fresh import PROCESS_SPREAD, processes as _processes
from .peers import _equal_cells, peer_rows
from smallem.training.model import CONFIGS, get_config
from .measuring import (FORK_JOIN_REPS, PROMPT, PROMPTS, RECORD, RECORD_QUALITY, SAMPLE, STUDY_LAYERS,
                        STUDY_MIN_TOKENS, STUDY_TOKENS, STUDY_TOP, matrix_params, study_config)

f = figures.fmt
NOISE = 0.05          # a rate above its bound by more than this must say which assumption failed
L3_VS_LLAMA = 1.3     # int8 decode against llama.cpp's Q8_0, weights in the L3
DRAM_VS_LLAMA = 1.0   # ... weights several times larger than the L3
DRAM_SHARE = 0.8      # ... there, weight bytes per second against chapter 1's DRAM read stream
PP_VS_LLAMA = 1.0     # prompt processing (the ladder's prompt) against llama.cpp's pp
INT8_VS_F32 = 2.5     # int8 decode against our f32 decode, beyond the L3
QUALITY = 0.01        # int8's validation bits per byte within 1 % of f32's


def target_values() -> dict:
    return {"ch4.target_l3_is": f"{L3_VS_LLAMA:g} times", "ch4.target_dram_is": f"{DRAM_VS_LLAMA:g} times",
            "ch4.target_dram_share_is": f"{100 * DRAM_SHARE:.0f} %", "ch4.target_pp_is": f"{PP_VS_LLAMA:g} times",
            "ch4.target_int8_is": f"{INT8_VS_F32:g} times", "ch4.target_quality_is": f"{100 * QUALITY:g} %",
            "ch4.target_spread": PROCESS_SPREAD}


def _verdict(ours, theirs, target: float) -> str:
    """reached / not reached / not shown for ours against theirs at ``target`` times, by the
    one-sided signed-rank test of the rounds (compare.against; a parity target at the parity margin)."""
    return compare.against(ours, theirs, target).text()


def bandwidth_bound(facts, weight_bytes: float, threads: int) -> tuple[str, float]:
    """(the level that holds ``weight_bytes`` on ``threads`` threads, its bandwidth there in
    bytes/s): :func:`holding`."""
    h = holding(facts, weight_bytes, threads)
    return ("n/a", math.nan) if h is None else (h["level"], h["bw"])


def resident_bound(facts, nbytes: float, threads: int) -> float:
    """Bytes/s of a stream of ``nbytes`` from DRAM if as much of it as the L3's plateau holds
    stayed there between passes: the most that keeping part of it closer explains."""
    if facts is None:
        return math.nan
    ext = facts[f"{ch1.read_stream(facts)}_spans"]
    th = threads if threads in ext else max(ext)
    kept = min(nbytes, _l3_end(facts))
    return nbytes / (kept / (ext[th]["L3"]["bw"] * 1e9) + (nbytes - kept) / (ext[th]["DRAM"]["bw"] * 1e9))


def _prompt_bound(facts, p, rung: int, weights: int, amx: bool = False):
    """(tokens/s, what) the compute bound allows a prompt record ``p``: two operations per
    weight per token at chapter 1's peak on its threads, f32 for the GEMM prompt, int8 for
    rung 5's; None without the records it needs. Rung 0 has no prompt of its own."""
    if facts is None or p is None or rung == AT["no_cache"]:
        return None
    # rung 5 takes the path its decoder measured faster (older records: the int8 call):
    # the int8 call and the integer GEMM (vpdpbusd on int8 blocks) are bound by the int8
    # peak, the f32 GEMM by the f32 one
    kind = ("int8" if rung >= AT["prompt_path"] and p["params"].get("prefill_path", "c") in ("c", "int8")
            else "f32")
    if kind == "int8" and amx and p["params"].get("prefill_path") == "int8":
        kind = "amx_int8"  # the integer GEMM on AMX tiles (``amx``: where the record says so)
    # rungs 1-4 send the prompt through the f32 GEMM, on every core whatever the decoder's
    # threads; rung 5 through the decoder's own call, on its threads
    th = p["params"].get("threads", facts["cores"]) if kind == "int8" else facts["cores"]
    peaks = {t: v for (k, t), v in facts["peak"].items() if k == kind}
    if not peaks:
        return None
    peak = peaks.get(th, peaks[max(peaks)])
    # chapter 1's probes: the int8 dot product's (vpdpbusd, or what stands in for it), or AMX's
    what = {"amx_int8": "AMX int8 tile", "int8": "int8 dot"}.get(kind, kind)
    return peak * 1e9 / (2 * weights), f"{what} peak on {th} thread{'s' if th > 1 else ''}"


def _int8_ceiling_note(facts, rung: int, threads: int, weights: int, bound: float,
                       values: dict, lower: float | None = None) -> str:
    """Where chapter 1's int8 dot peak on ``threads`` allows an int8 rung's decode fewer
    tokens/s (two operations a weight) than its bandwidth ``bound``: the cell's clause that
    says so, and, where it is below the ``lower`` bound too (a rung between two levels: their
    lower one), the rung noted in ``ch4.int8_peak_binds``; else ""."""
    peak = facts["peak"].get(("int8", threads)) if facts and weights and rung >= AT["int8"] else None
    ceil = peak * 1e9 / (2 * weights) if peak else None
    if not ceil or ceil >= bound:
        return ""
    if lower is None or ceil < lower:
        values["ch4.int8_peak_binds"] = [*(values.get("ch4.int8_peak_binds") or []), rung]
    return (f"; the int8 dot peak on {figures.plural(threads, 'thread')} allows "
            f"{figures.fmt(ceil, 'tokens/s')}" + (", less than the first" if lower else ""))


def _ratio(a, b) -> float:
    return records.median(a) / records.median(b) if a and b else math.nan


def _ladder(rec, facts, values):
    """Chapter 4's ladder table (our rungs, then the peers and the reference) and its values."""
    s = rec["settings"]["ladder"]
    cfg = s["config"]["name"]
    rung3 = dict(s["rungs"]).get(AT["int8"], "")
    values["ch4.int8_instruction"] = s.get("int8_instruction") or rung3.partition(", ")[2] or "n/a"
    weights = matrix_params(get_config(cfg)) if cfg in CONFIGS else 0
    values["ch4.llama_f32_share"] = None
    rows = _rung_rows(rec, facts, s, weights, values) + peer_rows(rec, facts, s, values)
    note = (f"Model {cfg} with random weights ({s['prompt']}-byte prompt, then "
            f"{s['decode_tokens']} tokens timed per round, {s['rounds']} rounds; rung 0 timed "
            f"alone on {s['rung0_tokens']} tokens). Prompt column: {s['prefill_tokens']} tokens "
            f"from position 0. Bytes of the decode bound: the weights and the keys and values "
            f"cached at the last timed position (f32); its level: chapter 1's staircase. "
            f"{figures.machine_line(rec)}."
            + (figures.peer_notes(rec["settings"]["llama_cpp"], {}) if rec["settings"].get("llama_cpp") else "")
            + _equal_cells(rows))
    figures.write_table("ch4_ladder", rows, ["rung", "what it adds", "decode", "against the "
                                             "rung before", "weights per token",
                                             "decode predicted: bytes ÷ bandwidth",
                                             "prompt", "prompt predicted: compute bound"], note)
    _ladder_values(rec, facts, s, cfg, values)
    values["ch4.threshold_fj_us"] = threshold_fork_join(rec, facts)




def _rung_rows(rec, facts, s, weights, values) -> list[list[str]]:
    """A row per rung: its decode against the rung before and against its bound (the bytes a
    token reads, weights and the cached keys and values, over the bandwidth of the level that
    holds them; rung 0's prefix at the f32 peak), its prompt against its compute bound."""
    rows, prev = [], None
    values["ch4.gap_rungs"] = None  # the rungs whose bytes lie between a cache's plateau and DRAM's
    values["ch4.int8_peak_binds"] = None  # the int8 rungs whose arithmetic allows less than the bytes
    values["ch4.near_above"], values["ch4.noise_margin"] = None, NOISE  # above by less than NOISE
    above = []  # (share, rung, level, data, level size) of decodes above their bound
    draws = []  # (level held, rung, threads, bytes a token reads, the rate it drew them at)
    for i, what in s["rungs"]:
        r = _one(rec, "decode", rung=i)
        if r is None:
            continue
        p = _one(rec, "prefill", rung=i)
        wb = r["params"].get("weight_bytes")
        th = r["params"].get("threads", rec["settings"]["threads"])
        data = wb + _kv_bytes(s, s["decode_tokens"]) if wb else None
        h = holding(facts, data, th) if data else None
        share = records.median(r) * data / h["bw"] if h else math.nan
        pp = _prompt_bound(facts, p, i, weights,
                           amx=rec["settings"].get("prompt_int8_path") == "amx")
        bound_cell = "—"
        if i == AT["no_cache"] and facts is not None and weights:
            # no cache: each token runs its whole prefix through the products again
            prefix = s["prompt"] + s["rung0_tokens"] / 2
            peak = facts["peak"][("f32", facts["cores"])]
            bound = peak * 1e9 / (2 * weights * prefix)
            share = records.median(r) / bound
            values["ch4.rung0_prefix"] = round(prefix)
            wb = 4 * weights  # one forward over the prefix reads each f32 weight once
            bound_cell = f"{f(bound, 'tokens/s')}: {100 * share:.0f} % of it (the prefix at the f32 peak)"
        elif h and h["gap_bw"]:
            # past the cache's last measured point, short of DRAM's first: against both
            gap_share = records.median(r) * data / h["gap_bw"]
            bound_cell = (f"{f(h['bw'] / data, 'tokens/s')} from the {h['level']}, "
                          f"{f(h['gap_bw'] / data, 'tokens/s')} from DRAM: {100 * share:.0f} % "
                          f"and {100 * gap_share:.0f} % of them ({compare.size(data / 1024)}, "
                          f"past the {h['level']}'s plateau in chapter 1's {stream_name(facts)} "
                          f"on {figures.plural(th, 'thread')}, which ends at "
                          f"{compare.size(h['size'] / 1024)}, short of DRAM's, which starts at "
                          f"{compare.size(h['gap_first'] / 1024)})")
            values["ch4.gap_rungs"] = [*(values.get("ch4.gap_rungs") or []), i]
            bound_cell += _int8_ceiling_note(facts, i, th, weights, h["bw"] / data, values, h["gap_bw"] / data)
        elif h:
            where = (f"{h['level']}, whose plateau in chapter 1's {stream_name(facts)} on "
                     f"{figures.plural(th, 'thread')} ends at {compare.size(h['size'] / 1024)}"
                     if h["level"] != "DRAM" else f"DRAM, read on {figures.plural(th, 'thread')}")
            bound_cell = (f"{f(h['bw'] / data, 'tokens/s')}: {100 * share:.0f} % of it "
                          f"({compare.size(data / 1024)} in {where})")
            bound_cell += _int8_ceiling_note(facts, i, th, weights, h["bw"] / data, values)
            if share > 1 + NOISE:
                above.append((share, i, h["level"], data, h["size"]))
            elif share > 1:
                values["ch4.near_above"] = [*(values.get("ch4.near_above") or []), i]
        if h and data:
            draws.append((h, i, th, data, records.median(r) * data))
        if i == AT["prompt_path"] and p and p["params"].get("prefill_path") in PATHS:
            # the record's label names two paths; the page's, the one this prompt took
            what = f"prompt path chosen by measurement: {PATHS[p['params']['prefill_path']]} here"
        rows.append([str(i), what, f(records.median(r), "tokens/s"),
                     _versus(r, prev) if prev else "—",
                     compare.size(wb / 1024) if wb else "—", bound_cell,
                     f(records.median(p), "tokens/s") if p else "—",
                     f"{f(pp[0], 'tokens/s')} ({pp[1]}): {100 * p['value']['median'] / pp[0]:.0f} %"
                     if pp else "—"])
        if pp and i == AT["prompt_path"]:  # the path rung 5 took, which the page discusses
            values[f"ch4.rung{i}_prompt_of_bound"] = records.median(p) / pp[0]
        prev = r
        values[f"ch4.rung{i}_toks"] = f(records.median(r), "tokens/s")
    _l3_miss(facts, draws, values)
    # the decode furthest above its bound, for the sentence that says which assumption failed
    top = max(above) if above else None
    values["ch4.above_rung"] = top[1] if top else None
    values["ch4.above_share"] = top[0] if top else None
    values["ch4.above_level"] = top[2] if top else None
    values["ch4.above_mib"] = top[3] / 2**20 if top else None
    values["ch4.above_level_mib"] = top[4] / 2**20 if top else None
    values["ch4.above_others"] = sorted(a[1] for a in above if a is not top)
    return rows


PATHS = {"c": "the int8 call", "gemm": "the f32 GEMM", "int8": "the integer GEMM"}  # rung 5's prompt


def _l3_miss(facts, draws: list, values) -> None:
    """The first rung charged to the L3 (its plateau's upper half) that drew its bytes nearer
    DRAM's rate, unless another rung drew the same bytes on as many threads nearer the L3's,
    or on any threads faster than DRAM gives them (the bytes were in the L3 then)."""
    dram_of = lambda th: holding(facts, math.inf, th)["bw"]  # noqa: E731
    for h, i, th, data, gbs in draws:
        near_l3 = (dram_of(th) + h["bw"]) / 2
        if not (h["level"] == "L3" and not h["gap_bw"] and data > h["size"] / 2
                and (1 - NOISE) * dram_of(th) <= gbs < near_l3):
            continue
        if any(d == data and j != i and ((t == th and g >= near_l3) or g > (1 + NOISE) * dram_of(t))
               for _, j, t, d, g in draws):
            continue
        values.update({"ch4.l3_miss_rung": i, "ch4.l3_miss_gbs": gbs / 1e9,
                       "ch4.l3_miss_dram_gbs": dram_of(th) / 1e9, "ch4.l3_miss_l3_gbs": h["bw"] / 1e9,
                       "ch4.l3_miss_mib": data / 2**20, "ch4.l3_miss_end_mib": h["size"] / 2**20})
        return


def _versus(r, base) -> str:
    """:func:`compare.versus`, a factor where the rate more than doubled ("18.8×", not
    "1779.1 % faster")."""
    x = records.median(r) / records.median(base)
    if x < 2:
        return compare.versus(r, base)
    d = compare.difference(r, base)
    return f(x) + "×" + (compare.note(d.note()) if d.rounds is not None else " (timed apart)")



def _ladder_values(rec, facts, s, cfg, values) -> None:
    values["ch4.ladder_config"] = cfg
    p5 = _one(rec, "prefill", rung=AT["prompt_path"])
    path = PATHS
    values["ch4.rung5_prompt_path"] = (
        f"{path[p5['params']['prefill_path']]} (measured faster at "
        + ", ".join(f"{n} tokens: {path[v]}" for n, v in p5["params"]["prefill_choice"].items())
        + ")" if p5 and "prefill_path" in p5["params"] else
        "the int8 call (a record made before the choice was measured)")
    values["ch4.llama_reps"] = str(s.get("llama_reps", "one (a record made before steady state)"))
    _peer_values(rec, values)
    # a product y = x W reads each f32 weight (4 bytes) for one multiply-add (2 operations)
    values["ch4.f32_ridges"] = (ch1.ridge_position(facts, 2 / 4, rec["settings"]["threads"],
                                                   ch1.read_stream(facts)) if facts else None)
    c = s["config"]
    values["ch4.ladder_regions"] = 5 * c["n_layer"] + 1  # 4 products, 1 attention a block, the head
    values["ch4.kv_mib"] = compare.size(2 * c["n_layer"] * c["context"] * c["d_model"] * 4 / 1024)
    r4 = _one(rec, "decode", rung=AT["threads"])
    r5 = _one(rec, "decode", rung=AT["prompt_path"])
    values["ch4.sync_factor"] = decode.Decoder.SYNC_SHARE
    values["ch4.choices_kept"] = bool(rec["settings"].get("choices_kept"))
    # each decoder measures its own threshold when it is made: rung 4's, rung 5's
    values["ch4.par_min_kib"] = (r4["params"]["par_min_bytes"] / 1024
                                 if r4 and "par_min_bytes" in r4["params"] else None)
    values["ch4.rung5_par_min_kib"] = (r5["params"]["par_min_bytes"] / 1024
                                       if r5 and "par_min_bytes" in r5["params"] else None)
    if cfg in CONFIGS:  # how many of a block's products each threshold sends to the threads
        sizes = _block_products(get_config(cfg))
        values["ch4.block_products"] = len(sizes)
        for key, r in (("ch4.rung4_team_n", r4), ("ch4.rung5_team_n", r5)):
            pm = r["params"].get("par_min_bytes") if r else None
            values[key] = sum(b >= pm for b in sizes) if pm is not None else None
        # the attention of a token at position p reads 8 (p + 1) d bytes of keys and values
        # a layer (the C forward's count, kernels_c/forward/attend.c): the threads take it
        # from the first position where that reaches rung 4's threshold
        pm = r4["params"].get("par_min_bytes") if r4 else None
        d = get_config(cfg).d_model
        first = attention_from(pm, d)
        last = s["prompt"] + s["decode_tokens"] - 1
        values["ch4.rung4_attn_from"] = first if first is not None and first <= last else None
        values["ch4.first_timed"] = s["prompt"]  # the position of the first timed token
        # whether any region of a timed token went to the team at rung 4
        values["ch4.rung4_teamed"] = bool(values["ch4.rung4_team_n"]) or \
            values["ch4.rung4_attn_from"] is not None
        values["ch4.rungs45_one_core"] = one_core_bytes(values, len(sizes), d, r4, r5,
                                                         s["prompt"])
    if r4 and r5:
        d = compare.difference(r5, r4)
        values["ch4.rung5_vs_rung4_sign"] = d.sign if (d.sign > 0) == (d.pct > 0) else 0
        values["ch4.rung5_vs_rung4"] = compare.versus(r5, r4)
    else:
        values["ch4.rung5_vs_rung4_sign"], values["ch4.rung5_vs_rung4"] = None, None
    w8, w32 = _one(rec, "decode", rung=AT["int8"]), _one(rec, "decode", rung=AT["c_call"])
    if w8 and w32:
        values["ch4.weights_f32"] = compare.size(w32["params"]["weight_bytes"] / 1024)
        values["ch4.weights_int8"] = compare.size(w8["params"]["weight_bytes"] / 1024)
    values["ch4.prompt_tokens"] = str(s["prefill_tokens"])
    values["ch4.decode_tokens"] = str(s["decode_tokens"])
    r3, r4 = _one(rec, "decode", rung=AT["int8"]), _one(rec, "decode", rung=AT["threads"])
    if r3 and r4:
        _threads_rounds(r4, r3, values)
    r32, l32 = _one(rec, "decode", case="f32-threads"), _one(rec, "llama_tg", dtype="f32")
    if r32 and l32:  # our f32 decode against llama.cpp's, same threads, same rounds
        d = compare.difference(r32, l32)
        values["ch4.f32_vs_llama"] = records.median(r32) / records.median(l32)
        values["ch4.f32_vs_llama_sign"] = d.sign if (d.sign > 0) == (d.pct > 0) else 0
        values["ch4.f32_vs_llama_text"] = compare.versus(r32, l32)
    t = top_rung(rec)
    r0, top = _one(rec, "decode", rung=AT["no_cache"]), _one(rec, "decode", rung=t)
    last = max(i for i, _ in s["rungs"])
    values["ch4.top_rung"], values["ch4.last_rung"] = t, last
    values["ch4.top_toks"] = records.median(top) if top else None
    rl = _one(rec, "decode", rung=last)
    values["ch4.last_vs_top"] = compare.versus(rl, top) if top and rl and last != t else None
    if r0 and top:
        values["ch4.climb"] = _ratio(top, r0)
    # the top picked by its median from rungs 4 and 5, which decode with the same code: whether
    # the rounds tell the two apart
    values["ch4.top_tied"] = (t in (AT["threads"], AT["prompt_path"])
                              and values.get("ch4.rung5_vs_rung4_sign") == 0)


def _peer_values(rec, values) -> None:
    """How the peers ran, as the record holds it: llama.cpp's source (the llama-cpp-python
    sdist that bundles it, its version string), the instruction sets its build named, AMX
    off; PyTorch's version and threads."""
    st = rec["settings"]
    ll = st.get("llama_cpp") or {}
    build = ll.get("build") or {}
    opts = build.get("options") or []
    on = [o[len("-DGGML_"):-len("=ON")] for o in opts if o.startswith("-DGGML_") and o.endswith("=ON")]
    version = ll.get("version") or ""
    commit = version.rpartition("commit ")[2].rstrip(")") if "commit " in version else None
    values["ch4.llama_measured"] = bool(_one(rec, "llama_tg", dtype="q8_0"))
    values["ch4.llama_commit"] = commit
    values["ch4.llama_sdist"] = build.get("version")
    values["ch4.llama_isa"] = ", ".join(x.replace("_", "-") for x in on if x != "NATIVE") or None
    values["ch4.llama_amx"] = llama.amx_on(opts) if opts else None
    values["ch4.llama_safe"] = bool(build.get("safe_build")) or bool(ll.get("flags"))
    values["ch4.llama_safe_why"] = build.get("why") or ll.get("flags_why") or None
    values["ch4.threads"] = st["threads"]
    values["ch4.has_amx"] = any("amx" in x for x in rec["machine"]["isa"].get("extensions", []))
    values["ch4.llama_amx_off"] = llama.amx_off_reason(opts, values["ch4.has_amx"],
                                                       bool(build.get("safe_build")))
    values["ch4.prompt_amx"] = st.get("prompt_int8_path") == "amx"  # rung 5's integer prompt
    values["ch4.prompt_path_kept"] = st.get("prompt_int8_path") is not None  # older: no key
    t = _one(rec, "decode", case="torch-f32")
    values["ch4.torch_measured"] = t is not None
    values["ch4.torch_version"] = st.get("torch") if isinstance(st.get("torch"), str) else None
    values["ch4.torch_threads"] = t["params"].get("threads") if t else None
    missing = st.get("missing") or {}
    values["ch4.llama_missing_why"] = (missing.get("llama.cpp") or ll.get("why")
                                       or "not found: `make llama` builds it")
    values["ch4.torch_missing_why"] = missing.get("torch-f32") or "not installed"


def _groups(rates: list[float], gap: float = 1.5) -> list[list[float]]:
    """The rounds' rates split where two neighbours (sorted) differ by more than ``gap``
    times: one group for a unimodal set, two or more where the rounds fall apart."""
    out = []
    for x in sorted(rates):
        if out and x <= out[-1][-1] * gap:
            out[-1].append(x)
        else:
            out.append([x])
    return out


def _threads_rounds(r4, r3, values):
    """Rung 4 (threads) round by round against rung 3 (one thread), timed in the same
    rounds: in how many it was slower, and whether its rounds form one group or several."""
    a, b = compare.per_round_rates(r4), compare.per_round_rates(r3)
    values["ch4.rung4_any_slower"] = False
    if not a or len(a) != len(b):
        values["ch4.rung4_slower"] = values["ch4.rung4_rounds"] = values["ch4.rung4_groups"] = None
        return
    slower = sum(x < y for x, y in zip(a, b))
    values["ch4.rung4_slower"], values["ch4.rung4_rounds"] = slower, len(a)
    values["ch4.rung4_any_slower"] = slower > 0 or len(_groups(a)) > 1
    groups = _groups(a)
    if len(groups) == 1:
        values["ch4.rung4_groups"] = (f"every round lay between {f(min(a), 'tokens/s')} "
                                      f"and {f(max(a), 'tokens/s')}, with no gap between neighbouring "
                                      f"rounds wide enough to split them into groups")
    else:
        parts = [f"{len(g)} near {f(float(np.median(g)), 'tokens/s')}" for g in reversed(groups)]
        values["ch4.rung4_groups"] = ("they fall into separate groups, " + ", ".join(parts[:-1])
                                      + " and " + parts[-1])


def _targets(rec, values, rec_dir=None):
    top = top_rung(rec)
    last = max(i for i, _ in rec["settings"]["ladder"]["rungs"])
    ours = _one(rec, "decode", rung=top)
    q8 = _one(rec, "llama_tg", dtype="q8_0")
    out = []
    facts = ch1.facts(rec_dir)
    held = (holding(facts, ours["params"]["weight_bytes"], ours["params"]["threads"])
            if ours and "weight_bytes" in ours["params"] else None)
    # None without chapter 1's record; "DRAM" between the L3's plateau and DRAM's (not in the L3)
    level = ("DRAM" if held["gap_bw"] else held["level"]) if held else None
    values["ch4.ladder_level"] = level
    values["ch4.ladder_gap"] = bool(held and held["gap_bw"])  # past the L3's plateau, short of DRAM's
    values["ch4.ladder_in_l3"] = level == "L3"
    if ours and q8:
        x = _ratio(ours, q8)
        values["ch4.vs_llama_ladder"] = f"{f(x)} times"
        rl = _one(rec, "decode", rung=last)
        values["ch4.vs_llama_last"] = f"{f(_ratio(rl, q8))} times" if rl and last != top else None
        if level == "L3":  # else the study's model inside the measured L3 plateau decides it
            values["ch4.vs_llama_l3"] = f"{f(x)} times"
            values["ch4.l3_params"] = f"the ladder's {values['ch4.ladder_config']}"
            values["ch4.l3_llama_measured"] = True
            out.append(f"int8 decode, weights in the L3 (the ladder's model, rung {top}, its "
                       f"fastest int8 decode), against llama.cpp's Q8_0: "
                       + _verdict(ours, q8, L3_VS_LLAMA))
    # the prompt: the fastest prompt of the int8 rungs (rung 5's measured path, as a rule)
    pps = {i: p for i, _ in rec["settings"]["ladder"]["rungs"]
           if i >= AT["int8"] and (p := _one(rec, "prefill", rung=i))}
    pr = max(pps, key=lambda i: records.median(pps[i])) if pps else top
    values["ch4.pp_rung"] = pr if pps else None
    pp, lpp = _one(rec, "prefill", rung=pr), _one(rec, "llama_pp", dtype="q8_0")
    if pp and lpp:
        x = _ratio(pp, lpp)
        values["ch4.pp_vs_llama"] = f"{f(x)} times"
        out.append(f"prompt of {rec['settings']['ladder']['prefill_tokens']} tokens (rung {pr}'s, "
                   f"the fastest of the int8 rungs) against llama.cpp's Q8_0 pp: " + _verdict(pp, lpp, PP_VS_LLAMA))
    return out


def _study(rec, facts, values):
    """The L3 study: its figure, and the targets and values of the models in the L3, beyond
    it, and the smallest."""
    pts = records.results(rec, "study")
    values["ch4.study_measured"] = bool(pts)
    if not pts:
        return []
    widths = rec["settings"]["study"]["widths"]
    by = {(r["params"]["d"], r["params"]["kind"]): r for r in pts}
    st = rec["settings"]["study"]
    per = [by[d, "int8"]["params"].get("decoded", st["decode_tokens"]) for d in widths]
    values["ch4.study_tokens"] = (f"{per[0]} tokens a round" if min(per) == max(per) else
                                  f"from {max(per)} tokens a round on the smallest models to "
                                  f"{min(per)} on the largest")
    values["ch4.study_round"] = (f"{f(1000 * st['round_seconds'])} ms" if "round_seconds" in st
                                 else None)
    if facts:  # where the measured plateaus end at the study's threads (at most each size)
        ends = level_ends(facts, st.get("threads", rec["settings"]["threads"]))
        values["ch4.l2_end_mib"] = ends["L2"] / 2**20 if "L2" in ends else None
        values["ch4.l3_end_mib"] = _l3_end(facts) / 2**20
    lla = {r["params"]["study_d"]: r for r in records.results(rec, "llama_tg") if "study_d" in r["params"]}
    _study_figure(rec, facts, widths, by, lla)
    out = _study_l3(facts, widths, by, lla, values)
    out += _study_big(facts, widths[-1], by, lla, values)
    values.update(study_above(facts, widths, by, NOISE))
    _study_small(rec, facts, widths[0], by, values)
    return out


def _study_figure(rec, facts, widths, by, lla):
    """Decode speed against model size, with each level's bound and where the plateaus end."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    params = np.array([by[d, "int8"]["params"]["params"] for d in widths]) / 1e6
    style = {"int8": ("tab:blue", "int8, all cores"), "f32": ("tab:red", "f32, all cores"),
             "int8-1": ("tab:cyan", "int8, one core")}
    for kind, (color, label) in style.items():
        y = [records.median(by[d, kind]) for d in widths]
        ax.plot(params, y, "o-", color=color, label=label)
        bound = []
        for d in widths:
            r = by[d, kind]
            _, bw = bandwidth_bound(facts, r["params"]["weight_bytes"], r["params"]["threads"])
            bound.append(bw / r["params"]["weight_bytes"])
        if kind != "int8-1" and facts:  # no bound without chapter 1's record
            ax.plot(params, bound, ":", color=color, lw=1, label=f"{label.split(',')[0]}: weight "
                    "bytes ÷ bandwidth of their level")
    if lla:
        ax.plot(params, [records.median(lla[d]) if d in lla else np.nan for d in widths], "s--",
                color="tab:green", label="llama.cpp Q8_0, all cores")
    th = rec["settings"]["threads"]
    # where the measured plateaus end (chapter 1's staircase at these threads), in bytes
    ends = level_ends(facts, th) if facts else {}
    ax.set_xscale("log")
    ax.set_yscale("log")
    marks = [(ends.get(lv, 0) / 1.0625, f" int8 fill the {lv}", "grey")
             for lv in ("L2", "L3")]
    marks.append((ends.get("L3", 0) / 4, " f32 fill the L3", "tab:red"))
    for size, text, color in marks:  # where the weights fill a level (parameters)
        if size:
            ax.axvline(size / 1e6, color=color, lw=0.8, ls="--")
            ax.text(size / 1e6, 0.02, text, transform=ax.get_xaxis_transform(), fontsize=8,
                    color=color, rotation=90, va="bottom")
    ax.set_xlabel("parameters (millions)")
    ax.set_ylabel("tokens/s, one sequence")
    ax.legend(fontsize=7)
    ax.set_title("Decode speed against model size")
    figures.save(fig, "ch4_l3")


def _study_l3(facts, widths, by, lla, values) -> list[str]:
    """The largest model whose int8 weights sit in the measured L3 plateau, against
    llama.cpp (unless the ladder's model was there), and of those the largest whose f32
    weights no longer do: int8 against f32 there."""
    def level(r):  # None between a cache's plateau and DRAM's: in neither
        h = holding(facts, r["params"]["weight_bytes"], r["params"]["threads"])
        return None if h is None or h["gap_bw"] else h["level"]

    # the models whose int8 weights sit in the measured L3 plateau; of those, where f32 no longer does
    in_l3 = [d for d in widths if level(by[d, "int8"]) == "L3"]
    mid = [d for d in in_l3 if level(by[d, "f32"]) != "L3"]  # DRAM's, or past the L3's plateau
    out = []
    if "ch4.vs_llama_l3" not in values or values["ch4.vs_llama_l3"] == NOT_MEASURED:
        values["ch4.l3_params"] = "no model of the study"
        if facts is None:  # no level without chapter 1's record: no L3 target
            values["ch4.l3_params"] = None
            out.append("int8 decode, weights in the L3, against llama.cpp's Q8_0: —")
        elif in_l3:
            m8 = by[in_l3[-1], "int8"]
            values["ch4.l3_params"] = f(m8["params"]["params"] / 1e6, "M parameters")
            if in_l3[-1] in lla:
                values["ch4.vs_llama_l3"] = f"{f(_ratio(m8, lla[in_l3[-1]]))} times"
                values["ch4.l3_llama_measured"] = True
                out.append(f"int8 decode, weights in the L3 (the study's "
                           f"{values['ch4.l3_params']}), against llama.cpp's Q8_0: "
                           + _verdict(m8, lla[in_l3[-1]], L3_VS_LLAMA))
        else:
            out.append("int8 decode, weights in the L3, against llama.cpp's Q8_0: not measured "
                       "(no model of the study has its int8 weights inside the measured L3 "
                       "plateau)")
    if mid:
        m8, m32 = by[mid[-1], "int8"], by[mid[-1], "f32"]
        values["ch4.mid_params"] = f(m8["params"]["params"] / 1e6, "M parameters")
        values["ch4.mid_int8_vs_f32"] = _ratio(m8, m32)
        # the gain fewer bytes alone give, had both come from one level
        values["ch4.mid_bytes_ratio"] = m32["params"]["weight_bytes"] / m8["params"]["weight_bytes"]
    else:
        values["ch4.mid_params"] = values["ch4.mid_int8_vs_f32"] = values["ch4.mid_bytes_ratio"] = None
    return out


def _study_big(facts, big, by, lla, values) -> list[str]:
    """The largest model: int8 against f32, its weights' bytes per second against the
    bound of their level, and against llama.cpp."""
    out = []
    b8, b32 = by[big, "int8"], by[big, "f32"]
    x = _ratio(b8, b32)
    out.append(f"int8 against our f32 on the largest model ({f(b8['params']['params'] / 1e6, 'M')} "
               f"parameters): " + _verdict(b8, b32, INT8_VS_F32))
    values["ch4.big_params"] = f(b8["params"]["params"] / 1e6, "M parameters")
    values["ch4.big_int8_mib"] = compare.size(b8["params"]["weight_bytes"] / 1024)
    values["ch4.big_int8_vs_f32"] = x
    level, bw = bandwidth_bound(facts, b8["params"]["weight_bytes"], b8["params"]["threads"])
    gbs = records.median(b8) * b8["params"]["weight_bytes"]
    values["ch4.big_level"] = level if facts else None
    values["ch4.big_gbs"] = gbs / 1e9
    values["ch4.big_bw"] = bw / 1e9 if bw == bw else None
    values["ch4.big_share"] = gbs / bw if bw == bw else None
    values["ch4.big_above"] = bool(bw == bw and gbs > (1 + NOISE) * bw)
    # f32 on the same model: its weights' bytes a second against the bound of their level
    _, bw32 = bandwidth_bound(facts, b32["params"]["weight_bytes"], b32["params"]["threads"])
    gbs32 = records.median(b32) * b32["params"]["weight_bytes"]
    values["ch4.big_f32_share"] = gbs32 / bw32 if bw32 == bw32 else None
    # above DRAM's bound: could the L3 keeping as much of the weights as its plateau holds
    # explain it? the most that explains, and the L3's size
    kept = resident_bound(facts, b8["params"]["weight_bytes"], b8["params"]["threads"])
    values["ch4.big_resident_gbs"] = kept / 1e9 if kept == kept else None
    values["ch4.big_resident_explains"] = bool(kept == kept and gbs <= (1 + NOISE) * kept)
    values["ch4.l3_end_mib"] = _l3_end(facts) / 2**20 if facts else None
    if level == "DRAM":
        out.append(f"weight bytes per second on that model against chapter 1's DRAM "
                   f"{stream_name(facts)}: "
                   + compare.against_bound(b8, bw / b8["params"]["weight_bytes"], DRAM_SHARE)
                   .text(f"{figures.pct(gbs / bw)}, target {100 * DRAM_SHARE:.0f} %"))
    elif facts is None:  # no level, no bound
        out.append(f"weight bytes per second on that model against chapter 1's DRAM "
                   f"{stream_name(facts)}: —")
    else:
        out.append(f"the largest model's int8 weights ({values['ch4.big_int8_mib']}) still fit "
                   f"the {level} here: the DRAM target could not be measured")
    if big in lla:
        x = _ratio(b8, lla[big])
        values["ch4.vs_llama_big"] = f"{f(x)} times"
        values["ch4.vs_llama_big_measured"] = True
        out.append(f"int8 decode on that model against llama.cpp's Q8_0: "
                   + _verdict(b8, lla[big], DRAM_VS_LLAMA))
    return out


def _study_small(rec, facts, small, by, values) -> None:
    """The smallest model on one core and on all: its fixed cost per token, the fork-joins
    of the regions that go to the team, and the prediction from both."""
    s1, s2 = by[small, "int8-1"], by[small, "int8"]
    values["ch4.small_params"] = f(s1["params"]["params"] / 1e6, "M parameters")
    values["ch4.small_one_core"] = f(records.median(s1), "tokens/s")
    values["ch4.small_all_cores"] = f(records.median(s2), "tokens/s")
    values["ch4.small_all_vs_one"] = compare.versus(s2, s1)
    values["ch4.small_differs"] = compare.difference(s2, s1).sign != 0
    largest, par_min = _small_regions(rec, small, s2)
    teamed = par_min is None or largest >= par_min
    values["ch4.small_largest_kib"] = largest / 1024
    values["ch4.small_par_min_kib"] = par_min / 1024 if par_min is not None else None
    values["ch4.small_teamed"] = teamed
    fj = _one(rec, "fork_join", kind="pool")
    values["ch4.fork_join_us"] = 1e6 * records.median(fj) if fj else None
    values["ch4.fork_join_reps"] = FORK_JOIN_REPS
    if fj:
        L = rec["settings"]["study"]["layers"]
        per = (5 * L + 1) * records.median(fj)
        values["ch4.regions"] = 5 * L + 1
        values["ch4.study_layers"] = L
        # against the one-core token, the time the team's share is decided against (the
        # all-core token already holds the fork-joins it pays)
        values["ch4.sync_share"] = per * records.median(s1)
        # all cores: one core's fixed cost per token (its measured time less its bytes at
        # their level's bandwidth: Python, the call, the sampling), plus the regions'
        # fork-joins, plus the bytes at the bandwidth of all cores
        wb = s2["params"]["weight_bytes"]
        _, bw = bandwidth_bound(facts, wb, s2["params"]["threads"])
        # one core's weights at the level that holds them for one core (its L2 where they
        # fit a core's L2 plateau, as the figure's bound holds them on all cores)
        h1 = core_holding(facts, s1["params"]["weight_bytes"])
        bw1 = h1["bw"] if h1 else math.nan
        fixed = 1.0 / records.median(s1) - s1["params"]["weight_bytes"] / bw1
        ok = fixed == fixed and fixed > 0
        values["ch4.small_fixed_us"] = 1e6 * fixed if ok else None
        values["ch4.small_token_us"] = 1e6 / records.median(s1)
        values["ch4.small_int8_mib"] = s1["params"]["weight_bytes"] / 2**20
        values["ch4.small_fixed_level"] = h1["level"] if h1 else None
        values["ch4.small_fixed_gbs"] = bw1 / 1e9 if h1 else None
        values["ch4.small_core_mib"] = h1["size"] / 2**20 if h1 else None
        fixed = fixed if ok else math.nan
        # a prediction only where regions go to the team: else the decoder given all cores
        # does the one-core decoder's work, and its "prediction" would be that measurement
        pred = 1.0 / (fixed + per + wb / bw) if teamed and ok and bw == bw else None
        values["ch4.small_predicted"] = pred
        values["ch4.small_of_predicted"] = records.median(s2) / pred if pred else None


def _block_products(cfg) -> list[int]:
    """The bytes forward.c's team() weighs each of a block's int8 products by (K x N, a byte a
    weight): the query-key-value product, the projection, the MLP's two."""
    d, hidden = cfg.d_model, cfg.mlp_hidden
    return [d * 3 * d, d * d, d * hidden, hidden * d]


def _small_regions(rec, d: int, r) -> tuple[int, int | None]:
    """(the bytes of the largest parallel region of a decoded token of the study's model of
    width ``d``, the decoder's threshold in bytes or None where the record keeps none):
    forward.c's team() weighs products by their weight bytes, int8 here, and the attention
    by 8 bytes per cached position and feature."""
    cfg = study_config(d)
    hidden, vocab = cfg.mlp_hidden, cfg.vocab
    products = max(d * 3 * d, d * d, d * hidden, hidden * d, d * vocab)  # int8: a byte each
    positions = len(PROMPT) + r["params"].get("decoded",
                                              rec["settings"]["study"].get("decode_tokens", 0))
    return max(products, 8 * positions * d), r["params"].get("par_min_bytes")


def _quality(rec, values):
    f32, q8 = (records.median(_one(rec, "val_bpb", dtype=d)) for d in ("f32", "int8"))
    change = q8 / f32 - 1
    values.update({"ch4.bpb_f32": f(f32, "bits/byte"), "ch4.bpb_int8": f(q8, "bits/byte"),
                   "ch4.bpb_change": f"{100 * change:+.2f} %",
                   "ch4.q_steps": str(rec["settings"]["steps"]),
                   "ch4.q_config": rec["settings"]["config"]["name"],
                   "ch4.q_tokens": str(rec["settings"]["greedy_tokens"]),
                   "ch4.q_context": rec["settings"]["config"]["context"]})
    agree = records.results(rec, "greedy_agreement")
    rows = []
    lla = {r["params"]["prompt"]: r for r in records.results(rec, "llama_greedy")}
    for r in agree:
        i = r["params"]["prompt"]
        lr = lla.get(i)
        # counts, not a rounded share: 199 of 200 would print as "100 %" beside a difference
        tokens = rec["settings"]["greedy_tokens"]
        rows.append([repr(rec["settings"]["prompts"][i]),
                     f"{round(r['value']['median'] * tokens)} of {tokens}",
                     f"{r['params']['first_difference']} of {tokens}",
                     f"{lr['value']['median']:.0f} of {lr['params']['compared']}" if lr else
                     "not measured (no llama.cpp)"])
    figures.write_table("ch4_quality", rows, ["prompt", "int8 = f32, greedy: bytes equal", "bytes before the first difference",
                                              "llama.cpp f32 = ours f32, tokens before the first difference"],
                        f"Model {rec['settings']['config']['name']} trained here for "
                        f"{rec['settings']['steps']} steps; validation over "
                        f"{rec['settings']['val_chunks']} windows of held-out files: f32 "
                        f"{f(f32)} bits/byte, int8 {f(q8)} ({100 * change:+.2f} %). "
                        f"{figures.machine_line(rec)}.")
    values["ch4.agreement"] = f"{100 * np.mean([r['value']['median'] for r in agree]):.0f} %"
    # a prompt whose outputs differ early yet hold the same byte at most later positions:
    # the one where equal bytes exceed those before the first difference the most
    tokens = rec["settings"]["greedy_tokens"]
    rejoin = max(((round(records.median(r) * tokens) - r["params"]["first_difference"], r)
                  for r in agree), key=lambda t: t[0], default=(0, None))
    rj = rejoin[1] if rejoin[0] > tokens // 10 else None
    values["ch4.q_rejoin_prompt"] = repr(rec["settings"]["prompts"][rj["params"]["prompt"]]) if rj else None
    values["ch4.q_rejoin_first"] = rj["params"]["first_difference"] if rj else None
    values["ch4.q_rejoin_equal"] = round(records.median(rj) * tokens) if rj else None
    sample = rec["settings"].get("sample", "")
    figures.write(figures.tables_dir() / "ch4_sample.md",
                  "~~~text\n" + sample.replace("~~~", "~ ~ ~") + "\n~~~\n")
    return [f"int8's validation bits per byte against f32's: "
            + compare.exact(abs(change) < QUALITY,
                            f"{100 * change:+.2f} %, target within {100 * QUALITY:g} %")]


NOT_MEASURED = "not measured here (no llama.cpp: `make llama`)"
# the values the page quotes, read from it: each is set (None where its record is missing)
PAGE_KEYS = sorted(set(re.findall(r"\b(ch4\.[a-z0-9_]+)", (records.ROOT / "chapters" / "4-generation.md").read_text())))


def report(rec_dir) -> dict:
    values: dict = target_values()
    ffi, lib = build.load("forward")  # the decoder's shapes, as the kernel has them
    values.update({"ch4.tile": str(quant.TILE), "ch4.qblock": str(quant.QBLOCK),
                   "ch4.group": str(quant.GROUP), "ch4.rows": str(lib.sm_rows()),
                   "ch4.block_rows": str(lib.sm_block_rows()),
                   "ch4.study_layers": str(STUDY_LAYERS), "ch4.study_top": str(STUDY_TOP),
                   "ch4.prompts": str(len(PROMPTS)),
                   "ch4.sample_settings": f"temperature {SAMPLE['temperature']:g}, seed {SAMPLE['seed']}"})
    values["ch4.ladder_level"] = None  # the level that holds the ladder's model's weights
    values["ch4.ladder_gap"] = False
    values["ch4.l3_params"] = "not measured"
    values["ch4.l3_llama_measured"] = False  # llama.cpp beside the L3 target's model
    values["ch4.small_predicted"] = values["ch4.small_of_predicted"] = None
    values["ch4.small_fixed_us"] = None
    values["ch4.top_rung"] = values["ch4.top_toks"] = values["ch4.last_rung"] = None
    values["ch4.top_tied"] = False
    values["ch4.llama_reps"] = values["ch4.rung5_prompt_path"] = "n/a"
    for key in ("ch4.vs_llama_l3", "ch4.vs_llama_ladder", "ch4.pp_vs_llama", "ch4.vs_llama_big"):
        values[key] = NOT_MEASURED  # replaced below where llama.cpp was measured
    values["ch4.rungs"] = str(len(decode.RUNGS))
    for key in ("ch4.par_min_kib", "ch4.rung5_par_min_kib", "ch4.rung5_vs_rung4_sign",
                "ch4.rung5_vs_rung4", "ch4.small_largest_kib", "ch4.small_par_min_kib",
                "ch4.fork_join_us", "ch4.regions", "ch4.study_layers", "ch4.ladder_regions", "ch4.sync_share", "ch4.above_rung", "ch4.llama_f32_share",
                "ch4.above_share", "ch4.above_level", "ch4.above_mib", "ch4.above_level_mib",
                "ch4.above_others", "ch4.study_above_share", "ch4.study_above_mparams",
                "ch4.study_above_kind", "ch4.study_above_mib", "ch4.mid_bytes_ratio",
                "ch4.big_resident_gbs", "ch4.big_f32_share", "ch4.l3_end_mib", "ch4.gap_rungs", "ch4.int8_peak_binds", "ch4.l2_end_mib", "ch4.rung0_prefix",
                "ch4.rung5_prompt_of_bound", "ch4.f32_vs_llama", "ch4.f32_vs_llama_sign",
                "ch4.q_context", "ch4.block_products", "ch4.rung4_team_n", "ch4.rung5_team_n", "ch4.rung4_attn_from", "ch4.first_timed",
                "ch4.threshold_fj_us", "ch4.near_above", "ch4.noise_margin",
                "ch4.f32_vs_llama_text", "ch4.llama_commit", "ch4.llama_sdist", "ch4.llama_isa",
                "ch4.llama_safe_why", "ch4.threads", "ch4.torch_version", "ch4.torch_threads"):
        values.setdefault(key, None)
    values["ch4.small_teamed"] = values["ch4.big_above"] = False
    values["ch4.llama_measured"] = values["ch4.torch_measured"] = False
    values["ch4.llama_amx"] = values["ch4.llama_amx_off"] = None
    values["ch4.llama_safe"] = values["ch4.has_amx"] = values["ch4.vs_llama_big_measured"] = False
    values["ch4.prompt_amx"] = values["ch4.prompt_path_kept"] = False
    values["ch4.rung4_teamed"] = True  # unknown: the page keeps the general account
    values["ch4.rungs45_one_core"] = True  # unknown: as above
    values["ch4.big_resident_explains"] = False
    values["ch4.fork_join_reps"] = FORK_JOIN_REPS
    values["ch4.measured"] = records.exists(RECORD, rec_dir)
    values["ch4.study_measured"] = False
    values["ch4.procs_measured"] = False
    values["ch4.quality_measured"] = records.exists(RECORD_QUALITY, rec_dir)
    values["ch4.study_tokens"] = values["ch4.study_round"] = "not measured"
    values["ch4.study_token_range"] = f"at least {STUDY_MIN_TOKENS}, at most {STUDY_TOKENS}"
    values["ch4.int8_instruction"] = "not measured"  # the record's rung 3 says, below
    facts = ch1.facts(rec_dir)
    values["ch4.ch1_measured"] = facts is not None  # the levels and bounds need it
    values["ch4.stream"] = stream_name(facts)
    targets = []
    if records.exists(RECORD, rec_dir):
        rec = records.load(RECORD, rec_dir)
        _ladder(rec, facts, values)
        targets += _targets(rec, values, rec_dir)
        targets += _study(rec, facts, values)
        targets += _processes(rec, values)
    if records.exists(RECORD_QUALITY, rec_dir):
        targets += _quality(records.load(RECORD_QUALITY, rec_dir), values)
    for key in PAGE_KEYS:  # appendix C reads the rungs' rates: "not measured" there
        values.setdefault(key, "not measured (no record ch4.decode)" if re.fullmatch(r"ch4\.rung\d_toks", key) else None)
    values["ch4.f32_ridges"] = values.get("ch4.f32_ridges") if facts else None
    balance(rec_dir)
    figures.write_table("ch4_targets", [[t.split(": ")[0], t.split(": ", 1)[1]] for t in targets],
                        ["what must hold", "on this machine"])
    return values
