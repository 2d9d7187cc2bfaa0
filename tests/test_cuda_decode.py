"""Chapter 4 on the GPU: kernels_cuda/decode.cu on the CPU (tests/cuda_emu), every kernel
against a float64 numpy reference on awkward shapes; then smallem.generating.gpu_decode on the
fake CuPy (tests/fake_cupy, whose kernels run decode.cu through the same emulator), in a child
process: greedy tokens against the CPU decoders, the prompt's GEMMs against token by token,
the graph against launch by launch, the tokens read back once.

No GPU is needed. Every CUDA thread runs on one core (a fiber each), so the grids stay small.
"""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smallem.generating import decode, gpu_decode
from smallem.generating.quant import dequantize_q8, quantize_q8
from smallem.training.ops import LN_EPS, rope_tables

HERE = Path(__file__).parent
FAKE = HERE / "fake_cupy"
I32, F32 = np.int32, np.float32
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                               reason="no C++ compiler for the CUDA emulator")


@pytest.fixture(scope="module")
def emu():
    if shutil.which("g++") is None and shutil.which("clang++") is None:
        pytest.skip("no C++ compiler (g++ or clang++) to build the CUDA emulator")
    sys.path.insert(0, str(HERE / "cuda_emu"))
    try:
        from emulator import Emulator
    finally:
        sys.path.remove(str(HERE / "cuda_emu"))
    return Emulator.of("decode")


def guarded(a, fill=np.nan, pad=8):
    """``a`` in the middle of a larger buffer whose ends hold ``fill``: (the view, the buffer),
    so that a kernel writing past either end shows."""
    a = np.ascontiguousarray(a)
    buf = np.full(a.size + 2 * pad, fill, a.dtype)
    buf[pad:pad + a.size] = a.ravel()
    return buf[pad:pad + a.size].reshape(a.shape), buf


def ends_kept(buf, fill=np.nan, pad=8):
    ends = np.concatenate([buf[:pad], buf[-pad:]])
    if isinstance(fill, float) and math.isnan(fill):
        return np.isnan(ends).all()
    return (ends == fill).all()


def product_launch(func, K, N, lanes, args, warps=4):
    rows = 32 // lanes
    w = math.ceil(N / rows)
    per = min(warps, w)
    return func, (math.ceil(w / per),), (32 * per,), args


# ---------------------------------------------------------------- the products

@pytest.mark.parametrize("K, N", [(1, 1), (31, 5), (33, 9), (101, 3), (96, 33), (256, 2)])
def test_matvec_f32(emu, rng, K, N):
    W = rng.standard_normal((K, N)).astype(F32)
    WT = np.ascontiguousarray(W.T)
    b = rng.standard_normal(N).astype(F32)
    for shift in (0, 1):  # x at a 16-byte boundary, then not: the scalar loads
        xb = rng.standard_normal(K + 1).astype(F32)
        x = xb[shift:shift + K]
        want = x.astype(np.float64) @ W.astype(np.float64)
        lanes = gpu_decode.lanes_for(K // 4 if K % 4 == 0 else K)
        for bias, acc in ((None, 0), (b, 1)):
            y0 = rng.standard_normal(N).astype(F32)
            y, buf = guarded(y0)
            f, g, bl, args = product_launch("matvec_f32", K, N, lanes,
                                            (WT, x, bias, y, I32(K), I32(N), I32(lanes), I32(acc)))
            emu.launch(f, g, bl, args)
            ref = want + (0 if bias is None else b) + (y0 if acc else 0)
            np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * math.sqrt(K))
            assert ends_kept(buf)


@pytest.mark.parametrize("K", [1, 31, 33, 101, 320])
def test_quantize_q8_is_the_cpu_decoders(emu, rng, K):
    """The activation's blocks equal the CPU decoder's (decode.quantize_rows), integers and
    scales, tiny blocks (an f16 subnormal scale) and a zero block included."""
    x = (rng.standard_normal(K) * np.where(np.arange(K) < 32, 1e-6, 3.0)).astype(F32)
    if K > 64:
        x[32:64] = 0
    K32 = -(-K // 32) * 32
    xq, qbuf = guarded(np.zeros(K32, np.int8), fill=np.int8(77))
    xs, sbuf = guarded(np.zeros(K32 // 32, F32))
    nb = K32 // 32
    per = min(8, nb)
    emu.launch("quantize_q8", (math.ceil(nb / per),), (32 * per,), (x, I32(K), xq, xs))
    p, a = decode.quantize_rows(x[None])
    assert np.array_equal(xq, p[0]) and np.array_equal(xs, a[0])
    assert ends_kept(qbuf, np.int8(77)) and ends_kept(sbuf)


def q8_device(W):
    q, s = quantize_q8(W)
    return (np.ascontiguousarray(q.T), np.ascontiguousarray(s.T).view(np.uint16),
            dequantize_q8(q, s, W.shape[0]))


@pytest.mark.parametrize("K, N", [(32, 1), (33, 7), (101, 33), (320, 5)])
def test_int8_products(emu, rng, K, N):
    """dp4a and the f32-FMA form against the same dequantised weights in float64: the f32 form
    multiplies x itself, dp4a the activation quantised as the CPU does (and equals the CPU
    decoder's int8 product to float rounding)."""
    W = rng.standard_normal((K, N)).astype(F32)
    x = rng.standard_normal(K).astype(F32)
    b = rng.standard_normal(N).astype(F32)
    q, s, Wd = q8_device(W)
    K32 = q.shape[1]
    p, a = decode.quantize_rows(x[None])
    xq, xs = p[0], a[0]
    exact = x.astype(np.float64) @ Wd
    quantised = decode.dequantize_rows(p, a, K)[0] @ Wd
    for acc in (0, 1):
        y0 = rng.standard_normal(N).astype(F32)
        base = b + (y0 if acc else 0)
        y, buf = guarded(y0)
        lanes = gpu_decode.lanes_for(K32 // 16, least=2)
        emu.launch(*product_launch("matvec_q8_dp4a", K32, N, lanes,
                                   (q, s, xq, xs, b, y, I32(K32), I32(N), I32(lanes), I32(acc))))
        np.testing.assert_allclose(y, quantised + base, rtol=1e-5, atol=1e-5 * math.sqrt(K))
        # the activation's rounding: at most half a step of each block, over the block's weights
        step = np.repeat(a[0].astype(np.float64), 32)[:K]
        assert (np.abs(y - (exact + base)) <= 0.5 * step @ np.abs(Wd) * 1.01 + 1e-4).all()
        assert ends_kept(buf)
        if not acc:
            pk = decode.Packed(W, "int8", b)
            cpu = decode.matmul(pk, x[None])[0]
            np.testing.assert_allclose(y, cpu, rtol=1e-5, atol=1e-5 * math.sqrt(K))
        y, buf = guarded(y0)
        lanes = gpu_decode.lanes_for(K32 // 16)
        emu.launch(*product_launch("matvec_q8_f32", K32, N, lanes,
                                   (q, s, x, b, y, I32(K), I32(K32), I32(N), I32(lanes), I32(acc))))
        np.testing.assert_allclose(y, exact + base, rtol=1e-5, atol=1e-5 * math.sqrt(K))
        assert ends_kept(buf)


def test_product_lanes_past_the_rows(emu, rng):
    """A warp whose last rows lie past N (N = 5 with 4 rows a warp) writes only N outputs,
    with every lane count a width allows."""
    K, N = 64, 5
    W = rng.standard_normal((K, N)).astype(F32)
    x = rng.standard_normal(K).astype(F32)
    for lanes in (2, 4, 8, 16, 32):
        y, buf = guarded(np.zeros(N, F32))
        emu.launch(*product_launch("matvec_f32", K, N, lanes,
                                   (np.ascontiguousarray(W.T), x, None, y, I32(K), I32(N),
                                    I32(lanes), I32(0)), warps=1))
        np.testing.assert_allclose(y, x.astype(np.float64) @ W, rtol=1e-5, atol=1e-5)
        assert ends_kept(buf)


# ---------------------------------------------------------------- the rest of a layer

@pytest.mark.parametrize("d, rows", [(1, 1), (31, 2), (33, 3), (101, 1)])
def test_norm_rows(emu, rng, d, rows):
    x = (rng.standard_normal((rows, d)) * 3 + 1).astype(F32)
    w, b = rng.standard_normal(d).astype(F32), rng.standard_normal(d).astype(F32)
    for rms in (0, 1):
        y, buf = guarded(np.zeros((rows, d), F32))
        emu.launch("norm_rows", (rows,), (32 * min(8, max(1, math.ceil(d / 32))),),
                   (x, w, None if rms else b, y, I32(d), F32(LN_EPS), I32(rms)))
        want = np.stack([decode._norm(r.astype(np.float64), w, None if rms else b) for r in x])
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
        assert ends_kept(buf)


def test_embed(emu, rng):
    V, d, ctx = 7, 33, 20
    wte = rng.standard_normal((V, d)).astype(F32)
    wpe = rng.standard_normal((ctx, d)).astype(F32)
    tokens = np.array([3, 0, 6, 9, 2] + [1] * 16, I32)  # 9: outside the vocabulary
    for p0, pos in ((0, wpe), (17, wpe), (1, None)):
        state = np.array([p0, 0, 0, 0], I32)
        x = np.zeros((4, d), F32)
        emu.launch("embed", (4,), (64,), (wte, pos, tokens, state, x, I32(d), I32(V), I32(ctx)))
        for r in range(4):
            p, t = p0 + r, tokens[min(p0 + r, tokens.size - 1)]
            if p >= ctx or not 0 <= t < V:
                assert np.isnan(x[r]).all(), (p0, r)
            else:
                np.testing.assert_array_equal(x[r], wte[t] + (0 if pos is None else pos[p]))


def rope_ref(x, cos, sin, p):
    """NumpyCache's RoPE of (H, hd) at position p, in float64."""
    x = x.astype(np.float64).copy()
    a, b = x[:, 0::2].copy(), x[:, 1::2].copy()
    c, s = cos[p].astype(np.float64), sin[p].astype(np.float64)
    x[:, 0::2], x[:, 1::2] = a * c - b * s, a * s + b * c
    return x


@pytest.mark.parametrize("H, hd", [(1, 8), (2, 16), (3, 24)])
@pytest.mark.parametrize("p0", [0, 1, 17])
def test_rope_append(emu, rng, H, hd, p0):
    ctx, rows = 19, 3  # p0 = 17: the third row lies past the context and is skipped
    d = H * hd
    cos, sin = rope_tables(ctx, hd)
    for rope in (True, False):
        qkv = rng.standard_normal((rows, 3 * d)).astype(F32)
        before = qkv.copy()
        kc, kbuf = guarded(np.zeros((H, ctx, hd), F32), fill=-7.0)
        vc, vbuf = guarded(np.zeros((H, ctx, hd), F32), fill=-7.0)
        state = np.array([p0, 0, 0, 0], I32)
        emu.launch("rope_append", (rows,), (32 * max(1, math.ceil(H * hd / 2 / 32)),),
                   (qkv, I32(3 * d), cos if rope else None, sin if rope else None, kc, vc, state,
                    I32(H), I32(hd), I32(ctx)))
        assert ends_kept(kbuf, -7.0) and ends_kept(vbuf, -7.0)
        for r in range(rows):
            p = p0 + r
            q, k, v = (before[r, j * d:(j + 1) * d].reshape(H, hd) for j in range(3))
            if p >= ctx:
                np.testing.assert_array_equal(qkv[r], before[r])
                continue
            turn = (lambda t: rope_ref(t, cos, sin, p)) if rope else (lambda t: t)
            np.testing.assert_allclose(qkv[r, :d].reshape(H, hd), turn(q), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(kc[:, p], turn(k), rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(vc[:, p], v)
            np.testing.assert_array_equal(qkv[r, d:], before[r, d:])
        written = {p0 + r for r in range(rows) if p0 + r < ctx}
        for p in set(range(ctx)) - written:
            assert (kc[:, p] == 0).all() and (vc[:, p] == 0).all()


def test_rope_append_odd_head_without_rope(emu, rng):
    """GPT-2's block may have an odd head size: the last feature has no pair and is copied."""
    H, hd, ctx = 2, 5, 4
    qkv = rng.standard_normal((1, 3 * H * hd)).astype(F32)
    kc, vc = np.zeros((H, ctx, hd), F32), np.zeros((H, ctx, hd), F32)
    emu.launch("rope_append", (1,), (32,), (qkv, I32(3 * H * hd), None, None, kc, vc,
                                            np.array([2, 0], I32), I32(H), I32(hd), I32(ctx)))
    np.testing.assert_array_equal(kc[:, 2], qkv[0, H * hd:2 * H * hd].reshape(H, hd))
    np.testing.assert_array_equal(vc[:, 2], qkv[0, 2 * H * hd:].reshape(H, hd))


@pytest.mark.parametrize("H, hd", [(1, 8), (2, 16), (3, 24)])
@pytest.mark.parametrize("p0, rows", [(0, 1), (1, 1), (17, 1), (0, 3), (15, 4)])
def test_attend(emu, rng, H, hd, p0, rows):
    ctx = 18  # p0 = 15, 4 rows: the last row is past the context and writes nothing
    d, scale = H * hd, 1 / math.sqrt(hd)
    qkv = rng.standard_normal((rows, 3 * d)).astype(F32)
    kc = rng.standard_normal((H, ctx, hd)).astype(F32)
    vc = rng.standard_normal((H, ctx, hd)).astype(F32)
    out, buf = guarded(np.full((rows, d), -5.0, F32))
    threads = max(32, math.ceil(hd / 32) * 32)
    smem = 4 * ((hd + 3) // 4 * 4 + ctx + threads)
    emu.launch("attend", (H, rows), (threads,),
               (qkv, I32(3 * d), kc, vc, out, I32(d), np.array([p0, 0], I32), I32(hd), I32(ctx),
                F32(scale)), shared_mem=smem)
    assert ends_kept(buf)
    for r in range(rows):
        p = p0 + r
        if p >= ctx:
            assert (out[r] == -5.0).all()
            continue
        q = qkv[r, :d].reshape(H, hd).astype(np.float64)
        s = np.einsum("hd,htd->ht", q, kc[:, :p + 1].astype(np.float64)) * scale
        e = np.exp(s - s.max(axis=1, keepdims=True))
        want = np.einsum("ht,htd->hd", e / e.sum(axis=1, keepdims=True), vc[:, :p + 1])
        np.testing.assert_allclose(out[r].reshape(H, hd), want, rtol=1e-4, atol=1e-5)


def test_attend_splits_positions_among_thread_groups(emu, rng):
    """More threads than the head size: positions split among groups and summed."""
    H, hd, ctx, p = 1, 8, 40, 37
    qkv = rng.standard_normal((1, 3 * hd)).astype(F32)
    kc, vc = (rng.standard_normal((H, ctx, hd)).astype(F32) for _ in range(2))
    out = np.zeros((1, hd), F32)
    emu.launch("attend", (1, 1), (64,), (qkv, I32(3 * hd), kc, vc, out, I32(hd),
                                         np.array([p], I32), I32(hd), I32(ctx), F32(0.5)),
               shared_mem=4 * (8 + ctx + 64))
    s = qkv[0, :hd].astype(np.float64) @ kc[0, :p + 1].T.astype(np.float64) * 0.5
    e = np.exp(s - s.max())
    np.testing.assert_allclose(out[0], e / e.sum() @ vc[0, :p + 1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hidden, rows", [(1, 1), (33, 2), (101, 3)])
def test_mlp_act(emu, rng, hidden, rows):
    for swiglu in (0, 1):
        u = (rng.standard_normal((rows, hidden * (2 if swiglu else 1))) * 3).astype(F32)
        g, buf = guarded(np.zeros((rows, hidden), F32))
        emu.launch("mlp_act", (2,), (64,), (u, g, I32(hidden), I32(rows), I32(swiglu)))
        x = u.astype(np.float64)
        if swiglu:
            a, b = x[:, :hidden], x[:, hidden:]
            want = a / (1 + np.exp(-a)) * b
        else:
            want = 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)
        assert ends_kept(buf)


def test_add_rows(emu, rng):
    rows, n = 3, 37
    src, b = rng.standard_normal((rows, n)).astype(F32), rng.standard_normal(n).astype(F32)
    for s, bias in ((src, b), (None, b), (src, None)):
        d0 = rng.standard_normal((rows, n)).astype(F32)
        dst, buf = guarded(d0)
        emu.launch("add_rows", (1,), (64,), (dst, s, bias, I32(rows), I32(n)))
        want = d0 + (0 if s is None else s) + (0 if bias is None else b)
        np.testing.assert_allclose(dst, want, rtol=1e-6, atol=1e-6)
        assert ends_kept(buf)


# ---------------------------------------------------------------- the next token

def pick(emu, logits, temperature=0.0, seed=0, pos=5, advance=0, capacity=64, threads=64):
    state = np.array([pos, 0, 0, 0], I32)
    tokens = np.full(capacity, -1, I32)
    emu.launch("pick_token", (1,), (threads,),
               (logits, I32(logits.size), F32(temperature), np.uint32(seed), state, tokens,
                I32(capacity), I32(advance)))
    return state[0], tokens


def test_pick_token_greedy(emu, rng):
    for V in (1, 31, 200):
        logits = rng.standard_normal(V).astype(F32)
        state, tokens = pick(emu, logits)
        assert state == 5 and tokens[5] == np.argmax(logits)
        assert (np.delete(tokens, 5) == -1).all()
    logits = np.zeros(100, F32)
    logits[[17, 60, 90]] = 3.0        # a tie: the first, as numpy's argmax
    assert pick(emu, logits)[1][5] == 17
    logits[40] = np.nan               # a NaN wins, as in numpy
    assert pick(emu, logits)[1][5] == 40 == np.argmax(logits)
    state, tokens = pick(emu, rng.standard_normal(9).astype(F32), pos=6, advance=1)
    assert state == 7 and tokens[7] >= 0 and tokens[6] == -1
    state, tokens = pick(emu, rng.standard_normal(9).astype(F32), pos=63, advance=1, capacity=64)
    assert state == 64 and (tokens == -1).all()  # past the buffer: the position moves, no write


def test_pick_token_samples_by_gumbel_max(emu, rng):
    """A temperature draws argmax(logits + T g), g the hash's Gumbel noise at (seed, position):
    the same draw on the host; the same (seed, position) gives the same token; the draws
    follow softmax(logits / T)."""
    V, T = 50, 0.7
    logits = rng.standard_normal(V).astype(F32)
    for seed, pos in ((0, 0), (1, 0), (0, 1), (12345, 17)):
        noisy = logits.astype(np.float64) + T * gpu_decode.gumbel_noise(seed, pos + 1, V)
        top2 = np.sort(noisy)[-2:]
        state, tokens = pick(emu, logits, T, seed, pos, advance=1)
        if top2[1] - top2[0] > 1e-4:
            assert tokens[pos + 1] == np.argmax(noisy)
        assert pick(emu, logits, T, seed, pos, advance=1)[1][pos + 1] == tokens[pos + 1]
    # the noise itself: Gumbel(0, 1), mean Euler's gamma, variance pi^2 / 6
    g = np.concatenate([gpu_decode.gumbel_noise(s, p, 1000) for s in range(5) for p in range(4)])
    assert abs(g.mean() - 0.5772) < 0.03 and abs(g.var() - math.pi ** 2 / 6) < 0.1
    p = np.exp(logits / T - (logits / T).max())
    p /= p.sum()
    draws = np.array([np.argmax(logits + T * gpu_decode.gumbel_noise(7, i, V))
                      for i in range(4000)])
    freq = np.bincount(draws, minlength=V) / draws.size
    assert np.abs(freq - p).max() < 0.03


def test_put_token_and_advance(emu):
    state, tokens = np.array([3, 0], I32), np.zeros(5, I32)
    emu.launch("put_token", (1,), (32,), (state, tokens, I32(42), I32(5)))
    assert tokens.tolist() == [0, 0, 0, 42, 0]
    emu.launch("advance_position", (1,), (32,), (state, I32(2)))
    assert state[0] == 5
    emu.launch("put_token", (1,), (32,), (state, tokens, I32(9), I32(5)))  # past the end
    assert tokens.tolist() == [0, 0, 0, 42, 0]
    emu.launch("advance_position", (1,), (32,), (state, I32(-5)))
    assert state[0] == 0


def test_crossover_and_lanes():
    times = {(64, True): 1.0, (64, False): 3.0, (1024, True): 2.0, (1024, False): 2.0,
             (8192, True): 5.0, (8192, False): 4.0}
    table = gpu_decode.dp4a_crossover([64, 1024, 8192], lambda w, d: times[w, d])
    assert table == {64: True, 1024: False, 8192: False}
    assert gpu_decode.uses_dp4a(table, 32) and gpu_decode.uses_dp4a(table, 100)
    assert not gpu_decode.uses_dp4a(table, 4096) and gpu_decode.uses_dp4a(None, 4096)
    for bad in ([], [0], [2.5], [True]):
        with pytest.raises(ValueError, match="widths"):
            gpu_decode.dp4a_crossover(bad, lambda w, d: 1.0)
    assert [gpu_decode.lanes_for(c) for c in (1, 4, 5, 8, 9, 32, 128, 500)] == \
        [1, 1, 2, 2, 4, 8, 32, 32]
    assert gpu_decode.lanes_for(1, least=2) == 2


# ---------------------------------------------------------------- the decoder, without a GPU

def test_decoder_without_cupy_says_so():
    from smallem.plumbing import cuda
    if cuda.why_unavailable() is None:
        pytest.skip("CuPy and a device are present")
    with pytest.raises(cuda.GPUUnavailable, match="no GPU for smallem"):
        gpu_decode.GPUDecoder(tiny("gpt2"))
    with pytest.raises(TypeError, match="GPT"):
        gpu_decode.GPUDecoder(object())


def tiny(block, tied=True, embedding=1.0, vocab=64, seed=7):
    """A random model far from the init's near-uniform logits (weights of unit gain), so that
    greedy tokens are not decided by rounding: d 32, 2 layers, 2 heads, context 32."""
    from smallem.training.model import GPT, Config
    cfg = Config("tiny", d_model=32, n_layer=2, n_head=2, context=32, vocab=vocab, block=block,
                 tied=tied)
    m = GPT(cfg, "numpy", seed=1)
    rng = np.random.default_rng(seed)
    for name, p in m.params.items():
        if name in ("wte", "wpe", "lm_head"):
            p[...] = rng.standard_normal(p.shape) * embedding
        elif p.ndim == 2:
            p[...] = rng.standard_normal(p.shape) / math.sqrt(p.shape[0])
        elif name.endswith(".w"):  # norm gains
            p[...] = 1 + 0.2 * rng.standard_normal(p.shape)
        else:
            p[...] = 0.2 * rng.standard_normal(p.shape)
    return m


def dequantised(m):
    """The f32 model the int8 decoder without dp4a computes: every product's weights (the head
    too, untied so that the embedding stays f32) replaced by their Q8_0 values."""
    from smallem.training.model import GPT, Config
    c = m.config
    ref = GPT(Config(**{**c.to_dict(), "tied": False}), "numpy", seed=1)
    q8 = lambda w: dequantize_q8(*quantize_q8(w), w.shape[0]).astype(F32)  # noqa: E731
    for k, p in ref.params.items():
        if k in m.params:
            p[...] = q8(m.params[k]) if k.endswith(("attn.w", "proj.w", "fc.w", "fc2.w")) \
                else m.params[k]
    head = m.params["wte"] if c.tied else m.params["lm_head"]
    ref.params["lm_head"][...] = q8(np.ascontiguousarray(head.T)).T
    return ref


def agree(gpu_tokens, cpu, prompt, margin):
    """Walk a CPU decoder along the GPU's tokens: each must be the CPU's argmax, or within
    ``margin`` of its largest logit (a near tie, which rounding may decide). The near ties."""
    cpu.reset()
    logits, ties = cpu.prefill(prompt), []
    for i, t in enumerate(gpu_tokens):
        best = int(np.argmax(logits))
        if t != best:
            gap = logits[best] - logits[t]
            assert gap < margin, (i, gpu_tokens, best, gap)
            ties.append(i)
        if i + 1 < len(gpu_tokens):
            logits = cpu.step(t)
    return ties


PROMPT = [5, 17, 3, 40, 9]
N_TOKENS = 16


def fake_decoding(block):
    """Run in a child whose `cupy` is tests/fake_cupy: the decoder's orchestration with
    decode.cu's kernels on the emulator."""
    import cupy
    from smallem.plumbing import cuda
    assert cupy.__version__ == "fake" and cuda.why_unavailable() is None
    # untied heads: a tied one sends these random models back to the token they read, and
    # 16 tokens of one id would show little (the prompt's test takes the tied heads)
    m = tiny(block, tied=False, embedding=1.0 if block == "gpt2" else 0.3)
    report = {}

    def run(dec, what, n=N_TOKENS):
        cupy._TRANSFERS.update(to_device=0, to_host=0)
        got = dec.generate_greedy(PROMPT, n)
        # the prompt goes up once, the tokens come back once: nothing else crosses
        assert cupy._TRANSFERS == {"to_device": 1, "to_host": 1}, (what, cupy._TRANSFERS)
        assert len(got) == n and all(isinstance(t, int) for t in got)
        report[what] = got
        return got

    # f32 against the CPU's f32 decoder; the graph against launch by launch
    f32 = run(gpu_decode.GPUDecoder(m, "f32", prompt="f32"), "f32")
    report["f32 ties"] = agree(f32, decode.Decoder(m, "f32", threads=1), PROMPT, 1e-3)
    # int8 with dp4a: the CPU int8 decoder's scheme (Q8_0 weights and activations)
    q = run(gpu_decode.GPUDecoder(m, "int8", dp4a=True), "int8 dp4a")
    report["int8 ties"] = agree(q, decode.Decoder(m, "int8", threads=1), PROMPT, 2e-2)
    # the emulator runs a thread a CUDA thread: the checks beside the main ones take 8 tokens
    half = N_TOKENS // 2
    if block == "gpt2":
        assert run(gpu_decode.GPUDecoder(m, "f32", graph=False), "f32 launches", half) == f32[:half]
        # int8 without dp4a: f32 activations times the Q8_0 weights, the f32 decoder of the
        # dequantised model (the CPU has no such int8 scheme)
        q2 = run(gpu_decode.GPUDecoder(m, "int8", dp4a=False), "int8 f32 FMAs", half)
        report["int8 f32 FMAs ties"] = agree(q2, decode.Decoder(dequantised(m), "f32", threads=1),
                                             PROMPT, 1e-3)
    else:
        assert run(gpu_decode.GPUDecoder(m, "int8", dp4a=True, graph=False),
                   "int8 launches", half) == q[:half]
    for ties in (v for k, v in report.items() if k.endswith("ties")):
        assert len(ties) <= 1, report
    print(json.dumps(report))


def fake_prompt(block):
    """The prompt as GEMMs (f32 through cuBLAS's stand-in, bf16 through our tensor-core GEMM)
    against the same prompt token by token; the cache they leave decodes on alike."""
    import cupy
    m = tiny(block)
    out = {}
    for dtype in ("f32", "int8"):
        dec = gpu_decode.GPUDecoder(m, dtype, dp4a=True, prompt="f32")
        tokenwise = cupy.asnumpy(dec.prefill_tokenwise(PROMPT))
        assert dec.pos == len(PROMPT)
        after = cupy.asnumpy(dec.step(7))
        for prompt in ("f32", "bf16"):
            d2 = gpu_decode.GPUDecoder(m, dtype, dp4a=True, prompt=prompt)
            got = cupy.asnumpy(d2.prefill(PROMPT))
            scale = np.abs(tokenwise).max()
            # bf16 rounds activations and weights to 8 bits; int8's tokens quantise the
            # activation where the GEMM does not
            tol = (1e-5 if prompt == "f32" else 3e-2) + (3e-2 if dtype == "int8" else 0)
            err = np.abs(got - tokenwise).max() / scale
            assert err < tol, (dtype, prompt, err)
            np.testing.assert_allclose(cupy.asnumpy(d2.step(7)), after, atol=(tol + 1e-5) * scale)
            out[f"{dtype} {prompt}"] = float(err)
    # a prompt after tokens already in the cache: its GEMMs from that position on
    dec = gpu_decode.GPUDecoder(m, "f32", prompt="f32")
    whole = cupy.asnumpy(dec.prefill(PROMPT))
    dec.reset()
    dec.prefill_tokenwise(PROMPT[:2])
    np.testing.assert_allclose(cupy.asnumpy(dec.prefill(PROMPT[2:])), whole, rtol=1e-5,
                               atol=1e-5 * np.abs(whole).max())
    assert dec.pos == len(PROMPT)
    print(json.dumps(out))


def fake_errors():
    """Bad input: one clear error each."""
    import cupy
    m = tiny("modern")
    dec = gpu_decode.GPUDecoder(m, "f32", graph=False)
    c = m.config
    with pytest.raises(ValueError, match="ids must lie"):
        dec.step(c.vocab)
    with pytest.raises(ValueError, match="ids must lie"):
        dec.prefill([1, -1])
    with pytest.raises(TypeError, match="token"):
        dec.step(1.5)
    with pytest.raises(ValueError, match="context"):
        dec.prefill([1] * (c.context + 1))
    with pytest.raises(ValueError, match="fit the context"):
        dec.generate_greedy([1] * 20, 14)
    with pytest.raises(ValueError, match="n: expected"):
        dec.generate_greedy([1], -1)
    with pytest.raises(ValueError, match="temperature"):
        dec.generate([1], 2, temperature=-1)
    assert dec.generate_greedy([1], 0) == []
    with pytest.raises(TypeError, match="GPT"):
        gpu_decode.GPUDecoder("model")
    with pytest.raises(ValueError, match="dtype"):
        gpu_decode.GPUDecoder(m, "f16")
    with pytest.raises(ValueError, match="dp4a"):
        gpu_decode.GPUDecoder(m, "int8", dp4a="yes")
    with pytest.raises(ValueError, match="dp4a_table"):
        gpu_decode.GPUDecoder(m, "int8", dp4a=True, dp4a_table={32: True})
    with pytest.raises(ValueError, match="prompt"):
        gpu_decode.GPUDecoder(m, prompt="f16")
    with pytest.raises(ValueError, match="recurrent"):
        gpu_decode.GPUDecoder(tiny("recurrent"))
    mat = dec.layers[0].qkv
    with pytest.raises(TypeError, match="numpy.ndarray"):
        gpu_decode.product(mat, np.zeros(c.d_model, F32))
    with pytest.raises(ValueError, match="shape"):
        gpu_decode.product(mat, cupy.zeros(c.d_model + 1, dtype=cupy.float32))
    # the "auto" switch follows a measured table, by each product's input width
    auto = gpu_decode.GPUDecoder(m, "int8", dp4a_table={32: False, 64: True})
    assert [x.dp4a for x in auto.layers[0].matrices()] == [False, False, False, True]
    assert all(x.dp4a for x in gpu_decode.GPUDecoder(m, "int8").layers[0].matrices())
    # a temperature draws on the device, the same tokens for the same seed
    a = dec.generate([1, 2], 6, temperature=1.0, seed=3)
    assert a == dec.generate([1, 2], 6, temperature=1.0, seed=3) and len(a) == 6
    dec.reset()
    noisy = cupy.asnumpy(dec.prefill([1, 2])) + gpu_decode.gumbel_noise(3, 2, c.vocab)
    assert a[0] == np.argmax(noisy)  # the first draw, at position 2, followed on the host
    print(json.dumps({"sampled": a}))


def in_fake_cupy(call):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(FAKE), str(HERE.parent)])}
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_cuda_decode as t; t.{call}"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, cwd=HERE.parent)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@needs_cxx
@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_greedy_tokens_on_the_fake_gpu(block):
    """16 greedy tokens of the GPU decoder (its kernels on the emulator) equal the CPU
    decoders' (near ties aside, at most one); the graph's equal launch by launch."""
    report = in_fake_cupy(f"fake_decoding({block!r})")
    assert len(report["f32"]) == N_TOKENS and len(set(report["f32"])) > 2  # not one token over


@needs_cxx
@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_prompt_gemms_equal_token_by_token_on_the_fake_gpu(block):
    in_fake_cupy(f"fake_prompt({block!r})")


@needs_cxx
def test_bad_input_on_the_fake_gpu():
    in_fake_cupy("fake_errors()")


# ---------------------------------------------------------------- on a GPU

def _gpu_reason():
    from smallem.plumbing import cuda
    return cuda.why_unavailable()


@pytest.mark.skipif(_gpu_reason() is not None, reason=f"no GPU: {_gpu_reason()}")
@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_decoder_on_the_gpu(block):
    """On a real device: the greedy tokens of every form against the CPU's, graph and
    launches alike, the prompt's GEMMs against token by token, and a measured dp4a table."""
    import cupy
    m = tiny(block, tied=False, embedding=1.0 if block == "gpt2" else 0.3)
    cases = (("f32", False, decode.Decoder(m, "f32", threads=1), 1e-3),
             ("int8", True, decode.Decoder(m, "int8", threads=1), 2e-2),
             ("int8", False, decode.Decoder(dequantised(m), "f32", threads=1), 1e-3))
    for dtype, dp4a, cpu, margin in cases:
        runs = [gpu_decode.GPUDecoder(m, dtype, dp4a=dp4a, graph=g).generate_greedy(PROMPT, 16)
                for g in (True, False)]
        assert runs[0] == runs[1]
        assert len(agree(runs[0], cpu, PROMPT, margin)) <= 1
    dec = gpu_decode.GPUDecoder(m, "f32", prompt="f32")
    tokenwise = cupy.asnumpy(dec.prefill_tokenwise(PROMPT))
    for prompt, tol in (("f32", 1e-4), ("bf16", 3e-2)):
        got = cupy.asnumpy(gpu_decode.GPUDecoder(m, "f32", prompt=prompt).prefill(PROMPT))
        assert np.abs(got - tokenwise).max() < tol * np.abs(tokenwise).max()
    table = gpu_decode.measured_crossover([64, 4096], repeats=5)
    assert set(table) == {64, 4096} and all(isinstance(v, bool) for v in table.values())
