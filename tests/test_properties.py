"""Property tests (hypothesis): the public entry points on shapes nobody picked by hand.

Shapes are drawn from 1, primes, and one either side of every block the kernels cut into
(the micro-kernel's MR and NR, the decoder's 16-column tile and 32-row Q8_0 block, the
attention's tile); operands may be views whose rows lie further apart than their width.
Each result is held to a float64 reference under a worst-case rounding bound (not a
statistical one), so a pass is not luck and a failure is a bug.

The seed is fixed (``derandomize``) and the examples are few in CI; set
SMALLEM_HYPOTHESIS_EXAMPLES (say 500) for a longer search. Nothing is written to disk
(no example database), so a run leaves the checkout as it found it.
"""

import os

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is a test dependency: pip install -e '.[test]'")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from smallem.generating import decode  # noqa: E402
from smallem.product import gemm
from smallem.training import layers
from smallem.generating.decode import Sampler  # noqa: E402
from smallem.generating.quant import QBLOCK, TILE, Packed  # noqa: E402

EXAMPLES = int(os.environ.get("SMALLEM_HYPOTHESIS_EXAMPLES", "25"))
settings.register_profile(
    "smallem", max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
    print_blob=True,
    # the `level` fixture only sets SMALLEM_ISA: the same for every example of a test
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile("smallem")

U32 = 2.0 ** -24  # unit roundoff of float32
SMALL = [1, 2, 3, 5, 7, 11, 13, 17, 31, 37, 61]


def awkward(*blocks, top=80):
    """Sizes from 1 to ``top`` that favour 1, primes and each block's multiples +- 1."""
    near = {m * b + d for b in blocks for m in (1, 2) for d in (-1, 0, 1)}
    picks = sorted(x for x in set(SMALL) | near if 1 <= x <= top)
    return st.one_of(st.sampled_from(picks), st.integers(1, top))


def operand(rng, rows, cols, pad, step, dtype=np.float32):
    """A rows x cols matrix as a view: ``pad`` spare columns, every ``step``-th row of a
    taller parent (so the leading dimension is (cols + pad) * step); values in [-1, 1]."""
    parent = rng.uniform(-1, 1, (rows * step, cols + pad)).astype(np.float32)
    off = pad // 2
    view = parent[::step, off:off + cols]
    if dtype == np.uint16:
        view = gemm.f32_to_bf16(parent)[::step, off:off + cols]
    return view


layouts = st.tuples(st.sampled_from([0, 1, 3, 16]), st.sampled_from([1, 2]))  # (pad, step)


def bound(a64, b64, c0, alpha, beta, K):
    """Worst-case error of C = alpha A B + beta C0 with f32 sums of K products."""
    return (2 * (K + 4) * U32 * (abs(alpha) * (np.abs(a64) @ np.abs(b64)) + abs(beta) * np.abs(c0))
            + 1e-30)


def check_bound(got, want, allowed, what):
    err = np.abs(got.astype(np.float64) - want)
    worst = np.unravel_index(np.argmax(err - allowed), err.shape) if err.size else ()
    assert (err <= allowed).all(), (f"{what}: error {err[worst]:.3g} over the bound "
                                    f"{allowed[worst]:.3g} at {worst}")


@st.composite
def gemm_case(draw, level, bf16=False):
    mr, nr = gemm.kernel_shape(level)
    dims = awkward(mr, nr, 32)
    M, N, K = draw(dims), draw(dims), draw(dims)
    ta, tb = draw(st.booleans()), draw(st.booleans())
    alpha = draw(st.sampled_from([1.0, -0.5, 2.5, 0.0]))
    beta = draw(st.sampled_from([0.0, 1.0, -2.0, 0.25]))
    blocks = draw(st.one_of(st.none(), st.fixed_dictionaries({
        "mc": st.integers(1, 40), "kc": st.integers(1, 40), "nc": st.integers(1, 80),
        "order": st.sampled_from(gemm.ORDERS)})))
    path = draw(st.sampled_from(gemm.bf16_paths(level))) if bf16 else None
    return dict(M=M, N=N, K=K, ta=ta, tb=tb, alpha=alpha, beta=beta, blocks=blocks, path=path,
                la=draw(layouts), lb=draw(layouts), lc=draw(layouts),
                threads=draw(st.sampled_from([1, 2])), seed=draw(st.integers(0, 2**32 - 1)))


def _run_gemm(case, level, bf16):
    rng = np.random.default_rng(case["seed"])
    M, N, K, ta, tb = (case[k] for k in ("M", "N", "K", "ta", "tb"))
    dt = np.uint16 if bf16 else np.float32
    a = operand(rng, *((K, M) if ta else (M, K)), *case["la"], dtype=dt)
    b = operand(rng, *((N, K) if tb else (K, N)), *case["lb"], dtype=dt)
    out = operand(rng, M, N, *case["lc"])
    c0 = out.astype(np.float64)
    fn = gemm.matmul_bf16 if bf16 else gemm.matmul
    extra = {"path": case["path"]} if bf16 else {}
    fn(a, b, trans_a=ta, trans_b=tb, out=out, alpha=case["alpha"], beta=case["beta"],
       threads=case["threads"], blocks=case["blocks"], level=level, **extra)
    a64 = (gemm.bf16_to_f32(np.ascontiguousarray(a)) if bf16 else a).astype(np.float64)
    b64 = (gemm.bf16_to_f32(np.ascontiguousarray(b)) if bf16 else b).astype(np.float64)
    a64, b64 = (a64.T if ta else a64), (b64.T if tb else b64)
    want = case["alpha"] * (a64 @ b64) + case["beta"] * c0
    check_bound(out, want, bound(a64, b64, c0, case["alpha"], case["beta"], K),
                f"{'bf16 ' + case['path'] if bf16 else 'f32'} {M}x{N}x{K}")


@given(data=st.data())
def test_matmul(level, data):
    _run_gemm(data.draw(gemm_case(level)), level, bf16=False)


@given(data=st.data())
def test_matmul_bf16(level, data):
    _run_gemm(data.draw(gemm_case(level, bf16=True)), level, bf16=True)


@given(rows=st.integers(1, 9), cols=st.integers(2, 9), step=st.integers(2, 4))
def test_matmul_refuses_rows_whose_elements_are_apart(rows, cols, step):
    a = np.zeros((rows, cols * step), np.float32)[:, ::step]
    b = np.zeros((cols, 3), np.float32)
    with pytest.raises(ValueError, match="not adjacent"):
        gemm.matmul(a, b)


# ---------------------------------------------------------------- the layers

@given(N=awkward(16, top=40), C=awkward(16, 32, top=200), seed=st.integers(0, 2**32 - 1))
def test_layernorm(level, N, C, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 2, (N, C)).astype(np.float32)
    w, b = rng.normal(1, .5, C).astype(np.float32), rng.normal(0, .5, C).astype(np.float32)
    out, mean, rstd = np.empty_like(x), np.empty(N, np.float32), np.empty(N, np.float32)
    layers.layernorm_forward(x, w, b, out, mean, rstd)
    x64 = x.astype(np.float64)
    mu = x64.mean(1, keepdims=True)
    r = 1 / np.sqrt(((x64 - mu) ** 2).mean(1, keepdims=True) + 1e-5)
    xhat = (x64 - mu) * r
    tol = 64 * C * U32
    np.testing.assert_allclose(out, xhat * w + b, rtol=tol, atol=tol * (np.abs(w).max() + 1))
    dy = rng.normal(0, 1, (N, C)).astype(np.float32)
    dx, dw, db = np.zeros_like(x), np.empty(C, np.float32), np.empty(C, np.float32)
    layers.layernorm_backward(dy, x, w, mean, rstd, dx, dw, db)
    g = dy.astype(np.float64) * w
    want_dx = r * (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True))
    # the terms dx sums are r |g| in size (C = 1: they cancel to 0)
    np.testing.assert_allclose(dx, want_dx, rtol=tol, atol=tol * (r * np.abs(g)).max())
    np.testing.assert_allclose(dw, (dy * xhat).sum(0), rtol=tol * N, atol=tol * N)
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(0), rtol=tol * N, atol=tol * N)


@given(BH=st.integers(1, 3), T=awkward(32, 64, top=90), hd=st.sampled_from([1, 2, 4, 8, 16, 24, 64]),
       tile=st.one_of(st.none(), st.integers(1, 70)), threads=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**32 - 1))
def test_flash_attention_against_float64(level, BH, T, hd, tile, threads, seed):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.normal(0, 1, (BH, T, hd)).astype(np.float32) for _ in range(4))
    scale = 1 / np.sqrt(hd)
    o, lse = np.empty_like(q), np.empty((BH, T), np.float32)
    layers.flash_forward(q, k, v, o, lse, scale, tile=tile, threads=threads)
    q64, k64, v64, do64 = (x.astype(np.float64) for x in (q, k, v, do))
    s = scale * q64 @ k64.transpose(0, 2, 1)
    s[:, ~np.tri(T, dtype=bool)] = -np.inf
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    p /= l
    tol = 64 * (T + hd) * U32
    np.testing.assert_allclose(o, p @ v64, rtol=tol, atol=tol)
    np.testing.assert_allclose(lse, (m + np.log(l))[..., 0], rtol=tol, atol=tol)
    dq, dk, dv = (np.zeros_like(q) for _ in range(3))
    layers.flash_backward(q, k, v, o, lse, do, dq, dk, dv, scale, threads=threads)
    dp = do64 @ v64.transpose(0, 2, 1)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    for got, want, name in ((dq, scale * ds @ k64, "dq"),
                            (dk, scale * ds.transpose(0, 2, 1) @ q64, "dk"),
                            (dv, p.transpose(0, 2, 1) @ do64, "dv")):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * (1 + np.abs(want).max()),
                                   err_msg=name)


@given(BH=st.integers(1, 3), T=awkward(16, 32, top=70), seed=st.integers(0, 2**32 - 1))
def test_causal_softmax(level, BH, T, seed):
    rng = np.random.default_rng(seed)
    s = rng.normal(0, 3, (BH, T, T)).astype(np.float32)
    s64 = 0.7 * s.astype(np.float64)
    s64[:, ~np.tri(T, dtype=bool)] = -np.inf
    p = np.exp(s64 - s64.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    layers.attn_softmax_forward(s, 0.7)
    np.testing.assert_allclose(s, p, rtol=64 * T * U32, atol=64 * T * U32)


@given(N=awkward(16, top=30), V=awkward(16, 32, top=300), seed=st.integers(0, 2**32 - 1))
def test_cross_entropy(level, N, V, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 4, (N, V)).astype(np.float32)
    targets = rng.integers(0, V, N).astype(np.int32)
    losses, dl = np.empty(N, np.float32), np.empty_like(logits)
    layers.cross_entropy(logits, targets, losses, dl)
    z = logits.astype(np.float64)
    z = z - z.max(1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    tol = 64 * V * U32
    np.testing.assert_allclose(losses, -np.log(p[np.arange(N), targets]), rtol=tol, atol=tol)
    p[np.arange(N), targets] -= 1
    np.testing.assert_allclose(dl, p / N, rtol=tol, atol=tol / N)


@given(N=awkward(16, top=30), C=awkward(16, top=130), seed=st.integers(0, 2**32 - 1))
def test_gelu_and_swiglu(level, N, C, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 3, (N, C)).astype(np.float32)
    x64 = x.astype(np.float64)
    out = np.empty_like(x)
    layers.gelu_forward(x, out)
    c = np.sqrt(2 / np.pi)
    want = 0.5 * x64 * (1 + np.tanh(c * (x64 + 0.044715 * x64 ** 3)))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    u = rng.normal(0, 2, (N, 2 * C)).astype(np.float32)
    g = np.empty((N, C), np.float32)
    layers.swiglu_forward(u, g)
    a, b = u[:, :C].astype(np.float64), u[:, C:].astype(np.float64)
    np.testing.assert_allclose(g, a / (1 + np.exp(-a)) * b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the decoder

@given(rows=st.integers(1, 9), K=awkward(QBLOCK, TILE, top=300), N=awkward(TILE, 8 * TILE, top=300),
       kind=st.sampled_from(["f32", "int8"]), accumulate=st.booleans(),
       threads=st.sampled_from([1, 2]), pool=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_decoder_product(level, rows, K, N, kind, accumulate, threads, pool, seed):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.1, (K, N)).astype(np.float32)
    bias = rng.normal(0, 1, N).astype(np.float32)
    x = rng.normal(0, 1, (rows, K)).astype(np.float32)
    y0 = rng.normal(0, 1, (rows, N)).astype(np.float32)
    pk = Packed(w, kind, bias)
    y = decode.matmul(pk, x, threads=threads, pool=pool, y=y0.copy(), accumulate=accumulate)
    wd = pk.dequantized()
    if kind == "int8":
        xq, xs = decode.quantize_rows(x)
        xin = decode.dequantize_rows(xq, xs, K)
        # the terms the f32 sums add: per 32-row block, its scale x |q| (the integer sums exact)
        mag = decode.dequantize_rows(np.abs(xq.astype(np.int32)), xs, K) @ np.abs(wd)
        allowed = 4 * (K // QBLOCK + 8) * U32 * mag
    else:
        xin = x.astype(np.float64)
        allowed = 2 * (K + 4) * U32 * (np.abs(xin) @ np.abs(wd))
    want = xin @ wd + bias + (y0 if accumulate else 0)
    allowed = allowed + 4 * U32 * (np.abs(bias) + (np.abs(y0) if accumulate else 0) + np.abs(want))
    check_bound(y, want, allowed + 1e-30, f"{kind} {rows}x{K}x{N}")


@given(rows=st.integers(1, 6), K=awkward(QBLOCK, top=200), seed=st.integers(0, 2**32 - 1),
       zero_row=st.booleans())
def test_quantize_rows(rows, K, seed, zero_row):
    x = np.random.default_rng(seed).normal(0, 3, (rows, K)).astype(np.float32)
    if zero_row:
        x[0] = 0
    p, a = decode.quantize_rows(x)
    K32 = -(-K // QBLOCK) * QBLOCK
    assert p.shape == (rows, K32) and a.shape == (rows, K32 // QBLOCK) and (p[:, K:] == 0).all()
    xp = np.zeros((rows, K32), np.float32)
    xp[:, :K] = x
    amax = np.abs(xp).reshape(rows, -1, QBLOCK).max(axis=2)
    np.testing.assert_array_equal(a, (amax / np.float32(127)).astype(np.float16).astype(np.float32))
    assert np.abs(p).max(initial=0) <= 127
    err = np.abs(decode.dequantize_rows(p, a, K) - x)
    step = np.repeat(a.astype(np.float64), QBLOCK, axis=1)[:, :K]
    assert (err <= (0.5 + 127 * 2.0**-11) * step * (1 + 1e-6) + 1e-30).all()


# ---------------------------------------------------------------- the sampler

@given(V=st.integers(1, 300), temperature=st.sampled_from([0.0, 0.3, 1.0, 5.0]),
       top_k=st.integers(0, 40), top_p=st.sampled_from([1.0, 0.9, 0.5, 1e-6]),
       seed=st.integers(0, 2**32 - 1))
def test_sampler_stays_inside_its_cut(V, temperature, top_k, top_p, seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 3, V).astype(np.float32)
    draws = [Sampler(temperature, top_k, top_p, seed=seed, vocab=V)(logits) for _ in range(2)]
    assert draws[0] == draws[1]  # seeded
    s = Sampler(temperature, top_k, top_p, seed=seed, vocab=V)
    got = {s(logits) for _ in range(20)}
    assert all(0 <= t < V for t in got)
    if temperature == 0:
        assert got == {int(np.argmax(logits))}
        return
    order = np.argsort(-logits.astype(np.float64), kind="stable")
    k = top_k if 0 < top_k < V else V
    z = logits[order[:k]].astype(np.float64) / temperature
    p = np.exp(z - z[0])
    p /= p.sum()
    # the nucleus: the smallest prefix whose mass reaches top_p (ties at its edge allowed)
    edge = int(np.searchsorted(np.cumsum(p), top_p * (1 - 1e-9))) + 1 if top_p < 1 else k
    allowed = set(order[:edge].tolist()) | {int(t) for t in order[:k] if logits[t] == logits[order[edge - 1]]}
    assert got <= allowed, (sorted(got), edge, k)
