"""Chapter 1's probes of a machine's limits, for the book (smallem.book.ch1 measures and
records them) and for the GEMM's choices (:func:`feeds`):

- two clocks, chains of dependent adds and of multiplies;
- the compute probes: f32 FMA, bf16 and int8 dots, AMX tiles where present;
- the STREAM kernels over any working set;
- the theoretical peak, cores x f32 FMA lanes a cycle x 2 (multiply and add) x clock, every
  factor measured (:func:`peak_theory`), and the vendors' table of FMA pipes as its
  cross-check.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import tempfile
import time

import numpy as np

from smallem import checks
from smallem.plumbing import build
from smallem.cpu import isa, machine_info
from smallem.cpu.timing import measure, quick_mode

RECORD = "ch1.machine"
KiB, MiB, GiB = 1024, 1024**2, 1024**3
STREAM_KERNELS = {  # name: (arrays touched, bytes moved per element as STREAM counts them)
    "copy": (2, 16), "scale": (2, 16), "add": (3, 24), "triad": (3, 24),
    "read": (1, 8)}  # a sum of one array: a decoder's traffic (it reads weights, writes little)



# ---------------------------------------------------------------- the theoretical peak

# The theoretical f32 peak is cores x f32 lanes a cycle x 2 (multiply and add) x clock. No
# operating system reports the lanes, and a table keyed on the CPU's family and model is only
# as good as the model number, which a hypervisor may mask (a Granite-Rapids-class Xeon that
# reads as model 167 looked up as a client core: half its lanes, a peak 185 % "reached"). So
# the lanes are measured (:func:`peak_theory`) and the table below is kept as a cross-check.

FMA_LANES = (4, 8, 16, 32, 64)  # f32 lanes a cycle of 1 to 4 FMA pipes of 128, 256 or 512 bits
MAX_FMA_PIPES = 4

# The one table of core facts, from the manuals each row cites (anchors of bibliography.md),
# keyed by vendor and ISA features through :func:`core_name`. Per row: the source named by its
# citation ("vendor": the manual's author), FMA pipes and bits per pipe, how wider vectors run,
# the L1's vector loads a cycle and their width in bits, whether the L2 is inclusive of the
# L1 and whether the L3 is inclusive. None: the cited source does not settle it for every core
# of the row (never a guess). Chapter 1 measures what it can (the FMAs a cycle, the plateaus);
# this table is the rest, and every page states these facts from it (ch1.hw.*).
CORE_FACTS = {
    "AMD Zen 1": dict(
        vendor="AMD", cite="amd-opt", pipes=2, pipe_bits=128, how="",
        loads_per_cycle=2, load_bits=128, l2_inclusive=True, l3_inclusive=False),
    "AMD Zen 2": dict(
        vendor="AMD", cite="amd-opt", pipes=2, pipe_bits=256, how="",
        loads_per_cycle=2, load_bits=256, l2_inclusive=True, l3_inclusive=False),
    "AMD Zen 3": dict(
        vendor="AMD", cite="amd-opt", pipes=2, pipe_bits=256, how="",
        loads_per_cycle=2, load_bits=256, l2_inclusive=True, l3_inclusive=False),
    "AMD Zen 4": dict(
        vendor="AMD", cite="amd-opt", pipes=2, pipe_bits=256,
        how="a 512-bit FMA runs as two 256-bit halves",
        loads_per_cycle=2, load_bits=256, l2_inclusive=True, l3_inclusive=False),
    "AMD Zen 5 (desktop, server)": dict(
        vendor="AMD", cite="amd-opt", pipes=2, pipe_bits=512, how="",
        loads_per_cycle=2, load_bits=512, l2_inclusive=True, l3_inclusive=False),
    "AMD Zen 5 (mobile: Strix, Krackan Point)": dict(
        vendor="Chips and Cheese", cite="strix-point", pipes=2, pipe_bits=256,
        how="256-bit datapaths: 512-bit ops in halves",
        loads_per_cycle=None, load_bits=None, l2_inclusive=None, l3_inclusive=None),
    "Intel Xeon with AVX-512 (Skylake-SP to Granite Rapids)": dict(
        vendor="Intel", cite="intel-opt", pipes=2, pipe_bits=512,
        how="ports 0+1 fused, and port 5; a few low-end SKUs lack port 5's",
        loads_per_cycle=2, load_bits=512, l2_inclusive=None, l3_inclusive=False),
    "Intel client core with AVX-512 (Ice, Tiger, Rocket Lake)": dict(
        vendor="Intel", cite="intel-opt", pipes=2, pipe_bits=256,
        how="one 512-bit FMA: ports 0 and 1 fused",
        loads_per_cycle=2, load_bits=512, l2_inclusive=None, l3_inclusive=None),
    "Intel core with AVX2 and FMA (Haswell on)": dict(  # Haswell to Raptor Lake: loads differ
        vendor="Intel", cite="intel-opt", pipes=2, pipe_bits=256, how="",
        loads_per_cycle=None, load_bits=None, l2_inclusive=None, l3_inclusive=None),
    "Apple M-series": dict(
        vendor="Apple", cite="apple-opt", pipes=4, pipe_bits=128, how="NEON",
        loads_per_cycle=None, load_bits=None, l2_inclusive=None, l3_inclusive=None),
}
CORE_FIELDS = ("vendor", "cite", "pipes", "pipe_bits", "how", "loads_per_cycle", "load_bits",
               "l2_inclusive", "l3_inclusive")
# FMA pipes per core and bits per pipe (the table's first columns, as before): a vector wider
# than a pipe is split across it in halves.
FMA_PIPES = {name: (row["pipes"], row["pipe_bits"], row["how"])
             for name, row in CORE_FACTS.items()}
# The AMX tile unit's operations a cycle per core (a 16 x 32 by 32 x 16 bf16 tile product,
# 16 384 operations, every 16 cycles; int8 twice that), from Intel's optimization manual
# (bibliography.md: intel-opt), for the cores that have AMX (Sapphire Rapids on).
AMX_OPS_PER_CYCLE = {"amx_bf16": 1024, "amx_int8": 2048}
# family 6 models of the Intel server cores with two 512-bit FMA pipes
INTEL_SERVER_AVX512 = {0x55, 0x6A, 0x6C, 0x8F, 0xCF, 0xAD, 0xAE}
# AMD family 1Ah (Zen 5) models with 256-bit datapaths: Strix Point and Krackan Point
ZEN5_NARROW_MODELS = (range(0x20, 0x30), range(0x60, 0x70))


# ISA features only Intel's server cores have among those with AVX-512 (Cooper Lake's
# AVX512_BF16, Sapphire Rapids' AMX): a hypervisor that masks the model number leaves them
INTEL_SERVER_FEATURES = frozenset({"avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})


def core_name(ident: dict | None = None, by_model: bool = False) -> str | None:
    """The :data:`CORE_FACTS` (and :data:`FMA_PIPES`) row of a CPU, or None for a core not in
    the table, by its vendor, family and ISA features.

    ``ident`` is :func:`smallem.cpu.isa.parse_cpuinfo`'s reading (default: this machine).
    ``by_model``: an Intel core with AVX-512 by its model number alone, as the table was looked
    up before issue 64 (the cross-check of :func:`peak_theory`, which shows a masked model:
    a Granite-Rapids-class Xeon that reads as model 167 looks up as a client core); otherwise
    its server-only features (:data:`INTEL_SERVER_FEATURES`) also make it a Xeon.
    """
    ident = ident or machine_info.cpu_identity()
    flags, family, model = ident["flags"], ident["family"], ident["model"]
    if ident["vendor"] == "AuthenticAMD":
        if family == 0x17:
            return "AMD Zen 1" if 0 <= model < 0x30 else "AMD Zen 2"
        if family == 0x19:
            return "AMD Zen 4" if "avx512f" in flags else "AMD Zen 3"
        if family == 0x1A:
            narrow = any(model in r for r in ZEN5_NARROW_MODELS)
            return "AMD Zen 5 (mobile: Strix, Krackan Point)" if narrow else "AMD Zen 5 (desktop, server)"
    if ident["vendor"] == "GenuineIntel" and family == 6 and "fma" in flags:
        if "avx512f" in flags:
            server = model in INTEL_SERVER_AVX512 or (
                not by_model and bool(INTEL_SERVER_FEATURES & set(flags)))
            return ("Intel Xeon with AVX-512 (Skylake-SP to Granite Rapids)" if server else
                    "Intel client core with AVX-512 (Ice, Tiger, Rocket Lake)")
        return "Intel core with AVX2 and FMA (Haswell on)"
    if platform.machine() in ("arm64", "aarch64") and (
            "Apple" in ident["model_name"] or platform.system() == "Darwin"):
        return "Apple M-series"
    return None


def core_facts(ident: dict | None = None) -> dict | None:
    """The :data:`CORE_FACTS` row of a CPU with its name under "core" (a copy), or None for a
    core not in the table. ``ident`` as :func:`core_name`'s."""
    name = core_name(ident)
    return None if name is None else {"core": name, **CORE_FACTS[name]}


def fma_units(ident: dict | None = None) -> tuple[int, int, str]:
    """(FMA pipes per core, bits per pipe, where this came from) for a CPU, as the table of
    vendors' manuals (:data:`FMA_PIPES`) gives them for its family and model number: the cross-check
    of :func:`peak_theory`, never the peak itself. A core not in the table gets
    ``(0, 0, "unknown")``."""
    name = core_name(ident, by_model=True)
    if name is None:
        return 0, 0, "unknown"
    pipes, bits, how = FMA_PIPES[name]
    return pipes, bits, f"{name}: {pipes} FMA pipes of {bits} bits" + (f" ({how})" if how else "")


def vector_bits(level: str) -> int:
    return {"avx512": 512, "avx2": 256}.get(level, 128)


def theoretical_peak(clock_hz: float, cores: int, level: str, measured_per_core: float,
                     ident: dict | None = None) -> dict:
    """The f32 peak the table of :data:`FMA_PIPES` would give, cores x pipes x lanes x 2 x
    clock, for the vector width ``level`` uses (on the CPU ``ident`` describes; default this
    one): what the book computed before it measured the lanes, kept for comparison. The
    book's peak is :func:`peak_theory`'s."""
    pipes, pipe_bits, source = fma_units(ident) if ident else fma_units()
    width = vector_bits(level)
    if pipes == 0:  # unknown core: the number of pipes that explains the measurement
        lanes_per_pipe = width // 32
        pipes = max(1, round(measured_per_core / (clock_hz * lanes_per_pipe * 2)))
        pipe_bits, source = width, "inferred from the measured FMA rate (core not in our table)"
    # A vector wider than a pipe occupies several pipes (Zen 4 runs AVX-512 on two 256-bit halves).
    lanes = pipes * min(width, pipe_bits) // 32
    flops_per_cycle = lanes * 2
    return {"pipes": pipes, "pipe_bits": pipe_bits, "vector_bits": width, "source": source,
            "flops_per_cycle_per_core": flops_per_cycle,
            "gops_per_core": flops_per_cycle * clock_hz / 1e9,
            "gops_all": flops_per_cycle * clock_hz * cores / 1e9}


def chain_clock(add_hz: float, mul_hz: float = math.nan) -> tuple[float, str]:
    """(the clock in Hz, the chain it came from: "add" or "mul") from :func:`measure_clock`'s
    two chains, either of which may be missing (NaN).

    A chain of dependent operations cannot run faster than their latency, and anything
    else on the core (an interrupt, a hypervisor's neighbour, a frequency step) only slows
    it: each chain's clock is a lower bound on the true clock, and the larger is the
    tighter bound."""
    found = [(hz, chain) for hz, chain in ((add_hz, "add"), (mul_hz, "mul")) if hz == hz and hz > 0]
    if not found:
        raise ValueError("chain_clock: neither chain measured a clock")
    return max(found)


def fma_lanes(flops_per_cycle: float, level: str) -> int:
    """The f32 FMA lanes a core starts per cycle, from the operations a cycle measured: the
    nearest of :data:`FMA_LANES` on a log scale (a rate a fifth low is nearer 16 lanes than
    8), and no more than :data:`MAX_FMA_PIPES` pipes of ``level``'s vector width carry."""
    lanes = max(flops_per_cycle, 1e-9) / 2
    top = min(FMA_LANES[-1], MAX_FMA_PIPES * vector_bits(level) // 32)
    return max(FMA_LANES[0], min(top, 2 ** round(math.log2(lanes))))


def peak_theory(clock_add_hz: float, clock_mul_hz: float, f32_one_hz: float, f32_all_hz: float,
                cores: int, level: str, ident: dict | None = None) -> dict:
    """The theoretical f32 peak, cores x lanes x 2 x clock, with every factor measured.

    The clock is :func:`chain_clock`'s. The lanes are the f32 operations a cycle one core's
    FMA probe reached, halved and rounded to whole pipes (:func:`fma_lanes`); the probe rate
    per core is the better of the one-thread probe (``f32_one_hz``, operations a second) and
    the all-core probe (``f32_all_hz``) over the ``cores`` physical cores, so that one
    disturbed probe cannot halve the peak. A measurement counts the probe's instructions a
    cycle, so the pipes are of the probe's width (a core that splits a 512-bit FMA over two
    256-bit pipes reads as one 512-bit pipe: the same lanes, the same peak).

    ``ident`` (a :func:`smallem.cpu.isa.parse_cpuinfo` reading; None: no cross-check) is looked
    up in :data:`FMA_PIPES`: "table" holds what the vendors' manuals give for its model
    number (None where the core is not in the table), and whether it agrees.
    """
    clock_hz, chain = chain_clock(clock_add_hz, clock_mul_hz)
    one, every = f32_one_hz, f32_all_hz / cores
    per_core, rate_from = (one, "one thread") if one >= every else (every, "all cores")
    measured = per_core / clock_hz
    lanes = fma_lanes(measured, level)
    width = vector_bits(level)
    pipe_bits = min(width, 32 * lanes)
    pipes = 32 * lanes // pipe_bits
    flops_per_cycle = 2 * lanes
    table = None
    if ident is not None and core_name(ident, by_model=True) is not None:
        t_pipes, t_bits, t_source = fma_units(ident)
        t_flops = 2 * t_pipes * min(width, t_bits) // 32
        table = {"core": core_name(ident, by_model=True), "pipes": t_pipes, "pipe_bits": t_bits,
                 "source": t_source, "flops_per_cycle_per_core": t_flops,
                 "agrees": t_flops == flops_per_cycle,
                 "family": ident.get("family"), "model": ident.get("model")}
    return {"pipes": pipes, "pipe_bits": pipe_bits, "vector_bits": width, "lanes": lanes,
            "source": f"measured: {pipes} FMA{'s' if pipes > 1 else ''} of {pipe_bits} bits a cycle "
                      f"({measured:.1f} f32 operations a cycle, {rate_from}, at the "
                      f"{chain} chain's clock)",
            "flops_per_cycle_per_core": flops_per_cycle,
            "measured_flops_per_cycle": measured,
            "clock_ghz": clock_hz / 1e9, "clock_chain": chain,
            "probe_gops_core": per_core / 1e9, "probe_from": rate_from,
            "cores": cores, "table": table,
            "gops_per_core": flops_per_cycle * clock_hz / 1e9,
            "gops_all": flops_per_cycle * clock_hz * cores / 1e9}


# ---------------------------------------------------------------- probes

def _probes(level: str | None = None):
    return build.load("probes", level)


def settle(seconds: float = 1.0) -> None:
    """Wait until the OpenMP threads of the last parallel region have gone to sleep.

    An idle OpenMP thread spins for a while before it sleeps (OMP_WAIT_POLICY, GOMP_SPINCOUNT).
    On a machine whose cores share anything (SMT siblings, a hypervisor's neighbours) that
    spinning can halve what one thread measures right after a multi-threaded kernel.
    """
    time.sleep(seconds)


MUL_LATENCY = 3  # cycles of a 64-bit integer multiply: Intel since Nehalem, AMD since Zen


def measure_clock(repeats: int = 5, chain: str = "add") -> dict:
    """Cycles per second, from chains of dependent operations: adds of two registers (one
    cycle each), or, as an independent check, multiplies (``MUL_LATENCY`` cycles each)."""
    _, lib = _probes()
    fn, cycles = {"add": (lib.probe_add_chain, 1), "mul": (lib.probe_mul_chain, MUL_LATENCY)}[chain]
    iters = 2_000_000 if quick_mode() else 10_000_000  # 64 adds each: ~40 or ~200 ms at 3 GHz
    iters //= cycles
    t = measure(lambda: fn(iters), repeats=repeats)
    return t.rate(iters * 64.0 * cycles)


PROBES = ("f32", "bf16", "int8", "amx_bf16", "amx_int8")


DOT_KINDS = ("bf16", "int8")  # the probes whose chains of accumulators are an argument


def dot_chain_counts(level: str | None = None) -> tuple[int, ...]:
    """The numbers of independent accumulators the bf16 and int8 dot probes can keep."""
    _, lib = _probes(level)
    counts, i = [], 0
    while (c := lib.probe_dot_chain_count(i)) > 0:
        counts.append(c)
        i += 1
    return tuple(counts)


def peak_probe(kind: str, threads: int, iters: int | None = None, level: str | None = None,
               chains: int | None = None):
    """One of the compute probes (:data:`PROBES`) on ``threads`` threads, ready to time:
    (a function that runs it once, the Gop one run does). ``chains``: the dot probes'
    accumulators (one of :func:`dot_chain_counts`; the largest when not given)."""
    threads = checks.positive_int(threads, "threads", limit=4096)
    ffi, lib = _probes(level)
    fn = {"f32": lib.probe_fma_f32, "bf16": lib.probe_dot_bf16, "int8": lib.probe_dot_int8,
          "amx_bf16": lib.probe_amx_bf16, "amx_int8": lib.probe_amx_int8}.get(kind)
    if fn is None:
        raise ValueError(f"kind: expected one of {PROBES}, got {kind!r}")
    if kind.startswith("amx") and not native(kind, level):
        raise ValueError(f"kind: {kind!r} needs AMX tiles, which this build or CPU lacks")
    if kind in DOT_KINDS:
        counts = dot_chain_counts(level)
        chains = max(counts) if chains is None else chains
        if chains not in counts:
            raise ValueError(f"chains: expected one of {list(counts)}, got {chains!r}")
        fn = (lambda f, c: lambda n, t, s: f(n, t, c, s))(fn, chains)
    sink = ffi.new("int32_t *" if kind.endswith("int8") else "float *")
    if iters is None:  # ~40 ms a sample: longer than a host hiccup (a tile op does 512 FMAs' work)
        iters = 200_000 if quick_mode() else 20_000_000
        iters //= 64 if kind.startswith("amx") else 1
    ops = fn(iters, threads, sink)  # also the warm-up: threads spawned, clocks up
    return (lambda: fn(iters, threads, sink)), ops / 1e9


def fastest_dot_chains(kind: str, threads: int = 1, level: str | None = None) -> int:
    """The number of accumulators at which the ``kind`` dot probe runs fastest here: each
    count timed on ``threads`` threads, three short runs in turn, the best of each kept.
    Too few chains time the instruction's latency; too many can fill the core's scheduler
    (on Zen 4, 24 run about a sixth slower than 8 to 16)."""
    if kind not in DOT_KINDS:
        raise ValueError(f"kind: expected one of {DOT_KINDS}, got {kind!r}")
    runs = {}
    for c in dot_chain_counts(level):
        run_once, gop = peak_probe(kind, threads, iters=(20_000 if quick_mode() else 2_000_000)
                                   * 8 // c, level=level, chains=c)
        runs[c] = (run_once, gop)
    best = {c: 0.0 for c in runs}
    for _ in range(3):
        for c, (run_once, gop) in runs.items():
            t0 = time.perf_counter()
            run_once()
            best[c] = max(best[c], gop / (time.perf_counter() - t0))
    return max(best, key=best.get)


def measure_peak(kind: str, threads: int, repeats: int = 5) -> dict:
    """Gop/s of one of the compute probes (:data:`PROBES`) on ``threads`` threads; the dot
    probes at the chain count that runs fastest on one thread (:func:`fastest_dot_chains`),
    kept in ``chains``."""
    chains = fastest_dot_chains(kind) if kind in DOT_KINDS else None
    run_once, gop = peak_probe(kind, threads, chains=chains)
    t = measure(run_once, repeats=repeats, warmup=0)
    out = {"value": t.rate(gop), "seconds": t.stats()}
    if chains is not None:
        out["chains"] = chains
    return out


def native(kind: str, level: str | None = None) -> bool:
    """Whether the probe ``kind`` runs its own instruction here (not a fallback); for the
    AMX kinds, whether it can run at all."""
    _, lib = _probes(level)
    return bool({"f32": 1, "bf16": lib.probe_has_native_bf16(),
                 "int8": lib.probe_has_native_int8(), "amx_bf16": lib.probe_has_amx() & 1,
                 "amx_int8": lib.probe_has_amx() & 2}[kind])


def amx_kinds(level: str | None = None) -> tuple[str, ...]:
    """The AMX tile probes this machine can run (none without AMX)."""
    return tuple(k for k in ("amx_bf16", "amx_int8") if native(k, level))


# ---------------------------------------------------------------- the memory staircase

def stream_kernel(kernel: str, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None,
                  scalar: float = 3.0, reps: int = 1, threads: int = 1) -> float | None:
    """Run one STREAM kernel in place on float64 arrays: a = b, s*b, b+c or b+s*c; or
    "read", which stores nothing into ``a`` and returns the sum of ``b`` over the ``reps``
    passes (each thread's slice summed in its own order)."""
    if kernel not in STREAM_KERNELS:
        raise ValueError(f"kernel: expected one of {list(STREAM_KERNELS)}, got {kernel!r}")
    checks.array(a, "a", np.float64, ndim=1, writable=True)
    if kernel == "read":  # b alone, of any length
        checks.array(b, "b", np.float64, ndim=1)
    else:
        checks.array(b, "b", np.float64, shape=a.shape)
    if STREAM_KERNELS[kernel][0] == 3:
        if c is None:
            raise ValueError(f"c: the {kernel} kernel reads a third array")
        checks.array(c, "c", np.float64, shape=a.shape)
    n = checks.positive_int((b if kernel == "read" else a).size, "len(b)" if kernel == "read"
                            else "len(a)", limit=2**62)
    reps = checks.positive_int(reps, "reps")
    threads = checks.positive_int(threads, "threads", limit=4096)
    ffi, lib = build.load("stream")
    pa, pb = ffi.from_buffer("double[]", a), ffi.from_buffer("double[]", b)
    if kernel == "read":
        out = np.zeros(8 * threads)  # a line per thread
        lib.stream_read(pb, ffi.from_buffer("double[]", out), n, reps, threads)
        return float(out[::8].sum())
    if kernel == "copy":
        lib.stream_copy(pa, pb, n, reps, threads)
    elif kernel == "scale":
        lib.stream_scale(pa, pb, float(scalar), n, reps, threads)
    elif kernel == "add":
        lib.stream_add(pa, pb, ffi.from_buffer("double[]", c), n, reps, threads)
    else:
        lib.stream_triad(pa, pb, ffi.from_buffer("double[]", c), float(scalar), n, reps, threads)


def _line_aligned(n: int, skip: int) -> np.ndarray:
    """n float64s starting ``skip`` elements after a 64-byte boundary."""
    raw = np.empty(n + skip + 8)
    first = (-raw.ctypes.data % 64) // 8
    return raw[first + skip:first + skip + n]


class Stream:
    """Three arrays big enough for the largest working set, first-touched by ``threads``."""

    def __init__(self, max_bytes: int, threads: int):
        ffi, lib = build.load("stream")
        n = max_bytes // (8 * 2) + 64
        # Each array starts on a cache line (no vector load straddles two lines), and b and c
        # are shifted by 17 and 34 lines: large arrays otherwise start at the same offset in a
        # 4 KiB page, so a[i], b[i] and c[i] would share their low 12 address bits and the
        # core would mistake loads for dependents of earlier stores ("4K aliasing").
        # b is twice as long: the read kernel spends the whole working set on it alone
        self.a, self.b, self.c = (_line_aligned(m, skip)
                                  for m, skip in ((n, 0), (2 * n, 17 * 8), (n, 34 * 8)))
        lib.stream_init(*(ffi.from_buffer("double[]", x) for x in (self.a, self.b[:n], self.c)),
                        n, threads)
        self.b[n:] = 2.0

    def run(self, kernel: str, n: int, reps: int, threads: int):
        if kernel == "read":  # one array of n: b alone
            return stream_kernel(kernel, self.a[:1], self.b[:n], None, 3.0, reps, threads)
        stream_kernel(kernel, self.a[:n], self.b[:n], self.c[:n], 3.0, reps, threads)


def measure_stream_point(s: Stream, kernel: str, ws_bytes: int, threads: int,
                         repeats: int = 5) -> dict:
    arrays, per_elem = STREAM_KERNELS[kernel]
    n = max(threads * 8, ws_bytes // (8 * arrays))
    # Enough passes that one sample moves ~512 MiB (milliseconds even in L1): call overhead vanishes.
    reps = max(1, int(512 * MiB / (n * per_elem)))
    s.run(kernel, n, reps, threads)  # warm-up: bring the working set into the cache under test
    t = measure(lambda: s.run(kernel, n, reps, threads), repeats=repeats, warmup=0)
    return {"value": t.rate(n * per_elem * reps / 1e9), "seconds": t.stats(),
            "n": n, "reps": reps}




# ---------------------------------------------------------------- what the GEMM's model weighs

FEED_RUN_BYTES = 1024**3  # bytes a run of the L3 triad moves (measure_feeds)
FEEDS_VERSION = 4  # bump when feeds() measures differently: older files are measured again


def feeds(level: str, refresh: bool = False) -> dict:
    """One core's f32 FMA and bf16 dot rates (Gop/s), each core's share of the L3's triad
    bandwidth with every core reading (GB/s) and the caches' reach (:func:`cache_reach`),
    for chapter 2's loop-order model, bf16 path and AMX epilogue. Measured once per machine (the CPU, its caches, the usable cores, the ISA level)
    and kept in the build cache, so every process here makes the same choices. ``refresh``
    measures again and replaces what the cache kept: chapter 1's measurement does, so that
    a book's choices come from a quiet machine, not from the first call of some earlier
    process (which may have run beside a compiler)."""
    key = json.dumps([FEEDS_VERSION, machine_info.cpu_model(), machine_info.usable_cores(),
                      machine_info.caches(), level, sorted(isa.extensions(level))])
    path = build.cache_dir() / f"feeds_{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if refresh:
        _feeds.cache_clear()
        try:
            os.remove(path)
        except OSError:
            pass
    return _feeds(str(path), level)


@functools.lru_cache(maxsize=8)
def _feeds(path: str, level: str) -> dict:
    try:
        with open(path) as f:
            found = json.load(f)
        if {"f32_gops_core", "bf16_gops_core", "l3_gbs_core", "reach_bytes"} <= set(found):
            return found
    except (OSError, ValueError):
        pass  # not measured yet, or a damaged file: measure again
    found = measure_feeds(level)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False,
                                         suffix=".tmp") as f:
            json.dump(found, f)
        os.replace(f.name, path)  # whole or not at all, even with several processes at once
    except OSError:
        pass  # a cache that cannot be written: this process keeps its own measurement
    return found


# ---------------------------------------------------------------- choices kept per machine

KEPT_PREFIX = "kept_"


def kept(name: str, key: list, measure_it):
    """A choice that decides a kernel's speed (a thread threshold, a prompt path), measured
    once on this machine and kept in the build cache under ``name`` and ``key`` (with the
    CPU, its caches and its usable cores), so that every process here makes the same choice:
    a choice timed anew in each process flips with the noise of the moment, and the speed
    with it. ``measure_it()`` returns a JSON value. :func:`forget_kept` measures them all
    again (chapter 1's measurement calls it, so a book's choices come from a quiet machine)."""
    ident = json.dumps([name, machine_info.cpu_model(), machine_info.usable_cores(),
                        machine_info.caches(), key], sort_keys=True, default=str)
    path = build.cache_dir() / f"{KEPT_PREFIX}{name}_{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"
    found = _read_kept(path, ident)
    if found is not None:
        return found[0]
    # one process measures at a time: processes started together (MPI's ranks) wait for the
    # first one's choice instead of each timing its own, contended, and choosing apart
    with _kept_lock():
        found = _read_kept(path, ident)
        if found is not None:
            return found[0]
        return _measure_kept(path, ident, measure_it)


def _read_kept(path, ident):
    """(value,) kept at ``path`` for ``ident``; None where there is none or it is damaged."""
    try:
        with open(path) as f:
            found = json.load(f)
        if found.get("ident") == ident:
            return (found["value"],)
    except (OSError, ValueError, AttributeError):
        pass  # not measured yet, or a damaged file: measure again
    return None


class _kept_lock:
    """An exclusive lock on the cache's kept choices: a file lock between processes, taken
    once per process (a measurement may ask for another kept choice: the prompt's rates
    load the GEMM, whose loop order is kept too), and none where the cache cannot be
    written (each process then measures for itself)."""
    held = 0  # how deep this process is inside the lock
    mutex = __import__("threading").RLock()
    file = None

    def __enter__(self):
        import fcntl

        cls = type(self)
        cls.mutex.acquire()
        cls.held += 1
        if cls.held == 1:
            try:
                os.makedirs(build.cache_dir(), exist_ok=True)
                cls.file = open(build.cache_dir() / ".kept.lock", "a")
                fcntl.flock(cls.file, fcntl.LOCK_EX)
            except OSError:
                if cls.file:
                    cls.file.close()
                cls.file = None
        return self

    def __exit__(self, *exc):
        cls = type(self)
        cls.held -= 1
        if cls.held == 0 and cls.file:
            cls.file.close()  # closing the file releases the lock
            cls.file = None
        cls.mutex.release()
        return False


def _measure_kept(path, ident, measure_it):
    value = measure_it()
    try:
        os.makedirs(path.parent, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump({"ident": ident, "value": value,
                       "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)
        os.replace(f.name, path)  # whole or not at all, even with several processes at once
    except OSError:
        pass  # a cache that cannot be written: this process keeps its own measurement
    return value


def forget_kept() -> int:
    """Remove every kept choice (:func:`kept`); returns how many there were."""
    n = 0
    for p in build.cache_dir().glob(f"{KEPT_PREFIX}*.json"):
        try:
            p.unlink()
            n += 1
        except OSError:
            pass
    return n


REACH_DROP = 1.5  # a cache level's rate over memory's: chapter 1's plateaus differ by more


def cache_reach(points) -> int:
    """The largest working set (bytes) that the caches still serve: of ``points``, (bytes,
    GB/s) of one thread's copy at growing working sets (chapter 1's stream sweep), the
    largest whose rate is REACH_DROP times the rate at the largest, which memory serves
    (the largest itself where none is: the sweep never left the caches).
    On a virtual machine the L3 the system reports is the whole socket's, shared with
    every other guest; this is the part of it a process here can count on. Past it, a
    product's C is written back to memory whatever the kernel does (the AMX path's
    streamed stores, :func:`smallem.gemm.amx_epilogue`)."""
    pts = sorted((int(b), float(g)) for b, g in points)
    if not pts:
        raise ValueError("cache_reach: no points")
    memory = pts[-1][1]
    inside = [b for b, g in pts if g >= REACH_DROP * memory]
    return max(inside) if inside else pts[-1][0]


def reach_points(l2_bytes: int, l3_bytes: int, repeats: int = 3) -> list[tuple[int, float]]:
    """One thread's copy at working sets doubling from the L2s' bytes to four times the L3
    the system reports (at most 512 MiB): the points :func:`cache_reach` reads."""
    top = min(512 * MiB, 4 * max(l3_bytes, l2_bytes))
    sizes, ws = [], max(MiB, l2_bytes)
    while ws <= top:
        sizes.append(ws)
        ws *= 2
    s = Stream(sizes[-1], 1)
    return [(ws, measure_stream_point(s, "copy", ws, 1, repeats)["value"]["max"])
            for ws in sizes]


def measure_feeds(level: str, repeats: int = 5) -> dict:
    """:func:`feeds`, measured: the best of ``repeats`` short runs of each probe."""
    out = {}
    for kind in ("f32", "bf16"):
        chains = fastest_dot_chains(kind, level=level) if kind in DOT_KINDS else None
        run_once, gop = peak_probe(kind, 1, iters=400_000, level=level, chains=chains)
        out[f"{kind}_gops_core"] = measure(run_once, repeats=repeats, warmup=0).rate(gop)["max"]
    caches, cores = machine_info.caches(), machine_info.usable_cores()
    l2 = caches["L2_bytes"] * cores
    l3 = caches["L3_bytes"] * min(cores, caches["L3_instances"]) or 4 * l2
    ws = int(math.sqrt(2 * l2 * l3 / 2)) // 4096 * 4096  # between the L2s and the L3
    s = Stream(ws, cores)
    n = ws // 24
    # a GiB a run (about 10 ms): runs of 64 MiB, half a millisecond, read the 2-core Zen 3's
    # L3 at 29 GB/s a core where runs of a GiB and chapter 1's sweep read 60-70
    reps = max(1, int(FEED_RUN_BYTES // (n * 24)))
    s.run("triad", n, reps, cores)
    t = measure(lambda: s.run("triad", n, reps, cores), repeats=repeats, warmup=0)
    out["l3_gbs_core"] = t.rate(24.0 * n * reps / 1e9)["max"] / cores
    out["working_set"] = ws
    out["reach_bytes"] = cache_reach(reach_points(l2, caches["L3_bytes"] * caches["L3_instances"]))
    out["date"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return out
