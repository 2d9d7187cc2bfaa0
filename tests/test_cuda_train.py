"""kernels_cuda/train.cu run on the CPU (tests/cuda_emu), each kernel against the numpy
reference of its layer (smallem.training.ops' Numpy* classes, in float64) on awkward shapes:
one row, rows and widths that are not multiples of 4 or 32, sequences of 1, 5, 17 and 67
tokens, head sizes 8, 16 and 24, and grids smaller than the tensor (the grid-stride loops).

The emulator runs every CUDA thread on one core (a fiber each), so the launches here use small grids.
"""

import math
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from smallem import checks
from smallem.plumbing import build
from smallem.training.ops import NumpyOps, rope_tables

sys.path.insert(0, str(Path(__file__).parent / "cuda_emu"))
from emulator import Emulator  # noqa: E402

sys.path.pop(0)

i32, i64, f32, f64 = np.int32, np.int64, np.float32, np.float64
REF = NumpyOps()
SRC = (Path(__file__).parent.parent / "kernels_cuda" / "train.cu").read_text()


@pytest.fixture(scope="module")
def emu():
    if not (shutil.which("g++") or shutil.which("clang++")):
        pytest.skip("no C++ compiler (g++ or clang++) to build the CUDA emulator")
    return Emulator.of("train")


def close(got, want, k=1, name="result", **tol):
    """checks.assert_close of a float32 result against its float64 reference: the tolerance
    grows with k, the length of the sums behind each element (tol: where a test needs more,
    it says why)."""
    checks.assert_close(np.asarray(got), np.asarray(want, np.float64), k=k, name=name, **tol)


def normal(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def test_constants_match_the_cpu_kernels():
    for cpu, gpu in (("SM_LN_EPS", "TR_LN_EPS"), ("SM_GELU_K", "TR_GELU_K"),
                     ("SM_GELU_A", "TR_GELU_A")):
        value = re.search(rf"#define {gpu} ([0-9.e+-]+)f", SRC).group(1)
        assert np.float32(value) == np.float32(build.header_constant(cpu)), cpu


# ---------------------------------------------------------------- embedding

@pytest.mark.parametrize("B, T, C, V, P", [(1, 1, 7, 5, 1), (2, 5, 33, 11, 9),
                                           (5, 67, 8, 3, 70)])
@pytest.mark.parametrize("positions", [True, False])
def test_embedding(emu, rng, B, T, C, V, P, positions):
    idx = rng.integers(0, V, (B, T)).astype(np.int32)
    wte, wpe = normal(rng, V, C), normal(rng, P, C)
    out = np.full((B * T, C), np.nan, np.float32)
    emu.launch("embedding_fwd", (3,), (64,), (idx, wte, wpe if positions else None, out,
                                              i32(B * T), i32(T), i32(V), i32(C)))
    want = np.empty((B * T, C))
    REF.embedding(idx, wte.astype(f64), wpe.astype(f64) if positions else None, want)
    close(out, want)

    dout, dwte = normal(rng, B * T, C), normal(rng, V, C)  # dwte holds the head's share
    dwpe = np.full((P, C), np.nan, np.float32)
    want_te, want_pe = dwte.astype(f64), np.empty((P, C))
    REF.embedding_backward(idx, dout.astype(f64), want_te, want_pe if positions else None)
    block = 32 * -(-min(C, 64) // 32)
    emu.launch("embedding_bwd_wte", (-(-C // block), V), (block,),
               (idx, dout, dwte, i32(B * T), i32(C)))
    close(dwte, want_te, k=B * T, name="dwte")
    if positions:
        emu.launch("embedding_bwd_wpe", (2,), (64,), (dout, dwpe, i32(B), i32(T), i32(P),
                                                      i32(C)))
        close(dwpe, want_pe, k=B, name="dwpe")


def test_embedding_marks_a_bad_id(emu, rng):
    idx = np.array([[0, 7, -1]], np.int32)
    wte, out = normal(rng, 4, 5), np.zeros((3, 5), np.float32)
    emu.launch("embedding_fwd", (1,), (32,), (idx, wte, None, out, i32(3), i32(3), i32(4),
                                              i32(5)))
    assert np.array_equal(out[0], wte[0]) and np.isnan(out[1:]).all()


# ---------------------------------------------------------------- the norms

NORM_SHAPES = [(1, 7), (7, 33), (33, 100), (9, 64)]


@pytest.mark.parametrize("N, C", NORM_SHAPES)
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "residual_layernorm",
                                  "residual_nobias"])
def test_norm_forward(emu, rng, N, C, kind):
    x, t, bias = normal(rng, N, C, scale=3.0), normal(rng, N, C), normal(rng, C)
    w, b = normal(rng, C), normal(rng, C)
    out, mid = np.full((N, C), np.nan, np.float32), np.full((N, C), np.nan, np.float32)
    mean, rstd = np.full(N, np.nan, np.float32), np.full(N, np.nan, np.float32)
    rms = kind == "rmsnorm"
    fused = kind.startswith("residual")
    args = (x, t if fused else None, bias if kind == "residual_layernorm" else None,
            mid if fused else None, w, None if rms else b, out, None if rms else mean, rstd,
            i32(N), i32(C))
    emu.launch("norm_fwd", (2,), (64,), args)  # 2 rows a block, 4 a pass: grid-stride
    X, W, Bv = x.astype(f64), w.astype(f64), b.astype(f64)
    wm, wr, wo = np.empty(N), np.empty(N), np.empty((N, C))
    if rms:
        REF.rmsnorm(X, W, wo, wr)
    elif fused:
        wmid = np.empty((N, C))
        tb = bias.astype(f64) if kind == "residual_layernorm" else np.zeros(C)
        REF.residual_layernorm(X, t.astype(f64), tb, wmid, W, Bv, wo, wm, wr)
        close(mid, wmid, k=2, name="mid")
    else:
        REF.layernorm(X, W, Bv, wo, wm, wr)
    close(out, wo, k=C, name="out")
    close(rstd, wr, k=C, name="rstd")
    if not rms:
        close(mean, wm, k=C, name="mean")


def colsums(emu, dy, x, mean, rstd, dw, db, rows):
    N, C = dy.shape
    parts = -(-N // rows)
    pw = np.full(parts * C, np.nan, np.float32) if dw is not None else None
    pb = np.full(parts * C, np.nan, np.float32) if db is not None else None
    emu.launch("colsum_partial", (-(-C // 32), parts), (32, 8),
               (dy, x, mean, rstd, pw, pb, i32(N), i32(C), i32(rows)))
    emu.launch("colsum_finish", (2,), (32,), (pw, pb, dw, db, i32(parts), i32(C)))


@pytest.mark.parametrize("N, C", NORM_SHAPES)
@pytest.mark.parametrize("rms", [False, True], ids=["layernorm", "rmsnorm"])
def test_norm_backward(emu, rng, N, C, rms):
    x, dy, w = normal(rng, N, C, scale=2.0), normal(rng, N, C), normal(rng, C)
    X, W = x.astype(f64), w.astype(f64)
    mean, rstd = np.empty(N), np.empty(N)
    REF.layernorm(X, W, np.zeros(C), np.empty((N, C)), mean, rstd)
    if rms:
        REF.rmsnorm(X, W, np.empty((N, C)), rstd)
    dx0 = normal(rng, N, C)
    want_dx, want_dw, want_db = dx0.astype(f64), np.empty(C), np.empty(C)
    m32, r32 = mean.astype(f32), rstd.astype(f32)
    if rms:
        REF.rmsnorm_backward(dy.astype(f64), X, W, rstd, want_dx, want_dw)
    else:
        REF.layernorm_backward(dy.astype(f64), X, W, mean, rstd, want_dx, want_dw, want_db)
    dx = dx0.copy()
    emu.launch("norm_bwd", (1,), (96,), (dy, x, w, None if rms else m32, r32, dx, i32(N),
                                         i32(C)))
    close(dx, want_dx, k=C, name="dx")
    dw, db = np.full(C, np.nan, np.float32), np.full(C, np.nan, np.float32)
    colsums(emu, dy, x, None if rms else m32, r32, dw, None if rms else db, rows=5)
    close(dw, want_dw, k=N, name="dw")
    if not rms:
        close(db, want_db, k=N, name="db")


@pytest.mark.parametrize("N, C, rows", [(1, 1, 1), (7, 33, 3), (40, 70, 64), (33, 129, 8)])
def test_bias_backward(emu, rng, N, C, rows):
    dy = normal(rng, N, C)
    db = np.full(C, np.nan, np.float32)
    colsums(emu, dy, None, None, None, None, db, rows)
    close(db, dy.astype(f64).sum(axis=0), k=N)


# ---------------------------------------------------------------- element-wise layers

@pytest.mark.parametrize("N, C", [(1, 1), (7, 33), (5, 131)])
def test_residual_and_bias_adds(emu, rng, N, C):
    x, t, bias = normal(rng, N, C), normal(rng, N, C), normal(rng, C)
    n, out = i64(N * C), np.full((N, C), np.nan, np.float32)
    emu.launch("add_rows", (2,), (64,), (x, t, None, out, n, i32(C)))
    assert np.array_equal(out, x + t)
    emu.launch("add_rows", (3,), (32,), (x, t, bias, out, n, i32(C)))
    assert np.array_equal(out, x + (t + bias))       # the unfused CPU order, bit for bit
    y = x.copy()
    emu.launch("add_rows", (1,), (64,), (y, None, bias, y, n, i32(C)))  # in place
    assert np.array_equal(y, x + bias)


@pytest.mark.parametrize("N, C", [(1, 1), (7, 33), (5, 131)])
def test_gelu(emu, rng, N, C):
    u, b, dy = normal(rng, N, C, scale=2.0), normal(rng, C), normal(rng, N, C)
    n = i64(N * C)
    g = np.full((N, C), np.nan, np.float32)
    ub = u.copy()
    emu.launch("bias_gelu_fwd", (2,), (64,), (ub, b, g, n, i32(C)))
    want_u, want_g = u.astype(f64), np.empty((N, C))
    REF.bias_gelu(want_u, b.astype(f64), want_g)
    close(ub, want_u, name="u + b")
    # 1 + tanh(...) cancels for negative u, and gelu' is a difference of terms of the size of
    # u that cancel there too: their f32 errors are eps times |u| (times dy), not times the
    # result, hence an absolute tolerance of a few eps * max|u|
    atol = 8 * 1.2e-7 * np.abs(ub).max()
    close(g, want_g, name="gelu", atol=atol)
    plain, want_plain = np.full((N, C), np.nan, np.float32), np.empty((N, C))
    emu.launch("bias_gelu_fwd", (2,), (64,), (u, None, plain, n, i32(C)))
    REF.gelu(u.astype(f64), want_plain)
    close(plain, want_plain, name="gelu without bias", atol=8 * 1.2e-7 * np.abs(u).max())
    dx = dy.copy()  # in place: dx is dy, as the model calls it
    emu.launch("gelu_bwd", (3,), (32,), (ub, dx, dx, n))
    want_dx = np.empty((N, C))
    REF.gelu_backward(ub.astype(f64), dy.astype(f64), want_dx)
    close(dx, want_dx, name="gelu backward", atol=atol * np.abs(dy).max())


@pytest.mark.parametrize("N, h", [(1, 1), (7, 33), (3, 96)])
def test_swiglu(emu, rng, N, h):
    u, dg = normal(rng, N, 2 * h, scale=3.0), normal(rng, N, h)
    g = np.full((N, h), np.nan, np.float32)
    du = np.full((N, 2 * h), np.nan, np.float32)
    emu.launch("swiglu_fwd", (2,), (64,), (u, g, i32(N), i32(h)))
    emu.launch("swiglu_bwd", (2,), (64,), (u, dg, du, i32(N), i32(h)))
    want_g, want_du = np.empty((N, h)), np.empty((N, 2 * h))
    REF.swiglu(u.astype(f64), want_g)
    REF.swiglu_backward(u.astype(f64), dg.astype(f64), want_du)
    close(g, want_g, name="g")
    close(du, want_du, name="du")


# ---------------------------------------------------------------- RoPE and the heads

@pytest.mark.parametrize("BH, T, hd", [(1, 1, 2), (3, 5, 8), (2, 17, 24)])
@pytest.mark.parametrize("inverse", [False, True])
def test_rope(emu, rng, BH, T, hd, inverse):
    q, k = normal(rng, BH, T, hd), normal(rng, BH, T, hd)
    cos, sin = rope_tables(T, hd)
    gq, gk = q.copy(), k.copy()
    emu.launch("rope", (2,), (64,), (gq, gk, cos, sin, i32(BH), i32(T), i32(hd), i32(inverse)))
    wq, wk = q.astype(f64), k.astype(f64)
    REF.rope(wq, wk, cos.astype(f64), sin.astype(f64), inverse=inverse)
    close(gq, wq, name="q")
    close(gk, wk, name="k")


def heads(x, B, T, H, hd):  # (B*T, parts*H*hd) -> parts x (B, H, T, hd), float64
    return x.astype(f64).reshape(B, T, -1, H, hd).transpose(2, 0, 3, 1, 4)


@pytest.mark.parametrize("B, T, H, hd, with_rope", [
    (1, 1, 1, 2, False), (1, 1, 1, 2, True), (2, 5, 3, 8, False), (2, 5, 3, 8, True),
    (1, 17, 2, 24, False), (1, 17, 2, 24, True), (2, 3, 2, 7, False)])  # RoPE: hd even
def test_qkv_split_and_merge(emu, rng, B, T, H, hd, with_rope):
    N, C = B * T, H * hd
    qkv = normal(rng, N, 3 * C)
    cos, sin = rope_tables(T, hd) if with_rope else (None, None)
    q, k, v = (np.full((B, H, T, hd), np.nan, np.float32) for _ in range(3))
    dims = (i32(B), i32(T), i32(H), i32(hd))
    emu.launch("qkv_split", (3,), (64,), (qkv, q, k, v, cos, sin, *dims))
    wq, wk, wv = heads(qkv, B, T, H, hd)
    if with_rope:
        REF.rope(wq, wk, cos.astype(f64), sin.astype(f64))
    for got, want, name in ((q, wq, "q"), (k, wk, "k"), (v, wv, "v")):
        close(got, want, name=name)
    dq, dk, dv = (normal(rng, B, H, T, hd) for _ in range(3))
    dqkv = np.full((N, 3 * C), np.nan, np.float32)
    emu.launch("qkv_merge", (3,), (64,), (dq, dk, dv, dqkv, cos, sin, *dims))
    wdq, wdk = dq.astype(f64), dk.astype(f64)
    if with_rope:
        REF.rope(wdq, wdk, cos.astype(f64), sin.astype(f64), inverse=True)
    want = np.stack([wdq, wdk, dv.astype(f64)]).transpose(1, 3, 0, 2, 4).reshape(N, 3 * C)
    close(dqkv, want, name="dqkv")


# ---------------------------------------------------------------- attention in tiles

class Cache:  # the fields of AttnCache the reference reads and writes
    def __init__(self, B, H, T, hd, dtype):
        self.q, self.k, self.v, self.o = (np.zeros((B, H, T, hd), dtype) for _ in range(4))
        self.p, self.rope = np.zeros((B, H, T, T), dtype), None


def bound(hd):
    return next(b for b in (16, 32, 64) if hd <= b)


@pytest.mark.parametrize("B, H, T, hd", [(1, 1, 1, 8), (2, 2, 5, 16), (1, 2, 17, 24),
                                         (2, 1, 67, 8), (1, 1, 33, 64), (1, 1, 40, 37)])
def test_attention_forward_and_backward(emu, rng, B, H, T, hd):
    N, C, BH, HD = B * T, H * hd, B * H, bound(hd)
    qkv, dout = normal(rng, N, 3 * C), normal(rng, N, C)
    ref = Cache(B, H, T, hd, f64)
    want_out = np.empty((N, C))
    REF.attention(qkv.astype(f64), want_out, ref)
    want_dqkv = np.empty((N, 3 * C))
    REF.attention_backward(dout.astype(f64), want_dqkv, ref)
    with np.errstate(divide="ignore"):
        s = ref.q @ ref.k.swapaxes(-1, -2) / math.sqrt(hd) + np.log(np.tril(np.ones((T, T))))
    want_lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)

    q, k, v = (x.astype(f32).copy() for x in (ref.q, ref.k, ref.v))  # (B, H, T, hd)
    o, out = np.full((B, H, T, hd), np.nan, np.float32), np.full((N, C), np.nan, np.float32)
    lse = np.full((B, H, T), np.nan, np.float32)
    grid, scale = (-(-T // 32), BH), f32(1.0 / math.sqrt(hd))
    emu.launch(f"attn_fwd_h{HD}", grid, (32,), (q, k, v, o, out, lse, i32(H), i32(T), i32(hd),
                                                scale))
    close(out, want_out, k=T * hd, name="out")
    close(o, want_out.reshape(B, T, H, hd).transpose(0, 2, 1, 3), k=T * hd, name="o")
    close(lse, want_lse, k=T * hd, name="lse")

    dO, D = np.full((B, H, T, hd), np.nan, np.float32), np.full((B, H, T), np.nan, np.float32)
    emu.launch("attn_bwd_prep", (2,), (64,), (dout, o, dO, D, i32(B), i32(H), i32(T), i32(hd)))
    close(dO, dout.reshape(B, T, H, hd).transpose(0, 2, 1, 3), name="dO")
    close(D, (dO.astype(f64) * o).sum(-1), k=hd, name="D")
    dq, dk, dv = (np.full((B, H, T, hd), np.nan, np.float32) for _ in range(3))
    emu.launch(f"attn_bwd_dkdv_h{HD}", grid, (32,), (q, k, v, dO, lse, D, dk, dv, i32(T),
                                                     i32(hd), scale))
    emu.launch(f"attn_bwd_dq_h{HD}", grid, (32,), (q, k, v, dO, lse, D, dq, i32(T), i32(hd),
                                                   scale))
    wq, wk, wv = heads(want_dqkv, B, T, H, hd)
    for got, want, name in ((dq, wq, "dq"), (dk, wk, "dk"), (dv, wv, "dv")):
        close(got, want, k=T * hd, name=name)


# ---------------------------------------------------------------- loss, sums, optimiser

@pytest.mark.parametrize("N, V", [(1, 5), (7, 33), (33, 256)])
def test_cross_entropy(emu, rng, N, V):
    logits, targets = normal(rng, N, V, scale=4.0), rng.integers(0, V, N).astype(np.int32)
    losses, dlogits = np.full(N, np.nan, np.float32), np.full((N, V), np.nan, np.float32)
    emu.launch("cross_entropy", (2,), (64,), (logits, targets, losses, dlogits, i32(N), i32(V),
                                              f32(1.0 / N)))
    want_l, want_d = np.empty(N), np.empty((N, V))
    REF.cross_entropy(logits.astype(f64), targets, want_l, want_d)
    close(losses, want_l, k=V, name="losses")
    close(dlogits, want_d, k=V, name="dlogits")
    targets[0] = V  # outside the vocabulary: a NaN loss, a zero gradient row
    emu.launch("cross_entropy", (1,), (32,), (logits, targets, losses, dlogits, i32(N), i32(V),
                                              f32(1.0 / N)))
    assert np.isnan(losses[0]) and not dlogits[0].any()


@pytest.mark.parametrize("n, grid", [(1, 1), (1000, 3), (4097, 5)])
def test_sums_and_the_clip_factor(emu, rng, n, grid):
    x = normal(rng, n)
    part, out = np.full(grid, np.nan), np.full(2, np.nan)
    emu.launch("sum_partial", (grid,), (256,), (x, i64(n), i32(0), part))
    emu.launch("sum_finish", (1,), (256,), (part, i32(grid), f64(1.0 / n), out))
    close(out[0], x.astype(f64).mean(), k=n, name="mean")
    emu.launch("sum_partial", (grid,), (256,), (x, i64(n), i32(1), part))
    ss = x.astype(f64) @ x
    for clip in (0.0, 0.5, 1e9):
        emu.launch("norm_finish", (1,), (256,), (part, i32(grid), f64(clip), out))
        norm = math.sqrt(ss)
        close(out, [norm, min(1.0, clip / (norm + 1e-6)) if clip else 1.0], k=n,
              name=f"clip {clip}")
    y = np.full(n, np.nan, np.float32)
    emu.launch("sum_finish", (1,), (256,), (part, i32(grid), f64(1.0), out))
    emu.launch("scale_inv_norm", (2,), (64,), (x, y, i64(n), out, f64(1e-7)))
    close(y, x / (math.sqrt(ss) + 1e-7), k=n, name="x / |x|")


@pytest.mark.parametrize("n", [1, 7, 1000])
def test_axpby(emu, rng, n):
    x, y = normal(rng, n), normal(rng, n)
    z = y.copy()
    emu.launch("axpby", (2,), (64,), (x, z, i64(n), f32(-2.5), f32(1.0)))
    close(z, -2.5 * x.astype(f64) + y, name="beta 1")
    z[:] = np.nan  # beta 0: y is not read
    emu.launch("axpby", (2,), (64,), (x, z, i64(n), f32(3.0), f32(0.0)))
    close(z, 3.0 * x.astype(f64), name="beta 0")


@pytest.mark.parametrize("n", [1, 7, 1001])
@pytest.mark.parametrize("on_device", [True, False], ids=["scale-on-device", "no-scale"])
def test_adamw(emu, rng, n, on_device):
    p, g = normal(rng, n), normal(rng, n)
    m, v = normal(rng, n, scale=0.1), np.abs(normal(rng, n, scale=0.01))
    kw = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=3)
    scale = 0.37 if on_device else 1.0
    want = [x.astype(f64) for x in (p, m, v)]
    REF.adamw(want[0], g.astype(f64), want[1], want[2], grad_scale=scale, **kw)
    gscale = np.array([0.37]) if on_device else None
    emu.launch("adamw", (3,), (64,), (p, g, m, v, i64(n), f32(kw["lr"]), f32(0.9), f32(0.95),
                                      f32(1e-8), f32(0.1), gscale, f32(1.0),
                                      f32(1 - 0.9 ** 3), f32(1 - 0.95 ** 3)))
    for got, w, name in zip((p, m, v), want, "pmv"):
        close(got, w, k=4, name=name)  # four rounded f32 operations a moment, and beta1,
        # beta2 themselves rounded to f32 (the reference keeps them in float64)


# ---------------------------------------------------------------- the whole step, orchestrated
# smallem.training.gpu_ops on tests/fake_cupy (numpy in CuPy's place, every train.cu kernel
# through the emulator), in a process of its own: the same losses as the CPU's kernels, and
# no host transfer but the batch's two uploads a step.

FAKE = Path(__file__).parent / "fake_cupy"
ROOT = Path(__file__).parent.parent

STEPS = r"""
import json, sys
import numpy as np, cupy
from smallem.training.model import Config
from smallem.training.train import Trainer
from smallem.training.gpu_ops import run_steps
out = {}
for block in ("gpt2", "modern"):
    for opt in ("adamw", "muon"):
        cfg = Config("tiny", d_model=32, n_layer=2, n_head=2, context=16, block=block)
        kw = dict(corpus=sys.argv[1], batch_size=2, seq_len=16, steps=10, seed=3, optimizer=opt)
        gpu, cpu = Trainer(cfg, backend="cuda", **kw), Trainer(cfg, backend="kernels", **kw)
        ops = gpu.model.ops
        ops.block_threads, ops.max_blocks = 32, 2  # small blocks: the emulator's threads
        gpu.model.workspace(2, 16)  # made, and RoPE's tables copied, before the steps
        steps, step = [], gpu.train_step

        def counted():
            before = dict(cupy._TRANSFERS)
            r = step()
            assert isinstance(r["loss"], cupy.ndarray) and r["loss"].shape == ()
            assert isinstance(r["grad_norm"], cupy.ndarray) and r["grad_norm"].shape == ()
            steps.append({k: cupy._TRANSFERS[k] - before[k] for k in before})
            return r

        gpu.train_step = counted
        before = dict(cupy._TRANSFERS)
        losses = run_steps(gpu, 3)
        total = {k: cupy._TRANSFERS[k] - before[k] for k in before}
        flat, start = gpu.model.host(gpu.model.flat), cpu.model.flat.copy()
        out[f"{block}-{opt}"] = dict(
            gpu=losses, cpu=run_steps(cpu, 3), steps=steps, total=total,
            weights=float(np.abs(flat - cpu.model.flat).max()),
            moved=float(np.abs(cpu.model.flat - start).max()),
            ns=ops.ns_products, products=ops.products)
print(json.dumps(out))
"""


def run_fake(code, *args, timeout=600):
    import json
    import os
    import subprocess
    env = {**os.environ, "PYTHONPATH": f"{FAKE}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    words = ["def", "return", "self", "import", "class", "(", ")", ":", "\n", "    ", "x", "="]
    path.write_text(" ".join(np.random.default_rng(0).choice(words, 3000)))
    return path


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("g++"), reason="the emulator needs g++")
def test_steps_on_the_gpu_match_the_cpu_and_transfer_only_the_batch(corpus_file):
    """Both blocks, AdamW and Muon: three steps on backend "cuda" give the losses of backend
    "kernels" (Muon's Newton-Schulz in bf16 on the GPU, in f32 on the CPU: hence rtol 1e-4);
    each step uploads the token ids and the targets and reads nothing; run_steps reads the
    three losses with one transfer."""
    results = run_fake(STEPS, corpus_file)
    for name, r in results.items():
        assert r["products"] == "cublas" and r["ns"] == "bf16"
        np.testing.assert_allclose(r["gpu"], r["cpu"], rtol=1e-4, err_msg=name)
        assert r["steps"] == [{"to_device": 2, "to_host": 0}] * 3, name
        assert r["total"] == {"to_device": 6, "to_host": 1}, name
        assert r["weights"] < 2e-2 * r["moved"], (name, r["weights"], r["moved"])


RUN = r"""
import json, sys
import numpy as np, cupy
from smallem.training.model import Config
from smallem.training.train import Trainer, train
cfg = Config("tiny", d_model=32, n_layer=1, n_head=2, context=8, block="modern")
t = Trainer(cfg, backend="cuda", corpus=sys.argv[1], batch_size=2, steps=2, seed=1,
            optimizer="muon", accumulate=2)
t.model.ops.block_threads, t.model.ops.max_blocks = 32, 2
h = train(t, log_path=sys.argv[2] + "/log.jsonl", eval_every=2, eval_batches=1,
          checkpoint_dir=sys.argv[2] + "/ck", sample_bytes=2, progress=False)
back = Trainer.resume(sys.argv[2] + "/ck", corpus=sys.argv[1], backend="cuda")
same = all(np.array_equal(back.model.host(x), t.model.host(y)) for x, y in
           ((back.model.flat, t.model.flat), (back.opt.m, t.opt.m), (back.opt.v, t.opt.v)))
muon = all(np.array_equal(back.opt.state()[k], v) for k, v in t.opt.state().items())
print(json.dumps(dict(loss=h["loss"], bpb=h["val_bpb"], sample=len(h["sample"]), same=same,
                      muon=muon, step=back.step)))
"""


@pytest.mark.skipif(not shutil.which("g++"), reason="the emulator needs g++")
def test_train_loop_log_checkpoint_and_resume_on_the_gpu(corpus_file, tmp_path):
    """train() on the GPU (micro-batches, validation, samples, the log, a checkpoint), and a
    resumed run that finds the same weights and optimiser state on the device."""
    r = run_fake(RUN, corpus_file, tmp_path)
    assert len(r["loss"]) == 2 and all(math.isfinite(x) for x in r["loss"] + r["bpb"])
    assert r["sample"] == len("def ") + 2 and r["same"] and r["muon"] and r["step"] == 2
    assert (tmp_path / "log.jsonl").read_text().count('"kind": "train"') == 2


PRODUCTS = r"""
import json
import numpy as np, cupy
from smallem.plumbing import cuda
from smallem.training.model import GPT, Config
out, rng = {}, np.random.default_rng(0)
for block in ("gpt2", "modern"):
    cfg = Config("tiny", d_model=32, n_layer=1, n_head=2, context=8, block=block)
    x, y = rng.integers(0, 256, (2, 8)), rng.integers(0, 256, (2, 8))
    for products in ("cublas", "ours"):
        m = GPT(cfg, "cuda", seed=1)
        m.ops.products, m.ops.block_threads, m.ops.max_blocks = products, 32, 2
        loss = float(m.forward(x, y))
        m.backward()
        out[f"{block}-{products}"] = [loss, m.host(m.grad_flat).tolist()]
a, b, c = (rng.standard_normal(s).astype(np.float32) for s in ((5, 7), (3, 7), (5, 3)))
want = 2.0 * a.astype(np.float64) @ b.T + c
for kind in ("cublas", "ours", "bf16"):
    m.ops.products, m.ops.ns_products = ("ours", "bf16") if kind == "bf16" else (kind, "f32")
    got = cupy.asarray(c)
    m.ops.ns_matmul(cupy.asarray(a), cupy.asarray(b), trans_b=True, out=got, alpha=2.0, beta=1.0)
    ref = want if kind != "bf16" else 2.0 * (cuda.bf16_to_f32(cuda.bf16_bits(a)).astype(np.float64)
                                             @ cuda.bf16_to_f32(cuda.bf16_bits(b)).T) + c
    out[kind] = float(np.abs(cupy.asnumpy(got) - ref).max())
print(json.dumps(out))
"""


@pytest.mark.skipif(not shutil.which("g++"), reason="the emulator needs g++")
def test_our_products_and_cublas_give_one_step():
    """products="ours" (chapter 2's kernels) and "cublas" give the same loss and gradients;
    alpha and beta, and the bf16 products of Newton-Schulz, are what they say."""
    r = run_fake(PRODUCTS)
    for block in ("gpt2", "modern"):
        (l1, g1), (l2, g2) = r[f"{block}-cublas"], r[f"{block}-ours"]
        assert abs(l1 - l2) < 1e-6 * l1
        close(np.array(g2, np.float32), np.array(g1), k=256, name=f"{block} gradients")
    assert r["cublas"] < 1e-5 and r["ours"] < 1e-5 and r["bf16"] < 1e-5, r


ERRORS = r"""
import json
import numpy as np, cupy
from smallem.training.gpu_ops import CudaOps
from smallem.training.model import GPT, Config
ops, out = CudaOps(), {}
x = cupy.zeros((4, 8), cupy.float32)
w, b = cupy.ones(8, cupy.float32), cupy.zeros(8, cupy.float32)
mean, rstd = cupy.zeros(4, cupy.float32), cupy.zeros(4, cupy.float32)
cases = {
    "numpy": lambda: ops.layernorm(np.zeros((4, 8), np.float32), w, b, x, mean, rstd),
    "float64": lambda: ops.layernorm(x.astype(cupy.float64), w, b, x, mean, rstd),
    "shape": lambda: ops.layernorm(x, cupy.ones(7, cupy.float32), b, x, mean, rstd),
    "strided": lambda: ops.add(x[:, ::2], x[:, ::2], x[:, :4]),
    "ids": lambda: ops.embedding(cupy.zeros((1, 4), cupy.int64), x, None, x),
    "chain": lambda: ops.matmul(x, x),
    "products": lambda: CudaOps(products="tf32"),
    "recurrent": lambda: GPT(Config("r", 32, 1, 2, 8, block="recurrent"), "cuda"),
    "head size": lambda: GPT(Config("h", 160, 1, 2, 8), "cuda").forward(np.zeros((1, 8), np.int32)),
}
for name, call in cases.items():
    try:
        call()
        out[name] = "no error"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@pytest.mark.skipif(not shutil.which("g++"), reason="the emulator needs g++")
def test_bad_arguments_raise_one_clear_error():
    r = run_fake(ERRORS)
    want = {"numpy": "TypeError: x: expected a cupy.ndarray on the GPU, got a numpy.ndarray",
            "float64": "TypeError: x: expected dtype float32, got float64",
            "shape": "ValueError: w: expected shape (8,), got (7,)",
            "strided": "ValueError: a: expected a C-contiguous array",
            "ids": "TypeError: idx: expected dtype int32, got int64",
            "chain": "ValueError: a and b do not chain",
            "products": "ValueError: products: expected one of cublas, ours",
            "recurrent": "ValueError: backend 'cuda' runs the gpt2 and modern blocks, not "
                         "'recurrent'",
            "head size": "ValueError: a.q: head size 80; the attention kernels take head sizes "
                         "up to 64"}
    for name, start in want.items():
        assert r[name].startswith(start), (name, r[name])


def test_the_cuda_backend_without_a_gpu_says_so(corpus_file):
    from smallem.plumbing import cuda
    from smallem.training.model import GPT
    from smallem.training.ops import make_ops
    from smallem.training.train import TrainSettings, Trainer
    if cuda.why_unavailable() is None:
        pytest.skip("a GPU is present: the no-GPU path is not taken")
    assert "cuda" in TrainSettings.__dataclass_fields__["backend"].metadata["choices"]
    for call in (lambda: make_ops("cuda"), lambda: GPT("s", "cuda"),
                 lambda: Trainer("s", corpus=corpus_file, backend="cuda")):
        with pytest.raises(cuda.GPUUnavailable, match="no GPU for smallem"):
            call()


# ---------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("products", ["cublas", "ours"])
@pytest.mark.parametrize("block", ["gpt2", "modern"])
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_steps_on_a_gpu_match_the_cpu(products, block, optimizer, corpus_file):
    """The same steps on a real device, with either kind of product: the losses of the CPU's
    kernels, and the weights they leave."""
    from smallem.plumbing import cuda
    from smallem.training.gpu_ops import run_steps
    from smallem.training.model import Config
    from smallem.training.train import Trainer
    if cuda.why_unavailable() is not None:
        pytest.skip(f"no GPU: {cuda.why_unavailable()}")
    cfg = Config("tiny", d_model=64, n_layer=2, n_head=2, context=40, block=block)
    kw = dict(corpus=corpus_file, batch_size=3, seq_len=37, steps=10, seed=5,
              optimizer=optimizer)
    gpu, cpu = Trainer(cfg, backend="cuda", **kw), Trainer(cfg, backend="kernels", **kw)
    gpu.model.ops.products = products
    start = cpu.model.flat.copy()
    got, want = run_steps(gpu, 3), run_steps(cpu, 3)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    moved = np.abs(cpu.model.flat - start).max()
    assert np.abs(gpu.model.host(gpu.model.flat) - cpu.model.flat).max() < 2e-2 * moved
