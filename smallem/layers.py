"""The GPT's layers, twice: a plain numpy reference and smallem's own kernels.

Both are written as *ops* objects with the same methods, each of which writes
into buffers the caller owns (the model's :class:`~smallem.model.Workspace`):

- :class:`NumpyOps` is the reference: short numpy expressions, dtype-generic,
  so the tests can run it in float64 against finite differences. It allocates
  temporaries freely; it is the readable definition, not the fast path.
- :class:`KernelOps` does every matrix product with chapter 2's GEMM
  (:func:`smallem.gemm.matmul`) and everything else with ``kernels_c/layers.c``.
  It allocates nothing per call: every output and every scratch buffer is
  passed in.

Conventions: activations are (N, C) row-major with N = B*T tokens; a linear
layer's weight is stored (in, out), so y = x @ W + b; attention tensors per
head are (B, H, T, hd). Backward functions that say "adds into" accumulate into
their output (the residual stream's gradient); all others overwrite.
"""

from __future__ import annotations

import math

import numpy as np

from . import checks

GELU_K = math.sqrt(2.0 / math.pi)
LN_EPS = 1e-5


# ---------------------------------------------------------------- C kernel wrappers

def _lib():
    from . import build
    return build.load("layers")


def _fp(ffi, x):
    return ffi.from_buffer("float[]", x)


def _ip(ffi, x):
    return ffi.from_buffer("int[]", x)


def _threads(n):
    return checks.threads(n)


def _f32(x, name, shape=None, writable=False):
    return checks.array(x, name, np.float32, ndim=None if shape is None else len(shape),
                        shape=shape, writable=writable)


def add_bias(y, b, threads=None):
    """y[n, :] += b, in place."""
    _f32(y, "y", writable=True)
    if y.ndim != 2:
        raise ValueError(f"y: expected 2 dimensions, got shape {y.shape}")
    _f32(b, "b", (y.shape[1],))
    ffi, lib = _lib()
    lib.add_bias(_fp(ffi, y), _fp(ffi, b), y.shape[0], y.shape[1], _threads(threads))
    return y


def col_sum(dy, db, threads=None):
    """db = dy.sum(axis=0), overwriting db."""
    _f32(dy, "dy")
    if dy.ndim != 2:
        raise ValueError(f"dy: expected 2 dimensions, got shape {dy.shape}")
    _f32(db, "db", (dy.shape[1],), writable=True)
    ffi, lib = _lib()
    lib.col_sum(_fp(ffi, dy), _fp(ffi, db), dy.shape[0], dy.shape[1], _threads(threads))
    return db


def residual_add(a, b, out, threads=None):
    """out = a + b (any shape, all three the same)."""
    _f32(a, "a")
    _f32(b, "b", a.shape)
    _f32(out, "out", a.shape, writable=True)
    ffi, lib = _lib()
    lib.residual_add(_fp(ffi, a), _fp(ffi, b), _fp(ffi, out), a.size, _threads(threads))
    return out


def _ids(idx, name):
    checks.array(idx, name, np.int32)
    if idx.ndim != 2:
        raise ValueError(f"{name}: expected (B, T) token ids, got shape {idx.shape}")
    return idx


def embedding_forward(idx, wte, wpe, out, threads=None):
    """out[b*T + t] = wte[idx[b, t]] + wpe[t]."""
    _ids(idx, "idx")
    B, T = idx.shape
    _f32(wte, "wte")
    if wte.ndim != 2:
        raise ValueError(f"wte: expected (V, C), got shape {wte.shape}")
    V, C = wte.shape
    _f32(wpe, "wpe", (None, C))
    if T > wpe.shape[0]:
        raise ValueError(f"idx: {T} positions but wpe has only {wpe.shape[0]}")
    _f32(out, "out", (B * T, C), writable=True)
    ffi, lib = _lib()
    bad = lib.embedding_forward(_ip(ffi, idx), _fp(ffi, wte), _fp(ffi, wpe), _fp(ffi, out),
                                B, T, C, V, _threads(threads))
    if bad:
        raise ValueError(f"idx: {bad} token ids outside [0, {V})")
    return out


def embedding_backward(idx, dout, dwte, dwpe, threads=None):
    """dwte[idx] += dout (adds into dwte); dwpe[t] = sum over the batch (overwrites, all rows)."""
    _ids(idx, "idx")
    B, T = idx.shape
    _f32(dwte, "dwte", writable=True)
    if dwte.ndim != 2:
        raise ValueError(f"dwte: expected (V, C), got shape {dwte.shape}")
    V, C = dwte.shape
    _f32(dout, "dout", (B * T, C))
    _f32(dwpe, "dwpe", (None, C), writable=True)
    if T > dwpe.shape[0]:
        raise ValueError(f"idx: {T} positions but dwpe has only {dwpe.shape[0]}")
    ffi, lib = _lib()
    bad = lib.embedding_backward(_ip(ffi, idx), _fp(ffi, dout), _fp(ffi, dwte), _fp(ffi, dwpe),
                                 B, T, C, V, _threads(threads))
    dwpe[T:] = 0.0  # positions this batch did not reach get no gradient
    if bad:
        raise ValueError(f"idx: {bad} token ids outside [0, {V})")
    return dwte, dwpe


def layernorm_forward(x, w, b, out, mean, rstd, threads=None):
    _f32(x, "x")
    if x.ndim != 2:
        raise ValueError(f"x: expected 2 dimensions, got shape {x.shape}")
    N, C = x.shape
    _f32(w, "w", (C,))
    _f32(b, "b", (C,))
    _f32(out, "out", (N, C), writable=True)
    _f32(mean, "mean", (N,), writable=True)
    _f32(rstd, "rstd", (N,), writable=True)
    ffi, lib = _lib()
    lib.layernorm_forward(_fp(ffi, x), _fp(ffi, w), _fp(ffi, b), _fp(ffi, out), _fp(ffi, mean),
                          _fp(ffi, rstd), N, C, _threads(threads))
    return out


def layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, threads=None):
    """Adds the input gradient into dx; overwrites dw and db."""
    _f32(x, "x")
    if x.ndim != 2:
        raise ValueError(f"x: expected 2 dimensions, got shape {x.shape}")
    N, C = x.shape
    _f32(dy, "dy", (N, C))
    _f32(w, "w", (C,))
    _f32(mean, "mean", (N,))
    _f32(rstd, "rstd", (N,))
    _f32(dx, "dx", (N, C), writable=True)
    _f32(dw, "dw", (C,), writable=True)
    _f32(db, "db", (C,), writable=True)
    ffi, lib = _lib()
    lib.layernorm_backward(_fp(ffi, dy), _fp(ffi, x), _fp(ffi, w), _fp(ffi, mean), _fp(ffi, rstd),
                           _fp(ffi, dx), _fp(ffi, dw), _fp(ffi, db), N, C, _threads(threads))
    return dx


def gelu_forward(x, out, threads=None):
    _f32(x, "x")
    _f32(out, "out", x.shape, writable=True)
    ffi, lib = _lib()
    lib.gelu_forward(_fp(ffi, x), _fp(ffi, out), x.size, _threads(threads))
    return out


def gelu_backward(x, dy, dx, threads=None):
    """dx = dy * gelu'(x); dx may be dy itself."""
    _f32(x, "x")
    _f32(dy, "dy", x.shape)
    _f32(dx, "dx", x.shape, writable=True)
    ffi, lib = _lib()
    lib.gelu_backward(_fp(ffi, x), _fp(ffi, dy), _fp(ffi, dx), x.size, _threads(threads))
    return dx


def heads_split(x, outs, B, T, H, threads=None):
    """x (B*T, parts*H*hd) -> each of ``outs`` (B, H, T, hd), parts = len(outs)."""
    parts = len(outs)
    if parts not in (1, 3):
        raise ValueError(f"outs: expected 1 or 3 arrays, got {parts}")
    B, T, H = (checks.positive_int(v, n) for v, n in ((B, "B"), (T, "T"), (H, "H")))
    _f32(x, "x")
    if x.ndim != 2 or x.shape[0] != B * T or x.shape[1] % (parts * H):
        raise ValueError(f"x: expected ({B * T}, {parts}*{H}*hd), got shape {x.shape}")
    hd = x.shape[1] // (parts * H)
    for i, o in enumerate(outs):
        _f32(o, f"outs[{i}]", (B, H, T, hd), writable=True)
    ffi, lib = _lib()
    ptrs = [_fp(ffi, o) for o in outs] + [ffi.NULL] * (3 - parts)
    lib.heads_split(_fp(ffi, x), *ptrs, B, T, H, hd, parts, _threads(threads))
    return outs


def heads_merge(ins, x, threads=None):
    """The inverse of :func:`heads_split`: each of ``ins`` (B, H, T, hd) -> x (B*T, parts*H*hd)."""
    parts = len(ins)
    if parts not in (1, 3):
        raise ValueError(f"ins: expected 1 or 3 arrays, got {parts}")
    _f32(ins[0], "ins[0]")
    if ins[0].ndim != 4:
        raise ValueError(f"ins[0]: expected (B, H, T, hd), got shape {ins[0].shape}")
    B, H, T, hd = ins[0].shape
    for i, a in enumerate(ins):
        _f32(a, f"ins[{i}]", (B, H, T, hd))
    _f32(x, "x", (B * T, parts * H * hd), writable=True)
    ffi, lib = _lib()
    ptrs = [_fp(ffi, a) for a in ins] + [ffi.NULL] * (3 - parts)
    lib.heads_merge(*ptrs, _fp(ffi, x), B, T, H, hd, parts, _threads(threads))
    return x


def _scores(s, name, writable):
    _f32(s, name, writable=writable)
    if s.ndim < 2 or s.shape[-1] != s.shape[-2]:
        raise ValueError(f"{name}: expected (..., T, T) score matrices, got shape {s.shape}")
    T = s.shape[-1]
    return s.size // (T * T), T


def attn_softmax_forward(s, scale, threads=None):
    """In place: each (T, T) matrix of s becomes the causal softmax of scale * s."""
    BH, T = _scores(s, "s", True)
    ffi, lib = _lib()
    lib.attn_softmax_forward(_fp(ffi, s), BH, T, float(scale), _threads(threads))
    return s


def attn_softmax_backward(p, dp, scale, threads=None):
    """In place: dp (gradient of P) becomes the gradient of the unscaled scores."""
    BH, T = _scores(p, "p", False)
    _f32(dp, "dp", p.shape, writable=True)
    ffi, lib = _lib()
    lib.attn_softmax_backward(_fp(ffi, p), _fp(ffi, dp), BH, T, float(scale), _threads(threads))
    return dp


def cross_entropy(logits, targets, losses, dlogits, threads=None):
    """Per-row losses and the gradient of their mean; returns the mean loss."""
    _f32(logits, "logits")
    if logits.ndim != 2:
        raise ValueError(f"logits: expected (N, V), got shape {logits.shape}")
    N, V = logits.shape
    checks.array(targets, "targets", np.int32, shape=(N,))
    _f32(losses, "losses", (N,), writable=True)
    _f32(dlogits, "dlogits", (N, V), writable=True)
    ffi, lib = _lib()
    bad = lib.cross_entropy(_fp(ffi, logits), _ip(ffi, targets), _fp(ffi, losses),
                            _fp(ffi, dlogits), N, V, 1.0 / N, _threads(threads))
    if bad:
        raise ValueError(f"targets: {bad} targets outside [0, {V})")
    return float(losses.mean(dtype=np.float64))


def adamw(p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, grad_scale, step, threads=None):
    """One AdamW update of p (and its moments m, v) in place; ``step`` counts from 1."""
    _f32(p, "p", writable=True)
    for a, n in ((g, "g"), (m, "m"), (v, "v")):
        _f32(a, n, p.shape, writable=n != "g")
    step = checks.positive_int(step, "step")
    ffi, lib = _lib()
    lib.adamw(_fp(ffi, p), _fp(ffi, g), _fp(ffi, m), _fp(ffi, v), p.size, lr, beta1, beta2, eps,
              weight_decay, grad_scale, 1.0 - beta1 ** step, 1.0 - beta2 ** step,
              _threads(threads))
    return p


def sum_squares(x, threads=None):
    _f32(x, "x")
    ffi, lib = _lib()
    return float(lib.sum_squares(_fp(ffi, x), x.size, _threads(threads)))


GEMM_F32_TYPE = ("void(*)(int, int, int, int, int, float, float *, int, float *, int, float, "
                 "float *, int, int, int, int, int, float *)")


class BatchedGemm:
    """out[i] = op(a[i]) op(b[i]) for every i, chapter 2's ``gemm_f32`` looped over in C.

    Threads take whole products (each runs single-threaded with its own
    packing buffer, allocated here once and grown when a larger one is needed).
    """

    def __init__(self, threads=None):
        from . import build, gemm

        gffi, glib = build.load("gemm")
        fn = getattr(glib, "gemm_f32", None)
        if fn is None or gffi.typeof(fn).cname != GEMM_F32_TYPE:
            raise RuntimeError("kernels_c/gemm.c has no gemm_f32 with the expected prototype")
        self.addr = int(gffi.cast("uintptr_t", gffi.addressof(glib, "gemm_f32")))
        blocks = gemm.default_blocks()
        self.blocks = blocks["mc"], blocks["kc"], blocks["nc"]
        self.glib = glib
        self.threads = checks.threads(threads)
        self.work = np.zeros(0, np.float32)

    def __call__(self, a, b, out, *, trans_a=False, trans_b=False, alpha=1.0):
        _f32(a, "a")
        _f32(b, "b")
        _f32(out, "out", writable=True)
        if not (a.ndim == b.ndim == out.ndim == 3) or not (len(a) == len(b) == len(out)):
            raise ValueError(f"a, b, out: expected stacks of matrices of one count, got shapes "
                             f"{a.shape}, {b.shape}, {out.shape}")
        M, K = a.shape[:0:-1] if trans_a else a.shape[1:]
        K2, N = b.shape[:0:-1] if trans_b else b.shape[1:]
        if K != K2 or out.shape[1:] != (M, N):
            raise ValueError(f"a, b, out: shapes {a.shape}, {b.shape}, {out.shape} do not make "
                             f"op(a) op(b) (trans_a={trans_a}, trans_b={trans_b})")
        if len(a) == 0:
            return out
        mc, kc, nc = self.blocks
        per = int(self.glib.gemm_work_floats(N, K, mc, kc, nc, 1))
        if self.work.size < per * self.threads:
            self.work = np.zeros(per * self.threads, np.float32)
        ffi, lib = _lib()
        lib.batched_gemm(ffi.cast("void *", self.addr), len(a), int(trans_a), int(trans_b), M, N,
                         K, float(alpha), _fp(ffi, a), a[0].size, a.shape[2], _fp(ffi, b),
                         b[0].size, b.shape[2], 0.0, _fp(ffi, out), out[0].size, N, mc, kc, nc,
                         _fp(ffi, self.work), per, self.threads)
        return out


# ---------------------------------------------------------------- the two ops

class NumpyOps:
    """The reference: each layer in a few lines of numpy, any float dtype."""

    name = "numpy"

    def __init__(self, threads=None):
        self.threads = threads

    # --8<-- [start:numpy_linear]
    def linear(self, x, w, b, out):
        np.matmul(x, w, out=out)
        if b is not None:
            out += b

    def linear_backward(self, dy, x, w, dx, dw, db, accumulate=False):
        if accumulate:
            dx += dy @ w.T
        else:
            np.matmul(dy, w.T, out=dx)
        np.matmul(x.T, dy, out=dw)
        if db is not None:
            np.sum(dy, axis=0, out=db)
    # --8<-- [end:numpy_linear]

    def head(self, x, w, out):
        np.matmul(x, w.T, out=out)

    def head_backward(self, dlogits, x, w, dx, dw):
        """dx = dlogits @ w (overwrites); dw = dlogits^T x (overwrites)."""
        np.matmul(dlogits, w, out=dx)
        np.matmul(dlogits.T, x, out=dw)

    def embedding(self, idx, wte, wpe, out):
        T = idx.shape[1]
        out[...] = (wte[idx] + wpe[:T]).reshape(out.shape)

    def embedding_backward(self, idx, dout, dwte, dwpe):
        B, T = idx.shape
        d = dout.reshape(B, T, -1)
        dwpe[...] = 0
        dwpe[:T] = d.sum(axis=0)
        np.add.at(dwte, idx.reshape(-1), dout)

    # --8<-- [start:numpy_layernorm]
    def layernorm(self, x, w, b, out, mean, rstd):
        mean[...] = x.mean(axis=1)
        xc = x - mean[:, None]
        rstd[...] = 1.0 / np.sqrt((xc * xc).mean(axis=1) + LN_EPS)
        out[...] = xc * rstd[:, None] * w + b

    def layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db):
        xh = (x - mean[:, None]) * rstd[:, None]
        g = dy * w
        dx += rstd[:, None] * (g - g.mean(axis=1, keepdims=True)
                               - xh * (g * xh).mean(axis=1, keepdims=True))
        dw[...] = (dy * xh).sum(axis=0)
        db[...] = dy.sum(axis=0)
    # --8<-- [end:numpy_layernorm]

    def gelu(self, x, out):
        out[...] = 0.5 * x * (1.0 + np.tanh(GELU_K * (x + 0.044715 * x ** 3)))

    def gelu_backward(self, x, dy, dx):
        t = np.tanh(GELU_K * (x + 0.044715 * x ** 3))
        dt = (1.0 - t * t) * GELU_K * (1.0 + 3 * 0.044715 * x * x)
        dx[...] = dy * (0.5 * (1.0 + t) + 0.5 * x * dt)

    def add(self, a, b, out):
        np.add(a, b, out=out)

    # --8<-- [start:numpy_attention]
    def attention(self, qkv, out, a):
        """qkv (B*T, 3C) -> out (B*T, C); keeps q, k, v, p in the attention workspace ``a``."""
        B, H, T, hd = a.q.shape
        x = qkv.reshape(B, T, 3, H, hd).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        a.q[...], a.k[...], a.v[...] = x[0], x[1], x[2]
        s = (a.q @ a.k.swapaxes(-1, -2)) / math.sqrt(hd)
        s[..., np.triu(np.ones((T, T), bool), 1)] = -np.inf      # causal mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        a.p[...] = s / s.sum(axis=-1, keepdims=True)
        out[...] = (a.p @ a.v).transpose(0, 2, 1, 3).reshape(B * T, H * hd)

    def attention_backward(self, dout, dqkv, a):
        B, H, T, hd = a.q.shape
        do = dout.reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        dv = a.p.swapaxes(-1, -2) @ do
        dp = do @ a.v.swapaxes(-1, -2)
        ds = a.p * (dp - (dp * a.p).sum(axis=-1, keepdims=True)) / math.sqrt(hd)
        dq, dk = ds @ a.k, ds.swapaxes(-1, -2) @ a.q
        dqkv.reshape(B, T, 3, H, hd)[...] = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4)
    # --8<-- [end:numpy_attention]

    def cross_entropy(self, logits, targets, losses, dlogits):
        z = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(z)
        s = e.sum(axis=1, keepdims=True)
        rows = np.arange(len(targets))
        losses[...] = np.log(s[:, 0]) - z[rows, targets]
        dlogits[...] = e / s
        dlogits[rows, targets] -= 1.0
        dlogits /= len(targets)
        return float(losses.mean(dtype=np.float64))

    def sum_squares(self, x):
        y = x.astype(np.float64)
        return float(y @ y)

    def adamw(self, p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, grad_scale, step):
        g = g * grad_scale
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * g * g
        p *= 1 - lr * weight_decay
        denom = np.sqrt(v) / math.sqrt(1 - beta2 ** step) + eps
        p -= (lr / (1 - beta1 ** step)) * m / denom


class KernelOps:
    """Chapter 2's GEMM for every product, ``kernels_c/layers.c`` for the rest."""

    name = "kernels"

    def __init__(self, threads=None):
        import inspect

        from .gemm import matmul
        self.threads = checks.threads(threads)
        self._matmul = matmul
        self._takes_threads = "threads" in inspect.signature(matmul).parameters
        _lib()  # build now, not inside the first timed step
        try:
            self.bmm = BatchedGemm(self.threads)
        except RuntimeError:  # a GEMM without gemm_f32: loop over the slices in Python
            self.bmm = self._bmm_python

    def matmul(self, a, b, **kw):
        """Chapter 2's GEMM; products under ~1 MFLOP stay on one thread (see PAR_MIN)."""
        if self._takes_threads:
            k = b.shape[1] if kw.get("trans_b") else b.shape[0]
            madds = a.size * (b.size // max(k, 1))  # (M K) (N) = M N K multiply-adds
            kw["threads"] = 1 if madds < (1 << 19) else self.threads
        return self._matmul(a, b, **kw)

    def _bmm_python(self, a, b, out, *, trans_a=False, trans_b=False):
        for x, y, o in zip(a, b, out):
            self.matmul(x, y, out=o, trans_a=trans_a, trans_b=trans_b)

    # --8<-- [start:kernel_linear]
    def linear(self, x, w, b, out):
        self.matmul(x, w, out=out)
        if b is not None:
            add_bias(out, b, self.threads)

    def linear_backward(self, dy, x, w, dx, dw, db, accumulate=False):
        self.matmul(dy, w, trans_b=True, out=dx, beta=1.0 if accumulate else 0.0)
        self.matmul(x, dy, trans_a=True, out=dw)
        if db is not None:
            col_sum(dy, db, self.threads)
    # --8<-- [end:kernel_linear]

    def head(self, x, w, out):
        self.matmul(x, w, trans_b=True, out=out)

    def head_backward(self, dlogits, x, w, dx, dw):
        self.matmul(dlogits, w, out=dx)
        self.matmul(dlogits, x, trans_a=True, out=dw)

    def embedding(self, idx, wte, wpe, out):
        embedding_forward(idx, wte, wpe, out, self.threads)

    def embedding_backward(self, idx, dout, dwte, dwpe):
        embedding_backward(idx, dout, dwte, dwpe, self.threads)

    def layernorm(self, x, w, b, out, mean, rstd):
        layernorm_forward(x, w, b, out, mean, rstd, self.threads)

    def layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db):
        layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, self.threads)

    def gelu(self, x, out):
        gelu_forward(x, out, self.threads)

    def gelu_backward(self, x, dy, dx):
        gelu_backward(x, dy, dx, self.threads)

    def add(self, a, b, out):
        residual_add(a, b, out, self.threads)

    # --8<-- [start:kernel_attention]
    def attention(self, qkv, out, a):
        B, H, T, hd = a.q.shape
        heads_split(qkv, (a.q, a.k, a.v), B, T, H, self.threads)
        S, P = a.p.reshape(B * H, T, T), a.p.reshape(B * H, T, T)
        self.bmm(a.q.reshape(-1, T, hd), a.k.reshape(-1, T, hd), S, trans_b=True)  # S = Q K^T
        attn_softmax_forward(a.p, 1.0 / math.sqrt(hd), self.threads)
        self.bmm(P, a.v.reshape(-1, T, hd), a.o.reshape(-1, T, hd))             # O = P V
        heads_merge((a.o,), out, self.threads)

    def attention_backward(self, dout, dqkv, a):
        B, H, T, hd = a.q.shape
        flat = lambda x: x.reshape(B * H, *x.shape[2:])  # noqa: E731
        heads_split(dout, (a.do,), B, T, H, self.threads)
        self.bmm(flat(a.do), flat(a.v), flat(a.dp), trans_b=True)   # dP = dO V^T
        self.bmm(flat(a.p), flat(a.do), flat(a.dv), trans_a=True)   # dV = P^T dO
        attn_softmax_backward(a.p, a.dp, 1.0 / math.sqrt(hd), self.threads)
        self.bmm(flat(a.dp), flat(a.k), flat(a.dq))                 # dQ = dS K
        self.bmm(flat(a.dp), flat(a.q), flat(a.dk), trans_a=True)   # dK = dS^T Q
        heads_merge((a.dq, a.dk, a.dv), dqkv, self.threads)
    # --8<-- [end:kernel_attention]

    def cross_entropy(self, logits, targets, losses, dlogits):
        return cross_entropy(logits, targets, losses, dlogits, self.threads)

    def sum_squares(self, x):
        return sum_squares(x, self.threads)

    def adamw(self, p, g, m, v, **kw):
        adamw(p, g, m, v, threads=self.threads, **kw)


# backend name -> ops class. The performance ladder's rungs (a persistent thread pool, tiled
# attention, bf16 products, ...) are subclasses of KernelOps that override the methods they
# change, registered here under their own names; the model code does not change.
BACKENDS = {"numpy": NumpyOps, "kernels": KernelOps}


def make_ops(backend: str, threads=None):
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, "
                         f"got {backend!r}")
    return BACKENDS[backend](threads)
