"""A GPT-2-style transformer in one file: its layers, then the model.

Read it from top to bottom, as llm.c's ``train_gpt2.c``. First the layers, in the order the
forward pass meets them: embedding, LayerNorm, linear (the attention's QKV and projection,
the MLP's two layers), attention, residual add, GELU, the element-wise layers that run in a
row and so can be fused, the tied head, cross-entropy; then AdamW and the gradient norm,
which the trainer calls. Each layer is written twice, side by side:

- ``Numpy<Layer>``, the reference: a few lines of numpy for the forward and the backward,
  dtype-generic, so that the tests run it in float64 against finite differences and
  PyTorch. It allocates temporaries freely: it is the definition, not the fast path.
- ``Kernel<Layer>``, the kernel path: the calls it makes instead. Every product goes to
  chapter 2's GEMM (``self.matmul``, ``self.bmm``: :class:`KernelOps`), everything else to
  the function of the same name in ``kernels_c/layers.c`` (``layers.<name>``: its Python
  entry in :mod:`smallem.layers` only checks the arguments). It allocates nothing: every
  output and scratch buffer is passed in.

After the last layer, :class:`NumpyOps` and :class:`KernelOps` each inherit one class of
every pair. Then the model: its shape (:class:`Config`), its buffers (:class:`Workspace`)
and :class:`GPT`, whose forward and backward walk the layers through an ops object, so
they are written once for both paths.

Why this layout: a reader asking what LayerNorm's backward computes, or what the kernel
path does for it, finds both on one screen here, and the model that calls them further
down; the argument checks, a dozen lines per kernel, stay in :mod:`smallem.layers`, where
they do not stand between the two versions. A layer is a pair of small classes, rather
than a method in each of two long classes, to keep the pair together; building the ops
objects from them keeps every method overridable on its own, which the performance
ladder's rungs (subclasses of :class:`KernelOps`, in :data:`BACKENDS`) rely on.

No autograd: :meth:`GPT.forward` keeps every activation the backward pass needs in a
:class:`Workspace` allocated once per (config, B, T), and :meth:`GPT.backward` walks the
layers in reverse, writing gradients into one flat buffer that mirrors the flat parameter
buffer. Parameters live in one contiguous array (weights that take weight decay first,
then biases and LayerNorm gains), so that the optimiser, the gradient norm and the
checkpoint each see one buffer, not sixty.

Conventions: activations are (N, C) row-major with N = B*T tokens; a linear layer's
weight is stored (in, out), so y = x @ W + b; attention tensors per head are (B, H, T, hd).
Backward methods that say "adds into" accumulate into their output (the residual stream's
gradient); all others overwrite.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from . import checks, layers

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
LN_EPS = 1e-5

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
# are the output (N, C). ``a`` holds the layer's buffers (_Attn, in the Workspace below),
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

    def _flash_scratch(self, T, hd):  # one scratch for every layer, grown once
        need = layers.flash_work_floats(T, hd, layers.flash_tile(hd), self.threads)
        if getattr(self, "_flash", np.empty(0)).size < need:
            self._flash = np.empty(need, np.float32)
        return self._flash

    def attention(self, qkv, out, a):
        B, H, T, hd = a.q.shape
        flat = lambda x: x.reshape(B * H, T, hd)  # noqa: E731
        layers.heads_split(qkv, (a.q, a.k, a.v), B, T, H, self.threads)
        if a.rope is not None:
            self.rope(a.q, a.k, *a.rope)
        layers.flash_forward(flat(a.q), flat(a.k), flat(a.v), flat(a.o), a.lse.reshape(B * H, T),
                             1.0 / math.sqrt(hd), threads=self.threads,
                             work=self._flash_scratch(T, hd))
        layers.heads_merge((a.o,), out, self.threads)

    def attention_backward(self, dout, dqkv, a):
        B, H, T, hd = a.q.shape
        flat = lambda x: x.reshape(B * H, T, hd)  # noqa: E731
        layers.heads_split(dout, (a.do,), B, T, H, self.threads)
        layers.flash_backward(*(flat(x) for x in (a.q, a.k, a.v, a.o)), a.lse.reshape(B * H, T),
                              *(flat(x) for x in (a.do, a.dq, a.dk, a.dv)), 1.0 / math.sqrt(hd),
                              threads=self.threads, work=self._flash_scratch(T, hd))
        if a.rope is not None:
            self.rope(a.dq, a.dk, *a.rope, inverse=True)
        layers.heads_merge((a.dq, a.dk, a.dv), dqkv, self.threads)
# --8<-- [end:flash_attention]


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
GELU_K = math.sqrt(2.0 / math.pi)


class NumpyGelu:
    def gelu(self, x, out):
        out[...] = 0.5 * x * (1.0 + np.tanh(GELU_K * (x + 0.044715 * x ** 3)))

    def gelu_backward(self, x, dy, dx):
        t = np.tanh(GELU_K * (x + 0.044715 * x ** 3))
        dt = (1.0 - t * t) * GELU_K * (1.0 + 3 * 0.044715 * x * x)
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
        layers.gelu_backward_bias(u, dy, dx, db, self.threads)

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
# Not layers, but the rest of a training step (smallem.train.Trainer calls them): the
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
# otherwise be lost), and so do the activations between the layers and every
# element-wise layer; this is what PyTorch's bf16 autocast does on the CPU.

# --8<-- [start:bf16_products]
class KernelBf16Products:
    def _bf16(self, x, slot):  # x rounded into this ops object's scratch (grown once)
        bufs = self.__dict__.setdefault("_bf16_bufs", [np.empty(0, np.uint16)] * 2)
        if bufs[slot].size < x.size:
            bufs[slot] = np.empty(x.size, np.uint16)
        return layers.to_bf16(x, bufs[slot][:x.size].reshape(x.shape),
                              1 if x.size < (1 << 16) else self.threads)

    def matmul(self, a, b, **kw):
        from .gemm import matmul_bf16
        k = b.shape[1] if kw.get("trans_b") else b.shape[0]
        kw["threads"] = 1 if a.size * (b.size // max(k, 1)) < (1 << 19) else self.threads
        return matmul_bf16(self._bf16(a, 0), self._bf16(b, 1), **kw)
# --8<-- [end:bf16_products]


# ================================================================ the two ops objects

class NumpyOps(NumpyEmbedding, NumpyLayerNorm, NumpyLinear, NumpyAttention, NumpyResidual,
               NumpyGelu, NumpyRMSNorm, NumpyRope, NumpySwiGLU, UnfusedElementwise, NumpyHead,
               NumpyCrossEntropy, NumpyAdamW):
    """The reference: each layer in a few lines of numpy, any float dtype."""

    name = "numpy"

    def __init__(self, threads=None):
        self.threads = threads


class KernelOps(KernelEmbedding, KernelLayerNorm, KernelLinear, KernelAttention,
                KernelResidual, KernelGelu, KernelRMSNorm, KernelRope, KernelSwiGLU,
                UnfusedElementwise, KernelHead, KernelCrossEntropy, KernelAdamW):
    """Chapter 2's GEMM for every product, ``kernels_c/layers.c`` for the rest."""

    name = "kernels"

    def __init__(self, threads=None):
        from . import build
        from .gemm import matmul
        self.threads = checks.threads(threads)
        self._matmul = matmul
        build.load("layers")  # build now, not inside the first timed step
        try:
            self.bmm = layers.BatchedGemm(self.threads)
        except RuntimeError:  # a GEMM without gemm_f32: loop over the slices in Python
            self.bmm = self._bmm_python

    def matmul(self, a, b, **kw):
        """Chapter 2's GEMM; products under ~1 MFLOP stay on one thread (as PAR_MIN in
        kernels_c/layers.c decides for the other kernels)."""
        k = b.shape[1] if kw.get("trans_b") else b.shape[0]
        madds = a.size * (b.size // max(k, 1))  # (M K) (N) = M N K multiply-adds
        kw["threads"] = 1 if madds < (1 << 19) else self.threads
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


# backend name -> ops class. The performance ladder's rungs (a persistent thread pool, tiled
# attention, bf16 products, ...) are subclasses of KernelOps that override the methods they
# change, registered here under their own names; the model code does not change.
BACKENDS = {"numpy": NumpyOps, "kernels": KernelOps, "flash": FlashOps, "fused": FusedOps,
            "bf16": Bf16Ops}


def make_ops(backend: str, threads=None):
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(map(repr, BACKENDS))}, "
                         f"got {backend!r}")
    return BACKENDS[backend](threads)


# ================================================================ the model

VOCAB = 256  # byte-level tokens
BLOCKS = ("gpt2", "modern")


@dataclass(frozen=True)
class Config:
    """A model's shape. ``context`` is the longest sequence it is trained on."""

    name: str = "custom"
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    context: int = 128
    vocab: int = VOCAB
    tied: bool = True  # LM head shares the token-embedding matrix
    block: str = "gpt2"  # or "modern": RMSNorm, RoPE, SwiGLU, no biases

    def __post_init__(self):
        for k in ("d_model", "n_layer", "n_head", "context", "vocab"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"config {self.name!r}: {k} must be a positive int, got {v!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"config {self.name!r}: n_head={self.n_head} does not divide "
                             f"d_model={self.d_model} (each head gets d_model/n_head features)")
        if self.block not in BLOCKS:
            raise ValueError(f"config {self.name!r}: block must be one of {', '.join(BLOCKS)}, "
                             f"got {self.block!r}")
        if self.block == "modern" and self.head_dim % 2:
            raise ValueError(f"config {self.name!r}: RoPE turns pairs of features, but the head "
                             f"size d_model/n_head = {self.head_dim} is odd")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def mlp_hidden(self) -> int:
        """The MLP's hidden width: 4d for GPT-2; for SwiGLU, whose three matrices must hold
        as many weights as GPT-2's two, 8d/3 rounded up to a multiple of 32."""
        if self.block == "gpt2":
            return 4 * self.d_model
        return 32 * -(-self.d_model // 12)  # ceil(8d/3 / 32) * 32

    @property
    def mlp_in(self) -> int:
        """The width of the MLP's first product: 4d, or 2h for SwiGLU's W1 and W3 together."""
        return self.mlp_hidden * (2 if self.block == "modern" else 1)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter, in storage order: decayed matrices (the blocks' ones together),
        then the rest."""
        if self.block == "modern":
            return self._modern_shapes()
        C, V = self.d_model, self.vocab
        decayed = {"wte": (V, C), "wpe": (self.context, C)}
        rest = {}
        for i in range(self.n_layer):
            p = f"h{i}."
            decayed.update({p + "attn.w": (C, 3 * C), p + "proj.w": (C, C),
                            p + "fc.w": (C, 4 * C), p + "fc2.w": (4 * C, C)})
            rest.update({p + "ln1.w": (C,), p + "ln1.b": (C,), p + "attn.b": (3 * C,),
                         p + "proj.b": (C,), p + "ln2.w": (C,), p + "ln2.b": (C,),
                         p + "fc.b": (4 * C,), p + "fc2.b": (C,)})
        if not self.tied:
            decayed["lm_head"] = (V, C)
        rest.update({"lnf.w": (C,), "lnf.b": (C,)})
        return {**decayed, **rest}

    def _modern_shapes(self) -> dict[str, tuple[int, ...]]:
        C, V, h = self.d_model, self.vocab, self.mlp_hidden
        shapes = {"wte": (V, C)}
        if not self.tied:
            shapes["lm_head"] = (V, C)
        for i in range(self.n_layer):
            p = f"h{i}."
            shapes.update({p + "attn.w": (C, 3 * C), p + "proj.w": (C, C),
                           p + "fc.w": (C, 2 * h), p + "fc2.w": (h, C)})
        for i in range(self.n_layer):
            shapes.update({f"h{i}.ln1.w": (C,), f"h{i}.ln2.w": (C,)})
        shapes["lnf.w"] = (C,)
        return shapes

    def hidden_matrices(self) -> list[str]:
        """The blocks' weight matrices (the ones Muon updates), in storage order."""
        return [n for n, s in self.param_shapes().items() if n.startswith("h") and len(s) == 2]

    def hidden_span(self) -> tuple[int, int]:
        """Where the blocks' matrices sit in the flat buffer: [start, end), in floats."""
        start = end = off = 0
        names = set(self.hidden_matrices())
        for name, shape in self.param_shapes().items():
            if name in names and not start:
                start = off
            off += math.prod(shape)
            if name in names:
                end = off
        return start, end

    def n_decayed(self) -> int:
        """How many leading floats of the flat buffer take weight decay (the 2-D ones)."""
        return sum(math.prod(s) for s in self.param_shapes().values() if len(s) == 2)

    def n_params(self) -> int:
        return sum(math.prod(s) for s in self.param_shapes().values())

    def flops_per_token(self, T: int | None = None) -> int:
        """Training FLOPs per token, 6N + 12 L d T (the PaLM paper's count, Appendix B).

        N counts the parameters that enter a matrix product (every weight matrix
        and the LM head, not the position table or biases): 2 FLOPs each forward,
        4 backward. The attention products QK^T and PV add 4 d T per layer
        forward (counted over the full T x T square, as the kernels compute it).
        """
        T = self.context if T is None else T
        C, L = self.d_model, self.n_layer
        mlp = C * self.mlp_in + self.mlp_hidden * C  # weights of the MLP's products
        n_matmul = L * (4 * C * C + mlp) + self.vocab * C
        return 6 * n_matmul + 12 * L * C * T

    def to_dict(self) -> dict:
        return asdict(self)


# The four sizes the book trains. The comments are what ``n_params`` and
# ``flops_per_token`` compute (``smallem train --list``; a test keeps them true).
CONFIGS = {
    "s": Config("s", d_model=128, n_layer=4, n_head=4, context=128),    # 0.84 M, 5.7 MFLOP/token
    "m": Config("m", d_model=256, n_layer=6, n_head=8, context=256),    # 4.87 M, 33 MFLOP/token
    "l": Config("l", d_model=384, n_layer=8, n_head=8, context=256),    # 14.4 M, 95 MFLOP/token
    "xl": Config("xl", d_model=512, n_layer=8, n_head=8, context=512),  # 25.6 M, 177 MFLOP/token
    # the same four shapes with the modern block (RMSNorm, RoPE, SwiGLU, no biases)
    "s-modern": Config("s-modern", 128, 4, 4, 128, block="modern"),     # 0.84 M, 5.8 MFLOP/token
    "m-modern": Config("m-modern", 256, 6, 8, 256, block="modern"),     # 4.89 M, 34 MFLOP/token
    "l-modern": Config("l-modern", 384, 8, 8, 256, block="modern"),     # 14.3 M, 95 MFLOP/token
    "xl-modern": Config("xl-modern", 512, 8, 8, 512, block="modern"),   # 25.4 M, 178 MFLOP/token
}


def get_config(name_or_config) -> Config:
    if isinstance(name_or_config, Config):
        return name_or_config
    if isinstance(name_or_config, dict):
        return Config(**name_or_config)
    if name_or_config not in CONFIGS:
        raise ValueError(f"unknown config {name_or_config!r}; choose one of {', '.join(CONFIGS)}")
    return CONFIGS[name_or_config]


class _Attn:
    """Per-layer attention buffers: q, k, v, the output o, and the probabilities P (or, for
    the attention in tiles, only each row's log-sum-exp)."""

    def __init__(self, z, B, H, T, hd, shared, scores=True, rope=None):
        self.rope = rope  # (cos, sin) for the modern block's RoPE, or None
        self.q, self.k, self.v, self.o = (z(B, H, T, hd) for _ in range(4))
        self.p = z(B, H, T, T) if scores else z(0)
        self.lse = z(B, H, T)
        # backward scratch, shared by all layers (only one layer's backward runs at a time)
        self.do, self.dq, self.dk, self.dv, self.dp = (
            shared["do"], shared["dq"], shared["dk"], shared["dv"], shared["dp"])


@dataclass
class _Layer:
    x: np.ndarray       # block input (the residual stream)
    ln1: np.ndarray
    ln1_mean: np.ndarray
    ln1_rstd: np.ndarray
    qkv: np.ndarray
    att: np.ndarray     # attention output before the projection
    mid: np.ndarray     # residual stream after attention
    ln2: np.ndarray
    ln2_mean: np.ndarray
    ln2_rstd: np.ndarray
    u: np.ndarray       # fc output (GELU input)
    g: np.ndarray       # GELU output
    attn: _Attn = field(repr=False)


class _Arena:
    """Carves arrays one after another out of one flat buffer, each at a 64-byte boundary.
    With no buffer it only counts: the first pass over a layout sizes the arena, the second
    carves it."""

    ALIGN = 64  # bytes: a cache line, so no two buffers share one and no vector load splits

    def __init__(self, dtype, buf=None):
        self.dtype, self.buf, self.used = np.dtype(dtype), buf, 0

    def __call__(self, *shape):
        n = math.prod(shape)
        start = self.used
        self.used += -(-n * self.dtype.itemsize // self.ALIGN) * self.ALIGN // self.dtype.itemsize
        if self.buf is None:
            return np.empty((0,) * len(shape), self.dtype)  # a placeholder while sizing
        return self.buf[start:start + n].reshape(shape)


class Workspace:
    """Every activation and gradient buffer one (config, B, T) step needs, carved once from
    one arena (:attr:`arena`, zeroed), whose size follows from the config: :meth:`floats`.

    For the xl config at B=4, T=512 this is about 0.9 GB: per layer twenty
    (B*T, d) tensors of 4 MiB and the attention probabilities, B*H*T*T floats
    = 32 MiB. ``arena=False`` gives every buffer its own allocation instead: the step
    that allocates per call, which chapter 3 times against the arena. The token ids and
    targets (int32) are two small arrays of their own either way.
    """

    def __init__(self, cfg: Config, B: int, T: int, dtype=np.float32, scores: bool = True,
                 arena: bool = True):
        self.B, self.T, self.dtype = B, T, np.dtype(dtype)
        self.idx = np.zeros((B, T), np.int32)
        self.targets = np.zeros(B * T, np.int32)
        if arena:
            size = _Arena(dtype)
            self._carve(cfg, size, scores)
            raw = np.zeros(size.used + _Arena.ALIGN // self.dtype.itemsize, dtype)
            skip = -raw.ctypes.data % _Arena.ALIGN // self.dtype.itemsize
            self.arena = raw[skip:skip + size.used]  # starts on a cache line
            self._carve(cfg, _Arena(dtype, self.arena), scores)
        else:
            self.arena = None
            self._carve(cfg, lambda *s: np.zeros(s, dtype), scores)
        if cfg.block == "modern":  # RoPE's angles, the same for every layer
            self.rope_cos[...], self.rope_sin[...] = rope_tables(T, cfg.head_dim, dtype)

    @staticmethod
    def floats(cfg: Config, B: int, T: int, scores: bool = True) -> int:
        """The arena's length in elements, for ``cfg`` at ``B`` x ``T``."""
        plan, size = Workspace.__new__(Workspace), _Arena(np.float32)
        plan.B, plan.T = B, T
        plan._carve(cfg, size, scores)
        return size.used

    def _carve(self, cfg, z, scores):
        N, C, H, hd = self.B * self.T, cfg.d_model, cfg.n_head, cfg.head_dim
        B, T, modern = self.B, self.T, cfg.block == "modern"
        shared = {k: z(B, H, T, hd) for k in ("do", "dq", "dk", "dv")}
        shared["dp"] = z(B, H, T, T) if scores else z(0)  # no (T, T) buffers in tiles
        self.rope_cos, self.rope_sin = (z(T, hd // 2), z(T, hd // 2)) if modern else (z(0), z(0))
        rope = (self.rope_cos, self.rope_sin) if modern else None
        self.layers = [
            _Layer(x=z(N, C), ln1=z(N, C), ln1_mean=z(N), ln1_rstd=z(N), qkv=z(N, 3 * C),
                   att=z(N, C), mid=z(N, C), ln2=z(N, C), ln2_mean=z(N), ln2_rstd=z(N),
                   u=z(N, cfg.mlp_in), g=z(N, cfg.mlp_hidden),
                   attn=_Attn(z, B, H, T, hd, shared, scores, rope))
            for _ in range(cfg.n_layer)]
        self.out = z(N, C)            # the last block's output
        self.lnf, self.lnf_mean, self.lnf_rstd = z(N, C), z(N), z(N)
        self.logits, self.losses, self.dlogits = z(N, cfg.vocab), z(N), z(N, cfg.vocab)
        self.tmp = z(N, C)            # projection outputs, before the residual add
        # backward
        self.dx = z(N, C)             # gradient of the residual stream
        self.dln = z(N, C)
        self.dqkv = z(N, 3 * C)
        self.datt = z(N, C)
        self.dh = z(N, cfg.mlp_in)    # the MLP's first product's gradient
        self.dg = z(N, cfg.mlp_hidden) if modern else z(0)  # SwiGLU's output's gradient


class GPT:
    """The model: parameters, gradients, and a forward/backward pair per backend."""

    def __init__(self, config, backend: str = "kernels", *, seed: int = 0, threads=None,
                 dtype=np.float32, arena: bool = True):
        self.config = cfg = get_config(config)
        self.dtype = np.dtype(dtype)
        if backend != "numpy" and self.dtype != np.float32:
            raise ValueError(f"backend {backend!r} is float32 only; use backend='numpy' for "
                             f"float64")
        self.ops = make_ops(backend, threads)
        self.backend = backend
        self.arena = bool(arena)  # False: a new Workspace, buffer by buffer, every forward
        self.shapes = cfg.param_shapes()
        n = cfg.n_params()
        self.flat = np.zeros(n, self.dtype)
        self.grad_flat = np.zeros(n, self.dtype)
        self.params = self._views(self.flat)
        self.grads = self._views(self.grad_flat)
        self._workspaces: dict[tuple[int, int], Workspace] = {}
        self.ws: Workspace | None = None
        self.init_weights(seed)

    def _views(self, flat):
        out, off = {}, 0
        for name, shape in self.shapes.items():
            size = math.prod(shape)
            out[name] = flat[off:off + size].reshape(shape)
            off += size
        return out

    def init_weights(self, seed: int):
        """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2L)."""
        rng = np.random.default_rng(seed)
        resid_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.params.items():
            if name.endswith((".b",)):
                p[...] = 0
            elif name.endswith(("ln1.w", "ln2.w")) or name == "lnf.w":
                p[...] = 1
            else:
                std = resid_std if name.endswith(("proj.w", "fc2.w")) else 0.02
                p[...] = rng.normal(0.0, std, p.shape)

    def load_flat(self, flat):
        self.flat[...] = flat

    def workspace(self, B: int, T: int) -> Workspace:
        key = (B, T)
        scores = getattr(self.ops, "needs_scores", True)
        if not self.arena:  # the step that allocates per call: nothing is kept
            return Workspace(self.config, B, T, self.dtype, scores, arena=False)
        if key not in self._workspaces:
            self._workspaces[key] = Workspace(self.config, B, T, self.dtype, scores)
        return self._workspaces[key]

    # ------------------------------------------------------------ forward
    def forward(self, idx, targets=None) -> float | np.ndarray:
        """Run the model on ``idx`` (B, T). With ``targets`` return the mean loss
        (nats per token), else the logits (B*T, V)."""
        idx = np.asarray(idx)
        if idx.ndim != 2:
            raise ValueError(f"idx: expected (B, T) token ids, got shape {idx.shape}")
        B, T = idx.shape
        if T > self.config.context:
            raise ValueError(f"sequence length {T} is longer than the context "
                             f"{self.config.context} the model {self.config.name!r} was built for")
        if B < 1 or T < 1:
            raise ValueError(f"idx: empty batch, shape {idx.shape}")
        ws = self.ws = self.workspace(B, T)
        ws.idx[...] = idx
        P, ops, modern = self.params, self.ops, self.config.block == "modern"
        ops.embedding(ws.idx, P["wte"], None if modern else P["wpe"], ws.layers[0].x)
        block = self._modern_block_forward if modern else self._block_forward
        for i, L in enumerate(ws.layers):
            nxt = ws.layers[i + 1].x if i + 1 < len(ws.layers) else ws.out
            block(i, L, nxt)
        if modern:
            ops.rmsnorm(ws.out, P["lnf.w"], ws.lnf, ws.lnf_rstd)
        else:
            ops.layernorm(ws.out, P["lnf.w"], P["lnf.b"], ws.lnf, ws.lnf_mean, ws.lnf_rstd)
        ops.head(ws.lnf, P["wte"] if self.config.tied else P["lm_head"], ws.logits)
        if targets is None:
            return ws.logits
        ws.targets[...] = np.asarray(targets).reshape(-1)
        return ops.cross_entropy(ws.logits, ws.targets, ws.losses, ws.dlogits)

    # --8<-- [start:block_forward]
    def _block_forward(self, i, L: _Layer, out):
        P, ops, ws, p = self.params, self.ops, self.ws, f"h{i}."
        ops.layernorm(L.x, P[p + "ln1.w"], P[p + "ln1.b"], L.ln1, L.ln1_mean, L.ln1_rstd)
        ops.linear(L.ln1, P[p + "attn.w"], P[p + "attn.b"], L.qkv)        # N x C x 3C
        ops.attention(L.qkv, L.att, L.attn)                               # B*H x T x T x hd
        ops.linear(L.att, P[p + "proj.w"], None, ws.tmp)                  # N x C x C
        ops.residual_layernorm(L.x, ws.tmp, P[p + "proj.b"], L.mid,       # mid = x + tmp + b
                               P[p + "ln2.w"], P[p + "ln2.b"], L.ln2, L.ln2_mean, L.ln2_rstd)
        ops.linear(L.ln2, P[p + "fc.w"], None, L.u)                       # N x C x 4C
        ops.bias_gelu(L.u, P[p + "fc.b"], L.g)
        ops.linear(L.g, P[p + "fc2.w"], None, ws.tmp)                     # N x 4C x C
        ops.bias_residual(L.mid, ws.tmp, P[p + "fc2.b"], out)
    # --8<-- [end:block_forward]

    # --8<-- [start:modern_block_forward]
    def _modern_block_forward(self, i, L: _Layer, out):
        P, ops, ws, p = self.params, self.ops, self.ws, f"h{i}."
        ops.rmsnorm(L.x, P[p + "ln1.w"], L.ln1, L.ln1_rstd)
        ops.linear(L.ln1, P[p + "attn.w"], None, L.qkv)         # N x C x 3C
        ops.attention(L.qkv, L.att, L.attn)                     # RoPE on q and k inside
        ops.linear(L.att, P[p + "proj.w"], None, ws.tmp)        # N x C x C
        ops.add(L.x, ws.tmp, L.mid)
        ops.rmsnorm(L.mid, P[p + "ln2.w"], L.ln2, L.ln2_rstd)
        ops.linear(L.ln2, P[p + "fc.w"], None, L.u)             # N x C x 2h: [W1 | W3]
        ops.swiglu(L.u, L.g)                                    # silu(x W1) * (x W3)
        ops.linear(L.g, P[p + "fc2.w"], None, ws.tmp)           # N x h x C
        ops.add(L.mid, ws.tmp, out)
    # --8<-- [end:modern_block_forward]

    # ------------------------------------------------------------ backward
    def backward(self):
        """Gradients of the last forward's mean loss, into :attr:`grads` (overwritten)."""
        ws = self.ws
        if ws is None:
            raise RuntimeError("backward() before forward(idx, targets)")
        P, G, ops, modern = self.params, self.grads, self.ops, self.config.block == "modern"
        head = "wte" if self.config.tied else "lm_head"
        # LM head: writes dwte (tied) before the embedding adds its share below.
        ops.head_backward(ws.dlogits, ws.lnf, P[head], ws.dln, G[head])
        ws.dx[...] = 0
        if modern:
            ops.rmsnorm_backward(ws.dln, ws.out, P["lnf.w"], ws.lnf_rstd, ws.dx, G["lnf.w"])
        else:
            ops.layernorm_backward(ws.dln, ws.out, P["lnf.w"], ws.lnf_mean, ws.lnf_rstd, ws.dx,
                                   G["lnf.w"], G["lnf.b"])
        block = self._modern_block_backward if modern else self._block_backward
        for i in reversed(range(self.config.n_layer)):
            block(i, ws.layers[i])
        if not self.config.tied:
            G["wte"][...] = 0
        ops.embedding_backward(ws.idx, ws.dx, G["wte"], None if modern else G["wpe"])
        return self.grads

    # --8<-- [start:block_backward]
    def _block_backward(self, i, L: _Layer):
        """ws.dx holds dLoss/d(block output) on entry and dLoss/d(block input) on exit.

        The residual adds need no code: the gradient flows through them
        unchanged, and each LayerNorm's backward *adds* its branch into ws.dx.
        """
        P, G, ops, ws, p = self.params, self.grads, self.ops, self.ws, f"h{i}."
        # MLP branch: out = mid + fc2(gelu(fc(ln2(mid))))
        ops.linear_backward(ws.dx, L.g, P[p + "fc2.w"], ws.dh, G[p + "fc2.w"], G[p + "fc2.b"])
        ops.gelu_backward_bias(L.u, ws.dh, ws.dh, G[p + "fc.b"])
        ops.linear_backward(ws.dh, L.ln2, P[p + "fc.w"], ws.dln, G[p + "fc.w"], None)
        ops.layernorm_backward(ws.dln, L.mid, P[p + "ln2.w"], L.ln2_mean, L.ln2_rstd, ws.dx,
                               G[p + "ln2.w"], G[p + "ln2.b"])
        # attention branch: mid = x + proj(attention(attn(ln1(x))))
        ops.linear_backward(ws.dx, L.att, P[p + "proj.w"], ws.datt, G[p + "proj.w"],
                            G[p + "proj.b"])
        ops.attention_backward(ws.datt, ws.dqkv, L.attn)
        ops.linear_backward(ws.dqkv, L.ln1, P[p + "attn.w"], ws.dln, G[p + "attn.w"],
                            G[p + "attn.b"])
        ops.layernorm_backward(ws.dln, L.x, P[p + "ln1.w"], L.ln1_mean, L.ln1_rstd, ws.dx,
                               G[p + "ln1.w"], G[p + "ln1.b"])
    # --8<-- [end:block_backward]

    def _modern_block_backward(self, i, L: _Layer):
        P, G, ops, ws, p = self.params, self.grads, self.ops, self.ws, f"h{i}."
        ops.linear_backward(ws.dx, L.g, P[p + "fc2.w"], ws.dg, G[p + "fc2.w"], None)
        ops.swiglu_backward(L.u, ws.dg, ws.dh)
        ops.linear_backward(ws.dh, L.ln2, P[p + "fc.w"], ws.dln, G[p + "fc.w"], None)
        ops.rmsnorm_backward(ws.dln, L.mid, P[p + "ln2.w"], L.ln2_rstd, ws.dx, G[p + "ln2.w"])
        ops.linear_backward(ws.dx, L.att, P[p + "proj.w"], ws.datt, G[p + "proj.w"], None)
        ops.attention_backward(ws.datt, ws.dqkv, L.attn)
        ops.linear_backward(ws.dqkv, L.ln1, P[p + "attn.w"], ws.dln, G[p + "attn.w"], None)
        ops.rmsnorm_backward(ws.dln, L.x, P[p + "ln1.w"], L.ln1_rstd, ws.dx, G[p + "ln1.w"])

    # ------------------------------------------------------------ generation
    def generate(self, prompt: bytes, n: int, *, temperature: float = 0.8, seed: int = 0) -> bytes:
        """Sample ``n`` bytes after ``prompt``. Each new byte reruns the whole window
        (no key/value cache: that is chapter 4's subject)."""
        rng = np.random.default_rng(seed)
        ctx = self.config.context
        start = list(prompt) or [10]  # an empty prompt starts after a newline
        tokens = list(start)
        T = min(ctx, len(tokens) + n)
        idx = np.zeros((1, T), np.int32)
        for _ in range(n):
            window = tokens[-T:]
            idx[0, :len(window)] = window  # later positions are padding the causal mask hides
            logits = self.forward(idx)[len(window) - 1].astype(np.float64)
            z = logits / max(temperature, 1e-6)
            prob = np.exp(z - z.max())
            prob /= prob.sum()
            tokens.append(int(rng.choice(len(prob), p=prob)))
        return bytes(tokens[len(start):])
