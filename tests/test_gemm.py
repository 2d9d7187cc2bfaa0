"""Chapter 2: every rung of the ladder and the package's GEMM against numpy."""

import functools
import itertools
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import captured
from smallem import checks
from smallem.product import gemm
from smallem.cpu import isa, machine
from smallem.book import ch1, ch2, compare, figures, records

SHAPES = [(1, 1, 1), (1, 7, 3), (5, 1, 2), (2, 3, 5), (7, 13, 11), (17, 31, 29), (37, 19, 41),
          (6, 16, 8), (13, 33, 64)]
SMALL_BLOCKS = {"mc": 7, "kc": 5, "nc": 19}  # cuts every loop into blocks with ragged edges


def ref(a, b, ta=False, tb=False):
    a = a.T if ta else a
    b = b.T if tb else b
    return a.astype(np.float64) @ b.astype(np.float64)


def rand(rng, *shape):
    return rng.standard_normal(shape, dtype=np.float32)


# ---------------------------------------------------------------- the model

def test_micro_shape_model_matches_the_compiled_kernels(level):
    vec, regs = gemm.REGISTER_FILE[level]
    assert gemm.micro_shape(vec, regs) == gemm.kernel_shape(level)


def test_micro_shape_model_for_avx512():
    assert gemm.micro_shape(16, 32) == (14, 32)
    assert gemm.micro_shape(8, 16) == (6, 16)
    with pytest.raises(ValueError):
        gemm.micro_shape(8, 16, latency=8, pipes=2)  # 96 < 8 x 8 x 2: latency not covered


def test_block_sizes_for_zen3_caches():
    g = {"L1d": {"bytes": 32768, "ways": 8, "line": 64, "instances": 2},
         "L2": {"bytes": 524288, "ways": 8, "line": 64, "instances": 2},
         "L3": {"bytes": 32 << 20, "ways": 16, "line": 64, "instances": 1}}
    b = gemm.block_sizes(6, 16, g, threads=2)
    # B's sliver in 6 of 8 ways of 4 KiB: 384 x 16 x 4 B = 24 KiB
    assert b["kc"] == 384
    # A's block in half of the L2: 256 KiB / (384 x 4 B) = 170 rows, down to a multiple of 6
    assert b["mc"] == 168
    assert b["nc"] % 16 == 0
    assert 2 * b["mc"] * b["kc"] * 4 + b["kc"] * b["nc"] * 4 <= 32 << 20
    # AVX-512's 14 x 32 on the same caches: 128-byte rows of B, so half the KC
    b = gemm.block_sizes(14, 32, g, threads=2)
    assert b["kc"] == 192 and b["mc"] % 14 == 0
    # rung 5 keeps A's sliver instead, in 7 of 8 ways: 6 x 1194 x 4 B = 28 KiB
    b = gemm.block_sizes(6, 16, g, threads=2, rung5=True)
    assert b["kc"] == 1194 and b["mc"] == 54
    assert 2 * b["mc"] * b["kc"] * 4 + b["kc"] * b["nc"] * 4 <= 32 << 20
    assert gemm.block_sizes(14, 32, g, threads=2, rung5=True)["kc"] == 512
    # where the caches' measured reach is 16 MiB, B's block takes at most 8 MiB of it
    wide = b["nc"]
    b = gemm.block_sizes(6, 16, g, threads=2, rung5=True, reach=16 << 20)
    assert b["kc"] == 1194 and b["mc"] == 54 and b["nc"] % 16 == 0
    assert b["kc"] * b["nc"] * 4 <= 8 << 20 < b["kc"] * (b["nc"] + 16) * 4 and b["nc"] < wide
    # a reach beyond the L3's space the model fills changes nothing
    assert gemm.block_sizes(6, 16, g, threads=2, rung5=True, reach=1 << 30)["nc"] == wide
    # the column order keeps each B sliver in L1 down its column: its block is not capped
    assert gemm.block_sizes(6, 16, g, threads=2, reach=16 << 20) == gemm.block_sizes(6, 16, g, 2)


def test_the_timing_overrules_the_order_model_only_where_it_is_clear():
    """order_rule keeps the model's order unless the other was faster in every round but one
    at most; rounds missing or unequal leave the model's order."""
    fast, slow = [1.0] * 7, [1.1] * 7
    assert gemm.order_rule("columns", {"rows": fast, "columns": slow}) == "rows"
    assert gemm.order_rule("rows", {"rows": fast, "columns": slow}) == "rows"
    assert gemm.order_rule("rows", {"rows": slow, "columns": fast}) == "columns"
    six = [1.0] * 6 + [1.2]
    assert gemm.order_rule("columns", {"rows": six, "columns": slow}) == "rows"  # 6 of 7
    five = [1.0] * 5 + [1.2] * 2
    assert gemm.order_rule("columns", {"rows": five, "columns": slow}) == "columns"  # 5 of 7
    assert gemm.order_rule("columns", {"rows": fast[:6], "columns": slow}) == "columns"
    assert gemm.order_rule("columns", None) == gemm.order_rule("columns", {}) == "columns"


def test_the_timed_order_is_the_same_in_every_process(monkeypatch):
    """The two orders are timed once per machine and kernel source and kept: a process that
    loads the kernels again (here: the loaded set dropped) reads the same rounds and takes
    the same order, without timing; an emulated or lesser level is not timed."""
    if os.environ.get(gemm.ORDER_ENV):
        pytest.skip(f"${gemm.ORDER_ENV} forces the order")
    first = gemm.kernels(isa.best())
    if first.order_timed is None:
        pytest.skip("the best level here is emulated: its order is the model's")
    assert set(first.order_timed) >= {"rows", "columns", "n", "threads"}
    assert len(first.order_timed["rows"]) == len(first.order_timed["columns"]) == gemm.ORDER_ROUNDS
    monkeypatch.setattr(gemm, "_loaded", {})
    monkeypatch.setattr(gemm, "_time_orders", lambda *a: pytest.fail("timed again"))
    again = gemm.kernels(isa.best())
    assert again.order_timed == first.order_timed and again.order == first.order
    assert again.order == gemm.order_rule(again.order_model, again.order_timed)
    if isa.best() != "generic" and isa.supported("generic"):
        assert gemm.kernels("generic").order_timed is None  # not the best level: the model's


def test_default_blocks_come_from_this_machine(monkeypatch):
    mr, nr = gemm.kernel_shape()
    th = checks.threads(None)
    reach = gemm.feeds()["reach_bytes"]  # chapter 1's copy sweep, kept for this machine
    assert gemm.order_blocks("rows") == gemm.block_sizes(mr, nr, threads=th, rung5=True,
                                                         reach=reach)
    assert gemm.ladder_blocks() == gemm.block_sizes(mr, nr, threads=th, reach=reach)
    model = gemm.loop_order(mr, nr, gemm.feeds(), threads=th)[0]
    if not os.environ.get(gemm.ORDER_ENV):
        assert gemm.kernels().order_model == model
        assert gemm.default_order() == gemm.order_rule(model, gemm.kernels().order_timed)
    assert gemm.default_blocks() == gemm.order_blocks(gemm.default_order())
    assert gemm.default_config() == (gemm.ORDERS.index(gemm.default_order()),
                                     *gemm.default_blocks().values())


def test_feeds_are_measured_once_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("SMALLEM_CACHE", str(tmp_path))
    calls = []
    real = gemm.machine.measure_feeds
    monkeypatch.setattr(gemm.machine, "measure_feeds", lambda lvl: calls.append(lvl) or real(lvl))
    level = isa.best()
    gemm.machine._feeds.cache_clear()
    first = gemm.machine.feeds(level)
    gemm.machine._feeds.cache_clear()  # a new process: the file answers
    assert gemm.machine.feeds(level) == first and len(calls) == 1
    assert first["f32_gops_core"] > 0.1 and first["l3_gbs_core"] > 0.1
    (path,) = tmp_path.glob("feeds_*.json")
    path.write_text("{not json")  # a damaged file is measured again, not trusted
    gemm.machine._feeds.cache_clear()
    assert set(gemm.machine.feeds(level)) == set(first) and len(calls) == 2
    gemm.machine._feeds.cache_clear()


@pytest.mark.parametrize("order", gemm.ORDERS)
def test_both_orders_compute_every_product(order, level, rng):
    """The driver's two orders of the tiles, on awkward shapes, transposes, alpha and beta,
    1 to 3 threads, with blocks that make several blocks of A, B and K: against float64, and
    bit for bit against each other (each tile is summed the same way in either order)."""
    for M, N, K in [(1, 1, 1), (29, 37, 41), (97, 65, 130), (14, 200, 33), (300, 31, 70)]:
        for ta, tb in ((False, False), (True, False), (False, True)):
            a = rand(rng, *((K, M) if ta else (M, K)))
            b = rand(rng, *((N, K) if tb else (K, N)))
            c0 = rand(rng, M, N)
            for threads in (1, 3):
                got = {}
                for o in gemm.ORDERS:
                    out = c0.copy()
                    gemm.matmul(a, b, trans_a=ta, trans_b=tb, out=out, alpha=0.5, beta=2.0,
                                threads=threads, level=level,
                                blocks={"order": o, "mc": 28, "kc": 48, "nc": 64})
                    got[o] = out
                want = 0.5 * ref(a, b, ta, tb) + 2.0 * c0
                checks.assert_close(got[order], want.astype(np.float32), k=K,
                                    name=f"{order} {M}x{N}x{K} ta={ta} tb={tb}")
                assert np.array_equal(got["rows"], got["columns"])
    with pytest.raises(ValueError, match="order"):
        gemm.matmul(a, b, trans_a=ta, trans_b=tb, blocks={"order": "diagonal"})


def test_rung5_and_the_ladder_get_their_own_blocks(rng, monkeypatch, captured_machine):
    """run_rung hands rung 5 A's-sliver blocks (its tiles go along C's rows, whatever order the
    package's GEMM takes) and rungs 2-4 B's; matmul takes the order and blocks the model chose
    for the machine (on each captured machine: Zen 3's L3 cannot feed rung 5's order, so its
    matmul runs "columns" with rung 4's blocks)."""
    seen = {}
    ffi, lib, *rest = gemm.kernels()

    class Spy:
        def __getattr__(self, name):
            fn = getattr(lib, name)
            if not (name.endswith("_ex") or name == "gemm_f32"):
                return fn

            def call(*args):
                seen[name] = args[10:13] if name.endswith("_ex") else args[14:18]
                return fn(*args)
            return call

    monkeypatch.setitem(gemm._loaded, (isa.selected(), False), gemm.Kernels(ffi, Spy(), *rest))
    a = rng.standard_normal((37, 29), dtype=np.float32)
    b = rng.standard_normal((29, 41), dtype=np.float32)
    for rung in gemm.LADDER:
        checks.assert_close(rung(a, b), a.astype(np.float64) @ b, k=29, name=rung.label)
    gemm.matmul(a, b, threads=2)
    ladder, rows = gemm.ladder_blocks(), gemm.order_blocks("rows")
    for name in ("gemm_blocked_ex", "gemm_registers_ex", "gemm_packed_ex"):
        assert seen[name] == (ladder["mc"], ladder["kc"], ladder["nc"]), name
    assert seen["gemm_threads_ex"] == (rows["mc"], rows["kc"], rows["nc"])
    final = gemm.default_blocks()
    assert seen["gemm_f32"] == (gemm.ORDERS.index(gemm.default_order()),
                                final["mc"], final["kc"], final["nc"])
    mr, nr = gemm.kernel_shape()
    expected = gemm.loop_order(mr, nr, captured_machine.feeds,
                               gemm.cache_geometry(captured_machine.caches),
                               threads=captured_machine.cores)[0]
    assert gemm.default_order() == expected


# ---------------------------------------------------------------- every rung

@pytest.mark.parametrize("rung", gemm.LADDER, ids=lambda r: r.name)
def test_rung_against_numpy(rung, level, rng):
    shapes = SHAPES if rung.index else SHAPES[:6]
    for blocks in (None, SMALL_BLOCKS):
        for M, N, K in shapes:
            a, b = rand(rng, M, K), rand(rng, K, N)
            c = rung(a, b, threads=2, blocks=blocks)
            checks.assert_close(c, ref(a, b).astype(np.float32), k=K,
                                name=f"{rung.name} {M}x{N}x{K}")


@pytest.mark.parametrize("rung", gemm.LADDER[1:], ids=lambda r: r.name)
def test_rung_with_leading_dimensions_and_out(rung, rng):
    M, N, K = 23, 35, 19
    big_a, big_b = rand(rng, M + 3, K + 5), rand(rng, K, N + 9)
    a, b = big_a[1:M + 1, 2:K + 2], big_b[:, 4:N + 4]  # lda = K + 5, ldb = N + 9
    big_c = np.full((M, N + 7), 7.0, np.float32)
    out = big_c[:, 3:N + 3]
    got = rung(a, b, out, blocks=SMALL_BLOCKS)
    assert got is out
    checks.assert_close(out, ref(a, b).astype(np.float32), k=K)
    assert np.all(big_c[:, :3] == 7.0) and np.all(big_c[:, N + 3:] == 7.0)  # nothing outside


def test_every_rung_is_a_function_of_the_kernel():
    """Each rung calls its own C function (its places on the page, in the notebook and in
    the tests are walked for every ladder in test_ladders.py); only the last rung threads."""
    assert [r.threaded for r in gemm.LADDER] == [False] * (len(gemm.LADDER) - 1) + [True]
    lib = gemm.kernels().lib
    for r in gemm.LADDER:
        assert hasattr(lib, f"gemm_{r.name}") or hasattr(lib, f"gemm_{r.name}_ex"), r.name
        assert ch2.reading.snippet(r.name), f"no [start:{r.name}] section in gemm.c"


# ---------------------------------------------------------------- rung 5

THIN = [(1, 1, 1), (1, 300, 70), (3, 45, 200), (5, 7, 33)]  # fewer rows than one panel (MR >= 6)


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 5])
def test_rung5_on_every_isa_and_thread_count(threads, level, rng):
    """Rung 5 against numpy: awkward shapes, products thinner than one MR-row panel (their
    tiles are shared out along the columns), several K slices and blocks of columns, and
    1 to 5 threads, at times more than there are tiles (the rung then starts fewer)."""
    rung = gemm.LADDER[5]
    mr, nr = gemm.kernel_shape(level)
    for blocks in (None, SMALL_BLOCKS, {"mc": 2 * mr, "kc": 16, "nc": 2 * nr + 3}):
        for M, N, K in SHAPES + THIN:
            a, b = rand(rng, M, K), rand(rng, K, N)
            c = rung(a, b, threads=threads, blocks=blocks, level=level)
            checks.assert_close(c, ref(a, b).astype(np.float32), k=K,
                                name=f"rung 5 {M}x{N}x{K} {blocks}, {threads} threads")


@pytest.mark.parametrize("n", [1, 13, 64, 200, 333])
def test_rung5_and_matmul_give_the_same_bits(n, level, rng):
    """Rung 5 is the package's GEMM without transposes, alpha, beta or bf16: on a plain f32
    square product, with the same blocks and threads, both sum every tile in the same K
    slices with the same micro-kernel, so the bits agree, also where matmul packs all of
    B first (gemm_b_whole) and rung 5 one slice at a time."""
    lib = gemm.kernels(level).lib
    a, b = rand(rng, n, n), rand(rng, n, n)
    whole = set()
    for blocks in (None, {"mc": 28, "kc": 48, "nc": 96}, {"kc": 64, "nc": 4096}):
        mc, kc, nc = gemm._blocks(blocks, level)
        whole.add(bool(lib.gemm_b_whole(n, n, kc, nc)))
        for threads in (1, 2, 3):
            got = gemm.LADDER[5](a, b, threads=threads, blocks=blocks, level=level)
            want = gemm.matmul(a, b, threads=threads, blocks=dict(blocks or {}, order="rows"),
                               level=level)
            assert np.array_equal(got, want), f"{n}^3, blocks {blocks}, {threads} threads"
    assert whole == ({False, True} if n >= 200 else {False})  # kc = 64 < n: all of B fits


def test_rung5_is_a_page_of_diff_from_rung4(records_tmp):
    """The chapter shows rung 5 as its difference from rung 4, as it shows every step; the
    package's generalisations live in gemm/driver.c so that this stays short enough to read."""
    assert ch2.reading.RUNG_SECTIONS[-2:] == [r.name for r in gemm.LADDER[-2:]]
    paths = {p.name: p for p in ch2.reading.write_rung_diffs()}
    lines = paths["ch2_diff_packed_threads.md"].read_text().splitlines()
    assert lines[0] == "```diff" and lines[-1] == "```"
    diff = lines[1:-1]
    assert any(x.startswith("-void gemm_packed_ex(") for x in diff)
    assert any(x.startswith("+void gemm_threads_ex(") for x in diff)
    assert len(diff) < 60, f"rung 4 -> 5 is {len(diff)} lines of diff"


# ---------------------------------------------------------------- the package's GEMM

@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_transposes(ta, tb, level, rng):
    for blocks in (None, SMALL_BLOCKS):
        for M, N, K in SHAPES:
            a = rand(rng, *((K, M) if ta else (M, K)))
            b = rand(rng, *((N, K) if tb else (K, N)))
            c = gemm.matmul(a, b, trans_a=ta, trans_b=tb, blocks=blocks, threads=2)
            checks.assert_close(c, ref(a, b, ta, tb).astype(np.float32), k=K,
                                name=f"ta={ta} tb={tb} {M}x{N}x{K}")


@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 1.0), (-2.0, 0.25), (0.0, 3.0)])
def test_matmul_alpha_beta(alpha, beta, rng):
    for blocks in (None, SMALL_BLOCKS):
        M, N, K = 29, 37, 43
        a, b = rand(rng, M, K), rand(rng, K, N)
        c0 = rand(rng, M, N)
        out = c0.copy()
        got = gemm.matmul(a, b, out=out, alpha=alpha, beta=beta, blocks=blocks)
        assert got is out
        checks.assert_close(out, (alpha * ref(a, b) + beta * c0).astype(np.float32), k=K)


def test_beta_zero_ignores_nan_in_out(rng):
    a, b = rand(rng, 9, 10), rand(rng, 10, 11)
    out = np.full((9, 11), np.nan, np.float32)
    gemm.matmul(a, b, out=out)
    checks.assert_close(out, ref(a, b).astype(np.float32), k=10)


def test_gradient_accumulation_pattern(rng):
    """dW += x^T dY over several micro-batches, in place, as the trainer does."""
    x, dy = rand(rng, 64, 24), rand(rng, 64, 40)
    dw = np.zeros((24, 40), np.float32)
    for part in range(4):
        s = slice(16 * part, 16 * (part + 1))
        gemm.matmul(x[s], dy[s], trans_a=True, out=dw, beta=1.0)
    checks.assert_close(dw, ref(x, dy, ta=True).astype(np.float32), k=64)


def test_matmul_leading_dimensions_with_transposes(rng):
    M, N, K = 14, 22, 31
    big_a, big_b = rand(rng, K + 2, M + 6), rand(rng, N + 1, K + 3)
    a, b = big_a[2:, 3:M + 3], big_b[1:, :K]  # op(a) = a^T, op(b) = b^T; both row-strided
    out = np.zeros((M, N + 4), np.float32)[:, 2:N + 2]
    gemm.matmul(a, b, trans_a=True, trans_b=True, out=out, blocks=SMALL_BLOCKS)
    checks.assert_close(out, ref(a, b, True, True).astype(np.float32), k=K)


def test_matmul_random_shapes_and_blocks(rng):
    for _ in range(25):
        M, N, K = (int(x) for x in rng.integers(1, 90, size=3))
        mr, nr = gemm.kernel_shape()
        blocks = {"mc": int(rng.integers(1, 4 * mr)), "kc": int(rng.integers(1, 70)),
                  "nc": int(rng.integers(1, 4 * nr))}
        ta, tb = bool(rng.integers(2)), bool(rng.integers(2))
        a = rand(rng, *((K, M) if ta else (M, K)))
        b = rand(rng, *((N, K) if tb else (K, N)))
        threads = int(rng.integers(1, 6))  # up to more threads than tiles: rung 5 caps them
        c = gemm.matmul(a, b, trans_a=ta, trans_b=tb, blocks=blocks, threads=threads)
        checks.assert_close(c, ref(a, b, ta, tb).astype(np.float32), k=K,
                            name=f"{M}x{N}x{K} ta={ta} tb={tb} {blocks}")


def test_rung5_packs_all_of_b_when_it_fits(rng, level):
    """Both ways of rung 5: all of B packed first (it fits in half its L3 share), and
    one K slice at a time; primes, several slices, alpha/beta, transposes, 1-3 threads."""
    lib = gemm.kernels(level).lib
    blocks = {"mc": 37, "kc": 16, "nc": 512}
    cases = [(23, 37, 61, False, False, 1), (41, 70, 53, True, False, 2),
             (5, 33, 97, False, True, 3), (29, 64, 47, True, True, 2)]
    seen = set()
    for M, N, K, ta, tb, threads in cases:
        for nc in (blocks["nc"], 64):  # 512: all of B fits; 64: it does not
            whole = bool(lib.gemm_b_whole(N, K, blocks["kc"], nc))
            seen.add(whole)
            a = rand(rng, *((K, M) if ta else (M, K)))
            b = rand(rng, *((N, K) if tb else (K, N)))
            c0 = rand(rng, M, N)
            c = gemm.matmul(a, b, trans_a=ta, trans_b=tb, out=c0.copy(), alpha=0.5, beta=-2.0,
                            blocks={**blocks, "nc": nc}, threads=threads, level=level)
            want = 0.5 * ref(a, b, ta, tb) - 2.0 * c0
            checks.assert_close(c, want.astype(np.float32), k=K,
                                name=f"{M}x{N}x{K} ta={ta} tb={tb} nc={nc} whole={whole}")
            ha, hb = gemm.f32_to_bf16(a), gemm.f32_to_bf16(b)  # bf16 packs into the same blocks
            want = 0.5 * ref(gemm.bf16_to_f32(ha), gemm.bf16_to_f32(hb), ta, tb) - 2.0 * c0
            for path in gemm.bf16_paths(level):
                c = gemm.matmul_bf16(ha, hb, trans_a=ta, trans_b=tb, out=c0.copy(), alpha=0.5,
                                     beta=-2.0, blocks={**blocks, "nc": nc}, threads=threads,
                                     level=level, path=path)
                checks.assert_close(c, want.astype(np.float32), k=K,
                                    name=f"bf16 {path} {M}x{N}x{K} nc={nc} whole={whole}")
    assert seen == {True, False}  # both paths ran


def test_whole_b_is_measured_where_it_applies_and_said_from_the_record(rng):
    lib = gemm.kernels().lib
    blocks = {"mc": 28, "kc": 16, "nc": 512}
    shapes = [dict(label="one slice (a)", M=40, K=16, N=24, ta=False, tb=False),
              dict(label="fits (b)", M=40, K=100, N=24, ta=False, tb=False)]
    rec = records.Record("t.gemm", settings={}, machine={"cpu": "test"})
    assert ch2.reading.whole_b_values(rec.data)["ch2.whole_b_vs"] is None  # the page drops it
    ch2.measuring._measure_whole_b(rec, lib, shapes[:1], blocks, 2, True, rng)  # K = kc: one slice
    assert not records.results(rec.data, "whole_b")
    ch2.measuring._measure_whole_b(rec, lib, shapes, blocks, 2, True, rng)
    got = {r["params"]["b"]: r for r in records.results(rec.data, "whole_b")}
    assert set(got) == {"whole", "slices"} and got["whole"]["params"]["label"] == "fits (b)"
    v = ch2.reading.whole_b_values(rec.data)
    ratio = got["whole"]["value"]["median"] / got["slices"]["value"]["median"]
    assert v["ch2.whole_b_label"] == "fits" and v["ch2.whole_b_slices"] == "7"
    # the medians' ratio as the page words it (a factor past twice the speed or half of it)
    told = compare.amount(100 * (ratio - 1)).split(" % ")[0].split("×")[0]
    assert told in v["ch2.whole_b_vs"] or v["ch2.whole_b_vs"] == "as fast"
    assert v["ch2.whole_b_vs"] == "as fast" or "of 3 rounds" in v["ch2.whole_b_vs"]


def test_out_may_share_a_buffer_with_the_inputs_without_overlapping(rng):
    buf = rand(rng, 20, 30)
    a, out = buf[:, :10], buf[:, 10:22]  # interleaved rows of one buffer, no shared element
    b = rand(rng, 10, 12)
    want = ref(a, b).astype(np.float32)
    gemm.matmul(a, b, out=out)
    checks.assert_close(buf[:, 10:22], want, k=10)


def test_empty_dimensions(rng):
    assert gemm.matmul(np.zeros((0, 3), np.float32), rand(rng, 3, 4)).shape == (0, 4)
    out = np.ones((2, 4), np.float32)
    gemm.matmul(np.zeros((2, 0), np.float32), np.zeros((0, 4), np.float32), out=out, beta=2.0)
    assert np.all(out == 2.0)


@pytest.mark.parametrize("m, k, n", [(300, 1000, 190),  # K: several K_C slices
                                     (3, 700, 200)])     # thinner than a panel: split by columns
def test_results_are_bitwise_repeatable(rng, m, k, n):
    a, b = rand(rng, m, k), rand(rng, k, n)
    one = gemm.matmul(a, b, threads=1)
    for threads in (1, 2, 3):
        first = gemm.matmul(a, b, threads=threads)
        for _ in range(3):
            assert np.array_equal(gemm.matmul(a, b, threads=threads), first)
        # whichever thread takes a tile sums it in the same order
        assert np.array_equal(first, one)


@pytest.mark.parametrize("m, k, n, ta, tb, threads", [(1, 1, 1, False, False, 1),
                                                    (37, 1031, 101, True, False, 2),
                                                    (131, 67, 257, False, True, 3)])
def test_phase_times_computes_the_product_and_times_each_thread(rng, m, k, n, ta, tb, threads):
    a = rand(rng, k, m) if ta else rand(rng, m, k)
    b = rand(rng, n, k) if tb else rand(rng, k, n)
    out = np.full((m, n), np.nan, np.float32)
    got = gemm.phase_times(a, b, trans_a=ta, trans_b=tb, out=out, threads=threads,
                           blocks={"kc": 256})
    # the same driver, blocks and threads as matmul: the same sums in the same order
    want = gemm.matmul(a, b, trans_a=ta, trans_b=tb, threads=threads, blocks={"kc": 256})
    checks.assert_close(out, ref(a, b, ta, tb).astype(np.float32), k=k, name="phase_times")
    assert np.array_equal(out, want)
    assert 1 <= len(got["threads"]) <= threads
    for row in got["threads"]:
        assert set(row) == set(gemm.PHASES) and min(row.values()) >= 0
        assert 0 < sum(row.values()) <= got["wall"]  # laps inside the call, timed around it
    assert max(row["pack B"] for row in got["threads"]) > 0
    if m * n * k > 10**6:  # warm, a product of ~0.1 ms spends most of its call in phases
        best = max(max(sum(r.values()) for r in g["threads"]) / g["wall"] for g in
                   (gemm.phase_times(a, b, trans_a=ta, trans_b=tb, out=out, threads=threads,
                                     blocks={"kc": 256}) for _ in range(5)))
        assert best > 0.2
    with pytest.raises(TypeError, match="a: expected dtype float32"):
        gemm.phase_times(a.astype(np.float64), b, trans_a=ta, trans_b=tb)


def test_phase_times_on_every_isa(rng, level):
    a, b = rand(rng, 700, 29), rand(rng, 700, 67)  # K: three slices of 256; A transposed
    out = np.empty((29, 67), np.float32)
    got = gemm.phase_times(a, b, trans_a=True, out=out, threads=2, blocks={"kc": 256},
                           level=level)
    checks.assert_close(out, ref(a, b, True, False).astype(np.float32), k=700, name=level)
    assert got["threads"] and all(0 < sum(r.values()) <= got["wall"] for r in got["threads"])


def test_phases_are_measured_per_model_product_and_said_from_the_record(rng):
    shapes = [dict(label="wide (a)", M=64, K=40, N=48, ta=False, tb=False),
              dict(label="thin (b)", M=3, K=900, N=200, ta=True, tb=False)]
    rec = records.Record("t.gemm", settings={}, machine={"cpu": "test"})
    assert ch2.reading.phase_rows(rec.data)[1]["ch2.phase_most"].startswith("n/a")
    for sh in shapes:
        a = rand(rng, sh["K"], sh["M"]) if sh["ta"] else rand(rng, sh["M"], sh["K"])
        b = rand(rng, sh["K"], sh["N"])
        c = np.empty((sh["M"], sh["N"]), np.float32)
        params = dict(label=sh["label"], M=sh["M"], N=sh["N"], K=sh["K"], trans_a=sh["ta"],
                      trans_b=sh["tb"], threads=2)
        for impl in ("smallem", "numpy"):  # the comparison the table rows follow
            rec.add("shape", "Gop/s", {"median": 1.0, "min": 1.0, "max": 1.0, "n": 1},
                    impl=impl, **params)
        ch2.measuring._measure_phases(rec, a, b, c, params, quick=True)
    found = records.results(rec.data, "phase", label="thin (b)")
    assert {r["params"]["phase"] for r in found} == {*gemm.PHASES, "wall"}
    assert all(r["value"]["n"] == 2 for r in found)
    rows, v = ch2.reading.phase_rows(rec.data)
    assert [r[0] for r in rows] == ["wide", "thin"]
    for row in rows:  # the four shares are of the same time: they add up to 100 %
        assert sum(float(x.split()[0]) for x in row[4:]) == pytest.approx(100, abs=0.3)
    share = {r[0]: r[4] for r in rows}
    assert v["ch2.phase_most"] in share and v["ch2.phase_most_pct"] == share[v["ch2.phase_most"]]
    assert v["ch2.phase_least_pct"] == share[v["ch2.phase_least"]]
    assert v["ch2.phase_most_m"] == str(next(s["M"] for s in shapes
                                             if s["label"].startswith(v["ch2.phase_most"])))
    pack_a = {r[0]: float(r[5].split()[0]) for r in rows}
    assert v["ch2.phase_a_narrow_pct"] == pytest.approx(pack_a[v["ch2.phase_a_narrow"]] / 100,
                                                        abs=5e-4)
    n_of = {s["label"].split(" (")[0]: s["N"] for s in shapes}
    # the odd one out: the largest share x N, where the 1/N sentence does not already name it
    odd = max(pack_a, key=lambda k: pack_a[k] * n_of[k])
    assert v["ch2.phase_a_odd"] in (None, odd)
    if v["ch2.phase_a_odd"]:
        assert v["ch2.phase_a_odd"] not in (v["ch2.phase_a_narrow"], v["ch2.phase_a_wide"])


@pytest.mark.parametrize("kc, slivers, threads, shared", [(1, 1, 1, True), (13, 3, 3, True),
                                                          (301, 2, 2, False), (7, 5, 4, False)])
def test_kernel_alone_sums_each_threads_tiles(level, kc, slivers, threads, shared):
    run, gop, d = gemm.kernel_alone(kc, slivers, reps=3, threads=threads, shared_b=shared,
                                    level=level, seed=kc)
    mr, nr = gemm.kernel_shape(level)
    assert d["a"].shape == (threads, kc, mr) and d["c"].shape == (threads, mr, slivers * nr)
    assert d["b"].shape == ((1 if shared else threads), slivers, kc, nr)
    assert gop == pytest.approx(2 * mr * nr * kc * slivers * 3 * threads / 1e9)
    a, b = d["a"].astype(np.float64), d["b"].astype(np.float64)
    ref = np.stack([3 * np.concatenate([a[t].T @ b[0 if shared else t, j] for j in range(slivers)],
                                       axis=1) for t in range(threads)])
    run()
    checks.assert_close(d["c"], ref.astype(np.float32), k=3 * kc, name=level)
    run()  # a second call adds the same again
    checks.assert_close(d["c"], (2 * ref).astype(np.float32), k=6 * kc, name=level)


def test_kernel_alone_refuses_bad_sizes():
    with pytest.raises(ValueError, match="kc"):
        gemm.kernel_alone(0, 1)
    with pytest.raises(TypeError, match="slivers"):
        gemm.kernel_alone(8, 2.0)
    with pytest.raises(ValueError, match="threads"):
        gemm.kernel_alone(8, 2, threads=-1)


def test_alone_slivers_put_b_in_half_the_l2_and_well_beyond_it():
    geo = {"L1d": {"bytes": 48 << 10, "ways": 12, "line": 64},
           "L2": {"bytes": 1 << 20, "ways": 16, "line": 64},
           "L3": {"bytes": 32 << 20, "ways": 16, "line": 64}}
    got = ch2.measuring.alone_slivers(804, 32, geo)
    sliver = 804 * 32 * 4
    assert got["L2"] * sliver <= (1 << 19) < (got["L2"] + 1) * sliver
    assert got["L3"] * sliver <= (8 << 20) < (got["L3"] + 1) * sliver
    assert ch2.measuring.alone_slivers(100_000, 32, geo) == {"L2": 1, "L3": 2}  # never empty
    small = {**geo, "L2": {**geo["L2"], "bytes": 1280 << 10}, "L3": {**geo["L3"], "bytes": 4 << 20}}
    got = ch2.measuring.alone_slivers(804, 32, small)  # a quarter of this L3 fits in an L2: half of it
    assert got["L3"] * sliver <= (2 << 20) < (got["L3"] + 1) * sliver
    # a socket's L3 reported to a guest that reaches a part of it: half of what it reaches
    big = {**geo, "L3": {**geo["L3"], "bytes": 300 << 20}}
    got = ch2.measuring.alone_slivers(804, 32, big, reach=64 << 20)
    assert got["L3"] * sliver <= (32 << 20) < (got["L3"] + 1) * sliver
    assert ch2.measuring.alone_slivers(804, 32, geo, reach=64 << 20) == ch2.measuring.alone_slivers(804, 32, geo)


def _timed(gops, secs):
    """A result as _compare records it: the median rate, and every sample's seconds."""
    s = sorted(secs)
    return {"value": {"median": gops}, "seconds": {"median": s[len(s) // 2], "samples": secs}}


def test_versus_says_how_much_and_whether_the_rounds_tell():
    base = _timed(100.0, [1.0] * 15)
    clear = _timed(95.0, [1.0 / 0.95] * 15)  # slower in every round
    said = compare.versus(clear, base)
    assert said.startswith("5.0 % slower" + compare.NOTE_OPEN) and "in 0 of 15 rounds" in said
    mixed = _timed(101.0, [0.99] * 8 + [1.01] * 7)  # faster in 8 rounds, slower in 7
    said = compare.versus(mixed, base)
    assert said.startswith("within the noise (median 1.0 % faster)" + compare.NOTE_OPEN)
    assert "faster in 8 of 15 rounds" in said
    # different work per call: rates, not seconds, are compared round by round
    double = _timed(110.0, [2 / 1.1] * 15)  # twice the work, more seconds, a higher rate
    assert compare.versus(double, base).startswith("10.0 % faster" + compare.NOTE_OPEN)
    assert compare.versus(_timed(100.0, [1.0] * 15), base) == "as fast"


def test_alone_is_measured_and_said_from_the_record(monkeypatch, captured_machine):
    monkeypatch.setenv("SMALLEM_QUICK", "1")
    rec = records.Record("t.gemm", settings={}, machine={"cpu": "test"})
    ch2.measuring._measure_alone(rec, None, 2, quick=True)
    found = records.results(rec.data, "alone")
    assert sorted((r["params"]["threads"], r["params"]["b_in"], r["params"]["shared_b"])
                  for r in found) == [(1, "L2", True), (1, "L3", True), (2, "L2", True),
                                      (2, "L3", False), (2, "L3", True)]
    assert len(records.results(rec.data, "alone_probe")) == 2
    rows, v, kc = ch2.alone_rows(rec.data)
    assert kc == gemm.order_blocks("rows")["kc"]  # rung 5's KC, whatever order matmul takes
    assert len(rows) == 5 and v["ch2.alone_threads"] == "2"
    one_l2 = records.value(rec.data, "alone", threads=1, b_in="L2")
    probe = records.value(rec.data, "alone_probe", threads=1)
    assert v["ch2.alone_pct_one"] == f"{100 * one_l2 / probe:.0f} %" == rows[0][-1]
    assert v["ch2.tiles_range"].startswith("n/a")  # no phase results in this record
    l3 = records.results(rec.data, "alone", threads=1, b_in="L3")[0]["params"]["b_kib"] * 1024
    assert v["ch2.alone_l3_per_l2"] == figures.fmt(l3 / gemm.cache_geometry()["L2"]["bytes"])
    for key in ("ch2.alone_l3_one", "ch2.alone_l3_shared", "ch2.alone_l3_own"):
        assert v[key] == "as fast" or " % " in v[key] or "\u00d7" in v[key], v[key]
    one = ch2.alone_rows({**rec.data, "results": [r for r in rec.data["results"]
                                                   if r["params"].get("threads") == 1]})[1]
    assert one["ch2.alone_l3_shared"].startswith("n/a") and one["ch2.alone_pct_one"] != "n/a"


def test_packing_buffer_is_reused_and_no_result_is_allocated(rng):
    a, b = rand(rng, 100, 80), rand(rng, 80, 60)
    out = np.empty((100, 60), np.float32)
    gemm.matmul(a, b, out=out)
    key = (gemm.isa.selected(), id(gemm.kernels()[0]))  # the buffer's level and ffi
    buf = gemm._work.bufs[key]
    for _ in range(5):
        assert gemm.matmul(a, b, out=out, beta=0.0) is out
    assert gemm._work.bufs[key] is buf


def test_concurrent_calls_from_python_threads(rng):
    pairs = [(rand(rng, 70 + i, 50), rand(rng, 50, 40 + i)) for i in range(4)]
    errors = []

    def work(a, b):
        try:
            for _ in range(10):
                got = gemm.matmul(a, b, threads=2)
                checks.assert_close(got, ref(a, b).astype(np.float32), k=50)
        except AssertionError as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=p) for p in pairs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]


def test_public_export_is_lazy():
    code = ("import sys, smallem; assert 'smallem.product.gemm' not in sys.modules; "
            "f = smallem.matmul; assert 'smallem.product.gemm' in sys.modules; "
            # found once, then a plain module attribute: no import machinery on every call
            "assert vars(smallem)['matmul'] is f is smallem.product.gemm.matmul; print(f.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "matmul"


# ---------------------------------------------------------------- errors

def test_wrong_inputs_raise_clear_errors(rng):
    a, b = rand(rng, 4, 5), rand(rng, 5, 6)
    with pytest.raises(TypeError, match="a: expected dtype float32"):
        gemm.matmul(a.astype(np.float64), b)
    with pytest.raises(TypeError, match="b: expected a numpy.ndarray"):
        gemm.matmul(a, b.tolist())
    with pytest.raises(ValueError, match="b: the elements of a row are not adjacent"):
        gemm.matmul(a, rand(rng, 5, 12)[:, ::2])
    with pytest.raises(ValueError, match="trans_a"):
        gemm.matmul(rand(rng, 5, 4).T, b)  # a transposed view: say trans_a
    with pytest.raises(ValueError, match="2-D"):
        gemm.matmul(a[0], b)
    with pytest.raises(ValueError, match="inner dimensions"):
        gemm.matmul(a, rand(rng, 4, 6))
    with pytest.raises(ValueError, match="out: expected shape"):
        gemm.matmul(a, b, out=np.empty((4, 5), np.float32))
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        gemm.matmul(a, b, out=np.empty((4, 6), np.float64))
    with pytest.raises(ValueError, match="beta != 0 needs out"):
        gemm.matmul(a, b, beta=1.0)
    ro = np.empty((4, 6), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        gemm.matmul(a, b, out=ro)
    sq = rand(rng, 5, 5)
    with pytest.raises(ValueError, match="overlaps"):
        gemm.matmul(sq, sq, out=sq)
    with pytest.raises(TypeError, match="alpha"):
        gemm.matmul(a, b, alpha="2")
    with pytest.raises(ValueError, match="threads"):
        gemm.matmul(a, b, threads=0)
    with pytest.raises(ValueError, match="kc"):
        gemm.matmul(a, b, blocks={"kc": 0})
    with pytest.raises(ValueError, match="unknown keys"):
        gemm.matmul(a, b, blocks={"KC": 8})
    with pytest.raises(TypeError, match="uint16"):
        gemm.matmul_bf16(a, b)
    for rung in gemm.LADDER:
        with pytest.raises(TypeError):
            rung(a.astype(np.float64), b)
        with pytest.raises(ValueError):
            rung(a, rand(rng, 6, 5))


# ---------------------------------------------------------------- bf16

def test_bf16_rounding_is_nearest_even():
    f = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-8 + 2**-20, -2.5, 3.4e38,
                  np.inf, -np.inf, 0.0, -0.0], np.float32)
    h = gemm.f32_to_bf16(f)
    back = gemm.bf16_to_f32(h)
    # ties: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> even (1.0); 1 + 3*2^-8 -> 1 + 2^-6
    assert back[0] == 1.0 and back[1] == 1.0 and back[2] == 1.0 + 2**-6
    assert back[3] == 1.0 + 2**-7  # just above the tie rounds up
    assert back[4] == -2.5 and np.isinf(back[5])  # 3.4e38 rounds past the largest bf16
    assert np.isposinf(back[6]) and np.isneginf(back[7])
    assert h[8] == 0 and h[9] == 0x8000
    nan = gemm.bf16_to_f32(gemm.f32_to_bf16(np.array([np.nan, -np.nan], np.float32)))
    assert np.all(np.isnan(nan))


def test_bf16_round_trip_is_exact_for_bf16_values(rng):
    h = rng.integers(0, 0x7F80, size=1000, dtype=np.uint16)  # finite positives
    assert np.array_equal(gemm.f32_to_bf16(gemm.bf16_to_f32(h)), h)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_bf16(ta, tb, level, rng):
    # every path this level has; the last shape has several whole micro-panels of A and B
    # at every level, and odd K
    paths = gemm.bf16_paths(level)
    exts = isa.extensions(level) if level == "avx512" else ()
    assert gemm.native_bf16(level) == ("avx512_bf16" in exts)
    assert ("amx" in paths) <= ("amx_bf16" in exts)
    if isa.emulating(level):
        assert paths == ["widen", "native", "amx"]
    elif "amx_bf16" in exts:  # Linux refuses the tiles to a process whose sigaltstack is too small
        assert "amx" in paths, "this CPU has AMX_BF16 but Linux refused the tile state"
    # AMX blocks are 32 x 32 with k in steps of 32: 33 x 65 x 70 crosses each edge
    # the AMX path with each epilogue; SMALL_BLOCKS cut K and N into several slices (the
    # streamed stores only on the last), and C 64-byte aligned or not
    runs = [(p, b, e) for p, b in itertools.product(paths, (None, SMALL_BLOCKS))
            for e in (gemm.AMX_EPILOGUES if p == "amx" else (None,))]
    for path, blocks, epilogue in runs:
        for M, N, K in SHAPES + [(45, 70, 37), (33, 65, 70), (35, 96, 70)]:
            a = gemm.f32_to_bf16(rand(rng, *((K, M) if ta else (M, K))))
            b = gemm.f32_to_bf16(rand(rng, *((N, K) if tb else (K, N))))
            c0 = rand(rng, M, N)
            out = gemm.empty_aligned((M, N)) if M % 2 else np.empty((M, N), np.float32)
            out[...] = c0
            gemm.matmul_bf16(a, b, trans_a=ta, trans_b=tb, out=out, alpha=0.5, beta=2.0,
                             blocks=blocks, path=path, epilogue=epilogue)
            want = 0.5 * ref(gemm.bf16_to_f32(a), gemm.bf16_to_f32(b), ta, tb) + 2.0 * c0
            checks.assert_close(out, want.astype(np.float32), k=K,
                                name=f"bf16 {path} {epilogue} {M}x{N}x{K}")
            if path == "amx":  # beta 0, C made by the package (aligned): stored, not added
                got = gemm.matmul_bf16(a, b, trans_a=ta, trans_b=tb, blocks=blocks, path=path,
                                       epilogue=epilogue)
                checks.assert_close(got, (want - 2.0 * c0).astype(np.float32) * 2, k=K,
                                    name=f"bf16 amx {epilogue} beta 0 {M}x{N}x{K}")


@pytest.mark.parametrize("ta", [False, True])
def test_matmul_bf16_tiles_through_the_emulator_where_avx512_has_no_amx(ta, rng, monkeypatch,
                                                                        amx_emulated):
    """The AMX path on a CPU with AVX-512 but no AMX_BF16 (a Zen 4 or 5), which the level
    fixture runs natively and so never on tiles: built through SIMDe with emulate.h's tiles,
    every epilogue, whole and sliced blocks, shapes across each edge of the 32 x 32 tiles."""
    # gemm keeps one build a level for the process: this test's own, put back after it
    monkeypatch.setattr(gemm, "_loaded", {})
    monkeypatch.setattr(gemm, "_bf16_paths",
                        functools.lru_cache(maxsize=None)(gemm._bf16_paths.__wrapped__))
    assert "amx" in gemm.bf16_paths("avx512")
    for epilogue, blocks in itertools.product(gemm.AMX_EPILOGUES, (None, SMALL_BLOCKS)):
        for M, N, K in [(33, 65, 70), (45, 70, 37), (1, 1, 1)]:
            a = gemm.f32_to_bf16(rand(rng, *((K, M) if ta else (M, K))))
            b = gemm.f32_to_bf16(rand(rng, K, N))
            got = gemm.matmul_bf16(a, b, trans_a=ta, blocks=blocks, path="amx", epilogue=epilogue)
            want = ref(gemm.bf16_to_f32(a), gemm.bf16_to_f32(b), ta, False)
            checks.assert_close(got, want.astype(np.float32), k=K,
                                name=f"bf16 amx emulated {epilogue} {M}x{N}x{K}")


def test_amx_entry_points_at_every_level(level):
    """gemm_amx_alone computes what it counts where the build has AMX and Linux grants the
    tiles (the emulator included), and both AMX entry points answer -1, leaving C as it
    was, where not; the Python side then says so in one line."""
    ffi, lib = gemm.kernels(level).ffi, gemm.kernels(level).lib
    if gemm.amx_bf16(level):
        run, gop, d = gemm.amx_alone(96, 3, reps=2, threads=2, level=level)
        d["c"][...] = 0
        assert run() == 0
        a = gemm.bf16_to_f32(d["a"]).astype(np.float64)  # (threads, 32, kp)
        b = gemm.bf16_to_f32(d["b"]).astype(np.float64)  # (panels, kp / 2, 32, 2): k in pairs
        b = b.transpose(0, 1, 3, 2).reshape(3, 96, 32)
        want = np.einsum("tik,pkj->tpij", a, b)
        checks.assert_close(d["c"], want.astype(np.float32), k=96, name="amx_alone")
        assert gop == pytest.approx(2 * 32 * 32 * 96 * 3 * 2 * 2 / 1e9)
        with pytest.raises(ValueError, match="multiple of 32"):
            gemm.amx_alone(100, 1, level=level)
        return
    with pytest.raises(RuntimeError, match="no AMX tiles"):
        gemm.amx_alone(64, 1, level=level)
    a, c = np.zeros((32, 32), np.uint16), np.full((32, 32), 7.0, np.float32)
    work = np.zeros(int(lib.gemm_work_floats(32, 32, 32, 32, 32, 1)), np.float32)
    p = (ffi.from_buffer("uint16_t[]", a),)
    got = lib.gemm_bf16_amx(0, 0, 32, 32, 32, 1.0, p[0], 32, p[0], 32, 0.0,
                            ffi.from_buffer("float[]", c), 32, 1, 32, 32, 0,
                            ffi.from_buffer("float[]", work))
    assert got == -1 and (c == 7.0).all()


def test_bf16_path_choice(level, monkeypatch):
    monkeypatch.delenv(gemm.BF16_ENV, raising=False)
    if gemm.amx_bf16(level):  # where the tiles are, no probe is needed
        assert gemm.bf16_path(level) == "amx"
        monkeypatch.setenv(gemm.BF16_ENV, "native")
        assert gemm.bf16_path(level) == "native"
        return
    if not gemm.native_bf16(level):
        assert gemm.bf16_path(level) == "widen"
        with pytest.raises(ValueError, match="needs AVX512_BF16"):
            gemm.matmul_bf16(np.zeros((2, 2), np.uint16), np.zeros((2, 2), np.uint16),
                             path="native")
        monkeypatch.setenv(gemm.BF16_ENV, "native")
        with pytest.raises(ValueError, match="SMALLEM_BF16"):
            gemm.bf16_path(level)
        return
    if not isa.emulating(level):  # the probes decide: the faster one per core
        rates = {"f32_gops_core": 100.0, "bf16_gops_core": 50.0}
        monkeypatch.setattr(gemm, "feeds", lambda lvl: rates)
        assert gemm.bf16_path(level) == "widen"
        rates["bf16_gops_core"] = 200.0
        assert gemm.bf16_path(level) == "native"
    monkeypatch.setenv(gemm.BF16_ENV, "widen")
    assert gemm.bf16_path(level) == "widen"


def test_bf16_path_validation(monkeypatch):
    a = np.zeros((2, 2), np.uint16)
    with pytest.raises(ValueError, match="path: expected one of"):
        gemm.matmul_bf16(a, a, path="fast")
    with pytest.raises(ValueError, match="only the AMX path takes one"):
        gemm.matmul_bf16(a, a, path="widen", epilogue="stream")
    if "amx" in gemm.bf16_paths():
        with pytest.raises(ValueError, match="epilogue: expected one of"):
            gemm.matmul_bf16(a, a, path="amx", epilogue="fast")
    monkeypatch.setenv(gemm.BF16_ENV, "quick")
    with pytest.raises(ValueError, match="SMALLEM_BF16='quick'"):
        gemm.matmul_bf16(a, a)


def test_empty_aligned_starts_on_a_line():
    for shape in ((1, 1), (3, 5), (100, 70), (2048, 3072)):
        x = gemm.empty_aligned(shape)
        assert x.shape == shape and x.dtype == np.float32 and x.flags.c_contiguous
        assert x.ctypes.data % 64 == 0


# ---------------------------------------------------------------- pool, benchmark, figures

def test_openmp_pool_is_persistent(level):
    ids = [gemm.pool_ids(2, level) for _ in range(3)]
    assert ids[0] == ids[1] == ids[2] and len(ids[0]) == 2


def test_fork_join_timers_run(level):
    # chapter 2's "thread pool" rows time these two; here they only have to return
    import time

    ffi, lib, *_ = gemm.kernels(level)
    t = time.perf_counter()
    lib.gemm_empty_regions(20, 2)
    lib.gemm_spawn_join(2, 2)
    assert time.perf_counter() - t < 10


@pytest.mark.slow  # a few seconds on an idle machine, more when the cores are shared
def test_quick_benchmark_writes_record_and_figures(records_tmp, monkeypatch, tmp_path):
    monkeypatch.setenv("SMALLEM_QUICK", "1")
    rec = ch2.run(quick=True, progress=False)
    rec.save()
    values = ch2.report(records_tmp)
    for key in ("ch2.final_gops", "ch2.naive_gops", "ch2.one_core_gops", "ch2.peak", "ch2.kc",
                "ch2.pool_same", "ch2.bf16_chosen", "ch2.sweep_ratio_1024", "ch2.kc_best",
                "ch2.call_us", "ch2.numpy_call_us", "ch2.smallest_us", "ch2.beside_pct", "ch2.thread_min_us",
                "ch2.rung2_verdict", "ch2.phase_most", "ch2.phase_least_pct",
                "ch2.alone_pct_all", "ch2.alone_l3_shared", "ch2.tiles_range"):
        assert key in values, key
    figs = tmp_path / "figures"
    for name in ("ch2_ladder.svg", "ch2_sweep.svg", "ch2_roofline.svg", "tables/ch2_ladder.md",
                 "tables/ch2_shapes.md", "tables/ch2_bf16.md", "tables/ch2_sweep.md",
                 "tables/ch2_phases.md", "tables/ch2_alone.md"):
        assert (figs / name).is_file(), name
    data = records.load(ch2.RECORD, records_tmp)
    assert len(records.results(data, "rung")) == len(gemm.LADDER)
    # the FMA probe ran beside the largest sweep size up to 2048, with its own work per call
    beside = records.results(data, "peak_beside")
    assert [r["params"]["n"] for r in beside] == [256]
    probe = beside[0]["value"]["median"]
    _, gop = machine.peak_probe("f32", beside[0]["params"]["threads"])
    assert probe == pytest.approx(gop / beside[0]["seconds"]["median"])  # not 2 x 256³
    assert values["ch2.beside_n"] == "256³"
    ours = records.value(data, "sweep", impl="smallem", n=256)
    assert values["ch2.beside_pct"] == f"{100 * ours / probe:.0f} %"
    assert data["settings"]["blas"]
    # with chapter 1's record beside it, the rungs go on chapter 1's roofline
    from smallem.plumbing.build import ROOT
    ch1_rec = ROOT / "figures" / "records" / "ch1.machine.json"
    if ch1_rec.is_file():
        (records_tmp / "ch1.machine.json").write_text(ch1_rec.read_text())
        values = ch2.report(records_tmp)
        assert values["ch2.peak_source"] == "chapter 1's record"
        # every "% of peak" on the page divides by that one peak
        peak, _ = ch2.reading._peak(data, records_tmp)
        final = records.value(data, "rung", rung=len(gemm.LADDER) - 1, M=data["settings"]["n_ladder"])
        assert values["ch2.final_pct_peak"] == f"{100 * final / peak:.0f} %"
        per_core = ch2.reading._peak_core(data, records_tmp) * 1e9
        assert values["ch2.thread_min_us"] == figures.fmt(gemm.THREAD_MIN_OPS / per_core * 1e6, "µs")


@pytest.mark.parametrize("name", ["book", *captured.NAMES])
def test_the_page_has_one_peak_for_all_cores_and_one_for_one_core(name):
    """Every "of peak", "predicted" and "of one core's peak" on the page divides by chapter 1's
    FMA probe, its run on all cores and the same run on one core (the figures its roofline
    shows), never by this run's own probe or the probes timed in turn."""
    rec_dir = records.records_dir() if name == "book" else captured.MACHINES / name / "records"
    facts = ch1.facts(rec_dir)
    if facts is None or not records.exists(ch2.RECORD, rec_dir):
        pytest.skip("no chapter 1 and 2 records")
    rec = records.load(ch2.RECORD, rec_dir)
    one, cores = facts["peak"][("f32", 1)], facts["peak"][("f32", facts["cores"])]
    rows, v = ch2.reading.ladder_rows(rec, rec_dir)
    assert (v["ch2.peak"], v["ch2.peak_core"]) == (figures.fmt(cores, "Gop/s"),
                                                   figures.fmt(one, "Gop/s"))
    assert rows[-1][1] == v["ch2.peak"] and v["ch2.peak_source"] == "chapter 1's record"
    # each ladder row's share is of the peak of the cores it ran on
    for row in rows[:-1]:
        rate = float(row[1].rsplit(" ", 1)[0].replace("\u202f", "").replace(" ", ""))
        peak = one if row[0].endswith(", 1 thread") else cores
        shown = row[2].rstrip(" %")  # to the unit, or to a tenth below 10 %
        share = 100 * rate / peak  # the rate is shown to 3 digits: 0.3 % of it, then rounding
        assert abs(float(shown) - share) <= 0.003 * share + (0.05 if "." in shown else 0.5)
    pred = ch2.reading.predicted(rec, facts)
    # rung 5: all cores' peak, or its block of B's feed where that binds (test_predicted)
    assert pred[4][0] == one and (pred[5][0] == cores
                                  or pred[5][1].startswith("a sliver") and pred[5][0] < cores)
    a = ch2.alone_rows(rec, rec_dir)[1]
    alone = {t: records.value(rec, "alone", threads=t, b_in="L2") for t in (1, facts["cores"])}
    assert a["ch2.alone_one_of_peak"] == pytest.approx(alone[1] / one)
    assert a["ch2.alone_all_of_peak"] == pytest.approx(alone[facts["cores"]] / cores)
    assert ch2.reading.pool_values(rec, rec_dir)["ch2.thread_min_us"] == figures.fmt(
        gemm.THREAD_MIN_OPS / (one * 1e9) * 1e6, "µs")


def test_bf16_check_for_a_second_machine(records_tmp, tmp_path, capsys):
    from smallem import cli
    from smallem.plumbing.build import ROOT

    committed = ROOT / "figures" / "records" / f"{ch2.RECORD}.json"
    if not committed.is_file():
        pytest.skip("no committed chapter-2 record to draw the page's tables beside")
    records_tmp.mkdir(parents=True, exist_ok=True)
    (records_tmp / committed.name).write_text(committed.read_text())
    values = ch2.report(records_tmp)
    assert values["ch2.bf16_native_machine"] is None and values["ch2.bf16_native_exists"] is False
    table = tmp_path / "figures" / "tables" / "ch2_bf16_native.md"
    assert "not measured yet" in table.read_text()

    assert cli.main(["gemm-bf16", "--quick"]) == 0
    assert "wrote" in capsys.readouterr().out
    data = records.load(ch2.BF16_RECORD, records_tmp)
    sizes = {(r["params"]["M"], r["params"]["K"], r["params"]["N"])
             for r in records.results(data, "dtype")}
    assert sizes == {tuple(x) for x in data["settings"]["sizes"]} and len(sizes) == 2
    assert data["settings"]["native_bf16"] == gemm.native_bf16()
    values = ch2.report(records_tmp)
    assert values["ch2.bf16_native_machine"] == figures.machine_line(data)
    assert values["ch2.bf16_native_chosen"].startswith(data["settings"]["bf16_path"] + " (")
    M, K, N = data["settings"]["sizes"][0]
    g32 = records.value(data, "dtype", dtype="f32", M=M, K=K, N=N)
    g16 = records.value(data, "dtype", dtype="bf16", path=data["settings"]["bf16_path"],
                        M=M, K=K, N=N)
    assert {r["params"]["kind"] for r in records.results(data, "peak")} == {"f32", "bf16"}
    peak = records.value(data, "peak", kind="bf16")
    assert values["ch2.bf16_native_bf16_probe"] == figures.fmt(peak, "Gop/s")
    assert f"| {100 * g16 / g32:.0f} % |" in table.read_text()
    assert f"{M}×{K}×{N}" in table.read_text() and "not measured" not in table.read_text()


def test_gpu_check_selects_the_real_avx512_gemm_tests():
    # On a GPU host whose CPU has AVX512_BF16, gpu_check.sh runs these on the hardware itself.
    import re

    from smallem.plumbing.build import ROOT

    script = (ROOT / "kernels_cuda" / "gpu_check.sh").read_text()
    selection = re.search(r'tests/test_gemm\.py -k "([^"]+)"', script).group(1)
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "tests/test_gemm.py", "-k", selection], cwd=ROOT, capture_output=True, text=True)
    ids = [line for line in r.stdout.splitlines() if "::" in line]
    assert ids and all("avx512" in i and "simde" not in i for i in ids)
    for test in ("test_rung_against_numpy", "test_matmul_transposes", "test_matmul_bf16"):
        assert any(f"::{test}[" in i for i in ids), (test, r.stdout[-2000:])


def test_make_figures_without_record_is_skipped(records_tmp, tmp_path):
    assert ch2.report(records_tmp) == {}
    # the rung-to-rung diffs come from the source and are written all the same
    diff = (tmp_path / "figures" / "tables" / "ch2_diff_naive_loop_order.md").read_text()
    assert diff.startswith("```diff") and "+void gemm_loop_order(" in diff


def test_sweep_values_say_where_the_model_landed():
    def pts(rates):
        return [{"params": {"mc": k}, "value": {"median": v}} for k, v in rates.items()]
    v = ch2.reading._sweep_values(pts({42: 90.0, 168: 100.0}), "mc", 168, "p",
                                  typed=("spread", "model_gap"))
    assert v == {"p_best": "168", "p_best_gops": "100 Gop/s", "p_model_gap": "0.0 %",
                 "p_spread": "10.0 %", "p_trend": None, "p_cliff": False, "p_cliff_from": None,
                 "p_cliff_to": None, "p_cliff_from_gops": None, "p_cliff_to_gops": None,
                 "p_spread_frac": pytest.approx(0.1),
                 "p_model_gap_frac": 0.0}
    # a steady fall over three sizes, first to last more than the noise, is a trend
    v = ch2.reading._sweep_values(pts({84: 110.0, 168: 104.0, 252: 98.0}), "mc", 168, "p",
                                  typed=("model_gap",))
    assert v["p_trend"] == "falls" and v["p_model_gap_frac"] == pytest.approx(6 / 110)
    assert "p_spread_frac" not in v  # only the fractions asked for
    v = ch2.reading._sweep_values(pts({84: 100.0, 168: 96.0, 252: 98.0}), "mc", 168, "p")
    assert v["p_best"] == "84" and v["p_model_gap"] == "4.0 %" == v["p_spread"]
    # a two-level step (flat, a drop, flat again) is a fall too; a rise past the noise is not
    two_level = pts({1: 100.0, 2: 101.0, 3: 80.0, 4: 79.5})
    assert ch2.reading._sweep_values(two_level, "mc", 1, "p")["p_trend"] == "falls"
    # ... and one step holds most of its spread: a cliff, which the page names first
    v = ch2.reading._sweep_values(two_level, "mc", 1, "p")
    assert v["p_cliff"] and (v["p_cliff_from"], v["p_cliff_to"], v["p_cliff_to_gops"]) == (2, 3, 80.0)
    # a spread past the noise (5.5 %) whose largest step (4.2 %) is inside it is no cliff
    small_steps = pts({1: 100.0, 2: 100.0, 3: 95.8, 4: 94.5})
    assert not ch2.reading._sweep_values(small_steps, "mc", 1, "p")["p_cliff"]
    up_down = pts({1: 100.0, 2: 80.0, 3: 92.0, 4: 78.0})
    assert ch2.reading._sweep_values(up_down, "mc", 1, "p")["p_trend"] is None


def test_auto_threads_gives_each_thread_enough_work(monkeypatch):
    monkeypatch.setenv("SMALLEM_THREADS", "4")
    assert gemm.auto_threads(1, 1, 1) == 1
    assert 2 * 128**3 == 2 * gemm.THREAD_MIN_OPS  # 128³ is work for exactly two threads
    assert gemm.auto_threads(128, 128, 128) == 2
    assert gemm.auto_threads(128, 128, 127) == 1
    assert gemm.auto_threads(1024, 1024, 1024) == 4


def _rounds(rates):
    """A result as compare.paired records it: per-round rates (one unit of work a call)."""
    rates = list(rates)
    med = sorted(rates)[len(rates) // 2]
    return {"median": med, "min": min(rates), "max": max(rates), "n": len(rates)}, \
        {"median": 1 / med, "min": 1 / max(rates), "max": 1 / min(rates), "n": len(rates),
         "samples": [1 / r for r in rates]}


def test_bf16_target_reads_both_paths_and_the_probes():
    rec = records.Record("t.bf16", settings={"native_bf16": True}, machine={"cpu": "test"})
    for (M, K, N), f32, widen, native in (((64, 64, 64), 100.0, 95.0, 180.0),
                                          ((128, 64, 32), 100.0, 99.0, 175.0)):
        for extra, rate in (({"dtype": "f32"}, f32), ({"dtype": "bf16", "path": "widen"}, widen),
                            ({"dtype": "bf16", "path": "native"}, native)):
            value, seconds = _rounds([rate] * 7)
            rec.add("dtype", "Gop/s", value, seconds=seconds, **extra, M=M, K=K, N=N)
    rec.add("dtype", "Gop/s", _rounds([100.0] * 7)[0], dtype="f32", M=8, K=8, N=8)  # no bf16
    line = ch2.bf16_target(rec.data)
    assert "reached (the faster bf16 path 1.75 times f32 at 128x64x32" in line, line
    assert "at or above 1.7 in 7 of 7 rounds" in line and "probe" not in line
    rec.add("peak", "Gop/s", _rounds([100.0])[0], kind="f32")
    rec.add("peak", "Gop/s", _rounds([49.0])[0], kind="bf16")
    # native at 64^3 now 1.2x in six rounds, 1.8x in one: not reached there (the one round
    # above the target is the closest to it, so the signed ranks pass where the plain count
    # of 6 of 7 would not), whatever the others
    value, seconds = _rounds([120.0] * 6 + [180.0])
    rec.data["results"][2].update(value=value, seconds=seconds)
    line = ch2.bf16_target(rec.data)
    assert "not reached (the faster bf16 path 1.2 times f32 at 64x64x64" in line, line
    assert "in 1 of 7 rounds; below it in 6, one-sided signed-rank test" in line
    # ... and 1.2x in four rounds, 1.8x in three: not shown
    value, seconds = _rounds([120.0] * 4 + [180.0] * 3)
    rec.data["results"][2].update(value=value, seconds=seconds)
    line = ch2.bf16_target(rec.data)
    assert "not shown (the faster bf16 path" in line and "neither one-sided" in line, line
    assert line.endswith("the bf16 dot probe runs at 0.49x the f32 FMA probe on this CPU")
    rec.data["settings"]["native_bf16"] = False
    assert "not applicable" in ch2.bf16_target(rec.data)


def test_targets_are_reached_only_by_a_one_sided_test_of_the_rounds():
    rec = records.Record("t.gemm", settings={"quick": False, "native_bf16": False},
                         machine={"cpu": "test"})
    rec.add("peak_f32", "Gop/s", _rounds([200.0])[0])
    for n, ours, theirs in ((1024, [150.0] * 7, [140.0] * 7), (2048, [171.0] * 7, [140.0] * 7),
                            (4096, [150.0] * 7, [151.0] * 7)):
        for impl, rates in (("smallem", ours), ("numpy", theirs)):
            value, seconds = _rounds(rates)
            rec.add("sweep", "Gop/s", value, seconds=seconds, impl=impl, n=n)
    # fwd ahead in every round; bwd 0.99x in every round (inside the parity margin);
    # mid 0.9x in four rounds of seven (not shown: neither test passes); few: ahead, in only
    # 4 rounds (not shown: 4 rounds cannot pass)
    for label, ours, theirs in (("fwd", [160.0] * 7, [150.0] * 7),
                                ("bwd", [148.5] * 7, [150.0] * 7),
                                ("mid", [135.0] * 4 + [150.0] * 3, [150.0] * 7),
                                ("few", [160.0] * 4, [150.0] * 4)):
        for impl, rates in (("smallem", ours), ("numpy", theirs)):
            value, seconds = _rounds(rates)
            rec.add("shape", "Gop/s", value, seconds=seconds, impl=impl, label=label)
    lines = ch2.targets(rec.data, rec_dir="/nonexistent")
    by = {x.split(": ", 1)[0]: x.split(": ", 1)[1] for x in lines}
    assert by["smallem >= numpy at 4096^3"].startswith("reached (150.0 vs 151.0 Gop/s")  # 0.99x
    assert "at or above 0.95 (the parity margin) in 7 of 7 rounds" in by["smallem >= numpy at 4096^3"]
    assert by[">= 85 % of the f32 peak at 2048^3"].startswith("reached (86 % of 200.0 Gop/s")
    assert by["smallem >= numpy on fwd"].startswith("reached (160.0 vs 150.0 Gop/s")
    assert by["smallem >= numpy on bwd"].startswith("reached (148.5 vs 150.0 Gop/s")
    assert by["smallem >= numpy on mid"].startswith("not shown (") and "in 3 of 7 rounds" \
        in by["smallem >= numpy on mid"]
    assert by["smallem >= numpy on few"].startswith("not shown (") and "4 rounds cannot pass" \
        in by["smallem >= numpy on few"]
    slow = compare.judge([0.8] * 7, 0.8, 1.0)  # below the parity margin in every round
    assert slow.word == "not reached" and slow.text().startswith("not reached (0.8 times")
    rec.data["settings"]["quick"] = True  # shapes divided by 16: not the targets' sizes
    lines = ch2.targets(rec.data, rec_dir="/nonexistent")
    assert not any(" on fwd" in x for x in lines)
    assert any("model's shapes: not measured at their size" in x for x in lines)


def test_a_target_is_judged_by_the_one_sided_signed_rank_test():
    assert compare.signed_rank_above([1.0] * 5) == pytest.approx(1 / 32)
    # 6 of 7 above: enough only where the seventh is the round closest to the target
    assert compare.signed_rank_above([-0.5] + [1.0] * 6) == pytest.approx(2 / 128)
    assert compare.signed_rank_above([-2.0] + [1.0] * 6) > compare.SIGN_LEVEL
    v = compare.judge([1.0] * 5, 1.0, 1.0)
    assert v.met and v.judged_at == compare.PARITY_MARGIN and v.ahead == 5
    assert not compare.judge([1.0] * 4, 1.0, 1.0).met  # 4 of 4 cannot say it
    assert not compare.judge([2.0] * 6 + [1.0], 1.9, 1.5).met  # the 7th far below: p = 0.18


def test_paired_rounds_and_the_signed_rank_test():
    assert compare.sign_test(0, 15) == compare.sign_test(15, 15) == pytest.approx(2 / 2**15)
    assert compare.sign_test(12, 15) == pytest.approx(0.0352, abs=1e-4)
    assert compare.sign_test(11, 15) == pytest.approx(0.1185, abs=1e-4)
    assert compare.sign_test(7, 15) == compare.sign_test(8, 15) == 1.0
    secs = lambda xs: {"median": sorted(xs)[len(xs) // 2], "min": min(xs), "max": max(xs),
                       "n": len(xs), "samples": xs}
    v = lambda x: {"median": x, "min": x, "max": x, "n": 15}
    rec = records.Record("t.gemm", settings={"quick": False, "native_bf16": False},
                         machine={"cpu": "test"})
    # "fast": ahead in every round; "slow": behind in 13, ahead by a hair in 2; "tie": ahead
    # in 7 of 15 by about what it is behind in the 8 others; "close": ahead in 13 of 15 by
    # less than it is behind in the other 2, which the sign test alone would call faster
    for label, ours in (("fast (a)", [1.0] * 15), ("slow (b)", [1.2] * 13 + [1.04] * 2),
                        ("tie (c)", [1.0] * 7 + [1.1] * 8),
                        ("close (d)", [1.04] * 13 + [1.5] * 2)):
        rec.add("shape", "Gop/s", v(1 / secs(ours)["median"]), seconds=secs(ours),
                impl="smallem", label=label, M=8, K=8, N=8)
        rec.add("shape", "Gop/s", v(1 / 1.05), seconds=secs([1.05] * 15), impl="numpy",
                label=label)
    rows, values = ch2.shape_rows(rec.data)
    assert [r[-1] for r in rows] == ["15 of 15", "2 of 15", "7 of 15", "13 of 15"]
    assert values["ch2.shapes_faster"] == "fast" and values["ch2.shapes_slower"] == "slow"
    assert values["ch2.shapes_tied"] == "tie and close"
    # a record from before the samples were kept says so instead of guessing
    for r in rec.data["results"]:
        del r["seconds"]["samples"]
    rows, values = ch2.shape_rows(rec.data)
    assert {r[-1] for r in rows} == {"n/a (not kept)"}
    assert values["ch2.shapes_tied"].startswith("n/a")


def test_compare_keeps_every_sample_in_round_order():
    calls = []
    res = compare.paired({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                        1, 1, 1, quick=True)
    for key in ("a", "b"):
        s = res[key]["seconds"]
        assert len(s["samples"]) == s["n"] == 3 and min(s["samples"]) == s["min"]
    ours = {"seconds": {"samples": [1.0, 3.0, 1.0]}}
    assert compare.rounds_ahead(ours, {"seconds": {"samples": [2.0, 2.0, 2.0]}}) == (2, 3)
    assert compare.rounds_ahead(ours, {"seconds": {"samples": [2.0, 2.0]}}) is None


def test_blocking_verdict_follows_the_measured_gain():
    assert ch2.reading.blocking_verdict(0.80) == "is slower here"
    assert ch2.reading.blocking_verdict(0.97) == ch2.reading.blocking_verdict(1.08) == "buys little"
    assert ch2.reading.blocking_verdict(1.3) == "helps a little"
    assert ch2.reading.blocking_verdict(1.82) == "helps a great deal here"


def test_equal_slices_is_the_drivers_cut(level):
    """Python's equal_slices (chapter 2's K_C table reads it) is kernels_c/gemm.c's, at every
    ISA level (each its own library)."""
    from smallem.plumbing import build

    lib = build.load("gemm", level)[1]
    for K, kc in itertools.product((1, 7, 128, 1000, 1024, 3072, 4096), (1, 64, 146, 320, 585, 804, 4096, 5000)):
        assert gemm.equal_slices(K, kc) == lib.gemm_equal_slices(K, kc), (K, kc)
    assert gemm.equal_slices(4096, 585) == 512


def test_amx_ladder_reads_its_rounds(tmp_path, monkeypatch):
    """Chapter 2's AMX ladder from a record: each rung's traffic by the stated model (K
    slices, C's bytes, where B's block lives), its bound, its gain over the rung above by
    the rounds' test, the last rung against half the probe timed in the same rounds, and a
    rung above its bound named; a record without the ladder drops it with every key."""
    from smallem.book.ch2 import bf16 as ch2_bf16

    monkeypatch.setattr(figures, "tables_dir", lambda: tmp_path)
    geometry = gemm.cache_geometry({"L1d_bytes": 48 << 10, "L2_bytes": 2 << 20,
                                    "L3_bytes": 300 << 20})
    rec = records.Record("t.gemm", settings={"threads": 2, "cache_geometry": geometry,
                                             "amx_epilogue": "stream"},
                         machine={"cpu": "test", "cores": 2, "isa": {"isa": "avx512", "extensions": []}})
    v = ch2_bf16.amx_ladder(rec.data, tmp_path)
    assert v["ch2.amx_ladder"] is False and set(ch2_bf16.AMX_KEYS) <= set(v)
    M, N, K = 8192, 3072, 768
    for rung, step, kc, nc, epi, rate in ((1, "tiles", 320, 221184, "vector", 1000.0),
                                          (2, "AMX blocks", 768, 672, "vector", 1200.0),
                                          (3, "streamed C", 768, 672, "stream", 1350.0)):
        value, seconds = _rounds([rate] * 7)
        rec.add("amx_rung", "Gop/s", value, seconds=seconds, rung=rung, step=step, kc=kc,
                nc=nc, epilogue=epi, M=M, N=N, K=K, threads=2)
    value, seconds = _rounds([2000.0] * 7)
    rec.add("amx_probe", "Gop/s", value, seconds=seconds, threads=2)
    value, seconds = _rounds([1250.0] * 7)
    rec.add("amx_alone", "Gop/s", value, seconds=seconds, kp=768, panels=20, threads=2)
    t1 = ch2_bf16.amx_traffic(rec.data["results"][0]["params"], geometry)
    assert (t1["slices"], t1["kslice"], t1["nrun"]) == (3, 256, 3072)
    assert t1["c_bytes"] == 3 * 8 * M * N and not t1["b_in_l2"]
    assert t1["b_l3_bytes"] == 2 * K * N * (M // 32)
    t3 = ch2_bf16.amx_traffic(rec.data["results"][2]["params"], geometry)
    assert (t3["slices"], t3["nrun"], t3["c_bytes"], t3["b_in_l2"]) == (1, 640, 4 * M * N, True)
    v = ch2_bf16.amx_ladder(rec.data, tmp_path)
    assert v["ch2.amx_ladder"] and v["ch2.amx_last_of_alone"] == pytest.approx(1.08)
    assert v["ch2.amx_target"].startswith("reached (68 % of the probe, target 50 %)")
    assert v["ch2.amx_blocks_gain"] == pytest.approx(0.2) and v["ch2.amx_blocks_gain_sign"] == 1
    assert v["ch2.amx_beats"] == ["streamed C"]  # 1350: above the tiles alone's 1250 by 8 %
    assert v["ch2.amx_first_bound"] == "the tile probe"  # no chapter 1 record: no bandwidths
    table = (tmp_path / "ch2_amx_ladder.md").read_text()
    assert "256 × 3072 (3 slices)" in table and "768 × 640 (1 slice)" in table
    from smallem.book.ch2.targets import amx_target
    assert amx_target(rec.data).startswith("AMX bf16 GEMM >= 50 % of the AMX bf16 probe: reached")
