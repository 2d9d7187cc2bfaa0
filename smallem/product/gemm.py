"""Chapter 2: the matrix product, from three loops to the machine's peak.

The C kernels are in ``kernels_c/gemm.c``, one function per rung of the ladder:

0. naive (i, j, k)                      3. a register-blocked micro-kernel
1. loop order (i, k, j)                 4. packing A and B into panels
2. cache blocking (jc, pc, ic loops)    5. threads (OpenMP, over the tiles of C)

:data:`LADDER` lists them, in order; the benchmark, the tests, the table and
the figures all read that one list. The block sizes come from the machine's
caches by the analytical model of Low et al. (2016), see :func:`block_sizes`.

The package's GEMM is the last rung, generalised (``kernels_c/gemm/driver.c``):
:func:`matmul` computes ``C = alpha op(A) op(B) + beta C`` for f32 and
:func:`matmul_bf16` the same with bf16 inputs (stored as ``uint16``) and f32
output. Both take the transposes in packing, never by copying, and allocate
nothing per call but the result (none when ``out=`` is given): the packing
buffer is kept per Python thread and reused.
"""

from __future__ import annotations

from typing import NamedTuple

import functools
import math
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from smallem import checks, ladder
from smallem.plumbing import build, pool
from smallem.cpu import isa, machine, machine_info
from smallem.product.blocks import (  # noqa: F401 (the block model, gemm's names too)
    b_block_bytes, block_sizes, cache_geometry, l1_ways_for_a, l1_ways_for_b, l2_ways_for_a)
from smallem.generating.quant import bf16_to_f32, f32_to_bf16  # noqa: F401 (the bf16 format, gemm's names too)

F32, U16 = np.dtype(np.float32), np.dtype(np.uint16)

# ---------------------------------------------------------------- the analytical model

# Per ISA level: floats per vector register, and vector registers.
REGISTER_FILE = {"avx512": (16, 32), "avx2": (8, 16), "generic": (4, 16)}  # generic: SSE2/NEON-ish
FMA_LATENCY = 4   # cycles, Zen 3 / Zen 4 / Skylake-X and later (Agner Fog's tables)
FMA_PIPES = 2


def micro_shape(vec_floats: int, registers: int, latency: int = FMA_LATENCY,
                pipes: int = FMA_PIPES) -> tuple[int, int]:
    """(MR, NR) of the micro-kernel from the register file.

    NR is two vectors, so one broadcast of A feeds two FMAs; MR is as many rows
    as the registers hold: MR * NR/VL accumulators + NR/VL for B + 1 for A.
    Low et al.'s condition, MR * NR >= VL * latency * pipes (enough independent
    FMAs in flight to hide the latency on every pipe), must then hold.
    """
    nv = 2
    nr = nv * vec_floats
    mr = (registers - nv - 1) // nv
    if mr * nr < vec_floats * latency * pipes:
        raise ValueError(f"{mr}x{nr} tile cannot hide a {latency}-cycle FMA on {pipes} pipes")
    return mr, nr


AMX_MR, AMX_KB = 32, 32  # kernels_c/gemm/bf16.c: rows of A in a block, bf16 of k in a tile row
AMX_EPILOGUES = ("vector", "stream")  # gemm_bf16_amx's epilogue numbers: 0, 1


# --8<-- [start:amx_blocks]
def amx_blocks(geometry: dict | None = None) -> dict:
    """KC and NC of the AMX path, from the caches (chapter 2's AMX ladder, second rung).

    - KC: A's 32-row panel, 32 x KC bf16, fills the L1. Each 32 x 32 block of C loads its
      two tiles of A from that panel and its two tiles of B from the L2, so the panel is
      what the L1 must keep; and every slice of K after the first reads C back and writes
      it again, so the longest slice the L1 allows is the one to take (K in equal slices
      of at most KC, as the f32 driver cuts it).
    - NC: B's KC x NC block, bf16, in half the L2 (as the f32 model gives A's block half
      its ways, l2_ways_for_a): the rest holds the A panels on their way to the L1 and
      the lines of C. N too is cut in equal slices of at most NC.
    """
    g = geometry or cache_geometry()
    kc = max(AMX_KB, g["L1d"]["bytes"] // (AMX_MR * 2) // AMX_KB * AMX_KB)
    nc = max(AMX_MR, g["L2"]["bytes"] // 2 // (2 * kc) // AMX_MR * AMX_MR)
    return {"kc": int(kc), "nc": int(nc)}


def amx_epilogue(M: int, N: int, reach_bytes: int) -> str:
    """How the AMX path writes C (chapter 2's AMX ladder, third rung): "stream" (whole
    lines, past the caches, not read first) where C's f32 outgrow what the caches here
    hold (``reach_bytes``, :func:`smallem.cpu.machine.cache_reach`), so that the lines
    would come from memory to be written and go back to memory before anyone read
    them; else "vector", which leaves C in the caches for the next reader."""
    return "stream" if 4 * M * N > reach_bytes else "vector"
# --8<-- [end:amx_blocks]


ORDERS = ("rows", "columns")  # the C driver's order numbers: 0, 1
ORDER_ENV = "SMALLEM_GEMM_ORDER"
HEADROOM = 0.5  # the share of a level's measured bandwidth one stream of the kernel counts on


def rows_bytes_per_op(mr: int, kc: int) -> float:
    """The row order's bytes an operation from where its block of B lies (:func:`loop_order`)."""
    return 2 / mr + 4 / kc


def loop_order(mr: int, nr: int, feeds: dict, geometry: dict | None = None,
               threads: int = 1) -> tuple[str, dict]:
    """The order of the tiles, from the caches and from what they can feed, and why.

    "rows" (rung 5): each MR x KC sliver of A stays in L1 while the tiles go along C's
    rows, and the KC x NR slivers of B stream in from the L3, one per tile: 4 KC NR bytes
    for 2 MR NR KC operations, 2 / MR bytes an operation, plus 4 / KC for C's lines.
    Its KC is the longer (A's slivers are MR floats wide, B's NR), so C is read fewer
    times; it is chosen when the L3 can deliver that at one core's peak rate with
    HEADROOM to spare: the triad's bandwidth is what a loop that does nothing else gets,
    and the kernel's loads from L1 run at the same time.

    "columns" (rung 4's order): each B sliver stays in L1 for the tiles down its column,
    and the A slivers come from the MC x KC block in L2: 2 / NR bytes an operation from
    L2, and the L3 only sees a B sliver once per block of A.

    ``feeds``: ``f32_gops_core`` (one core's FMA rate) and ``l3_gbs_core`` (each core's
    share of the L3's triad bandwidth with every core reading), as :func:`feeds`
    measures them or chapter 1 recorded them."""
    per_op = rows_bytes_per_op(mr, block_sizes(mr, nr, geometry, threads, rung5=True)["kc"])
    need, have = feeds["f32_gops_core"] * per_op, feeds["l3_gbs_core"]  # GB/s from L3
    why = {"need_gbs": need, "have_gbs": have, "headroom": HEADROOM, "bytes_per_op": per_op}
    return ("rows" if need <= HEADROOM * have else "columns"), why


ORDER_N, ORDER_ROUNDS = 2048, 7  # the product both orders are timed at, and in how many rounds


# --8<-- [start:order_rule]
def order_rule(model: str, seconds: dict | None) -> str:
    """The order the package takes: the model's (:func:`loop_order`), unless the two orders
    timed in turn (``seconds``, round by round: :func:`timed_orders`) had the other faster in
    every round but one at most. The model weighs the L3's bandwidth; the L3's latency that
    the prefetches hide, the column order's walks down C, only the timing sees."""
    other = next(o for o in ORDERS if o != model)
    a, b = (seconds or {}).get(other) or [], (seconds or {}).get(model) or []
    ahead = sum(x < y for x, y in zip(a, b))
    return other if a and len(a) == len(b) and ahead >= len(a) - 1 else model
# --8<-- [end:order_rule]


def timed_orders(level: str, threads: int, sets: tuple, ffi, lib) -> dict | None:
    """Both orders, each with its own blocks (``sets``: rows', columns'), on ORDER_N^3 with
    ``threads`` in ORDER_ROUNDS rounds taken in turn: {"rows": seconds, "columns": seconds,
    "n", "threads"}, measured once per machine and kernel source and kept
    (:func:`smallem.cpu.machine.kept`); None for a level not this CPU's best or emulated."""
    if level != isa.best() or isa.emulating(level):
        return None
    import hashlib

    src = sorted([build.KERNELS_DIR / "gemm.c", *(build.KERNELS_DIR / "gemm").glob("*.c")])
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in src)).hexdigest()[:16]
    return machine.kept("gemm_order", [level, threads, [list(x) for x in sets], digest],
                        lambda: _time_orders(level, threads, sets, ffi, lib))


def _time_orders(level, threads, sets, ffi, lib) -> dict:
    from smallem.cpu.timing import measure_interleaved

    n, rng = ORDER_N, np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
    c, fns = empty_aligned((n, n)), {}
    for order, (mc, kc, nc) in zip(ORDERS, sets):
        args = (0, 0, n, n, n, 1.0, _ptr(ffi, a), n, _ptr(ffi, b), n, 0.0, _ptr(ffi, c), n,
                threads, ORDERS.index(order), mc, kc, nc,
                _workspace(ffi, lib, level, n, n, mc, kc, nc, threads))
        fns[order] = lambda args=args: lib.gemm_f32(*args)
    ts = measure_interleaved(fns, repeats=ORDER_ROUNDS, warmup=1, min_sample=0.02)
    return {**{o: list(t.seconds) for o, t in ts.items()}, "n": n, "threads": threads}


def feeds(level: str | None = None) -> dict:
    """What :func:`loop_order` weighs for this machine: one core's f32 FMA rate, its bf16
    dot rate, and each core's share of the L3's bandwidth (triad, every core reading a
    working set between the L2s and the L3). Measured once per machine with chapter 1's
    probes at the first product and kept in the build cache, so every process on this
    machine makes the same choices; read once per process (matmul_bf16 asks on every call)."""
    level = isa.best() if level is None or isa.emulating(level) else level
    return _feeds(level, machine_info.usable_cores())


@functools.lru_cache(maxsize=8)
def _feeds(level: str, cores: int) -> dict:
    return machine.feeds(level)


# ---------------------------------------------------------------- loading the kernels

_lock = threading.Lock()


class Kernels(NamedTuple):
    """The GEMM module loaded for one level, and what was decided for it once: the
    micro-kernel's shape, the blocks of the rows order (rung 5's) and of the columns order
    (rungs 2-4's), each (mc, kc, nc), the package's loop order and the config tuple every
    plain call passes (the order's index, then its blocks), and the AMX path's (kc, nc)."""
    ffi: object
    lib: object
    mr: int
    nr: int
    blocks_rows: tuple
    blocks_columns: tuple
    order: str
    config: tuple
    amx: tuple = (0, 0)  # the AMX path's (kc, nc): amx_blocks, decided with the rest
    order_model: str = ""  # loop_order's choice, before the timing (order_rule)
    order_timed: dict | None = None  # timed_orders' rounds (None: not timed, the model's order)


def kernels(level: str | None = None, on_pool: bool = False) -> Kernels:
    """:class:`Kernels` for ``level`` (default: the selected ISA), on the pool's build of the
    module where ``on_pool``.

    Loaded once per process and level: build.load checks the sources' timestamps
    on every call (half a millisecond), which a 64^3 product cannot afford.
    """
    level = level or isa.selected()
    found = _loaded.get((level, on_pool))
    if found is None:
        with _lock:
            ffi, lib = pool.load("gemm", level) if on_pool else build.load("gemm", level)
            mr, nr = ffi.new("int *"), ffi.new("int *")
            lib.gemm_micro_shape(mr, nr)
            threads = checks.threads(None)
            # (mc, kc, nc), passed to every call that takes blocks (run_rung, _gemm): C keeps none
            reach = feeds(level)["reach_bytes"]
            sets = [tuple(block_sizes(mr[0], nr[0], threads=threads, rung5=r5,
                                      reach=reach).values()) for r5 in (True, False)]
            model = loop_order(mr[0], nr[0], feeds(level), threads=threads)[0]
            forced = os.environ.get(ORDER_ENV)
            timed = None if forced else timed_orders(level, threads, tuple(sets), ffi, lib)
            order = forced or order_rule(model, timed)
            if order not in ORDERS:
                raise ValueError(f"${ORDER_ENV}={order!r}: expected one of {ORDERS}")
            config = (ORDERS.index(order), *sets[0 if order == "rows" else 1])
            amx = tuple(amx_blocks().values())
            found = _loaded[(level, on_pool)] = Kernels(ffi, lib, mr[0], nr[0], *sets, order, config,
                                                        amx, model, timed)
    return found


_loaded: dict = {}


def kernel_shape(level: str | None = None) -> tuple[int, int]:
    """(MR, NR) as compiled into the kernel for ``level``."""
    k = kernels(level)
    return k.mr, k.nr


def default_order(level: str | None = None) -> str:
    """The order of :func:`matmul`'s tiles here: ``$SMALLEM_GEMM_ORDER``, else
    :func:`loop_order`'s choice as :func:`order_rule` keeps or overrules it by the timing."""
    return kernels(level).order


def order_blocks(order: str, level: str | None = None) -> dict:
    """The model's blocks for an order: "rows" lets A's sliver set KC (rung 5's blocks),
    "columns" B's (rungs 2 to 4's)."""
    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
    return dict(zip(("mc", "kc", "nc"), (kernels(level).blocks_rows if order == "rows"
                                           else kernels(level).blocks_columns)))


def default_blocks(level: str | None = None) -> dict:
    """The blocks of the package's GEMM: those of :func:`default_order`."""
    return order_blocks(default_order(level), level)


def ladder_blocks(level: str | None = None) -> dict:
    """The blocks of rungs 2 to 4: B's sliver sets KC."""
    return order_blocks("columns", level)


def default_config(level: str | None = None) -> tuple[int, int, int, int]:
    """(order number, mc, kc, nc) that the C driver takes by default."""
    return kernels(level).config


def _blocks(blocks, level, rung5: bool = True) -> tuple[int, int, int]:
    """A rung's blocks: the model's (rung 5's, or rungs 2-4's), with ``blocks`` over them."""
    return _config(blocks, level, "rows" if rung5 else "columns")[1:]


def _config(blocks, level, order: str | None = None) -> tuple[int, int, int, int]:
    """(order number, mc, kc, nc): ``blocks`` ({"order", "mc", "kc", "nc"}, or a tuple of the
    three sizes) over the model's blocks for the order asked, or the default one."""
    if blocks is None and order is None:
        return kernels(level).config  # every plain call: the tuple made once in kernels()
    if isinstance(blocks, dict) and "order" in blocks:
        order = blocks["order"]
    order = order or default_order(level)
    b = order_blocks(order, level)
    if blocks is None:
        return (ORDERS.index(order), *b.values())
    if isinstance(blocks, dict):
        unknown = set(blocks) - {"mc", "kc", "nc", "order"}
        if unknown:
            raise ValueError(f"blocks: unknown keys {sorted(unknown)}; use mc, kc, nc, order")
        b.update((k, v) for k, v in blocks.items() if k != "order")
    else:
        b.update(zip(("mc", "kc", "nc"), blocks))
    return (ORDERS.index(order),
            *(checks.positive_int(b[k], f"blocks['{k}']") for k in ("mc", "kc", "nc")))


_work = threading.local()  # one packing buffer per Python thread: concurrent calls never share


def _workspace(ffi, lib, level, n, k, mc, kc, nc, nthreads):
    need = int(lib.gemm_work_floats(n, k, mc, kc, nc, nthreads))
    bufs = getattr(_work, "bufs", None)
    if bufs is None:
        bufs = _work.bufs = {}
    key = (level, id(ffi))  # a pointer belongs to the ffi that made it (the pool variant's own)
    found = bufs.get(key)
    if found is None or found[0].size < need:
        size = max(need, int(1.25 * found[0].size) if found is not None else 0)
        buf = np.empty(size, F32)
        found = bufs[key] = (buf, ffi.from_buffer("float[]", buf))
    return found[1]


def _ptr(ffi, x, ctype="float"):
    """A C pointer to ``x``'s first element; ``ctype`` is the element type."""
    if x.flags.c_contiguous:  # the fast way (half a microsecond); keeps x alive during the call
        return ffi.from_buffer(ctype + "[]", x)
    return ffi.cast(ctype + " *", x.ctypes.data)  # rows further apart than their width


def _overlap(x, y) -> bool:
    """True if x and y share an element. Slices of one buffer that only interleave
    (x[:, :k] and x[:, k:]) do not; a case too costly to decide counts as overlap."""
    if not np.may_share_memory(x, y):
        return False
    try:
        return bool(np.shares_memory(x, y, max_work=100_000))
    except Exception:  # numpy's TooHardError: max_work exceeded
        return True


def _scalar(v, name: str) -> float:
    if type(v) is float and math.isfinite(v):
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: expected a real number, got {type(v).__name__}")
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {v}")
    return v


def _out(out, name, shape):
    if out is None:
        return np.empty(shape, F32), shape[1]
    out, ldc = checks.matrix(out, name, F32, writable=True)
    if out.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {out.shape}")
    return out, ldc


# ---------------------------------------------------------------- the ladder

@dataclass(frozen=True)
class Rung(ladder.Rung):
    """A rung of chapter 2's ladder (:class:`smallem.ladder.Rung`): C = A B by one C function."""
    label: str = ""            # "2 cache blocking": the rung as tables and figures name it
    threaded: bool = False     # uses all cores
    blocked: bool = False      # takes mc/kc/nc; its C function is gemm_<name>_ex
    packed: bool = False       # takes a packing buffer
    slow: bool = False         # measured at one size only, few repeats

    def __call__(self, a, b, out=None, *, threads=None, blocks=None, level=None):
        """C = A B with this rung. Same signature for every rung."""
        return run_rung(self, a, b, out, threads=threads, blocks=blocks, level=level)


def _where(i: int, heading: str, name: str) -> ladder.Where:
    """Where chapter 2's rung ``i`` is: its section of gemm.c, of the page, the notebook's
    cell that runs every rung, the test of every rung against numpy."""
    return ladder.Where(kernel=f"kernels_c/gemm.c:{name}",
                        page=f"chapters/2-matmul.md:## Rung {i}: {heading}",
                        notebook="notebooks/02_matmul.py:for rung in gemm.LADDER:",
                        test=f"tests/test_gemm.py::test_rung_against_numpy[{name}]")


LADDER = ladder.Ladder("chapter 2's product", [
    Rung(0, "naive", "textbook loops; B walked down a column", label="0 naive (i,j,k)",
         slow=True, where=_where(0, "three loops", "naive")),
    Rung(1, "loop_order", "inner loop streams rows; vectorised", label="1 loop order (i,k,j)",
         slow=True, where=_where(1, "the order of the loops", "loop_order")),
    Rung(2, "blocked", "jc, pc, ic loops: NC, KC, MC blocks", label="2 cache blocking",
         blocked=True, slow=True, where=_where(2, "cache blocks", "blocked")),
    Rung(3, "registers", "MR x NR tile in registers over KC", label="3 micro-kernel",
         blocked=True, slow=True, where=_where(3, "the micro-kernel, in registers", "registers")),
    Rung(4, "packed", "A and B packed into panels; zero-padded edges", label="4 packing",
         blocked=True, packed=True, where=_where(4, "packing", "packed")),
    Rung(5, "threads", "all cores, tiles of C shared out in shrinking runs; tiles along C's rows",
         label="5 threads", threaded=True, blocked=True, packed=True,
         where=_where(5, "threads", "threads")),
])


def run_rung(rung: Rung, a, b, out=None, *, threads=None, blocks=None, level=None):
    a, lda = checks.matrix(a, "a", F32)
    b, ldb = checks.matrix(b, "b", F32)
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise ValueError(f"a and b: inner dimensions differ, {a.shape} @ {b.shape}")
    out, ldc = _out(out, "out", (M, N))
    nthreads = checks.threads(threads) if rung.threaded else 1
    if M == 0 or N == 0:
        return out
    if K == 0:
        out[...] = 0.0
        return out
    ffi, lib, *_ = kernels(level)
    args = [M, N, K, _ptr(ffi, a), lda, _ptr(ffi, b), ldb, _ptr(ffi, out), ldc, nthreads]
    if rung.blocked:  # gemm_<name>_ex: the blocks, and from rung 4 on the buffer, passed in
        mc, kc, nc = _blocks(blocks, level, rung5=rung.threaded)  # rung 5: A's sliver sets KC
        args += [mc, kc, nc]
        if rung.packed:
            args.append(_workspace(ffi, lib, level or isa.selected(), N, K, mc, kc, nc, nthreads))
    getattr(lib, f"gemm_{rung.name}_ex" if rung.blocked else f"gemm_{rung.name}")(*args)
    return out


# ---------------------------------------------------------------- the package's GEMM

def _gemm(kind, a, b, trans_a, trans_b, out, alpha, beta, threads, blocks, level, path=0,
          phases=None, epilogue=None):
    dtype = F32 if kind == "f32" else U16
    a, lda = checks.matrix(a, "a", dtype)
    b, ldb = checks.matrix(b, "b", dtype)
    alpha, beta = _scalar(alpha, "alpha"), _scalar(beta, "beta")
    M, K = a.shape[::-1] if trans_a else a.shape
    K2, N = b.shape[::-1] if trans_b else b.shape
    if K != K2:
        raise ValueError(f"a and b: inner dimensions differ: op(a) is {M}x{K}, op(b) is {K2}x{N} "
                         f"(trans_a={trans_a}, trans_b={trans_b})")
    if out is None and beta != 0.0:
        raise ValueError("beta != 0 needs out= (the C that beta scales)")
    if out is None:  # an array made here overlaps nothing: no check
        out, ldc = empty_aligned((M, N)), N
    else:
        out, ldc = _out(out, "out", (M, N))
        for x, name in ((a, "a"), (b, "b")):
            if _overlap(out, x):
                raise ValueError(f"out overlaps {name}: the result would overwrite its own input")
    nthreads = auto_threads(M, N, K) if threads is None else pool.team(threads).n
    if M == 0 or N == 0:
        return out
    if K == 0:  # an empty sum: C = beta C
        if beta == 0.0:
            out[...] = 0.0
        else:
            out *= np.float32(beta)
        return out
    level = level or isa.selected()
    ffi, lib, *_ = kernels(level, pool.on_pool(threads))
    order, mc, kc, nc = _config(blocks, level)
    amx = kind == "bf16" and BF16_PATHS[path] == "amx"
    if amx:  # its own blocks (blocks= over them) and epilogue
        got = dict(zip(("kc", "nc"), kernels(level, pool.on_pool(threads)).amx))
        if blocks is not None:
            given = blocks if isinstance(blocks, dict) else dict(zip(("mc", "kc", "nc"), blocks))
            got.update((k, checks.positive_int(given[k], f"blocks['{k}']"))
                       for k in ("kc", "nc") if k in given)
        kc, nc = got["kc"], got["nc"]
        if epilogue is None:
            epilogue = amx_epilogue(M, N, feeds(level)["reach_bytes"])
        if epilogue not in AMX_EPILOGUES:
            raise ValueError(f"epilogue: expected one of {AMX_EPILOGUES}, got {epilogue!r}")
    work = _workspace(ffi, lib, level, N, K, mc, kc, nc, nthreads)
    ctype = "float" if kind == "f32" else "uint16_t"
    args = (int(bool(trans_a)), int(bool(trans_b)), M, N, K, alpha, _ptr(ffi, a, ctype), lda,
            _ptr(ffi, b, ctype), ldb, beta, _ptr(ffi, out), ldc, nthreads, order, mc, kc, nc,
            work)
    if phases is not None:  # f32 only: a list that receives the C driver's rows
        rows = np.zeros((nthreads, len(PHASES)), np.float64)
        lib.gemm_f32_phases(*args, ffi.from_buffer("double[]", rows))
        phases.extend(r for r in rows.tolist() if any(r))  # threads the driver did not start: 0
    elif kind == "f32":
        lib.gemm_f32(*args)
    elif amx:
        if lib.gemm_bf16_amx(*args[:14], kc, nc, AMX_EPILOGUES.index(epilogue), work) != 0:
            raise RuntimeError("the AMX path: this build or the OS gives no AMX tiles")
    else:
        lib.gemm_bf16(path, *args)
    return out


THREAD_MIN_OPS = 1 << 21  # operations a thread must get before matmul adds it


def equal_slices(K: int, kc: int) -> int:
    """The slice of K a block of B holds: ``kc`` shortened so that K falls into equal slices
    (kernels_c/gemm.c's equal_slices, which the driver cuts K with; tests/test_gemm.py checks
    that the two agree). A cap of 585 at K = 4096 runs as 8 slices of 512."""
    slices = -(-K // kc)
    return -(-K // slices)


def auto_threads(M: int, N: int, K: int) -> int:
    """Every usable core, but at least THREAD_MIN_OPS (2 Mop) of work each: a parallel region
    and its barriers cost microseconds, 2 Mop tens of microseconds of one core (both
    measured by `smallem gemm`)."""
    return max(1, min(checks.threads(None), 2 * M * N * K // THREAD_MIN_OPS))


def matmul(a, b, *, trans_a=False, trans_b=False, out=None, alpha=1.0, beta=0.0,
           threads=None, blocks=None, level=None) -> np.ndarray:
    """``C = alpha op(a) op(b) + beta C`` in f32; ``op`` transposes when ``trans_*`` is set.

    ``a`` is M x K (K x M with ``trans_a``), ``b`` is K x N (N x K with ``trans_b``);
    both float32 with adjacent elements in each row (row slices are fine).
    ``out`` (M x N float32) receives the result; ``beta != 0`` needs it. ``threads``
    defaults to every usable core (fewer for tiny products, see :func:`auto_threads`);
    ``blocks`` ({"mc", "kc", "nc", "order"}) overrides the cache model's block sizes or
    the order of the tiles (see :func:`loop_order`), and ``level`` the ISA, for tests.
    """
    return _gemm("f32", a, b, trans_a, trans_b, out, alpha, beta, threads, blocks, level)


PHASES = ("pack B", "wait after packing B", "pack A", "tiles", "wait at the end")


def phase_times(a, b, *, trans_a=False, trans_b=False, out=None, threads=None, blocks=None,
                level=None) -> dict:
    """One :func:`matmul` (alpha 1, beta 0) timed by phase inside the C driver.

    Returns ``{"wall": s, "threads": [{phase: s, ...}, ...]}``: for each thread that ran,
    the seconds it spent packing B, waiting at the barrier after that, packing A, in its
    tiles, and waiting at the barrier that ends each block of B (the phases in
    :data:`PHASES`), and the call's wall time measured around it in Python.
    """
    rows = []
    t0 = time.perf_counter()
    _gemm("f32", a, b, trans_a, trans_b, out, 1.0, 0.0, threads, blocks, level, phases=rows)
    wall = time.perf_counter() - t0
    return {"wall": wall, "threads": [dict(zip(PHASES, r)) for r in rows]}


def empty_aligned(shape, dtype=F32) -> np.ndarray:
    """``np.empty(shape, dtype)`` starting on a 64-byte line (numpy's large arrays start
    16 bytes into one), so that rows of a width that is a multiple of 64 bytes start on
    lines too: the AMX path's streamed stores write whole aligned lines only, and a tile
    row that straddles two lines costs two loads."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    buf = np.empty(n + 64 // dtype.itemsize, dtype)
    skip = (-buf.ctypes.data % 64) // dtype.itemsize
    return buf[skip:skip + n].reshape(shape)


def matmul_bf16(a, b, *, trans_a=False, trans_b=False, out=None, alpha=1.0, beta=0.0,
                threads=None, blocks=None, level=None, path=None,
                epilogue=None) -> np.ndarray:
    """:func:`matmul` for bf16 inputs (``uint16`` arrays, see :func:`f32_to_bf16`), f32 out.

    Products are summed in f32, on one of three paths: ``"widen"`` (packing widens bf16
    to f32, the f32 micro-kernel runs), ``"native"`` (``vdpbf16ps`` on bf16 pairs, where
    the CPU has AVX512_BF16) or ``"amx"`` (AMX tiles, where the CPU has AMX_BF16 and the
    OS lets this process use them). ``path=None`` takes :func:`bf16_path`'s choice.

    The AMX path takes :func:`amx_blocks` (``blocks``' "kc" and "nc" over them) and writes
    C as ``epilogue`` says (one of :data:`AMX_EPILOGUES`; default :func:`amx_epilogue`'s
    choice); chapter 2's AMX ladder sets both. Other paths take no ``epilogue``.
    """
    level = level or isa.selected()
    path = bf16_path(level) if path is None else _check_path(path, level)
    if epilogue is not None and path != "amx":
        raise ValueError(f"epilogue: only the AMX path takes one (the path here: {path})")
    return _gemm("bf16", a, b, trans_a, trans_b, out, alpha, beta, threads, blocks, level,
                 path=BF16_PATHS.index(path), epilogue=epilogue)


def native_bf16(level: str | None = None) -> bool:
    """Whether the kernels built for ``level`` have the vdpbf16ps path."""
    return bool(kernels(level).lib.gemm_native_bf16())


def amx_bf16(level: str | None = None) -> bool:
    """Whether the kernels built for ``level`` have the AMX path and Linux granted the tiles."""
    return bool(kernels(level).lib.gemm_amx_bf16())


BF16_PATHS = ("widen", "native", "amx")  # the C side's path numbers: 0, 1, 2
BF16_ENV = "SMALLEM_BF16"


def bf16_paths(level: str | None = None) -> list[str]:
    """The bf16 paths the kernels of ``level`` can take on this machine."""
    return list(_bf16_paths(level or isa.selected()))


@functools.lru_cache(maxsize=None)
def _bf16_paths(level: str) -> tuple[str, ...]:  # fixed per build and process: asked once
    return tuple(p for p, ok in zip(BF16_PATHS, (True, native_bf16(level), amx_bf16(level)))
                 if ok)


def _check_path(path, level) -> str:
    if path not in BF16_PATHS:
        raise ValueError(f"path: expected one of {BF16_PATHS}, got {path!r}")
    if path not in _bf16_paths(level):
        need = "AVX512_BF16" if path == "native" else "AMX_BF16 and the OS's permission"
        raise ValueError(f"path={path!r} needs {need}, which the {level!r} kernels lack "
                         f"(this CPU: {isa.describe()['extensions'] or 'no extensions'})")
    return path


def bf16_path(level: str | None = None) -> str:
    """The bf16 path :func:`matmul_bf16` takes by default: ``$SMALLEM_BF16`` if set, else
    "amx" where the tiles are there, else "native" where the kernels have vdpbf16ps and it
    outruns the FMA, else "widen".

    One AMX instruction does 8192 multiply-adds. vdpbf16ps does two per f32 lane, an FMA
    one; but a CPU may issue it at a lower rate. The two probes of chapter 1 decide, on one
    core, measured once per machine (:func:`feeds`): "native" only if the bf16 probe's
    Gop/s beats the f32 probe's.
    """
    level = level or isa.selected()
    forced = os.environ.get(BF16_ENV)
    if forced:
        try:
            return _check_path(forced, level)
        except ValueError as e:
            raise ValueError(f"${BF16_ENV}={forced!r}: {e}") from None
    paths = _bf16_paths(level)
    if "native" in paths and "amx" not in paths and isa.emulating(level):
        return "native"  # SIMDe's timings mean nothing: test the native path
    return choose_bf16_path(paths, feeds(level) if paths == ("widen", "native") else None)


def choose_bf16_path(paths, rates: dict | None) -> str:
    """:func:`bf16_path`'s choice among the ``paths`` a machine's kernels have, given its
    :func:`feeds` (``rates``; read only where "native" must be weighed against "widen")."""
    if "amx" in paths:
        return "amx"
    if "native" not in paths:
        return "widen"
    return "native" if rates["bf16_gops_core"] > rates["f32_gops_core"] else "widen"


# ---------------------------------------------------------------- the thread pool

def pool_ids(threads: int | None = None, level: str | None = None) -> list[int]:
    """Kernel thread ids of the OpenMP team; the same on every call means a persistent pool."""
    n = checks.threads(threads)
    ffi, lib, *_ = kernels(level)
    ids = ffi.new("long long[]", n)
    got = lib.gemm_pool_ids(n, ids)
    return [int(ids[i]) for i in range(got)]


def amx_alone(kp: int, panels: int, reps: int = 1, threads: int = 1, level: str | None = None,
              seed: int = 0) -> tuple:
    """The AMX block with nothing around it (C: ``gemm_amx_alone``), ready to time: each of
    ``threads`` threads makes ``reps`` passes of 32 x 32 blocks of C over its own packed A
    panel (32 x ``kp`` bf16, ``kp`` a multiple of 32) and ``panels`` packed B panels that
    every thread shares (``kp`` x 32 each, in bf16 pairs): the tile loads and products of
    the AMX path without its packing or its C. Returns ``(run, gop, data)`` as
    :func:`kernel_alone` does; ``data["c"]`` (threads, panels, 32, 32) holds each thread's
    blocks after a call, ``data["a"]`` (threads, 32, kp) and ``data["b"]`` (panels, kp // 2,
    32, 2) the operands, so that a test can check the arithmetic."""
    kp = checks.positive_int(kp, "kp")
    if kp % AMX_KB:
        raise ValueError(f"kp: expected a multiple of {AMX_KB}, got {kp}")
    panels = checks.positive_int(panels, "panels")
    reps = checks.positive_int(reps, "reps")
    threads = checks.positive_int(threads, "threads", limit=4096)
    ffi, lib, *_ = kernels(level)
    rng = np.random.default_rng(seed)
    a, b = empty_aligned((threads, AMX_MR, kp), U16), empty_aligned((panels, kp // 2, AMX_MR, 2), U16)
    a[...] = f32_to_bf16(rng.standard_normal(a.shape, dtype=np.float32))  # on lines, as packed
    b[...] = f32_to_bf16(rng.standard_normal(b.shape, dtype=np.float32))
    c = np.zeros((threads, panels, AMX_MR, AMX_MR), np.float32)
    pa, pb, pc = _ptr(ffi, a, "uint16_t"), _ptr(ffi, b, "uint16_t"), _ptr(ffi, c)
    if lib.gemm_amx_alone(kp, panels, 1, threads, pa, pb, pc) != 0:
        raise RuntimeError("amx_alone: this build or the OS gives no AMX tiles")
    gop = 2.0 * AMX_MR * AMX_MR * kp * panels * reps * threads / 1e9
    return (lambda: lib.gemm_amx_alone(kp, panels, reps, threads, pa, pb, pc)), gop, \
        {"a": a, "b": b, "c": c}


def kernel_alone(kc: int, slivers: int, reps: int = 1, threads: int = 1, shared_b: bool = True,
                 level: str | None = None, seed: int = 0) -> tuple:
    """The micro-kernel with nothing around it (C: ``gemm_kernel_alone``), ready to time.

    Each of ``threads`` threads makes ``reps`` passes over ``slivers`` full tiles: its own
    packed A sliver (MR x kc) against packed B slivers (kc x NR each), one set that every
    thread reads (``shared_b``, as rung 5 shares its block of B) or a set per thread. The
    size of the B slivers decides which cache they come from. Returns ``(run, gop, data)``:
    ``run()`` makes one call, ``gop`` is its Gop, and ``data`` holds ``a`` (threads, kc, MR),
    ``b`` (sets, slivers, kc, NR) and ``c`` (threads, MR, slivers * NR), into which every
    call adds ``reps`` times thread t's tiles, so that a test can check the arithmetic.
    """
    kc = checks.positive_int(kc, "kc")
    slivers = checks.positive_int(slivers, "slivers")
    reps = checks.positive_int(reps, "reps")
    threads = checks.positive_int(threads, "threads", limit=4096)
    ffi, lib, mr, nr, *_ = kernels(level)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((threads, kc, mr), dtype=np.float32)
    b = rng.standard_normal((1 if shared_b else threads, slivers, kc, nr), dtype=np.float32)
    c = np.zeros((threads, mr, slivers * nr), np.float32)
    pa, pb, pc = _ptr(ffi, a), _ptr(ffi, b), _ptr(ffi, c)
    gop = 2.0 * mr * nr * kc * slivers * reps * threads / 1e9
    return (lambda: lib.gemm_kernel_alone(kc, slivers, reps, threads, int(bool(shared_b)),
                                          pa, pb, pc)), gop, {"a": a, "b": b, "c": c}

