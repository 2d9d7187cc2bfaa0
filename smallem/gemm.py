"""Chapter 2: the matrix product, from three loops to the machine's peak.

The C kernels are in ``kernels_c/gemm.c``, one function per rung of the ladder:

0. naive (i, j, k)                      3. a register-blocked micro-kernel
1. loop order (i, k, j)                 4. packing A and B into panels
2. cache blocking (jc, pc, ic loops)    5. threads (OpenMP, over the tiles of C)

:data:`LADDER` lists them, in order; the benchmark, the tests, the table and
the figures all read that one list. The block sizes come from the machine's
caches by the analytical model of Low et al. (2016), see :func:`block_sizes`.

The package's GEMM is the last rung, generalised:
:func:`matmul` computes ``C = alpha op(A) op(B) + beta C`` for f32 and
:func:`matmul_bf16` the same with bf16 inputs (stored as ``uint16``) and f32
output. Both take the transposes in packing, never by copying, and allocate
nothing per call but the result (none when ``out=`` is given): the packing
buffer is kept per Python thread and reused.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import build, checks, figures, isa, machine_info, records, reference
from .timing import Timing, measure, measure_interleaved

RECORD = "ch2.gemm"
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


def cache_geometry() -> dict:
    """Size, ways and line size of L1d, L2, L3 (sizes from machine_info.caches())."""
    sizes = machine_info.caches()
    defaults = {"L1d": (32 * 1024, 8), "L2": (512 * 1024, 8), "L3": (8 * 1024**2, 16)}
    out = {}
    for name, (size, ways) in defaults.items():
        out[name] = {"bytes": sizes.get(f"{name}_bytes") or size, "ways": ways, "line": 64,
                     "instances": sizes.get(f"{name}_instances", 1)}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")) if base.is_dir() else []:
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            ways = int((index / "ways_of_associativity").read_text())
            line = int((index / "coherency_line_size").read_text())
        except (OSError, ValueError):
            continue
        name = {"1": "L1d", "2": "L2", "3": "L3"}.get(level)
        if name and kind != "Instruction" and ways > 0 and line > 0:
            out[name].update(ways=ways, line=line)
    return out


def l2_ways_for_a(ways: int) -> int:
    """Ways of the L2 given to the packed block of A: half of them.

    Low et al. give A every way but one spare and one for a B sliver. But the L2 also
    holds everything the L1 holds (it is inclusive on the cores we measured), the B
    slivers on their way from L3 to L1, the lines of C each tile reads and writes, and
    what the hardware prefetchers bring in ahead of those streams; half leaves room for
    them. `smallem gemm` sweeps MC (table ch2_mc): on the 2-core Zen 3 this was written
    on, blocks from a quarter to three quarters of the L2 came within a few percent of
    each other, less than the noise between two runs.
    """
    return max(1, ways // 2)


def l1_ways_for_b(ways: int) -> int:
    """Ways of the L1 given to the B sliver in rungs 2 to 4: all but two.

    The B sliver (KC x NR) is the one thing the L1 must keep: every tile of a column
    reuses it. A's sliver (MR x KC) and C's tile are read once per tile, so they only
    stream through, and two ways are enough for lines in flight. Low et al. keep A's
    sliver resident too, which caps KC lower; a larger KC means fewer passes over C
    (K / KC of them, each reading and writing all of C).
    """
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
                elem: int = 4, rung5: bool = False) -> dict:
    """KC, MC, NC from the caches, after Low et al. (2016), section 4.

    - L1 keeps the KC x NR sliver of B in all its ways but two (see l1_ways_for_b);
      with ``rung5``, the MR x KC sliver of A in all its ways but one (l1_ways_for_a).
    - L2 holds the MC x KC block of A in half its ways (see l2_ways_for_a).
    - L3 holds the KC x NC block of B beside every thread's block of A, one way spare.
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
    return {"mc": int(mc), "kc": int(kc), "nc": int(nc)}


# ---------------------------------------------------------------- loading the kernels

_lock = threading.Lock()


def _load(level: str | None = None):
    """(ffi, lib, MR, NR, rung 5's blocks, rungs 2-4's blocks) for ``level`` (default: the
    selected ISA); each set of blocks is a tuple (mc, kc, nc).

    Loaded once per process and level: build.load checks the sources' timestamps
    on every call (half a millisecond), which a 64^3 product cannot afford.
    """
    level = level or isa.selected()
    found = _loaded.get(level)
    if found is None:
        with _lock:
            ffi, lib = build.load("gemm", level)
            mr, nr = ffi.new("int *"), ffi.new("int *")
            lib.gemm_micro_shape(mr, nr)
            sets = []
            for rung5 in (True, False):
                b = block_sizes(mr[0], nr[0], threads=checks.threads(None), rung5=rung5)
                lib.gemm_set_defaults(int(rung5), b["mc"], b["kc"], b["nc"])
                sets.append((b["mc"], b["kc"], b["nc"]))
            found = _loaded[level] = (ffi, lib, mr[0], nr[0], *sets)
    return found


_loaded: dict = {}


def kernel_shape(level: str | None = None) -> tuple[int, int]:
    """(MR, NR) as compiled into the kernel for ``level``."""
    return _load(level)[2:4]


def default_blocks(level: str | None = None) -> dict:
    """The blocks of the package's GEMM (rung 5): A's sliver sets KC."""
    return dict(zip(("mc", "kc", "nc"), _load(level)[4]))


def ladder_blocks(level: str | None = None) -> dict:
    """The blocks of rungs 2 to 4: B's sliver sets KC."""
    return dict(zip(("mc", "kc", "nc"), _load(level)[5]))


def _blocks(blocks, level, rung5: bool = True) -> tuple[int, int, int]:
    if blocks is None:
        return _load(level)[4 if rung5 else 5]
    b = default_blocks(level) if rung5 else ladder_blocks(level)
    if isinstance(blocks, dict):
        unknown = set(blocks) - {"mc", "kc", "nc"}
        if unknown:
            raise ValueError(f"blocks: unknown keys {sorted(unknown)}; use mc, kc, nc")
        b.update(blocks)
    else:
        b.update(zip(("mc", "kc", "nc"), blocks))
    return tuple(checks.positive_int(b[k], f"blocks['{k}']") for k in ("mc", "kc", "nc"))


_work = threading.local()  # one packing buffer per Python thread: concurrent calls never share


def _workspace(ffi, lib, level, n, k, mc, kc, nc, nthreads):
    need = int(lib.gemm_work_floats(n, k, mc, kc, nc, nthreads))
    bufs = getattr(_work, "bufs", None)
    if bufs is None:
        bufs = _work.bufs = {}
    found = bufs.get(level)
    if found is None or found[0].size < need:
        size = max(need, int(1.25 * found[0].size) if found is not None else 0)
        buf = np.empty(size, F32)
        found = bufs[level] = (buf, ffi.from_buffer("float[]", buf))
    return found[1]


# ---------------------------------------------------------------- argument checks

def _matrix(x, name: str, dtype, writable: bool = False) -> tuple[np.ndarray, int]:
    """A 2-D array of ``dtype`` whose rows are contiguous; returns it and its leading dimension.

    Rows may be further apart than their width (a slice ``big[:, :k]``: lda > k),
    but the elements of a row must be adjacent; anything else is an error, not a copy.
    """
    if (type(x) is np.ndarray and x.dtype is dtype and x.ndim == 2 and x.flags.c_contiguous
            and x.size and (not writable or x.flags.writeable) and max(x.shape) <= 2**31 - 1):
        return x, x.shape[1]  # the usual case, without the checks below
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    dtype = np.dtype(dtype)
    if x.dtype != dtype:
        hint = "f32_to_bf16" if dtype == U16 else f"{name}.astype(np.{dtype})"
        raise TypeError(f"{name}: expected dtype {dtype}, got {x.dtype} (convert with {hint})")
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got shape {x.shape}")
    if writable and not x.flags.writeable:
        raise ValueError(f"{name}: array is read-only but the kernel writes into it")
    rows, cols = x.shape
    es = x.itemsize
    if x.size == 0:  # nothing to read or write; the caller handles empty products
        return x, max(cols, 1)
    if cols > 1 and x.strides[1] != es:
        raise ValueError(f"{name}: the elements of a row are not adjacent (strides {x.strides}); "
                         f"pass np.ascontiguousarray({name}), or use trans_a/trans_b "
                         f"for a transpose")
    ld = x.strides[0] // es if rows > 1 else max(cols, 1)
    if rows > 1 and (x.strides[0] % es or ld < cols):
        raise ValueError(f"{name}: rows overlap or are misaligned (strides {x.strides}); "
                         f"pass np.ascontiguousarray({name})")
    if ld > 2**31 - 1 or rows > 2**31 - 1 or cols > 2**31 - 1:
        raise ValueError(f"{name}: shape {x.shape} too large for the C kernels' int sizes")
    return x, max(ld, 1)


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
    out, ldc = _matrix(out, name, F32, writable=True)
    if out.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {out.shape}")
    return out, ldc


# ---------------------------------------------------------------- the ladder

@dataclass(frozen=True)
class Rung:
    index: int
    name: str          # C function: gemm_<name>
    label: str
    what: str          # one line for tables
    threaded: bool     # uses all cores
    blocked: bool      # takes mc/kc/nc
    packed: bool       # takes a packing buffer
    slow: bool         # measured at one size only, few repeats

    def __call__(self, a, b, out=None, *, threads=None, blocks=None, level=None):
        """C = A B with this rung. Same signature for every rung."""
        return run_rung(self, a, b, out, threads=threads, blocks=blocks, level=level)


LADDER = [
    #    index, C name, label, what; threaded, blocked, packed, slow
    Rung(0, "naive", "0 naive (i,j,k)", "textbook loops; B walked down a column",
         False, False, False, True),
    Rung(1, "loop_order", "1 loop order (i,k,j)", "inner loop streams rows; vectorised",
         False, False, False, True),
    Rung(2, "blocked", "2 cache blocking", "jc, pc, ic loops: NC, KC, MC blocks",
         False, True, False, True),
    Rung(3, "registers", "3 micro-kernel", "MR x NR tile in registers over KC",
         False, True, False, True),
    Rung(4, "packed", "4 packing", "A and B packed into panels; zero-padded edges",
         False, True, True, False),
    Rung(5, "threads", "5 threads",
         "all cores, tiles of C shared out in shrinking runs; tiles along C's rows",
         True, True, True, False),
]


def run_rung(rung: Rung, a, b, out=None, *, threads=None, blocks=None, level=None):
    a, lda = _matrix(a, "a", F32)
    b, ldb = _matrix(b, "b", F32)
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
    ffi, lib, *_ = _load(level)
    args = [M, N, K, _ptr(ffi, a), lda, _ptr(ffi, b), ldb, _ptr(ffi, out), ldc, nthreads]
    fn = getattr(lib, f"gemm_{rung.name}")
    if rung.blocked:
        mc, kc, nc = _blocks(blocks, level, rung5=rung.threaded)  # rung 5: A's sliver sets KC
        args += [mc, kc, nc]
        fn = getattr(lib, f"gemm_{rung.name}_ex")
        if rung.packed:
            args.append(_workspace(ffi, lib, level or isa.selected(), N, K, mc, kc, nc, nthreads))
    fn(*args)
    return out


# ---------------------------------------------------------------- the package's GEMM

def _gemm(kind, a, b, trans_a, trans_b, out, alpha, beta, threads, blocks, level, path=0,
          phases=None):
    dtype = F32 if kind == "f32" else U16
    a, lda = _matrix(a, "a", dtype)
    b, ldb = _matrix(b, "b", dtype)
    alpha, beta = _scalar(alpha, "alpha"), _scalar(beta, "beta")
    M, K = a.shape[::-1] if trans_a else a.shape
    K2, N = b.shape[::-1] if trans_b else b.shape
    if K != K2:
        raise ValueError(f"a and b: inner dimensions differ: op(a) is {M}x{K}, op(b) is {K2}x{N} "
                         f"(trans_a={trans_a}, trans_b={trans_b})")
    if out is None and beta != 0.0:
        raise ValueError("beta != 0 needs out= (the C that beta scales)")
    if out is None:  # an array made here overlaps nothing: no check
        out, ldc = np.empty((M, N), F32), N
    else:
        out, ldc = _out(out, "out", (M, N))
        for x, name in ((a, "a"), (b, "b")):
            if _overlap(out, x):
                raise ValueError(f"out overlaps {name}: the result would overwrite its own input")
    nthreads = auto_threads(M, N, K) if threads is None else checks.threads(threads)
    if M == 0 or N == 0:
        return out
    if K == 0:  # an empty sum: C = beta C
        if beta == 0.0:
            out[...] = 0.0
        else:
            out *= np.float32(beta)
        return out
    level = level or isa.selected()
    ffi, lib, *_ = _load(level)
    mc, kc, nc = _blocks(blocks, level)
    work = _workspace(ffi, lib, level, N, K, mc, kc, nc, nthreads)
    ctype = "float" if kind == "f32" else "uint16_t"
    args = (int(bool(trans_a)), int(bool(trans_b)), M, N, K, alpha, _ptr(ffi, a, ctype), lda,
            _ptr(ffi, b, ctype), ldb, beta, _ptr(ffi, out), ldc, nthreads, mc, kc, nc, work)
    if phases is not None:  # f32 only: a list that receives the C driver's rows
        rows = np.zeros((nthreads, len(PHASES)), np.float64)
        lib.gemm_f32_phases(*args, ffi.from_buffer("double[]", rows))
        phases.extend(r for r in rows.tolist() if any(r))  # threads the driver did not start: 0
    elif kind == "f32":
        lib.gemm_f32(*args)
    else:
        lib.gemm_bf16(path, *args)
    return out


THREAD_MIN_OPS = 1 << 21  # operations a thread must get before matmul adds it


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
    ``blocks`` ({"mc", "kc", "nc"}) overrides the cache model's block sizes and ``level``
    the ISA, for tests.
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


def matmul_bf16(a, b, *, trans_a=False, trans_b=False, out=None, alpha=1.0, beta=0.0,
                threads=None, blocks=None, level=None, path=None) -> np.ndarray:
    """:func:`matmul` for bf16 inputs (``uint16`` arrays, see :func:`f32_to_bf16`), f32 out.

    Products are summed in f32, on one of three paths: ``"widen"`` (packing widens bf16
    to f32, the f32 micro-kernel runs), ``"native"`` (``vdpbf16ps`` on bf16 pairs, where
    the CPU has AVX512_BF16) or ``"amx"`` (AMX tiles, where the CPU has AMX_BF16 and the
    OS lets this process use them). ``path=None`` takes :func:`bf16_path`'s choice.
    """
    level = level or isa.selected()
    path = bf16_path(level) if path is None else _check_path(path, level)
    return _gemm("bf16", a, b, trans_a, trans_b, out, alpha, beta, threads, blocks, level,
                 path=BF16_PATHS.index(path))


def native_bf16(level: str | None = None) -> bool:
    """Whether the kernels built for ``level`` have the vdpbf16ps path."""
    return bool(_load(level)[1].gemm_native_bf16())


def amx_bf16(level: str | None = None) -> bool:
    """Whether the kernels built for ``level`` have the AMX path and Linux granted the tiles."""
    return bool(_load(level)[1].gemm_amx_bf16())


BF16_PATHS = ("widen", "native", "amx")  # the C side's path numbers: 0, 1, 2
BF16_ENV = "SMALLEM_BF16"
_bf16_choice: dict = {}


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
    one; but a CPU may issue it at a lower rate. The two probes of chapter 1 decide, once
    per process and level, on one core: "native" only if the bf16 probe's Gop/s beats the
    f32 probe's.
    """
    level = level or isa.selected()
    forced = os.environ.get(BF16_ENV)
    if forced:
        try:
            return _check_path(forced, level)
        except ValueError as e:
            raise ValueError(f"${BF16_ENV}={forced!r}: {e}") from None
    paths = _bf16_paths(level)
    if "amx" in paths:
        return "amx"
    if "native" not in paths:
        return "widen"
    if level not in _bf16_choice:
        if isa.emulating(level):  # SIMDe's timings mean nothing: test the native path
            _bf16_choice[level] = "native"
        else:
            rates = probe_rates(level)
            _bf16_choice[level] = "native" if rates["bf16"] > rates["f32"] else "widen"
    return _bf16_choice[level]


def probe_rates(level: str, iters: int = 400_000, repeats: int = 3) -> dict:
    """One core's Gop/s on chapter 1's f32 FMA and bf16 dot probes (the best of
    ``repeats`` short runs, about a millisecond each on a 3 GHz core)."""
    from . import machine

    rates = {}
    for kind in ("f32", "bf16"):
        run_once, gop = machine.peak_probe(kind, 1, iters=iters, level=level)
        rates[kind] = measure(run_once, repeats=repeats, warmup=0).rate(gop)["max"]
    return rates


def f32_to_bf16(x) -> np.ndarray:
    """Round float32 to bf16 (nearest, ties to even), returned as uint16 bits."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    if nan.any():  # keep NaN a NaN (rounding could carry it into infinity): quiet, same sign
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def bf16_to_f32(h) -> np.ndarray:
    """Widen bf16 bits (uint16) to float32: exact, a 16-bit shift."""
    h = np.asarray(h)
    if h.dtype != U16:
        raise TypeError(f"h: expected dtype uint16 (bf16 bits), got {h.dtype}")
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)


# ---------------------------------------------------------------- the thread pool

def pool_ids(threads: int | None = None, level: str | None = None) -> list[int]:
    """Kernel thread ids of the OpenMP team; the same on every call means a persistent pool."""
    n = checks.threads(threads)
    ffi, lib, *_ = _load(level)
    ids = ffi.new("long long[]", n)
    got = lib.gemm_pool_ids(n, ids)
    return [int(ids[i]) for i in range(got)]


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
    ffi, lib, mr, nr, *_ = _load(level)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((threads, kc, mr), dtype=np.float32)
    b = rng.standard_normal((1 if shared_b else threads, slivers, kc, nr), dtype=np.float32)
    c = np.zeros((threads, mr, slivers * nr), np.float32)
    pa, pb, pc = _ptr(ffi, a), _ptr(ffi, b), _ptr(ffi, c)
    gop = 2.0 * mr * nr * kc * slivers * reps * threads / 1e9
    return (lambda: lib.gemm_kernel_alone(kc, slivers, reps, threads, int(bool(shared_b)),
                                          pa, pb, pc)), gop, {"a": a, "b": b, "c": c}


# ---------------------------------------------------------------- measuring

def quick_mode() -> bool:
    return os.environ.get("SMALLEM_QUICK") == "1"


def gops(m, n, k, seconds):
    return 2.0 * m * n * k / seconds / 1e9


def _numpy_pinned(threads):
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=threads, user_api="blas")


def blas_info() -> list[dict]:
    from threadpoolctl import threadpool_info
    keep = ("user_api", "internal_api", "version", "num_threads", "architecture", "threading_layer")
    return [{k: d.get(k) for k in keep} for d in threadpool_info()]


def _measure_gops(fn, m, n, k, quick=False):
    """One slow function alone (the first rungs take seconds a call): two samples."""
    t = measure(fn, repeats=3 if quick else 2, warmup=1 if quick else 0)
    return {"value": t.rate(2.0 * m * n * k / 1e9), "seconds": t.stats()}


def _compare(fns: dict, m, n, k, quick=False, pause=None, work=None) -> dict:
    """Time ``fns`` in turn (timing.measure_interleaved): {key: {"value", "seconds"}}.

    Every ratio the chapter quotes (smallem against numpy, one block size against
    another) comes from one such call, so both sides saw the same machine. Between two
    libraries a pause lets the previous one's spinning threads go to sleep. A call does
    the m x n x k product's 2mnk operations, unless ``work`` gives a key its own Gop.
    """
    if pause is None:
        pause = 0.0 if quick else 0.25
    ts = measure_interleaved(fns, repeats=3 if quick else 15, warmup=1,
                             min_sample=0.005 if quick else 0.05, pause=pause,
                             max_time=1.0 if quick else 60.0)
    gemm_work = 2.0 * m * n * k / 1e9
    # Every sample is kept, in the order taken: sample i of each key is round i of the
    # comparison, so the record can say in how many rounds one side was ahead.
    return {key: {"value": t.rate((work or {}).get(key, gemm_work)),
                  "seconds": {**t.stats(), "samples": list(t.seconds)}}
            for key, t in ts.items()}


def _measure_whole_b(rec, lib, shapes, blocks, cores, quick, rng):
    """Rung 5 with all of B packed first against one K slice at a time, on the first of
    the model's products where all of B fits (`gemm_b_whole`). ``nc = N`` keeps the
    same single block of columns but takes the slice-by-slice path: the two differ in
    that alone. "whole_b" results, ``b`` = "whole" or "slices"."""
    for sh in shapes:
        M, K, N = sh["M"], sh["K"], sh["N"]
        if not sh["ta"] and not sh["tb"] and lib.gemm_b_whole(N, K, blocks["kc"], blocks["nc"]):
            break
    else:
        return  # none fits (a quick run's shapes have one K slice): nothing to compare
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.empty((M, N), np.float32)
    res = _compare({"whole": lambda: matmul(a, b, out=c, blocks=blocks),
                    "slices": lambda: matmul(a, b, out=c, blocks={**blocks, "nc": N})},
                   M, N, K, quick=quick, pause=0.0)
    for way, r in res.items():
        rec.add("whole_b", "Gop/s", r["value"], seconds=r["seconds"], b=way, label=sh["label"],
                M=M, N=N, K=K, kc=blocks["kc"], threads=cores)


def whole_b_values(rec: dict) -> dict:
    """The chapter's words on packing all of B at once, from the "whole_b" results."""
    f = figures.fmt
    found = {r["params"]["b"]: r for r in records.results(rec, "whole_b")}
    if set(found) != {"whole", "slices"}:
        na = "n/a (not measured in this record)"
        return {k: na for k in ("ch2.whole_b_label", "ch2.whole_b_mib", "ch2.whole_b_slices",
                                "ch2.whole_b_gops", "ch2.slices_gops", "ch2.whole_b_ratio",
                                "ch2.whole_b_rounds")}
    p, w, s = found["whole"]["params"], found["whole"]["value"], found["slices"]["value"]
    rounds = rounds_ahead(found["whole"], found["slices"])
    return {"ch2.whole_b_label": _short(p["label"]),
            "ch2.whole_b_mib": f"{p['K'] * p['N'] * 4 / 2**20:.0f} MiB",
            "ch2.whole_b_slices": str(math.ceil(p["K"] / p["kc"])),
            "ch2.whole_b_gops": f(w["median"], "Gop/s"),
            "ch2.slices_gops": f(s["median"], "Gop/s"),
            "ch2.whole_b_ratio": f"× {w['median'] / s['median']:.3f}",
            "ch2.whole_b_rounds": _rounds_text(rounds)}


def _measure_phases(rec, a, b, c, params, quick):
    """Where the final GEMM's time goes on one product: "phase" results in ms per call,
    each phase of :data:`PHASES` as the mean over the threads, and "wall" (the call)."""
    calls = [phase_times(a, b, trans_a=params["trans_a"], trans_b=params["trans_b"], out=c)
             for _ in range(2 if quick else 7)]
    per = {p: [1e3 * sum(t[p] for t in r["threads"]) / len(r["threads"]) for r in calls]
           for p in PHASES}
    per["wall"] = [1e3 * r["wall"] for r in calls]
    for phase, ms in per.items():
        rec.add("phase", "ms", Timing(ms).stats(), phase=phase,
                **{**params, "threads": len(calls[-1]["threads"])})


def alone_slivers(kc: int, nr: int, geometry: dict | None = None) -> dict:
    """How many B slivers (kc x NR floats each) :func:`_measure_alone` gives each case:
    half an L2, which stays there, and for L3 a quarter of it, but at least four L2s (so
    that it cannot stay in one) and at most half the L3."""
    g = geometry or cache_geometry()
    sliver = kc * nr * 4
    l2, l3 = g["L2"]["bytes"], g["L3"]["bytes"]
    return {"L2": max(1, l2 // 2 // sliver),
            "L3": max(2, min(l3 // 2, max(l3 // 4, 4 * l2)) // sliver)}


def _measure_alone(rec, level, cores, quick):
    """The micro-kernel alone (:func:`kernel_alone`, rung 5's KC) with its B slivers in L2
    and in L3, on one core and on all: on all cores, from L3, either one block every thread
    reads (rung 5's way) or a block per thread. Each thread count is timed in turn with
    chapter 1's FMA probe on as many threads: "alone" and "alone_probe" results."""
    from . import machine

    _, _, mr, nr, blocks, _ = _load(level)
    kc = blocks[1]
    slivers = alone_slivers(kc, nr)
    gop_per_thread = 0.05 if quick else 10.0  # a call of ~40 ms at 250 Gop/s a core
    for th in sorted({1, cores}):
        fns, work, cases = {}, {}, {}
        fns["probe"], work["probe"] = machine.peak_probe("f32", th)
        for where, shared in [("L2", True), ("L3", True)] + ([("L3", False)] if th > 1 else []):
            key = f"{where} {'shared' if shared else 'own'}"
            per_pass = 2.0 * mr * nr * kc * slivers[where] / 1e9
            reps = max(1, math.ceil(gop_per_thread / per_pass))
            fns[key], work[key], _ = kernel_alone(kc, slivers[where], reps, th, shared, level)
            cases[key] = dict(b_in=where, shared_b=shared, slivers=slivers[where], kc=kc,
                              b_kib=slivers[where] * kc * nr * 4 / 1024, reps=reps)
        res = _compare(fns, 1, 1, 1, quick=quick, pause=0.0, work=work)
        rec.add("alone_probe", "Gop/s", res["probe"]["value"], seconds=res["probe"]["seconds"],
                kind="f32", threads=th)
        for key, params in cases.items():
            rec.add("alone", "Gop/s", res[key]["value"], seconds=res[key]["seconds"], **params,
                    threads=th)


def _phase_calls(rec: dict) -> str:
    found = records.results(rec, "phase", phase="wall")
    return str(found[0]["value"]["n"]) if found else "n/a"


def phase_rows(rec: dict) -> tuple[list[list], dict]:
    """Table ch2_phases: each model product's time per call and its shares by phase."""
    rows, shares, a_shares = [], {}, {}
    for label, *_ in shape_pairs(rec):
        found = {r["params"]["phase"]: r for r in records.results(rec, "phase", label=label)}
        if set(found) != {*PHASES, "wall"}:
            continue
        p = found["wall"]["params"]
        ms = {k: r["value"]["median"] for k, r in found.items()}
        busy = sum(ms[k] for k in PHASES)
        pct = {k: 100 * ms[k] / busy for k in PHASES}
        wait = pct["wait after packing B"] + pct["wait at the end"]
        name, mib = _short(label), p["K"] * p["N"] * 4 / 2**20
        shares[name], a_shares[name] = (pct["pack B"], mib, p["M"]), (pct["pack A"], p["N"])
        rows.append([name, f"{p['M']}", figures.fmt(mib, "MiB"),
                     figures.fmt(ms["wall"], "ms"), f"{pct['pack B']:.1f} %",
                     f"{pct['pack A']:.1f} %", f"{pct['tiles']:.1f} %", f"{wait:.1f} %"])
    if not shares:
        na = "n/a (not measured in this record)"
        return rows, {k: na for k in ("ch2.phase_most", "ch2.phase_most_pct", "ch2.phase_most_m",
                                      "ch2.phase_most_mib", "ch2.phase_least",
                                      "ch2.phase_least_pct", "ch2.phase_least_m",
                                      "ch2.phase_least_mib", "ch2.phase_a_most",
                                      "ch2.phase_a_most_pct", "ch2.phase_a_most_n")}
    most = max(shares, key=lambda k: shares[k][0])
    least = min(shares, key=lambda k: shares[k][0])
    a_most = max(a_shares, key=lambda k: a_shares[k][0])
    values = {"ch2.phase_a_most": a_most, "ch2.phase_a_most_pct": f"{a_shares[a_most][0]:.1f} %",
              "ch2.phase_a_most_n": str(a_shares[a_most][1])}
    for key, name in (("most", most), ("least", least)):
        pct, mib, m = shares[name]
        values.update({f"ch2.phase_{key}": name, f"ch2.phase_{key}_pct": f"{pct:.1f} %",
                       f"ch2.phase_{key}_m": str(m), f"ch2.phase_{key}_mib": figures.fmt(mib, "MiB")})
    return rows, values


def _square(n, rng):
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    return a, b, np.empty((n, n), np.float32)


def model_shapes() -> list[dict]:
    """The GPT-2-small products of chapter 3 at 8 x 1024 tokens (d=768, 4d=3072)."""
    T, d, f = 8192, 768, 3072
    return [
        {"label": "x W1 (8192x768 · 768x3072)", "M": T, "K": d, "N": f, "ta": False, "tb": False},
        {"label": "h W2 (8192x3072 · 3072x768)", "M": T, "K": f, "N": d, "ta": False, "tb": False},
        {"label": "dY W1ᵀ (8192x3072 · (768x3072)ᵀ)", "M": T, "K": f, "N": d,
         "ta": False, "tb": True},
        {"label": "xᵀ dY (768x8192ᵀ · 8192x3072)", "M": d, "K": T, "N": f,
         "ta": True, "tb": False},
    ]


def _measure_dtypes(rec, sizes, cores, quick, rng, step=lambda what: None):
    """f32 against bf16 inputs on each bf16 path this build has, same shapes and threads,
    timed in turn: "dtype" results (``path`` is one of BF16_PATHS for bf16)."""
    paths = bf16_paths()
    for M, K, N in sizes:
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        c = np.empty((M, N), np.float32)
        ha, hb = f32_to_bf16(a), f32_to_bf16(b)
        fns = {"f32": lambda: matmul(a, b, out=c)}
        for p in paths:
            fns[p] = lambda p=p: matmul_bf16(ha, hb, out=c, path=p)
        res = _compare(fns, M, N, K, quick=quick, pause=0.0)
        for kind, r in res.items():
            extra = {"dtype": "f32"} if kind == "f32" else {"dtype": "bf16", "path": kind}
            rec.add("dtype", "Gop/s", r["value"], seconds=r["seconds"], **extra, M=M, N=N, K=K,
                    threads=cores)
        step(f"f32, bf16 {M}x{K}x{N}")


BF16_RECORD = "ch2.bf16"


def run_bf16(quick: bool | None = None) -> records.Record:
    """Only the f32-against-bf16 products of :func:`run`, plus 2048³, and chapter 1's f32
    and bf16 probes on every core beside them: about a minute.

    For a second machine whose CPU has AVX512_BF16 when the book's own has not (the GPU
    check runs it on its host); chapter 2 shows this record beside its own bf16 table.
    """
    from . import machine

    quick = quick_mode() if quick is None else quick
    cores = checks.threads(None)
    level = isa.selected()
    first = model_shapes()[0]
    sizes = ([(128, 128, 128), (first["M"] // 16, first["K"] // 16, first["N"] // 16)] if quick
             else [(1024, 1024, 1024), (2048, 2048, 2048), (first["M"], first["K"], first["N"])])
    rec = records.Record(BF16_RECORD, settings={
        "quick": quick, "threads": cores, "isa": level, "native_bf16": native_bf16(level),
        "amx_bf16": amx_bf16(level), "bf16_path": bf16_path(level),
        "blocks": default_blocks(level), "sizes": sizes})
    for kind in ("f32", "bf16"):
        m = machine.measure_peak(kind, cores, repeats=3 if quick else 5)
        rec.add("peak", "Gop/s", m["value"], seconds=m["seconds"], kind=kind, threads=cores)
    _measure_dtypes(rec, sizes, cores, quick, np.random.default_rng(0))
    return rec


def run(quick: bool | None = None, progress: bool = True) -> records.Record:
    """Measure the ladder, the sweep, the model shapes, bf16 and the pool; one record."""
    from tqdm import tqdm

    from . import machine

    quick = quick_mode() if quick is None else quick
    cores = checks.threads(None)
    level = isa.selected()
    ffi, lib, mr, nr, *_ = _load(level)
    blocks, ladder = default_blocks(level), ladder_blocks(level)
    n_ladder = 128 if quick else 1024
    sweep = [32, 64, 128, 256] if quick else [64, 128, 256, 512, 1024, 2048, 4096]
    shapes = model_shapes()
    if quick:  # the same products, every size divided by 16
        shapes = [dict(s, M=s["M"] // 16, K=s["K"] // 16, N=s["N"] // 16) for s in shapes]
    rec = records.Record(RECORD, settings={
        "quick": quick, "threads": cores, "isa": level, "mr": mr, "nr": nr,
        "blocks": blocks, "blocks_ladder": ladder,
        "cache_geometry": cache_geometry(), "n_ladder": n_ladder, "sweep": sweep,
        "blas": blas_info(), "native_bf16": native_bf16(level), "amx_bf16": amx_bf16(level),
        "bf16_path": bf16_path(level),
        "env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                               "OMP_NUM_THREADS", "SMALLEM_THREADS")}})
    rng = np.random.default_rng(0)
    steps = 4 + len(LADDER) + len(sweep) + len(shapes) + 1 + 1 + 2 + 1
    bar = tqdm(total=steps, disable=not progress, desc="smallem gemm")

    def step(what):
        bar.set_postfix_str(what)
        bar.update(1)

    peaks, warnings = machine.measure_peaks(sorted({1, cores}), kinds=("f32",),
                                            pause=0.2 if quick else 2.0)
    peak = peaks["f32", cores]
    rec.add("peak_f32", "Gop/s", peak["value"], seconds=peak["seconds"], threads=cores)
    for w in warnings:
        rec.warn(w)
    step("f32 peak")
    n = n_ladder
    a, b, c = _square(n, rng)
    for rung in LADDER:
        if rung.slow:
            r = _measure_gops(lambda: rung(a, b, c, threads=1), n, n, n, quick=quick)
            rec.add("rung", "Gop/s", r["value"], seconds=r["seconds"], rung=rung.index,
                    kernel=rung.name, M=n, N=n, K=n, threads=1)
            step(rung.name)
    for th in sorted({1, cores}):  # the fast rungs in turn with numpy at their thread count
        fns = {"numpy": lambda: np.matmul(a, b, out=c)}
        fast = [r for r in LADDER if not r.slow and (cores if r.threaded else 1) == th]
        for rung in fast:
            fns[rung.name] = lambda rung=rung: rung(a, b, c, threads=th)
        if th == 1 < cores:  # the final GEMM on one core: its kernel against OpenBLAS's alone
            fns["final"] = lambda: matmul(a, b, out=c, threads=1)
        with _numpy_pinned(th):
            res = _compare(fns, n, n, n, quick=quick)
            rec.data["settings"].setdefault("blas_pinned", blas_info())
        rec.add("numpy", "Gop/s", res["numpy"]["value"], seconds=res["numpy"]["seconds"],
                M=n, N=n, K=n, threads=th)
        if "final" in res:
            rec.add("final_one_core", "Gop/s", res["final"]["value"],
                    seconds=res["final"]["seconds"], M=n, N=n, K=n, threads=1)
        for rung in fast:
            r = res[rung.name]
            rec.add("rung", "Gop/s", r["value"], seconds=r["seconds"], rung=rung.index,
                    kernel=rung.name, M=n, N=n, K=n, threads=th)
            step(rung.name)
    step("numpy")
    # Each block-size sweep runs where its block matters. M_C: rung 4 on one core, whose
    # tiles go down the columns and so re-read the whole A block from L2 for each one
    # (rung 5 reads each A sliver for one row of tiles only).
    n_mc = 128 if quick else 2048
    a, b, c = _square(n_mc, rng)
    packed = next(r for r in LADDER if r.name == "packed")
    g2 = cache_geometry()["L2"]
    way2 = g2["bytes"] // g2["ways"]
    mcs = {}
    for ways in sorted({1, 2, g2["ways"] // 4, l2_ways_for_a(g2["ways"]), g2["ways"] - 2} - {0}):
        mcs[ways] = max(mr, ways * way2 // (ladder["kc"] * 4) // mr * mr)
    res = _compare({w: (lambda mc=mc: packed(a, b, c, blocks={"mc": mc}, threads=1))
                    for w, mc in mcs.items()}, n_mc, n_mc, n_mc, quick=quick, pause=0.0)
    for ways, mc in mcs.items():
        rec.add("mc_sweep", "Gop/s", res[ways]["value"], seconds=res[ways]["seconds"], mc=mc,
                kc=ladder["kc"], l2_ways=ways, n=n_mc, threads=1, rung=packed.name)
    step("MC sweep")
    # K_C: the final GEMM on all cores, with a C too large for the L3, so that every
    # K_C slice is a pass over C in DRAM; A's sliver, the one rung 5 keeps in L1, in
    # more or fewer of its ways.
    n_kc = 128 if quick else 4096
    a, b, c = _square(n_kc, rng)
    g1 = cache_geometry()["L1d"]
    way1 = g1["bytes"] // g1["ways"]
    kcs = {ways: ways * way1 // (mr * 4) for ways in range(max(1, g1["ways"] // 4), g1["ways"] + 1)}
    res = _compare({w: (lambda kc=kc: matmul(a, b, out=c, blocks={"kc": kc}))
                    for w, kc in kcs.items()}, n_kc, n_kc, n_kc, quick=quick, pause=0.0)
    for ways, kc in kcs.items():
        rec.add("kc_sweep", "Gop/s", res[ways]["value"], seconds=res[ways]["seconds"], kc=kc,
                l1_ways=ways, sliver="A", n=n_kc, threads=cores)
    step("KC sweep")
    del a, b, c
    beside = max(x for x in sweep if x <= 2048)
    for s in sweep:
        a, b, c = _square(s, rng)
        fns = {"smallem": lambda: matmul(a, b, out=c), "numpy": lambda: np.matmul(a, b, out=c)}
        work = {}
        if s == beside:  # the FMA probe between the samples: what the cores gave meanwhile
            fns["peak"], work["peak"] = machine.peak_probe("f32", cores)
        with _numpy_pinned(cores):
            res = _compare(fns, s, s, s, quick=quick, work=work)
        for impl in ("smallem", "numpy"):
            rec.add("sweep", "Gop/s", res[impl]["value"], seconds=res[impl]["seconds"],
                    impl=impl, n=s, threads=cores)
        if "peak" in res:
            rec.add("peak_beside", "Gop/s", res["peak"]["value"], seconds=res["peak"]["seconds"],
                    kind="f32", n=s, threads=cores)
        step(f"sweep {s}")
    # What a call costs before any arithmetic: a 1 x 1 product through each library.
    a, b, c = _square(1, rng)
    with _numpy_pinned(cores):
        ts = measure_interleaved({"smallem": lambda: matmul(a, b, out=c),
                                  "numpy": lambda: np.matmul(a, b, out=c)},
                                 repeats=3 if quick else 15, warmup=100,
                                 min_sample=0.005 if quick else 0.02)
    for impl, t in ts.items():
        secs = {k: v * 1e6 for k, v in t.stats().items() if k != "n"}
        rec.add("call", "µs", {**secs, "n": t.stats()["n"]}, impl=impl, M=1, N=1, K=1)
    del a, b, c
    for sh in shapes:
        M, K, N, ta, tb = sh["M"], sh["K"], sh["N"], sh["ta"], sh["tb"]
        a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
        c = np.empty((M, N), np.float32)
        opa, opb = (a.T if ta else a), (b.T if tb else b)
        with _numpy_pinned(cores):
            res = _compare({"smallem": lambda: matmul(a, b, trans_a=ta, trans_b=tb, out=c),
                            "numpy": lambda: np.matmul(opa, opb, out=c)}, M, N, K, quick=quick)
        params = dict(label=sh["label"], M=M, N=N, K=K, trans_a=ta, trans_b=tb, threads=cores)
        for impl, r in res.items():
            rec.add("shape", "Gop/s", r["value"], seconds=r["seconds"], impl=impl, **params)
        _measure_phases(rec, a, b, c, params, quick)
        step(sh["label"])
    del a, b, c
    _measure_whole_b(rec, lib, shapes, blocks, cores, quick, rng)
    step("all of B at once")
    _measure_alone(rec, level, cores, quick)
    step("the micro-kernel alone")
    first = shapes[0]
    _measure_dtypes(rec, [(n_ladder, n_ladder, n_ladder), (first["M"], first["K"], first["N"])],
                    cores, quick, rng, step)
    reps = 50 if quick else 2000
    for name, fn in (("empty_region", lambda: lib.gemm_empty_regions(reps, cores)),
                     ("spawn_join", lambda: lib.gemm_spawn_join(reps // 10, cores))):
        t = measure(fn, repeats=5, warmup=1)
        per = reps if name == "empty_region" else reps // 10
        secs = {k: v / per * 1e6 for k, v in t.stats().items() if k != "n"}
        rec.add("pool", "µs", {**secs, "n": t.stats()["n"]}, what=name, threads=cores)
    ids = [pool_ids(cores, level) for _ in range(3)]
    rec.data["settings"]["pool_ids"] = ids
    step("thread pool")
    bar.close()
    return rec


# ---------------------------------------------------------------- reading the record

def _peak(rec: dict, rec_dir) -> tuple[float, str]:
    """The f32 peak for '% of peak': chapter 1's probe, run again in this run, and chapter 1's
    record if present. A busy machine only ever lowers a peak, so the higher one is used."""
    here = records.value(rec, "peak_f32")
    try:
        from . import machine
        ch1 = records.load(machine.RECORD, rec_dir)
        cores = max(ch1["settings"]["threads"])
        recorded = machine.summary(ch1)["peak"][("f32", cores)]
    except (records.RecordError, KeyError, ImportError, ValueError):
        return here, "this run's probe"
    return (recorded, "chapter 1's record") if recorded >= here else (here, "this run's probe")


def blocking_verdict(gain: float) -> str:
    """What rung 2 (blocking alone, expected to change little) did, from its measured gain."""
    return "is slower here" if gain < 0.95 else "buys little" if gain <= 1.1 else "helps a little"


def _nc_note(nc: int, widest: int) -> str:
    if nc >= widest:
        return ("both more than any $N$ in this chapter, so $B$ is packed in one block per "
                "$K_C$ slice")
    return f"a $B$ wider than {nc} columns is packed in several blocks per $K_C$ slice"


def ladder_rows(rec: dict, rec_dir=None) -> tuple[list[list], dict]:
    f = figures.fmt
    s = rec["settings"]
    n = s["n_ladder"]
    cores = s["threads"]
    ladder = s.get("blocks_ladder", s["blocks"])  # records before 2026-11-30 had one set
    peak, peak_src = _peak(rec, rec_dir)
    numpy_all = records.value(rec, "numpy", threads=cores, M=n)
    numpy_one = records.value(rec, "numpy", threads=1, M=n)
    rows = [[f"numpy (OpenBLAS), {cores} threads", f(numpy_all, "Gop/s"),
             f"{100 * numpy_all / peak:.0f} %", "", "—"]]
    if cores != 1:
        rows.append([f"numpy (OpenBLAS), 1 thread", f(numpy_one, "Gop/s"),
                     f"{100 * numpy_one / peak:.0f} %", "", "—"])
    prev = None
    ref = {0: reference.CH2_GEMM_1024_NAIVE_GOPS,
           len(LADDER) - 1: reference.CH2_GEMM_1024_FINAL_GOPS}
    gains = {}
    for rung in LADDER:
        g = records.value(rec, "rung", rung=rung.index, M=n)
        gains[rung.index] = g / prev if prev else float("nan")
        th = cores if rung.threaded else 1
        rows.append([f"{rung.label}, {th} thread{'s' if th > 1 else ''}", f(g, "Gop/s"),
                     f"{100 * g / peak:.1f} %" if g / peak < 0.1 else f"{100 * g / peak:.0f} %",
                     f"× {f(g / prev)}" if prev else "",
                     f(ref[rung.index], "Gop/s") if rung.index in ref else "—"])
        prev = g
    rows.append([f"f32 FMA peak, {cores} cores ({peak_src})", f(peak, "Gop/s"), "100 %", "",
                 f(reference.CH1_F32_PEAK_GOPS, "Gop/s")])
    final = records.value(rec, "rung", rung=len(LADDER) - 1, M=n)
    naive = records.value(rec, "rung", rung=0, M=n)
    values = {
        "ch2.n": str(n),
        "ch2.threads": str(cores),
        "ch2.isa": s["isa"],
        "ch2.mr": str(s["mr"]), "ch2.nr": str(s["nr"]),
        "ch2.mc": str(ladder["mc"]), "ch2.kc": str(ladder["kc"]), "ch2.nc": str(ladder["nc"]),
        "ch2.kc5": str(s["blocks"]["kc"]), "ch2.nc5": str(s["blocks"]["nc"]),
        "ch2.nc_note": _nc_note(min(ladder["nc"], s["blocks"]["nc"]), max(s["sweep"])),
        "ch2.peak": f(peak, "Gop/s"),
        "ch2.peak_source": peak_src,
        "ch2.numpy_gops": f(numpy_all, "Gop/s"),
        "ch2.numpy_1t_gops": f(numpy_one, "Gop/s"),
        "ch2.final_gops": f(final, "Gop/s"),
        "ch2.final_pct_peak": f"{100 * final / peak:.0f} %",
        "ch2.final_vs_numpy": f"{100 * final / numpy_all:.0f} %",
        "ch2.naive_gops": f(naive, "Gop/s"),
        "ch2.climb": f(final / naive),
        "ch2.machine": figures.machine_line(rec),
        "ch2.samples": str(records.results(rec, "rung", rung=len(LADDER) - 1)[0]["value"]["n"]),
        "ch2.blas": _blas_line(rec),
    }
    for rung in LADDER:
        g = records.value(rec, "rung", rung=rung.index, M=n)
        values[f"ch2.rung{rung.index}_gops"] = f(g, "Gop/s")
        if rung.index:
            values[f"ch2.rung{rung.index}_gain"] = f(gains[rung.index])
    values["ch2.rung2_verdict"] = blocking_verdict(gains[2])
    g = s["cache_geometry"]
    mr, nr, b = s["mr"], s["nr"], ladder
    vec, regs = REGISTER_FILE[s["isa"]]
    values.update({
        "ch2.vec_floats": str(vec), "ch2.registers": str(regs),
        "ch2.accumulators": str(mr * nr // vec), "ch2.b_vectors": str(nr // vec),
        "ch2.regs_used": str(mr * nr // vec + nr // vec + 1),
        "ch2.latency_bound": str(vec * FMA_LATENCY * FMA_PIPES),
        "ch2.tile_floats": str(mr * nr),
        "ch2.l1_kib": f"{g['L1d']['bytes'] // 1024} KiB", "ch2.l1_ways": str(g["L1d"]["ways"]),
        "ch2.l2_kib": f"{g['L2']['bytes'] // 1024} KiB", "ch2.l2_ways": str(g["L2"]["ways"]),
        "ch2.l3_mib": f"{g['L3']['bytes'] / 1024**2:.0f} MiB", "ch2.l3_ways": str(g["L3"]["ways"]),
        "ch2.line": f"{g['L1d']['line']} B",
        "ch2.l1_ways_b": str(math.ceil(nr * b["kc"] * 4 / (g["L1d"]["bytes"] / g["L1d"]["ways"]))),
        "ch2.l1_ca_low": str(max(1, (g["L1d"]["ways"] - 1) * mr // (mr + nr))),
        "ch2.kc_low": str(max(1, (g["L1d"]["ways"] - 1) * mr // (mr + nr))
                          * g["L1d"]["bytes"] // g["L1d"]["ways"] // (mr * 4)),
        "ch2.l2_ways_a": str(l2_ways_for_a(g["L2"]["ways"])),
        "ch2.l1_sets": str(g["L1d"]["bytes"] // (g["L1d"]["ways"] * g["L1d"]["line"])),
        "ch2.l1_way_kib": f"{g['L1d']['bytes'] / g['L1d']['ways'] / 1024:.0f} KiB",
        "ch2.l2_way_kib": f"{g['L2']['bytes'] / g['L2']['ways'] / 1024:.0f} KiB",
        "ch2.a_sliver_kib": f"{mr * b['kc'] * 4 / 1024:.1f} KiB",
        "ch2.a_sliver5_kib": f"{mr * s['blocks']['kc'] * 4 / 1024:.1f} KiB",
        "ch2.l1_ways_a5": str(math.ceil(mr * s["blocks"]["kc"] * 4
                                        / (g["L1d"]["bytes"] / g["L1d"]["ways"]))),
        "ch2.b_sliver_kib": f"{nr * b['kc'] * 4 / 1024:.1f} KiB",
        "ch2.a_block_kib": f"{b['mc'] * b['kc'] * 4 / 1024:.0f} KiB",
        "ch2.b_block_kib": f"{b['kc'] * min(b['nc'], n) * 4 / 1024:.0f} KiB",
        "ch2.b_block_full_mib": f"{b['kc'] * b['nc'] * 4 / 1024**2:.1f} MiB",
        "ch2.quick_note": ("These numbers come from a quick run on tiny sizes; run `smallem gemm` "
                           "for the real ones." if s["quick"] else ""),
        "ref.ch2_final": f(reference.CH2_GEMM_1024_FINAL_GOPS, "Gop/s"),
    })
    packed = records.value(rec, "rung", rung=len(LADDER) - 2, M=n)
    values["ch2.packed_pct_core"] = f"{100 * packed / (peak / cores):.0f} %"
    values.update(_one_core_values(rec, n, final, numpy_all, numpy_one))
    return rows, values


def _one_core_values(rec: dict, n: int, final: float, numpy_all: float, numpy_one: float) -> dict:
    """The final GEMM on one core beside numpy on one core, and what threads add to each.
    Records before 2026-11-30 lack it; on a one-core machine rung 5's row is that comparison."""
    f = figures.fmt
    found = records.results(rec, "final_one_core", M=n)
    numpy_gain = f"numpy's by {f(numpy_all / numpy_one)}"
    if rec["settings"]["threads"] == 1:
        return {"ch2.one_core": "This process had one core: rung 5 ran on one thread, beside "
                                "numpy on one thread."}
    if found:
        one = found[0]["value"]["median"]
        rounds = rounds_ahead(found[0], records.results(rec, "numpy", threads=1, M=n)[0])
    else:
        return {"ch2.one_core": f"It was not timed on one core in this record; threads "
                                f"multiply {numpy_gain}."}
    return {"ch2.one_core": (f"On one core the same GEMM ran at {f(one, 'Gop/s')}, "
                             f"{100 * one / numpy_one:.1f} % of numpy's {f(numpy_one, 'Gop/s')}, "
                             f"ahead in {_rounds_text(rounds)} paired rounds: threads multiply "
                             f"its speed by {f(final / one)}, and {numpy_gain}.")}


def targets(rec: dict, rec_dir=None) -> list[str]:
    """The performance targets, checked on a record (benchmarks check speed, tests don't)."""
    peak, src = _peak(rec, rec_dir)
    out = []
    for n in (1024, 2048, 4096):
        found = records.results(rec, "sweep", impl="smallem", n=n)
        if not found:
            out.append(f"smallem >= numpy at {n}^3: not measured (quick run)")
            continue
        ours = found[0]["value"]["median"]
        theirs = records.value(rec, "sweep", impl="numpy", n=n)
        out.append(f"smallem >= numpy at {n}^3: {'met' if ours >= theirs else 'MISSED'} "
                   f"({ours:.1f} vs {theirs:.1f} Gop/s{_rounds_note(rec, 'sweep', n=n)})")
        if n == 2048:
            met = "met" if ours >= 0.85 * peak else "MISSED"
            out.append(f">= 85 % of the f32 peak at 2048^3: {met} "
                       f"({100 * ours / peak:.0f} % of {peak:.1f} Gop/s, {src})")
    pairs = shape_pairs(rec)  # the model's products, forward and backward
    if rec["settings"].get("quick") or not pairs:  # a quick run shrinks them 16 times
        why = "quick run" if pairs else "not in this record"
        out.append(f"smallem >= numpy on the model's shapes: not measured at their size ({why})")
        pairs = []
    for label, ours, theirs in pairs:
        out.append(f"smallem >= numpy on {label}: {'met' if ours >= theirs else 'MISSED'} "
                   f"({ours:.1f} vs {theirs:.1f} Gop/s{_rounds_note(rec, 'shape', label=label)})")
    return out + [bf16_target(rec)]


def _rounds_note(rec: dict, name: str, **params) -> str:
    """The medians decide a target; the rounds say how close the call was."""
    rounds = _pair_rounds(rec, name, **params)
    return "" if rounds is None else f"; ahead in {rounds[0]} of {rounds[1]} paired rounds"


BF16_TARGET = 1.7  # bf16 Gop/s over f32 Gop/s, where AVX512_BF16 exists


def bf16_target(rec: dict) -> str:
    """The bf16 target on a record's "dtype" results, with the probes' ratio if measured."""
    what = f"bf16 >= {BF16_TARGET}x f32 where AVX512_BF16 exists"
    if not rec["settings"].get("native_bf16"):
        return f"{what}: not applicable (no AVX512_BF16 here)"
    ratios = []
    for r in records.results(rec, "dtype", dtype="f32"):
        p = r["params"]
        bf16 = [g for q in BF16_PATHS if (g := _bf16_value(rec, q, p["M"], p["K"], p["N"]))]
        if bf16:  # a size timed in f32 only has nothing to compare
            ratios.append(max(bf16) / r["value"]["median"])
    if not ratios:
        return f"{what}: not measured"
    line = (f"{what}: {'met' if min(ratios) >= BF16_TARGET else 'MISSED'} "
            f"(the faster bf16 path: {min(ratios):.2f}x to {max(ratios):.2f}x f32)")
    peaks = [records.results(rec, "peak", kind=k) for k in ("f32", "bf16")]
    if all(peaks):
        ratio = peaks[1][0]["value"]["median"] / peaks[0][0]["value"]["median"]
        line += f"; the bf16 dot probe runs at {ratio:.2f}x the f32 FMA probe on this CPU"
    return line


def _blas_line(rec: dict) -> str:
    blas = [b for b in rec["settings"].get("blas_pinned", rec["settings"]["blas"])
            if b.get("user_api") == "blas"]
    if not blas:
        return "unknown BLAS"
    b = blas[0]
    return f"{b.get('internal_api')} {b.get('version')}, kernel {b.get('architecture')}"


def sweep_rows(rec: dict, rec_dir=None) -> tuple[list[list], dict]:
    f = figures.fmt
    rows, values = [], {}
    peak, _ = _peak(rec, rec_dir)
    for s in (1024, 2048, 4096):  # keys the chapter quotes exist even for a quick run
        values[f"ch2.sweep_{s}"] = values[f"ch2.sweep_numpy_{s}"] = "n/a (not measured)"
        values[f"ch2.sweep_ratio_{s}"] = values[f"ch2.sweep_pct_peak_{s}"] = "n/a"
    for s in rec["settings"]["sweep"]:
        ours = records.value(rec, "sweep", impl="smallem", n=s)
        theirs = records.value(rec, "sweep", impl="numpy", n=s)
        rows.append([f"{s}³", f(ours, "Gop/s"), f(theirs, "Gop/s"),
                     f"{100 * ours / theirs:.1f} %", _rounds_text(_pair_rounds(rec, "sweep", n=s))])
        values[f"ch2.sweep_{s}"] = f(ours, "Gop/s")
        values[f"ch2.sweep_numpy_{s}"] = f(theirs, "Gop/s")
        values[f"ch2.sweep_ratio_{s}"] = f"{100 * ours / theirs:.0f} %"
        values[f"ch2.sweep_pct_peak_{s}"] = f"{100 * ours / peak:.0f} %"
    sizes = rec["settings"]["sweep"]
    values["ch2.sweep_sizes"] = f"{sizes[0]} to {sizes[-1]}"
    wins = [s for s in sizes if records.value(rec, "sweep", impl="smallem", n=s)
            >= records.value(rec, "sweep", impl="numpy", n=s)]
    values["ch2.sweep_wins"] = _listing([f"{s}³" for s in wins], "none of the sizes")
    small = sizes[0]
    for impl, key in (("smallem", "ch2.call_us"), ("numpy", "ch2.numpy_call_us")):
        found = records.results(rec, "call", impl=impl)  # absent from records before 2026-11-29
        values[key] = f(found[0]["value"]["median"], "µs") if found else "n/a (not measured)"
    values["ch2.smallest"] = f"{small}³"
    # The FMA probe timed between one size's samples: the product's share of it separates
    # a slow product from cores the host gave less of at the time.
    beside = records.results(rec, "peak_beside")  # absent from records before 2026-11-29
    for key in ("ch2.beside_n", "ch2.beside_peak", "ch2.beside_pct", "ch2.beside_numpy_pct"):
        values[key] = "n/a (not measured)"
    if beside:
        s, probe = beside[0]["params"]["n"], beside[0]["value"]["median"]
        values["ch2.beside_n"] = f"{s}³"
        values["ch2.beside_peak"] = f(probe, "Gop/s")
        for impl, key in (("smallem", "ch2.beside_pct"), ("numpy", "ch2.beside_numpy_pct")):
            values[key] = f"{100 * records.value(rec, 'sweep', impl=impl, n=s) / probe:.0f} %"
    for impl, key in (("smallem", "ch2.smallest_us"), ("numpy", "ch2.numpy_smallest_us")):
        values[key] = f(1e6 * records.results(rec, "sweep", impl=impl, n=small)[0]
                        ["seconds"]["median"], "µs")
    return rows, values


def rounds_ahead(ours: dict, theirs: dict) -> tuple[int, int] | None:
    """In how many rounds of a paired comparison ``ours`` took less time than ``theirs``,
    and of how many: two results of one :func:`_compare` call. None for results recorded
    before the samples were kept (records before 2026-11-30)."""
    a, b = (r.get("seconds", {}).get("samples") for r in (ours, theirs))
    if not a or not b or len(a) != len(b):
        return None
    return sum(x < y for x, y in zip(a, b)), len(a)


def sign_test(ahead: int, n: int) -> float:
    """Two-sided sign test: how often n fair coin flips give a split at least as lopsided
    as ``ahead`` of ``n``. Rounds are paired, so the machine's drift cancels within a
    round; what is left is noise, which favours neither side."""
    worst = max(ahead, n - ahead)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(worst, n + 1)) / 2 ** n)


SIGN_LEVEL = 0.05  # a split a coin gives less often than once in 20: a real difference


def _lopsided(n: int) -> int:
    """The fewest rounds of n one side must be ahead in for the sign test to tell."""
    return next((k for k in range(n // 2, n + 1) if sign_test(k, n) < SIGN_LEVEL), n + 1)


def _rounds_text(rounds: tuple[int, int] | None) -> str:
    return "n/a (not kept)" if rounds is None else f"{rounds[0]} of {rounds[1]}"


def _pair_rounds(rec: dict, name: str, **params) -> tuple[int, int] | None:
    ours = records.results(rec, name, impl="smallem", **params)
    theirs = records.results(rec, name, impl="numpy", **params)
    return rounds_ahead(ours[0], theirs[0]) if ours and theirs else None


ROUNDS_HEADER = "rounds smallem ahead"


def shape_pairs(rec: dict) -> list[tuple[str, float, float]]:
    """(label, smallem's Gop/s, numpy's) for each of the model's products in a record."""
    labels = dict.fromkeys(r["params"]["label"] for r in records.results(rec, "shape"))
    return [(label, records.value(rec, "shape", impl="smallem", label=label),
             records.value(rec, "shape", impl="numpy", label=label)) for label in labels]


def shape_rows(rec: dict) -> tuple[list[list], dict]:
    f = figures.fmt
    rows, values = [], {}
    for i, (label, ours, theirs) in enumerate(shape_pairs(rec)):
        p = records.results(rec, "shape", impl="smallem", label=label)[0]["params"]
        rows.append([label, f"{p['M']}×{p['K']}×{p['N']}", f(ours, "Gop/s"), f(theirs, "Gop/s"),
                     f"{100 * ours / theirs:.1f} %",  # a decimal: 99.6 % is not 100 %
                     _rounds_text(_pair_rounds(rec, "shape", label=label))])
        values[f"ch2.shape{i}_gops"] = f(ours, "Gop/s")
        values[f"ch2.shape{i}_ratio"] = f"{100 * ours / theirs:.0f} %"
    values.update(_shape_verdicts(rec))
    return rows, values


def _short(label: str) -> str:
    """A model product's name without its shapes: "x W1 (8192x768 · 768x3072)" -> "x W1"."""
    return label.split(" (")[0]


def _listing(items: list[str], empty: str) -> str:
    """"a", "a and b", "a, b and c" for prose; ``empty`` for none."""
    if len(items) < 2:
        return items[0] if items else empty
    return ", ".join(items[:-1]) + " and " + items[-1]


def _shape_verdicts(rec: dict) -> dict:
    """Which of the model's products the sign test calls faster, slower, or a tie."""
    groups = {"faster": [], "slower": [], "tied": []}
    n = None
    for label, ours, theirs in shape_pairs(rec):
        rounds = _pair_rounds(rec, "shape", label=label)
        if rounds is None:
            return {f"ch2.shapes_{k}": "n/a (a record without samples)" for k in
                    (*groups, "lopsided")}
        ahead, n = rounds
        short = _short(label)
        if sign_test(ahead, n) >= SIGN_LEVEL:
            groups["tied"].append(short)
        else:
            groups["faster" if ahead > n - ahead else "slower"].append(short)
    out = {f"ch2.shapes_{k}": _listing(v, "none") for k, v in groups.items()}
    k = _lopsided(n) if n else None
    out["ch2.shapes_lopsided"] = ("n/a" if not n else f"{k} of {n}" if k <= n else
                                  f"no count of {n} (too few rounds to tell)")
    return out


def _bf16_value(rec: dict, path: str, M, K, N) -> float | None:
    for r in records.results(rec, "dtype", dtype="bf16", M=M, K=K, N=N):
        # records made before the two paths have one bf16 result, on the path the build had
        got = r["params"].get("path", "native" if rec["settings"]["native_bf16"] else "widen")
        if got == path:
            return r["value"]["median"]
    return None


BF16_PATH_TEXT = {"widen": "bf16 widened to f32 in packing, the FMA micro-kernel",
                  "native": "vdpbf16ps on bf16 pairs", "amx": "AMX tiles (tdpbf16ps)"}


def _missing(rec: dict, path: str) -> str:
    """What a table says for a path a record has no result for."""
    have = rec["settings"].get({"native": "native_bf16", "amx": "amx_bf16"}[path])
    if path == "amx" and not rec["settings"]["native_bf16"]:
        have = False  # every CPU with AMX_BF16 has AVX512_BF16
    if have is False:
        return "no AVX512_BF16" if path == "native" else "no AMX"
    return "not measured"  # records from before the path existed


def dtype_rows(rec: dict, prefix: str = "ch2.bf16") -> tuple[list[list], dict]:
    f = figures.fmt
    rows, values = [], {}
    sizes = list(dict.fromkeys((r["params"]["M"], r["params"]["K"], r["params"]["N"])
                               for r in records.results(rec, "dtype")))
    chosen = rec["settings"].get("bf16_path",
                                 "native" if rec["settings"]["native_bf16"] else "widen")
    for i, (M, K, N) in enumerate(sizes):
        g32 = records.value(rec, "dtype", dtype="f32", M=M, K=K, N=N)
        g16 = {p: _bf16_value(rec, p, M, K, N) for p in BF16_PATHS}
        cells = [f(g16[p], "Gop/s") if g16[p] is not None else _missing(rec, p)
                 for p in BF16_PATHS]
        best = g16[chosen]
        rows.append([f"{M}×{K}×{N}", f(g32, "Gop/s"), *cells, f"{100 * best / g32:.0f} %"])
        values[f"{prefix}_{i}_gops"] = f(best, "Gop/s")
        values[f"{prefix}_{i}_ratio"] = f"{100 * best / g32:.0f} %"
    has = [x for x, key in (("AVX512_BF16", "native_bf16"), ("AMX", "amx_bf16"))
           if rec["settings"].get(key)]
    values[f"{prefix}_path"] = ((" and ".join(has) if has else "no AVX512_BF16")
                                + f"; matmul_bf16 takes the {chosen} path: "
                                + BF16_PATH_TEXT[chosen])
    peaks = {k: records.results(rec, "peak", kind=k) for k in ("f32", "bf16")}
    if all(peaks.values()):
        p32, p16 = (peaks[k][0]["value"]["median"] for k in ("f32", "bf16"))
        values[f"{prefix}_peaks"] = (
            f"the f32 FMA probe gave {f(p32, 'Gop/s')} and the bf16 dot probe "
            f"{f(p16, 'Gop/s')} on the same cores, a ratio of {p16 / p32:.2f}")
    return rows, values


DTYPE_HEADER = ["M×K×N", "f32 inputs", "bf16, widened", "bf16, vdpbf16ps", "bf16, AMX",
                "bf16 (path taken) / f32"]


def _print_dtype_rows(rows):
    for r in rows:
        print(f"  {r[0]:<18} f32 {r[1]:>12}  bf16 widened {r[2]:>12}  vdpbf16ps {r[3]:>14}"
              f"  AMX {r[4]:>12}  ({r[5]})")


def bf16_elsewhere(rec_dir) -> dict:
    """Table ch2_bf16_native and its sentence, from the second machine's record if any."""
    if not records.exists(BF16_RECORD, rec_dir):
        figures.write_table("ch2_bf16_native", [["not measured yet"] + [""] * 5],
                            DTYPE_HEADER)
        return {"ch2.bf16_native_line": (
            f"No record `{BF16_RECORD}` from a CPU with AVX512_BF16 is committed yet: "
            "`smallem gemm-bf16` on one writes it, and the GPU check "
            "(`kernels_cuda/gpu_check.sh`) runs it on its host when that CPU has AVX512_BF16.")}
    rec = records.load(BF16_RECORD, rec_dir)
    rows, values = dtype_rows(rec, prefix="ch2.bf16_native")
    figures.write_table("ch2_bf16_native", rows, DTYPE_HEADER,
                        note=f"Machine: {figures.machine_line(rec)}; "
                             f"bf16 path: {values['ch2.bf16_native_path']}.")
    peaks = values.get("ch2.bf16_native_peaks")
    values["ch2.bf16_native_line"] = (
        f"The same comparison on a second machine, from its record `{BF16_RECORD}` "
        f"({figures.machine_line(rec)}, {rec['settings']['threads']} threads; "
        f"{values['ch2.bf16_native_path']}"
        + (f"; {peaks}" if peaks else "") + "):")
    return values


def pool_values(rec: dict, rec_dir=None) -> dict:
    f = figures.fmt
    peak, _ = _peak(rec, rec_dir)
    empty = records.value(rec, "pool", what="empty_region")
    spawn = records.value(rec, "pool", what="spawn_join")
    ids = rec["settings"]["pool_ids"]
    same = all(i == ids[0] for i in ids)
    return {"ch2.pool_region_us": f(empty, "µs"), "ch2.pool_spawn_us": f(spawn, "µs"),
            "ch2.pool_ratio": f(spawn / empty),
            "ch2.pool_persistent": ("the same on every call, so the pool persists" if same
                                    else "not the same on every call: no persistent pool"),
            "ch2.pool_calls": str(len(ids)),
            "ch2.thread_min_mop": f"{THREAD_MIN_OPS / 1e6:.1f} million",
            # at one core's share of the peak every "% of peak" divides by
            "ch2.thread_min_us": f(THREAD_MIN_OPS / (peak * 1e9 / rec["settings"]["threads"])
                                   * 1e6, "µs")}


def ladder_figure(rec: dict, peak: float, name: str = "ch2_ladder"):
    import matplotlib.pyplot as plt

    n = rec["settings"]["n_ladder"]
    cores = rec["settings"]["threads"]
    labels = [r.label for r in LADDER]
    vals = [records.value(rec, "rung", rung=r.index, M=n) for r in LADDER]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    bars = ax.barh(labels[::-1], vals[::-1], color="#457b9d")
    for bar_, v in zip(bars, vals[::-1]):
        ax.text(v * 1.08, bar_.get_y() + bar_.get_height() / 2, figures.fmt(v, "Gop/s"),
                va="center", fontsize=8)
    ax.axvline(peak, color="black", lw=1.2, label=f"f32 peak, {cores} cores")
    ax.axvline(records.value(rec, "numpy", threads=cores, M=n), color="#e76f51", ls="--", lw=1.2,
               label=f"numpy, {cores} threads")
    ax.set_xscale("log")
    ax.set_xlim(min(vals) / 2, peak * 3)
    ax.set_xlabel(f"Gop/s, {n}³ f32 product (log scale)")
    ax.set_title(f"The ladder: {rec['machine']['cpu']}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="x", which="both", alpha=0.25)
    return figures.save(fig, name)


def sweep_figure(rec: dict, peak: float, name: str = "ch2_sweep"):
    import matplotlib.pyplot as plt

    sizes = rec["settings"]["sweep"]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for impl, style in (("smallem", "o-"), ("numpy", "s--")):
        ax.plot(sizes, [records.value(rec, "sweep", impl=impl, n=s) for s in sizes], style,
                label="smallem.matmul" if impl == "smallem" else "numpy (OpenBLAS)")
    ax.axhline(peak, color="black", lw=1, label="f32 peak")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (n×n times n×n, f32)")
    ax.set_ylabel("Gop/s")
    top = max([peak] + [r["value"]["median"] for r in records.results(rec, "sweep")])
    ax.set_ylim(0, top * 1.1)
    ax.set_title(f"Size sweep, {rec['settings']['threads']} threads", fontsize=10)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=8)
    return figures.save(fig, name)


def roofline_points(rec: dict) -> list[tuple[str, float, float]]:
    """Each rung at its intensity against the cache level that feeds its innermost loop.

    - rung 0: each multiply-add (2 operations) misses L1 for a new 64-byte line of B (L2);
    - rungs 1, 2: each multiply-add reads 4 bytes of B that come from L3 (B exceeds L2);
    - rungs 3 to 5: each step of the micro-kernel does 2 MR NR operations and reads an MR
      sliver of A (4 MR bytes) from L2; B's sliver stays in L1: NR / 2 operations per byte.
    """
    n = rec["settings"]["n_ladder"]
    nr = rec["settings"]["nr"]
    where = {0: (2 / 64, "B lines from L2"), 1: (2 / 4, "B from L3"), 2: (2 / 4, "B from L3"),
             3: (nr / 2, "A from L2"), 4: (nr / 2, "A from L2"), 5: (nr / 2, "A from L2")}
    # rungs that share an intensity get their labels on alternate lines (a trailing newline
    # lifts the text by one line), so that close points stay readable
    return [(f"{r.index} {r.name.replace('_', ' ')} ({where[r.index][1]})"
             + ("\n" if r.index in (2, 4) else ""), where[r.index][0],
             records.value(rec, "rung", rung=r.index, M=n)) for r in LADDER]


def dram_intensity(n: int) -> float:
    """Operations per byte of an n^3 product if each matrix crosses DRAM once: n / 6."""
    return 2.0 * n**3 / (3 * n * n * 4)


def roofline(rec: dict, rec_dir, name: str = "ch2_roofline"):
    """Chapter 1's roofline with the rungs on it, or a small stand-in if chapter 1 has no record."""
    from . import machine

    points = roofline_points(rec)
    try:
        ch1 = records.load(machine.RECORD, rec_dir)
    except records.RecordError:
        ch1 = None
    if ch1 is not None and hasattr(machine, "roofline_figure"):
        return machine.roofline_figure(points, name, ch1)
    import matplotlib.pyplot as plt  # stand-in: the peak only, no bandwidth slopes

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    peak, src = _peak(rec, rec_dir)
    ax.axhline(peak, color="black", label=f"f32 peak ({src})")
    for label, x, y in points:
        ax.plot([x], [y], "o")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operations per byte")
    ax.set_ylabel("Gop/s")
    ax.legend(fontsize=8)
    return figures.save(fig, name)


def chapter1_links(rec: dict, rec_dir) -> dict:
    """Bounds that chapter 1's measurements put on the rungs (n/a without its record)."""
    from . import machine

    f = figures.fmt
    try:
        sm = machine.summary(records.load(machine.RECORD, rec_dir))
    except (records.RecordError, KeyError, ValueError):
        return {"ch2.l3_core_bw": "n/a", "ch2.rung1_l3_bound": "n/a", "ch2.l1_core_bw": "n/a"}
    l3 = sm["triad_plateaus"][1]["L3"]
    # rung 1 reads one 4-byte float of B from L3 per multiply-add (2 operations)
    return {"ch2.l3_core_bw": f(l3, "GB/s"), "ch2.rung1_l3_bound": f(l3 * 2 / 4, "Gop/s"),
            "ch2.l1_core_bw": f(sm["triad_plateaus"][1]["L1"], "GB/s")}


RUNG_SECTIONS = ["naive", "loop_order", "blocked", "registers", "packed"]


def snippet(name: str, path: Path | None = None) -> list[str]:
    """The lines between ``--8<-- [start:name]`` and ``[end:name]`` in kernels_c/gemm.c."""
    path = path or build.KERNELS_DIR / "gemm.c"
    lines = path.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if f"[start:{name}]" in l)
    end = next(i for i, l in enumerate(lines) if f"[end:{name}]" in l)
    return lines[start + 1:end]


def write_rung_diffs() -> list[Path]:
    """figures/tables/ch2_diff_<a>_<b>.md: what each rung changes, from the real source."""
    import difflib

    out = []
    for old, new in zip(RUNG_SECTIONS, RUNG_SECTIONS[1:]):
        diff = difflib.unified_diff(snippet(old), snippet(new), f"gemm.c: {old}", f"gemm.c: {new}",
                                    n=2, lineterm="")
        path = figures.tables_dir() / f"ch2_diff_{old}_{new}.md"
        path.write_text("```diff\n" + "\n".join(diff) + "\n```\n")
        out.append(path)
    return out


def _sweep_summary(pts: list[dict], param: str, chosen: int, symbol: str) -> str:
    """One sentence on a block-size sweep: where the model's choice landed, from the record."""
    by = {p["params"][param]: p["value"]["median"] for p in pts}
    if chosen not in by:
        return "the model's value is not in this record (run `smallem gemm`)."
    best = max(by, key=by.get)
    fmt = figures.fmt
    if best == chosen:
        out = f"the model's {symbol} = {chosen} was the fastest ({fmt(by[best], 'Gop/s')})"
    else:
        gap = 100 * (1 - by[chosen] / by[best])
        out = (f"the fastest was {symbol} = {best} ({fmt(by[best], 'Gop/s')}), and the model's "
               f"{symbol} = {chosen} came "
               + (f"{gap:.0f} % below it" if gap >= 0.5 else "within 0.5 % of it"))
    slowest = min(by, key=by.get)
    if by[slowest] >= 0.95 * by[best]:
        return out + ("; all of them lie within 5 % of the fastest, about the noise between "
                      "two runs on this machine.")
    return out + (f"; the slowest, {symbol} = {slowest}, was "
                  f"{100 * (1 - by[slowest] / by[best]):.0f} % below the fastest.")


def mc_rows(rec: dict) -> tuple[list[list], dict]:
    """The MC sweep: rung 4, the model's KC, A's block in more or fewer L2 ways."""
    pts = records.results(rec, "mc_sweep")
    chosen = rec["settings"].get("blocks_ladder", rec["settings"]["blocks"])["mc"]
    rows = [[f"{p['params']['l2_ways']}" + (" (model)" if p["params"]["mc"] == chosen else ""),
             f"{p['params']['mc']} × {p['params']['kc']}",
             f"{p['params']['mc'] * p['params']['kc'] * 4 / 1024:.0f} KiB",
             figures.fmt(p["value"]["median"], "Gop/s")] for p in pts]
    th = pts[0]["params"]["threads"] if pts else 0
    rung = [r.index for r in LADDER if pts and r.name == pts[0]["params"].get("rung")]
    values = {"ch2.mc_n": str(pts[0]["params"]["n"]) if pts else "n/a",
              "ch2.mc_threads": f"{th} thread{'s' if th != 1 else ''}",
              "ch2.mc_rung": str(rung[0]) if rung else str(LADDER[-1].index),  # older records
              "ch2.mc_summary": _sweep_summary(pts, "mc", chosen, "$M_C$")}
    return rows, values


def kc_rows(rec: dict) -> tuple[list[list], dict]:
    """The KC sweep: the final GEMM on all cores, a sliver (A's since 2026-11-30, B's
    before) in more or fewer L1 ways."""
    pts = records.results(rec, "kc_sweep")
    chosen = rec["settings"]["blocks"]["kc"]
    sliver = pts[0]["params"].get("sliver", "B") if pts else "A"
    width = rec["settings"]["mr" if sliver == "A" else "nr"]  # floats per k
    rows = [[f"{p['params']['l1_ways']}" + (" (model)" if p["params"]["kc"] == chosen else ""),
             f"{p['params']['kc']}",
             f"{p['params']['kc'] * width * 4 / 1024:.0f} KiB",
             f"{math.ceil(p['params']['n'] / p['params']['kc'])}",
             figures.fmt(p["value"]["median"], "Gop/s")] for p in pts]
    values = {"ch2.kc_n": str(pts[0]["params"]["n"]) if pts else "n/a",
              "ch2.kc_sliver": sliver,
              "ch2.kc_c_mib": f"{pts[0]['params']['n'] ** 2 * 4 / 1024**2:.0f} MiB" if pts else "n/a",
              "ch2.kc_summary": _sweep_summary(pts, "kc", chosen, "$K_C$")}
    return rows, values


def _versus(r: dict, base: dict) -> str:
    """Result r against result base (two rates timed in turn) as prose: "2.1 % slower (in
    14 of 15 rounds)", with "too few to tell" where the sign test cannot tell them apart.
    Each round's rates come from its samples: the work per call is median rate x median
    seconds, as the two may do different work."""
    d = 100 * (r["value"]["median"] / base["value"]["median"] - 1)
    out = "as fast" if abs(d) < 0.05 else f"{abs(d):.1f} % {'faster' if d > 0 else 'slower'}"
    if abs(d) < 0.05:
        return out
    per_op = [{"seconds": {"samples": [t / (x["value"]["median"] * x["seconds"]["median"])
                                       for t in x.get("seconds", {}).get("samples") or []]}}
              for x in (r, base)]  # seconds per Gop: less is faster, whatever the work
    rounds = rounds_ahead(*(per_op if d > 0 else per_op[::-1]))
    if rounds is None:
        return out
    tell = "" if sign_test(*rounds) < SIGN_LEVEL else ", too few to tell"
    return f"{out} (in {rounds[0]} of {rounds[1]} rounds{tell})"


def _size(kib: float) -> str:
    """A size for prose and tables: KiB below a MiB, MiB from there."""
    return figures.fmt(kib, "KiB") if kib < 1024 else figures.fmt(kib / 1024, "MiB")


def alone_rows(rec: dict) -> tuple[list[list], dict]:
    """Table ch2_alone: the micro-kernel alone, its B slivers in L2 or L3, on one core and
    on all, each against the FMA probe timed in turn with it; and the values the text
    quotes (each case against B in L2 on as many threads)."""
    keys = ("ch2.alone_kc", "ch2.alone_l2_kib", "ch2.alone_l3_kib", "ch2.alone_pct_one",
            "ch2.alone_pct_all", "ch2.alone_l3_one", "ch2.alone_l3_shared", "ch2.alone_l3_own",
            "ch2.alone_threads", "ch2.tiles_range", "ch2.alone_l3_where", "ch2.alone_verdict")
    found = records.results(rec, "alone")
    if not found:
        return [], {k: "n/a (not measured in this record)" for k in keys}
    f = figures.fmt
    rows, by = [], {}
    for r in found:
        p = r["params"]
        probe = records.value(rec, "alone_probe", threads=p["threads"])
        gops = r["value"]["median"]
        by[p["b_in"], p["shared_b"], p["threads"]] = r
        if p["b_in"] == "L2":
            where = "L2"
        elif p["threads"] == 1:
            where = "L3"
        else:
            where = "L3, one block all threads read" if p["shared_b"] else "L3, a block per thread"
        rows.append([where, _size(p["b_kib"]), str(p["threads"]), f(gops, "Gop/s"),
                     f(probe, "Gop/s"), f"{100 * gops / probe:.0f} %"])
    p0 = found[0]["params"]
    cores = max(r["params"]["threads"] for r in found)
    l2_kib = next(r["params"]["b_kib"] for r in found if r["params"]["b_in"] == "L2")
    l3_kib = next(r["params"]["b_kib"] for r in found if r["params"]["b_in"] == "L3")

    def pct(t):
        gops = by["L2", True, t]["value"]["median"]
        return f"{100 * gops / records.value(rec, 'alone_probe', threads=t):.0f} %"

    na = "n/a (one core)"
    l2 = (rec["settings"].get("cache_geometry") or cache_geometry())["L2"]["bytes"]
    if l3_kib * 1024 >= 2 * l2:
        l3_where = (f"is more than an L2 holds ({_size(l2 / 1024)}), so it comes from L3 on "
                    "every pass")
    else:
        l3_where = (f"is not much more than an L2 ({_size(l2 / 1024)}) on this machine, so part "
                    "of it may stay there")
    best = by["L2", True, cores]["value"]["median"] / records.value(rec, "alone_probe",
                                                                    threads=cores)
    verdict = ("so the register tile and its loads are not what keeps a product from the peak"
               if best >= 0.9 else "so on this machine the micro-kernel itself stays well "
               "below the peak, before any packing or memory")
    values = {"ch2.alone_l3_where": l3_where, "ch2.alone_verdict": verdict,
              "ch2.alone_kc": str(p0["kc"]), "ch2.alone_l2_kib": _size(l2_kib),
              "ch2.alone_l3_kib": _size(l3_kib), "ch2.alone_threads": str(cores),
              "ch2.alone_pct_one": pct(1),
              "ch2.alone_pct_all": pct(cores) if cores > 1 else na,
              "ch2.alone_l3_one": _versus(by["L3", True, 1], by["L2", True, 1]),
              "ch2.alone_l3_shared": (_versus(by["L3", True, cores], by["L2", True, cores])
                                      if cores > 1 else na),
              "ch2.alone_l3_own": (_versus(by["L3", False, cores], by["L2", True, cores])
                                   if cores > 1 else na)}
    # the tiles inside the model's products: 2MNK over each thread's time in its tiles
    tiles = []
    for label, *_ in shape_pairs(rec):
        t = records.results(rec, "phase", label=label, phase="tiles")
        if t and t[0]["value"]["median"] > 0:
            q = t[0]["params"]
            tiles.append(2.0 * q["M"] * q["N"] * q["K"] / 1e9 / (t[0]["value"]["median"] / 1e3))
    values["ch2.tiles_range"] = (f"{f(min(tiles))} to {f(max(tiles), 'Gop/s')}" if tiles
                                 else "n/a (not measured in this record)")
    return rows, values


def make_figures(rec_dir) -> dict:
    write_rung_diffs()  # from the source, not the record: always possible
    if not records.exists(RECORD, rec_dir):
        print(f"chapter 2: no record {RECORD} in {rec_dir}; run `smallem gemm` (skipped)")
        return {}
    rec = records.load(RECORD, rec_dir)
    peak, _ = _peak(rec, rec_dir)
    cores = rec["settings"]["threads"]
    note = f"This machine: {figures.machine_line(rec)}; numpy: {_blas_line(rec)}."
    rows, values = ladder_rows(rec, rec_dir)
    figures.write_table("ch2_ladder", rows,
                        ["Rung", f"Gop/s, {rec['settings']['n_ladder']}³", "of peak", "gain",
                         f"Reference: {reference.MACHINE.split(' vs ')[0]}, 8 threads"],
                        note=note + f" Reference: quoted from {reference.CITE}, not measured here.")
    r, v = sweep_rows(rec, rec_dir)
    values.update(v)
    figures.write_table("ch2_sweep", r, ["Size", f"smallem, {cores} threads",
                                         f"numpy, {cores} threads", "smallem / numpy",
                                         ROUNDS_HEADER], note=note)
    r, v = shape_rows(rec)
    values.update(v)
    values.update(whole_b_values(rec))
    figures.write_table("ch2_shapes", r,
                        ["Product", "M×K×N", "smallem", "numpy", "smallem / numpy",
                         ROUNDS_HEADER], note=note)
    r, v = phase_rows(rec)
    values.update(v)
    figures.write_table("ch2_phases", r,
                        ["Product", "M", "B", "per call", "pack B", "pack A", "tiles",
                         "waiting"],
                        note=note + f" Medians of {_phase_calls(rec)} calls; each share is the "
                        "mean over the threads of their time in the parallel region.")
    r, v = alone_rows(rec)
    values.update(v)
    figures.write_table("ch2_alone", r,
                        ["B's slivers in", "B", "threads", "the micro-kernel alone",
                         "FMA probe, in turn", "of the probe"],
                        note=note + f" K_C = {v['ch2.alone_kc']}, full tiles, no packing and "
                        "no barriers; medians of samples taken in turn with the probe.")
    r, v = dtype_rows(rec)
    values.update(v)
    figures.write_table("ch2_bf16", r, DTYPE_HEADER,
                        note=note + f" bf16 path: {values['ch2.bf16_path']}.")
    values.update(bf16_elsewhere(rec_dir))
    r, v = mc_rows(rec)
    values.update(v)
    figures.write_table("ch2_mc", r, ["L2 ways for A", "MC × KC", "A block",
                                      f"rung {values['ch2.mc_rung']}, Gop/s at "
                                      f"{values['ch2.mc_n']}³, {values['ch2.mc_threads']}"],
                        note=note)
    r, v = kc_rows(rec)
    values.update(v)
    figures.write_table("ch2_kc", r, [f"L1 ways for {v['ch2.kc_sliver']}", "KC",
                                      f"{v['ch2.kc_sliver']} sliver",
                                      f"passes over C at {values['ch2.kc_n']}³",
                                      f"Gop/s, {cores} threads"], note=note)
    values.update(pool_values(rec, rec_dir))
    values.update(chapter1_links(rec, rec_dir))
    ladder_figure(rec, peak)
    sweep_figure(rec, peak)
    roofline(rec, rec_dir)
    values["ch2.ai"] = figures.fmt(dram_intensity(rec["settings"]["n_ladder"]), "op/byte")
    pts = roofline_points(rec)
    values["ch2.ai_naive"] = figures.fmt(pts[0][1], "op/byte")
    values["ch2.ai_loop"] = figures.fmt(pts[1][1], "op/byte")
    values["ch2.ai_kernel"] = figures.fmt(pts[3][1], "op/byte")
    return values


# ---------------------------------------------------------------- command line

def add_gemm_arguments(p):
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds not minutes")
    p.add_argument("--no-save", action="store_true", help="print the table, write no record")


add_gemm_bf16_arguments = add_gemm_arguments  # the same two options


def cmd_gemm_bf16(args) -> int:
    rec = run_bf16(quick=args.quick or quick_mode())
    rows, values = dtype_rows(rec.data, prefix="ch2.bf16_native")
    print(f"{figures.machine_line(rec.data)}; {values['ch2.bf16_native_path']}")
    if "ch2.bf16_native_peaks" in values:
        print(f"  {values['ch2.bf16_native_peaks']}")
    _print_dtype_rows(rows)
    print(bf16_target(rec.data))
    if not args.no_save:
        print(f"wrote {rec.save()}")
    return 0


def cmd_gemm(args) -> int:
    # OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (set on some machines for old OpenBLAS builds)
    # slow a current one down; OpenBLAS reads them when it loads, so the benchmark
    # runs in a child process without them. Tests and other commands keep them.
    pinned = [k for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ]
    if pinned and not os.environ.get("_SMALLEM_GEMM_CHILD"):
        env = {k: v for k, v in os.environ.items() if k not in pinned}
        env["_SMALLEM_GEMM_CHILD"] = "1"
        argv = [sys.executable, "-m", "smallem", "gemm"] + (["--quick"] if args.quick else []) + (
            ["--no-save"] if args.no_save else [])
        print(f"running the benchmark without {', '.join(pinned)} (numpy's peer)", file=sys.stderr)
        return subprocess.call(argv, env=env)
    quick = args.quick or quick_mode()
    rec = run(quick=quick)
    rows, values = ladder_rows(rec.data)
    print(f"\n{figures.machine_line(rec.data)}; numpy: {_blas_line(rec.data)}")
    print(f"micro-kernel {values['ch2.mr']}x{values['ch2.nr']}; blocks of rungs 2-4 "
          f"MC={values['ch2.mc']} KC={values['ch2.kc']} NC={values['ch2.nc']}, of rung 5 and "
          f"matmul KC={values['ch2.kc5']} NC={values['ch2.nc5']}")
    width = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"  {r[0]:<{width}}  " + "  ".join(f"{c:>12}" for c in r[1:4]))
    for r in sweep_rows(rec.data)[0]:
        print(f"  sweep {r[0]:>7}: smallem {r[1]:>12}  numpy {r[2]:>12}  ({r[3]})")
    for r in shape_rows(rec.data)[0]:
        print(f"  {r[0]:<36} smallem {r[2]:>12}  numpy {r[3]:>12}  ({r[4]})")
    _print_dtype_rows(dtype_rows(rec.data)[0])
    for r in alone_rows(rec.data)[0]:
        print(f"  micro-kernel alone, B in {r[0]} ({r[1]}), {r[2]} thread(s): {r[3]}, {r[5]} of "
              f"the probe")
    for line in targets(rec.data):
        print("  target: " + line)
    pv = pool_values(rec.data)
    print(f"  parallel region {pv['ch2.pool_region_us']} vs create+join {pv['ch2.pool_spawn_us']}; "
          f"the team's thread ids: {pv['ch2.pool_persistent']}")
    if not args.no_save:
        path = rec.save()
        print(f"wrote {path}")
    return 0
