"""Chapter 4's records read into the page's tables, figures and values."""

from __future__ import annotations

import math

import numpy as np

from smallem.plumbing import build
from smallem.generating import decode, quant
from .. import ch1, compare, figures, records, reference
from smallem.training.model import CONFIGS, get_config
from .measuring import (PROMPT, PROMPTS, RECORD, RECORD_QUALITY, SAMPLE, STUDY_LAYERS,
                        STUDY_MIN_TOKENS, STUDY_TOKENS, STUDY_TOP, matrix_params, study_config)

f = figures.fmt
AT = {r.name: r.index for r in decode.RUNGS}  # each rung's place, by its name: what records keep
L3_VS_LLAMA = 1.3     # int8 decode against llama.cpp's Q8_0, weights in the L3
DRAM_VS_LLAMA = 1.0   # ... weights several times larger than the L3
DRAM_SHARE = 0.8      # ... there, weight bytes per second against chapter 1's DRAM read stream
PP_VS_LLAMA = 1.0     # prompt processing (the ladder's prompt) against llama.cpp's pp
INT8_VS_F32 = 2.5     # int8 decode against our f32 decode, beyond the L3
QUALITY = 0.01        # int8's validation bits per byte within 1 % of f32's


def target_values() -> dict:
    return {"ch4.target_l3_is": f"{L3_VS_LLAMA:g} times", "ch4.target_dram_is": f"{DRAM_VS_LLAMA:g} times",
            "ch4.target_dram_share_is": f"{100 * DRAM_SHARE:.0f} %", "ch4.target_pp_is": f"{PP_VS_LLAMA:g} times",
            "ch4.target_int8_is": f"{INT8_VS_F32:g} times", "ch4.target_quality_is": f"{100 * QUALITY:g} %"}


def _verdict(ours, theirs, target: float) -> str:
    """reached / not reached / not shown for ours against theirs at ``target`` times, by the
    one-sided signed-rank test of the rounds (compare.against; a parity target at the parity margin)."""
    return compare.against(ours, theirs, target).text()


STREAM_NAMES = {"read": "read-only stream", "triad": "triad"}


def stream_name(facts) -> str:
    """What the decode bounds are read from, for prose: chapter 1's read-only stream (a
    decoder reads its weights and writes almost nothing), or, in a record from before it,
    the triad."""
    return STREAM_NAMES[ch1.read_stream(facts)] if facts else STREAM_NAMES["read"]


def bandwidth_bound(facts, weight_bytes: float, threads: int) -> tuple[str, float]:
    """(the level of chapter 1's measured staircase that holds ``weight_bytes`` of weights at
    ``threads``, its bandwidth there in bytes/s), from the read-only stream where the record
    has it (:func:`ch1.level_of`, :func:`ch1.read_stream`)."""
    if facts is None:
        return "n/a", math.nan
    level, gbs = ch1.level_of(facts, weight_bytes, threads, ch1.read_stream(facts))
    return level, gbs * 1e9


def _prompt_bound(facts, p, rung: int, weights: int):
    """(tokens/s, what) the compute bound allows a prompt record ``p``: two operations per
    weight per token at chapter 1's peak on its threads, f32 for the GEMM prompt, int8 for
    rung 5's; None without the records it needs. Rung 0 has no prompt of its own."""
    if facts is None or p is None or rung == AT["no_cache"]:
        return None
    # rung 5 takes the path its decoder measured faster (older records: the int8 call)
    kind = ("int8" if rung >= AT["prompt_path"] and p["params"].get("prefill_path", "c") == "c"
            else "f32")
    # rungs 1-4 send the prompt through the f32 GEMM, on every core whatever the decoder's
    # threads; rung 5 through the decoder's own call, on its threads
    th = p["params"].get("threads", facts["cores"]) if kind == "int8" else facts["cores"]
    peaks = {t: v for (k, t), v in facts["peak"].items() if k == kind}
    if not peaks:
        return None
    peak = peaks.get(th, peaks[max(peaks)])
    return peak * 1e9 / (2 * weights), f"{kind} peak on {th} thread{'s' if th > 1 else ''}"


def _one(rec, name, **params):
    found = records.results(rec, name, **params)
    return found[0] if found else None


def _ratio(a, b) -> float:
    return a["value"]["median"] / b["value"]["median"] if a and b else math.nan


def _ladder(rec, facts, values):
    """Chapter 4's ladder table (our rungs, then the peers and the reference) and its values."""
    s = rec["settings"]["ladder"]
    cfg = s["config"]["name"]
    rung3 = dict(s["rungs"]).get(AT["int8"], "")
    values["ch4.int8_instruction"] = s.get("int8_instruction") or rung3.partition(", ")[2] or "n/a"
    weights = matrix_params(get_config(cfg)) if cfg in CONFIGS else 0
    rows = _rung_rows(rec, facts, s, weights, values) + _peer_rows(rec)
    missing = rec["settings"].get("missing") or {}
    note = (f"Model {cfg} with random weights ({s['prompt']}-byte prompt, then "
            f"{s['decode_tokens']} tokens timed per round, {s['rounds']} rounds; rung 0 timed "
            f"alone on {s['rung0_tokens']} tokens). Prompt column: {s['prefill_tokens']} tokens "
            f"from position 0. {figures.machine_line(rec)}."
            + figures.peer_notes(rec["settings"].get("llama_cpp"), missing))
    figures.write_table("ch4_ladder", rows, ["rung", "what it adds", "decode", "against the "
                                             "rung before", "weights per token",
                                             "decode predicted: weights ÷ bandwidth",
                                             "prompt", "prompt predicted: compute bound"], note)
    _ladder_values(rec, facts, s, cfg, values)


def _rung_rows(rec, facts, s, weights, values) -> list[list[str]]:
    """A row per rung: its decode against the rung before and against its bound (weights
    over the bandwidth of their level; rung 0's prefix at the f32 peak), its prompt against
    its compute bound."""
    rows, prev = [], None
    values["ch4.any_above_bound"] = False  # a decode faster than its level's bandwidth allows
    for i, what in s["rungs"]:
        r = _one(rec, "decode", rung=i)
        if r is None:
            continue
        p = _one(rec, "prefill", rung=i)
        wb = r["params"].get("weight_bytes")
        th = r["params"].get("threads", rec["settings"]["threads"])
        level, bw = bandwidth_bound(facts, wb, th) if wb else ("n/a", math.nan)
        share = r["value"]["median"] * wb / bw if wb else math.nan
        pp = _prompt_bound(facts, p, i, weights)
        if i == AT["no_cache"] and facts is not None and weights:
            # no cache: each token runs its whole prefix through the products again
            prefix = s["prompt"] + s["rung0_tokens"] / 2
            peak = facts["peak"][("f32", facts["cores"])]
            bw, level, wb = peak * 1e9 / (2 * weights * prefix), "compute", 2 * weights * prefix
            share = r["value"]["median"] / bw
            values["ch4.rung0_prefix"] = f(prefix)
        rows.append([str(i), what, f(r["value"]["median"], "tokens/s"),
                     compare.versus(r, prev) if prev else "—",
                     compare.size(wb / 1024) if wb else "—",
                     f"{f(bw, 'tokens/s')}: {100 * share:.0f} % of it (the prefix at the "
                     f"f32 peak)" if i == AT["no_cache"] and share == share else
                     f"{f(bw / wb, 'tokens/s')}: {100 * share:.0f} % of it ({level})"
                     if share == share else "—",
                     f(p["value"]["median"], "tokens/s") if p else "—",
                     f"{f(pp[0], 'tokens/s')} ({pp[1]}): {100 * p['value']['median'] / pp[0]:.0f} %"
                     if pp else "—"])
        if share == share and share > 1 and i != AT["no_cache"]:
            values["ch4.any_above_bound"] = True
        if pp and i == AT["prompt_path"]:  # the int8 prompt, which the page discusses
            values[f"ch4.rung{i}_prompt_of_bound"] = f"{100 * p['value']['median'] / pp[0]:.0f} %"
        prev = r
        values[f"ch4.rung{i}_toks"] = f(r["value"]["median"], "tokens/s")
    return rows


def _peer_rows(rec) -> list[list[str]]:
    """f32 on rung 4's threads, llama.cpp, PyTorch, and the reference series."""
    rows = []
    r32 = _one(rec, "decode", case="f32-threads")
    if r32:
        rows.append(["", "f32 with rung 4's threads (for comparison)",
                     f(r32["value"]["median"], "tokens/s"), "—",
                     compare.size(r32["params"]["weight_bytes"] / 1024), "—",
                     f(_one(rec, "prefill", case="f32-threads")["value"]["median"], "tokens/s"), "—"])
    for dtype, label in (("q8_0", "llama.cpp, Q8_0"), ("f32", "llama.cpp, f32")):
        tg, pp = _one(rec, "llama_tg", dtype=dtype), _one(rec, "llama_pp", dtype=dtype)
        if tg:
            rows.append(["peer", f"{label} (same file, same threads, same rounds)",
                         f(tg["value"]["median"], "tokens/s"), "—", "—", "—",
                         f(pp["value"]["median"], "tokens/s") if pp else "—", "—"])
    for kind, label in (("torch-f32", "PyTorch eager, f32, KV cache"),
                        ("torch-int8", "PyTorch eager, dynamic int8 (quantize_dynamic)")):
        t = _one(rec, "decode", case=kind)
        if t:
            rows.append(["peer", label, f(t["value"]["median"], "tokens/s"), "—", "—", "—", "—", "—"])
    rows.append(["ref.", f"the reference series, one sequence ({reference.CITE}, "
                 f"{reference.MACHINE})", f"{reference.CH4_GEN_BEFORE_TOKS} → "
                 f"{f(reference.CH4_GEN_AFTER_TOKS)} tokens/s", "—", "—", "—", "—", "—"])
    return rows


def _ladder_values(rec, facts, s, cfg, values) -> None:
    values["ch4.ladder_config"] = cfg
    p5 = _one(rec, "prefill", rung=AT["prompt_path"])
    path = {"c": "the int8 call", "gemm": "the f32 GEMM", "int8": "the integer GEMM"}
    values["ch4.rung5_prompt_path"] = (
        f"{path[p5['params']['prefill_path']]} (measured faster at "
        + ", ".join(f"{n} tokens: {path[v]}" for n, v in p5["params"]["prefill_choice"].items())
        + ")" if p5 and "prefill_path" in p5["params"] else
        "the int8 call (a record made before the choice was measured)")
    values["ch4.llama_reps"] = str(s.get("llama_reps", "one (a record made before steady state)"))
    # a product y = x W reads each f32 weight (4 bytes) for one multiply-add (2 operations)
    values["ch4.f32_ridges"] = (ch1.ridge_position(facts, 2 / 4, rec["settings"]["threads"])
                                if facts else "n/a (no chapter-1 record)")
    c = s["config"]
    values["ch4.kv_mib"] = compare.size(2 * c["n_layer"] * c["context"] * c["d_model"] * 4 / 1024)
    r4 = _one(rec, "decode", rung=AT["threads"])
    values["ch4.sync_factor"] = str(decode.Decoder.SYNC_SHARE)
    values["ch4.par_min"] = (compare.size(r4["params"]["par_min_bytes"] / 1024)
                             if r4 and "par_min_bytes" in r4["params"] else "n/a (not recorded)")
    w8, w32 = _one(rec, "decode", rung=AT["int8"]), _one(rec, "decode", rung=AT["c_call"])
    if w8 and w32:
        values["ch4.weights_f32"] = compare.size(w32["params"]["weight_bytes"] / 1024)
        values["ch4.weights_int8"] = compare.size(w8["params"]["weight_bytes"] / 1024)
    values["ch4.prompt_tokens"] = str(s["prefill_tokens"])
    values["ch4.decode_tokens"] = str(s["decode_tokens"])
    r3, r4 = _one(rec, "decode", rung=AT["int8"]), _one(rec, "decode", rung=AT["threads"])
    if r3 and r4:
        _threads_rounds(r4, r3, values)
    r0, top = _one(rec, "decode", rung=AT["no_cache"]), _one(rec, "decode", rung=max(i for i, _ in s["rungs"]))
    if r0 and top:
        values["ch4.climb"] = f"{f(_ratio(top, r0))} times"


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
        values["ch4.rung4_slower_rounds"] = "n/a (no rounds kept)"
        values["ch4.rung4_groups"] = "its rounds are not kept in this record"
        return
    slower = sum(x < y for x, y in zip(a, b))
    values["ch4.rung4_slower_rounds"] = f"{slower} of {len(a)}"
    values["ch4.rung4_any_slower"] = slower > 0 or len(_groups(a)) > 1
    groups = _groups(a)
    if len(groups) == 1:
        values["ch4.rung4_groups"] = (f"they form one group, from {f(min(a), 'tokens/s')} "
                                      f"to {f(max(a), 'tokens/s')}")
    else:
        parts = [f"{len(g)} near {f(float(np.median(g)), 'tokens/s')}" for g in reversed(groups)]
        values["ch4.rung4_groups"] = ("they fall into separate groups, " + ", ".join(parts[:-1])
                                      + " and " + parts[-1])


def _targets(rec, values, rec_dir=None):
    top = max(i for i, _ in rec["settings"]["ladder"]["rungs"])
    ours = _one(rec, "decode", rung=top)
    q8 = _one(rec, "llama_tg", dtype="q8_0")
    out = []
    facts = ch1.facts(rec_dir)
    level = (bandwidth_bound(facts, ours["params"]["weight_bytes"], ours["params"]["threads"])[0]
             if ours and "weight_bytes" in ours["params"] else "n/a")
    values["ch4.ladder_level"] = level
    values["ch4.ladder_in_l3"] = level == "L3"
    if ours and q8:
        x = _ratio(ours, q8)
        values["ch4.vs_llama_ladder"] = f"{f(x)} times"
        if level == "L3":  # else the study's model inside the measured L3 plateau decides it
            values["ch4.vs_llama_l3"] = f"{f(x)} times"
            values["ch4.l3_params"] = f"the ladder's {values['ch4.ladder_config']}"
            out.append(f"int8 decode, weights in the L3 (the ladder's model), against "
                       f"llama.cpp's Q8_0: " + _verdict(ours, q8, L3_VS_LLAMA))
    pp, lpp = _one(rec, "prefill", rung=top), _one(rec, "llama_pp", dtype="q8_0")
    if pp and lpp:
        x = _ratio(pp, lpp)
        values["ch4.pp_vs_llama"] = f"{f(x)} times"
        out.append(f"prompt of {rec['settings']['ladder']['prefill_tokens']} tokens against "
                   f"llama.cpp's pp: " + _verdict(pp, lpp, PP_VS_LLAMA))
    return out


def _study(rec, facts, values):
    """The L3 study: its figure, and the targets and values of the models in the L3, beyond
    it, and the smallest."""
    pts = records.results(rec, "study")
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
                                 else "n/a (an older record: a fixed count)")
    lla = {r["params"]["study_d"]: r for r in records.results(rec, "llama_tg") if "study_d" in r["params"]}
    _study_figure(rec, facts, widths, by, lla)
    out = _study_l3(facts, widths, by, lla, values)
    out += _study_big(facts, widths[-1], by, lla, values)
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
        y = [by[d, kind]["value"]["median"] for d in widths]
        ax.plot(params, y, "o-", color=color, label=label)
        bound = []
        for d in widths:
            r = by[d, kind]
            _, bw = bandwidth_bound(facts, r["params"]["weight_bytes"], r["params"]["threads"])
            bound.append(bw / r["params"]["weight_bytes"])
        if kind != "int8-1":
            ax.plot(params, bound, ":", color=color, lw=1, label=f"{label.split(',')[0]}: weight "
                    "bytes ÷ bandwidth of their level")
    if lla:
        ax.plot(params, [lla[d]["value"]["median"] if d in lla else np.nan for d in widths], "s--",
                color="tab:green", label="llama.cpp Q8_0, all cores")
    th = rec["settings"]["threads"]
    # where the measured plateaus end (chapter 1's staircase at these threads), in bytes
    ext = facts[f"{ch1.read_stream(facts)}_spans"] if facts else {}
    ends = ({lv: span["last"] for lv, span in ext[th if th in ext else max(ext)].items()
             if span["last"] == span["last"]} if ext else {})
    ax.set_xscale("log")
    ax.set_yscale("log")
    marks = [(ends.get(lv, 0) / 1.0625, f" int8 = end of the {lv} plateau", "grey")
             for lv in ("L2", "L3")]
    marks.append((ends.get("L3", 0) / 4, " f32 = end of the L3 plateau", "tab:red"))
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
    def level(r):
        return bandwidth_bound(facts, r["params"]["weight_bytes"], r["params"]["threads"])[0]

    # the models whose int8 weights sit in the measured L3 plateau; of those, where f32 no longer does
    in_l3 = [d for d in widths if level(by[d, "int8"]) == "L3"]
    mid = [d for d in in_l3 if level(by[d, "f32"]) == "DRAM"]
    out = []
    if "ch4.vs_llama_l3" not in values or values["ch4.vs_llama_l3"] == NOT_MEASURED:
        values["ch4.l3_params"] = "no model of the study"
        if in_l3:
            m8 = by[in_l3[-1], "int8"]
            values["ch4.l3_params"] = f(m8["params"]["params"] / 1e6, "M parameters")
            if in_l3[-1] in lla:
                values["ch4.vs_llama_l3"] = f"{f(_ratio(m8, lla[in_l3[-1]]))} times"
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
        values["ch4.mid_int8_vs_f32"] = f"{f(_ratio(m8, m32))} times"
    else:
        values["ch4.mid_params"] = "no model of the study"
        values["ch4.mid_int8_vs_f32"] = "n/a"
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
    values["ch4.big_int8_vs_f32"] = f"{f(x)} times"
    level, bw = bandwidth_bound(facts, b8["params"]["weight_bytes"], b8["params"]["threads"])
    gbs = b8["value"]["median"] * b8["params"]["weight_bytes"]
    values["ch4.big_level"] = level
    values["ch4.big_gbs"] = f(gbs / 1e9, "GB/s")
    values["ch4.big_bw"] = f(bw / 1e9, "GB/s")
    values["ch4.big_share"] = f"{100 * gbs / bw:.0f} %" if bw == bw else "n/a"
    if level == "DRAM":
        out.append(f"weight bytes per second on that model against chapter 1's DRAM "
                   f"{stream_name(facts)}: "
                   + compare.against_bound(b8, bw / b8["params"]["weight_bytes"], DRAM_SHARE)
                   .text(f"{100 * gbs / bw:.0f} %, target {100 * DRAM_SHARE:.0f} %"))
    else:
        out.append(f"the largest model's int8 weights ({values['ch4.big_int8_mib']}) still fit "
                   f"the {level} here: the DRAM target could not be measured")
    if big in lla:
        x = _ratio(b8, lla[big])
        values["ch4.vs_llama_big"] = f"{f(x)} times"
        out.append(f"int8 decode on that model against llama.cpp's Q8_0: "
                   + _verdict(b8, lla[big], DRAM_VS_LLAMA))
    return out


def _study_small(rec, facts, small, by, values) -> None:
    """The smallest model on one core and on all: its fixed cost per token, the fork-joins
    of the regions that go to the team, and the prediction from both."""
    s1, s2 = by[small, "int8-1"], by[small, "int8"]
    values["ch4.small_params"] = f(s1["params"]["params"] / 1e6, "M parameters")
    values["ch4.small_one_core"] = f(s1["value"]["median"], "tokens/s")
    values["ch4.small_all_cores"] = f(s2["value"]["median"], "tokens/s")
    values["ch4.small_all_vs_one"] = compare.versus(s2, s1)
    values["ch4.small_differs"] = compare.difference(s2, s1).sign != 0
    values["ch4.small_threaded"], teamed = _small_threaded(rec, small, s2)
    values["ch4.small_teamed"] = teamed
    fj = _one(rec, "fork_join", kind="pool")
    if fj:
        L = rec["settings"]["study"]["layers"]
        per = (5 * L + 1) * fj["value"]["median"]
        values["ch4.regions"] = str(5 * L + 1)
        values["ch4.fork_join_us"] = f(1e6 * fj["value"]["median"], "µs")
        values["ch4.sync_share"] = f"{100 * per * s2['value']['median']:.0f} %"
        # all cores: one core's fixed cost per token (its measured time less its bytes at
        # their level's bandwidth: Python, the call, the sampling), plus the regions'
        # fork-joins, plus the bytes at the bandwidth of all cores
        wb = s2["params"]["weight_bytes"]
        _, bw = bandwidth_bound(facts, wb, s2["params"]["threads"])
        _, bw1 = bandwidth_bound(facts, s1["params"]["weight_bytes"], 1)
        fixed = 1.0 / s1["value"]["median"] - s1["params"]["weight_bytes"] / bw1
        # fork-joins and all cores' bandwidth only where regions go to the team (none: the
        # one-core decoder's work, at one core's bandwidth)
        if not teamed:
            per, bw = 0.0, bw1
        pred = 1.0 / (fixed + per + wb / bw) if bw == bw and bw1 == bw1 else math.nan
        values["ch4.small_fixed_us"] = f(1e6 * fixed, "µs")
        values["ch4.small_predicted"] = f(pred, "tokens/s")
        values["ch4.small_of_predicted"] = f"{100 * s2['value']['median'] / pred:.0f} %"


def _small_threaded(rec, d: int, r) -> tuple[str, bool]:
    """(words, whether any region goes to the team): whether any parallel region of a decoded token of the study's model of width ``d``
    reaches the decoder's threshold (forward.c's team(): products by their weight bytes,
    int8 here; the attention by 8 bytes per cached position and feature), as words."""
    par_min = r["params"].get("par_min_bytes")
    if par_min is None:
        return "not known (the record keeps no threshold)", True
    cfg = study_config(d)
    hidden, vocab = cfg.mlp_hidden, cfg.vocab
    products = max(d * 3 * d, d * d, d * hidden, hidden * d, d * vocab)  # int8: a byte each
    positions = len(PROMPT) + r["params"].get("decoded",
                                              rec["settings"]["study"].get("decode_tokens", 0))
    biggest = max(products, 8 * positions * d)
    if biggest < par_min:
        return (f"no region of a token reaches the threshold (the largest reads "
                f"{compare.size(biggest / 1024)}, the threshold is {compare.size(par_min / 1024)}): "
                f"every product and attention runs on one thread, the same work as the one-core "
                f"decoder's"), False
    return (f"its largest region reads {compare.size(biggest / 1024)}, above the threshold of "
            f"{compare.size(par_min / 1024)}, so some of its regions go to the team"), True


def _quality(rec, values):
    f32, q8 = (_one(rec, "val_bpb", dtype=d)["value"]["median"] for d in ("f32", "int8"))
    change = q8 / f32 - 1
    values.update({"ch4.bpb_f32": f(f32, "bits/byte"), "ch4.bpb_int8": f(q8, "bits/byte"),
                   "ch4.bpb_change": f"{100 * change:+.2f} %",
                   "ch4.q_steps": str(rec["settings"]["steps"]),
                   "ch4.q_config": rec["settings"]["config"]["name"],
                   "ch4.q_tokens": str(rec["settings"]["greedy_tokens"])})
    agree = records.results(rec, "greedy_agreement")
    rows = []
    lla = {r["params"]["prompt"]: r for r in records.results(rec, "llama_greedy")}
    for r in agree:
        i = r["params"]["prompt"]
        lr = lla.get(i)
        rows.append([repr(rec["settings"]["prompts"][i]), f"{100 * r['value']['median']:.0f} %",
                     str(r["params"]["first_difference"]),
                     f"{lr['value']['median']:.0f} of {lr['params']['compared']}" if lr else
                     "not measured (no llama.cpp)"])
    figures.write_table("ch4_quality", rows, ["prompt", "int8 = f32, greedy", "first difference",
                                              "llama.cpp f32 = ours f32, tokens before the first difference"],
                        f"Model {rec['settings']['config']['name']} trained here for "
                        f"{rec['settings']['steps']} steps; validation over "
                        f"{rec['settings']['val_chunks']} windows of held-out files: f32 "
                        f"{f(f32)} bits/byte, int8 {f(q8)} ({100 * change:+.2f} %). "
                        f"{figures.machine_line(rec)}.")
    values["ch4.agreement"] = f"{100 * np.mean([r['value']['median'] for r in agree]):.0f} %"
    sample = rec["settings"].get("sample", "")
    (figures.tables_dir() / "ch4_sample.md").write_text("~~~~text\n" + sample.replace("~~~~", "~ ~ ~ ~")
                                                        + "\n~~~~\n")
    return [f"int8's validation bits per byte against f32's: "
            + compare.exact(abs(change) < QUALITY,
                            f"{100 * change:+.2f} %, target within {100 * QUALITY:g} %")]


def _gpu_cell(rec_dir, chapter: str) -> str:
    """Our GPU's figure for the balance sheet: the GPT-2 step (ch3.gpu) or the int8 decode
    with its graph (ch4.gpu), or why there is none."""
    name = f"{chapter}.gpu"
    if not records.exists(name, rec_dir):
        return records.NOT_ON_GPU
    rec = records.load(name, rec_dir)
    found = (records.results(rec, "gpu_step", block="gpt2") if chapter == "ch3" else
             records.results(rec, "gpu_decode", dtype="int8", dp4a="auto", graph=True))
    return f(found[0]["value"]["median"], "tokens/s") if found else records.NOT_ON_GPU


def _balance(values, rec_dir):
    """The series' balance sheet: training and generating, ours beside the reference's."""
    rows = []
    steps = (records.results(records.load("ch3.train_step", rec_dir), "rung_step")
             if records.exists("ch3.train_step", rec_dir) else [])
    if steps:  # none in a record that predates chapter 3's climb
        best = max(steps, key=lambda r: r["value"]["median"])
        rows.append(["train, xl step", f(best["value"]["median"], "tokens/s"),
                     f"{reference.CH3_XL_STEP_BEFORE_TOKS} → {f(reference.CH3_XL_STEP_AFTER_TOKS)} tokens/s",
                     f"{100 * reference.CH3_XL_MFU_GPU:.0f} % of its peak", _gpu_cell(rec_dir, "ch3")])
    if records.exists(RECORD, rec_dir):
        rec = records.load(RECORD, rec_dir)
        top = max(i for i, _ in rec["settings"]["ladder"]["rungs"])
        r = _one(rec, "decode", rung=top)
        if r:
            rows.append([f"generate, one sequence ({rec['settings']['ladder']['config']['name']})",
                         f(r["value"]["median"], "tokens/s"),
                         f"{reference.CH4_GEN_BEFORE_TOKS} → {f(reference.CH4_GEN_AFTER_TOKS)} tokens/s",
                         f(reference.CH4_GEN_GPU_TOKS, "tokens/s"), _gpu_cell(rec_dir, "ch4")])
    figures.write_table("ch4_balance", rows, ["", "ours, this machine", f"reference CPU "
                                              f"({reference.CORES} cores)", "reference GPU",
                                              "ours, GPU"],
                        f"Reference figures from {reference.CITE}, on {reference.MACHINE}; "
                        f"ours from this book's records on this machine (chapter 3's best rung "
                        f"for training).")


NOT_MEASURED = "not measured here (no llama.cpp: `make llama`)"


def report(rec_dir) -> dict:
    values: dict = target_values()
    ffi, lib = build.load("forward")  # the decoder's shapes, as the kernel has them
    values.update({"ch4.tile": str(quant.TILE), "ch4.qblock": str(quant.QBLOCK),
                   "ch4.group": str(quant.GROUP), "ch4.rows": str(lib.sm_rows()),
                   "ch4.block_rows": str(lib.sm_block_rows()),
                   "ch4.study_layers": str(STUDY_LAYERS), "ch4.study_top": str(STUDY_TOP),
                   "ch4.prompts": str(len(PROMPTS)),
                   "ch4.sample_settings": f"temperature {SAMPLE['temperature']:g}, seed {SAMPLE['seed']}"})
    values["ch4.ladder_level"] = values["ch4.l3_params"] = "not measured"
    values["ch4.small_predicted"] = values["ch4.small_of_predicted"] = "not measured"
    values["ch4.small_fixed_us"] = "not measured"
    values["ch4.rung0_prefix"] = values["ch4.rung5_prompt_of_bound"] = "n/a"
    values["ch4.llama_reps"] = values["ch4.rung5_prompt_path"] = "n/a"
    for key in ("ch4.vs_llama_l3", "ch4.vs_llama_ladder", "ch4.pp_vs_llama", "ch4.vs_llama_big"):
        values[key] = NOT_MEASURED  # replaced below where llama.cpp was measured
    values["ch4.rungs"] = str(len(decode.RUNGS))
    values["ch4.study_tokens"] = values["ch4.study_round"] = "not measured"
    values["ch4.study_token_range"] = f"at least {STUDY_MIN_TOKENS}, at most {STUDY_TOKENS}"
    values["ch4.int8_instruction"] = "not measured"  # the record's rung 3 says, below
    facts = ch1.facts(rec_dir)
    values["ch4.stream"] = stream_name(facts)
    targets = []
    if records.exists(RECORD, rec_dir):
        rec = records.load(RECORD, rec_dir)
        _ladder(rec, facts, values)
        targets += _targets(rec, values, rec_dir)
        targets += _study(rec, facts, values)
    if records.exists(RECORD_QUALITY, rec_dir):
        targets += _quality(records.load(RECORD_QUALITY, rec_dir), values)
    _balance(values, rec_dir)
    figures.write_table("ch4_targets", [[t.split(": ")[0], t.split(": ", 1)[1]] for t in targets],
                        ["what must hold", "on this machine"])
    return values
