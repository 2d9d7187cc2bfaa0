"""Which level of chapter 1's staircase holds a decoder's bytes, at the rate of which stream,
and the bytes a token reads: what chapter 4's decode bounds are made of."""

from __future__ import annotations

import math

from smallem.generating.decode import Decoder
from .. import ch1, records
from .balance import AT, _one


# What the decode bounds are read from, for prose: chapter 1's read-only stream (a decoder
# reads its weights and writes almost nothing), or, in a record from before it, the triad.
stream_name = ch1.read_stream_name


def _l3_end(facts) -> float:
    """Where chapter 1's L3 plateau ends (bytes): the largest end measured at any thread
    count. The L3 is shared, so its size does not depend on the threads that read it; a
    plateau that ends earlier on one thread than on all of them ends on the staircase's
    coarse grid of sizes, not at the cache's size."""
    ext = facts[f"{ch1.read_stream(facts)}_spans"]
    ends = [sp["L3"]["last"] for sp in ext.values() if "L3" in sp and sp["L3"]["bw"] == sp["L3"]["bw"]]
    return max(ends) if ends else math.nan


def level_ends(facts, threads: int) -> dict:
    """{level: bytes} where each cache's measured plateau ends at ``threads`` threads (the
    read-only stream where the record has it; the most threads measured where these were
    not), at most the size the OS reports for it at those threads: past its size, a plateau
    that still runs fast is the next level answering (as :func:`ch1.level_of` reads it)."""
    ext = facts[f"{ch1.read_stream(facts)}_spans"]
    th = threads if threads in ext else max(ext)
    sizes = ch1.level_sizes(facts["caches"], th) if facts.get("caches") else {}
    return {lv: min(span["last"], sizes.get(lv) or math.inf)
            for lv, span in ext[th].items() if lv != "DRAM" and span["last"] == span["last"]}


def holding(facts, nbytes: float, threads: int) -> dict | None:
    """The level of chapter 1's measured staircase that holds ``nbytes`` read by ``threads``
    threads: {"level", "bw" (bytes/s at those threads), "size" (bytes: where its plateau
    ends at those threads), "gap_bw", "gap_first"}, from the read-only stream where the
    record has it (:func:`ch1.level_of`); None without a chapter 1 record. Between the last
    cache's last point and DRAM's first, where chapter 1 measured no size and the bytes
    come from both in shares its records do not give, the level is that cache and
    "gap_bw"/"gap_first" are DRAM's bandwidth (bytes/s) and first point (bytes); else None."""
    if facts is None:
        return None
    stream = ch1.read_stream(facts)
    ext = facts[f"{stream}_spans"]
    th = threads if threads in ext else max(ext)
    level, gbs = ch1.level_of(facts, nbytes, threads, stream)
    gap_bw = gap_first = None
    first = ext[th]["DRAM"].get("first", math.nan)
    caches = [c for c in ("L1", "L2", "L3") if ext[th][c]["bw"] == ext[th][c]["bw"]]
    if level == "DRAM" and caches and first == first and nbytes < first:
        gap_bw, gap_first = gbs * 1e9, first
        level, gbs = caches[-1], ext[th][caches[-1]]["bw"]
    size = ext[th][level]["last"] if level != "DRAM" else math.inf
    return {"level": level, "bw": gbs * 1e9, "size": size, "gap_bw": gap_bw, "gap_first": gap_first}


def core_holding(facts, nbytes: float) -> dict | None:
    """:func:`holding` for one core reading ``nbytes`` alone: a private level (L1, L2) holds
    what fits the largest end of its plateau per core measured at any thread count (the
    staircase's grid is coarse, so a plateau that ends at 1 MiB on one thread and at 4 MiB
    on two ends, per core, at 2 MiB), and no more than the size the OS reports for it (past
    it, a plateau that still runs fast is the next level answering), at one thread's
    bandwidth; beyond them :func:`holding` on one thread. None without a chapter 1 record."""
    if facts is None:
        return None
    ext = facts[f"{ch1.read_stream(facts)}_spans"]
    one = ext[1] if 1 in ext else ext[min(ext)]
    caches = facts.get("caches") or {}
    for lv, key in (("L1", "L1d_bytes"), ("L2", "L2_bytes")):
        ends = [sp[lv]["last"] / th for th, sp in ext.items()
                if lv in sp and sp[lv]["bw"] == sp[lv]["bw"] and sp[lv]["last"] == sp[lv]["last"]]
        reach = min(max(ends), caches.get(key) or math.inf) if ends else 0
        if ends and nbytes <= reach and one[lv]["bw"] == one[lv]["bw"]:
            return {"level": lv, "bw": one[lv]["bw"] * 1e9, "size": reach}
    return holding(facts, nbytes, 1)


def _kv_bytes(s, rung_tokens: int) -> int:
    """The keys and values a token reads at the last timed position (f32, every layer)."""
    c = s["config"]
    return 2 * c["n_layer"] * (s["prompt"] + rung_tokens) * c["d_model"] * 4


def attention_from(par_min_bytes, d: int) -> int | None:
    """The first position whose attention reaches a threshold of ``par_min_bytes``: a token
    at position p reads 8 (p + 1) d bytes of keys and values a layer (forward.c's count)."""
    return None if par_min_bytes is None else max(0, -(-par_min_bytes // (8 * d)) - 1)


def one_core_bytes(values: dict, products: int, d: int, r4, r5, first: int) -> bool:
    """Whether rung 4's or 5's threshold keeps one of a block's ``products``, or the first
    timed token's attention (8 (p + 1) d bytes a layer at position p, forward.c's count), on
    one core: those bytes then come at one core's rate."""
    def attn_from(r):
        return attention_from(r["params"].get("par_min_bytes") if r else None, d)
    return any((values[f"ch4.rung{k}_team_n"] is not None
                and values[f"ch4.rung{k}_team_n"] < products)
               or (attn_from(r) is not None and attn_from(r) > first)
               for k, r in (("4", r4), ("5", r5)))


def threshold_fork_join(rec, facts) -> float | None:
    """The fork-join rung 4's threshold implies, in µs: its bytes over SYNC_SHARE fork-joins,
    streamed at chapter 1's one-core rate of the level that holds the model's weights."""
    r4 = _one(rec, "decode", rung=AT["threads"])
    p = r4["params"] if r4 else {}
    if not facts or "par_min_bytes" not in p or "weight_bytes" not in p:
        return None
    _, gbs = ch1.level_of(facts, p["weight_bytes"], 1, ch1.read_stream(facts))
    return 1e6 * p["par_min_bytes"] / Decoder.SYNC_SHARE / (gbs * 1e9) if gbs else None


def study_above(facts, widths, by, noise: float) -> dict:
    """The study's model, int8 or f32, whose weights held in DRAM streamed furthest above
    chapter 1's DRAM bound, where that is by more than ``noise`` and not the largest model
    (whose share the page gives itself): its share, parameters, kind and weights' MiB
    (typed, None each where none is)."""
    found = None
    for d in widths[:-1]:
        for kind in ("int8", "f32"):
            r = by.get((d, kind))
            h = r and holding(facts, r["params"]["weight_bytes"], r["params"]["threads"])
            if not h or h["level"] != "DRAM":
                continue
            share = records.median(r) * r["params"]["weight_bytes"] / h["bw"]
            if share > 1 + noise and (found is None or share > found[0]):
                found = (share, r["params"]["params"] / 1e6, kind, r["params"]["weight_bytes"] / 2**20)
    keys = ("ch4.study_above_share", "ch4.study_above_mparams", "ch4.study_above_kind",
            "ch4.study_above_mib")
    return dict(zip(keys, found or (None,) * 4))
