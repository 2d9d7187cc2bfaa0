"""Chapter 2's block sizes: the analytical model of Low et al. (2016) that sizes the GEMM's
blocks from the caches the system reports, and from the reach chapter 1's copy sweep measures.
:mod:`smallem.product.gemm` takes them from here (and names them as its own)."""

from __future__ import annotations

import math

from smallem.cpu import machine_info


def cache_geometry(caches: dict | None = None) -> dict:
    """Size, ways, line size and instances of L1d, L2, L3, from ``caches`` (default
    :func:`smallem.cpu.machine_info.caches`); a size or associativity the system does not
    report takes a common value (32 KiB 8-way, 512 KiB 8-way, 8 MiB 16-way)."""
    sizes = caches or machine_info.caches()
    defaults = {"L1d": (32 * 1024, 8), "L2": (512 * 1024, 8), "L3": (8 * 1024**2, 16)}
    return {name: {"bytes": sizes.get(f"{name}_bytes") or size,
                   "ways": sizes.get(f"{name}_ways") or ways, "line": 64,
                   "instances": sizes.get(f"{name}_instances", 1)}
            for name, (size, ways) in defaults.items()}


def l2_ways_for_a(ways: int) -> int:
    """Ways of the L2 given to the packed block of A: half of them.

    Low et al. give A every way but one spare and one for a B sliver. But the L2 also
    holds everything the L1 holds (it is inclusive on the cores we measured), the B
    slivers on their way from L3 to L1, the lines of C each tile reads and writes, and
    what the hardware prefetchers bring in ahead of those streams; half leaves room for
    them. `smallem gemm` sweeps MC (table ch2_mc): on the 2-core Zen 3 this was written
    on, blocks from a quarter to three quarters of the L2 came within a few percent of
    each other, less than the noise between two runs."""
    return max(1, ways // 2)


def l1_ways_for_b(ways: int) -> int:
    """Ways of the L1 given to the B sliver in rungs 2 to 4: all but two.

    The B sliver (KC x NR) is the one thing the L1 must keep: every tile of a column
    reuses it. A's sliver (MR x KC) and C's tile are read once per tile, so they only
    stream through, and two ways are enough for lines in flight. Low et al. keep A's
    sliver resident too, which caps KC lower; a larger KC means fewer passes over C
    (K / KC of them, each reading and writing all of C)."""
    return max(1, ways - 2)


def l1_ways_for_a(ways: int) -> int:
    """Ways of the L1 given to the A sliver in rung 5: all but one.

    Rung 5 walks its tiles along C's rows, so A's sliver (MR x KC) is the one every
    tile of a row reuses, and B's slivers stream past it once each, as C's tile does.
    With B no longer resident, KC is bounded by A's sliver, whose rows are MR floats
    where B's are NR: on AVX-512's 14 x 32 tile KC more than doubles, and so the
    passes over C halve. The sweep in table ch2_kc times the final GEMM with A's sliver
    in more or fewer ways. On 2 Zen 5 cores, timed in turn against rung 4's KC, it was
    a few percent faster on every square and model shape tried; all ways but two was no
    faster than all but one, which also puts K = 768 in a single slice.
    """
    return max(1, ways - 1)


def block_sizes(mr: int, nr: int, geometry: dict | None = None, threads: int = 1,
                elem: int = 4, rung5: bool = False, reach: int | None = None) -> dict:
    """KC, MC, NC from the caches, after Low et al. (2016), section 4.

    - L1 keeps the KC x NR sliver of B in all its ways but two (see l1_ways_for_b);
      with ``rung5``, the MR x KC sliver of A in all its ways but one (l1_ways_for_a).
    - L2 holds the MC x KC block of A in half its ways (see l2_ways_for_a).
    - L3 holds the KC x NC block of B beside every thread's block of A, one way spare;
      and with ``rung5``, where ``reach`` is given (the caches' reach that chapter 1's copy
      sweep measures, :func:`smallem.cpu.machine.cache_reach`), B's block takes at most half
      of it (see b_block_bytes). The row order reads a B sliver from that block for every
      tile; the column order reads one per block of A and keeps it in L1 for the tiles down
      its column, so a block of B partly in memory costs it a tile column's share as much.
    """
    g = geometry or cache_geometry()

    def sets(c):
        return c["bytes"] // (c["ways"] * c["line"])

    l1, l2, l3 = g["L1d"], g["L2"], g["L3"]
    way1 = sets(l1) * l1["line"]
    if rung5:
        kc = max(1, l1_ways_for_a(l1["ways"]) * way1 // (mr * elem))
    else:
        kc = max(1, l1_ways_for_b(l1["ways"]) * way1 // (nr * elem))
    way2 = sets(l2) * l2["line"]
    mc = max(mr, l2_ways_for_a(l2["ways"]) * way2 // (kc * elem) // mr * mr)
    way3 = sets(l3) * l3["line"]
    a_blocks = max(1, threads // max(1, l3["instances"]))
    ca3 = math.ceil(a_blocks * mc * kc * elem / way3)
    nc = max(nr, (l3["ways"] - 1 - ca3) * way3 // (kc * elem) // nr * nr)
    if reach and rung5:
        nc = min(nc, max(nr, b_block_bytes(reach) // (kc * elem) // nr * nr))
    return {"mc": int(mc), "kc": int(kc), "nc": int(nc)}


def b_block_bytes(reach: int) -> int:
    """The most a block of B may take where the caches' measured reach is ``reach``: half.

    On a virtual machine the L3 the system reports is the whole socket's, shared with
    other guests; the reach is what one process here still finds served by the caches. A
    block planned for the whole reported L3 (19 MiB of B on the 2-core Zen 3, whose copy
    sweep falls to memory's rate past 16 MiB) is partly read back from memory. Half, as A's
    block takes half the L2 (l2_ways_for_a) and as b_whole leaves half of B's space: the
    rest of the reach holds the lines of A and C that stream past B's block on their way."""
    return int(reach) // 2
