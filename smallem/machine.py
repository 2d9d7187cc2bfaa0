"""Chapter 1: what a CPU is worth.

Measures this machine's limits and writes them to one record, ``ch1.machine``:

- the clock, from a chain of dependent integer adds (one cycle each);
- peak compute: f32 FMA, bf16 dot, int8 dot, on one core and on all;
- the memory staircase: STREAM copy/scale/add/triad over working sets from
  16 KiB to 1 GiB, on one core and on all, with numpy's copy as a peer;
- the starting point of chapter 2: a naive 1024^3 matrix product.

The theoretical peak is computed, not assumed:
cores x FMA pipes x lanes x 2 (multiply and add) x measured clock.
"""

from __future__ import annotations

import platform
import time

import numpy as np

from . import build, checks, isa, machine_info
from .timing import measure, quick_mode

RECORD = "ch1.machine"
KiB, MiB, GiB = 1024, 1024**2, 1024**3
STREAM_KERNELS = {  # name: (arrays touched, bytes moved per element as STREAM counts them)
    "copy": (2, 16), "scale": (2, 16), "add": (3, 24), "triad": (3, 24)}



# ---------------------------------------------------------------- the theoretical peak

def fma_units() -> tuple[int, int, str]:
    """(FMA pipes per core, bits per pipe, where this came from) for this CPU.

    No operating system reports the number of FMA pipes, so we look the core up
    in the vendors' optimisation manuals (see bibliography.md). An unknown core
    gets ``(0, 0, "unknown")`` and the caller infers the pipes from the
    measurement, saying so.
    """
    flags = isa.cpu_flags()
    model = machine_info.cpu_model()
    family = _cpuinfo_int("cpu family")
    if "AMD" in model or "AuthenticAMD" in _cpuinfo_str("vendor_id"):
        if family == 0x17 and _cpuinfo_int("model") < 0x30:
            return 2, 128, "AMD Zen 1: two 128-bit FMA pipes"
        if family in (0x17, 0x19):
            return 2, 256, "AMD Zen 2/3/4: two 256-bit FMA pipes (Zen 4 splits AVX-512 in two halves)"
        if family == 0x1A:
            return 2, 512, "AMD Zen 5: two 512-bit FMA pipes"
    if "Intel" in model and "fma" in flags:
        if "avx512f" in flags and ("Xeon" in model):
            return 2, 512, "Intel Xeon with AVX-512: two 512-bit FMA pipes (some SKUs have one)"
        return 2, 256, "Intel core with FMA: two 256-bit FMA pipes"
    if platform.machine() in ("arm64", "aarch64"):
        if "Apple" in model or platform.system() == "Darwin":
            return 4, 128, "Apple M-series: four 128-bit NEON FMA pipes"
    return 0, 0, "unknown"


def _cpuinfo_str(key: str) -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _cpuinfo_int(key: str) -> int:
    value = _cpuinfo_str(key)
    try:
        return int(value, 0)
    except ValueError:
        return -1


def vector_bits(level: str) -> int:
    return {"avx512": 512, "avx2": 256}.get(level, 128)


def theoretical_peak(clock_hz: float, cores: int, level: str, measured_per_core: float) -> dict:
    """f32 peak = cores x pipes x lanes x 2 x clock, for the vector width ``level`` uses."""
    pipes, pipe_bits, source = fma_units()
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


def measure_clock(repeats: int = 5) -> dict:
    """Cycles per second, from adds that each wait one cycle for the previous one."""
    _, lib = _probes()
    iters = 2_000_000 if quick_mode() else 10_000_000  # 64 adds each: ~40 or ~200 ms at 3 GHz
    t = measure(lambda: lib.probe_add_chain(iters), repeats=repeats)
    return t.rate(iters * 64.0)


def peak_probe(kind: str, threads: int, iters: int | None = None, level: str | None = None):
    """One of the compute probes ('f32', 'bf16', 'int8') on ``threads`` threads, ready to
    time: (a function that runs it once, the Gop one run does)."""
    threads = checks.positive_int(threads, "threads", limit=4096)
    ffi, lib = _probes(level)
    fn = {"f32": lib.probe_fma_f32, "bf16": lib.probe_dot_bf16, "int8": lib.probe_dot_int8}.get(kind)
    if fn is None:
        raise ValueError(f"kind: expected 'f32', 'bf16' or 'int8', got {kind!r}")
    sink = ffi.new("int32_t *" if kind == "int8" else "float *")
    if iters is None:  # ~40 ms a sample: longer than a host hiccup
        iters = 200_000 if quick_mode() else 20_000_000
    ops = fn(iters, threads, sink)  # also the warm-up: threads spawned, clocks up
    return (lambda: fn(iters, threads, sink)), ops / 1e9


def measure_peak(kind: str, threads: int, repeats: int = 5) -> dict:
    """Gop/s of one of the compute probes ('f32', 'bf16', 'int8') on ``threads`` threads."""
    run_once, gop = peak_probe(kind, threads)
    t = measure(run_once, repeats=repeats, warmup=0)
    return {"value": t.rate(gop), "seconds": t.stats()}



def native(kind: str) -> bool:
    _, lib = _probes()
    return bool({"f32": 1, "bf16": lib.probe_has_native_bf16(),
                 "int8": lib.probe_has_native_int8()}[kind])


# ---------------------------------------------------------------- the memory staircase

def stream_kernel(kernel: str, a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None,
                  scalar: float = 3.0, reps: int = 1, threads: int = 1) -> None:
    """Run one STREAM kernel in place on float64 arrays: a = b, s*b, b+c or b+s*c."""
    if kernel not in STREAM_KERNELS:
        raise ValueError(f"kernel: expected one of {list(STREAM_KERNELS)}, got {kernel!r}")
    checks.array(a, "a", np.float64, ndim=1, writable=True)
    checks.array(b, "b", np.float64, shape=a.shape)
    if STREAM_KERNELS[kernel][0] == 3:
        if c is None:
            raise ValueError(f"c: the {kernel} kernel reads a third array")
        checks.array(c, "c", np.float64, shape=a.shape)
    n = checks.positive_int(a.size, "len(a)", limit=2**62)
    reps = checks.positive_int(reps, "reps")
    threads = checks.positive_int(threads, "threads", limit=4096)
    ffi, lib = build.load("stream")
    pa, pb = ffi.from_buffer("double[]", a), ffi.from_buffer("double[]", b)
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
        self.a, self.b, self.c = (_line_aligned(n, skip) for skip in (0, 17 * 8, 34 * 8))
        lib.stream_init(*(ffi.from_buffer("double[]", x) for x in (self.a, self.b, self.c)),
                        n, threads)

    def run(self, kernel: str, n: int, reps: int, threads: int):
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


