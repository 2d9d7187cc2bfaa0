"""smallem's own thread pool (``kernels_c/pool.c``): the training step's rung 2.

The step's kernels are OpenMP code. Built as ``layers_pool`` and ``gemm_pool`` (the same
sources with ``SM_POOL``), the OpenMP runtime calls that GCC makes for their pragmas go to
this pool instead of libgomp; :func:`load` builds such a module and attaches it to the
pool. A kernel call runs there when its ``threads`` argument is a :class:`PoolThreads`
(an int that says so), as the ops object of a model built with ``pool=True`` passes.

:func:`run` runs a Python function on the pool's threads (the tests' way in);
:func:`fork_join_seconds` and :func:`barrier_seconds` time the pool against OpenMP's
runtime and against threads created per call.
"""

from __future__ import annotations

import ctypes
import threading

from . import build, checks


class PoolThreads(int):
    """A thread count whose kernels run on smallem's pool rather than OpenMP's."""

    pool = True


def threads(n=None, pool: bool = True) -> int:
    """``n`` threads (default: every usable core), as a :class:`PoolThreads` if ``pool``."""
    n = checks.threads(n)
    return PoolThreads(n) if pool else n


def on_pool(threads) -> bool:
    return bool(getattr(threads, "pool", False))


def lib():
    """(ffi, lib) of the pool module itself."""
    return build.load("pool")


_attached: dict = {}
_lock = threading.Lock()


def load(name: str, level: str | None = None):
    """(ffi, lib) of ``name``'s pool variant (``layers`` or ``gemm``), attached to the pool."""
    from . import isa

    level = level or isa.selected()
    key = (name, level, isa.extensions(level))
    found = _attached.get(key)
    if found is None:
        with _lock:
            pffi, plib = lib()
            ffi, vlib = build.load(name + build.POOL_SUFFIX, level)
            vlib.sm_pool_attach(plib.pool_api())
            found = _attached[key] = (ffi, vlib)
    return found


SPIN_NS = 50_000  # the pool's default: spin 50 us, then sleep


def set_spin(ns: int | None):
    """How long a waiting thread spins before it sleeps: ``ns`` nanoseconds, 0 to sleep at
    once, None to spin forever; returns the previous setting."""
    ffi, plib = lib()
    old = int(plib.pool_spin_ns())
    plib.pool_set_spin_ns(-1 if ns is None else int(ns))
    return None if old < 0 else old


_TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)


def run(fn, n=None):
    """Call ``fn(thread, threads)`` on ``n`` threads of the pool (the caller is thread 0)
    and return when all are done. An exception in any of them is raised here, after the
    join; the pool goes on."""
    n = checks.threads(n)
    errors: list = []

    def task(_ctx, t, nt):
        try:
            fn(t, nt)
        except BaseException as e:  # noqa: BLE001 - carried to the caller, not lost
            errors.append(e)

    callback = _TASK(task)  # kept alive until the call returns
    ffi, plib = lib()
    plib.pool_run_task(ffi.cast("void (*)(void *, int, int)",
                                ctypes.cast(callback, ctypes.c_void_p).value), ffi.NULL, n)
    if errors:
        raise errors[0]


def fork_join_seconds(kind: str, n: int, reps: int) -> float:
    """Seconds per fork-join of ``n`` threads around an empty region: ``kind`` "pool",
    "openmp" or "create" (threads made and joined for each call)."""
    ffi, plib = lib()
    fn = {"pool": plib.pool_fork_join_seconds, "openmp": plib.omp_fork_join_seconds,
          "create": plib.create_fork_join_seconds}[kind]
    return float(fn(checks.threads(n), int(reps)))


def barrier_seconds(kind: str, n: int, reps: int) -> float:
    """Seconds per barrier of ``n`` threads in one region: "pool" or "openmp"."""
    ffi, plib = lib()
    fn = {"pool": plib.pool_barrier_seconds, "openmp": plib.omp_barrier_seconds}[kind]
    return float(fn(checks.threads(n), int(reps)))
