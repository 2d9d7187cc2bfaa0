"""Chapter 3's training step on the GPU: :class:`CudaOps`, the ops object of backend "cuda".

It has the methods, arguments and semantics of the CPU's ops objects
(:mod:`smallem.training.ops`, whose Numpy* classes are the definition), on CuPy arrays, so
that :class:`smallem.training.model.GPT` runs unchanged: ``GPT(cfg, backend="cuda")`` puts its
flat parameters, gradients and workspace arena on the device (it allocates through
:attr:`CudaOps.xp`, which is ``cupy``), and every layer becomes a launch of a kernel of
``kernels_cuda/train.cu``. The products go to cuBLAS (``cupy.matmul``) or to chapter 2's own
kernels (:func:`smallem.plumbing.cuda.matmul`), as ``products=`` says; Muon's Newton-Schulz
products to the tensor cores in bf16 (``ns_products="bf16"``, gemm.cu's ``hgemm_async``).

Nothing in a step comes back to the host: the mean loss, the gradient norm and the clipping
factor are 0-d device arrays (float64), AdamW reads the factor from device memory, and the
only transfers of a step are the batch's two uploads (token ids and targets).
:func:`run_steps` reads all of a run's losses with one transfer at the end.

The attention runs in tiles (no (T, T) buffers: ``needs_scores = False``), with head sizes up
to 64; the recurrent block has no CUDA kernel (:attr:`CudaOps.blocks`). Every method checks
its arrays first (CuPy arrays of float32, C-contiguous, of the expected shapes): a numpy
array, another dtype or a wrong shape raises TypeError or ValueError naming the argument.
"""

from __future__ import annotations

import math

import numpy as np

from smallem.plumbing import cuda

BLOCK = 256       # threads a block of the element-wise kernels and the sums (8 warps)
ROW = 128         # threads a block of the warp-per-row kernels: 4 rows
COL_ROWS = 8      # colsum_partial's block is (32, COL_ROWS): 8 rows at a time
COL_PARTS = 64    # at most this many slices of rows in a column sum's first pass
ATT = 32          # the attention's block: 32 queries, one warp
HEAD_BOUNDS = (16, 32, 64)  # the attention kernels' compiled head sizes (attn_*_h16, ...)

PRODUCTS = {"cublas": "f32 through cuBLAS (cupy.matmul)",
            "ours": "f32 through chapter 2's final SIMT kernel (cuda.matmul)"}
NS_PRODUCTS = {"bf16": "bf16 on the tensor cores through chapter 2's final bf16 kernel "
                       "(cuda.matmul)",
               "f32": "the model's f32 products (see products)"}

i32, i64, f32, f64 = np.int32, np.int64, np.float32, np.float64


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class CudaOps:
    """The ops of :mod:`smallem.training.ops` on the GPU (backend "cuda").

    ``products``: "cublas" (the default: our f32 SIMT kernel of chapter 2 is slower than
    cuBLAS's) or "ours". ``ns_products``: "bf16" (Muon's Newton-Schulz products on the tensor
    cores) or "f32" (through ``products``). ``max_blocks`` bounds the grids of the
    grid-stride kernels (a few blocks per SM is enough to keep a memory-bound loop busy), and
    ``block_threads`` (a power of two from 32 to 256) their blocks: smaller ones serve the
    CPU emulator of the tests, which runs each CUDA thread as a fiber on one core. The choices
    stay in their attributes, so a record can say which ran."""

    name = "cuda"
    needs_scores = False        # the attention in tiles: no P, no dP in the workspace
    blocks = ("gpt2", "modern")  # the recurrent block's scan has no CUDA kernel
    threads = None              # no CPU team (Trainer.settings reads threads.pool)

    def __init__(self, threads=None, pool: bool = False, *, products: str = "cublas",
                 ns_products: str = "bf16", max_blocks: int = 1024, block_threads: int = BLOCK):
        self.xp = cuda.require()  # GPUUnavailable ("no GPU for smallem: ...") without one
        if pool:
            raise ValueError("pool: smallem's CPU thread pool does not apply to backend 'cuda'")
        if products not in PRODUCTS:
            raise ValueError(f"products: expected one of {', '.join(PRODUCTS)}, got {products!r}")
        if ns_products not in NS_PRODUCTS:
            raise ValueError(f"ns_products: expected one of {', '.join(NS_PRODUCTS)}, "
                             f"got {ns_products!r}")
        if isinstance(max_blocks, bool) or not isinstance(max_blocks, int) or max_blocks < 1:
            raise ValueError(f"max_blocks: expected a positive int, got {max_blocks!r}")
        if block_threads not in (32, 64, 128, 256):
            raise ValueError(f"block_threads: expected 32, 64, 128 or 256, got {block_threads!r}")
        self.products, self.ns_products, self.max_blocks = products, ns_products, max_blocks
        self.block_threads = block_threads
        self._kernels: dict = {}
        self._scratch: dict = {}

    def describe(self) -> dict:
        """What runs the products, in words and by kernel (for records and the book)."""
        kernel = {"cublas": "cuBLAS", "ours": cuda.RUNGS[cuda.FINAL_F32].func,
                  "bf16": cuda.RUNGS[cuda.FINAL_BF16].func}
        ns = "bf16" if self.ns_products == "bf16" else self.products
        return {"products": PRODUCTS[self.products], "products_kernel": kernel[self.products],
                "ns_products": NS_PRODUCTS[self.ns_products], "ns_products_kernel": kernel[ns]}

    # ------------------------------------------------------------ plumbing
    def _launch(self, func, grid, block, *args, source="train"):
        k = self._kernels.get((source, func))
        if k is None:  # looked up once: cuda.kernel reads and hashes the source
            k = self._kernels[(source, func)] = cuda.kernel(source, func)
        k(grid, block, args)

    def _ew(self, n: int) -> tuple:
        """An element-wise kernel's grid, block for n elements."""
        bt = self.block_threads
        return (max(1, min(_cdiv(n, bt), self.max_blocks)),), (bt,)

    def _rows(self, rows: int) -> tuple:
        """A warp-per-row kernel's grid, block."""
        bt = min(ROW, self.block_threads)
        return (max(1, min(_cdiv(rows, bt // 32), self.max_blocks)),), (bt,)

    def _buf(self, name: str, size: int, dtype=np.float32):
        """Scratch ``name`` of ``size`` elements on the device, grown only when a larger one
        is needed: after the first step, a step allocates only its small results (the loss,
        the norm and the clipping factor, which must outlive it)."""
        buf = self._scratch.get(name)
        if buf is None or buf.size < size:
            buf = self._scratch[name] = self.xp.empty(max(size, 1), dtype)
        return buf[:size]

    def _check(self, x, name: str, dtype, shape=None):
        """x must be a C-contiguous CuPy array of ``dtype`` (and ``shape``: None for any
        length along that axis)."""
        if not isinstance(x, self.xp.ndarray):
            if isinstance(x, np.ndarray):
                raise TypeError(f"{name}: expected a cupy.ndarray on the GPU, got a numpy.ndarray "
                                f"(move it with cupy.asarray({name}))")
            raise TypeError(f"{name}: expected a cupy.ndarray, got {type(x).__name__}")
        if x.dtype != dtype:
            raise TypeError(f"{name}: expected dtype {np.dtype(dtype)}, got {x.dtype}")
        if shape is not None and (x.ndim != len(shape) or any(
                s is not None and s != d for s, d in zip(shape, x.shape))):
            want = "(" + ", ".join("any" if s is None else str(s) for s in shape) + \
                ("," if len(shape) == 1 else "") + ")"
            raise ValueError(f"{name}: expected shape {want}, got {tuple(x.shape)}")
        if not x.flags.c_contiguous:
            raise ValueError(f"{name}: expected a C-contiguous array (make one with "
                             f"cupy.ascontiguousarray)")
        return x

    def _f32(self, x, name, shape=None):
        return self._check(x, name, np.float32, shape)

    def _rows_of(self, x, name, C=None):
        """(N, C) of a 2-D float32 array."""
        return self._f32(x, name, (None, C)).shape

    # ------------------------------------------------------------ embedding
    def embedding(self, idx, wte, wpe, out):
        B, T = self._check(idx, "idx", np.int32, (None, None)).shape
        V, C = self._rows_of(wte, "wte")
        if wpe is not None:
            self._f32(wpe, "wpe", (None, C))
            if T > wpe.shape[0]:
                raise ValueError(f"idx: {T} positions but wpe has only {wpe.shape[0]}")
        self._f32(out, "out", (B * T, C))
        self._launch("embedding_fwd", *self._ew(B * T * C), idx, wte, wpe, out,
                     i32(B * T), i32(T), i32(V), i32(C))

    def embedding_backward(self, idx, dout, dwte, dwpe):
        """Adds into dwte; overwrites dwpe (every row). Deterministic: no atomics."""
        B, T = self._check(idx, "idx", np.int32, (None, None)).shape
        V, C = self._rows_of(dwte, "dwte")
        if V > 65535:
            raise ValueError(f"dwte: {V} rows; the kernel takes at most 65535 (a grid's y)")
        self._f32(dout, "dout", (B * T, C))
        if dwpe is not None:
            P = self._rows_of(dwpe, "dwpe", C)[0]
            if T > P:
                raise ValueError(f"idx: {T} positions but dwpe has only {P}")
            self._launch("embedding_bwd_wpe", *self._ew(P * C), dout, dwpe, i32(B), i32(T),
                         i32(P), i32(C))
        block = min(128, self.block_threads, 32 * _cdiv(C, 32))
        self._launch("embedding_bwd_wte", (_cdiv(C, block), V), (block,), idx, dout, dwte,
                     i32(B * T), i32(C))

    # ------------------------------------------------------------ LayerNorm, RMSNorm
    def _norm(self, x, t, bias, mid, w, b, out, mean, rstd):
        N, C = self._rows_of(x, "x")
        for a, name, shape in ((t, "t", (N, C)), (bias, "bias", (C,)), (mid, "mid", (N, C)),
                               (w, "w", (C,)), (b, "b", (C,)), (out, "out", (N, C)),
                               (mean, "mean", (N,)), (rstd, "rstd", (N,))):
            if a is not None:
                self._f32(a, name, shape)
        self._launch("norm_fwd", *self._rows(N), x, t, bias, mid, w, b, out, mean, rstd,
                     i32(N), i32(C))

    def layernorm(self, x, w, b, out, mean, rstd):
        self._norm(x, None, None, None, w, b, out, mean, rstd)

    def residual_layernorm(self, x, t, bias, mid, w, b, out, mean, rstd):
        """mid = x + (t + bias), then out = LayerNorm(mid): one kernel."""
        self._norm(x, t, bias, mid, w, b, out, mean, rstd)

    def rmsnorm(self, x, w, out, rstd):
        self._norm(x, None, None, None, w, None, out, None, rstd)

    def _norm_backward(self, dy, x, w, mean, rstd, dx, dw, db):
        N, C = self._rows_of(x, "x")
        for a, name, shape in ((dy, "dy", (N, C)), (w, "w", (C,)), (mean, "mean", (N,)),
                               (rstd, "rstd", (N,)), (dx, "dx", (N, C)), (dw, "dw", (C,)),
                               (db, "db", (C,))):
            if a is not None:
                self._f32(a, name, shape)
        self._launch("norm_bwd", *self._rows(N), dy, x, w, mean, rstd, dx, i32(N), i32(C))
        self._colsums(dy, x, mean, rstd, dw, db)

    def layernorm_backward(self, dy, x, w, mean, rstd, dx, dw, db):
        """Adds the input gradient into dx; overwrites dw and db."""
        self._norm_backward(dy, x, w, mean, rstd, dx, dw, db)

    def rmsnorm_backward(self, dy, x, w, rstd, dx, dw):
        """Adds the input gradient into dx; overwrites dw."""
        self._norm_backward(dy, x, w, None, rstd, dx, dw, None)

    def _colsums(self, dy, x, mean, rstd, dw, db):
        """dw = column sums of dy * xh (if dw is given), db = column sums of dy (if db is):
        train.cu's two deterministic passes."""
        N, C = dy.shape
        rows = max(4 * COL_ROWS, _cdiv(N, COL_PARTS))
        parts = _cdiv(N, rows)
        buf = self._buf("colsum", 2 * parts * C)
        pw = buf[:parts * C] if dw is not None else None
        pb = buf[parts * C:] if db is not None else None
        block = (32, min(COL_ROWS, self.block_threads // 32))
        self._launch("colsum_partial", (_cdiv(C, 32), parts), block, dy,
                     x if dw is not None else None, mean, rstd if dw is not None else None, pw, pb,
                     i32(N), i32(C), i32(rows))
        self._launch("colsum_finish", *self._ew(C), pw, pb, dw, db, i32(parts), i32(C))

    # ------------------------------------------------------------ linear, head, products
    def matmul(self, a, b, *, trans_a=False, trans_b=False, out=None, alpha=1.0, beta=0.0):
        """out = alpha op(a) op(b) + beta out, as KernelOps.matmul; the product by
        ``products`` (cuBLAS or ours), alpha and beta by one more pass (axpby)."""
        return self._matmul(a, b, trans_a, trans_b, out, alpha, beta, self.products)

    def ns_matmul(self, a, b, *, trans_b=False, out=None, alpha=1.0, beta=0.0):
        """Newton-Schulz's products (smallem.training.train.newton_schulz uses this where
        the ops object has it): bf16 on the tensor cores (ns_products="bf16"), else matmul."""
        if self.ns_products == "f32":
            return self.matmul(a, b, trans_b=trans_b, out=out, alpha=alpha, beta=beta)
        return self._matmul(a, b, False, trans_b, out, alpha, beta, "bf16")

    def _matmul(self, a, b, trans_a, trans_b, out, alpha, beta, kind):
        self._rows_of(a, "a")
        self._rows_of(b, "b")
        M, K = a.shape[::-1] if trans_a else a.shape
        K2, N = b.shape[::-1] if trans_b else b.shape
        if K != K2:
            raise ValueError(f"a and b do not chain: op(a) is {M} x {K}, op(b) is {K2} x {N}")
        if out is None:
            if beta:
                raise ValueError("beta != 0 needs out")
            out = self.xp.empty((M, N), np.float32)
        self._f32(out, "out", (M, N))
        direct = alpha == 1.0 and beta == 0.0
        dst = out if direct else self._buf("product", M * N).reshape(M, N)
        if kind == "cublas":
            self.xp.matmul(a.T if trans_a else a, b.T if trans_b else b, out=dst)
        elif kind == "ours":
            cuda.matmul(a, b, trans_a=trans_a, trans_b=trans_b, out=dst)
        else:  # "bf16": both operands rounded to bf16, our tensor-core kernel, f32 sums
            cuda.matmul(self._bf16(a, "bf16_a"), self._bf16(b, "bf16_b"), trans_a=trans_a,
                        trans_b=trans_b, out=dst)
        if not direct:
            self._launch("axpby", *self._ew(M * N), dst, out, i64(M * N), f32(alpha),
                         f32(beta))
        return out

    def _bf16(self, x, slot):
        """x's bf16 bits (round to nearest even) in scratch ``slot``: gemm.cu's f32_to_bf16."""
        y = self._buf(slot, x.size, np.uint16).reshape(x.shape)
        self._launch("f32_to_bf16", (max(1, min(_cdiv(x.size, 256), 65535)),), (256,), x, y,
                     i64(x.size), source="gemm")
        return y

    def linear(self, x, w, b, out):
        self.matmul(x, w, out=out)
        if b is not None:
            self.bias(out, b)

    def linear_backward(self, dy, x, w, dx, dw, db, accumulate=False):
        self.matmul(dy, w, trans_b=True, out=dx, beta=1.0 if accumulate else 0.0)
        self.matmul(x, dy, trans_a=True, out=dw)
        if db is not None:
            self.bias_backward(dy, db)

    def bias(self, y, b):
        N, C = self._rows_of(y, "y")
        self._f32(b, "b", (C,))
        self._launch("add_rows", *self._ew(N * C), y, None, b, y, i64(N * C), i32(C))

    def bias_backward(self, dy, db):
        C = self._rows_of(dy, "dy")[1]
        self._colsums(dy, None, None, None, None, self._f32(db, "db", (C,)))

    def head(self, x, w, out):
        self.matmul(x, w, trans_b=True, out=out)

    def head_backward(self, dlogits, x, w, dx, dw):
        self.matmul(dlogits, w, out=dx)
        self.matmul(dlogits, x, trans_a=True, out=dw)

    # ------------------------------------------------------------ attention in tiles
    def _attn_shapes(self, a):
        B, H, T, hd = self._f32(a.q, "a.q", (None,) * 4).shape
        for name in ("k", "v", "o", "do", "dq", "dk", "dv"):
            self._f32(getattr(a, name), f"a.{name}", (B, H, T, hd))
        self._f32(a.lse, "a.lse", (B, H, T))
        if B * H > 65535:
            raise ValueError(f"a.q: {B * H} sequences x heads; the kernels take at most 65535")
        bound = next((h for h in HEAD_BOUNDS if hd <= h), None)
        if bound is None:
            raise ValueError(f"a.q: head size {hd}; the attention kernels take head sizes up to "
                             f"{HEAD_BOUNDS[-1]} (d_model / n_head)")
        cos = sin = None
        if a.rope is not None:
            cos, sin = (self._f32(t, f"a.rope[{i}]", (T, hd // 2)) for i, t in enumerate(a.rope))
        return B, H, T, hd, bound, cos, sin

    def attention(self, qkv, out, a):
        """qkv (B*T, 3C) -> out (B*T, C), causal, in tiles; keeps q, k, v (RoPE'd for the
        modern block), o and each row's log-sum-exp in ``a``."""
        B, H, T, hd, bound, cos, sin = self._attn_shapes(a)
        self._f32(qkv, "qkv", (B * T, 3 * H * hd))
        self._f32(out, "out", (B * T, H * hd))
        self._launch("qkv_split", *self._ew(qkv.size), qkv, a.q, a.k, a.v, cos, sin, i32(B),
                     i32(T), i32(H), i32(hd))
        self._launch(f"attn_fwd_h{bound}", (_cdiv(T, ATT), B * H), (ATT,), a.q, a.k, a.v, a.o,
                     out, a.lse, i32(H), i32(T), i32(hd), f32(1.0 / math.sqrt(hd)))

    def attention_backward(self, dout, dqkv, a):
        B, H, T, hd, bound, cos, sin = self._attn_shapes(a)
        self._f32(dout, "dout", (B * T, H * hd))
        self._f32(dqkv, "dqkv", (B * T, 3 * H * hd))
        D = self._buf("attn_D", B * H * T)
        scale, grid = f32(1.0 / math.sqrt(hd)), (_cdiv(T, ATT), B * H)
        self._launch("attn_bwd_prep", *self._rows(B * H * T), dout, a.o, a.do, D, i32(B),
                     i32(H), i32(T), i32(hd))
        self._launch(f"attn_bwd_dkdv_h{bound}", grid, (ATT,), a.q, a.k, a.v, a.do, a.lse, D, a.dk,
                     a.dv, i32(T), i32(hd), scale)
        self._launch(f"attn_bwd_dq_h{bound}", grid, (ATT,), a.q, a.k, a.v, a.do, a.lse, D, a.dq,
                     i32(T), i32(hd), scale)
        self._launch("qkv_merge", *self._ew(dqkv.size), a.dq, a.dk, a.dv, dqkv, cos, sin,
                     i32(B), i32(T), i32(H), i32(hd))

    def rope(self, q, k, cos, sin, inverse=False):
        """In place: q and k (..., T, hd) turned pair by pair (back, if ``inverse``)."""
        self._f32(q, "q")
        if q.ndim < 2 or q.shape[-1] % 2:
            raise ValueError(f"q: expected (..., T, hd) with an even hd, got shape {q.shape}")
        self._f32(k, "k", q.shape)
        T, hd = q.shape[-2:]
        self._f32(cos, "cos", (T, hd // 2))
        self._f32(sin, "sin", (T, hd // 2))
        BH = q.size // (T * hd)
        self._launch("rope", *self._ew(2 * BH * T * (hd // 2)), q, k, cos, sin, i32(BH),
                     i32(T), i32(hd), i32(bool(inverse)))

    def recurrence(self, *args):
        raise NotImplementedError("the recurrent block has no CUDA kernel: train it on a CPU "
                                  "backend")

    recurrence_backward = recurrence

    # ------------------------------------------------------------ element-wise layers
    def _same(self, arrays):
        N, C = self._rows_of(arrays[0][0], arrays[0][1])
        for x, name in arrays[1:]:
            self._f32(x, name, (N, C))
        return N, C

    def add(self, a, b, out):
        """out = a + b, any shape (the residual adds; Trainer sums micro-batches' gradients)."""
        self._f32(a, "a")
        self._f32(b, "b", a.shape)
        self._f32(out, "out", a.shape)
        self._launch("add_rows", *self._ew(a.size), a, b, None, out, i64(a.size), i32(1))

    def bias_residual(self, x, t, bias, out):
        """out = x + (t + bias): one kernel."""
        N, C = self._same([(x, "x"), (t, "t"), (out, "out")])
        self._f32(bias, "bias", (C,))
        self._launch("add_rows", *self._ew(N * C), x, t, bias, out, i64(N * C), i32(C))

    def bias_gelu(self, u, b, g):
        """u += b, then g = gelu(u): one kernel."""
        N, C = self._same([(u, "u"), (g, "g")])
        if b is not None:
            self._f32(b, "b", (C,))
        self._launch("bias_gelu_fwd", *self._ew(N * C), u, b, g, i64(N * C), i32(C))

    def gelu(self, x, out):
        self.bias_gelu(x, None, out)

    def gelu_backward(self, x, dy, dx):
        N, C = self._same([(x, "x"), (dy, "dy"), (dx, "dx")])
        self._launch("gelu_bwd", *self._ew(N * C), x, dy, dx, i64(N * C))

    def gelu_backward_bias(self, u, dy, dx, db):
        """dx = dy * gelu'(u) (dx may be dy), then db = the column sums of dx."""
        self.gelu_backward(u, dy, dx)
        self.bias_backward(dx, db)

    def swiglu(self, u, g):
        N, h = self._rows_of(g, "g")
        self._f32(u, "u", (N, 2 * h))
        self._launch("swiglu_fwd", *self._ew(N * h), u, g, i32(N), i32(h))

    def swiglu_backward(self, u, dg, du):
        N, h = self._rows_of(dg, "dg")
        self._f32(u, "u", (N, 2 * h))
        self._f32(du, "du", (N, 2 * h))
        self._launch("swiglu_bwd", *self._ew(N * h), u, dg, du, i32(N), i32(h))

    # ------------------------------------------------------------ loss, norm, AdamW
    def cross_entropy(self, logits, targets, losses, dlogits):
        """Per-row losses and the gradient of their mean; returns the mean loss as a new 0-d
        float64 device array (read it with float() when it is wanted, not before)."""
        N, V = self._rows_of(logits, "logits")
        self._check(targets, "targets", np.int32, (N,))
        self._f32(losses, "losses", (N,))
        self._f32(dlogits, "dlogits", (N, V))
        self._launch("cross_entropy", *self._rows(N), logits, targets, losses, dlogits,
                     i32(N), i32(V), f32(1.0 / N))
        return self._sum(losses, False, 1.0 / N, self.xp.empty((), np.float64))

    def _sum(self, x, square: bool, scale: float, out):
        """out[0] = scale * the sum of x (of x^2): two passes, in float64, in a fixed order."""
        part, grid, block = self._sum_parts(x, square)
        self._launch("sum_finish", (1,), block, part, i32(grid[0]), f64(scale), out)
        return out

    def _sum_parts(self, x, square: bool):
        """sum_partial over x: its partial sums (a scratch), its grid and block."""
        grid, block = self._ew(x.size)
        part = self._buf("sum_parts", grid[0], np.float64)
        self._launch("sum_partial", grid, block, x, i64(x.size), i32(square), part)
        return part, grid, block

    def sum_squares(self, x):
        """The sum of squares of x as a 0-d float64 device array."""
        return self._sum(self._f32(x, "x"), True, 1.0, self.xp.empty((), np.float64))

    def clip_scale(self, g, clip: float):
        """The gradient's global norm and the factor that clips it to ``clip`` (1 where clip
        is 0), both 0-d float64 device arrays: nothing goes to the host."""
        self._f32(g, "g")
        out = self.xp.empty(2, np.float64)
        part, grid, block = self._sum_parts(g, True)
        self._launch("norm_finish", (1,), block, part, i32(grid[0]), f64(clip or 0.0), out)
        return out[0:1].reshape(()), out[1:2].reshape(())

    def scale_to_unit_norm(self, g, out, eps: float):
        """out = g / (|g| + eps), |g| computed and used on the device (Newton-Schulz's start)."""
        self._f32(g, "g")
        self._f32(out, "out", g.shape)
        ss = self._sum(g, True, 1.0, self._buf("unit_norm", 1, np.float64))
        self._launch("scale_inv_norm", *self._ew(g.size), g, out, i64(g.size), ss, f64(eps))

    def adamw(self, p, g, m, v, *, lr, beta1, beta2, eps, weight_decay, grad_scale, step):
        """One AdamW update in place; ``grad_scale`` a number or a 0-d float64 device array
        (the clipping factor :meth:`clip_scale` left on the device)."""
        self._f32(p, "p")
        for x, name in ((g, "g"), (m, "m"), (v, "v")):
            self._f32(x, name, p.shape)
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
            raise ValueError(f"step: expected a positive int, got {step!r}")
        if isinstance(grad_scale, self.xp.ndarray):
            self._check(grad_scale, "grad_scale", np.float64, ())
            ptr, mul = grad_scale, 1.0
        else:
            ptr, mul = None, float(grad_scale)
        self._launch("adamw", *self._ew(p.size), p, g, m, v, i64(p.size), f32(lr),
                     f32(beta1), f32(beta2), f32(eps), f32(weight_decay), ptr, f32(mul),
                     f32(1.0 - beta1 ** step), f32(1.0 - beta2 ** step))


def run_steps(trainer, n: int) -> list[float]:
    """Run ``n`` training steps of ``trainer`` and return their losses. On the GPU each
    step's loss stays on the device until the end, where all ``n`` are read with one
    transfer (a read after every step would wait for that step's kernels each time)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n: expected a whole number of steps, got {n!r}")
    losses = [trainer.train_step()["loss"] for _ in range(n)]
    xp = getattr(trainer.model, "xp", np)
    if xp is np or not losses:
        return [float(x) for x in losses]
    cuda.TRANSFERS["to_host"] += 1
    return [float(x) for x in xp.asnumpy(xp.stack(losses))]
