"""The gated linear recurrence (kernels_c/layers/scan.c): its three rungs, forward and
backward, against the float64 reference of smallem.training.scan, itself checked against
central finite differences; at lengths on either side of every chunk, with decays from 0.5
to 1, none at all, and so steep (lam = -30) that each step forgets the last."""

import functools
import os

import numpy as np
import pytest

from smallem.checks import assert_close
from smallem.training import layers, scan

import captured

RUNGS = layers.SCAN_RUNGS


def inputs(BH, T, hd, decay="gated", seed=0):
    """q, k, v, lam, dout (float32); lam = log of a decay in [0.5, 1], 0 or -30."""
    rng = np.random.default_rng([seed, BH, T, hd])
    q, k, v, do = (rng.standard_normal((BH, T, hd)).astype(np.float32) for _ in range(4))
    lam = {"gated": np.log(rng.uniform(0.5, 1.0, (BH, T))), "none": np.zeros((BH, T)),
           "steep": np.full((BH, T), -30.0)}[decay].astype(np.float32)
    return q, k, v, lam, do


@functools.lru_cache(maxsize=256)
def expected(BH, T, hd, decay="gated", seed=0):
    """The inputs, then the float64 reference: o, every state (BH, T + 1, hd, hd), and
    dq, dk, dv, dlam."""
    x = inputs(BH, T, hd, decay, seed)
    o, S = scan.states(*x[:4])
    return x, o, S, scan.reference_backward(*x)


def run(rung, q, k, v, lam, do, chunk, threads=None):
    """(o, states, [dq, dk, dv, dlam]) from ``rung``, every output first filled with NaN."""
    BH, T, hd = q.shape
    o = np.full_like(q, np.nan)
    st = np.full((BH, -(-T // chunk) + 1, hd, hd), np.nan, np.float32)
    layers.scan_forward(q, k, v, lam, o, st, chunk=chunk, rung=rung, threads=threads)
    grads = [np.full_like(q, np.nan) for _ in range(3)] + [np.full_like(lam, np.nan)]
    layers.scan_backward(q, k, v, lam, st, do, *grads, chunk=chunk, rung=rung, threads=threads)
    return o, st, grads


def close(got, want, T, hd, name):
    """Within float32 rounding of sums of T hd terms, relative to the largest of them."""
    k = T * hd
    assert_close(got, want.astype(np.float32), k=k, name=name,
                 atol=4 * 1.2e-7 * np.sqrt(k) * max(np.abs(want).max(), 1e-30))


def check(rung, BH, T, hd, chunk, decay="gated", threads=None, seed=0):
    x, o64, S64, grads64 = expected(BH, T, hd, decay, seed)
    o, st, grads = run(rung, *x, chunk, threads)
    close(o, o64, T, hd, f"{rung} o")
    close(st, S64[:, list(range(0, T, chunk)) + [T]], T, hd, f"{rung} states")
    for got, want, name in zip(grads, grads64, ("dq", "dk", "dv", "dlam")):
        # dlam sums hd^2 products a step over up to T steps
        close(got, want, T, hd * (hd if name == "dlam" else 1), f"{rung} {name}")


@pytest.mark.parametrize("chunk", [8, 16, 32])
@pytest.mark.parametrize("T", [1, 2, 7, 31, 32, 33, 63, 64, 65, 97])
def test_every_rung_against_the_reference(level, T, chunk):
    """Lengths shorter than a chunk, one either side of one and two chunks, and odd; hd a
    vector, two, and three half-vectors; one head and three."""
    for BH, hd in ((3, 8), (1, 16), (3, 24)):
        for rung in RUNGS:
            check(rung, BH, T, hd, chunk)


@pytest.mark.parametrize("decay", ["none", "steep"])
@pytest.mark.parametrize("T,chunk", [(65, 16), (33, 32)])
def test_no_decay_and_steep_decay(level, decay, T, chunk):
    """lam = 0: every product kept forever (the state grows); lam = -30: exp(lam) ~ 1e-13,
    the state is the last step's k v^T and the decays inside a chunk underflow."""
    for rung in RUNGS:
        check(rung, 2, T, 16, chunk, decay)


def test_reference_backward_against_finite_differences():
    x = [a.astype(np.float64) for a in inputs(2, 5, 3)]
    x[3] = x[3] - 0.1  # lam stays below 0 on either side of a step
    grads = scan.reference_backward(*x)

    def loss(args):
        return float((scan.reference_forward(*args[:4])[0] * args[4]).sum())

    h = 1e-6
    for i, name in enumerate(("q", "k", "v", "lam")):
        fd = np.empty_like(x[i])
        for idx in np.ndindex(x[i].shape):
            up, down = [a.copy() for a in x], [a.copy() for a in x]
            up[i][idx] += h
            down[i][idx] -= h
            fd[idx] = (loss(up) - loss(down)) / (2 * h)
        np.testing.assert_allclose(grads[i], fd, rtol=1e-6, atol=1e-8, err_msg=name)
    o, final = scan.reference_forward(*x[:4])
    q, k, v, lam = x[:4]
    step = np.zeros((2, 3, 3))  # the final state, and o_t = S_t^T q_t, by the definition
    for t in range(5):
        step = np.exp(lam[:, t])[:, None, None] * step + np.einsum("bi,bj->bij", k[:, t], v[:, t])
        np.testing.assert_allclose(o[:, t], np.einsum("bi,bij->bj", q[:, t], step))
    np.testing.assert_allclose(final, step)
    assert scan.checkpoints(*x[:4], 2).shape == (2, 4, 3, 3)


def test_chunked_and_step_agree_to_rounding(level):
    x = inputs(3, 97, 24)
    step = run("step", *x, 16)
    for chunk in (1, 16, 200):  # a chunk of one step, and one longer than the sequence
        chunked = run("chunked", *x, chunk)
        close(chunked[0], step[0].astype(np.float64), 97, 24, f"o, chunk {chunk}")
        if chunk == 16:
            close(chunked[1], step[1].astype(np.float64), 97, 24, "states")
        for got, want, name in zip(chunked[2], step[2], ("dq", "dk", "dv", "dlam")):
            close(got, want.astype(np.float64), 97, 24 * 24, f"{name}, chunk {chunk}")


@pytest.mark.parametrize("BH", [1, 3])
def test_every_rung_on_one_and_two_threads(level, BH):
    """The threaded rung splits the heads and, within each, the chunks (one head on two
    threads: both take chunks of it), each chunk computed by one thread in one order: its
    bits are the chunked rung's, whatever the team."""
    T, hd, chunk = 97, 24, 16
    for rung in RUNGS:
        for threads in (1, 2):
            check(rung, BH, T, hd, chunk, threads=threads)
    x = inputs(BH, T, hd)
    want = run("chunked", *x, chunk)
    for threads in (1, 2):
        got = run("threaded", *x, chunk, threads=threads)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
        assert all(np.array_equal(a, b) for a, b in zip(got[2], want[2]))


def test_work_can_be_given_and_is_checked():
    x = inputs(2, 40, 8)
    for rung in RUNGS:
        work = np.empty(layers.scan_work_floats(40, 8, 16, threads=2), np.float32)
        got = run(rung, *x, 16, threads=2)
        o, st = np.empty_like(x[0]), np.empty((2, 4, 8, 8), np.float32)
        layers.scan_forward(*x[:4], o, st, chunk=16, rung=rung, threads=2, work=work)
        assert np.array_equal(o, got[0])
        grads = [np.empty_like(x[0]) for _ in range(3)] + [np.empty_like(x[3])]
        layers.scan_backward(*x[:4], st, x[4], *grads, chunk=16, rung=rung, threads=2, work=work)
        assert all(np.array_equal(a, b) for a, b in zip(grads, got[2]))
        with pytest.raises(ValueError, match="work"):
            layers.scan_forward(*x[:4], o, st, chunk=16, rung=rung, threads=2, work=work[:3])


def test_bad_inputs_are_refused_clearly():
    q, k, v, lam, do = inputs(2, 9, 4)
    o, st = np.empty_like(q), np.empty((2, 4, 4, 4), np.float32)  # 3 chunks of 4 steps
    grads = [np.empty_like(q) for _ in range(3)] + [np.empty_like(lam)]

    def fwd(**kw):
        a = dict(q=q, k=k, v=v, lam=lam, o=o, states=st, chunk=4, rung="threaded")
        a.update((n, x) for n, x in kw.items() if n in a)
        return layers.scan_forward(**a)

    def bwd(**kw):
        a = dict(q=q, k=k, v=v, lam=lam, states=st, dout=do, dq=grads[0], dk=grads[1],
                 dv=grads[2], dlam=grads[3], chunk=4, rung="threaded")
        a.update((n, x) for n, x in kw.items() if n in a)
        return layers.scan_backward(**a)

    for call in (fwd, bwd):
        with pytest.raises(TypeError, match="k"):  # the package's rule: a wrong dtype is a TypeError
            call(k=k.astype(np.float64))
        for bad, words in ((0.5, "1 of 18"), (np.nan, "lam"), (-np.inf, "lam"), (np.inf, "lam")):
            wrong = lam.copy()
            wrong[1, 3] = bad
            with pytest.raises(ValueError, match=words):
                call(lam=wrong)
        with pytest.raises(ValueError, match="lam"):
            call(lam=lam[:, :8].copy())
        with pytest.raises(ValueError, match="^states: "):
            call(chunk=5)  # 2 chunks of 5 steps need 3 states, not 4
        with pytest.raises(ValueError, match="chunk"):
            call(chunk=0)
        with pytest.raises(ValueError, match="rung"):
            call(rung="fastest")
        with pytest.raises(ValueError, match="B\\*H, T, hd"):
            call(q=q[0], k=k[0], v=v[0])
        with pytest.raises(ValueError, match="zero"):
            empty = np.empty((2, 0, 4), np.float32)
            call(q=empty, k=empty, v=empty, lam=np.empty((2, 0), np.float32), o=empty,
                 dout=empty, dq=empty, dk=empty, dv=empty, dlam=np.empty((2, 0), np.float32),
                 states=np.empty((2, 1, 4, 4), np.float32))
    with pytest.raises(ValueError, match="^o: "):
        fwd(o=np.empty((2, 9, 5), np.float32))
    with pytest.raises(ValueError, match="^dlam: "):
        bwd(dlam=np.empty((2, 8), np.float32))
    with pytest.raises(ValueError, match="^dout: "):
        bwd(dout=do[:, ::2])  # a strided view


def fits(L, hd, l2):
    return L <= max(hd, 16) and 4 * (4 * L * hd + L * L + hd * hd) <= l2


def test_chunk_follows_the_head_and_the_l2():
    for l2 in (256 * 1024, 512 * 1024, 1 << 20, 2 << 20):
        for hd in (1, 8, 16, 32, 64, 128, 256):
            L = layers.scan_chunk(hd, {"L2_bytes": l2})
            assert 16 <= L <= 128 and L % 8 == 0
            assert L == 16 or fits(L, hd, l2), (l2, hd, L)
            assert L == 128 or not fits(L + 8, hd, l2), (l2, hd, L)  # the longest that fits
    assert layers.scan_chunk(64, {"L2_bytes": 1 << 20}) == 64
    assert layers.scan_chunk(32, {"L2_bytes": 1 << 20}) == 32
    assert layers.scan_chunk(8, {"L2_bytes": 1 << 20}) == 16
    assert layers.scan_chunk(256, {"L2_bytes": 256 * 1024}) == 16  # the state alone fills it
    assert layers.scan_chunk(256, {"L2_bytes": 1 << 20}) == 128
    assert layers.scan_chunk(64, {"L2_bytes": 0}) == layers.scan_chunk(64, {"L2_bytes": 256 * 1024})


@pytest.mark.parametrize("name", captured.NAMES)
def test_chunk_fits_each_captured_l2(name):
    m = captured.load(name)
    for hd in (16, 32, 64):
        L = layers.scan_chunk(hd, m.caches)
        assert 16 <= L <= 128 and L % 8 == 0 and (L == 16 or fits(L, hd, m.caches["L2_bytes"]))


hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is a test dependency: pip install -e '.[test]'")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

EXAMPLES = int(os.environ.get("SMALLEM_HYPOTHESIS_EXAMPLES", "25"))
NEAR = sorted({m * b + d for b in (8, 16, 32) for m in (1, 2) for d in (-1, 0, 1)} | {1, 2, 3, 5, 7})


@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(BH=st.integers(1, 3), T=st.one_of(st.sampled_from(NEAR), st.integers(1, 90)),
       hd=st.sampled_from([1, 2, 3, 8, 13, 16, 24, 32]),
       chunk=st.one_of(st.none(), st.integers(1, 70)), rung=st.sampled_from(RUNGS),
       threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**32 - 1))
def test_scan_against_float64(level, BH, T, hd, chunk, rung, threads, seed):
    chunk = layers.scan_chunk(hd) if chunk is None else chunk
    check(rung, BH, T, hd, chunk, threads=threads, seed=seed)
