"""Chapter 2's micro-kernel alone: its B slivers in L2 or further, on one core and on all,
each level from chapter 1's plateaus (table ch2_alone and the values its section quotes)."""

from __future__ import annotations

from smallem.product.gemm import cache_geometry
from .. import ch1, compare, figures, records

NOISE = compare.SWEEP_NOISE  # a rate this far from its model is off it, not within the noise


def _big_set_values(facts: dict | None, by: dict, l3_kib: float, cores: int) -> dict:
    """Where the larger set of slivers sits on chapter 1's one-core staircase (in a plateau,
    or in the gap before DRAM's), and the kernel alone from L2 against the page's peaks."""
    values: dict = {"ch2.alone_stream": ch1.read_stream_name(facts)}
    if facts is not None:
        lv, also = _plateau_of(facts, l3_kib * 1024, 1)
        ext = facts[f"{ch1.read_stream(facts)}_spans"]
        span = ext[1 if 1 in ext else max(ext)]
        bw = span[lv]["bw"]
        end = span[lv]["last"] if lv != "DRAM" else None
        values.update({"ch2.alone_big_level": lv, "ch2.alone_big_level_gbs": bw,
                       # in the gap between that cache's plateau and DRAM's: DRAM's first
                       # point and bandwidth (None inside a plateau)
                       "ch2.alone_big_dram_first": (compare.size(span["DRAM"]["first"] / 1024)
                                                    if also else None),
                       "ch2.alone_big_dram_gbs": span["DRAM"]["bw"] if also else None,
                       "ch2.alone_big_level_end": compare.size(end / 1024) if end else None,
                       # past half the plateau's last size: at its edge, not inside it
                       "ch2.alone_big_at_end": bool(end and not also and 2 * l3_kib * 1024 > end),
                       # from L2, against the page's peaks (one core's; all cores')
                       "ch2.alone_one_of_peak": records.median(by["L2", True, 1])
                       / facts["peak"][("f32", 1)],
                       "ch2.alone_all_of_peak": records.median(by["L2", True, cores])
                       / facts["peak"][("f32", facts["cores"])]})
    else:
        values.update(dict.fromkeys(("ch2.alone_big_level", "ch2.alone_big_level_gbs",
                                     "ch2.alone_big_level_end", "ch2.alone_big_at_end",
                                     "ch2.alone_big_dram_first", "ch2.alone_big_dram_gbs",
                                     "ch2.alone_one_of_peak", "ch2.alone_all_of_peak")))
    return values


def _plateau_of(facts: dict, nbytes: float, threads: int) -> tuple[str, str | None]:
    """Where a working set of ``nbytes`` on ``threads`` threads sits on chapter 1's staircase
    of the stream that only reads (the kernel only reads its B slivers; the triad in a record
    from before that stream): (its level, None) inside a plateau, or (the last cache's level,
    "DRAM") in the gap between that cache's last point and the first point of DRAM's
    plateau, where chapter 1 measured no size and the data comes from both in shares its
    records do not give."""
    stream = ch1.read_stream(facts)
    lv, _ = ch1.level_of(facts, nbytes, threads, stream)
    ext = facts[f"{stream}_spans"]
    th = threads if threads in ext else max(ext)
    first = ext[th]["DRAM"]["first"]
    caches = [c for c in ("L1", "L2", "L3") if ext[th][c]["bw"] == ext[th][c]["bw"]]
    if lv == "DRAM" and caches and first == first and nbytes < first:
        return caches[-1], "DRAM"
    return lv, None


def alone_rows(rec: dict, rec_dir=None) -> tuple[list[list], dict]:
    """Table ch2_alone: the micro-kernel alone, its B slivers in L2 or L3, on one core and
    on all, each against the FMA probe timed in turn with it; and the values the text
    quotes (each case against B in L2 on as many threads)."""
    found = records.results(rec, "alone")
    f = figures.fmt
    facts = ch1.facts(rec_dir) if rec_dir is not None else None
    rows, by = [], {}
    for r in found:
        p = r["params"]
        probe = records.value(rec, "alone_probe", threads=p["threads"])
        rate = records.median(r)
        by[p["b_in"], p["shared_b"], p["threads"]] = r
        # the level from chapter 1's plateaus on as many threads (all the threads' blocks
        # together), the benchmark's own aim without its record
        where = p["b_in"]
        if facts is not None:
            blocks = 1 if p["shared_b"] else p["threads"]
            where = " and ".join(x for x in _plateau_of(facts, blocks * p["b_kib"] * 1024,
                                                         p["threads"]) if x)
        if p["b_in"] != "L2" and p["threads"] > 1:
            where += ", one block all threads read" if p["shared_b"] else ", a block per thread"
        rows.append([where, compare.size(p["b_kib"]), str(p["threads"]), f(rate, "Gop/s"),
                     f(probe, "Gop/s"), f"{100 * rate / probe:.0f} %"])
    p0 = found[0]["params"]
    cores = max(r["params"]["threads"] for r in found)
    l2_kib = next(r["params"]["b_kib"] for r in found if r["params"]["b_in"] == "L2")
    l3_kib = next(r["params"]["b_kib"] for r in found if r["params"]["b_in"] == "L3")

    def of_probe(t):
        return records.median(by["L2", True, t]) / records.value(rec, "alone_probe", threads=t)

    def pct(t):
        return f"{100 * of_probe(t):.0f} %"

    na = "n/a (one core)"
    l2 = (rec["settings"].get("cache_geometry") or cache_geometry())["L2"]["bytes"]
    values = {"ch2.alone_l3_per_l2": figures.fmt(l3_kib * 1024 / l2),
              "ch2.alone_l2_kib": compare.size(l2_kib),
              "ch2.alone_l3_kib": compare.size(l3_kib), "ch2.alone_threads": str(cores),
              "ch2.alone_pct_one": pct(1),
              "ch2.alone_pct_all": pct(cores) if cores > 1 else na,
              # typed: from L2, of the probe timed in turn, one core and all (None: one core)
              "ch2.alone_of_probe_one": of_probe(1),
              "ch2.alone_of_probe_all": of_probe(cores) if cores > 1 else None,
              "ch2.alone_l3_one": compare.versus(by["L3", True, 1], by["L2", True, 1]),
              "ch2.alone_l3_shared": (compare.versus(by["L3", True, cores], by["L2", True, cores])
                                      if cores > 1 else na),
              "ch2.alone_l3_own": (compare.versus(by["L3", False, cores], by["L2", True, cores])
                                   if cores > 1 else na)}
    # where the larger set of slivers sits on chapter 1's one-core staircase, and the bytes
    # of B a second the kernel drew from there (4 N_R bytes per 2 M_R N_R operations)
    l3_rate = records.median(by["L3", True, 1])
    mr = rec["settings"].get("mr")
    values["ch2.alone_l3_gbs"] = l3_rate * 2 / mr if mr else None
    values.update(_big_set_values(facts, by, l3_kib, cores))
    values["ch2.alone_kc"] = p0["kc"]
    # the FMA probe timed beside the kernel on one core, against chapter 1's one-core peak:
    # above it, the host gave this run more than it gave chapter 1's
    probe_one = records.value(rec, "alone_probe", threads=1)
    values["ch2.alone_probe_over_peak"] = (probe_one / facts["peak"][("f32", 1)]
                                           if facts else None)
    # the M_C sweep's fastest point (rung 4, columns), where it ran on one thread: above the
    # kernel alone from L2 by more than the noise, the kernel alone is no ceiling for it
    one_l2 = records.median(by["L2", True, 1])
    mc = [p for p in records.results(rec, "mc_sweep") if p["params"]["threads"] == 1]
    best = max(mc, key=records.median) if mc else None
    values["ch2.alone_one_gops"] = one_l2
    # the FMA probe timed beside it, all cores' over one core's (what the host gave then)
    values["ch2.alone_probe_gain"] = (records.value(rec, "alone_probe", threads=cores)
                                      / records.value(rec, "alone_probe", threads=1)
                                      if cores > 1 else None)
    values["ch2.mc_above_alone"] = (records.median(best) / one_l2 - 1
                                    if best and records.median(best) > one_l2 * (1 + NOISE)
                                    else None)
    values["ch2.mc_best_kc"] = best["params"]["kc"] if best else None
    values["ch2.alone_l3_loss"] = 1 - l3_rate / records.median(by["L2", True, 1])
    return rows, values, p0["kc"]
