"""The phases of chapter 2's model products: what 1/M says packing B should cost, and 1/N
packing A."""

from __future__ import annotations

from .. import records


def pack_b_expect(shares: dict, most: str) -> dict:
    """What 1/M predicts for the product that spends the most packing B, from each other
    product's share times its M: the least and the most of those, as fractions (None where
    there is no other product), and how far apart the others' own shares are."""
    others = [(pct * m / shares[most][2]) for name, (pct, _, m) in shares.items() if name != most]
    own = [pct for name, (pct, _, _) in shares.items() if name != most]
    return {"ch2.phase_most_share": shares[most][0] / 100,
            "ch2.phase_most_expect_lo": min(others) / 100 if others else None,
            "ch2.phase_most_expect_hi": max(others) / 100 if others else None,
            "ch2.phase_others_spread": max(own) / min(own) if own and min(own) > 0 else None}


def block_width(rec: dict, N: int) -> float:
    """The width of a block of B along N, N over the blocks the package's N_C cuts it into:
    the driver packs A again for every such block (inside its jc loop), so packing A's share
    of a product weighs as one over this width."""
    nc = (rec["settings"].get("blocks") or {}).get("nc") or N  # no blocks recorded: N whole
    return N / -(-N // nc)


def pack_a_expect(a_shares: dict, odd: str) -> dict:
    """What 1/N predicts for product ``odd``'s share of packing A from each other product's
    share times its N (``a_shares``: name -> (share in %, N)): the least and the most of
    those, as fractions (None where there is no other product)."""
    others = [pct * n / a_shares[odd][1] for name, (pct, n) in a_shares.items() if name != odd]
    return {"ch2.phase_a_odd_expect_lo": min(others) / 100 if others else None,
            "ch2.phase_a_odd_expect_hi": max(others) / 100 if others else None}


def phase_gap(rec: dict, pairs: list) -> float | None:
    """How far the phase table's time per call lies from the time the products table's rate
    (``pairs``: reading.shape_pairs) gives the same product: the largest gap over the
    products, as a fraction; None where there is none above 2 %."""
    gaps = []
    for label, ours, _ in pairs:  # (label, our Gop/s, numpy's): the products table's
        wall = records.results(rec, "phase", label=label, phase="wall")
        if wall and ours:
            p = wall[0]["params"]
            shape_ms = 2e-6 * p["M"] * p["K"] * p["N"] / ours
            gaps.append(abs(records.median(wall[0]) / shape_ms - 1))
    return max(gaps) if gaps and max(gaps) > 0.02 else None
