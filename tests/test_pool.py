"""smallem's own thread pool (kernels_c/pool.c, smallem.plumbing.pool): the training step's rung 2.

The kernels on the pool must give the bits they give on OpenMP's runtime, and the pool
must not hang: many fork-joins, an exception in a task, more threads than cores, two
callers at once, and the ways it can wait."""

import shutil
import subprocess
import threading
import time

import numpy as np
import pytest

from smallem.plumbing import build, pool
from smallem.product import gemm
from smallem.cpu import isa, machine_info
from smallem.training import layers
from smallem.training.model import GPT, Config

CORES = machine_info.usable_cores()


def test_a_hundred_thousand_fork_joins():
    seconds = pool.fork_join_seconds("pool", max(2, CORES), 100_000)
    assert 0 < seconds < 1e-3  # per fork-join: microseconds, not a scheduler time slice


def test_every_thread_runs_the_task_once():
    for n in (1, 2, CORES + 1, 2 * CORES + 3):  # more threads than cores, too
        seen = []
        lock = threading.Lock()

        def task(t, nt, seen=seen):
            with lock:
                seen.append((t, nt))
        pool.run(task, n)
        assert sorted(seen) == [(t, n) for t in range(n)]
        assert pool.lib()[1].pool_workers() >= n - 1  # started once, kept for the next region


def test_an_exception_in_a_task_reaches_the_caller_and_the_pool_goes_on():
    def fail_on_one(t, nt):
        if t == 1:
            raise KeyError("task 1")
    with pytest.raises(KeyError, match="task 1"):
        pool.run(fail_on_one, 3)
    done = []
    pool.run(lambda t, nt: done.append(t), 3)
    assert sorted(done) == [0, 1, 2]


@pytest.mark.parametrize("spin", [0, pool.SPIN_NS, None], ids=["sleep", "bounded", "forever"])
def test_every_way_of_waiting_returns(spin):
    old = pool.set_spin(spin)
    try:
        reps = 20 if spin is None else 500  # spinning forever on too few cores is slow
        _per_call_within_the_wall(pool.fork_join_seconds, "pool", CORES + 1, reps)
        _per_call_within_the_wall(pool.barrier_seconds, "pool", CORES + 1, reps)
    finally:
        pool.set_spin(old)
    assert pool.set_spin(old) == old


def _per_call_within_the_wall(fn, kind, n, reps):
    """The probe returns seconds per call: reps of them fit in the wall time around it, and
    one call of a team of two or more takes more than a nanosecond."""
    t0 = time.perf_counter()
    s = fn(kind, n, reps)
    wall = time.perf_counter() - t0
    assert 1e-9 < s and s * reps <= wall, (kind, s, reps, wall)


def test_openmp_and_threads_created_per_call_are_timed_too():
    for kind in ("openmp", "create"):
        _per_call_within_the_wall(pool.fork_join_seconds, kind, 2, 50)
    _per_call_within_the_wall(pool.barrier_seconds, "openmp", 2, 100)


def test_the_pool_variants_take_nothing_from_libgomp():
    """Every OpenMP call GCC made for the kernels' pragmas binds to pool_shim.h's own
    definitions: the modules import no GOMP_ or omp_ symbol."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to list the modules' imported symbols")
    level = isa.selected()
    for name in build.POOL_VARIANTS:
        pool.load(name)
        path = build.module_path(name + build.POOL_SUFFIX, level, isa.extensions(level))
        undefined = subprocess.run([nm, "-D", "--undefined-only", str(path)], check=True,
                                   capture_output=True, text=True).stdout.split()
        assert "memset" in {s.split("@")[0] for s in undefined}
        assert not [s for s in undefined if s.upper().startswith(("GOMP_", "OMP_"))], path


@pytest.mark.parametrize("block", ["gpt2", "modern"])
@pytest.mark.parametrize("backend", ["kernels", "flash", "fused", "bf16"])
def test_a_step_on_the_pool_gives_openmps_bits(level, backend, block, monkeypatch):
    """The same kernels on either runtime: each thread gets the same share (static loops)
    or sums in the same order whatever it gets (dynamic ones), so the bits agree. And every
    kernel of the pool's step runs there: one that fell back to OpenMP (a thread count
    turned into a plain int on the way) would leave libgomp's threads spinning on the
    cores the pool's next region needs."""
    cfg = Config("pool", d_model=32, n_layer=2, n_head=4, context=19, block=block)
    rng = np.random.default_rng(0)
    idx, tg = rng.integers(0, 256, (3, 19)), rng.integers(0, 256, (3, 19))
    a, b = GPT(cfg, backend, threads=2), GPT(cfg, backend, threads=2, pool=True)
    assert pool.on_pool(b.ops.threads) and not pool.on_pool(a.ops.threads)
    regions = pool.lib()[1].pool_regions
    before = regions()
    la = a.forward(idx, tg)
    a.backward()
    assert regions() == before  # OpenMP's step leaves the pool alone
    seen, real_lib, real_load = [], layers._lib, gemm.kernels

    def spy_lib(threads=None):
        seen.append(("layers", pool.on_pool(threads)))
        return real_lib(threads)

    def spy_load(level=None, *on_pool):  # the products' own call names its runtime
        if on_pool:
            seen.append(("gemm", on_pool[0]))
        return real_load(level, *on_pool)
    monkeypatch.setattr(layers, "_lib", spy_lib)
    monkeypatch.setattr(gemm, "kernels", spy_load)
    lb = b.forward(idx, tg)
    b.backward()
    assert regions() > before   # and the pool's step runs its regions there
    assert {m for m, _ in seen} == {"layers", "gemm"}
    assert all(p for _, p in seen), sorted({m for m, p in seen if not p})
    assert la == lb and np.array_equal(a.grad_flat, b.grad_flat)


def test_two_callers_at_once(rng):
    """A second caller while the pool is busy runs its region alone: no deadlock, the
    same numbers."""
    x = rng.normal(size=(4096, 256)).astype(np.float32)
    want = np.empty_like(x)
    layers.gelu_forward(x, want, 2)
    outs, errors = [np.empty_like(x) for _ in range(4)], []

    def work(out):
        try:
            for _ in range(50):
                layers.gelu_forward(x, out, pool.team(2, pool=True))
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=work, args=(o,)) for o in outs]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in ts)
    assert all(np.array_equal(o, want) for o in outs)


def test_a_team_carries_its_runtime_and_is_not_a_number():
    """The runtime travels with the count: a Team is made once and passed down, and nothing
    that wants a number can take one and drop the pool on the way (PoolThreads, an int with
    a flag, was stripped that way)."""
    from smallem import checks
    from smallem.training import layers

    t = pool.team(2, pool=True)
    assert (t.n, t.pool, t.runtime) == (2, True, "pool") and t.one() == pool.Team(1, True)
    assert pool.team(t) is t and pool.team(pool.Team(2), pool=True) == t
    assert pool.team(3) == pool.Team(3, False) and not pool.on_pool(3)
    with pytest.raises(TypeError, match="expected an int"):
        checks.threads(t)
    with pytest.raises(TypeError):
        t * 2
    # the module a call loads follows the team: the pool variant on the pool
    assert layers._lib(t) == pool.load("layers") and layers._lib(2) != pool.load("layers")
    assert layers._threads(t) == 2
    with pytest.raises(TypeError, match="pool"):
        pool.Team(2, pool="yes")


def test_huge_copy_holds_the_array_on_its_own_lines():
    """smallem.plumbing.memory.huge_copy: the same values, C-contiguous, on a cache line,
    never sharing bytes with another copy carved from the same mapping, alive after the
    original is gone; a small array is an ordinary copy."""
    import gc

    from smallem.plumbing import memory

    rng = np.random.default_rng(0)
    made = []
    for shape, dtype in (((300, 700), np.int8), ((1000, 33), np.float32), ((5,), np.float32),
                         ((2, 3, 40000), np.uint16), ((129, 1025), np.float16)):
        a = rng.integers(-100, 100, shape).astype(dtype)
        b = memory.huge_copy(a.T if a.ndim == 2 else a)
        want = a.T if a.ndim == 2 else a
        assert np.array_equal(b, want) and b.flags.c_contiguous and b.dtype == dtype
        if b.nbytes >= memory.SMALL:
            assert b.ctypes.data % memory.ALIGN == 0
        made.append((b, want.copy()))
        del a
    gc.collect()
    spans = sorted((b.ctypes.data, b.ctypes.data + b.nbytes) for b, _ in made)
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))  # no overlap
    for b, want in made:
        assert np.array_equal(b, want)
