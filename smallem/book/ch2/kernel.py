"""Chapter 2's micro-kernel on the page: the FMAs that must be in flight, the registers its
tile takes, and its blocks against the caches (values for the page, from the record and
chapter 1's)."""

from __future__ import annotations

import math

from smallem.product.gemm import FMA_LATENCY, FMA_PIPES, REGISTER_FILE, l2_ways_for_a
from .. import ch1, figures, records, reference


def latency_values(s: dict, rec_dir) -> dict:
    """The FMAs that must be in flight to hide the FMA's latency: the latency (the manuals')
    times the FMAs of the kernel's width this core starts a cycle, from the f32 operations a
    cycle chapter 1 measured (and the lanes it rounds them to) where its record ran the same
    ISA level; else the two pipes smallem.product.gemm.micro_shape assumes, said so."""
    vec, _ = REGISTER_FILE[s["isa"]]
    per_cycle, ops, lanes = FMA_PIPES, None, None  # ops: None where nothing was measured
    # the one core table's facts as chapter 1 states them (ch1.hw.*); None without its record,
    # where this page, which has its own record, still renders
    hw = dict.fromkeys(("ch1.hw.load_bits", "ch1.hw.loads_per_cycle", "ch1.hw.vendor",
                        "ch1.hw.cite", "ch1.hw.l2_inclusive"))
    if records.exists("ch1.machine", rec_dir):
        rec1 = records.load("ch1.machine", rec_dir)
        if rec1["settings"]["isa"] == s["isa"]:
            th = ch1.theory(rec1)
            # chapter 1's measured operations a cycle, and the lanes it rounds them to
            # (ch1.hw.fmas_per_cycle: the same reading)
            ops, lanes = th["measured_flops_per_cycle"], th["lanes"]
            per_cycle = max(1, lanes // vec)
        hw.update(ch1.hw_values(rec1))
    # typed counts: the page writes them with its plural filter
    return {"ch2.fma_latency": FMA_LATENCY, "ch2.fmas_per_cycle": per_cycle,
            "ch2.fma_ops_measured": ops, "ch2.fma_lanes": lanes, "ch2.vec_bits": 32 * vec,
            "ch2.fmas_in_flight": FMA_LATENCY * per_cycle,
            "ch2.latency_bound": vec * FMA_LATENCY * per_cycle,
            "ch2.fmas_measured": ops is not None,
            "ch2.hw_load_bits": hw["ch1.hw.load_bits"],
            "ch2.hw_loads_per_cycle": hw["ch1.hw.loads_per_cycle"],
            "ch2.hw_vendor": hw["ch1.hw.vendor"], "ch2.hw_cite": hw["ch1.hw.cite"],
            "ch2.hw_l2_inclusive": hw["ch1.hw.l2_inclusive"]}


def block_values(s: dict, n: int, no5: str) -> dict:
    """The micro-kernel's registers and the blocks' sizes against the caches, for the page
    (``no5`` where the record has no blocks of rung 5's own)."""
    f = figures.fmt
    values = {}
    ladder = s["blocks_ladder"]
    kc5 = s["blocks_rows"]["kc"] if "blocks_rows" in s else None
    g = s["cache_geometry"]
    mr, nr, b = s["mr"], s["nr"], ladder
    vec, regs = REGISTER_FILE[s["isa"]]
    values.update({
        "ch2.vec_floats": str(vec), "ch2.registers": str(regs),
        "ch2.accumulators": str(mr * nr // vec), "ch2.b_vectors": str(nr // vec),
        "ch2.regs_used": str(mr * nr // vec + nr // vec + 1),

        "ch2.tile_floats": str(mr * nr),
        "ch2.l1_kib": f"{g['L1d']['bytes'] // 1024} KiB", "ch2.l1_ways": str(g["L1d"]["ways"]),
        "ch2.l2_kib": f"{g['L2']['bytes'] // 1024} KiB", "ch2.l2_ways": str(g["L2"]["ways"]),
        "ch2.l3_mib": f"{g['L3']['bytes'] / 1024**2:.0f} MiB",
        "ch2.line": f"{g['L1d']['line']} B",
        "ch2.l1_ways_b": str(math.ceil(nr * b["kc"] * 4 / (g["L1d"]["bytes"] / g["L1d"]["ways"]))),
        "ch2.l1_ca_low": max(1, (g["L1d"]["ways"] - 1) * mr // (mr + nr)),
        "ch2.kc_low": str(max(1, (g["L1d"]["ways"] - 1) * mr // (mr + nr))
                          * g["L1d"]["bytes"] // g["L1d"]["ways"] // (mr * 4)),
        "ch2.l2_ways_a": str(l2_ways_for_a(g["L2"]["ways"])),
        "ch2.l1_sets": str(g["L1d"]["bytes"] // (g["L1d"]["ways"] * g["L1d"]["line"])),
        "ch2.l1_way_kib": f"{g['L1d']['bytes'] / g['L1d']['ways'] / 1024:.0f} KiB",
        "ch2.l2_way_kib": f"{g['L2']['bytes'] / g['L2']['ways'] / 1024:.0f} KiB",
        "ch2.a_sliver_kib": f"{mr * b['kc'] * 4 / 1024:.1f} KiB",
        "ch2.a_sliver5_kib": f"{mr * kc5 * 4 / 1024:.1f} KiB" if kc5 else no5,
        "ch2.l1_ways_a5": (str(math.ceil(mr * kc5 * 4 / (g["L1d"]["bytes"] / g["L1d"]["ways"])))
                           if kc5 else no5),
        "ch2.b_sliver_kib": f"{nr * b['kc'] * 4 / 1024:.1f} KiB",
        "ch2.a_block_kib": f"{b['mc'] * b['kc'] * 4 / 1024:.0f} KiB",
        "ch2.b_block_kib": f"{b['kc'] * min(b['nc'], n) * 4 / 1024:.0f} KiB",
        "ch2.b_row_bytes": f"{nr * 4} bytes",
        "ch2.b_row_lines": math.ceil(nr * 4 / g["L1d"]["line"]),
        # lines of rung 0's column of B (rows 4n bytes apart) that the L1's sets hold at once
        "ch2.column_lines_l1": ch1.column_lines_held(g["L1d"]["bytes"], g["L1d"]["ways"], 4 * n,
                                                     g["L1d"]["line"]),
    })
    return values
