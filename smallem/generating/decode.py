"""Chapter 4: generating one sequence without the GPU.

The decode ladder, :data:`RUNGS`: each rung is a decoder with the same three calls,
``reset()``, ``prefill(tokens) -> logits`` and ``step(token) -> logits`` (the logits of
the last token, float32 (V,)), and each differs from the one before by one idea:

0. :class:`NoCache`: every new token runs the whole prefix through the model again;
1. :class:`NumpyCache`: keys and values kept per layer (the KV cache), the prompt as one
   batched pass through chapter 2's GEMM, then one token at a time in numpy;
2. :class:`Decoder` in f32: the whole token in one C call (``kernels_c/forward.c``, the one
   forward of every architecture), the weights repacked into the tiles that call streams,
   on one core (the prompt still takes rung 1's GEMM on every core, inside the same call);
3. the same with int8 weights (:mod:`smallem.generating.quant`), a quarter of the bytes;
4. threads splitting each product's tiles, on chapter 3's pool;
5. the prompt through the same C call in row blocks (the int8 product on many rows),
   not through the f32 GEMM.

:class:`Generator` is what a reader uses: a checkpoint (or any model) in, bytes out, with
:class:`Sampler`'s temperature, top-k and top-p. ``smallem generate`` is its command.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from smallem import checks
from smallem.cpu import isa, machine
from smallem.plumbing import build
from smallem.training import checkpoint
from smallem.plumbing import pool as _pool
from smallem.ladder import Ladder, Rung, Where
from smallem.training.model import GPT, get_config
from smallem.training.ops import LN_EPS, rope_tables
from smallem.generating.forward import Q8_0_ID, Forward, Rows, Spec
from smallem.generating.quant import Packed
from smallem.generating.sampling import Sampler, generate  # noqa: F401 (Sampler: the tests too)

DTYPES = ("f32", "int8")


def _lib(threads):
    """forward.c's module for ``threads`` (a count or a Team): its pool variant on the pool."""
    return _pool.team(threads).module("forward")


def load_model(folder, backend: str = "kernels", threads=None) -> GPT:
    """The model a ``smallem train`` checkpoint holds (either block), its parameters only."""
    tensors, meta = checkpoint.load(folder)
    where = Path(folder) / checkpoint.INDEX
    try:
        cfg = get_config(meta["config"])
    except (KeyError, TypeError, ValueError) as e:
        raise checkpoint.CheckpointError(f"{where}: missing or bad config ({e})") from e
    model = GPT(cfg, backend, threads=threads)
    checkpoint.check_tensors(tensors, {"param." + k: s for k, s in model.shapes.items()}, where)
    for name in model.params:
        model.params[name][...] = tensors["param." + name]
    return model


def _check_tokens(tokens, vocab: int, pos: int, context: int) -> np.ndarray:
    t = np.asarray(tokens)
    if t.ndim != 1 or t.size == 0:
        raise ValueError(f"tokens: expected a non-empty 1-D sequence, got shape {t.shape}")
    if not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"tokens: expected ints, got {t.dtype}")
    if t.min() < 0 or t.max() >= vocab:
        raise ValueError(f"tokens: ids must lie in [0, {vocab}), got {t.min()}..{t.max()}")
    if pos + t.size > context:
        raise ValueError(f"{t.size} tokens after position {pos} do not fit the context "
                         f"of {context}")
    return np.ascontiguousarray(t, np.int32)


# ================================================================ rung 0
def _with_attention(model: GPT, what: str) -> None:
    """One clear line where a decoder that caches keys and values meets a model without
    them: the recurrent block carries a state instead, and only rung 0 (the model's own
    forward over the whole prefix) decodes it so far."""
    if model.config.block == "recurrent":
        raise ValueError(f"{what}: the recurrent block ({model.config.name}) has no keys and "
                         f"values to cache; it decodes by rerunning its prefix (rung 0, NoCache)")


class NoCache:
    """Rung 0: no memory between tokens; each one reruns the whole prefix."""

    def __init__(self, model: GPT):
        self.model, self.config = model, model.config
        self.reset()

    def reset(self):
        self.tokens: list[int] = []

    @property
    def pos(self) -> int:
        return len(self.tokens)

    def prefill(self, tokens) -> np.ndarray:
        t = _check_tokens(tokens, self.config.vocab, self.pos, self.config.context)
        self.tokens += t.tolist()
        return self.model.forward(np.array([self.tokens], np.int32))[-1].copy()

    def step(self, token: int) -> np.ndarray:
        return self.prefill([token])


# ================================================================ rung 1
def _norm(x, w, b):
    """LayerNorm (b given) or RMSNorm (b None) of one row."""
    if b is not None:
        x = x - x.mean()
    return x / np.sqrt((x * x).mean() + LN_EPS) * w + (0 if b is None else b)


class NumpyCache:
    """Rung 1: a KV cache (per layer, keys and values of every position so far, allocated
    for the whole context); the prompt through the model's batched forward (chapter 2's
    GEMM), then each token in numpy: its products are matrix-vector ones."""

    def __init__(self, model: GPT):
        _with_attention(model, "the KV cache")
        self.model, self.config = model, model.config
        c = self.config
        shape = (c.n_layer, c.n_head, c.context, c.head_dim)
        self.k, self.v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.cos, self.sin = rope_tables(c.context, c.head_dim) if c.block == "modern" else (None, None)
        self.pos = 0

    def reset(self):
        self.pos = 0

    def prefill(self, tokens) -> np.ndarray:
        t = _check_tokens(tokens, self.config.vocab, self.pos, self.config.context)
        if self.pos:  # a prompt after tokens already seen: token by token
            for tok in t[:-1]:
                self.step(int(tok))
            return self.step(int(t[-1]))
        logits = self.model.forward(t[None, :])
        n = t.size
        for i, layer in enumerate(self.model.ws.layers):  # q and k after RoPE, as cached
            self.k[i, :, :n] = layer.attn.k[0]
            self.v[i, :, :n] = layer.attn.v[0]
        self.pos = n
        return logits[-1].copy()

    def _rope(self, x, p):  # x (H, hd): pairs (2i, 2i+1) turned by p theta_i
        a, b = x[:, 0::2].copy(), x[:, 1::2].copy()
        c, s = self.cos[p], self.sin[p]
        x[:, 0::2], x[:, 1::2] = a * c - b * s, a * s + b * c

    # --8<-- [start:numpy_step]
    def step(self, token: int) -> np.ndarray:
        c, P, p = self.config, self.model.params, self.pos
        _check_tokens([token], c.vocab, p, c.context)
        modern, H, hd = c.block == "modern", c.n_head, c.head_dim
        x = P["wte"][token] + (0 if modern else P["wpe"][p])
        for i in range(c.n_layer):
            n = f"h{i}."
            b = (lambda name: None) if modern else (lambda name: P[n + name])
            qkv = _norm(x, P[n + "ln1.w"], b("ln1.b")) @ P[n + "attn.w"]
            if not modern:
                qkv = qkv + P[n + "attn.b"]
            q, k, v = (qkv[j * c.d_model:(j + 1) * c.d_model].reshape(H, hd) for j in range(3))
            if modern:
                self._rope(q, p), self._rope(k, p)
            self.k[i, :, p], self.v[i, :, p] = k, v
            s = np.einsum("hd,htd->ht", q, self.k[i, :, :p + 1]) / math.sqrt(hd)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            o = np.einsum("ht,htd->hd", s / s.sum(axis=1, keepdims=True), self.v[i, :, :p + 1])
            x = x + o.reshape(-1) @ P[n + "proj.w"] + (0 if modern else P[n + "proj.b"])
            u = _norm(x, P[n + "ln2.w"], b("ln2.b")) @ P[n + "fc.w"]
            if modern:
                h = c.mlp_hidden
                g = u[:h] / (1 + np.exp(-u[:h])) * u[h:]
            else:
                u = u + P[n + "fc.b"]
                g = 0.5 * u * (1 + np.tanh(0.7978845608 * (u + 0.044715 * u ** 3)))
            x = x + g @ P[n + "fc2.w"] + (0 if modern else P[n + "fc2.b"])
        h = _norm(x, P["lnf.w"], None if modern else P["lnf.b"])
        self.pos = p + 1
        return (P["wte"] if c.tied else P["lm_head"]) @ h
    # --8<-- [end:numpy_step]


# ================================================================ rungs 2-5
PREFILLS = ("c", "gemm", "int8", "auto")


class Tiles:
    """One of the model's matrices for the C forward: chapter 4's tiles (:class:`Packed`, f32
    or int8, with its bias), and where the prompt may take the GEMM its plain f32 copy
    (K x N: a copy, so that changing the model afterwards changes no path of the decoder)."""

    def __init__(self, w, dtype: str, bias=None, plain: bool = False):
        self.pk = Packed(w, dtype, bias)
        self.plain = np.array(w, np.float32, order="C") if plain else None
        self.K, self.N, self.kind, self.nbytes = self.pk.K, self.pk.N, self.pk.kind, self.pk.nbytes
        # int8 weights where the prompt may take the GEMM: the same integers and scales as
        # ggml's Q8_0 rows too (one row of K / 32 blocks a column), for the integer GEMM
        self.q8_0 = q8_0_rows(*self.pk.q8) if plain and dtype == "int8" and self.K % 32 == 0 else None
        self.int8_type = Q8_0_ID if self.q8_0 is not None else -1

    def fill(self, ffi, mat):
        self.pk.fill(ffi, mat)
        if self.plain is not None:
            mat.plain = ffi.cast("float *", self.plain.ctypes.data)
            mat.plain_trans = 0
        if self.q8_0 is not None:
            mat.type, mat.row_bytes = Q8_0_ID, self.q8_0.shape[1]
            mat.w = ffi.cast("const uint8_t *", self.q8_0.ctypes.data)



def q8_0_rows(q: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Chapter 4's int8 weights (q (K, N) int8 and s (K / 32, N) f16, :func:`quantize_q8`) as
    ggml's Q8_0 rows: (N, K / 32 * 34) bytes, each block its f16 scale then its 32 integers."""
    K, N = q.shape
    nb = K // 32
    out = np.empty((N, nb, 34), np.uint8)
    out[:, :, :2] = np.ascontiguousarray(s.astype(np.float16).T).view(np.uint8).reshape(N, nb, 2)
    out[:, :, 2:] = q.reshape(nb, 32, N).transpose(2, 0, 1).view(np.uint8)
    return out.reshape(N, nb * 34)


def gpt_spec(model: GPT, dtype: str, plain: bool) -> Spec:
    """A chapter 3 model as the one C forward takes it: GPT-2's block (LayerNorm with biases,
    learned positions, GELU) or the modern one (RMSNorm, RoPE in pairs, SwiGLU with gate and
    up in one matrix), q, k and v in one matrix, the cache in chapter 4's f32 key tiles; or
    the recurrent block (the modern one without RoPE, its gates a matrix with a bias, one
    state a head in place of the cache)."""
    c, P = model.config, model.params
    modern, rec = c.block != "gpt2", c.block == "recurrent"
    bias = (lambda name: None) if modern else (lambda name: P[name])  # noqa: E731
    mat = lambda n, w, b=None: Tiles(w, dtype, None if modern else b, plain)  # noqa: E731
    layers = []
    for i in range(c.n_layer):
        n = f"h{i}."
        layers.append({
            "norm1_w": P[n + "ln1.w"], "norm1_b": bias(n + "ln1.b"),
            "norm2_w": P[n + "ln2.w"], "norm2_b": bias(n + "ln2.b"),
            "qkv": mat(n, P[n + "attn.w"], bias(n + "attn.b")),
            "o": mat(n, P[n + "proj.w"], bias(n + "proj.b")),
            "up": mat(n, P[n + "fc.w"], bias(n + "fc.b")),
            "down": mat(n, P[n + "fc2.w"], bias(n + "fc2.b"))})
        if rec:
            layers[-1]["decay"] = Tiles(P[n + "gate.w"], dtype, P[n + "gate.b"], plain)
    cos = sin = None
    if c.block == "modern":
        cos, sin = rope_tables(c.context, c.head_dim)
    return Spec(n_layer=c.n_layer, d=c.d_model, n_head=c.n_head, n_kv_head=c.n_head,
                head_dim=c.head_dim, v_dim=c.head_dim, hidden=c.mlp_hidden, vocab=c.vocab,
                context=c.context, norm="rms" if modern else "layer",
                mlp="swiglu" if modern else "gelu", rope="pairs" if cos is not None else None,
                rope_dim=c.head_dim, cache="state" if rec else "tiles", eps=LN_EPS,
                attn_scale=1.0 / math.sqrt(c.head_dim), embd=Rows(P["wte"]),
                head=mat("", (P["wte"] if c.tied else P["lm_head"]).T), layers=layers,
                wpe=None if modern else P["wpe"], out_norm_w=P["lnf.w"],
                out_norm_b=bias("lnf.b"), rope_cos=cos, rope_sin=sin, block_rows=_rows())


def _rows() -> int:
    ffi, lib = build.load("forward")
    return int(lib.sm_rows())


class Decoder(Forward):
    """Rungs 2-5: the model's forward for new tokens in one C call per token (``sm_forward``
    in ``kernels_c/forward.c``, the one forward of every architecture), against a KV cache it
    owns.

    ``dtype`` "f32" or "int8" (the blocks' matrices and the head; embeddings, norms and
    biases stay f32); ``threads`` for every product and the attention (None: every core);
    ``pool`` runs them on chapter 3's pool; ``prefill`` "c" sends the prompt through the
    tiles' products in blocks of rows, "gemm" through the same call's GEMM branch (chapter
    2's f32 GEMM on the weights' plain copy), "int8" through the integer GEMM
    (``kernels_c/forward/qgemm.c``, on the int8 weights as Q8_0 rows; int8 decoders only),
    "auto" through whichever of them ran faster here, timed when the decoder is made on a short and a long prompt
    (:attr:`prefill_choice`); ``prompt_threads`` the GEMM branch's threads (None:
    ``threads``). The weights are copied into the decoder's layout when it is
    made: changing the model afterwards does not change the decoder.
    """

    def __init__(self, model: GPT, dtype: str = "int8", threads=1, pool: bool = True,
                 prefill: str = "c", par_min_bytes: int | None = None, prompt_threads=None):
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        if prefill not in PREFILLS:
            raise ValueError(f"prefill: expected one of {', '.join(map(repr, PREFILLS))}, "
                             f"got {prefill!r}")
        if prefill == "int8" and dtype != "int8":
            raise ValueError("prefill='int8': the integer GEMM takes the int8 decoder's weights")
        self.model, self.config = model, model.config
        self.dtype, self.prefill_mode = dtype, prefill
        gemm = prefill != "c"
        super().__init__(gpt_spec(model, dtype, plain=gemm), threads, pool,
                         par_min_bytes=par_min_bytes, gemm_rows=2 if gemm else None,
                         prompt_dtype="f32" if gemm else None, prompt_threads=prompt_threads)
        if prefill == "int8" and not self.int8_prompt:
            raise ValueError(f"prefill='int8': the integer GEMM takes widths in blocks of 32, "
                             f"this model's are {self.config.d_model} and {self.config.mlp_hidden}")
        self.prefill_choice = {}  # prompt length measured -> the faster path there ("auto")
        if prefill == "auto":
            self._choose_prefill()

    def _choose_prefill(self):
        """Time the prompt paths from position 0 on a short prompt (a few of the C path's
        row blocks) and a long one (half the context), each warmed once and then timed
        three times (the fastest kept): the int8 tiles stream their weights once per block of
        rows, the f32 GEMM and the integer GEMM (an int8 decoder's third path) get faster as
        the prompt widens their products, so which wins depends on the machine and the length.
        A prompt takes the path measured faster at the nearer of the two lengths (on a log
        scale). The choice is measured once on this machine for the model's shapes, the
        weights' type, the teams and the level, and kept (:func:`machine.kept`), so every
        process takes the same path."""
        c = self.config
        short = min(c.context, 4 * int(self.lib.sm_rows()))
        lengths = sorted({short, max(short, c.context // 2)})
        modes = ("c", "gemm", "int8") if self.int8_prompt else ("c", "gemm")
        level = self.level or isa.selected()
        shape = [c.block, c.d_model, c.n_layer, c.n_head, c.mlp_hidden, c.vocab, c.context, c.tied]
        key = [level, sorted(isa.extensions(level)), self.team.runtime, self.threads,
               self.prompt_threads, self.dtype, shape, lengths, modes]
        kept = machine.kept("prefill_path", key, lambda: {
            str(n): mode for n, mode in self._time_prefill(lengths, modes).items()})
        self.prefill_choice = {int(n): mode for n, mode in kept.items()}
        self.prefill_mode = "auto"
        self.reset()

    def _time_prefill(self, lengths, modes) -> dict:
        """{prompt length: the mode that ran it fastest}, measured now."""
        c = self.config
        tokens = np.arange(max(lengths), dtype=np.int64) % c.vocab
        choice = {}
        for n in lengths:
            took = {}
            for mode in modes:
                self.prefill_mode = mode
                best = math.inf
                for i in range(4):
                    self.reset()
                    t0 = time.perf_counter()
                    self.prefill(tokens[:n])
                    if i:
                        best = min(best, time.perf_counter() - t0)
                took[mode] = best
            choice[n] = min(took, key=took.get)
        return choice

    def _prefill_path(self, n: int) -> str:
        if self.prefill_mode != "auto":
            return self.prefill_mode
        near = min(self.prefill_choice, key=lambda m: abs(math.log(m) - math.log(max(n, 1))))
        return self.prefill_choice[near]

    def prefill(self, tokens) -> np.ndarray:
        t = _check_tokens(tokens, self.config.vocab, self.pos, self.config.context)
        path = self._prefill_path(t.size) if t.size > 1 else "c"
        self.logits[...] = self.forward(t, path=path)
        return self.logits

    def all_logits(self, tokens) -> np.ndarray:
        """Logits (n, V) of every position of ``tokens`` from position 0 (for the loss)."""
        self.reset()
        t = _check_tokens(tokens, self.config.vocab, 0, self.config.context)
        return self.forward(t, all_logits=True, path="c")


def matmul(pk: Packed, x: np.ndarray, threads=1, pool: bool = False, y=None,
           accumulate: bool = False) -> np.ndarray:
    """y (rows, N) = x (rows, K) W through the decoder's product, W packed in ``pk``
    (int8: ``x`` quantised per block of 32 first, as the decoder does). For tests and benchmarks."""
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != pk.K:
        raise ValueError(f"x: expected float32 (rows, {pk.K}), got {x.dtype}{x.shape}")
    x = np.ascontiguousarray(x)
    rows = x.shape[0]
    team = _pool.team(threads, pool)
    threads = team.n
    ffi, lib = _lib(team)
    if y is None:
        y = np.zeros((rows, pk.N), np.float32)
    elif y.shape != (rows, pk.N) or y.dtype != np.float32 or not y.flags.c_contiguous:
        raise ValueError(f"y: expected C-contiguous float32 {(rows, pk.N)}, got {y.dtype}{y.shape}")
    m = ffi.new("sm_mat *")
    pk.fill(ffi, m)
    fp = lambda a: ffi.cast("float *", a.ctypes.data)  # noqa: E731
    xq = xs = None
    if pk.kind == "int8":
        xq, xs = quantize_rows(x)
    lib.sm_matmul(m, fp(x), ffi.NULL if xq is None else ffi.cast("int8_t *", xq.ctypes.data),
                  ffi.NULL if xs is None else fp(xs), fp(y), rows, int(accumulate), threads)
    return y


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row of x (rows, K) to int8 per block of 32 as ggml's Q8_0, as the decoder quantises
    activations: (p int8 (rows, K32), a float32 (rows, K32 / 32)), x ~ a_b p in block b."""
    x = np.ascontiguousarray(x, np.float32)
    rows, K = x.shape
    K32 = -(-K // 32) * 32
    xq = np.zeros((rows, K32), np.int8)
    xs = np.zeros((rows, K32 // 32), np.float32)
    ffi, lib = build.load("forward")
    lib.sm_quantize_rows(ffi.cast("float *", x.ctypes.data), rows, K,
                         ffi.cast("int8_t *", xq.ctypes.data), ffi.cast("float *", xs.ctypes.data))
    return xq, xs


def dequantize_rows(p: np.ndarray, a: np.ndarray, K: int, dtype=np.float64) -> np.ndarray:
    """The rows :func:`quantize_rows` stands for: (rows, K) in ``dtype``, each block's values
    times its scale."""
    return (p.astype(dtype) * np.repeat(a.astype(dtype), 32, axis=1))[:, :K]


# The ladder: (rung, what it adds, decoder factory). Every rung decodes the same model.
def _where(kernel: str | None, rung: int, test: str) -> Where:
    """Where chapter 4's rung ``rung`` is: its code, its paragraph of the page, the notebook's
    cell of the ladder, its test."""
    return Where(kernel, f"chapters/4-generation.md:**Rung {rung}, ",
                 "notebooks/04_generation.py:# ## The ladder, with llama.cpp and PyTorch",
                 f"tests/test_decode.py::{test}")


RUNGS = Ladder("chapter 4's decoders", [
    Rung(0, "no_cache", "no cache: the whole prefix again per token",
         run=lambda m, t: NoCache(m), where=_where(None, 0, "test_rungs_are_the_ladder")),
    Rung(1, "kv_cache", "KV cache; prompt through the GEMM, tokens in numpy",
         run=lambda m, t: NumpyCache(m),
         where=_where("smallem/generating/decode.py:numpy_step", 1, "test_kv_cache_decode_equals_full_recompute")),
    Rung(2, "c_call", "one C call per token, f32 tiles",
         run=lambda m, t: Decoder(m, "f32", 1, prefill="gemm", prompt_threads=t),
         where=_where("kernels_c/forward/tiles.c:f32_block", 2, "test_kv_cache_decode_equals_full_recompute")),
    Rung(3, "int8", "int8 weights",
         run=lambda m, t: Decoder(m, "int8", 1, prefill="gemm", prompt_threads=t),
         where=_where("kernels_c/forward/tiles.c:q8_block", 3, "test_int8_decode_follows_f32")),
    Rung(4, "threads", "threads on the pool",
         run=lambda m, t: Decoder(m, "int8", t, prefill="gemm"),
         where=_where("kernels_c/forward/tiles.c:matmul", 4, "test_threshold_for_threads")),
    Rung(5, "prompt_path", "prompt path chosen by measurement: int8 call or f32 GEMM",
         run=lambda m, t: Decoder(m, "int8", t, prefill="auto"),
         where=_where("kernels_c/forward.c:gemm_branch", 5, "test_the_measured_prompt_path_gives_the_same_logits")),
])


def int8_instruction(level: str | None = None) -> str:
    """The instruction the int8 product runs in the decoder built for ``level`` (default:
    the selected one): vpdpbusd (AVX512-VNNI or AVX-VNNI), vpmaddubsw (AVX2) or plain C."""
    ffi, lib = build.load("forward", level)
    return ffi.string(lib.sm_int8_instruction()).decode()


def rung_label(i, level: str | None = None) -> str:
    """Rung ``i``'s label (``i`` its place or name), with the int8 instruction that runs here
    on the int8 rung."""
    r = RUNGS[i]
    return f"{r.what}, {int8_instruction(level)}" if r.name == "int8" else r.what


def rung_decoder(i, model: GPT, threads=None):
    """Rung ``i``'s decoder of ``model`` (``i`` its place or its name)."""
    if isinstance(i, str) and i in RUNGS or isinstance(i, int) and not isinstance(i, bool) \
            and 0 <= i < len(RUNGS):
        return RUNGS[i].run(model, threads)
    raise ValueError(f"decode rung {i!r}: expected one of {list(range(len(RUNGS)))} or "
                     f"{', '.join(RUNGS.names())}")


# ================================================================ the generator
class Generator:
    """Bytes after a prompt, from a model, one at a time: ``for piece in g.generate(...)``.

    Uses the top of the ladder (:class:`Decoder`, int8 or f32, threads on the pool).
    When the context is full, the last half of it is prefilled again and generation goes
    on: the model then sees the latest ``context / 2`` bytes, never more than its context.

    ``prefill`` is the decoder's prompt path, "c" by default: the prompt goes through the
    same call, in the same ``dtype``, as every token after it, so the same seed gives the
    same text on a machine. "auto" (rung 5) picks the faster path by timing it when the
    generator is made; the f32 GEMM's logits differ from the int8 call's, so with "auto" the
    text may change from run to run with the clock.
    """

    def __init__(self, model: GPT, *, dtype: str = "int8", threads=None, pool: bool = True,
                 prefill: str = "c"):
        self.model, self.config = model, model.config
        self.decoder = Decoder(model, dtype, threads, pool, prefill=prefill)

    @classmethod
    def from_checkpoint(cls, folder, **kw) -> "Generator":
        return cls(load_model(folder), **kw)

    def prompt_tokens(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            prompt = prompt.encode("utf-8")
        if not isinstance(prompt, (bytes, bytearray, memoryview)):
            raise TypeError(f"prompt: expected bytes or str, got {type(prompt).__name__}")
        tokens = list(bytes(prompt)) or [10]  # an empty prompt starts after a newline
        if len(tokens) > self.config.context:
            raise ValueError(f"the prompt is {len(tokens)} bytes, longer than the model's "
                             f"context of {self.config.context}")
        return tokens

    def generate(self, prompt, tokens: int, *, temperature: float = 0.8, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0):
        """Yield ``tokens`` bytes (each a ``bytes`` of length 1) after ``prompt``."""
        if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 0:
            raise ValueError(f"tokens must be an int >= 0, got {tokens!r}")
        history = self.prompt_tokens(prompt)
        sampler = Sampler(temperature, top_k, top_p, seed, self.config.vocab)
        dec = self.decoder

        def refill(ids):
            dec.reset()
            return dec.prefill(ids)

        for t in generate(refill(history), history, tokens, sampler,
                          context=self.config.context, step=dec.step, refill=refill):
            yield bytes((t,))
