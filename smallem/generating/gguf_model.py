"""The forward of a llama-family GGUF model (:mod:`smallem.generating.gguf_file`), one token at a time
against a KV cache: the numpy reference every faster path is checked against.

One forward serves every architecture in :data:`smallem.generating.gguf_file.ARCHS`; each difference
is a switch read from the file's :class:`~smallem.generating.gguf_file.Arch`:

    x = token_embd[t]                                         gemma3: times sqrt(d)
    per block:  h = RMSNorm(x) * attn_norm
                q, k, v = h Wq (+ bq), h Wk (+ bk), h Wv (+ bv)       qwen2: the biases
                q, k = RMSNorm per head * q_norm, k_norm              qwen3, gemma3
                q, k = RoPE(q, k, position)     pairs (2i, 2i+1) ("norm") or (i, i + half)
                                    gemma3: the window's layers with their own base
                att = softmax(q k^T / sqrt(hd)) v, each key/value head shared by
                      n_head / n_kv_head query heads (GQA)      phi3, gemma3: (q * s) k^T
                      gemma3: five layers of six see only the last `window` positions
                x += att Wo                               gemma3: RMSNorm(att Wo) * post_attention_norm
                h = RMSNorm(x) * ffn_norm;  x += (silu(h Wg) * (h Wu)) Wd
                                          gemma3: gelu for silu, RMSNorm(...) * post_ffw_norm
    logits = (RMSNorm(x) * output_norm) W_out     (W_out = token_embd where the file has none)
                                          gemma3: c tanh(logits / c) where the file gives c

The angle of pair i at position p is p * base^(-2i / rope_dim), divided by
``rope_freqs[i]`` where the file has that tensor (llama 3's frequency scaling, which
llama.cpp's converter stores there). ``dtype`` float64 is the oracle; float32 runs the same
arithmetic at the precision of the kernels. Each matrix is dequantised by the ``gguf``
package when a product needs it and dropped after: slow, never a copy of the model.

``like_llama`` makes it the oracle of what the C forward (:mod:`smallem.generating.forward`) and
llama.cpp compute: each product's activation rounded first as llama.cpp rounds it for the
weights' type (:func:`round_activation`), the keys and values kept in f16, each query
rounded to f16 before it meets the keys (ggml multiplies an f16 matrix by an f16 copy of the
other operand), and the attention summed as ggml's CPU flash attention sums it, in an f16
accumulator (:func:`flash_f16`). That last rounding is not small: about 1e-3 of the
attention's output, enough to move many of the 8-bit roundings of the activations after it,
so that without it the logits of a Q8_0 file part from llama.cpp's by a per cent.
"""

from __future__ import annotations

import numpy as np

from smallem.generating.gguf_file import ModelFile, head_name, rope_angles, tensor_name


def rope(x, angles, style: str):
    """x (n, heads, hd) turned in place by angles (n, r/2) over its first r features."""
    r = angles.shape[1] * 2
    c, s = np.cos(angles)[:, None, :].astype(x.dtype), np.sin(angles)[:, None, :].astype(x.dtype)
    if style == "norm":
        a, b = x[..., 0:r:2].copy(), x[..., 1:r:2].copy()
        x[..., 0:r:2], x[..., 1:r:2] = a * c - b * s, a * s + b * c
    else:  # neox: the first half of the turned features with the second half
        a, b = x[..., :r // 2].copy(), x[..., r // 2:r].copy()
        x[..., :r // 2], x[..., r // 2:r] = a * c - b * s, a * s + b * c
    return x


# the type llama.cpp rounds a product's activation row to, by the weights' type
ACTIVATION = {"F16": "F16", "BF16": "BF16", "Q8_0": "Q8_0", "Q4_0": "Q8_0", "Q5_0": "Q8_0",
              "Q4_K": "Q8_K", "Q6_K": "Q8_K"}


def round_activation(weight_type: str, x) -> np.ndarray:
    """The values (float64) of x (..., K) rounded as llama.cpp rounds an activation before a
    product with ``weight_type`` weights, in float32 arithmetic as its x86 code does:
    F16/BF16 round to nearest even; Q8_0 blocks of 32 with d = f16(max|x| / 127) and
    q = rint(x * (127 / max|x|)); Q8_K blocks of 256 with s = -127 / x_m (x_m the first value
    of largest magnitude), q = min(127, rint(s x)) and d = 1 / s. F32 weights: x itself."""
    kind = ACTIVATION.get(weight_type)
    x = np.asarray(x, np.float32)
    if kind is None:
        return x.astype(np.float64)
    if kind == "F16":
        return x.astype(np.float16).astype(np.float64)
    if kind == "BF16":
        u = x.view(np.uint32).astype(np.uint64)
        r = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)
        return r.view(np.float32).astype(np.float64)
    n = 32 if kind == "Q8_0" else 256
    b = x.reshape(*x.shape[:-1], x.shape[-1] // n, n)
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "Q8_0":
            amax = np.abs(b).max(axis=-1, keepdims=True)
            d = (amax / np.float32(127)).astype(np.float16).astype(np.float64)
            inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
            q = np.rint(b * inv)
        else:
            i = np.abs(b).argmax(axis=-1)[..., None]
            vmax = np.take_along_axis(b, i, axis=-1)
            s = np.where(vmax != 0, np.float32(-127) / vmax, np.float32(0)).astype(np.float32)
            q = np.minimum(np.rint(s * b), 127)
            d = np.where(s != 0, np.float32(1) / s, np.float32(0)).astype(np.float32).astype(np.float64)
    return (d * q.astype(np.float64)).reshape(x.shape)


def flash_f16(q, K, V, scale, p0, window: int = 0) -> np.ndarray:
    """Attention as ggml's CPU flash attention computes it with an f16 cache (llama.cpp's
    default): row r of q (n, heads, hd) sees keys 0..p0 + r of K (T, heads, hd), in order
    (with a ``window``, only those less than ``window`` positions back: the others are masked,
    -inf, which ggml skips as it skips the future),
    with an online softmax in float32 (M the largest score so far, S the sum of
    exp(score - M)) and the values summed in an f16 accumulator, each step a float32 fused
    multiply-add (exact here in float64, then rounded to float32) rounded to f16, a new
    largest score first scaling the accumulator by exp(M_old - M), rounded to f16 too. The
    accumulator over S at the end, in float32. Rows and heads at once; keys one at a time."""
    n, H, _ = q.shape
    T = K.shape[0]
    q64, K64 = q.astype(np.float64), K.astype(np.float64)
    V32 = V.astype(np.float32)
    M = np.full((n, H), -np.inf, np.float32)
    S = np.zeros((n, H), np.float32)
    acc = np.zeros((n, H, V.shape[2]), np.float16)
    last = p0 + np.arange(n)[:, None]                      # the last key row r sees
    with np.errstate(invalid="ignore", over="ignore"):
        for t in range(T):
            seen = (t <= last) & (last - t < window) if window else t <= last
            if not seen.any():
                continue
            live = np.broadcast_to(seen, (n, H))
            sc = (np.einsum("nhd,hd->nh", q64, K64[t]).astype(np.float32)
                  * np.float32(scale))
            new = live & (sc > M)
            ms = np.where(new, np.exp(M - sc, dtype=np.float32), np.float32(1))
            vs = np.where(new, np.float32(1),
                          np.where(live, np.exp(sc - M, dtype=np.float32), np.float32(0)))
            M = np.where(new, sc, M)
            acc = np.where(new[..., None], (acc.astype(np.float32) * ms[..., None]).astype(np.float16),
                           acc)
            step = (acc.astype(np.float64) + V32[t].astype(np.float64) * vs[..., None].astype(np.float64))
            acc = np.where(live[..., None], step.astype(np.float32).astype(np.float16), acc)
            S = np.where(live, S * ms + vs, S).astype(np.float32)
    inv = np.where(S == 0, np.float32(0), np.float32(1) / S).astype(np.float32)
    return (acc.astype(np.float32) * inv[..., None]).astype(np.float64)


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def gelu(x):
    """gelu's tanh form (gemma3's gelu_pytorch_tanh, ggml's ggml_gelu_f32)."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * x * (1 + 0.044715 * x * x)))


_GELU_F16 = None


def geglu_like_ggml(g, u) -> np.ndarray:
    """gelu(g) * u as ggml's CPU geglu computes it (GGML_GELU_FP16, its default): in float32,
    g <= -10 gives 0 and g >= 10 gives g * u; between, g rounded to f16 picks gelu's value from
    a table of f16 values (gelu of each f16 in float32 arithmetic, rounded to f16), times u."""
    global _GELU_F16
    if _GELU_F16 is None:
        f = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
        c, a, half, one = (np.float32(v) for v in (0.79788456080286535587989211986876,
                                                    0.044715, 0.5, 1.0))
        with np.errstate(invalid="ignore", over="ignore"):
            _GELU_F16 = (half * f * (one + np.tanh(c * f * (one + a * f * f)))).astype(np.float16)
    g, u = np.asarray(g, np.float32), np.asarray(u, np.float32)
    table = _GELU_F16[g.astype(np.float16).view(np.uint16)].astype(np.float32)
    out = np.where(g <= -10, np.float32(0), np.where(g >= 10, g, table) * u)
    return out.astype(np.float64)


class Reference:
    """The forward in numpy at ``dtype``, with its own KV cache. ``like_llama``: each product's
    activation rounded as llama.cpp rounds it for the weight's type (:func:`round_activation`)
    and the cache in f16; ``cache16`` alone: the f16 cache without the rounded activations
    (what chapter 2's GEMM path computes). ``keep``: each matrix dequantised once and kept
    (faster, a copy of the model at ``dtype``)."""

    def __init__(self, mf: ModelFile, dtype=np.float64, like_llama: bool = False,
                 cache16: bool | None = None, keep: bool = False):
        self.mf, self.h, self.dtype = mf, mf.hyper, np.dtype(dtype)
        self._kept = {} if keep else None  # keep: each matrix dequantised once, kept (a copy
                                           # of the model at dtype: for small models)
        self.like_llama = like_llama
        self.cache16 = like_llama if cache16 is None else cache16
        self._vec = {}
        self.freqs = (mf.tensors[tensor_name("rope_freqs")].dequantize()
                      if tensor_name("rope_freqs") in mf.tensors else None)
        self.reset()

    def reset(self):
        h = self.h
        self.k = np.zeros((h.n_layer, h.context, h.n_kv_head, h.head_dim), self.dtype)
        self.v = np.zeros((h.n_layer, h.context, h.n_kv_head, h.v_dim), self.dtype)
        self.pos = 0

    def vec(self, key):
        if key not in self._vec:
            self._vec[key] = self.mf.tensors[key].dequantize().astype(self.dtype)
        return self._vec[key]

    def mat(self, key, x):
        """x (n, n_in) times the file's matrix ``key`` (n_out rows of n_in): (n, n_out)."""
        t = self.mf.tensors[key]
        if self.like_llama:
            x = round_activation(t.type, x).astype(self.dtype)
        if self._kept is None:
            return x @ t.dequantize().astype(self.dtype).T
        if key not in self._kept:
            self._kept[key] = t.dequantize().astype(self.dtype)
        return x @ self._kept[key].T

    def forward(self, tokens, all_logits: bool = False) -> np.ndarray:
        h, a = self.h, self.h.arch
        tokens = np.asarray(tokens, np.int64)
        n, p0 = len(tokens), self.pos
        if n == 0 or p0 + n > h.context:
            raise ValueError(f"tokens: {n} at position {p0} do not fit a context of {h.context}")
        if tokens.min() < 0 or tokens.max() >= h.vocab:
            raise ValueError(f"tokens: ids outside [0, {h.vocab})")
        emb = self.mf.tensors[tensor_name("embd")]
        x = emb.rows(tokens).astype(self.dtype)
        if a.embed_scale:  # gemma3: times sqrt(d), in float32 in llama.cpp
            x = ((x.astype(np.float32) * np.sqrt(np.float32(h.d))).astype(self.dtype)
                 if self.like_llama else x * np.sqrt(self.dtype.type(h.d)))
        pos = np.arange(p0, p0 + n)
        ang = {swa: rope_angles(h, pos, self.freqs, swa) for swa in {h.is_swa(i)
                                                                   for i in range(h.n_layer)}}
        mask = np.triu(np.full((n, p0 + n), -np.inf), k=p0 + 1)
        if h.window:  # a key at t is visible from p iff p - t < window (llama.cpp's is_masked_swa)
            back = pos[:, None] - np.arange(p0 + n)[None, :]
            mask_swa = np.where(back >= h.window, -np.inf, mask)
        for i in range(h.n_layer):
            b = lambda part: tensor_name(part, i)  # noqa: E731  (layer i's, by gguf_file's table)
            swa = h.is_swa(i)
            t = rms(x, self.vec(b("norm1_w")), h.eps)
            q, k, v = (self.mat(b(c), t) for c in "qkv")
            if a.qkv_bias:
                q, k, v = q + self.vec(b("bq")), k + self.vec(b("bk")), v + self.vec(b("bv"))
            q = q.reshape(n, h.n_head, h.head_dim)
            k = k.reshape(n, h.n_kv_head, h.head_dim)
            v = v.reshape(n, h.n_kv_head, h.v_dim)
            if a.qk_norm:
                q = rms(q, self.vec(b("q_norm")), h.eps)
                k = rms(k, self.vec(b("k_norm")), h.eps)
            rope(q, ang[swa], a.rope)
            rope(k, ang[swa], a.rope)
            scale = h.attn_scale
            if a.q_prescaled:  # phi3, gemma3 (like llama.cpp: in float32, before the f16 rounding)
                q = ((q.astype(np.float32) * np.float32(scale)).astype(self.dtype)
                     if self.like_llama else q * self.dtype.type(scale))
                scale = 1.0
            if self.cache16:  # the cache in f16, as llama.cpp's (and the C forward's)
                k, v = (a.astype(np.float16).astype(self.dtype) for a in (k, v))
            if self.like_llama:  # the query meets f16 keys as f16 (ggml's vec_dot_type)
                q = q.astype(np.float16).astype(self.dtype)
            self.k[i, p0:p0 + n], self.v[i, p0:p0 + n] = k, v
            K = np.repeat(self.k[i, :p0 + n], h.group, axis=1)   # (T, n_head, hd)
            V = np.repeat(self.v[i, :p0 + n], h.group, axis=1)
            if self.like_llama:
                att = flash_f16(q, K, V, scale, p0, h.window if swa else 0)
                att = att.reshape(n, h.n_head * h.v_dim)
            else:
                s = np.einsum("nhd,thd->hnt", q, K) * scale + (mask_swa if swa else mask)
                s = np.exp(s - s.max(axis=-1, keepdims=True))
                s /= s.sum(axis=-1, keepdims=True)
                att = np.einsum("hnt,thd->nhd", s, V).reshape(n, h.n_head * h.v_dim)
            o = self.mat(b("o"), att)
            if a.post_norms:
                o = rms(o, self.vec(b("post1_w")), h.eps)
            x = x + o
            t = rms(x, self.vec(b("norm2_w")), h.eps)
            g, u = self.mat(b("gate"), t), self.mat(b("up"), t)
            if a.mlp == "geglu":
                act = geglu_like_ggml(g, u).astype(self.dtype) if self.like_llama else gelu(g) * u
            else:
                act = g / (1 + np.exp(-g)) * u
            o = self.mat(b("down"), act)
            if a.post_norms:
                o = rms(o, self.vec(b("post2_w")), h.eps)
            x = x + o
        self.pos += n
        x = x if all_logits else x[-1:]
        x = rms(x, self.vec(tensor_name("out_norm_w")), h.eps)
        out = self.mat(head_name(h), x)
        if h.softcap:  # softcap * tanh(logits / softcap), in float32 steps in llama.cpp
            c = h.softcap
            out = ((np.tanh(out.astype(np.float32) * (np.float32(1) / np.float32(c)))
                    * np.float32(c)).astype(self.dtype)
                   if self.like_llama else c * np.tanh(out / c))
        return out if all_logits else out[0]


def eog_ids(tk) -> set:
    """The tokens that end a generation: the file's EOS and end-of-turn, where it names them."""
    return {t for t in (tk.eos, tk.eot) if t is not None}


def chat_prompt(mf: ModelFile, tk, messages: list) -> str:
    """The conversation as the file's ``tokenizer.chat_template`` (Jinja) writes it, ending
    where the assistant's answer begins, as the transformers library renders it."""
    template = mf.meta.get("tokenizer.chat_template")
    if not isinstance(template, str):
        raise ValueError(f"{mf.path}: the file has no tokenizer.chat_template; --chat needs one")
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ValueError(f"{mf.path}: the chat template refused the conversation: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        tpl = env.from_string(template)
        return tpl.render(messages=messages, add_generation_prompt=True,
                          bos_token=tk.tokens[tk.bos] if tk.bos is not None else "",
                          eos_token=tk.tokens[tk.eos] if tk.eos is not None else "")
    except jinja2.TemplateError as e:
        raise ValueError(f"{mf.path}: the chat template cannot be rendered ({e})") from None


class Runner:
    """A file's model and tokenizer, generating: prompt ids in, token pieces (bytes) out.
    ``model`` "c": the C forward (:meth:`smallem.generating.forward.Forward.from_gguf`, ``threads`` and
    ``context`` go to it); "reference": the numpy forward, float32."""

    def __init__(self, mf: ModelFile, threads=None, context=None, model: str = "c"):
        from smallem.generating.gguf_tokenizer import from_model_file

        if model not in ("c", "reference"):
            raise ValueError(f"model: expected 'c' or 'reference', got {model!r}")
        self.mf, self.tk = mf, from_model_file(mf)
        self.history: list = []  # the ids in the cache
        if model == "c":
            from smallem.generating.forward import Forward

            self.model = Forward.from_gguf(mf, threads=threads, context=context)
            self.context = self.model.context
        else:
            self.model = Reference(mf, np.float32)
            self.context = mf.hyper.context

    def generate(self, ids: list, tokens: int, sampler, keep_cache: bool = False):
        """Yields the bytes of each new token after ``ids`` (which continue the cache when
        ``keep_cache``), stopping at an end-of-generation token; a full context keeps its
        latest half and goes on (:func:`smallem.generating.sampling.generate`, the rule of
        chapter 4's generator too)."""
        from smallem.generating.sampling import generate

        if not keep_cache:
            self.model.reset()
            self.history = []
        if not ids:
            raise ValueError("the prompt is empty and the tokenizer adds no BOS: nothing to "
                             "continue")
        if self.model.pos + len(ids) > self.context:
            raise ValueError(f"the prompt's {len(ids)} tokens do not fit the context of "
                             f"{self.context} after {self.model.pos}")
        self.history += list(ids)

        def refill(kept):
            self.model.reset()
            return self.model.forward(kept)

        for t in generate(self.model.forward(list(ids)), self.history, tokens, sampler,
                          context=self.context, step=lambda t: self.model.forward([t]),
                          refill=refill, stop=eog_ids(self.tk)):
            yield self.tk.piece(t, special=False)
