"""Appendix D's record read into its tables and values: the scan's rungs beside the f32
peak, the training step of both blocks at each context, one decoded token's cost at each
position beside the bound its bytes set, and the bits per byte after the same time."""

from __future__ import annotations

from smallem.training.layers import SCAN_LADDER
from .. import ch1, compare, figures, records
from .measuring import RECORD

f = figures.fmt
SCAN_TARGET = 5.0   # the issue's: the chunked, threaded scan against the step-by-step one
FLAT = 0.9          # decode at the longest position against the shortest: flat within 10 %
PREDICTED_WITHIN = 1.5  # a prediction holds within this factor, on the same side of one
BPB_TOL = 0.05      # one run of each: a gap in bits per byte under 5 % is not called a lead
STEP_BYTES_PER_OP = 2.0  # the step by step scan: a 4-byte load and a 4-byte store of the state
                         # for every two multiply-adds (four operations)
KEYS = ("chunk", "scan_shape", "chunked_vs_step", "threaded_vs_step", "scan_target",
        "step_share", "chunked_share", "train_size", "train_short", "train_long", "decode_flat",
        "attn_fall", "attn_fall_predicted", "positions", "decode_threads", "bpb_modern",
        "bpb_recurrent",
        "run_minutes", "run_config", "decode_shape", "decode_context", "l1_gbs", "l1_ms",
        "step_ms", "l1_bound_share", "bpb_gap", "bpb_gap_share", "bpb_leader",
        "attn_first_share", "attn_last_share", "steps_attention", "steps_recurrent",
        "above_positions", "above_count", "above_of", "above_level", "above_inner", "above_inner_last_mib",
        "above_inner_reported_mib")


def _missing(note: str) -> dict:
    """No record: every value None (the page says so once, at its head, and leaves the
    measured sections out)."""
    for name in ("recurrent_scan", "recurrent_train", "recurrent_decode"):
        figures.write_table(name, [], ["(nothing measured)"], note)
    return {f"rec.{k}": None for k in KEYS} | {"rec.measured": False, "rec.scan_reached": False}


def _one(rec, name, **params):
    found = records.results(rec, name, **params)
    return found[0] if found else None


def _scan(rec, facts) -> dict:
    runs = {r["params"]["rung"]: r for r in records.results(rec, "scan")}
    step = runs["step"]
    rows = []
    for rung, r in runs.items():
        p = r["params"]
        peak = facts["peak"].get(("f32", p["threads"])) if facts else None
        rows.append([rung, SCAN_LADDER[rung].what, str(p["threads"]), f(r["seconds"]["median"], "s"),
                     f(records.median(r), "GFLOP/s"),
                     "—" if r is step else _versus(r, step),
                     f(peak, "GFLOP/s") if peak else "no chapter 1 record",
                     f"{100 * r['value']['median'] / peak:.0f} %" if peak else "—"])
    p = step["params"]
    figures.write_table(
        "recurrent_scan", rows,
        ["rung", "what it does", "threads", "forward and backward", "rate", "against step by step",
         "chapter 1's f32 peak on its threads", "share of the peak"],
        f"One sequence of {p['BH']} heads of {p['hd']} features, T = {p['T']}, chunks of "
        f"{p['chunk']} steps; the rate counts the definition's operations (4 hd² a step and "
        f"head forward, three times that with the backward) whatever a rung does; medians of "
        f"{len(step['seconds']['samples'])} rounds in turn. {VERSUS_NOTE} "
        f"{figures.machine_line(rec)}.")
    v = compare.against(runs["threaded"], step, SCAN_TARGET)
    peak1 = facts["peak"].get(("f32", 1)) if facts else None
    # the step by step scan's state traffic at chapter 1's L1 rate on one core (the triad's:
    # it reads and writes, as the state's update does)
    l1 = facts["triad_spans"].get(1, {}).get("L1", {}).get("bw") if facts else None
    ops = records.median(step) * 1e9 * step["seconds"]["median"]
    l1_s = ops * STEP_BYTES_PER_OP / (l1 * 1e9) if l1 and l1 == l1 else None
    return {"rec.l1_gbs": l1 if l1_s else None, "rec.l1_ms": 1e3 * l1_s if l1_s else None,
            "rec.step_ms": 1e3 * step["seconds"]["median"],
            "rec.l1_bound_share": (min(1.0, l1 / STEP_BYTES_PER_OP / peak1) if l1_s and peak1 else None),
            "rec.chunk": str(p["chunk"]), "rec.scan_shape": f"T = {p['T']}, {p['BH']} heads of {p['hd']}",
            "rec.chunked_vs_step": _versus(runs["chunked"], step),
            "rec.threaded_vs_step": _versus(runs["threaded"], step),
            "rec.scan_target": v.text(), "rec.scan_reached": v.met,
            "rec.step_share": records.median(step) / peak1 if peak1 else None,
            "rec.chunked_share": records.median(runs["chunked"]) / peak1 if peak1 else None}


# what an "against" cell says: its change, and round by round in brackets
VERSUS_NOTE = ("Against: the ratio of the two medians, \"within the noise\" where the "
               "two-sided signed-rank test on the rounds does not pass; the brackets pair the "
               "two round by round, so a median a little slower can sit beside more rounds "
               "faster.")


def _versus(r, base) -> str:
    """:func:`compare.versus`, as a factor where the rate more than doubled ("4.23× as fast",
    not "322.6 % faster")."""
    x = records.median(r) / records.median(base)
    if x < 2:
        return compare.versus(r, base)
    d = compare.difference(r, base)
    return f"{f(x)}× as fast" + (compare.note(d.note()) if d.rounds is not None else "")


def _train(rec) -> dict:
    runs = {(r["params"]["block"], r["params"]["T"]): r for r in records.results(rec, "train_step")}
    Ts = sorted({T for _, T in runs})
    rows = []
    for T in Ts:
        a, r = runs[("modern", T)], runs[("recurrent", T)]
        rows.append([str(T), str(a["params"]["batch"]), f(records.median(a)),
                     f(a["params"]["flops_per_token"] / 1e6), f(records.median(r)),
                     f(r["params"]["flops_per_token"] / 1e6), _versus(r, a)])
    figures.write_table(
        "recurrent_train", rows,
        ["context T", "sequences a step", "attention (tokens/s)", "its MFLOP a token",
         "recurrent (tokens/s)", "its MFLOP a token", "recurrent against attention"],
        "One forward and backward of each model (the same size, the same tokens a step at "
        "every context; f32, the attention in tiles), timed in the same rounds (medians). "
        "The attention's MFLOP count the whole T × T square of scores, as the PaLM paper's "
        "6N + 12 L d T does; the tiles skip the keys after each query, about half of it, so "
        "at long contexts the attention model does less work than its column says, and "
        "tokens/s times that column can exceed the peak. " + VERSUS_NOTE + " "
        f"{figures.machine_line(rec)}.")
    ratio = lambda T: records.median(runs[("recurrent", T)]) / records.median(runs[("modern", T)])  # noqa: E731
    return {"rec.train_size": f"{runs[('modern', Ts[0])]['params']['params'] / 1e6:.1f} million parameters",
            "rec.train_short": f"{ratio(Ts[0]):.2f} times the attention model's rate at T = {Ts[0]}",
            "rec.train_long": f"{ratio(Ts[-1]):.2f} times at T = {Ts[-1]}"}


def _bound(facts, nbytes: float, threads: int) -> float | None:
    """Tokens/s a step reading ``nbytes`` can reach at chapter 1's read-only stream of the
    level that holds them."""
    if not facts:
        return None
    _, bw = ch1.level_of(facts, nbytes, threads, ch1.read_stream(facts))
    return bw * 1e9 / nbytes


def _decode(rec, facts) -> dict:
    runs = {(r["params"]["block"], r["params"]["position"]): r for r in records.results(rec, "decode")}
    ps = sorted({p for _, p in runs})
    th = rec["settings"].get("decode_threads", rec["settings"]["threads"])
    rows = []
    for p in ps:
        row = [str(p)]
        for b in ("modern", "recurrent"):
            r = runs[(b, p)]
            nbytes = r["params"]["weight_bytes"] + r["params"]["cache_bytes"]
            bound = _bound(facts, nbytes, th)
            row += [f(records.median(r)), f(nbytes / 2**20), f(bound) if bound else "—"]
        rows.append(row)
    figures.write_table(
        "recurrent_decode", rows,
        ["position", "attention (tokens/s)", "its MiB a token", "its bound (tokens/s)",
         "recurrent (tokens/s)", "its MiB a token", "its bound (tokens/s)"],
        f"One token decoded at each position, int8 weights, on {th} thread{'s' * (th > 1)}, "
        "the same rounds for both models. "
        "MiB a token: the weights and, for attention, the keys and values cached so far (f32), "
        "for the recurrent model its states read and written. The bound: those bytes over "
        "chapter 1's read-only stream at the level that holds them. "
        f"{figures.machine_line(rec)}.")
    a0, a1 = runs[("modern", ps[0])], runs[("modern", ps[-1])]
    bytes_of = lambda r: r["params"]["weight_bytes"] + r["params"]["cache_bytes"]  # noqa: E731
    return _above(runs, ps, facts, th, bytes_of) | {"rec.decode_flat": compare.against(runs[("recurrent", ps[-1])],
                                               runs[("recurrent", ps[0])], FLAT).text(),
            "rec.attn_fall": records.median(a1) / records.median(a0),
            "rec.attn_fall_predicted": (_bound(facts, bytes_of(a1), th) / _bound(facts, bytes_of(a0), th)
                                        if facts else None),
            "rec.attn_first_share": (records.median(a0) / _bound(facts, bytes_of(a0), th)
                                     if facts else None),
            "rec.attn_last_share": (records.median(a1) / _bound(facts, bytes_of(a1), th)
                                    if facts else None),
            "rec.decode_shape": rec["settings"].get("size"),
            "rec.decode_context": ps[-1] + rec["settings"].get("feed", 0) + 2,
            "rec.positions": f"{ps[0]} to {ps[-1]}",
            "rec.decode_threads": f"{th} thread{'s' * (th > 1)}"}


def _above(runs, ps, facts, th: int, bytes_of) -> dict:
    """The positions at which the attention model decoded faster than its bound, the most by
    which it did, the level the bound took those bytes from, and the level before it: where
    chapter 1's read-only plateau on these threads was last measured, and its size as the
    operating system reports it (None where no position beat its bound)."""
    keys = ("rec.above_positions", "rec.above_count", "rec.above_of", "rec.above_level", "rec.above_inner",
            "rec.above_inner_last_mib", "rec.above_inner_reported_mib")
    if not facts:
        return dict.fromkeys(keys)
    over = [(p, records.median(runs[("modern", p)]) / _bound(facts, bytes_of(runs[("modern", p)]), th))
            for p in ps]
    over = [(p, x) for p, x in over if x > 1]
    if not over:
        return dict.fromkeys(keys)
    top = max(over, key=lambda o: o[1])
    level, _ = ch1.level_of(facts, bytes_of(runs[("modern", top[0])]), th, ch1.read_stream(facts))
    spans = facts[f"{ch1.read_stream(facts)}_spans"]
    ext = spans[th if th in spans else max(spans)]
    i = ch1.LEVELS.index(level)
    inner = ch1.LEVELS[i - 1] if i > 0 else None
    reported = (facts.get("caches") or {}).get(f"{inner}_bytes") if inner else None
    return dict(zip(keys, (compare.listing([str(p) for p, _ in over], "none"), len(over), top[1],
                           level, inner,
                           ext[inner]["last"] / 2**20 if inner else None,
                           reported / 2**20 if reported else None)))


def _runs(rec) -> dict:
    runs = {r["params"]["block"]: r for r in records.results(rec, "run")}
    a, r = runs["modern"], runs["recurrent"]
    bpb = lambda x: records.median(x)  # noqa: E731
    gap = abs(bpb(a) - bpb(r))
    return {"rec.bpb_gap": gap, "rec.bpb_gap_share": gap / max(bpb(a), bpb(r)),
            "rec.bpb_leader": ("recurrent" if bpb(r) < bpb(a) else "attention")
            if gap > BPB_TOL * max(bpb(a), bpb(r)) else None,
            "rec.bpb_tol": BPB_TOL, "rec.within": PREDICTED_WITHIN,
            "rec.steps_attention": a["params"]["steps"], "rec.steps_recurrent": r["params"]["steps"],
            "rec.bpb_modern": f"{bpb(a):.3f} bits/byte after {a['params']['steps']} steps",
            "rec.bpb_recurrent": f"{bpb(r):.3f} bits/byte after {r['params']['steps']} steps",
            "rec.run_minutes": f"{60 * rec['settings']['run_minutes']:.0f} s",
            "rec.run_config": f"{a['params']['config']} and {r['params']['config']}"}


def report(rec_dir=None) -> dict:
    if not records.exists(RECORD, rec_dir):
        return _missing("nothing measured: this machine's book holds no appendix D record") | {"rec.bpb_tol": BPB_TOL, "rec.within": PREDICTED_WITHIN}
    rec = records.load(RECORD, rec_dir)
    facts = ch1.facts(rec_dir)
    return ({"rec.measured": True} | _scan(rec, facts) | _train(rec) | _decode(rec, facts)
            | _runs(rec))
