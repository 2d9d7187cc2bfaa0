"""Python's entries to ``kernels_c/layers.c``: check the arguments, then make the C call.

Each function here has the name of the C function it calls and takes the arrays in the same
order; it checks them with :mod:`smallem.checks` (a wrong dtype is a ``TypeError``, a wrong
shape or a strided view a ``ValueError``, never a crash), derives the sizes the C side needs
and makes the call. :class:`BatchedGemm` runs chapter 2's ``gemm_f32`` over a stack of
matrices from C (attention's per-head products).

What each layer computes, and which of these calls the kernel path makes for it, is in
:mod:`smallem.training.model`, layer by layer beside the numpy reference; this module keeps only the
checks, which would otherwise bury the calls there (this file mirrors ``layers.c`` as
``smallem/product/gemm.py`` mirrors ``gemm.c``).
"""

from __future__ import annotations

import numpy as np

from smallem import checks


def _lib(threads=None):
    """layers.c's module for ``threads`` (a count or a :class:`smallem.plumbing.pool.Team`): its pool
    variant where the team is on the pool."""
    from smallem.plumbing import pool
    return pool.team(threads).module("layers")


def _fp(ffi, x):
    return ffi.from_buffer("float[]", x)


def _ip(ffi, x):
    return ffi.from_buffer("int[]", x)


def _threads(n):
    """The count of threads a call runs on (``n`` a count, None or a Team)."""
    from smallem.plumbing import pool
    return pool.team(n).n


def _f32(x, name, shape=None, writable=False):
    return checks.array(x, name, np.float32, ndim=None if shape is None else len(shape),
                        shape=shape, writable=writable)


def add_bias(y, b, threads=None):
    """y[n, :] += b, in place."""
    _f32(y, "y", writable=True)
    if y.ndim != 2:
        raise ValueError(f"y: expected 2 dimensions, got shape {y.shape}")
    _f32(b, "b", (y.shape[1],))
    ffi, lib = _lib(threads)
    lib.add_bias(_fp(ffi, y), _fp(ffi, b), y.shape[0], y.shape[1], _threads(threads))
    return y


def col_sum(dy, db, threads=None):
    """db = dy.sum(axis=0), overwriting db."""
    _f32(dy, "dy")
    if dy.ndim != 2:
        raise ValueError(f"dy: expected 2 dimensions, got shape {dy.shape}")
    _f32(db, "db", (dy.shape[1],), writable=True)
    ffi, lib = _lib(threads)
    lib.col_sum(_fp(ffi, dy), _fp(ffi, db), dy.shape[0], dy.shape[1], _threads(threads))
    return db


def residual_add(a, b, out, threads=None):
    """out = a + b (any shape, all three the same)."""
    _f32(a, "a")
    _f32(b, "b", a.shape)
    _f32(out, "out", a.shape, writable=True)
    ffi, lib = _lib(threads)
    lib.residual_add(_fp(ffi, a), _fp(ffi, b), _fp(ffi, out), a.size, _threads(threads))
    return out


def _ids(idx, name):
    checks.array(idx, name, np.int32)
    if idx.ndim != 2:
        raise ValueError(f"{name}: expected (B, T) token ids, got shape {idx.shape}")
    return idx


def embedding_forward(idx, wte, wpe, out, threads=None):
    """out[b*T + t] = wte[idx[b, t]] + wpe[t]; ``wpe=None``: no position table."""
    _ids(idx, "idx")
    B, T = idx.shape
    _f32(wte, "wte")
    if wte.ndim != 2:
        raise ValueError(f"wte: expected (V, C), got shape {wte.shape}")
    V, C = wte.shape
    if wpe is not None:
        _f32(wpe, "wpe", (None, C))
        if T > wpe.shape[0]:
            raise ValueError(f"idx: {T} positions but wpe has only {wpe.shape[0]}")
    _f32(out, "out", (B * T, C), writable=True)
    ffi, lib = _lib(threads)
    pos = ffi.NULL if wpe is None else _fp(ffi, wpe)
    bad = lib.embedding_forward(_ip(ffi, idx), _fp(ffi, wte), pos, _fp(ffi, out),
                                B, T, C, V, _threads(threads))
    if bad:
        raise ValueError(f"idx: {bad} token ids outside [0, {V})")
    return out


def embedding_backward(idx, dout, dwte, dwpe, threads=None):
    """dwte[idx] += dout (adds into dwte); dwpe[t] = sum over the batch (overwrites, all rows;
    ``dwpe=None``: no position table)."""
    _ids(idx, "idx")
    B, T = idx.shape
    _f32(dwte, "dwte", writable=True)
    if dwte.ndim != 2:
        raise ValueError(f"dwte: expected (V, C), got shape {dwte.shape}")
    V, C = dwte.shape
    _f32(dout, "dout", (B * T, C))
    if dwpe is not None:
        _f32(dwpe, "dwpe", (None, C), writable=True)
        if T > dwpe.shape[0]:
            raise ValueError(f"idx: {T} positions but dwpe has only {dwpe.shape[0]}")
    ffi, lib = _lib(threads)
    bad = lib.embedding_backward(_ip(ffi, idx), _fp(ffi, dout), _fp(ffi, dwte),
                                 ffi.NULL if dwpe is None else _fp(ffi, dwpe), B, T, C, V,
                                 _threads(threads))
    if dwpe is not None:
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
    ffi, lib = _lib(threads)
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
    ffi, lib = _lib(threads)
    lib.layernorm_backward(_fp(ffi, dy), _fp(ffi, x), _fp(ffi, w), _fp(ffi, mean), _fp(ffi, rstd),
                           _fp(ffi, dx), _fp(ffi, dw), _fp(ffi, db), N, C, _threads(threads))
    return dx


def gelu_forward(x, out, threads=None):
    _f32(x, "x")
    _f32(out, "out", x.shape, writable=True)
    ffi, lib = _lib(threads)
    lib.gelu_forward(_fp(ffi, x), _fp(ffi, out), x.size, _threads(threads))
    return out


def gelu_backward(x, dy, dx, threads=None):
    """dx = dy * gelu'(x); dx may be dy itself."""
    _f32(x, "x")
    _f32(dy, "dy", x.shape)
    _f32(dx, "dx", x.shape, writable=True)
    ffi, lib = _lib(threads)
    lib.gelu_backward(_fp(ffi, x), _fp(ffi, dy), _fp(ffi, dx), x.size, _threads(threads))
    return dx


def _rows(x, name):
    _f32(x, name)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected 2 dimensions, got shape {x.shape}")
    return x.shape


def bias_gelu_forward(u, b, g, threads=None):
    """u += b, then g = gelu(u), in one pass (u keeps the biased values for the backward)."""
    _f32(u, "u", writable=True)
    N, C = _rows(u, "u")
    _f32(b, "b", (C,))
    _f32(g, "g", (N, C), writable=True)
    ffi, lib = _lib(threads)
    lib.bias_gelu_forward(_fp(ffi, u), _fp(ffi, b), _fp(ffi, g), N, C, _threads(threads))
    return g


def gelu_backward_bias(x, dy, dx, db, threads=None, work=None):
    """dx = dy * gelu'(x) and db = dx.sum(axis=0), in one pass; dx may be dy. ``work``:
    threads x C floats of scratch for the threads' partial sums (made here if not given)."""
    N, C = _rows(x, "x")
    _f32(dy, "dy", (N, C))
    _f32(dx, "dx", (N, C), writable=True)
    _f32(db, "db", (C,), writable=True)
    n = _threads(threads)
    if work is None:
        work = np.empty(n * C, np.float32)
    _f32(work, "work", writable=True)
    if work.ndim != 1 or work.size < n * C:
        raise ValueError(f"work: expected a 1-D float32 array of at least {n * C} floats, "
                         f"got shape {work.shape}")
    ffi, lib = _lib(threads)
    lib.gelu_backward_bias(_fp(ffi, x), _fp(ffi, dy), _fp(ffi, dx), _fp(ffi, db),
                           _fp(ffi, work), N, C, n)
    return dx


def residual_layernorm(x, t, bias, mid, w, b, out, mean, rstd, threads=None):
    """mid = x + (t + bias), then out = LayerNorm(mid) with gain w and shift b (keeping
    mean and rstd), in one pass over the rows."""
    N, C = _rows(x, "x")
    _f32(t, "t", (N, C))
    for a, n in ((bias, "bias"), (w, "w"), (b, "b")):
        _f32(a, n, (C,))
    _f32(mid, "mid", (N, C), writable=True)
    _f32(out, "out", (N, C), writable=True)
    _f32(mean, "mean", (N,), writable=True)
    _f32(rstd, "rstd", (N,), writable=True)
    ffi, lib = _lib(threads)
    lib.residual_layernorm(*(_fp(ffi, a) for a in (x, t, bias, mid, w, b, out, mean, rstd)), N,
                           C, _threads(threads))
    return out


def bias_residual(x, t, bias, out, threads=None):
    """out = x + (t + bias), in one pass."""
    N, C = _rows(x, "x")
    _f32(t, "t", (N, C))
    _f32(bias, "bias", (C,))
    _f32(out, "out", (N, C), writable=True)
    ffi, lib = _lib(threads)
    lib.bias_residual(_fp(ffi, x), _fp(ffi, t), _fp(ffi, bias), _fp(ffi, out), N, C,
                      _threads(threads))
    return out


def to_bf16(x, out, threads=None):
    """out = x rounded to bf16 (nearest, ties to even; uint16 bits), any shape."""
    _f32(x, "x")
    checks.array(out, "out", np.uint16, shape=x.shape, writable=True)
    ffi, lib = _lib(threads)
    lib.to_bf16(_fp(ffi, x), ffi.from_buffer("uint16_t[]", out), x.size, _threads(threads))
    return out


def rmsnorm_forward(x, w, out, rstd, threads=None):
    """out = x / rms(x) * w per row, keeping rstd = 1 / rms(x) for the backward."""
    N, C = _rows(x, "x")
    _f32(w, "w", (C,))
    _f32(out, "out", (N, C), writable=True)
    _f32(rstd, "rstd", (N,), writable=True)
    ffi, lib = _lib(threads)
    lib.rmsnorm_forward(_fp(ffi, x), _fp(ffi, w), _fp(ffi, out), _fp(ffi, rstd), N, C,
                        _threads(threads))
    return out


def rmsnorm_backward(dy, x, w, rstd, dx, dw, threads=None):
    """Adds the input gradient into dx; overwrites dw."""
    N, C = _rows(x, "x")
    _f32(dy, "dy", (N, C))
    _f32(w, "w", (C,))
    _f32(rstd, "rstd", (N,))
    _f32(dx, "dx", (N, C), writable=True)
    _f32(dw, "dw", (C,), writable=True)
    ffi, lib = _lib(threads)
    lib.rmsnorm_backward(_fp(ffi, dy), _fp(ffi, x), _fp(ffi, w), _fp(ffi, rstd), _fp(ffi, dx),
                         _fp(ffi, dw), N, C, _threads(threads))
    return dx


def rope(q, k, cos, sin, inverse=False, threads=None):
    """In place: each head's feature pairs (2i, 2i+1) of q and k (..., T, hd) turned by the
    angles whose cosines and sines ``cos``, ``sin`` (T, hd/2) hold; ``inverse`` turns back
    (the backward)."""
    _f32(q, "q", writable=True)
    if q.ndim < 2 or q.shape[-1] % 2:
        raise ValueError(f"q: expected (..., T, hd) with an even hd, got shape {q.shape}")
    _f32(k, "k", q.shape, writable=True)
    T, hd = q.shape[-2:]
    _f32(cos, "cos", (T, hd // 2))
    _f32(sin, "sin", (T, hd // 2))
    ffi, lib = _lib(threads)
    lib.rope(_fp(ffi, q), _fp(ffi, k), _fp(ffi, cos), _fp(ffi, sin), q.size // (T * hd), T, hd,
             -1.0 if inverse else 1.0, _threads(threads))
    return q, k


def swiglu_forward(u, g, threads=None):
    """g = silu(u[:, :h]) * u[:, h:], u (N, 2h), g (N, h)."""
    N, W = _rows(u, "u")
    if W % 2:
        raise ValueError(f"u: expected (N, 2h), got shape {u.shape}")
    _f32(g, "g", (N, W // 2), writable=True)
    ffi, lib = _lib(threads)
    lib.swiglu_forward(_fp(ffi, u), _fp(ffi, g), N, W // 2, _threads(threads))
    return g


def swiglu_backward(u, dg, du, threads=None):
    """du (N, 2h), the gradient of u, from dg (N, h)."""
    N, W = _rows(u, "u")
    if W % 2:
        raise ValueError(f"u: expected (N, 2h), got shape {u.shape}")
    _f32(dg, "dg", (N, W // 2))
    _f32(du, "du", (N, W), writable=True)
    ffi, lib = _lib(threads)
    lib.swiglu_backward(_fp(ffi, u), _fp(ffi, dg), _fp(ffi, du), N, W // 2, _threads(threads))
    return du


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
    ffi, lib = _lib(threads)
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
    ffi, lib = _lib(threads)
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
    ffi, lib = _lib(threads)
    lib.attn_softmax_forward(_fp(ffi, s), BH, T, float(scale), _threads(threads))
    return s


def attn_softmax_backward(p, dp, scale, threads=None):
    """In place: dp (gradient of P) becomes the gradient of the unscaled scores."""
    BH, T = _scores(p, "p", False)
    _f32(dp, "dp", p.shape, writable=True)
    ffi, lib = _lib(threads)
    lib.attn_softmax_backward(_fp(ffi, p), _fp(ffi, dp), BH, T, float(scale), _threads(threads))
    return dp


def flash_tile(hd: int, caches: dict | None = None) -> int:
    """Keys per tile of the attention in tiles: the tile of K (packed, hd x tile) and of V
    (tile x hd) together as large as the L1, in multiples of 32 (two AVX-512 vectors, the
    register-tiled path's step), from 32 to 256. Each row's running maximum and sum are
    updated once per tile, so a longer tile spreads that scalar work over more products;
    the few rows of q, scores and output the four-row block also touches are small beside
    it."""
    from smallem.cpu import machine_info

    l1 = (caches or machine_info.caches())["L1d_bytes"] or 32 * 1024
    return int(min(256, max(32, l1 // (2 * 4 * hd) // 32 * 32)))


def _flash_shapes(q, k, v, names=("q", "k", "v")):
    _f32(q, names[0])
    if q.ndim != 3:
        raise ValueError(f"{names[0]}: expected (B*H, T, hd), got shape {q.shape}")
    for x, name in zip((k, v), names[1:]):
        _f32(x, name, q.shape)
    return q.shape


def flash_work_floats(T, hd, tile, threads) -> int:
    """The floats of scratch :func:`flash_forward` and :func:`flash_backward` need."""
    ffi, lib = _lib(threads)
    return int(lib.flash_work_floats(T, hd, tile)) * _threads(threads)


def _flash_work(work, T, hd, tile, threads):
    need = flash_work_floats(T, hd, tile, threads)
    if work is None:
        return np.empty(need, np.float32)
    _f32(work, "work", writable=True)
    if work.ndim != 1 or work.size < need:
        raise ValueError(f"work: expected a 1-D float32 array of at least {need} floats, "
                         f"got shape {work.shape}")
    return work


def flash_forward(q, k, v, o, lse, scale, tile=None, threads=None, work=None):
    """Causal attention in tiles: o = softmax(scale q k^T, causal) v, and lse (B*H, T), the
    log-sum-exp of each row's scaled scores, for the backward; no (T, T) matrix is made.
    ``work`` (see :func:`flash_work_floats`) is the scratch, allocated here if not given."""
    BH, T, hd = _flash_shapes(q, k, v)
    _f32(o, "o", (BH, T, hd), writable=True)
    _f32(lse, "lse", (BH, T), writable=True)
    tile = checks.positive_int(flash_tile(hd) if tile is None else tile, "tile", limit=4096)
    n = _threads(threads)  # the count; ``threads`` itself says which runtime (_lib)
    work = _flash_work(work, T, hd, tile, threads)
    ffi, lib = _lib(threads)
    lib.flash_forward(_fp(ffi, q), _fp(ffi, k), _fp(ffi, v), _fp(ffi, o), _fp(ffi, lse), BH, T,
                      hd, float(scale), tile, _fp(ffi, work), n)
    return o


def flash_backward(q, k, v, o, lse, dout, dq, dk, dv, scale, threads=None, work=None):
    """The gradients of :func:`flash_forward`'s o with respect to q, k and v, from dout and
    the forward's o and lse (the probabilities are recomputed, never stored)."""
    BH, T, hd = _flash_shapes(q, k, v)
    for x, name in ((o, "o"), (dout, "dout")):
        _f32(x, name, (BH, T, hd))
    _f32(lse, "lse", (BH, T))
    for x, name in ((dq, "dq"), (dk, "dk"), (dv, "dv")):
        _f32(x, name, (BH, T, hd), writable=True)
    n = _threads(threads)
    tile = flash_tile(hd)
    work = _flash_work(work, T, hd, tile, threads)
    ffi, lib = _lib(threads)
    lib.flash_backward(*(_fp(ffi, x) for x in (q, k, v, o, lse, dout, dq, dk, dv)), BH, T, hd,
                       float(scale), tile, _fp(ffi, work), n)
    return dq, dk, dv


SCAN_RUNGS = ("step", "chunked", "threaded")


def _scan_ladder():
    """Appendix D's ladder: the scan's rungs, each with its kernel, page section, notebook
    cell and test (``SCAN_LADDER["chunked"]``)."""
    from smallem.ladder import Ladder, Rung, Where

    page, nb = "chapters/d-recurrent.md:## The scan, three ways", \
        "notebooks/08_recurrent.py:# ## The scan, three ways, against the definition"
    test = "tests/test_scan.py::test_every_rung_against_the_reference"
    what = {"step": ("scan_step", "the definition, one state update a step"),
            "chunked": ("scan_chunk", "chunks, their products on chapter 2's GEMM"),
            "threaded": ("scan_threaded", "the chunks' pairs on the threads")}
    return Ladder("appendix D's scan", [
        Rung(i, name, what[name][1], run=name,
             where=Where(f"kernels_c/layers/scan.c:{what[name][0]}", page, nb, test))
        for i, name in enumerate(SCAN_RUNGS)])


SCAN_LADDER = _scan_ladder()


def scan_chunk(hd: int, caches: dict | None = None) -> int:
    """Steps per chunk of the chunked scan. Inside a chunk the masked products add about
    2 L hd multiply-adds a step to the state's 2 hd^2, so a chunk longer than hd adds more
    work than the state traffic it saves; and the chunk's blocks of Q, K, V and O (4 L hd
    floats), its L x L masked scores and one state (hd^2) should stay in a core's L2, where
    the GEMM's packing finds them. The longest chunk, in multiples of 8 from 16 to 128, no
    longer than hd, that fits the L2 (16 where none does)."""
    from smallem.cpu import machine_info

    hd = checks.positive_int(hd, "hd")
    l2 = (caches or machine_info.caches()).get("L2_bytes") or 256 * 1024
    fits = [L for L in range(16, 129, 8)
            if L <= max(hd, 16) and 4 * (4 * L * hd + L * L + hd * hd) <= l2]
    return fits[-1] if fits else 16


def _scan_inputs(q, k, v, lam, rung, chunk):
    """(BH, T, hd, L), after checking q, k, v, lam, the rung and the chunk length."""
    if rung not in SCAN_RUNGS:
        raise ValueError(f"rung: expected one of {', '.join(SCAN_RUNGS)}, got {rung!r}")
    BH, T, hd = _flash_shapes(q, k, v)
    if not (BH and T and hd):
        raise ValueError(f"q: expected (B*H, T, hd), none of them zero, got shape {q.shape}")
    _f32(lam, "lam", (BH, T))
    bad = ~(np.isfinite(lam) & (lam <= 0))
    if bad.any():
        at = np.unravel_index(np.argmax(bad), bad.shape)
        raise ValueError(f"lam: expected finite log-decays <= 0 (log sigmoid of the gates); "
                         f"{int(bad.sum())} of {lam.size} are not, the first {lam[at]} at "
                         f"{tuple(int(i) for i in at)}")
    L = checks.positive_int(scan_chunk(hd) if chunk is None else chunk, "chunk", limit=4096)
    return BH, T, hd, L


def _gemm_f32(team):
    """(address of chapter 2's gemm_f32 on ``team``'s runtime, its (order, mc, kc, nc), the
    gemm module's lib), for kernels that take it as a pointer."""
    from smallem.product import gemm

    gffi, glib = team.module("gemm")
    fn = getattr(glib, "gemm_f32", None)
    if fn is None or gffi.typeof(fn).cname != GEMM_F32_TYPE:
        raise RuntimeError("kernels_c/gemm.c has no gemm_f32 with the expected prototype")
    return int(gffi.cast("uintptr_t", gffi.addressof(glib, "gemm_f32"))), gemm.default_config(), glib


def _scan_floats(T, hd, L, team, n):
    """(scan scratch per thread, GEMM packing per thread) for ``n`` threads; 0 packing
    where no GEMM runs (n = 0)."""
    _, lib = team.module("layers")
    own = int(lib.scan_work_floats(T, hd, L))
    if not n:
        return own, 0
    _, (order, mc, kc, nc), glib = _gemm_f32(team)
    sizes = (min(L, T), hd)
    return own, max(int(glib.gemm_work_floats(N, K, mc, kc, nc, 1)) for N in sizes for K in sizes)


def scan_work_floats(T, hd, chunk, threads=None) -> int:
    """The floats of scratch :func:`scan_forward` and :func:`scan_backward` need, any rung:
    per thread, the scan's own and the GEMM's packing buffer."""
    from smallem.plumbing import pool

    team = pool.team(threads)
    T, hd = checks.positive_int(T, "T"), checks.positive_int(hd, "hd")
    own, packing = _scan_floats(T, hd, checks.positive_int(chunk, "chunk", limit=4096), team, 1)
    return (own + packing) * team.n


def _scan_call(rung, T, hd, L, threads, work):
    """(ffi, lib, gemm_f32's address or None, the C function's arguments after its sizes)."""
    from smallem.plumbing import pool

    team = pool.team(threads)
    n = team.n if rung == "threaded" else 1
    own, packing = _scan_floats(T, hd, L, team, 0 if rung == "step" else n)
    need = (own + packing) * n
    if work is None:
        work = np.empty(need, np.float32)
    _f32(work, "work", writable=True)
    if work.ndim != 1 or work.size < need:
        raise ValueError(f"work: expected a 1-D float32 array of at least {need} floats, "
                         f"got shape {work.shape}")
    ffi, lib = _lib(team)
    scratch = _fp(ffi, work)
    if rung == "step":
        return ffi, lib, None, (scratch,)
    addr, config, _ = _gemm_f32(team)
    packs = _fp(ffi, work[own * n:])
    tail = (*config, packs, scratch) if rung == "chunked" else (*config, packs, packing, scratch, n)
    return ffi, lib, ffi.cast("void *", addr), tail


def scan_forward(q, k, v, lam, o, states, chunk=None, rung="threaded", threads=None, work=None):
    """The gated linear recurrence S_t = exp(lam_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t
    (:mod:`smallem.training.scan` is its float64 reference), by ``rung``: "step" (the
    definition), "chunked" (chunks of ``chunk`` steps, their products by chapter 2's GEMM)
    or "threaded" (the chunks on ``threads``). q, k, v, o (B*H, T, hd); lam (B*H, T), each
    <= 0. ``states`` (B*H, ceil(T / chunk) + 1, hd, hd) receives the state at the start of
    every chunk and, last, the final state: what :func:`scan_backward` starts from, and what
    a decoder continues from. ``chunk`` None: :func:`scan_chunk`."""
    BH, T, hd, L = _scan_inputs(q, k, v, lam, rung, chunk)
    _f32(o, "o", (BH, T, hd), writable=True)
    _f32(states, "states", (BH, -(-T // L) + 1, hd, hd), writable=True)
    ffi, lib, gemm, tail = _scan_call(rung, T, hd, L, threads, work)
    arrays = [_fp(ffi, x) for x in (q, k, v, lam, o, states)]
    if rung == "step":
        lib.scan_step_forward(*arrays, BH, T, hd, L, *tail)
    else:
        getattr(lib, f"scan_{rung}_forward")(gemm, *arrays, BH, T, hd, L, *tail)
    return o


def scan_backward(q, k, v, lam, states, dout, dq, dk, dv, dlam, chunk=None, rung="threaded",
                  threads=None, work=None):
    """The gradients of :func:`scan_forward`'s o with respect to q, k, v and lam (dq, dk,
    dv, dlam, overwritten), from dout and the forward's ``states`` (made with the same
    ``chunk``); the states inside a chunk are recomputed, never stored."""
    BH, T, hd, L = _scan_inputs(q, k, v, lam, rung, chunk)
    _f32(states, "states", (BH, -(-T // L) + 1, hd, hd))
    _f32(dout, "dout", (BH, T, hd))
    for x, name in ((dq, "dq"), (dk, "dk"), (dv, "dv")):
        _f32(x, name, (BH, T, hd), writable=True)
    _f32(dlam, "dlam", (BH, T), writable=True)
    ffi, lib, gemm, tail = _scan_call(rung, T, hd, L, threads, work)
    arrays = [_fp(ffi, x) for x in (q, k, v, lam, states, dout, dq, dk, dv, dlam)]
    if rung == "step":
        lib.scan_step_backward(*arrays, BH, T, hd, L, *tail)
    else:
        getattr(lib, f"scan_{rung}_backward")(gemm, *arrays, BH, T, hd, L, *tail)
    return dq, dk, dv, dlam


def cross_entropy(logits, targets, losses, dlogits, threads=None):
    """Per-row losses and the gradient of their mean; returns the mean loss."""
    _f32(logits, "logits")
    if logits.ndim != 2:
        raise ValueError(f"logits: expected (N, V), got shape {logits.shape}")
    N, V = logits.shape
    checks.array(targets, "targets", np.int32, shape=(N,))
    _f32(losses, "losses", (N,), writable=True)
    _f32(dlogits, "dlogits", (N, V), writable=True)
    ffi, lib = _lib(threads)
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
    ffi, lib = _lib(threads)
    lib.adamw(_fp(ffi, p), _fp(ffi, g), _fp(ffi, m), _fp(ffi, v), p.size, lr, beta1, beta2, eps,
              weight_decay, grad_scale, 1.0 - beta1 ** step, 1.0 - beta2 ** step,
              _threads(threads))
    return p


def sum_squares(x, threads=None):
    _f32(x, "x")
    ffi, lib = _lib(threads)
    return float(lib.sum_squares(_fp(ffi, x), x.size, _threads(threads)))


GEMM_F32_TYPE = ("void(*)(int, int, int, int, int, float, float *, int, float *, int, float, "
                 "float *, int, int, int, int, int, int, float *)")


class BatchedGemm:
    """out[i] = op(a[i]) op(b[i]) for every i, chapter 2's ``gemm_f32`` looped over in C.

    Threads take whole products (each runs single-threaded with its own
    packing buffer, allocated here once and grown when a larger one is needed).
    """

    def __init__(self, threads=None):
        from smallem.plumbing import pool

        self.team = pool.team(threads)
        self.addr, self.config, self.glib = _gemm_f32(self.team)  # config: (order, mc, kc, nc)
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
        order, mc, kc, nc = self.config
        per = int(self.glib.gemm_work_floats(N, K, mc, kc, nc, 1))
        n = self.team.n
        if self.work.size < per * n:
            self.work = np.zeros(per * n, np.float32)
        ffi, lib = _lib(self.team)
        lib.batched_gemm(ffi.cast("void *", self.addr), len(a), int(trans_a), int(trans_b), M, N,
                         K, float(alpha), _fp(ffi, a), a[0].size, a.shape[2], _fp(ffi, b),
                         b[0].size, b.shape[2], 0.0, _fp(ffi, out), out[0].size, N, order, mc, kc, nc,
                         _fp(ffi, self.work), per, n)
        return out

