"""Chapter 3's fused kernels read: their table (each timed fused and unfused, against the
bound of the level that holds its bytes), their typed facts for the page, and the roofline of
the climb's kernels."""

from __future__ import annotations

from .. import ch1, compare, figures, records
from .climb import CELL_TEST, cell
from .measuring import AT, FUSED, OP_GROUPS

f = figures.fmt


def _rounds_said(found: dict) -> str:
    """How many paired rounds the kernels took (fewer than the climb's: each call is short,
    and its samples are many calls), for the table's note."""
    n = {len(r["seconds"].get("samples") or []) for r in found.values()} - {0}
    return (f", in {min(n)} paired rounds (fewer than the climb's: a kernel's call is short, and "
            f"each sample is many calls)" if len(n) == 1 else "")


def fused_table(rec, rec_dir, rungs, values):
    found = {(r["params"]["op"], r["params"]["fused"]): r for r in records.results(rec, "fused_op")}
    if not found:
        return
    facts = ch1.facts(rec_dir)
    th = rec["settings"]["threads"]
    rows, ops = [], []
    for op in FUSED:
        un, fu = found[(op, False)], found[(op, True)]
        level, bw = (ch1.level_of(facts, fu["params"]["bytes"], th) if facts else
                     ("?", None))
        predicted = fu["params"]["bytes"] / (bw * 1e9) if bw else float("nan")
        ops.append(_fused_facts(op, un, fu, level, bw, facts, th))
        rows.append([op, f(1e3 * un["seconds"]["median"], "ms"),
                     f(1e3 * fu["seconds"]["median"], "ms"), cell(fu, un),
                     f"{f(un['params']['bytes'] / 2**20, 'MiB')} → "
                     f"{f(fu['params']['bytes'] / 2**20, 'MiB')}",
                     f(fu["params"]["bytes"] / fu["seconds"]["median"] / 1e9, "GB/s"),
                     f"{level}: {f(bw, 'GB/s') if bw else 'n/a'}",
                     f(1e3 * predicted, "ms")])
    s = rec["settings"]
    figures.write_table(
        "ch3_fused", rows, ["op", "unfused", "fused", "fused against unfused", "bytes named",
                            "fused: bytes / time", "ch. 1's triad where it fits",
                            "fused: predicted bound"],
        f"On the shapes of the {s['config']['name']} step ({s['batch_size']} x {s['seq_len']} "
        f"tokens, d = {s['config']['d_model']}), {th} threads, the two versions timed in turn"
        f"{_rounds_said(found)}; "
        f"bytes are the reads and writes the code names (a write-allocating cache reads each "
        f"written line first, so it moves more); the bound is those bytes at chapter 1's "
        f"triad bandwidth for the smallest level that holds them, a level holding a working "
        f"set up to the largest size chapter 1 measured on its plateau. "
        f"{CELL_TEST.replace('steps', 'versions').replace('a step can', 'a version can')} "
        f"{figures.machine_line(rec)}.")
    _fused_values(ops, facts, th, rec, values)


NOISE = 0.05  # a measured rate this far above its bound must say which assumption failed


def _fused_facts(op, un, fu, level, bw, facts, th) -> dict:
    """One fused kernel's typed facts: what fusion saved, its rate against the bound of the
    level that holds its bytes, and where its intensity falls against that level's ridge."""
    width, _, passes, n_ops = FUSED[op]
    nbytes = fu["params"]["bytes"]
    rate = nbytes / fu["seconds"]["median"] / 1e9
    intensity = n_ops / (4.0 * passes)
    peak = _peak_facts(facts, "f32", th) if facts else None
    d = compare.difference(fu, un)  # the table's test: fused against unfused, round by round
    return {"op": op, "gain": un["seconds"]["median"] / fu["seconds"]["median"] - 1,
            "shown": d.sign != 0 and (d.sign > 0) == (d.pct > 0),
            "level": level, "bw": bw, "rate": rate, "of_bound": rate / bw if bw else None,
            "mib": nbytes / 2**20, "right_of_ridge": bool(peak and bw and intensity >= peak / bw)}


def _peak_facts(facts, kind, threads):
    peaks = {th: v for (k, th), v in facts["peak"].items() if k == kind}
    return peaks.get(threads, peaks[max(peaks)]) if peaks else None


def _fused_values(ops: list[dict], facts, th, rec, values) -> None:
    """The fused kernels as facts for the page: which one fusion sped up most and least,
    which sits closest to its bound and farthest from it, which are right of their level's
    ridge, and any that beat their bound by more than the noise, with the size the bound
    took them to spill at."""
    best, worst = max(ops, key=lambda o: o["gain"]), min(ops, key=lambda o: o["gain"])
    values.update({"ch3.fused_best_op": best["op"], "ch3.fused_best_gain": best["gain"],
                   "ch3.fused_worst_op": worst["op"], "ch3.fused_worst_gain": worst["gain"],
                   "ch3.fused_best_shown": best["shown"], "ch3.fused_worst_shown": worst["shown"]})
    known = [o for o in ops if o["of_bound"] is not None]
    below = [o for o in known if o["of_bound"] <= 1 + NOISE]
    above = [o for o in known if o["of_bound"] > 1 + NOISE]
    values["ch3.fused_any_below"] = bool(below)
    if below:
        near, far = max(below, key=lambda o: o["of_bound"]), min(below, key=lambda o: o["of_bound"])
        values.update({"ch3.fused_closest_op": near["op"], "ch3.fused_closest": near["of_bound"],
                       "ch3.fused_farthest_op": far["op"], "ch3.fused_farthest": far["of_bound"]})
    right = [o["op"] for o in known if o["right_of_ridge"]]
    left = [o["op"] for o in known if not o["right_of_ridge"]]
    values.update({"ch3.fused_right": compare.listing(right, "none"),
                   "ch3.fused_left": compare.listing(left, "none"), "ch3.fused_all_left": not right})
    values["ch3.fused_any_above"] = bool(above)
    if above:
        top = max(above, key=lambda o: o["of_bound"])
        values.update({"ch3.fused_above": compare.listing([o["op"] for o in above], "none"),
                       "ch3.fused_above_many": len(above) > 1,
                       "ch3.fused_above_level": top["level"], "ch3.fused_above_of": top["of_bound"],
                       "ch3.fused_above_mib": top["mib"]})
        # the level before the one the bound took: where its plateau was last measured, the
        # first size measured beyond it, and the size the operating system reports
        spans = facts["triad_spans"]
        ext = spans[th if th in spans else max(spans)]
        levels = list(ext)
        i = levels.index(top["level"]) if top["level"] in levels else 0
        inner = levels[i - 1] if i > 0 else None
        values["ch3.fused_above_inner"] = inner
        if inner:
            reported = (rec["machine"].get("caches") or {}).get(f"{inner}_bytes")
            values.update({"ch3.fused_inner_last_mib": ext[inner]["last"] / 2**20,
                           "ch3.fused_outer_first_mib": ext[top["level"]]["first"] / 2**20,
                           "ch3.fused_inner_reported_mib": reported / 2**20 if reported else None})


def roofline(rec, rec_dir, values):
    """The climb's kernels on chapter 1's roofline: the fused kernels (their bytes and
    operations as FUSED counts them, their measured time) and the model's products at
    rungs 3 and 6 (the step's product FLOPs over the profile's time in them, at the
    intensity of the MLP's first product)."""
    facts = ch1.facts(rec_dir)
    found = {(r["params"]["op"], r["params"]["fused"]): r for r in records.results(rec, "fused_op")}
    if facts is None or not found:
        return
    import matplotlib
    matplotlib.use("Agg")
    s = rec["settings"]
    points = []
    for op, (width, _, passes, ops) in FUSED.items():
        r = found[(op, True)]
        elements = r["params"]["tensor_bytes"] / 4
        points.append((op, ops / (4.0 * passes), ops * elements / r["seconds"]["median"] / 1e9))
    cfg = s["config"]
    N, C = s["batch_size"] * s["seq_len"], cfg["d_model"]
    W = 4 * C  # the MLP's first product, N x C x 4C: the step's typical product
    intensity = 2.0 * N * C * W / (4.0 * (N * C + C * W + N * W))
    product_flops = (s["flops_per_token"] - 12 * cfg["n_layer"] * C * s["seq_len"]) * N
    for rung in (AT["arena"], AT["bf16"]):
        t = sum(records.median(r) for r in records.results(rec, "op_seconds", rung=rung)
                if OP_GROUPS.get(r["params"]["op"]) == "matrix products (+ bias)")
        if t:
            points.append((f"the step's products, rung {rung}", intensity,
                           product_flops / t / 1e9))
    ch1.roofline_figure(points, "ch3_roofline", facts)
    values["ch3.products_intensity"] = f(intensity, "flop/byte")
