"""Chapter 4 on the GPU: one sequence generated on the device (``kernels_cuda/decode.cu``).

:class:`GPUDecoder` has the CPU decoders' three calls, ``reset()``, ``prefill(tokens)`` and
``step(token)`` (the logits of the last token, a CuPy float32 (V,) array: the decoder's own
buffer, overwritten by the next call), for GPT-2's block and the modern one, with the
weights in f32 or in Q8_0 int8 blocks.

- The token step is a fixed list of launches (:meth:`GPUDecoder.launches`) that reads its
  token and position from device memory and ends by picking the next token into the token
  buffer and moving the position on, so it is captured once as a CUDA graph and replayed for
  every token: :meth:`GPUDecoder.generate_greedy` reads the tokens back once, at the end.
- The prompt is one GEMM per matrix over all its tokens (``prefill``), bf16 on the tensor
  cores through :func:`smallem.plumbing.cuda.matmul` or f32 through cuBLAS
  (:attr:`GPUDecoder.prompt_product` says which), with a causal attention over it; or token
  by token (``prefill_tokenwise``), which reads every weight once a token. An int8
  decoder's prompt multiplies by its dequantised weights, its activations unquantised.
- The int8 product takes ``__dp4a`` (four int8 products an instruction, the activation
  quantised to int8 first) or widens the weights to f32; :func:`dp4a_crossover` turns
  measured times of both into the widths where dp4a is used.

The int8 scheme with dp4a is the CPU decoder's (:class:`smallem.generating.decode.Decoder`,
"int8"): the same Q8_0 weights (:func:`smallem.generating.quant.quantize_q8`) and the same
activation blocks (scale max|x| / 127 rounded to f16, integers rounded half to even), so
greedy tokens can be compared directly. Without dp4a the activation stays f32 (int8 weights
times f32 values): the f32 decoder of the dequantised weights.
"""

from __future__ import annotations

import math

import numpy as np

from smallem.generating import quant
from smallem.generating.decode import DTYPES, _check_tokens, _with_attention
from smallem.plumbing import cuda
from smallem.training.model import GPT
from smallem.training.ops import LN_EPS, rope_tables

SOURCE = "decode"  # kernels_cuda/decode.cu
PROMPT_PRODUCTS = ("bf16", "f32")
WARPS = 2          # warps a block of the products: the smallest block with which an SM's
#                    32 resident blocks can fill its 64 warps (sm_80, sm_90)
SMEM_LIMIT = 48 * 1024  # dynamic shared memory a block gets without opting in
KERNELS = ("matvec_f32", "quantize_q8", "matvec_q8_dp4a", "matvec_q8_f32", "norm_rows",
           "embed", "rope_append", "attend", "mlp_act", "add_rows", "pick_token",
           "put_token", "advance_position")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _warps(n: int, most: int = 8) -> int:
    """Threads for a block that spreads n items over whole warps, at most ``most`` warps."""
    return 32 * max(1, min(most, _cdiv(n, 32)))


def lanes_for(chunks: int, least: int = 1) -> int:
    """Lanes a product gives one output row of ``chunks`` 16-byte chunks: the power of two
    that leaves about four chunks to a lane (four loads in flight each, a quarter of the
    shuffles of a lane a chunk, and no idle lanes on a narrow row), at most a warp, at least
    ``least``."""
    p = 1
    while 4 * p < chunks and p < 32:
        p *= 2
    return max(least, p)


class Kernels:
    """decode.cu's functions, looked up once (a lookup reads the source: never inside a
    capture) and launched by name."""

    def __init__(self):
        self.f = {name: cuda.kernel(SOURCE, name) for name in KERNELS}

    def __call__(self, name, grid, block, args, smem: int = 0):
        self.f[name](tuple(int(g) for g in grid), tuple(int(b) for b in block), tuple(args),
                     shared_mem=int(smem))

    def run(self, launches):
        for launch in launches:
            self(*launch)


_I = np.int32  # every int parameter of decode.cu is 32-bit


# ================================================================ one matrix

class DeviceMatrix:
    """One weight matrix W (K, N) (y = x W, as the model stores it) on the device, in the
    layout the one-row products read: its transpose, N rows of K (an output's weights
    contiguous), f32, or Q8_0 (N rows of K32 int8, K rounded up to 32 with zeros, and N rows of
    K32 / 32 float16 scales as uint16 bits). ``dp4a`` (int8 only) picks the dp4a product.
    ``prompt``: "bf16" or "f32" adds the (N, K) copy the prompt's GEMM reads (bf16 bits or f32;
    int8 weights dequantised, so that the prompt multiplies by the same weights)."""

    def __init__(self, w, dtype: str = "f32", bias=None, dp4a: bool = False,
                 prompt: str | None = None):
        cp = cuda.require()
        w = np.asarray(w, np.float32)
        if w.ndim != 2 or 0 in w.shape:
            raise ValueError(f"w: expected a non-empty (K, N) matrix, got shape {w.shape}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        self.K, self.N = w.shape
        self.kind, self.dp4a = dtype, bool(dp4a) and dtype == "int8"
        self.bias = None
        if bias is not None:
            bias = np.ascontiguousarray(bias, np.float32)
            if bias.shape != (self.N,):
                raise ValueError(f"bias: expected shape ({self.N},), got {bias.shape}")
            self.bias = cp.asarray(bias)
        if dtype == "f32":
            plain = np.ascontiguousarray(w.T)
            self.w = cp.asarray(plain)
            self.q = self.s = None
            self.K32 = self.K
            self.lanes = lanes_for(self.K // 4 if self.K % 4 == 0 else self.K)
            self.nbytes = plain.nbytes
        else:
            q, s = quant.quantize_q8(w)                 # (K32, N) int8, (K32 / 32, N) f16
            self.K32 = q.shape[0]
            self.w = None
            self.q = cp.asarray(np.ascontiguousarray(q.T))
            self.s = cp.asarray(np.ascontiguousarray(s.T).view(np.uint16))
            plain = quant.dequantize_q8(q, s, self.K, np.float32).T
            # a pair of lanes shares a block of 32 (16 bytes each): at least two lanes a row
            self.lanes = lanes_for(self.K32 // 16, least=2)
            self.nbytes = q.nbytes + s.nbytes
        self.prompt = None
        if prompt == "bf16":
            self.prompt = cp.asarray(cuda.bf16_bits(np.ascontiguousarray(plain)))
        elif prompt == "f32":
            self.prompt = self.w if self.w is not None else cp.asarray(np.ascontiguousarray(plain))
        elif prompt is not None:
            raise ValueError(f"prompt: expected None or one of {PROMPT_PRODUCTS}, got {prompt!r}")

    def launches(self, x, y, accumulate: bool = False, xq=None, xs=None) -> list:
        """The launches of y (N) = x (K) W (+ bias), or y += with ``accumulate``; the dp4a
        product first quantises x into ``xq`` (K32 int8) and ``xs`` (K32 / 32 f32)."""
        rows = 32 // self.lanes
        warps = _cdiv(self.N, rows)
        per = min(WARPS, warps)
        grid, block, acc = (_cdiv(warps, per),), (32 * per,), _I(accumulate)
        if self.kind == "f32":
            return [("matvec_f32", grid, block, (self.w, x, self.bias, y, _I(self.K), _I(self.N),
                                                 _I(self.lanes), acc))]
        if not self.dp4a:
            return [("matvec_q8_f32", grid, block, (self.q, self.s, x, self.bias, y, _I(self.K),
                                                    _I(self.K32), _I(self.N), _I(self.lanes), acc))]
        blocks = self.K32 // quant.QBLOCK
        qper = min(8, blocks)
        return [("quantize_q8", (_cdiv(blocks, qper),), (32 * qper,), (x, _I(self.K), xq, xs)),
                ("matvec_q8_dp4a", grid, block, (self.q, self.s, xq, xs, self.bias, y,
                                                 _I(self.K32), _I(self.N), _I(self.lanes), acc))]


def product(mat: DeviceMatrix, x, y=None, accumulate: bool = False):
    """y = x W (+ bias) for one device row x (float32, K): the decoder's product, on its own
    (for tests and timing). Returns y (a new array unless given)."""
    cp = cuda.require()
    if not isinstance(mat, DeviceMatrix):
        raise TypeError(f"mat: expected a DeviceMatrix, got {type(mat).__name__}")
    cuda.array(x, "x", np.float32, shape=(mat.K,))
    if y is None:
        if accumulate:
            raise ValueError("accumulate=True adds into y: pass y")
        y = cp.empty(mat.N, dtype=cp.float32)
    else:
        cuda.array(y, "y", np.float32, shape=(mat.N,))
    xq = xs = None
    if mat.dp4a:
        xq = cp.empty(mat.K32, dtype=np.int8)
        xs = cp.empty(mat.K32 // quant.QBLOCK, dtype=cp.float32)
    Kernels().run(mat.launches(x, y, accumulate, xq, xs))
    return y


def int8_product_case(K: int, N: int, dp4a: bool, seed: int = 0):
    """A callable that runs one int8 product y = x W of a random (K, N) matrix on the device,
    with dp4a (the activation's quantisation included: it is part of the product's cost) or
    without; for timing the two against each other."""
    cp = cuda.require()
    K, N = (int(v) for v in (K, N))
    for v, name in ((K, "K"), (N, "N")):
        if v < 1:
            raise ValueError(f"{name}: expected a positive width, got {v}")
    rng = np.random.default_rng(seed)
    mat = DeviceMatrix(rng.standard_normal((K, N)).astype(np.float32) / math.sqrt(K), "int8",
                       dp4a=dp4a)
    x = cp.asarray(rng.standard_normal(K).astype(np.float32))
    y = cp.empty(N, dtype=cp.float32)
    xq = cp.empty(mat.K32, dtype=np.int8)
    xs = cp.empty(mat.K32 // quant.QBLOCK, dtype=cp.float32)
    kernels, launches = Kernels(), mat.launches(x, y, False, xq, xs)
    return lambda: kernels.run(launches)


def dp4a_crossover(widths, measure) -> dict[int, bool]:
    """Whether the dp4a product is used at each layer width: ``measure(width, dp4a)`` gives the
    seconds of one int8 product at that width with (True) and without (False) dp4a; dp4a is
    used where it measured faster. On a narrow layer the instructions limit the product and
    dp4a does four multiply-adds in one; on the widest the memory does, and it gains nothing."""
    table = {}
    for w in widths:
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 1:
            raise ValueError(f"widths: expected positive ints, got {w!r}")
        with_, without = float(measure(int(w), True)), float(measure(int(w), False))
        table[int(w)] = with_ < without
    if not table:
        raise ValueError("widths: expected at least one width")
    return table


def uses_dp4a(table: dict | None, width: int) -> bool:
    """The decision of ``table`` (:func:`dp4a_crossover`) at ``width``: the nearest measured
    width's, on a log scale; no table: dp4a everywhere."""
    if not table:
        return True
    near = min(table, key=lambda w: (abs(math.log(w) - math.log(width)), w))
    return bool(table[near])


def time_product(fn, repeats: int = 20) -> float:
    """Seconds of one ``fn()`` on the device, from CUDA events around ``repeats`` calls."""
    cp = cuda.require()
    fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / repeats


def measured_crossover(widths, repeats: int = 20) -> dict[int, bool]:
    """:func:`dp4a_crossover` measured here, on square layers of each width."""
    return dp4a_crossover(widths, lambda w, d: time_product(int8_product_case(w, w, d), repeats))


# ================================================================ sampling on the host too

def _mix32(h):
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x7FEB352D)
    h = h ^ (h >> np.uint32(15))
    h = h * np.uint32(0x846CA68B)
    return h ^ (h >> np.uint32(16))


def gumbel_noise(seed: int, position: int, vocab: int) -> np.ndarray:
    """The Gumbel noise pick_token adds at ``position`` (float64 here, float32 there): the
    same counter-based hash of (seed, position, token), so a test can follow a draw."""
    with np.errstate(over="ignore"):
        i = np.arange(vocab, dtype=np.uint32)
        s = _mix32(np.uint32((seed + 0x165667B1) & 0xFFFFFFFF))
        p = _mix32(np.uint32((position * 0x85EBCA77) & 0xFFFFFFFF) ^ s)
        bits = _mix32(i * np.uint32(0x9E3779B9) ^ p)
    u = ((bits >> np.uint32(8)).astype(np.float64) + 0.5) * 2.0**-24
    return -np.log(-np.log(u))


# ================================================================ the decoder

class _Layer:
    """One block's weights on the device."""

    def __init__(self, model: GPT, i: int, dtype: str, dp4a, prompt: str):
        cp, P, c = cuda.require(), model.params, model.config
        n, gpt2 = f"h{i}.", c.block == "gpt2"
        vec = lambda name: cp.asarray(np.ascontiguousarray(P[n + name], np.float32))  # noqa: E731
        bias = (lambda name: P[n + name]) if gpt2 else (lambda name: None)  # noqa: E731
        self.ln1_w, self.ln2_w = vec("ln1.w"), vec("ln2.w")
        self.ln1_b, self.ln2_b = (vec("ln1.b"), vec("ln2.b")) if gpt2 else (None, None)
        mat = lambda name: DeviceMatrix(P[n + name + ".w"], dtype, bias(name + ".b"),  # noqa: E731
                                        dp4a(P[n + name + ".w"].shape[0]), prompt)
        self.qkv, self.proj, self.fc, self.fc2 = mat("attn"), mat("proj"), mat("fc"), mat("fc2")

    def matrices(self):
        return (self.qkv, self.proj, self.fc, self.fc2)


class GPUDecoder:
    """Chapter 4's decoder on the GPU: ``reset()``, ``prefill(tokens)``, ``step(token)`` (the
    logits, a CuPy float32 (V,) array, the decoder's own buffer), and
    :meth:`generate_greedy` / :meth:`generate`, which keep the tokens on the device.

    ``dtype`` "f32" or "int8" (the blocks' matrices and the head; embeddings, norms, biases
    and the KV cache stay f32). ``dp4a`` (int8): True or False for every product, or "auto":
    by ``dp4a_table`` (:func:`dp4a_crossover`, measured on this GPU) at each product's input
    width, dp4a everywhere without a table. ``graph``: the token step replayed as one captured
    CUDA graph (else launched kernel by kernel). ``prompt``: how the prompt's GEMMs multiply,
    "bf16" (:func:`smallem.plumbing.cuda.matmul` on bf16 bits: the tensor cores) or "f32"
    (``cupy.matmul``: cuBLAS). The weights are copied to the device when the decoder is made.
    """

    def __init__(self, model: GPT, dtype: str = "f32", dp4a="auto", graph: bool = True,
                 prompt: str = "bf16", dp4a_table: dict | None = None):
        if not isinstance(model, GPT):
            raise TypeError(f"model: expected a smallem GPT, got {type(model).__name__}")
        c = model.config
        _with_attention(model, "the GPU decoder's KV cache")
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        if not (dp4a is True or dp4a is False or isinstance(dp4a, str) and dp4a == "auto"):
            raise ValueError(f"dp4a: expected 'auto', True or False, got {dp4a!r}")
        if dp4a_table is not None and dp4a != "auto":
            raise ValueError("dp4a_table: read only with dp4a='auto'")
        if prompt not in PROMPT_PRODUCTS:
            raise ValueError(f"prompt: expected one of {PROMPT_PRODUCTS}, got {prompt!r}")
        cp = cuda.require()
        self.model, self.config, self.dtype, self.graph = model, c, dtype, bool(graph)
        self.prompt_product = prompt
        self.dp4a_table = dict(dp4a_table) if dp4a_table else None
        choose = (lambda K: uses_dp4a(self.dp4a_table, K)) if dp4a == "auto" else (lambda K: dp4a)
        self.dp4a = dp4a
        P, d, H, hd = model.params, c.d_model, c.n_head, c.head_dim
        self.modern = c.block == "modern"
        self.kernels = Kernels()
        dev = lambda a: cp.asarray(np.ascontiguousarray(a, np.float32))  # noqa: E731
        self.wte = dev(P["wte"])
        self.wpe = None if self.modern else dev(P["wpe"])
        self.layers = [_Layer(model, i, dtype, choose, prompt) for i in range(c.n_layer)]
        self.lnf_w = dev(P["lnf.w"])
        self.lnf_b = None if self.modern else dev(P["lnf.b"])
        head = P["wte"] if c.tied else P["lm_head"]
        self.head = DeviceMatrix(np.asarray(head).T, dtype, dp4a=choose(d))
        self.cos = self.sin = None
        if self.modern:
            cos, sin = rope_tables(c.context, hd)
            self.cos, self.sin = dev(cos), dev(sin)
        # the cache, and the step's buffers: made once, so that a captured graph's pointers
        # stay valid for every replay
        shape = (c.n_layer, H, c.context, hd)
        self.kc, self.vc = cp.zeros(shape, dtype=cp.float32), cp.zeros(shape, dtype=cp.float32)
        self.state = cp.zeros(4, dtype=cp.int32)        # [0]: the position
        self.tokens = cp.zeros(c.context + 1, dtype=cp.int32)  # the token at each position
        widest = max(d, c.mlp_hidden)
        self.x, self.h = cp.zeros(d, dtype=cp.float32), cp.zeros(d, dtype=cp.float32)
        self.qkv, self.att = cp.zeros(3 * d, dtype=cp.float32), cp.zeros(d, dtype=cp.float32)
        self.u = cp.zeros(c.mlp_in, dtype=cp.float32)
        self.g = cp.zeros(c.mlp_hidden, dtype=cp.float32)
        self.logits = cp.zeros(c.vocab, dtype=cp.float32)
        k32 = _cdiv(widest, quant.QBLOCK) * quant.QBLOCK
        self.xq = cp.zeros(k32, dtype=np.int8)
        self.xs = cp.zeros(k32 // quant.QBLOCK, dtype=cp.float32)
        # the attention: a thread a position for the scores, at least a thread a feature for
        # the values; 256 at most (its launch bounds)
        if hd > 256:
            raise ValueError(f"head size {hd}: the attention kernel takes at most 256")
        self.attn_threads = max(_cdiv(hd, 32) * 32, _warps(_cdiv(c.context, 8)))
        self.attn_smem = 4 * ((hd + 3) // 4 * 4 + c.context + self.attn_threads)
        if self.attn_smem > SMEM_LIMIT:
            raise ValueError(f"context {c.context}: the attention's scores need "
                             f"{self.attn_smem} bytes of shared memory, over {SMEM_LIMIT}")
        self._step = self.launches(1, self.x, self.h, self.qkv, self.att, self.u, self.g)
        self._graphs: dict = {}
        self._capture_stream = None
        self.pos = 0

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one token step reads (the blocks' matrices and the head)."""
        return sum(m.nbytes for L in self.layers for m in L.matrices()) + self.head.nbytes

    # ------------------------------------------------------------ the launches
    def _norm(self, x, w, b, y, rows: int):
        return ("norm_rows", (rows,), (_warps(self.config.d_model // 4),),
                (x, w, b, y, _I(self.config.d_model), np.float32(LN_EPS), _I(self.modern)))

    def launches(self, rows: int, x, h, qkv, att, u, g) -> list:
        """The launches of ``rows`` tokens from position state[0] through every block (x: rows
        x d, the residual stream; h, qkv, att, u, g: its scratch), then the final norm and the
        head of one row into ``self.logits``: with rows = 1, the token step. The products
        take one row; a prompt (:meth:`prefill`) runs the other launches between GEMMs."""
        c = self.config
        d, H, hd = c.d_model, c.n_head, c.head_dim
        out = [("embed", (rows,), (_warps(d),),
                (self.wte, self.wpe, self.tokens, self.state, x, _I(d), _I(c.vocab),
                 _I(c.context)))]
        for i, L in enumerate(self.layers):
            out += [self._norm(x, L.ln1_w, L.ln1_b, h, rows)]
            out += L.qkv.launches(h, qkv, False, self.xq, self.xs)
            out += [("rope_append", (rows,), (_warps(H * _cdiv(hd, 2)),),
                     (qkv, _I(3 * d), self.cos, self.sin, self.kc[i], self.vc[i], self.state,
                      _I(H), _I(hd), _I(c.context))),
                    ("attend", (H, rows), (self.attn_threads,),
                     (qkv, _I(3 * d), self.kc[i], self.vc[i], att, _I(d), self.state, _I(hd),
                      _I(c.context), np.float32(1.0 / math.sqrt(hd))), self.attn_smem)]
            out += L.proj.launches(att, x, True, self.xq, self.xs)
            out += [self._norm(x, L.ln2_w, L.ln2_b, h, rows)]
            out += L.fc.launches(h, u, False, self.xq, self.xs)
            n = rows * c.mlp_hidden
            out += [("mlp_act", (min(_cdiv(n, 256), 1024),), (_warps(n),),
                     (u, g, _I(c.mlp_hidden), _I(rows), _I(self.modern)))]
            out += L.fc2.launches(g, x, True, self.xq, self.xs)
        out += [self._norm(x, self.lnf_w, self.lnf_b, h, rows)]
        out += self.head.launches(h, self.logits, False, self.xq, self.xs)
        return out

    def _pick(self, temperature: float, seed: int, advance: bool):
        V = self.config.vocab
        return ("pick_token", (1,), (_warps(_cdiv(V, 8), 32),),
                (self.logits, _I(V), np.float32(temperature), np.uint32(seed & 0xFFFFFFFF),
                 self.state, self.tokens, _I(self.config.context + 1), _I(advance)))

    def _token_step(self, temperature: float = 0.0, seed: int = 0):
        """One token: the step's launches and the pick of the next token (which moves the
        position on), replayed from a graph captured on first use, or launched one by one."""
        if not self.graph:
            self.kernels.run(self._step + [self._pick(temperature, seed, True)])
            return
        key = (float(temperature), int(seed))
        graph = self._graphs.get(key)
        if graph is None:
            cp = cuda.require()
            if self._capture_stream is None:  # capture needs a stream other than the default
                self._capture_stream = cp.cuda.Stream(non_blocking=True)
            s = self._capture_stream
            with s:
                s.begin_capture()
                try:
                    self.kernels.run(self._step + [self._pick(temperature, seed, True)])
                finally:
                    graph = s.end_capture()
            if len(self._graphs) >= 8:
                self._graphs.clear()
            self._graphs[key] = graph
        graph.launch(cuda.require().cuda.get_current_stream())

    # ------------------------------------------------------------ the three calls
    def reset(self):
        self.state.fill(0)
        self.pos = 0

    def step(self, token: int):
        """The logits after ``token`` at the current position (the token enters the device's
        token buffer as a kernel argument)."""
        c = self.config
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
            raise TypeError(f"token: expected an int, got {type(token).__name__}")
        _check_tokens([token], c.vocab, self.pos, c.context)
        self.kernels("put_token", (1,), (32,), (self.state, self.tokens, _I(token),
                                                _I(c.context + 1)))
        self._token_step()
        self.pos += 1
        return self.logits

    def prefill_tokenwise(self, tokens):
        """The prompt token by token (every weight read once a token): the logits of the last."""
        t = _check_tokens(tokens, self.config.vocab, self.pos, self.config.context)
        for tok in t:
            self.step(int(tok))
        return self.logits

    def prefill(self, tokens):
        """The prompt's logits (of its last token), the prompt as one GEMM per matrix over all
        its tokens (:attr:`prompt_product`) and a causal attention over it, filling the cache."""
        c = self.config
        t = _check_tokens(tokens, c.vocab, self.pos, c.context)
        if t.size == 1:
            return self.step(int(t[0]))
        cp, n, p0, d = cuda.require(), t.size, self.pos, c.d_model
        self.tokens[p0:p0 + n] = cp.asarray(t)  # the one copy to the device
        new = lambda *shape: cp.empty(shape, dtype=cp.float32)  # noqa: E731
        x, h, tmp = new(n, d), new(n, d), new(n, d)
        qkv, att, u, g = new(n, 3 * d), new(n, d), new(n, c.mlp_in), new(n, c.mlp_hidden)
        steps = iter(self.launches(n, x, h, qkv, att, u, g))
        run = self.kernels
        run(*next(steps))                                   # embed
        for L in self.layers:
            run(*next(steps))                               # norm 1
            self._skip(steps, L.qkv)
            self._gemm(h, L.qkv, qkv, None)
            run(*next(steps))                               # rope, append to the cache
            run(*next(steps))                               # attention
            self._skip(steps, L.proj)
            self._gemm(att, L.proj, tmp, x)
            run(*next(steps))                               # norm 2
            self._skip(steps, L.fc)
            self._gemm(h, L.fc, u, None)
            run(*next(steps))                               # GELU / SwiGLU
            self._skip(steps, L.fc2)
            self._gemm(g, L.fc2, tmp, x)
        # the last row alone through the final norm and the head (the step's own launches)
        last = self._norm(x[n - 1], self.lnf_w, self.lnf_b, self.h, 1)
        run(*last)
        run.run(self.head.launches(self.h, self.logits, False, self.xq, self.xs))
        run("advance_position", (1,), (32,), (self.state, _I(n)))
        self.pos += n
        return self.logits

    @staticmethod
    def _skip(steps, mat: DeviceMatrix):
        for _ in range(2 if mat.dp4a else 1):
            next(steps)

    def _gemm(self, a, mat: DeviceMatrix, out, residual):
        """out = a W (+ bias), added into ``residual`` if given (then out is scratch)."""
        cp = cuda.require()
        if self.prompt_product == "bf16":
            cuda.matmul(cuda.to_bf16(a), mat.prompt, trans_b=True, out=out)
        else:
            cp.matmul(a, mat.prompt.T, out=out)
        rows, n = out.shape
        dst, src = (out, None) if residual is None else (residual, out)
        if src is not None or mat.bias is not None:
            self.kernels("add_rows", (min(_cdiv(rows * n, 256), 1024),), (_warps(rows * n),),
                         (dst, src, mat.bias, _I(rows), _I(n)))

    # ------------------------------------------------------------ many tokens
    def generate(self, prompt_tokens, n: int, temperature: float = 0.0, seed: int = 0) -> list[int]:
        """``n`` tokens after ``prompt_tokens``, from position 0: the prompt's GEMMs, then the
        token step n - 1 times (a graph replayed, or launched), each picking its successor on
        the device (argmax at temperature 0, else a Gumbel-max draw seeded by (seed,
        position)); the tokens come back in one copy at the end."""
        c = self.config
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"n: expected an int >= 0, got {n!r}")
        temperature = float(temperature)
        if not temperature >= 0 or math.isinf(temperature):
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
        t = _check_tokens(prompt_tokens, c.vocab, 0, c.context)
        if t.size + n - 1 > c.context:
            raise ValueError(f"a prompt of {t.size} and {n} new tokens do not fit the context "
                             f"of {c.context} (the last token needs no place in the cache)")
        if n == 0:
            return []
        self.reset()
        self.prefill(t)
        self.kernels(*self._pick(temperature, seed, False))
        for _ in range(n - 1):
            self._token_step(temperature, seed)
        self.pos += n - 1
        return [int(v) for v in cuda.require().asnumpy(self.tokens[t.size:t.size + n])]

    def generate_greedy(self, prompt_tokens, n: int) -> list[int]:
        """:meth:`generate` at temperature 0: the argmax at every step."""
        return self.generate(prompt_tokens, n, 0.0)
