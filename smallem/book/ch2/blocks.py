"""Rung 5's K_C sweep read against what sets it: the L1 that holds A's sliver, the passes over
C that a longer slice saves, and the block of B that every row of tiles reads again from the
L3, whose size the L1 model does not weigh."""

from __future__ import annotations

import math

from smallem.product import gemm
from smallem.product.gemm import equal_slices
from .. import ch1, compare, figures, records

PREDATES_ROWS = "the record predates rung 5's own blocks"
SLOW = 0.05  # the model's K_C this far below the fastest is a miss the page explains


def sweep_values(pts: list[dict], param: str, chosen: int | None, prefix: str,
                 unknown: str = "n/a", typed: tuple[str, ...] = ()) -> dict:
    """A block-size sweep in numbers: the fastest value and its rate, how far below it the
    model's choice (``unknown`` where the record does not say it) and the slowest came.
    ``typed`` names the fractions the page also takes as numbers ("spread", "model_gap")."""
    by = {p["params"][param]: records.median(p) for p in pts}
    best, slowest = max(by, key=by.get), min(by, key=by.get)
    frac = {"spread": 1 - by[slowest] / by[best],
            "model_gap": 1 - by[chosen] / by[best] if chosen in by else None}
    return {f"{prefix}_best": str(best), f"{prefix}_best_gops": figures.fmt(by[best], "Gop/s"),
            f"{prefix}_model_gap": (f"{100 * frac['model_gap']:.1f} %"
                                    if chosen in by else unknown),
            f"{prefix}_spread": f"{100 * frac['spread']:.1f} %",
            # typed: the rate "falls" or "rises" as the block grows (first to last by more than
            # the sweep's noise, no step the other way beyond it: a two-level step is a trend
            # too), else None; and the fractions asked
            f"{prefix}_trend": _trend([by[k] for k in sorted(by)]),
            # typed: whether one step holds most of the sweep's spread, and that step (its two
            # block sizes and their rates; None each without one): the page says it first
            **_cliff(sorted(by), [by[k] for k in sorted(by)], f"{prefix}_cliff"),
            **{f"{prefix}_{k}_frac": frac[k] for k in typed}}


def _trend(rates: list[float]) -> str | None:
    """"falls" or "rises" where the rate moves one way from the first block to the last by
    more than the sweep's noise and no step goes the other way by more than that noise of
    the rate it starts from; else None."""
    noise = compare.SWEEP_NOISE  # the page's "noise" of a sweep's points
    if len(rates) < 3 or abs(rates[-1] / rates[0] - 1) <= noise:
        return None
    pairs = list(zip(rates, rates[1:]))
    if rates[-1] < rates[0] and all(b - a <= noise * a for a, b in pairs):
        return "falls"
    if rates[-1] > rates[0] and all(a - b <= noise * a for a, b in pairs):
        return "rises"
    return None


def _cliff(keys: list, rates: list[float], key: str) -> dict:
    """The one step between neighbouring block sizes that holds at least two thirds of the
    sweep's spread, where the spread and the step are each more than the sweep's noise: ``key`` True and
    ``key``_from, _to (the block sizes), _from_gops, _to_gops; else ``key`` False, the rest None."""
    out = {key: False, **{f"{key}_{k}": None for k in ("from", "to", "from_gops", "to_gops")}}
    if len(rates) < 3:
        return out
    spread = max(rates) - min(rates)
    steps = [b - a for a, b in zip(rates, rates[1:])]
    i = max(range(len(steps)), key=lambda j: abs(steps[j]))
    if (spread <= compare.SWEEP_NOISE * max(rates) or abs(steps[i]) < 2 / 3 * spread
            or abs(steps[i]) <= compare.SWEEP_NOISE * max(rates[i], rates[i + 1])):
        return out  # no spread, no one step that holds it, or a step inside the noise
    return {key: True, f"{key}_from": keys[i], f"{key}_to": keys[i + 1],
            f"{key}_from_gops": rates[i], f"{key}_to_gops": rates[i + 1]}


def _l3_end(rec_dir) -> float | None:
    """Bytes at which chapter 1's triad plateau of the L3 ends on all cores (None without a
    chapter 1 record)."""
    facts = ch1.facts(rec_dir) if rec_dir is not None else None
    try:
        return float(facts["triad_spans"][facts["cores"]]["L3"]["last"])
    except (TypeError, KeyError):
        return None


def kc_rows(rec: dict, rec_dir=None) -> tuple[list[list], dict]:
    """The KC sweep: the final GEMM on all cores, A's sliver in more or fewer L1 ways, with
    the block of B (K_C x N floats) each point streams from the L3."""
    pts = records.results(rec, "kc_sweep")
    chosen = rec["settings"].get("blocks_rows", {}).get("kc")  # None: the record predates it
    width = rec["settings"]["mr"]  # floats of A's sliver per k
    n = pts[0]["params"]["n"]
    nc = rec["settings"].get("blocks_rows", {}).get("nc") or n

    def b_block(kc):
        return 4 * kc * min(n, nc)

    def cut(kc):  # the slice the driver runs: K in equal slices of at most kc
        return equal_slices(n, kc)

    rows = [[f"{p['params']['l1_ways']}" + (" (model)" if p["params"]["kc"] == chosen else ""),
             f"{p['params']['kc']}" + (f" → {cut(p['params']['kc'])}"
                                       if cut(p["params"]["kc"]) != p["params"]["kc"] else ""),
             f"{cut(p['params']['kc']) * width * 4 / 1024:.0f} KiB",
             f"{math.ceil(n / p['params']['kc'])}",
             f"{b_block(cut(p['params']['kc'])) / 2**20:.1f} MiB",
             figures.fmt(records.median(p), "Gop/s")] for p in pts]
    values = {"ch2.kc_n": str(n), "ch2.kc_c_mib": f"{n ** 2 * 4 / 1024**2:.0f} MiB",
              **sweep_values(pts, "kc", chosen, "ch2.kc", records.not_measured(rec, PREDATES_ROWS),
                             typed=("model_gap",))}
    by = {p["params"]["kc"]: records.median(p) for p in pts}
    best = max(by, key=by.get)
    # rows whose caps the driver cuts to the same slice run one product: how far apart they
    # measured is this sweep's own noise (None where no two rows share a slice)
    same: dict[int, list[float]] = {}
    for kc, rate in by.items():
        same.setdefault(cut(kc), []).append(rate)
    twice = [max(r) / min(r) - 1 for r in same.values() if len(r) > 1 and min(r) > 0]
    end = _l3_end(rec_dir)
    slow = chosen in by and by[chosen] < (1 - SLOW) * by[best]
    # the sweep times rung 5's row order; a machine whose loop-order model chose the columns
    # does not take that path unless SMALLEM_GEMM_ORDER forces it
    taken = rec["settings"].get("order", "rows") == "rows"
    values.update({
        "ch2.kc_order_taken": taken,
        "ch2.kc_twice": max(twice) if twice else None,
        "ch2.kc_model_slow": slow and taken,
        "ch2.kc_model_b": f"{b_block(cut(chosen)) / 2**20:.1f} MiB" if chosen in by else "n/a",
        "ch2.kc_best_b": f"{b_block(cut(best)) / 2**20:.1f} MiB",
        # typed: the slices the driver cut K into at the fastest cap and at the model's, and
        # whether they are the same product (two rows of one configuration)
        "ch2.kc_best_cut": cut(best), "ch2.kc_model_cut": cut(chosen) if chosen in by else None,
        "ch2.kc_same_cut": chosen in by and chosen != best and cut(chosen) == cut(best),
        "ch2.l3_plateau_end": f"{end / 2**20:.0f} MiB" if end else "n/a",
        # typed: chapter 1's all-core L3 plateau ended below half the L3 the OS reports (a
        # VM's share of a shared L3), which the block sizes are planned from
        "ch2.l3_plateau_short": bool(end and end < 0.5 * (rec["settings"].get("cache_geometry")
                                                          or {}).get("L3", {}).get("bytes", 0)),
        # the measured reason, where it holds: the model's B block is past the L3's plateau
        # and the fastest point's is not
        "ch2.kc_b_past_l3": bool(slow and taken and end
                                 and b_block(cut(chosen)) > end >= b_block(cut(best))),
        "ch2.nc5_reach_mib": nc5_reach_mib(rec)})
    return rows, values


def nc5_reach_mib(rec: dict) -> float | None:
    """The caches' reach (MiB, chapter 1's copy sweep) that cut rung 5's N_C, where it did:
    the record's row-order block is narrower than the L3 model alone gives (None where the
    reach left it whole, or the record predates the cut)."""
    s = rec["settings"]
    reach, rows5, geometry = s.get("blocks_reach"), s.get("blocks_rows"), s.get("cache_geometry")
    if not (reach and rows5 and geometry):
        return None
    whole = gemm.block_sizes(s["mr"], s["nr"], geometry, s["threads"], rung5=True)["nc"]
    return reach / 2**20 if rows5["nc"] < whole else None


def b_packed_whole(rec: dict, N: int, K: int) -> bool | None:
    """Whether the package's GEMM packs all of a K x N B before any tile, by the driver's
    rule (``b_whole`` in kernels_c/gemm/driver.c) at the record's blocks (None: no blocks)."""
    s = rec["settings"]
    b, nr = s.get("blocks"), s.get("nr")
    if not b or not nr:
        return None
    return K > b["kc"] and 2 * K * (-(-N // nr) * nr) <= b["kc"] * b["nc"]


def rows_fed(s: dict, facts: dict, stream: str) -> tuple[float, str] | None:
    """Rung 5's feed where its block of B lies beyond a core's L2: every core reads all of
    the shared block, so the level is the one that holds it on one core's staircase; the
    row order asks it for :func:`gemm.rows_bytes_per_op` bytes an operation, at the rate
    chapter 1 measured from that level with every core reading. None where the block sits
    in the L2 or closer, or the record predates rung 5's blocks."""
    rows5, n = s.get("blocks_rows"), s["n_ladder"]
    if not rows5:
        return None
    block = 4 * rows5["kc"] * min(rows5["nc"], n)
    lv, _ = ch1.level_of(facts, block, 1, stream)
    if lv in ("L1", "L2"):
        return None
    ext = facts[f"{stream}_spans"]
    bw = ext[facts["cores"] if facts["cores"] in ext else max(ext)][lv]["bw"]
    return bw / gemm.rows_bytes_per_op(s["mr"], rows5["kc"]), f"a sliver of B per tile from {lv}"
