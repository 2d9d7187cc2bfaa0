"""Chapter 3: every layer's backward against finite differences, every C kernel
against the numpy reference (each ISA level), the whole model against PyTorch."""

import math

import numpy as np
import pytest

from smallem.training import layers
from smallem.checks import assert_close
from smallem.training.model import CONFIGS, GPT, Config, KernelOps, NumpyOps, Workspace

TINY = Config("tiny", d_model=12, n_layer=2, n_head=3, context=7)
TINY_UNTIED = Config("tiny-untied", d_model=8, n_layer=1, n_head=2, context=5, tied=False)
TINY_MODERN = Config("tiny-modern", d_model=12, n_layer=2, n_head=3, context=7, block="modern")
TINY_MODERN_UNTIED = Config("tiny-modern-untied", d_model=8, n_layer=1, n_head=2, context=5,
                            block="modern", tied=False)
TINY_RECURRENT = Config("tiny-recurrent", d_model=12, n_layer=2, n_head=3, context=7,
                        block="recurrent")
ALL_TINY = [TINY, TINY_UNTIED, TINY_MODERN, TINY_MODERN_UNTIED, TINY_RECURRENT]
ALL_IDS = ["tied", "untied", "modern", "modern-untied", "recurrent"]


# ---------------------------------------------------------------- finite differences

def fd_check(f, inputs: dict, grads: dict, rng, eps=1e-6, samples=40):
    """``f()`` returns a scalar computed from ``inputs`` (float64, modified in place);
    ``grads`` holds the analytic gradient of each. Central differences at sampled entries."""
    for name, x in inputs.items():
        flat = x.reshape(-1)
        g = grads[name].reshape(-1)
        idx = rng.choice(flat.size, min(samples, flat.size), replace=False)
        num = np.empty(len(idx))
        for j, i in enumerate(idx):
            old = flat[i]
            flat[i] = old + eps
            hi = f()
            flat[i] = old - eps
            lo = f()
            flat[i] = old
            num[j] = (hi - lo) / (2 * eps)
        assert_close(g[idx], num, rtol=1e-5, atol=1e-7 * max(1.0, np.abs(num).max()), name=name)


def test_linear_backward_fd(rng):
    ops = NumpyOps()
    x, w, b = rng.normal(size=(5, 3)), rng.normal(size=(3, 7)), rng.normal(size=7)
    r = rng.normal(size=(5, 7))
    out = np.empty((5, 7))
    f = lambda: (ops.linear(x, w, b, out), (out * r).sum())[1]  # noqa: E731
    dx, dw, db = np.empty_like(x), np.empty_like(w), np.empty_like(b)
    ops.linear_backward(r, x, w, dx, dw, db)
    fd_check(f, {"x": x, "w": w, "b": b}, {"x": dx, "w": dw, "b": db}, rng)


def test_head_backward_fd(rng):
    ops = NumpyOps()
    x, w = rng.normal(size=(4, 6)), rng.normal(size=(11, 6))
    r, out = rng.normal(size=(4, 11)), np.empty((4, 11))
    f = lambda: (ops.head(x, w, out), (out * r).sum())[1]  # noqa: E731
    dx, dw = np.empty_like(x), np.empty_like(w)
    ops.head_backward(r, x, w, dx, dw)
    fd_check(f, {"x": x, "w": w}, {"x": dx, "w": dw}, rng)


def test_layernorm_backward_fd(rng):
    ops = NumpyOps()
    x = rng.normal(size=(6, 13)) * 3 + 1
    w, b = rng.normal(size=13), rng.normal(size=13)
    r = rng.normal(size=(6, 13))
    out, mean, rstd = np.empty((6, 13)), np.empty(6), np.empty(6)
    f = lambda: (ops.layernorm(x, w, b, out, mean, rstd), (out * r).sum())[1]  # noqa: E731
    f()
    dx, dw, db = np.zeros_like(x), np.empty_like(w), np.empty_like(b)
    ops.layernorm_backward(r, x, w, mean, rstd, dx, dw, db)
    fd_check(f, {"x": x, "w": w, "b": b}, {"x": dx, "w": dw, "b": db}, rng)


def test_gelu_backward_fd(rng):
    ops = NumpyOps()
    x = rng.normal(size=(7, 5)) * 3
    r, out = rng.normal(size=(7, 5)), np.empty((7, 5))
    f = lambda: (ops.gelu(x, out), (out * r).sum())[1]  # noqa: E731
    dx = np.empty_like(x)
    ops.gelu_backward(x, r, dx)
    fd_check(f, {"x": x}, {"x": dx}, rng)


def test_attention_backward_fd(rng):
    ops = NumpyOps()
    cfg = Config("a", d_model=6, n_layer=1, n_head=2, context=5)
    B, T = 2, 5
    ws = Workspace(cfg, B, T, np.float64)
    a = ws.layers[0].attn
    qkv = rng.normal(size=(B * T, 18))
    r, out = rng.normal(size=(B * T, 6)), np.empty((B * T, 6))
    f = lambda: (ops.attention(qkv, out, a), (out * r).sum())[1]  # noqa: E731
    f()
    dqkv = np.empty_like(qkv)
    ops.attention_backward(r, dqkv, a)
    fd_check(f, {"qkv": qkv}, {"qkv": dqkv}, rng, samples=60)


def test_attention_is_causal(rng):
    ops = NumpyOps()
    cfg = Config("a", d_model=4, n_layer=1, n_head=2, context=6)
    a = Workspace(cfg, 1, 6, np.float64).layers[0].attn
    qkv = rng.normal(size=(6, 12))
    out1, out2 = np.empty((6, 4)), np.empty((6, 4))
    ops.attention(qkv, out1, a)
    qkv[4:] = rng.normal(size=(2, 12))  # change the future: the first 4 outputs must not move
    ops.attention(qkv, out2, a)
    assert np.array_equal(out1[:4], out2[:4])


def test_cross_entropy_backward_fd(rng):
    ops = NumpyOps()
    z = rng.normal(size=(5, 9)) * 4
    t = rng.integers(0, 9, 5).astype(np.int32)
    losses, d = np.empty(5), np.empty((5, 9))
    f = lambda: ops.cross_entropy(z, t, losses, np.empty((5, 9)))  # noqa: E731
    ops.cross_entropy(z, t, losses, d)
    assert_close(losses, -np.log(np.exp(z)[np.arange(5), t] / np.exp(z).sum(1)), name="loss")
    fd_check(f, {"z": z}, {"z": d}, rng)


def test_embedding_backward_fd(rng):
    ops = NumpyOps()
    wte, wpe = rng.normal(size=(10, 4)), rng.normal(size=(6, 4))
    idx = np.array([[1, 3, 3], [9, 1, 0]], np.int32)  # repeated ids: scatter-add must sum
    r, out = rng.normal(size=(6, 4)), np.empty((6, 4))
    f = lambda: (ops.embedding(idx, wte, wpe, out), (out * r).sum())[1]  # noqa: E731
    dwte, dwpe = np.zeros_like(wte), np.empty_like(wpe)
    ops.embedding_backward(idx, r, dwte, dwpe)
    fd_check(f, {"wte": wte, "wpe": wpe}, {"wte": dwte, "wpe": dwpe}, rng)


@pytest.mark.parametrize("cfg", ALL_TINY, ids=ALL_IDS)
def test_whole_model_backward_fd(cfg, rng):
    m = GPT(cfg, "numpy", dtype=np.float64, seed=1)
    m.flat += rng.normal(0, 0.05, m.flat.shape)  # move off the init's zero biases
    idx = rng.integers(0, 256, (2, cfg.context))
    tg = rng.integers(0, 256, (2, cfg.context))
    m.forward(idx, tg)
    m.backward()
    g = m.grad_flat.copy()
    fd_check(lambda: m.forward(idx, tg), {"params": m.flat}, {"params": g}, rng, samples=150)


def test_the_recurrent_model_across_chunks(monkeypatch, rng):
    """The recurrent block with chunks shorter than the sequence (4 of 8 steps and a last
    of 5 for T = 29): the kernels' loss and gradients against float64's, and float64's
    gradients against finite differences; the gate biases start at decays whose half-lives
    run from one token to the context."""
    from smallem.training import model as model_mod

    monkeypatch.setattr(layers, "scan_chunk", lambda hd, caches=None: 8)
    cfg = Config("rec", d_model=16, n_layer=2, n_head=2, context=29, block="recurrent")
    b = model_mod.gate_biases(cfg)
    assert_close(1 / (1 + np.exp(-b)), 2.0 ** (-1.0 / np.array([1.0, 29.0])))  # sigmoid(b)
    idx, tg = rng.integers(0, 256, (2, 29)), rng.integers(0, 256, (2, 29))
    ref = GPT(cfg, "numpy", dtype=np.float64, seed=2)
    ref.flat += rng.normal(0, 0.05, ref.flat.shape)
    fast = GPT(cfg, "fused", threads=2, seed=2)
    fast.load_flat(ref.flat.astype(np.float32))
    assert fast.workspace(2, 29).layers[0].attn.states.shape == (4, 5, 8, 8)
    losses = [m.forward(idx, tg) for m in (ref, fast)]
    for m in (ref, fast):
        m.backward()
    assert abs(losses[0] - losses[1]) < 1e-5 * losses[0]
    assert_close(fast.grad_flat, ref.grad_flat, rtol=1e-4,
                 atol=2e-5 * np.abs(ref.grad_flat).max(), name="kernels against float64")
    g = ref.grad_flat.copy()
    fd_check(lambda: ref.forward(idx, tg), {"params": ref.flat}, {"params": g}, rng, samples=60)


def test_adamw_numpy_matches_formula(rng):
    ops = NumpyOps()
    p, g = rng.normal(size=20), rng.normal(size=20)
    m, v = rng.normal(size=20) * 0.1, rng.random(20) * 0.1
    p0, m0, v0 = p.copy(), m.copy(), v.copy()
    ops.adamw(p, g, m, v, lr=0.01, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
              grad_scale=0.5, step=3)
    gs = 0.5 * g
    m1, v1 = 0.9 * m0 + 0.1 * gs, 0.95 * v0 + 0.05 * gs * gs
    want = p0 * (1 - 0.001) - 0.01 * (m1 / (1 - 0.9 ** 3)) / (np.sqrt(v1 / (1 - 0.95 ** 3)) + 1e-8)
    assert_close(p, want, rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- C kernels vs numpy

SHAPES = [(1, 1), (3, 7), (17, 33), (64, 100), (5, 257)]


def f32(rng, *shape, scale=1.0):
    return (rng.normal(size=shape) * scale).astype(np.float32)


@pytest.mark.parametrize("N,C", SHAPES)
def test_kernel_layernorm(level, rng, N, C):
    ref = NumpyOps()
    x, w, b = f32(rng, N, C, scale=3) + 2, f32(rng, C), f32(rng, C)
    out, mean, rstd = np.empty((N, C), np.float32), np.empty(N, np.float32), np.empty(N, np.float32)
    layers.layernorm_forward(x, w, b, out, mean, rstd)
    x64 = x.astype(np.float64)
    o64, m64, r64 = np.empty((N, C)), np.empty(N), np.empty(N)
    ref.layernorm(x64, w.astype(np.float64), b.astype(np.float64), o64, m64, r64)
    assert_close(out, o64.astype(np.float32), k=C, name="out")
    assert_close(rstd, r64.astype(np.float32), k=C, name="rstd")
    dy = f32(rng, N, C)
    dx = f32(rng, N, C)
    dx64 = dx.astype(np.float64)
    dw, db = np.empty(C, np.float32), np.empty(C, np.float32)
    dw64, db64 = np.empty(C), np.empty(C)
    layers.layernorm_backward(dy, x, w, mean, rstd, dx, dw, db)
    ref.layernorm_backward(dy.astype(np.float64), x64, w.astype(np.float64), m64, r64, dx64,
                           dw64, db64)
    assert_close(dx, dx64.astype(np.float32), k=C, name="dx", atol=1e-5 * np.abs(dx64).max())
    assert_close(dw, dw64.astype(np.float32), k=N, name="dw", atol=1e-5 * np.abs(dw64).max())
    assert_close(db, db64.astype(np.float32), k=N, name="db", atol=1e-5 * np.abs(db64).max())


@pytest.mark.parametrize("n", [1, 7, 255, 256, 1000])
def test_kernel_gelu(level, rng, n):
    ref = NumpyOps()
    x = f32(rng, n, scale=4)
    x[:3] = [0.0, 30.0, -30.0][:min(3, n)]  # saturated tails
    out, dx = np.empty(n, np.float32), np.empty(n, np.float32)
    dy = f32(rng, n)
    layers.gelu_forward(x, out)
    layers.gelu_backward(x, dy, dx)
    o64, d64 = np.empty(n), np.empty(n)
    ref.gelu(x.astype(np.float64), o64)
    ref.gelu_backward(x.astype(np.float64), dy.astype(np.float64), d64)
    assert_close(out, o64.astype(np.float32), rtol=2e-6, atol=1e-6, name="gelu")
    assert_close(dx, d64.astype(np.float32), rtol=2e-6, atol=1e-6, name="gelu'")


def test_kernel_exp_accuracy(level):
    x = np.linspace(-87, 88, 100003).astype(np.float32)
    e = x.copy()
    ffi, lib = layers._lib()
    lib.vec_exp(ffi.from_buffer("float[]", e), e.size)
    rel = np.abs(e / np.exp(x.astype(np.float64)) - 1.0)
    assert rel.max() < 3e-7, f"worst relative error {rel.max():.2e} at x={x[rel.argmax()]}"


@pytest.mark.parametrize("N,C", SHAPES)
def test_kernel_bias_colsum_residual(level, rng, N, C):
    y, b = f32(rng, N, C), f32(rng, C)
    want = y + b
    layers.add_bias(y, b)
    assert_close(y, want)
    db = np.empty(C, np.float32)
    layers.col_sum(y, db)
    assert_close(db, y.astype(np.float64).sum(0).astype(np.float32), k=N,
                 atol=1e-6 * np.abs(y).sum(0).max())
    out = np.empty_like(y)
    layers.residual_add(y, b * np.ones_like(y), out)
    assert_close(out, y + b)


FUSED_SHAPES = SHAPES + [(3, 300), (2, 1000)]  # rows longer than one 256-float chunk


@pytest.mark.parametrize("N,C", FUSED_SHAPES)
def test_fused_kernels_match_their_compositions(level, rng, N, C):
    """Each fused kernel against the unfused composition it replaces (the same kernels of
    layers.c one after another, UnfusedElementwise) and against the float64 reference."""
    from smallem.training.model import FusedOps

    unfused, fused, ref = KernelOps(), FusedOps(), NumpyOps()
    x, t, bias, w, b = (f32(rng, N, C, scale=2), f32(rng, N, C), f32(rng, C), f32(rng, C),
                        f32(rng, C))
    x[0, :3] = [0.0, 30.0, -30.0][:min(3, C)]  # GELU's saturated tails
    outs = []
    for ops in (unfused, fused):
        u, g = x.copy(), np.empty((N, C), np.float32)
        ops.bias_gelu(u, bias, g)
        dx, db = np.empty((N, C), np.float32), np.empty(C, np.float32)
        ops.gelu_backward_bias(u, t, dx, db)
        inplace, db2 = t.copy(), np.empty(C, np.float32)
        ops.gelu_backward_bias(u, inplace, inplace, db2)  # dx over dy, as the model calls it
        mid, ln, mean, rstd = (np.empty((N, C), np.float32), np.empty((N, C), np.float32),
                               np.empty(N, np.float32), np.empty(N, np.float32))
        ops.residual_layernorm(x, t.copy(), bias, mid, w, b, ln, mean, rstd)
        res = np.empty((N, C), np.float32)
        ops.bias_residual(x, t.copy(), bias, res)
        assert np.array_equal(inplace, dx) and np.array_equal(db2, db)
        outs.append(dict(u=u, g=g, dx=dx, db=db, mid=mid, ln=ln, mean=mean, rstd=rstd, res=res))
    a, f = outs
    for k in ("u", "mid", "res"):  # element by element: the same additions
        assert np.array_equal(a[k], f[k]), k
    for k in ("g", "dx"):  # exp's vector and scalar forms meet at other chunk edges
        assert_close(f[k], a[k], rtol=1e-6, atol=1e-7 * np.abs(a[k]).max(), name=k)
    for k in ("db", "ln", "mean", "rstd"):    # sums: the order of a reduction may differ
        assert_close(f[k], a[k], k=max(N, C), name=k, atol=1e-6 * np.abs(a[k]).max())
    # and the composition itself against float64
    x64, t64, bias64 = x.astype(np.float64), t.astype(np.float64), bias.astype(np.float64)
    u64, g64 = x64.copy(), np.empty((N, C))
    ref.bias_gelu(u64, bias64, g64)
    dx64, db64 = np.empty((N, C)), np.empty(C)
    ref.gelu_backward_bias(u64, t64, dx64, db64)
    mid64, ln64, m64, r64 = np.empty((N, C)), np.empty((N, C)), np.empty(N), np.empty(N)
    ref.residual_layernorm(x64, t64.copy(), bias64, mid64, w.astype(np.float64),
                           b.astype(np.float64), ln64, m64, r64)
    assert_close(f["g"], g64.astype(np.float32), rtol=2e-6, atol=1e-6, name="gelu")
    assert_close(f["dx"], dx64.astype(np.float32), rtol=2e-6, atol=1e-6, name="gelu'")
    assert_close(f["db"], db64.astype(np.float32), k=N, atol=1e-5 * np.abs(db64).max(),
                 name="db")
    assert_close(f["ln"], ln64.astype(np.float32), k=C, name="layernorm")


def test_fused_kernels_check_their_arguments(rng):
    u, b = f32(rng, 4, 6), f32(rng, 6)
    with pytest.raises(ValueError, match="b"):
        layers.bias_gelu_forward(u, f32(rng, 5), np.empty_like(u))
    with pytest.raises(TypeError, match="dy"):
        layers.gelu_backward_bias(u, u.astype(np.float64), u.copy(), b.copy())
    with pytest.raises(ValueError, match="mean"):
        layers.residual_layernorm(u, u, b, u.copy(), b, b, u.copy(), np.empty(3, np.float32),
                                  np.empty(4, np.float32))
    with pytest.raises(ValueError, match="x"):
        layers.bias_residual(u[:, ::2], u[:, ::2], b[:3], np.empty((4, 3), np.float32))


def test_workspace_is_one_arena_of_the_size_the_config_gives():
    cfg = Config("arena", d_model=24, n_layer=2, n_head=3, context=11)
    for scores in (True, False):
        ws = Workspace(cfg, 2, 11, np.float32, scores)
        assert ws.arena.size == Workspace.floats(cfg, 2, 11, scores)
        assert ws.arena.ctypes.data % 64 == 0
        views = [v for v in vars(ws).values() if isinstance(v, np.ndarray) and v.dtype == np.float32]
        for L in ws.layers:
            views += [v for v in vars(L).values() if isinstance(v, np.ndarray)]
            views += [v for v in vars(L.attn).values() if isinstance(v, np.ndarray)]
        views = [v for v in views if v.size and v is not ws.arena]
        spans = sorted({(v.ctypes.data, v.ctypes.data + v.nbytes) for v in views})
        assert all(v.base is ws.arena.base or v.base is ws.arena for v in views)
        assert all(s % 64 == 0 for s, _ in spans)                       # each on a cache line
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))     # no two overlap
        assert spans[-1][1] <= ws.arena.ctypes.data + ws.arena.nbytes  # all inside it
    per_call = Workspace(cfg, 2, 11, arena=False)
    assert per_call.arena is None and per_call.dh.base is None


def test_a_step_allocating_per_call_gives_the_arenas_numbers(rng):
    idx, tg = rng.integers(0, 256, (2, 16)), rng.integers(0, 256, (2, 16))
    cfg = Config("arena", d_model=32, n_layer=2, n_head=2, context=16)
    a, b = GPT(cfg, "kernels"), GPT(cfg, "kernels", arena=False)
    for _ in range(2):
        assert a.forward(idx, tg) == b.forward(idx, tg)
        a.backward()
        b.backward()
        assert np.array_equal(a.grad_flat, b.grad_flat)
    assert a.ws is a.workspace(2, 16) and b.ws is not b.workspace(2, 16)


def test_the_c_kernels_call_no_allocator():
    """The C side of the zero-allocation promise: neither library imports malloc and its
    kin (the OpenMP runtime's own team set-up is its business, not ours)."""
    import shutil
    import subprocess

    from smallem.plumbing import build
    from smallem.cpu import isa

    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm (binutils) to list the libraries' imported symbols")
    for name in ("layers", "gemm"):
        build.load(name)
        level = isa.selected()
        path = build.module_path(name, level, isa.extensions(level))
        undefined = subprocess.run([nm, "-D", "--undefined-only", str(path)], check=True,
                                   capture_output=True, text=True).stdout.split()
        undefined = {sym.split("@")[0] for sym in undefined}  # malloc@GLIBC_2.2.5 -> malloc
        assert "memset" in undefined  # the listing is read right
        assert not {"malloc", "calloc", "realloc", "free", "posix_memalign",
                    "aligned_alloc"} & undefined, f"{path} allocates"


@pytest.mark.parametrize("N,C", SHAPES)
def test_kernel_rmsnorm(level, rng, N, C):
    ref = NumpyOps()
    x, w = f32(rng, N, C, scale=3) + 1, f32(rng, C)
    out, rstd = np.empty((N, C), np.float32), np.empty(N, np.float32)
    layers.rmsnorm_forward(x, w, out, rstd)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    o64, r64 = np.empty((N, C)), np.empty(N)
    ref.rmsnorm(x64, w64, o64, r64)
    assert_close(out, o64.astype(np.float32), k=C, name="out")
    assert_close(rstd, r64.astype(np.float32), k=C, name="rstd")
    dy, dx = f32(rng, N, C), f32(rng, N, C)
    dx64, dw, dw64 = dx.astype(np.float64), np.empty(C, np.float32), np.empty(C)
    layers.rmsnorm_backward(dy, x, w, rstd, dx, dw)
    ref.rmsnorm_backward(dy.astype(np.float64), x64, w64, r64, dx64, dw64)
    assert_close(dx, dx64.astype(np.float32), k=C, name="dx", atol=1e-5 * np.abs(dx64).max())
    assert_close(dw, dw64.astype(np.float32), k=N, name="dw", atol=1e-5 * np.abs(dw64).max())


def test_rmsnorm_backward_fd(rng):
    ops = NumpyOps()
    x, w, r = rng.normal(size=(3, 7)), rng.normal(size=7), rng.normal(size=(3, 7))
    out, rstd = np.empty((3, 7)), np.empty(3)
    f = lambda: (ops.rmsnorm(x, w, out, rstd), (out * r).sum())[1]  # noqa: E731
    f()
    dx, dw = np.zeros((3, 7)), np.empty(7)
    ops.rmsnorm_backward(r, x, w, rstd, dx, dw)
    fd_check(f, {"x": x, "w": w}, {"x": dx, "w": dw}, rng)


@pytest.mark.parametrize("BH,T,hd", [(1, 1, 2), (3, 7, 6), (2, 33, 64)])
def test_kernel_rope(level, rng, BH, T, hd):
    from smallem.training.model import rope_tables

    ref = NumpyOps()
    cos, sin = rope_tables(T, hd)
    q, k = f32(rng, BH, T, hd), f32(rng, BH, T, hd)
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    layers.rope(q, k, cos, sin)
    ref.rope(q64, k64, *rope_tables(T, hd, np.float64))
    assert_close(q, q64.astype(np.float32), atol=1e-6 * np.abs(q64).max(), name="q")
    assert_close(k, k64.astype(np.float32), atol=1e-6 * np.abs(k64).max(), name="k")
    # position 0 does not turn, and a turn keeps each pair's length
    assert np.allclose(np.hypot(q[..., 0::2], q[..., 1::2]),
                       np.hypot(q64[..., 0::2], q64[..., 1::2]), rtol=1e-5)
    layers.rope(q, k, cos, sin, inverse=True)
    ref.rope(q64, k64, *rope_tables(T, hd, np.float64), inverse=True)
    assert_close(q, q64.astype(np.float32), atol=2e-6 * np.abs(q64).max(), name="q back")
    with pytest.raises(ValueError, match="even"):
        layers.rope(f32(rng, 2, 3, 5), f32(rng, 2, 3, 5), cos[:3, :2], sin[:3, :2])


def test_rope_scores_depend_on_distance_only(rng):
    """RoPE's point: after the turn, q_i . k_j depends on i - j, not on i and j."""
    from smallem.training.model import rope_tables

    T, hd = 9, 8
    qv, kv = rng.normal(size=hd), rng.normal(size=hd)
    q, k = np.tile(qv, (T, 1)), np.tile(kv, (T, 1))
    NumpyOps().rope(q, k, *rope_tables(T, hd, np.float64))
    s = q @ k.T
    for d in range(-3, 4):
        diag = np.diagonal(s, d)
        assert np.allclose(diag, diag[0], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("N,h", [(1, 1), (3, 7), (5, 300)])
def test_kernel_swiglu(level, rng, N, h):
    ref = NumpyOps()
    u = f32(rng, N, 2 * h, scale=3)
    u[0, :2] = [40.0, -40.0][:min(2, h)] if h >= 2 else [40.0]  # saturated gates
    g, du, dg = np.empty((N, h), np.float32), np.empty((N, 2 * h), np.float32), f32(rng, N, h)
    layers.swiglu_forward(u, g)
    layers.swiglu_backward(u, dg, du)
    g64, du64 = np.empty((N, h)), np.empty((N, 2 * h))
    ref.swiglu(u.astype(np.float64), g64)
    ref.swiglu_backward(u.astype(np.float64), dg.astype(np.float64), du64)
    assert_close(g, g64.astype(np.float32), rtol=2e-6, atol=1e-6, name="swiglu")
    assert_close(du, du64.astype(np.float32), rtol=2e-6, atol=1e-6, name="swiglu'")
    with pytest.raises(ValueError, match="2h"):
        layers.swiglu_forward(f32(rng, 2, 3), np.empty((2, 1), np.float32))


def test_swiglu_backward_fd(rng):
    ops = NumpyOps()
    u, r = rng.normal(size=(3, 10)), rng.normal(size=(3, 5))
    g = np.empty((3, 5))
    f = lambda: (ops.swiglu(u, g), (g * r).sum())[1]  # noqa: E731
    f()
    du = np.empty((3, 10))
    ops.swiglu_backward(u, r, du)
    fd_check(f, {"u": u}, {"u": du}, rng)


@pytest.mark.parametrize("m,n", [(1, 1), (7, 13), (64, 200), (96, 96)])
def test_newton_schulz_against_float64(rng, m, n):
    """Muon's orthogonalisation in f32 (the kernels' GEMM) and with bf16 products, against
    the same iteration in float64; and what it is for: singular values near 1."""
    from smallem.training.model import Bf16Ops
    from smallem.training.train import newton_schulz

    g = rng.normal(size=(m, n)) * np.linspace(0.01, 3, n)  # a wide spread of scales
    want = newton_schulz(g)  # numpy, float64
    got32 = newton_schulz(g.astype(np.float32), KernelOps())
    got16 = newton_schulz(g.astype(np.float32), Bf16Ops())
    assert_close(got32, want.astype(np.float32), atol=2e-5 * np.abs(want).max(), name="f32")
    assert np.abs(got16 - want).max() < 0.05 * np.abs(want).max()
    # five quintic steps lift every singular value of g / |g| above 1/100 into [0.5, 1.3]
    # (each step multiplies a small one by about 3.4; smaller ones stay smaller)
    u, s0, vt = np.linalg.svd(g / np.linalg.norm(g), full_matrices=False)
    s1 = np.einsum("ij,ik,kj->j", u, want, vt.T)  # the same singular directions, in order
    assert np.abs(s1).max() < 1.3 and (np.abs(s1[s0 > 0.01]) > 0.5).all(), (s0, s1)


@pytest.mark.parametrize("B,T,C,V", [(1, 1, 1, 1), (2, 5, 7, 11), (3, 13, 70, 256)])
def test_kernel_embedding(level, rng, B, T, C, V):
    ref = NumpyOps()
    wte, wpe = f32(rng, V, C), f32(rng, T + 2, C)
    idx = rng.integers(0, V, (B, T)).astype(np.int32)
    out = np.empty((B * T, C), np.float32)
    layers.embedding_forward(idx, wte, wpe, out)
    want = np.empty_like(out)
    ref.embedding(idx, wte, wpe, want)
    assert_close(out, want)
    dout = f32(rng, B * T, C)
    dwte, dwpe = f32(rng, V, C), f32(rng, T + 2, C)
    dwte_ref, dwpe_ref = dwte.astype(np.float64), dwpe.astype(np.float64)
    layers.embedding_backward(idx, dout, dwte, dwpe)
    ref.embedding_backward(idx, dout.astype(np.float64), dwte_ref, dwpe_ref)
    assert_close(dwte, dwte_ref.astype(np.float32), k=B * T, atol=1e-6 * B * T)
    assert_close(dwpe, dwpe_ref.astype(np.float32), k=B, atol=1e-6 * B)


def test_kernel_embedding_rejects_bad_ids(rng):
    wte, wpe = f32(rng, 5, 3), f32(rng, 4, 3)
    out = np.empty((4, 3), np.float32)
    with pytest.raises(ValueError, match="outside"):
        layers.embedding_forward(np.array([[0, 1, 5, 2]], np.int32), wte, wpe, out)
    with pytest.raises(TypeError, match="idx"):
        layers.embedding_forward(np.array([[0, 1, 2, 2]]), wte, wpe, out)  # int64
    with pytest.raises(ValueError, match="positions"):
        layers.embedding_forward(np.zeros((1, 5), np.int32), wte, wpe, np.empty((5, 3), np.float32))


@pytest.mark.parametrize("B,H,T,hd", [(1, 1, 1, 1), (2, 3, 7, 5), (1, 2, 33, 16)])
def test_kernel_attention(level, rng, B, H, T, hd):
    cfg = Config("a", d_model=H * hd, n_layer=1, n_head=H, context=T)
    ws64 = Workspace(cfg, B, T, np.float64)
    ws32 = Workspace(cfg, B, T, np.float32)
    ref, ker = NumpyOps(), KernelOps()
    C = H * hd
    qkv = f32(rng, B * T, 3 * C)
    o64, o32 = np.empty((B * T, C)), np.empty((B * T, C), np.float32)
    ref.attention(qkv.astype(np.float64), o64, ws64.layers[0].attn)
    ker.attention(qkv, o32, ws32.layers[0].attn)
    assert_close(o32, o64.astype(np.float32), k=T * hd, atol=1e-6)
    assert_close(ws32.layers[0].attn.p, ws64.layers[0].attn.p.astype(np.float32), k=hd,
                 atol=1e-6)
    dout = f32(rng, B * T, C)
    d64, d32 = np.empty((B * T, 3 * C)), np.empty((B * T, 3 * C), np.float32)
    ref.attention_backward(dout.astype(np.float64), d64, ws64.layers[0].attn)
    ker.attention_backward(dout, d32, ws32.layers[0].attn)
    assert_close(d32, d64.astype(np.float32), k=T * hd, atol=1e-5 * np.abs(d64).max())


@pytest.mark.parametrize("BH,T,hd,tile", [(1, 1, 1, 16), (3, 7, 5, 16), (2, 33, 16, 16),
                                           (2, 100, 64, 32), (1, 129, 24, 48), (2, 5, 8, 256)])
def test_flash_attention_against_the_reference(level, rng, BH, T, hd, tile):
    """Attention in tiles, forward and backward, against the numpy reference in float64
    (itself checked against finite differences above): odd T, T smaller than a tile, T one
    past a multiple of it, hd not a multiple of a vector."""
    B, H = 1, BH
    cfg = Config("f", d_model=H * hd, n_layer=1, n_head=H, context=T)
    a = Workspace(cfg, B, T, np.float64).layers[0].attn
    qkv = rng.standard_normal((B * T, 3 * H * hd))
    ref = NumpyOps()
    out64 = np.empty((B * T, H * hd))
    ref.attention(qkv, out64, a)
    q, k, v = (np.ascontiguousarray(x.reshape(BH, T, hd), np.float32) for x in (a.q, a.k, a.v))
    o, lse = np.full_like(q, np.nan), np.full((BH, T), np.nan, np.float32)
    scale = 1 / math.sqrt(hd)
    layers.flash_forward(q, k, v, o, lse, scale, tile=tile)
    o64 = (a.p @ a.v).reshape(BH, T, hd)
    assert_close(o, o64.astype(np.float32), k=T * hd, atol=1e-6, name="o")
    s = np.einsum("btd,bsd->bts", a.q.reshape(BH, T, hd), a.k.reshape(BH, T, hd)) * scale
    s[:, np.triu(np.ones((T, T), bool), 1)] = -np.inf
    m = s.max(-1)
    want_lse = m + np.log(np.exp(s - m[..., None]).sum(-1))
    assert_close(lse, want_lse.astype(np.float32), k=hd, atol=1e-6, name="lse")
    dout = rng.standard_normal((B * T, H * hd))
    d64 = np.empty((B * T, 3 * H * hd))
    ref.attention_backward(dout, d64, a)
    want = d64.reshape(B, T, 3, H, hd).transpose(2, 0, 3, 1, 4).reshape(3, BH, T, hd)
    do = np.ascontiguousarray(dout.reshape(B, T, H, hd).transpose(0, 2, 1, 3).reshape(BH, T, hd),
                              np.float32)
    dq, dk, dv = (np.full_like(q, np.nan) for _ in range(3))
    layers.flash_backward(q, k, v, o, lse, do, dq, dk, dv, scale)
    for got, w, name in zip((dq, dk, dv), want, ("dq", "dk", "dv")):
        assert_close(got, w.astype(np.float32), k=T * hd, atol=1e-5 * np.abs(w).max(), name=name)
    for threads in (1, 3):  # a head (or a query tile) per task: the same bits for any team
        o2, lse2 = np.empty_like(o), np.empty_like(lse)
        layers.flash_forward(q, k, v, o2, lse2, scale, tile=tile, threads=threads)
        assert np.array_equal(o2, o) and np.array_equal(lse2, lse)
        again = [np.empty_like(q) for _ in range(3)]
        layers.flash_backward(q, k, v, o, lse, do, *again, scale, threads=threads)
        assert all(np.array_equal(x, y) for x, y in zip(again, (dq, dk, dv)))


def test_flash_backend_keeps_no_score_matrices():
    cfg = Config("f", d_model=16, n_layer=2, n_head=2, context=64)
    tiled, full = GPT(cfg, "flash").workspace(2, 64), GPT(cfg, "kernels").workspace(2, 64)
    assert all(L.attn.p.size == 0 and L.attn.lse.shape == (2, 2, 64) for L in tiled.layers)
    assert tiled.layers[0].attn.dp.size == 0 and full.layers[0].attn.p.shape == (2, 2, 64, 64)


@pytest.mark.parametrize("backend,block,optimizer", [
    ("kernels", "gpt2", "adamw"), ("flash", "gpt2", "adamw"), ("fused", "gpt2", "adamw"),
    ("bf16", "gpt2", "adamw"), ("bf16", "modern", "muon")])
def test_a_step_allocates_no_arrays_after_the_first(backend, block, optimizer, rng):
    """Every activation, gradient and scratch buffer comes from the workspace (or the ops'
    own scratch) made on the first step; the C kernels allocate nothing. tracemalloc sees
    numpy's array memory: a step after warm-up may only make small Python objects, far
    below the smallest activation (B*T x C floats, 64 KiB here)."""
    import tracemalloc

    from smallem.training.train import AdamW, Muon

    # one layer with Muon: its Newton-Schulz makes 75 bf16 products a layer, and a C call
    # of 20 arguments (gemm_bf16's) costs CPython a 200-byte argument tuple, which is not
    # an array but would add up to the limit over two layers
    cfg = Config("alloc", d_model=128, n_layer=1 if optimizer == "muon" else 2, n_head=4,
                 context=64, block=block)
    m = GPT(cfg, backend)
    opt = Muon(m, base_lr=1e-3) if optimizer == "muon" else AdamW(m)
    idx, tg = rng.integers(0, 256, (2, 64)), rng.integers(0, 256, (2, 64))
    for _ in range(2):
        m.forward(idx, tg)
        m.backward()
        opt.step(1e-3)
    tracemalloc.start()
    try:
        m.forward(idx, tg)
        m.backward()
        opt.step(1e-3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024, f"{peak} bytes allocated during a step"


def test_flash_attention_checks_its_arguments(rng):
    q = np.zeros((2, 5, 4), np.float32)
    o, lse = np.empty_like(q), np.empty((2, 5), np.float32)
    with pytest.raises(TypeError, match="k"):
        layers.flash_forward(q, q.astype(np.float64), q, o, lse, 0.5)
    with pytest.raises(ValueError, match="lse"):
        layers.flash_forward(q, q, q, o, np.empty((2, 4), np.float32), 0.5)
    with pytest.raises(ValueError, match="tile"):
        layers.flash_forward(q, q, q, o, lse, 0.5, tile=0)
    with pytest.raises(ValueError, match="B\\*H, T, hd"):
        layers.flash_forward(q[0], q[0], q[0], o[0], lse, 0.5)
    with pytest.raises(ValueError, match="work"):
        layers.flash_forward(q, q, q, o, lse, 0.5, work=np.empty(3, np.float32))
    assert layers.flash_tile(64, {"L1d_bytes": 32 * 1024}) == 64
    assert layers.flash_tile(64, {"L1d_bytes": 48 * 1024}) == 96
    assert layers.flash_tile(128, {"L1d_bytes": 48 * 1024}) == 32  # 48 keys: not two vectors
    assert layers.flash_tile(32, {"L1d_bytes": 48 * 1024}) == 192
    assert layers.flash_tile(1024, {"L1d_bytes": 32 * 1024}) == 32


@pytest.mark.parametrize("B,T,H,hd", [(1, 1, 1, 1), (2, 3, 5, 7)])
def test_kernel_heads_roundtrip(level, rng, B, T, H, hd):
    x = f32(rng, B * T, 3 * H * hd)
    q, k, v = (np.empty((B, H, T, hd), np.float32) for _ in range(3))
    layers.heads_split(x, (q, k, v), B, T, H)
    parts = x.reshape(B, T, 3, H, hd)
    assert np.array_equal(k, parts[:, :, 1].transpose(0, 2, 1, 3))
    back = np.empty_like(x)
    layers.heads_merge((q, k, v), back)
    assert np.array_equal(back, x)


@pytest.mark.parametrize("N,V", [(1, 1), (3, 7), (19, 256), (4, 1000)])
def test_kernel_cross_entropy(level, rng, N, V):
    ref = NumpyOps()
    z = f32(rng, N, V, scale=5)
    t = rng.integers(0, V, N).astype(np.int32)
    l32, d32 = np.empty(N, np.float32), np.empty((N, V), np.float32)
    l64, d64 = np.empty(N), np.empty((N, V))
    loss = layers.cross_entropy(z, t, l32, d32)
    want = ref.cross_entropy(z.astype(np.float64), t, l64, d64)
    assert abs(loss - want) < 1e-5 * max(1, abs(want))
    assert_close(l32, l64.astype(np.float32), rtol=1e-5, atol=1e-5)
    assert_close(d32, d64.astype(np.float32), rtol=1e-5, atol=1e-7 / N)
    with pytest.raises(ValueError, match="targets"):
        layers.cross_entropy(z, np.full(N, V, np.int32), l32, d32)


@pytest.mark.parametrize("n", [1, 17, 1001])
def test_kernel_adamw_and_norm(level, rng, n):
    ref = NumpyOps()
    p, g = f32(rng, n), f32(rng, n)
    m, v = f32(rng, n, scale=0.1), (rng.random(n) * 0.1).astype(np.float32)
    p64, m64, v64 = p.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
    kw = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_scale=0.7, step=5)
    layers.adamw(p, g, m, v, **kw)
    ref.adamw(p64, g.astype(np.float64), m64, v64, **kw)
    # m and v are sums of cancelling terms: compare with slack relative to their largest value
    assert_close(p, p64.astype(np.float32), rtol=1e-6, atol=1e-6 * np.abs(p64).max())
    assert_close(m, m64.astype(np.float32), rtol=1e-6, atol=1e-6 * np.abs(m64).max())
    assert_close(v, v64.astype(np.float32), rtol=1e-6, atol=1e-6 * np.abs(v64).max())
    assert math.isclose(layers.sum_squares(g), float((g.astype(np.float64) ** 2).sum()),
                        rel_tol=1e-12)


@pytest.mark.parametrize("count,M,N,K,ta,tb", [(1, 1, 1, 1, False, False), (5, 7, 13, 3, False, True),
                                               (3, 33, 17, 65, True, False), (2, 9, 9, 9, True, True)])
def test_batched_gemm(level, rng, count, M, N, K, ta, tb):
    bmm = KernelOps().bmm
    a = f32(rng, count, *((K, M) if ta else (M, K)))
    b = f32(rng, count, *((N, K) if tb else (K, N)))
    out = np.empty((count, M, N), np.float32)
    bmm(a, b, out, trans_a=ta, trans_b=tb)
    A = a.swapaxes(1, 2) if ta else a
    Bm = b.swapaxes(1, 2) if tb else b
    assert_close(out, (A.astype(np.float64) @ Bm).astype(np.float32), k=K)


def test_kernel_arguments_are_checked(rng):
    x = f32(rng, 4, 5)
    with pytest.raises(TypeError, match="x"):
        layers.gelu_forward(x.astype(np.float64), np.empty((4, 5), np.float32))
    with pytest.raises(ValueError, match="out"):
        layers.gelu_forward(x, np.empty((4, 6), np.float32))
    with pytest.raises(ValueError, match="contiguous"):
        layers.layernorm_forward(x[:, ::2].copy()[:, :2].T, np.ones(4, np.float32),
                                 np.zeros(4, np.float32), np.empty((2, 4), np.float32),
                                 np.empty(2, np.float32), np.empty(2, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.empty((4, 5), np.float32)
        ro.flags.writeable = False
        layers.gelu_forward(x, ro)


# ---------------------------------------------------------------- whole model

@pytest.mark.parametrize("backend", ["kernels", "flash", "fused"])
@pytest.mark.parametrize("cfg", ALL_TINY, ids=ALL_IDS)
def test_numpy_and_kernels_agree_after_one_step(level, cfg, backend, rng):
    from smallem.training.train import AdamW

    idx = rng.integers(0, 256, (3, cfg.context))
    tg = rng.integers(0, 256, (3, cfg.context))
    models = [GPT(cfg, b, seed=3) for b in ("numpy", backend)]
    results = []
    for m in models:
        m.flat += np.random.default_rng(9).normal(0, 0.02, m.flat.shape).astype(np.float32)
        loss = m.forward(idx, tg)
        m.backward()
        grads = {k: v.copy() for k, v in m.grads.items()}
        AdamW(m).step(1e-3)
        results.append((loss, grads, m.flat.copy()))
    (l0, g0, p0), (l1, g1, p1) = results
    assert abs(l0 - l1) < 1e-5 * l0
    for name in g0:
        scale = np.abs(g0[name]).max() + 1e-12
        assert_close(g1[name], g0[name], rtol=1e-4, atol=2e-5 * scale, name=name)
    # AdamW's first step is about lr * sign(g): where |g| is near eps (1e-8), float32 and
    # float64 gradients may round it differently by a fraction of lr (1e-3)
    assert_close(p1, p0, rtol=1e-5, atol=5e-6, name="params after AdamW")


def test_to_bf16_rounds_as_the_reference(level, rng):
    from smallem.product import gemm

    x = (rng.normal(size=1001) * 10.0 ** rng.integers(-40, 38, 1001)).astype(np.float32)
    x[:8] = [np.nan, -np.nan, np.inf, -np.inf, 3.4e38, -0.0, 1e-45, 1.0 + 2.0 ** -8]  # 1 + half ulp
    bits = x.view(np.uint32)
    bits[8:11] = [0x3F808000, 0x3F818000, 0x3F828000]  # exact ties: to the even neighbour
    out = np.empty(x.shape, np.uint16)
    layers.to_bf16(x, out)
    assert np.array_equal(out, gemm.f32_to_bf16(x))
    assert list(out[8:11]) == [0x3F80, 0x3F82, 0x3F82] and np.isnan(gemm.bf16_to_f32(out[:2])).all()
    with pytest.raises(TypeError, match="out"):
        layers.to_bf16(x, np.empty(x.shape, np.int16))


class _RoundedProducts(NumpyOps):
    """The float64 reference with every product's operands rounded to bf16 first: what
    the bf16 backend computes, with exact sums."""

    @staticmethod
    def _r(x):
        from smallem.product import gemm
        return gemm.bf16_to_f32(gemm.f32_to_bf16(x.astype(np.float32))).astype(np.float64)

    def linear(self, x, w, b, out):
        np.matmul(self._r(x), self._r(w), out=out)
        if b is not None:
            self.bias(out, b)

    def linear_backward(self, dy, x, w, dx, dw, db, accumulate=False):
        r = self._r
        dx[...] = (dx if accumulate else 0) + r(dy) @ r(w).T
        dw[...] = r(x).T @ r(dy)
        if db is not None:
            self.bias_backward(dy, db)

    def head(self, x, w, out):
        out[...] = self._r(x) @ self._r(w).T

    def head_backward(self, dlogits, x, w, dx, dw):
        r = self._r
        dx[...] = r(dlogits) @ r(w)
        dw[...] = r(dlogits).T @ r(x)


@pytest.mark.parametrize("cfg", ALL_TINY, ids=ALL_IDS)
def test_bf16_step_matches_the_rounded_reference(level, cfg, rng):
    """The bf16 backend against float64 with the same roundings: they differ only in the
    order of f32 sums (and where an f32 activation rounds to bf16 otherwise than its
    float64 value), far below the rounding's own effect, which the f32 backend shows."""
    idx, tg = rng.integers(0, 256, (3, cfg.context)), rng.integers(0, 256, (3, cfg.context))
    m16, m32 = GPT(cfg, "bf16", seed=3), GPT(cfg, "fused", seed=3)
    ref = GPT(cfg, "numpy", seed=3, dtype=np.float64)
    ref.ops = _RoundedProducts()
    for m in (m16, m32, ref):
        m.flat[...] = m.flat + np.random.default_rng(9).normal(0, 0.05, m.flat.shape)
    losses = [m.forward(idx, tg) for m in (m16, m32, ref)]
    for m in (m16, m32, ref):
        m.backward()
    scale = np.abs(ref.grad_flat).max()
    own = np.abs(m16.grad_flat - ref.grad_flat).max() / scale
    rounding = np.abs(m32.grad_flat - ref.grad_flat).max() / scale
    assert abs(losses[0] - losses[2]) < 1e-5 * losses[2]
    assert own < 1e-5 and rounding > 100 * own, (own, rounding)


def test_model_matches_pytorch(rng):
    pytest.importorskip("torch")
    from smallem.training import torch_gpt

    for cfg in (c for c in ALL_TINY if c.block != "recurrent"):  # PyTorch's oracle has none
        m64 = GPT(cfg, "numpy", dtype=np.float64, seed=2)
        m64.flat += rng.normal(0, 0.05, m64.flat.shape)
        idx = rng.integers(0, 256, (2, cfg.context))
        tg = rng.integers(0, 256, (2, cfg.context))
        loss = m64.forward(idx, tg)
        m64.backward()
        tloss, tgrads = torch_gpt.loss_and_grads(m64.params, cfg, idx, tg)
        assert abs(loss - tloss) < 1e-10
        for name, g in m64.grads.items():
            assert_close(g, tgrads[name], rtol=1e-8, atol=1e-12, name=name)
        # and the kernels, in float32, against the same float64 oracle
        k = GPT(cfg, "kernels")
        k.flat[...] = m64.flat
        kl = k.forward(idx, tg)
        k.backward()
        assert abs(kl - tloss) < 1e-5 * tloss
        for name, g in k.grads.items():
            assert_close(g, tgrads[name].astype(np.float32), rtol=1e-4,
                         atol=2e-5 * np.abs(tgrads[name]).max(), name=name)


def test_bad_configs():
    with pytest.raises(ValueError, match="does not divide"):
        Config("bad", d_model=10, n_head=3)
    with pytest.raises(ValueError, match="positive"):
        Config("bad", n_layer=0)
    with pytest.raises(ValueError, match="unknown config"):
        GPT("xxl")
    m = GPT(TINY, "numpy")
    with pytest.raises(ValueError, match="longer than the context"):
        m.forward(np.zeros((1, TINY.context + 1), np.int32))
    with pytest.raises(ValueError, match="backend"):
        GPT(TINY, "tpu")
    with pytest.raises(RuntimeError, match="forward"):
        GPT(TINY, "numpy").backward()


def test_configs_comments_are_true():
    """model.py writes each config's size beside it: those comments must match the methods."""
    import re

    from smallem.training import model

    src = open(model.__file__).read()
    for name, c in CONFIGS.items():
        m = re.search(rf'"{name}": Config\(.*# ([\d.]+) M, ([\d.]+) MFLOP/token', src)
        assert m, name
        assert float(m.group(1)) == pytest.approx(c.n_params() / 1e6, abs=0.051)
        assert float(m.group(2)) == pytest.approx(c.flops_per_token() / 1e6, rel=0.02)


def test_configs_documented_sizes():
    xl = CONFIGS["xl"]
    assert 25e6 <= xl.n_params() <= 30e6
    assert list(CONFIGS) == ["s", "m", "l", "xl", "s-modern", "m-modern", "l-modern",
                             "xl-modern", "s-recurrent", "m-recurrent", "l-recurrent",
                             "xl-recurrent"]
    for block in ("gpt2", "modern", "recurrent"):
        sizes = [c.n_params() for c in CONFIGS.values() if c.block == block]
        assert sizes == sorted(sizes)
    for name in ("s", "m", "l", "xl"):  # the other blocks keep the size within 2 %
        for block in ("modern", "recurrent"):
            assert CONFIGS[f"{name}-{block}"].n_params() == pytest.approx(
                CONFIGS[name].n_params(), rel=0.02)
    # 6 FLOPs per matmul parameter per token, plus attention's 12 L d T
    assert xl.flops_per_token() == 6 * (8 * 12 * 512 ** 2 + 256 * 512) + 12 * 8 * 512 * 512


def test_generate_is_deterministic_and_causal():
    m = GPT(TINY, "kernels", seed=0)
    a = m.generate(b"ab", 10, seed=1)
    b = m.generate(b"ab", 10, seed=1)
    assert a == b and len(a) == 10
