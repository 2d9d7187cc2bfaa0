"""A GGUF model's forward in C (``kernels_c/gguf.c``), reading each weight matrix in the
file's own blocks straight from the file's mapping.

:class:`Forward` is :class:`smallem.gguf_model.Reference`'s forward in one C call per
token (or per block of prompt rows), with a key/value cache in f16 as llama.cpp keeps it.
Each product first rounds its activation row to the type llama.cpp pairs with the weights'
type (Q8_0 for Q8_0, Q4_0 and Q5_0; Q8_K for Q4_K and Q6_K; F16 and BF16 for themselves),
which is what makes the tokens comparable with llama.cpp's; :func:`quantize` and
:func:`matmul` expose one product for the tests. Nothing here copies a weight: the C side
gets the address of each tensor in the mapping and its bytes per row.
"""

from __future__ import annotations

import numpy as np

from . import build, checks, pool as _pool
from .gguf_file import TYPES, ModelFile, Tensor, rope_angles

ROWS = 64          # prompt rows per C call: each block of 4 weight rows meets all of them in L1
DEFAULT_CONTEXT = 4096  # the cache's positions unless the caller asks for more (or fewer)


def type_id(name: str) -> int:
    import gguf

    return int(gguf.GGMLQuantizationType[name])


def _lib(team, level=None):
    return team.module("gguf", level)


def _fill(ffi, dst, t: Tensor):
    data = np.asarray(t.data)
    if not data.flags.c_contiguous:
        raise ValueError(f"tensor {t.name!r}: its bytes are not contiguous")
    K, N = t.ne[0], (t.ne[1] if len(t.ne) > 1 else 1)
    dst.type, dst.K, dst.N = type_id(t.type), K, N
    dst.w = ffi.cast("const uint8_t *", data.ctypes.data)
    dst.row_bytes = t.nbytes // N


def instruction(level=None) -> str:
    ffi, lib = build.load("gguf", level)
    return ffi.string(lib.sm_g_instruction()).decode()


def quantize(type_name: str, x, level=None) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, values) of one activation row rounded as a product with ``type_name``
    weights rounds it: its bytes, and the float64 values they stand for."""
    if type_name not in TYPES:
        raise ValueError(f"type: expected one of {', '.join(TYPES)}, got {type_name!r}")
    ffi, lib = build.load("gguf", level)
    x = np.ascontiguousarray(x, np.float32)
    K, tid = x.size, type_id(type_name)
    per = TYPES[type_name][0]
    if K % max(per, 256 if type_name in ("Q4_K", "Q6_K") else per):
        raise ValueError(f"{type_name}: a row of {K} does not fill its activation's blocks")
    out = np.zeros(int(lib.sm_g_act_bytes(tid, K)), np.uint8)
    lib.sm_g_quantize(tid, ffi.cast("float *", x.ctypes.data), K, ffi.cast("void *", out.ctypes.data))
    vals = np.zeros(K, np.float64)
    lib.sm_g_act_values(tid, ffi.cast("void *", out.ctypes.data), K,
                        ffi.cast("double *", vals.ctypes.data))
    return out, vals


def matmul(t: Tensor, x, threads=1, level=None) -> np.ndarray:
    """x (rows, K) by the file's matrix ``t`` (N rows of K): (rows, N) in float32."""
    team = _pool.team(threads)
    ffi, lib = _lib(team, level)
    x = np.ascontiguousarray(np.atleast_2d(x), np.float32)
    if x.shape[1] != t.ne[0]:
        raise ValueError(f"x: rows of {x.shape[1]}, the matrix takes {t.ne[0]}")
    m = ffi.new("sm_gmat *")
    _fill(ffi, m, t)
    y = np.zeros((x.shape[0], m.N), np.float32)
    lib.sm_g_matmul(m, ffi.cast("float *", x.ctypes.data), x.shape[0],
                    ffi.cast("float *", y.ctypes.data), team.n)
    return y


def row(t: Tensor, i: int, level=None) -> np.ndarray:
    """Row ``i`` of the matrix as float32, decoded by the C side."""
    ffi, lib = build.load("gguf", level)
    m = ffi.new("sm_gmat *")
    _fill(ffi, m, t)
    out = np.zeros(t.ne[0], np.float32)
    lib.sm_g_row(m, int(i), ffi.cast("float *", out.ctypes.data))
    return out


def default_prompt_dtype(level=None) -> str:
    """The prompt GEMM's inputs: "bf16" where chapter 2 chose a bf16 path that beats its f32
    GEMM on this machine (vdpbf16ps where its probe outruns the FMA, or AMX tiles), else
    "f32" (a widened bf16 product is an f32 product with coarser inputs)."""
    from . import gemm

    return "bf16" if gemm.bf16_path(level) != "widen" else "f32"


_ERRORS = {-1: "no tokens", -2: "past the context", -3: "workspace too small",
           -4: "a token id outside the vocabulary"}


class Forward:
    """The file's model in C: ``forward(tokens)`` continues the cache and returns the last
    row's logits (every row's with ``all_logits``). ``threads`` for every product and the
    attention (None: every core), on chapter 3's pool where ``pool``; ``context`` the
    cache's positions (default: the file's, at most :data:`DEFAULT_CONTEXT`);
    ``par_min_bytes`` the size below which a matrix stays on one core (None: measured);
    ``gemm_min_rows`` the prompt length from which the prompt goes through the GEMM, and
    ``prompt_dtype`` that GEMM's inputs ("f32" or "bf16"; None: :func:`default_prompt_dtype`)."""

    SYNC_SHARE = 32  # as chapter 4's decoder: see smallem.decode.Decoder

    def __init__(self, mf: ModelFile, threads=None, pool: bool = True, context=None,
                 par_min_bytes=None, level=None, gemm_min_rows=None, prompt_dtype=None):
        h = self.h = mf.hyper
        self.mf, a = mf, h.arch
        self.team = _pool.team(threads, pool)
        self.threads = self.team.n
        self.ffi, self.lib = ffi, lib = _lib(self.team, level)
        self.context = (min(h.context, DEFAULT_CONTEXT) if context is None
                        else checks.positive_int(context, "context", limit=h.context))
        T = mf.tensors
        self._keep = []

        def vec(name):
            if name not in T:
                return ffi.NULL
            v = np.ascontiguousarray(T[name].dequantize(), np.float32)
            self._keep.append(v)
            return ffi.cast("float *", v.ctypes.data)

        m = self._m = ffi.new("sm_gmodel *")
        layers = self._layers = ffi.new("sm_glayer[]", h.n_layer)
        for i in range(h.n_layer):
            b, L = f"blk.{i}.", layers[i]
            L.attn_norm, L.ffn_norm = vec(b + "attn_norm.weight"), vec(b + "ffn_norm.weight")
            L.q_norm, L.k_norm = vec(b + "attn_q_norm.weight"), vec(b + "attn_k_norm.weight")
            L.bq, L.bk, L.bv = vec(b + "attn_q.bias"), vec(b + "attn_k.bias"), vec(b + "attn_v.bias")
            for field, name in (("q", "attn_q"), ("k", "attn_k"), ("v", "attn_v"),
                                ("o", "attn_output"), ("gate", "ffn_gate"), ("up", "ffn_up"),
                                ("down", "ffn_down")):
                _fill(ffi, getattr(L, field), T[b + name + ".weight"])
        m.n_layer, m.d, m.n_head, m.n_kv_head = h.n_layer, h.d, h.n_head, h.n_kv_head
        m.head_dim, m.v_dim, m.hidden, m.vocab = h.head_dim, h.v_dim, h.hidden, h.vocab
        m.context, m.rope_dim, m.neox, m.eps = self.context, h.rope_dim, int(a.rope == "neox"), h.eps
        m.q_prescaled = int(a.q_prescaled)
        _fill(ffi, m.embd, T["token_embd.weight"])
        _fill(ffi, m.out, T["token_embd.weight" if h.tied else "output.weight"])
        m.out_norm = vec("output_norm.weight")
        freqs = T["rope_freqs.weight"].dequantize() if "rope_freqs.weight" in T else None
        ang = rope_angles(h, np.arange(self.context), freqs)
        self._cos = np.ascontiguousarray(np.cos(ang), np.float32)
        self._sin = np.ascontiguousarray(np.sin(ang), np.float32)
        m.rope_cos = ffi.cast("float *", self._cos.ctypes.data)
        m.rope_sin = ffi.cast("float *", self._sin.ctypes.data)
        m.layers = layers
        self.k = np.zeros((h.n_layer, self.context, h.n_kv_head, h.head_dim), np.float16)
        self.v = np.zeros((h.n_layer, self.context, h.n_kv_head, h.v_dim), np.float16)
        m.k_cache = ffi.cast("uint16_t *", self.k.ctypes.data)
        m.v_cache = ffi.cast("uint16_t *", self.v.ctypes.data)
        self.work = np.zeros(int(lib.sm_g_work_floats(m, ROWS)), np.float32)
        m.work, m.work_floats = ffi.cast("float *", self.work.ctypes.data), self.work.size
        m.par_min_bytes = 0
        self.par_min_bytes = (int(par_min_bytes) if par_min_bytes is not None
                              else self._par_min_bytes())
        m.par_min_bytes = self.par_min_bytes
        self.pos = 0
        self.gemm_min_rows = ROWS if gemm_min_rows is None else int(gemm_min_rows)
        self._panel = None
        self.prompt_dtype = prompt_dtype or default_prompt_dtype(level)
        if self.prompt_dtype not in ("f32", "bf16"):
            raise ValueError(f"prompt_dtype: expected 'f32' or 'bf16', got {prompt_dtype!r}")
        self._bf16_path = None
        if self.prompt_dtype == "bf16":
            from . import gemm

            self._bf16_path = gemm.bf16_path(level)

    def _par_min_bytes(self) -> int:
        """As chapter 4's decoder: the bytes one core streams in SYNC_SHARE fork-joins of
        the team, both measured now (the best of a few tries)."""
        if self.threads == 1:
            return 0
        import time

        fj = min(_pool.fork_join_seconds(self.team.runtime, self.threads, 200) for _ in range(3))
        L = self._layers
        big = max((self.ffi.addressof(L[0], f) for f in ("q", "gate", "down")),
                  key=lambda g: g.N * g.row_bytes)
        x = np.ones((1, big.K), np.float32)
        y = np.zeros((1, big.N), np.float32)
        fp = lambda a: self.ffi.cast("float *", a.ctypes.data)  # noqa: E731
        best = np.inf
        for _ in range(5):
            t0 = time.perf_counter()
            self.lib.sm_g_matmul(big, fp(x), 1, fp(y), 1)
            best = min(best, time.perf_counter() - t0)
        return int(self.SYNC_SHARE * fj * big.N * big.row_bytes / best)

    @property
    def weight_bytes(self) -> int:
        return self.mf.weight_bytes_per_token

    def reset(self):
        self.pos = 0

    def forward(self, tokens, all_logits: bool = False, path: str | None = None) -> np.ndarray:
        """The logits after ``tokens`` (the last row's, or every row's with ``all_logits``).
        ``path`` "c": every row through the C call, in blocks of :data:`ROWS`; "gemm": the
        rows' products through chapter 2's f32 GEMM (:meth:`_forward_gemm`); None: "c" for
        fewer rows than ``gemm_min_rows``, else "gemm"."""
        t = np.ascontiguousarray(tokens, np.int32).reshape(-1)
        n = t.size
        if n == 0 or self.pos + n > self.context:
            raise ValueError(f"tokens: {n} at position {self.pos} do not fit a context of "
                             f"{self.context}")
        if t.min() < 0 or t.max() >= self.h.vocab:
            raise ValueError(f"tokens: ids outside [0, {self.h.vocab})")
        path = path or ("gemm" if n >= self.gemm_min_rows else "c")
        if path == "gemm":
            return self._forward_gemm(t, all_logits)
        if path != "c":
            raise ValueError(f"path: expected 'c' or 'gemm', got {path!r}")
        out = np.empty((n if all_logits else 1, self.h.vocab), np.float32)  # C writes every row
        for s in range(0, n, ROWS):
            c = min(ROWS, n - s)
            dst = out[s:s + c] if all_logits else out
            rc = self.lib.sm_g_forward(self._m, self.ffi.cast("int *", t[s:].ctypes.data), c,
                                       self.pos, self.ffi.cast("float *", dst.ctypes.data),
                                       int(all_logits), self.threads)
            if rc:
                raise RuntimeError(f"sm_g_forward: {_ERRORS.get(rc, rc)}")
            self.pos += c
        return out if all_logits else out[0]

    # ------------------------------------------------------------ the prompt through the GEMM
    def _gm(self, name):
        L = name.split(".")
        if L[0] == "blk":
            field = {"attn_q": "q", "attn_k": "k", "attn_v": "v", "attn_output": "o",
                     "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down"}[L[2]]
            return self.ffi.addressof(self._layers[int(L[1])], field)
        return self.ffi.addressof(self._m, "out")

    def _product(self, name, x, xb=None):
        """x (n, K) by the matrix: its rows dequantised a panel at a time, each panel one call
        of chapter 2's GEMM on this forward's team: in bf16 (weights and activations rounded
        to bf16, products summed in f32; ``xb``: x in bf16 already) where ``prompt_dtype`` is
        "bf16", else in f32. A panel has as many rows as the GEMM's own column block (nc,
        from its cache model), so that cutting the matrix into panels adds no packing of x
        the GEMM would not do anyway; the work is compute-bound, and writing the panel costs
        a few per cent of multiplying it."""
        from . import gemm

        g = self._gm(name)
        K, N = g.K, g.N
        bf16 = self.prompt_dtype == "bf16"
        size = 2 if bf16 else 4
        rows = min(N, gemm.default_blocks()["nc"])
        if self._panel is None or self._panel.nbytes < rows * K * size:
            self._panel = np.empty(rows * K * size, np.uint8)
        panel = self._panel[:rows * K * size].view(np.uint16 if bf16 else np.float32)
        panel = panel.reshape(rows, K)
        out = np.empty((x.shape[0], N), np.float32)
        if bf16:
            x = self._bf16(x) if xb is None else xb
            scratch = np.empty(self.threads * K, np.float32)
            sp = self.ffi.cast("float *", scratch.ctypes.data)
            pp = self.ffi.cast("uint16_t *", panel.ctypes.data)
        else:
            pp = self.ffi.cast("float *", panel.ctypes.data)
        for r0 in range(0, N, rows):
            r1 = min(N, r0 + rows)
            if bf16:
                self.lib.sm_g_rows_bf16(g, r0, r1, pp, sp, self.threads)
                gemm.matmul_bf16(x, panel[:r1 - r0], trans_b=True, out=out[:, r0:r1],
                                 threads=self.team, path=self._bf16_path)
            else:
                self.lib.sm_g_rows(g, r0, r1, pp, self.threads)
                gemm.matmul(x, panel[:r1 - r0], trans_b=True, out=out[:, r0:r1],
                            threads=self.team)
        return out

    def _forward_gemm(self, t, all_logits):
        """The prompt rows' forward in float32 numpy around the GEMM's products: the
        norms, RoPE and attention as the C forward computes them, the keys and values
        written into the same f16 cache, so that decoding continues from it."""
        from threadpoolctl import threadpool_limits

        h, a = self.h, self.h.arch
        n, p0 = t.size, self.pos
        T = self.mf.tensors
        vec = lambda name: T[name].dequantize() if name in T else None  # noqa: E731
        rmsn = lambda x, w: x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + np.float32(h.eps)) * w  # noqa: E731
        x = np.stack([self._row("token_embd.weight", i) for i in t])
        cos, sin = self._cos[p0:p0 + n, None, :], self._sin[p0:p0 + n, None, :]
        half = h.rope_dim // 2

        def rope(v):
            if a.rope == "neox":
                x0, x1 = v[..., :half].copy(), v[..., half:2 * half].copy()
                v[..., :half], v[..., half:2 * half] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
            else:
                x0, x1 = v[..., 0:2 * half:2].copy(), v[..., 1:2 * half:2].copy()
                v[..., 0:2 * half:2], v[..., 1:2 * half:2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
            return v

        mask = np.triu(np.full((n, p0 + n), -np.inf, np.float32), k=p0 + 1)
        nkv = h.n_kv_head
        with threadpool_limits(1):  # numpy's own threads would spin on the GEMM's cores
            for i in range(h.n_layer):
                b = f"blk.{i}."
                u = rmsn(x, vec(b + "attn_norm.weight"))
                ub = self._bf16(u) if self.prompt_dtype == "bf16" else None
                q, k, v = (self._product(b + f"attn_{c}.weight", u, ub) for c in "qkv")
                if a.qkv_bias:
                    q += vec(b + "attn_q.bias")
                    k += vec(b + "attn_k.bias")
                    v += vec(b + "attn_v.bias")
                q = q.reshape(n, h.n_head, h.head_dim)
                k = k.reshape(n, nkv, h.head_dim)
                v = v.reshape(n, nkv, h.v_dim)
                if a.qk_norm:
                    q = rmsn(q, vec(b + "attn_q_norm.weight"))
                    k = rmsn(k, vec(b + "attn_k_norm.weight"))
                rope(q)
                rope(k)
                self.k[i, p0:p0 + n], self.v[i, p0:p0 + n] = k, v
                att = self._attend(i, q, p0, n, mask)
                x = x + self._product(b + "attn_output.weight", att)
                u = rmsn(x, vec(b + "ffn_norm.weight"))
                ub = self._bf16(u) if self.prompt_dtype == "bf16" else None
                g, up = (self._product(b + f"ffn_{c}.weight", u, ub) for c in ("gate", "up"))
                x = x + self._product(b + "ffn_down.weight", g / (1 + np.exp(-g)) * up)
        self.pos += n
        rows = x if all_logits else x[-1:]
        rows = np.ascontiguousarray(rmsn(rows, vec("output_norm.weight")), np.float32)
        with threadpool_limits(1):
            out = self._product("output", rows)  # float32 activations here too
        return out if all_logits else out[0]

    def _bf16(self, x):
        from . import layers

        x = np.ascontiguousarray(x, np.float32)
        return layers.to_bf16(x, np.empty(x.shape, np.uint16), threads=self.team)

    def _attend(self, i, q, p0, n, mask):
        """The prompt rows' attention over layer i's cache (its f16 keys and values, as the
        decode steps read them). From an empty cache, with keys and values of one width, it
        is chapter 3's causal attention in tiles (layers.flash_forward, each kv head's keys
        repeated for the heads that share them); a prompt that continues a cache takes the
        scores in numpy."""
        from . import layers

        h = self.h
        G, nkv, hd, vd = h.group, h.n_kv_head, h.head_dim, h.v_dim
        scale = np.float32(1 / np.sqrt(hd))
        if h.arch.q_prescaled:  # phi3: the query scaled first, the scores not
            q, scale = q * scale, np.float32(1)
        Kc = self.k[i, :p0 + n].astype(np.float32)                         # (T, kv, hd)
        Vc = self.v[i, :p0 + n].astype(np.float32)                         # (T, kv, vd)
        if p0 == 0 and hd == vd:
            qf = np.ascontiguousarray(q.transpose(1, 0, 2))                # (heads, n, hd)
            kf, vf = (np.ascontiguousarray(np.repeat(c, G, axis=1).transpose(1, 0, 2))
                      for c in (Kc, Vc))
            o, lse = np.empty_like(qf), np.empty(qf.shape[:2], np.float32)
            layers.flash_forward(qf, kf, vf, o, lse, float(scale), threads=self.team)
            return o.transpose(1, 0, 2).reshape(n, h.n_head * vd)
        qh = q.reshape(n, nkv, G, hd).transpose(1, 2, 0, 3)                # (kv, G, n, hd)
        s = qh @ Kc.transpose(1, 2, 0)[:, None] * scale + mask
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        return (s @ Vc.transpose(1, 0, 2)[:, None]).transpose(2, 0, 1, 3).reshape(n, h.n_head * vd)

    def _row(self, name, i):
        out = np.empty(self.h.d, np.float32)
        self.lib.sm_g_row(self.ffi.addressof(self._m, "embd"), int(i),
                          self.ffi.cast("float *", out.ctypes.data))
        return out
