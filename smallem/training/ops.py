"""The GPT's layers, each written twice side by side, and the ops objects built from them.

Read it from top to bottom, as llm.c's ``train_gpt2.c``: the layers in the order the
forward pass meets them: embedding, LayerNorm, linear (the attention's QKV and projection,
the MLP's two layers), attention (as matrices, and in tiles), the recurrent block's scan,
residual add, GELU, the modern block's RMSNorm, RoPE and SwiGLU, the element-wise layers
that run in a row and so
can be fused, the tied head, cross-entropy; then AdamW and the gradient norm, which the
trainer calls, and the bf16 products. Each layer is written twice:

- ``Numpy<Layer>``, the reference: a few lines of numpy for the forward and the backward,
  dtype-generic, so that the tests run it in float64 against finite differences and
  PyTorch. It allocates temporaries freely: it is the definition, not the fast path.
- ``Kernel<Layer>``, the kernel path: the calls it makes instead. Every product goes to
  chapter 2's GEMM (``self.matmul``, ``self.bmm``: :class:`KernelOps`), everything else to
  the function of the same name in ``kernels_c/layers.c`` (``layers.<name>``: its Python
  entry in :mod:`smallem.training.layers` only checks the arguments). It allocates nothing: every
  output and scratch buffer is passed in.

After the last layer, :class:`NumpyOps` and :class:`KernelOps` each inherit one class of
every pair, and the rungs of chapter 3's climb are subclasses of :class:`KernelOps` that
override what they change (:data:`BACKENDS`). The model that walks the layers through an
ops object, :class:`smallem.training.model.GPT`, is written once for all of them.

Why this layout: a reader asking what LayerNorm's backward computes, or what the kernel
path does for it, finds both on one screen here; the argument checks, a dozen lines per
kernel, stay in :mod:`smallem.training.layers`, where they do not stand between the two versions. A
layer is a pair of small classes, rather than a method in each of two long classes, to keep
the pair together; building the ops objects from them keeps every method overridable on its
own, which the rungs rely on.

Conventions: activations are (N, C) row-major with N = B*T tokens; a linear layer's
weight is stored (in, out), so y = x @ W + b; attention tensors per head are (B, H, T, hd).
Backward methods that say "adds into" accumulate into their output (the residual stream's
gradient); all others overwrite.
"""

from __future__ import annotations

import math

import numpy as np

from smallem.plumbing import build
from smallem.training import layers, scan

def _scratch(ops, name: str, size: int, dtype=np.float32) -> np.ndarray:
    """The ops object's scratch array ``name``, of at least ``size`` elements: made on the
    first call and grown only when a larger one is needed, so that a step after the first
    allocates none."""
    buf = ops.__dict__.get(name)
    if buf is None or buf.size < size:
        buf = ops.__dict__[name] = np.empty(size, dtype)
    return buf


# ================================================================ the layers
# In a Kernel<Layer>, self.threads, self.matmul and self.bmm come from KernelOps (after them).

# ---------------------------------------------------------------- embedding
# out[b*T + t] = wte[idx[b, t]] + wpe[t]. Backward: each position's gradient goes to the
# row of its byte in wte (a scatter-add) and to its row of wpe (summed over the batch).

class NumpyEmbedding:
    def embedding(self, idx, wte, wpe, out):
        """wpe=None: no position table (the modern block puts positions in RoPE)."""
        T = idx.shape[1]
        out[...] = (wte[idx] + (0 if wpe is None else wpe[:T])).reshape(out.shape)

    def embedding_backward(self, idx, dout, dwte, dwpe):
        """Adds into dwte (which holds the tied head's share, or zeros); overwrites dwpe."""
        B, T = idx.shape
        d = dout.reshape(B, T, -1)
        if dwpe is not None:
            dwpe[...] = 0
            dwpe[:T] = d.sum(axis=0)
        np.add.at(dwte, idx.reshape(-1), dout)  # not dwte[idx] += : a repeated byte adds twice


class KernelEmbedding:
    def embedding(self, idx, wte, wpe, out):
        layers.embedding_forward(idx, wte, wpe, out, self.threads)

    def embedding_backward(self, idx, dout, dwte, dwpe):
        layers.embedding_backward(idx, dout, dwte, dwpe, self.threads)


# ---------------------------------------------------------------- LayerNorm
# Per row of C features: y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(var + LN_EPS).
# The forward keeps mean and rstd for the backward. With xh the normalised row and
# g = dy * w, dx = rstd * (g - mean(g) - xh * mean(g * xh)): two means, no C x C Jacobian.
LN_EPS = build.header_constant("SM_LN_EPS")  # defined once, in kernels_c/common.h
PRODUCT_PAR_MIN = int(build.header_constant("SM_PRODUCT_PAR_MIN"))  # multiply-adds
ROUND_PAR_MIN = int(build.header_constant("SM_ROUND_PAR_MIN"))  # floats rounded to bf16

# --8<-- [start:numpy_layernorm]
class NumpyLayerNorm:
    def layernorm(self, x, w, b, out, mean, rstd):
        mean[...] = x.mean(axis=1)
        xc = x - mean[:, None]
        rstd[...] = 1.0 / np.sqrt((xc * xc).mean(axis=1) + LN_EPS)
        out[...] = xc * rstd[:, None] * w + b

    def layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db):
        """Adds the input gradient into dx; overwrites dw and db."""
        xh = (x - mean[:, None]) * rstd[:, None]
        g = dy * w
        dx += rstd[:, None] * (g - g.mean(axis=1, keepdims=True)
                               - xh * (g * xh).mean(axis=1, keepdims=True))
        dw[...] = (dy * xh).sum(axis=0)
        db[...] = dy.sum(axis=0)
# --8<-- [end:numpy_layernorm]


class KernelLayerNorm:
    def layernorm(self, x, w, b, out, mean, rstd):
        layers.layernorm_forward(x, w, b, out, mean, rstd, self.threads)

    def layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db):
        layers.layernorm_backward(dy, x, w, mean, rstd, dx, dw, db, self.threads)


# ---------------------------------------------------------------- linear
# y = x @ w + b, w stored (in, out): the attention's QKV (C -> 3C) and projection (C -> C),
# the MLP's fc (C -> 4C) and fc2 (4C -> C). Backward: dx = dy w^T, dw = x^T dy, db = the
# column sums of dy: two products the forward's size, so training costs 6 FLOPs a weight.

# --8<-- [start:numpy_linear]
class NumpyLinear:
    def linear(self, x, w, b, out):
        np.matmul(x, w, out=out)
        if b is not None:
            self.bias(out, b)

    def bias(self, y, b):
        y += b

    def bias_backward(self, dy, db):
        np.sum(dy, axis=0, out=db)

    def linear_backward(self, dy, x, w, dx, dw, db, accumulate=False):
        if accumulate:
            dx += dy @ w.T
        else:
            np.matmul(dy, w.T, out=dx)
        np.matmul(x.T, dy, out=dw)
        if db is not None:
            self.bias_backward(dy, db)
# --8<-- [end:numpy_linear]


# --8<-- [start:kernel_linear]
class KernelLinear:
    def linear(self, x, w, b, out):
        self.matmul(x, w, out=out)
        if b is not None:
            self.bias(out, b)

    def bias(self, y, b):
        layers.add_bias(y, b, self.threads)

    def bias_backward(self, dy, db):
        layers.col_sum(dy, db, self.threads)

    def linear_backward(self, dy, x, w, dx, dw, db, accumulate=False):
        self.matmul(dy, w, trans_b=True, out=dx, beta=1.0 if accumulate else 0.0)
        self.matmul(x, dy, trans_a=True, out=dw)
        if db is not None:
            self.bias_backward(dy, db)
# --8<-- [end:kernel_linear]


# ---------------------------------------------------------------- attention
# Causal self-attention over the QKV linear's output (N, 3C), per head: S = Q K^T,
# P = softmax(S / sqrt(hd)) over each row's causal prefix, O = P V; the heads side by side
# are the output (N, C). ``a`` holds the layer's buffers (AttnCache, in the Workspace below),
# where the forward keeps q, k, v and P for the backward:
#   dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)) / sqrt(hd), dQ = dS K, dK = dS^T Q.

# --8<-- [start:numpy_attention]
class NumpyAttention:
    def attention(self, qkv, out, a):
        """qkv (B*T, 3C) -> out (B*T, C); keeps q, k, v, p in the attention workspace ``a``."""
        B, H, T, hd = a.q.shape
        x = qkv.reshape(B, T, 3, H, hd).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        a.q[...], a.k[...], a.v[...] = x[0], x[1], x[2]
        if a.rope is not None:  # the modern block: positions as rotations of q and k
            self.rope(a.q, a.k, *a.rope)
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
        if a.rope is not None:
            self.rope(dq, dk, *a.rope, inverse=True)
        dqkv.reshape(B, T, 3, H, hd)[...] = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4)
# --8<-- [end:numpy_attention]


# --8<-- [start:kernel_attention]
class KernelAttention:
    def attention(self, qkv, out, a):
        B, H, T, hd = a.q.shape
        layers.heads_split(qkv, (a.q, a.k, a.v), B, T, H, self.threads)
        if a.rope is not None:
            self.rope(a.q, a.k, *a.rope)
        S, P = a.p.reshape(B * H, T, T), a.p.reshape(B * H, T, T)
        self.bmm(a.q.reshape(-1, T, hd), a.k.reshape(-1, T, hd), S, trans_b=True)  # S = Q K^T
        layers.attn_softmax_forward(a.p, 1.0 / math.sqrt(hd), self.threads)
        self.bmm(P, a.v.reshape(-1, T, hd), a.o.reshape(-1, T, hd))             # O = P V
        layers.heads_merge((a.o,), out, self.threads)

    def attention_backward(self, dout, dqkv, a):
        B, H, T, hd = a.q.shape
        flat = lambda x: x.reshape(B * H, *x.shape[2:])  # noqa: E731
        layers.heads_split(dout, (a.do,), B, T, H, self.threads)
        self.bmm(flat(a.do), flat(a.v), flat(a.dp), trans_b=True)   # dP = dO V^T
        self.bmm(flat(a.p), flat(a.do), flat(a.dv), trans_a=True)   # dV = P^T dO
        layers.attn_softmax_backward(a.p, a.dp, 1.0 / math.sqrt(hd), self.threads)
        self.bmm(flat(a.dp), flat(a.k), flat(a.dq))                 # dQ = dS K
        self.bmm(flat(a.dp), flat(a.q), flat(a.dk), trans_a=True)   # dK = dS^T Q
        if a.rope is not None:
            self.rope(a.dq, a.dk, *a.rope, inverse=True)
        layers.heads_merge((a.dq, a.dk, a.dv), dqkv, self.threads)
# --8<-- [end:kernel_attention]


# --8<-- [start:flash_attention]
class FlashAttention:
    """The same attention in tiles (kernels_c/layers/flash.c): no (T, T) matrix, in the
    forward or the backward; the forward keeps each row's log-sum-exp instead of P."""

    needs_scores = False  # the workspace holds no P and no dP

    def flash_scratch(self, T, hd):  # one scratch for every layer
        return _scratch(self, "_flash", layers.flash_work_floats(T, hd, layers.flash_tile(hd),
                                                                 self.threads))

    def attention(self, qkv, out, a):
        B, H, T, hd = a.q.shape
        flat = lambda x: x.reshape(B * H, T, hd)  # noqa: E731
        layers.heads_split(qkv, (a.q, a.k, a.v), B, T, H, self.threads)
        if a.rope is not None:
            self.rope(a.q, a.k, *a.rope)
        layers.flash_forward(flat(a.q), flat(a.k), flat(a.v), flat(a.o), a.lse.reshape(B * H, T),
                             1.0 / math.sqrt(hd), threads=self.threads,
                             work=self.flash_scratch(T, hd))
        layers.heads_merge((a.o,), out, self.threads)

    def attention_backward(self, dout, dqkv, a):
        B, H, T, hd = a.q.shape
        flat = lambda x: x.reshape(B * H, T, hd)  # noqa: E731
        layers.heads_split(dout, (a.do,), B, T, H, self.threads)
        layers.flash_backward(*(flat(x) for x in (a.q, a.k, a.v, a.o)), a.lse.reshape(B * H, T),
                              *(flat(x) for x in (a.do, a.dq, a.dk, a.dv)), 1.0 / math.sqrt(hd),
                              threads=self.threads, work=self.flash_scratch(T, hd))
        if a.rope is not None:
            self.rope(a.dq, a.dk, *a.rope, inverse=True)
        layers.heads_merge((a.dq, a.dk, a.dv), dqkv, self.threads)
# --8<-- [end:flash_attention]


# ---------------------------------------------------------------- the recurrence
# The recurrent block's mixer (appendix D), in place of the attention: per head a matrix
# state S (hd x hd), decayed at each step by a gate and added the step's k v^T, read by the
# query: S_t = exp(lam_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, with q scaled by 1/sqrt(hd)
# and lam = log sigmoid(z), z the gate logits (one a head, from their own linear). The scan
# itself is smallem.training.scan's (the float64 definition) or kernels_c/layers/scan.c's.
# Backward: the scan's dq, dk, dv, dlam; dq scaled back; dz = dlam (1 - exp(lam)), since
# d log sigmoid(z) / dz = 1 - sigmoid(z).

# --8<-- [start:numpy_recurrence]
class NumpyRecurrence:
    def recurrence(self, qkv, z, out, a):
        """qkv (B*T, 3C) and the gate logits z (B*T, H) -> out (B*T, C); keeps q (scaled),
        k, v and lam in ``a``."""
        B, H, T, hd = a.q.shape
        x = qkv.reshape(B, T, 3, H, hd).transpose(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        a.q[...], a.k[...], a.v[...] = x[0] / math.sqrt(hd), x[1], x[2]
        a.lam[...] = -np.logaddexp(0.0, -z.reshape(B, T, H).transpose(0, 2, 1))
        flat = lambda y: y.reshape(B * H, *y.shape[2:])  # noqa: E731
        o, _ = scan.reference_forward(flat(a.q), flat(a.k), flat(a.v), flat(a.lam))
        out[...] = o.reshape(B, H, T, hd).transpose(0, 2, 1, 3).reshape(B * T, H * hd)

    def recurrence_backward(self, dout, dqkv, dz, a):
        B, H, T, hd = a.q.shape
        flat = lambda y: y.reshape(B * H, *y.shape[2:])  # noqa: E731
        do = dout.reshape(B, T, H, hd).transpose(0, 2, 1, 3)
        dq, dk, dv, dlam = scan.reference_backward(flat(a.q), flat(a.k), flat(a.v),
                                                   flat(a.lam), flat(do))
        d = np.stack([dq / math.sqrt(hd), dk, dv]).reshape(3, B, H, T, hd)
        dqkv.reshape(B, T, 3, H, hd)[...] = d.transpose(1, 3, 0, 2, 4)
        dz[...] = (dlam.reshape(B, H, T) * -np.expm1(a.lam)).transpose(0, 2, 1).reshape(B * T, H)
# --8<-- [end:numpy_recurrence]


# --8<-- [start:kernel_recurrence]
class KernelRecurrence:
    def scan_scratch(self, T, hd, chunk):  # one scratch for every layer
        return _scratch(self, "_scan", layers.scan_work_floats(T, hd, chunk, self.threads))

    def recurrence(self, qkv, z, out, a):
        B, H, T, hd = a.q.shape
        flat = lambda y: y.reshape(B * H, *y.shape[2:])  # noqa: E731
        layers.heads_split(qkv, (a.q, a.k, a.v), B, T, H, self.threads)
        a.q *= 1.0 / math.sqrt(hd)
        np.negative(np.logaddexp(0.0, -z.reshape(B, T, H).transpose(0, 2, 1)), out=a.lam)
        layers.scan_forward(flat(a.q), flat(a.k), flat(a.v), flat(a.lam), flat(a.o), a.states,
                            chunk=a.chunk, threads=self.threads,
                            work=self.scan_scratch(T, hd, a.chunk))
        layers.heads_merge((a.o,), out, self.threads)

    def recurrence_backward(self, dout, dqkv, dz, a):
        B, H, T, hd = a.q.shape
        flat = lambda y: y.reshape(B * H, *y.shape[2:])  # noqa: E731
        layers.heads_split(dout, (a.do,), B, T, H, self.threads)
        layers.scan_backward(*(flat(y) for y in (a.q, a.k, a.v, a.lam)), a.states,
                             *(flat(y) for y in (a.do, a.dq, a.dk, a.dv, a.dlam)),
                             chunk=a.chunk, threads=self.threads,
                             work=self.scan_scratch(T, hd, a.chunk))
        a.dq *= 1.0 / math.sqrt(hd)
        layers.heads_merge((a.dq, a.dk, a.dv), dqkv, self.threads)
        dz.reshape(B, T, H)[...] = (a.dlam * -np.expm1(a.lam)).transpose(0, 2, 1)
# --8<-- [end:kernel_recurrence]


# ---------------------------------------------------------------- residual add
# out = a + b, after the attention branch and after the MLP branch. No backward: the
# gradient passes through unchanged, so GPT._block_backward has no line for it.

class NumpyResidual:
    def add(self, a, b, out):
        np.add(a, b, out=out)


class KernelResidual:
    def add(self, a, b, out):
        layers.residual_add(a, b, out, self.threads)


# ---------------------------------------------------------------- GELU
# The MLP is linear (C -> 4C), GELU, linear (4C -> C). GELU in GPT-2's tanh form,
# 0.5 x (1 + tanh(u)), u = GELU_K (x + 0.044715 x^3). The backward, dx = dy * gelu'(x),
# may write dx over dy: the model does, to keep one 4C-wide gradient buffer.
GELU_K = build.header_constant("SM_GELU_K")  # sqrt(2 / pi), as the C has it
GELU_A = build.header_constant("SM_GELU_A")


class NumpyGelu:
    def gelu(self, x, out):
        out[...] = 0.5 * x * (1.0 + np.tanh(GELU_K * (x + GELU_A * x ** 3)))

    def gelu_backward(self, x, dy, dx):
        t = np.tanh(GELU_K * (x + GELU_A * x ** 3))
        dt = (1.0 - t * t) * GELU_K * (1.0 + 3 * GELU_A * x * x)
        dx[...] = dy * (0.5 * (1.0 + t) + 0.5 * x * dt)


class KernelGelu:
    def gelu(self, x, out):
        layers.gelu_forward(x, out, self.threads)

    def gelu_backward(self, x, dy, dx):
        layers.gelu_backward(x, dy, dx, self.threads)


# ---------------------------------------------------------------- the modern block
# Three layers of today's open models in place of GPT-2's (the training step's rung 7):
# RMSNorm for LayerNorm, y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + LN_EPS), no mean,
# no shift; rotary position embeddings (RoPE) for the learned position table: the feature
# pairs (2i, 2i+1) of every query and key turned by the angle t * ROPE_BASE^(-2i/hd) at
# position t, so that a score depends on how far apart two tokens are; and the SwiGLU
# MLP for GELU's, g = silu(x W1) * (x W3), then g W2, with W1 and W3 side by side in one
# (d, 2h) matrix. No biases anywhere. The backward of RMSNorm, with xh = x * rstd and
# g = dy * w, is dx = rstd * (g - xh * mean(g * xh)); RoPE's is the rotation back.
ROPE_BASE = 10000.0


def rope_tables(T: int, hd: int, dtype=np.float32):
    """cos and sin (T, hd/2) of RoPE's angles t * ROPE_BASE^(-2i / hd), made in float64."""
    theta = ROPE_BASE ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    angle = np.arange(T, dtype=np.float64)[:, None] * theta[None, :]
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)


class NumpyRMSNorm:
    def rmsnorm(self, x, w, out, rstd):
        rstd[...] = 1.0 / np.sqrt((x * x).mean(axis=1) + LN_EPS)
        out[...] = x * rstd[:, None] * w

    def rmsnorm_backward(self, dy, x, w, rstd, dx, dw):
        """Adds the input gradient into dx; overwrites dw."""
        xh = x * rstd[:, None]
        g = dy * w
        dx += rstd[:, None] * (g - xh * (g * xh).mean(axis=1, keepdims=True))
        dw[...] = (dy * xh).sum(axis=0)


class KernelRMSNorm:
    def rmsnorm(self, x, w, out, rstd):
        layers.rmsnorm_forward(x, w, out, rstd, self.threads)

    def rmsnorm_backward(self, dy, x, w, rstd, dx, dw):
        layers.rmsnorm_backward(dy, x, w, rstd, dx, dw, self.threads)


class NumpyRope:
    def rope(self, q, k, cos, sin, inverse=False):
        """In place: q and k (..., T, hd) turned pair by pair (back, if ``inverse``)."""
        sin = -sin if inverse else sin
        for x in (q, k):
            a, b = x[..., 0::2].copy(), x[..., 1::2].copy()
            x[..., 0::2] = a * cos - b * sin
            x[..., 1::2] = a * sin + b * cos


class KernelRope:
    def rope(self, q, k, cos, sin, inverse=False):
        layers.rope(q, k, cos, sin, inverse, self.threads)


class NumpySwiGLU:
    def swiglu(self, u, g):
        """g = silu(a) * b, a and b the two halves of u's columns."""
        h = g.shape[1]
        a, b = u[:, :h], u[:, h:]
        g[...] = a / (1.0 + np.exp(-a)) * b

    def swiglu_backward(self, u, dg, du):
        h = dg.shape[1]
        a, b = u[:, :h], u[:, h:]
        s = 1.0 / (1.0 + np.exp(-a))
        du[:, :h] = dg * b * s * (1.0 + a * (1.0 - s))
        du[:, h:] = dg * a * s


class KernelSwiGLU:
    def swiglu(self, u, g):
        layers.swiglu_forward(u, g, self.threads)

    def swiglu_backward(self, u, dg, du):
        layers.swiglu_backward(u, dg, du, self.threads)


# ---------------------------------------------------------------- fused element-wise work
# Three places where the block runs two or three element-wise layers in a row over the
# same tensor: the MLP's bias and GELU (and their backward with the bias gradient), and
# after each branch's last product its bias and the residual add (then, after the
# attention, LayerNorm). Unfused, each layer is its own pass over memory; the model
# calls them through these four methods, so that a backend can do each in one pass
# (KernelFused, the training step's rung 5) and every other backend runs the
# composition below, which is the definition.

# --8<-- [start:unfused]
class UnfusedElementwise:
    def bias_gelu(self, u, b, g):
        """u += b, then g = gelu(u)."""
        self.bias(u, b)
        self.gelu(u, g)

    def gelu_backward_bias(self, u, dy, dx, db):
        """dx = dy * gelu'(u) (dx may be dy), then db = the column sums of dx."""
        self.gelu_backward(u, dy, dx)
        self.bias_backward(dx, db)

    def residual_layernorm(self, x, t, bias, mid, w, b, out, mean, rstd):
        """mid = x + (t + bias) (t is scratch: it may be overwritten), then
        out = LayerNorm(mid)."""
        self.bias(t, bias)
        self.add(x, t, mid)
        self.layernorm(mid, w, b, out, mean, rstd)

    def bias_residual(self, x, t, bias, out):
        """out = x + (t + bias) (t is scratch)."""
        self.bias(t, bias)
        self.add(x, t, out)
# --8<-- [end:unfused]


class KernelFused:
    """Each of the four in one pass: kernels_c/layers/fused.c."""

    def bias_gelu(self, u, b, g):
        layers.bias_gelu_forward(u, b, g, self.threads)

    def gelu_backward_bias(self, u, dy, dx, db):
        partial = _scratch(self, "_partial", self.threads.n * u.shape[1])  # threads' sums
        layers.gelu_backward_bias(u, dy, dx, db, self.threads, work=partial)

    def residual_layernorm(self, x, t, bias, mid, w, b, out, mean, rstd):
        layers.residual_layernorm(x, t, bias, mid, w, b, out, mean, rstd, self.threads)

    def bias_residual(self, x, t, bias, out):
        layers.bias_residual(x, t, bias, out, self.threads)


# ---------------------------------------------------------------- head
# After the last block, a final LayerNorm (above), then logits = x w^T, w (V, C): with tied
# weights the token table read as the output matrix. Backward: dx = dlogits w and
# dw = dlogits^T x, both overwritten (tied: the embedding's backward adds to dw later).

class NumpyHead:
    def head(self, x, w, out):
        np.matmul(x, w.T, out=out)

    def head_backward(self, dlogits, x, w, dx, dw):
        """dx = dlogits @ w (overwrites); dw = dlogits^T x (overwrites)."""
        np.matmul(dlogits, w, out=dx)
        np.matmul(dlogits.T, x, out=dw)


class KernelHead:
    def head(self, x, w, out):
        self.matmul(x, w, trans_b=True, out=out)

    def head_backward(self, dlogits, x, w, dx, dw):
        self.matmul(dlogits, w, out=dx)
        self.matmul(dlogits, x, trans_a=True, out=dw)


# ---------------------------------------------------------------- cross-entropy
# Softmax and loss fused, per row: loss = log(sum exp z) - z[target], and the gradient of
# the mean loss, (softmax(z) - onehot(target)) / N, written in the same pass. Returns the
# mean loss.

class NumpyCrossEntropy:
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


class KernelCrossEntropy:
    def cross_entropy(self, logits, targets, losses, dlogits):
        return layers.cross_entropy(logits, targets, losses, dlogits, self.threads)


# ---------------------------------------------------------------- AdamW and the gradient norm
# Not layers, but the rest of a training step (smallem.training.train.Trainer calls them): the
# gradient's squared norm, for clipping, and one AdamW update of p and its moments m, v in
# place. The clipping factor comes in as grad_scale, so the update is one pass; ``step``
# counts from 1 for the bias corrections.

class NumpyAdamW:
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


class KernelAdamW:
    def sum_squares(self, x):
        return layers.sum_squares(x, self.threads)

    def adamw(self, p, g, m, v, **kw):
        layers.adamw(p, g, m, v, threads=self.threads, **kw)


# ---------------------------------------------------------------- bf16 products
# The training step's rung 6: each product's two operands are rounded to bf16 (8 bits of
# mantissa where f32 has 24; the same exponent range) just before the product, and
# chapter 2's bf16 GEMM sums them in f32 into an f32 output. The weights stay f32 (the
# master copy AdamW updates: an update far smaller than a bf16 weight's last bit would
# otherwise be lost), and so do the activations between the layers, every element-wise
# layer and the attention in tiles. PyTorch's CPU autocast rounds its products the same way
# but also runs scaled_dot_product_attention in bf16, and an op fed by a bf16 product
# (GELU) in bf16 (bibliography.md: pytorch-autocast).

# --8<-- [start:bf16_products]
class KernelBf16Products:
    def _bf16(self, x, slot):  # x rounded into this ops object's scratch
        buf = _scratch(self, f"_bf16_{slot}", x.size, np.uint16)
        return layers.to_bf16(x, buf[:x.size].reshape(x.shape),
                              self.threads.one() if x.size < ROUND_PAR_MIN else self.threads)

    def matmul(self, a, b, **kw):
        from smallem.product.gemm import matmul_bf16
        k = b.shape[1] if kw.get("trans_b") else b.shape[0]
        small = a.size * (b.size // max(k, 1)) < PRODUCT_PAR_MIN
        kw["threads"] = self.threads.one() if small else self.threads
        return matmul_bf16(self._bf16(a, 0), self._bf16(b, 1), **kw)
# --8<-- [end:bf16_products]


# ================================================================ the two ops objects

class NumpyOps(NumpyEmbedding, NumpyLayerNorm, NumpyLinear, NumpyAttention, NumpyRecurrence,
               NumpyResidual,
               NumpyGelu, NumpyRMSNorm, NumpyRope, NumpySwiGLU, UnfusedElementwise, NumpyHead,
               NumpyCrossEntropy, NumpyAdamW):
    """The reference: each layer in a few lines of numpy, any float dtype."""

    name = "numpy"

    def __init__(self, threads=None, pool=False):
        self.threads = threads


class KernelOps(KernelEmbedding, KernelLayerNorm, KernelLinear, KernelAttention,
                KernelRecurrence, KernelResidual, KernelGelu, KernelRMSNorm, KernelRope,
                KernelSwiGLU, UnfusedElementwise, KernelHead, KernelCrossEntropy, KernelAdamW):
    """Chapter 2's GEMM for every product, ``kernels_c/layers.c`` for the rest."""

    name = "kernels"

    def __init__(self, threads=None, pool=False):
        from smallem.plumbing import pool as own_pool
        from smallem.product.gemm import matmul
        # the team every kernel of this ops object runs on: with pool=True smallem's own
        # thread pool (rung 2), not OpenMP's runtime
        self.threads = own_pool.team(threads, pool)
        self._matmul = matmul
        self.threads.module("layers")  # built and loaded now, not in a timed step
        try:
            self.bmm = layers.BatchedGemm(self.threads)
        except RuntimeError:  # a GEMM without gemm_f32: loop over the slices in Python
            self.bmm = self._bmm_python

    def matmul(self, a, b, **kw):
        """Chapter 2's GEMM; products under SM_PRODUCT_PAR_MIN multiply-adds stay on one
        thread (kernels_c/common.h, beside SM_PAR_MIN, which decides for the other kernels)."""
        k = b.shape[1] if kw.get("trans_b") else b.shape[0]
        madds = a.size * (b.size // max(k, 1))  # (M K) (N) = M N K multiply-adds
        kw["threads"] = self.threads.one() if madds < PRODUCT_PAR_MIN else self.threads
        return self._matmul(a, b, **kw)

    def _bmm_python(self, a, b, out, *, trans_a=False, trans_b=False):
        for x, y, o in zip(a, b, out):
            self.matmul(x, y, out=o, trans_a=trans_a, trans_b=trans_b)


class FlashOps(FlashAttention, KernelOps):
    """KernelOps with the attention in tiles."""

    name = "flash"


class FusedOps(KernelFused, FlashOps):
    """FlashOps with the fused element-wise kernels."""

    name = "fused"


class Bf16Ops(KernelBf16Products, FusedOps):
    """FusedOps with every matrix product in bf16 (the attention in tiles stays f32)."""

    name = "bf16"


def cuda_ops(threads=None, pool=False):
    """The training step on the GPU (smallem.training.gpu_ops.CudaOps), imported only when
    asked for: CuPy is optional, and without it or a device this raises
    smallem.plumbing.cuda.GPUUnavailable saying which is missing."""
    from smallem.training.gpu_ops import CudaOps
    return CudaOps(threads, pool=pool)


# backend name -> ops class. The performance ladder's rungs (a persistent thread pool, tiled
# attention, bf16 products, ...) are subclasses of KernelOps that override the methods they
# change, registered here under their own names; the model code does not change. "cuda" is
# the same model on the GPU: arrays on the device, every layer a kernel of kernels_cuda/train.cu.
BACKENDS = {"numpy": NumpyOps, "kernels": KernelOps, "flash": FlashOps, "fused": FusedOps,
            "bf16": Bf16Ops, "cuda": cuda_ops}


def make_ops(backend: str, threads=None, pool: bool = False):
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, "
                         f"got {backend!r}")
    return BACKENDS[backend](threads, pool=pool)
