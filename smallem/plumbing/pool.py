"""smallem's own thread pool (``kernels_c/pool.c``): the training step's rung 2.

The step's kernels are OpenMP code. Built as ``layers_pool`` and ``gemm_pool`` (the same
sources with ``SM_POOL``), the OpenMP runtime calls that GCC makes for their pragmas go to
this pool instead of libgomp; :func:`load` builds such a module and attaches it to the
pool. A kernel call runs there when its ``threads`` argument is a :class:`Team` on the pool,
as the ops object of a model built with ``pool=True`` passes; a plain count is a team on
OpenMP's runtime.

:func:`run` runs a Python function on the pool's threads (the tests' way in);
:func:`fork_join_seconds` and :func:`barrier_seconds` time the pool against OpenMP's
runtime and against threads created per call.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

from smallem import checks
from smallem.plumbing import build


@dataclass(frozen=True)
class Team:
    """The threads a kernel call runs on, made once and passed down: how many (``n``) and
    on which runtime (``pool``: smallem's own pool, else OpenMP's). It is not a number: a
    count it stands for is ``team.n``, so no call can drop the runtime on the way down."""
    n: int
    pool: bool = False

    def __post_init__(self):
        object.__setattr__(self, "n", checks.threads(self.n))
        if not isinstance(self.pool, bool):
            raise TypeError(f"pool: expected True or False, got {self.pool!r}")

    @property
    def runtime(self) -> str:
        return "pool" if self.pool else "openmp"

    def module(self, name: str, level: str | None = None):
        """(ffi, lib) of kernel module ``name`` for this team: its pool variant on the pool."""
        return load(name, level) if self.pool else build.load(name, level)

    def one(self) -> "Team":
        """One thread on the same runtime (a call too small to share out)."""
        return Team(1, self.pool)


def team(threads=None, pool: bool = False) -> Team:
    """The team a caller's ``threads`` stands for: a :class:`Team` as it is (on the pool too
    where ``pool``), a count (None: every usable core) on OpenMP's runtime, or on the pool
    where ``pool``."""
    if isinstance(threads, Team):
        return Team(threads.n, True) if pool and not threads.pool else threads
    return Team(checks.threads(threads), bool(pool))


def on_pool(threads) -> bool:
    return isinstance(threads, Team) and threads.pool


def lib():
    """(ffi, lib) of the pool module itself."""
    return build.load("pool")


_attached: dict = {}
_lock = threading.Lock()


def load(name: str, level: str | None = None):
    """(ffi, lib) of ``name``'s pool variant (``layers`` or ``gemm``), attached to the pool."""
    from smallem.cpu import isa

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
