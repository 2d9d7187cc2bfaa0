"""Chapter 1's staircase read from its points: the bytes each cache level holds, each level's
plateau and the stretch of working sets it held (an exact cut of the curve into as many stretches
as there are levels), and whether neighbouring plateaus are distinct."""

from __future__ import annotations

import math

import numpy as np

from .. import records

LEVELS = ("L1", "L2", "L3", "DRAM")
DISTINCT = 1.15  # two neighbouring plateaus are distinct when one is this much faster


def level_sizes(caches: dict, threads: int) -> dict:
    """The bytes each cache level holds for ``threads`` threads (0 where unknown).

    Private caches (L1, L2) add up across the cores the threads run on, at most one per
    instance (SMT siblings share their core's); the L3 counts once per instance.
    """
    def private(level):
        return caches[f"{level}_bytes"] * min(threads, caches.get(f"{level}_instances") or threads)

    return {"L1": private("L1d"), "L2": private("L2"),
            "L3": caches["L3_bytes"] * min(threads, caches["L3_instances"])}


def plateaus(points: list[dict], caches: dict, threads: int) -> dict:
    """Median bandwidth of each level of the staircase (NaN: not reached); see :func:`spans`."""
    return {lv: span["bw"] for lv, span in spans(points, caches, threads).items()}


def spans(points: list[dict], caches: dict, threads: int) -> dict:
    """Each level of the staircase as found in the data: its median bandwidth ("bw", GB/s)
    and the smallest and largest working sets measured inside its stretch ("first",
    "last", bytes; NaN where the level was not reached).

    The curve of bandwidth against working set (both on log scales) is cut into as many
    stretches as there are levels (the caches the system reports, then DRAM), at the cuts
    that leave the least spread inside the stretches: an exact search, a dynamic programme
    over the cut points. The cache sizes name the stretches and bound each cut loosely,
    between a quarter and four times the level's size (a sixteenth for an L3, of which a
    VM may own a small part); they do not fix it, because a VM's share of a big shared L3,
    a victim cache or a prefetcher moves the knee away from the nominal size. A level
    counts as reached when the largest working set is at least twice the level above it.
    """
    pts = sorted(points, key=lambda p: p["params"]["bytes"])
    sizes = level_sizes(caches, threads)
    top = pts[-1]["params"]["bytes"] if pts else 0
    above = {"L1": 0, "L2": sizes["L1"], "L3": sizes["L2"], "DRAM": sizes["L3"] or sizes["L2"]}
    known = [lv for lv in LEVELS if lv == "DRAM" or sizes[lv]]
    reached = [lv for lv in known if top >= 2 * above[lv]]
    nan = float("nan")
    out = {lv: {"bw": nan, "first": nan, "last": nan} for lv in LEVELS}
    bw = np.array([records.median(p) for p in pts])
    at = [p["params"]["bytes"] for p in pts]

    def allowed(m, c):  # may level m's stretch end just before point c?
        size = sizes[reached[m - 1]]
        low = size / (16 if reached[m - 1] == "L3" else 4)  # a VM may own a sliver of an L3
        return low <= at[c] <= 4 * size

    cuts = _segments(np.log(bw), len(reached), allowed) or _segments(np.log(bw), len(reached))
    for lv, (i, j) in zip(reached, cuts):
        out[lv] = {"bw": float(np.median(bw[i:j])), "first": at[i], "last": at[j - 1]}
    return out


def _segments(y: np.ndarray, k: int, allowed=None) -> list[tuple[int, int]]:
    """Cut ``y`` into ``k`` consecutive stretches [i, j) with the least total squared
    deviation from each stretch's mean (fewer stretches if there are fewer points), where
    ``allowed(m, j)`` (if given) says whether stretch m (from 1) may end before point j;
    [] if no cut satisfies it."""
    n = len(y)
    k = min(k, n)
    if k <= 0:
        return []
    c1, c2 = np.concatenate([[0], np.cumsum(y)]), np.concatenate([[0], np.cumsum(y * y)])

    def cost(i, j):  # spread of y[i:j] around its mean
        s = c1[j] - c1[i]
        return c2[j] - c2[i] - s * s / (j - i)

    best = {(0, 0): (0.0, None)}  # (stretches, end) -> (cost, start of the last stretch)
    for m in range(1, k + 1):
        for j in range(m, n - (k - m) + 1):
            if m < k and allowed and not allowed(m, j):
                continue
            options = [(best[m - 1, i][0] + cost(i, j), i)
                       for i in range(m - 1, j) if (m - 1, i) in best]
            if options:
                best[m, j] = min(options)
    if (k, n) not in best:
        return []
    cuts, j = [], n
    for m in range(k, 0, -1):
        i = best[m, j][1]
        cuts.append((i, j))
        j = i
    return cuts[::-1]


def staircase_close(plateau: dict, factor: float = DISTINCT) -> list[str]:
    """The neighbouring levels whose plateaus differ by less than ``factor`` ("L3/DRAM"),
    and the levels not reached; empty when the four plateaus are distinct."""
    out = [lv for lv in LEVELS if math.isnan(plateau[lv])]
    v = [(lv, plateau[lv]) for lv in LEVELS if not math.isnan(plateau[lv])]
    out += [f"{a}/{b}" for (a, x), (b, y) in zip(v, v[1:]) if x < factor * y]
    return out


def staircase_distinct(plateau: dict, factor: float = DISTINCT) -> bool:
    """True if L1 > L2 > L3 > DRAM, each by at least ``factor``."""
    return not staircase_close(plateau, factor)
