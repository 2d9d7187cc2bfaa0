"""The GPT: its shape (:class:`Config`), its buffers (:class:`Workspace`) and :class:`GPT`,
whose forward and backward walk the layers of :mod:`smallem.training.ops` through an ops object, so
that they are written once for the numpy reference and every rung of the kernel path.

No autograd: :meth:`GPT.forward` keeps every activation the backward pass needs in a
:class:`Workspace` carved once per (config, B, T) from one arena, and :meth:`GPT.backward`
walks the layers in reverse, writing gradients into one flat buffer that mirrors the flat
parameter buffer. Parameters live in one contiguous array (weights that take weight decay
first, the blocks' matrices together among them, then biases and gains), so that the
optimiser, the gradient norm and the checkpoint each see one buffer, not sixty.

Two blocks: GPT-2's (LayerNorm, learned positions, GELU MLP, biases) and the modern one
(RMSNorm, RoPE, SwiGLU, no biases), chosen by :attr:`Config.block`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from smallem.plumbing import cuda
from smallem.training import layers
from smallem.training.ops import (BACKENDS, LN_EPS, Bf16Ops, FlashOps, FusedOps, KernelOps,  # noqa: F401
                  NumpyOps, make_ops, rope_tables)

# ================================================================ the model

VOCAB = 256  # byte-level tokens
TRANSFERS = cuda.TRANSFERS  # the host transfers GPT.upload and GPT.host make on the GPU
BLOCKS = ("gpt2", "modern", "recurrent")


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
    block: str = "gpt2"  # or "modern": RMSNorm, RoPE, SwiGLU, no biases; or "recurrent":
    # the modern block with a gated linear recurrence in place of the attention (appendix D)

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
        return self.mlp_hidden * (2 if self.block != "gpt2" else 1)

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter, in storage order: decayed matrices (the blocks' ones together),
        then the rest."""
        if self.block != "gpt2":
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
        gates = self.block == "recurrent"  # one gate a head: its decay, from the token
        for i in range(self.n_layer):
            p = f"h{i}."
            shapes.update({p + "attn.w": (C, 3 * C), **({p + "gate.w": (C, self.n_head)} if gates else {}),
                           p + "proj.w": (C, C), p + "fc.w": (C, 2 * h), p + "fc2.w": (h, C)})
        for i in range(self.n_layer):
            shapes.update({f"h{i}.ln1.w": (C,), f"h{i}.ln2.w": (C,),
                           **({f"h{i}.gate.b": (self.n_head,)} if gates else {})})
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
        forward (counted over the full T x T square, as the kernels compute it). The
        recurrent block's mixer instead adds, per head and token, the state's update and its
        read (2 hd^2 multiply-adds, 4 hd^2 FLOPs) forward, three times that with the
        backward: 12 d hd a layer, whatever T (its definition's count; the chunked scan
        moves some of it into products inside a chunk).
        """
        T = self.context if T is None else T
        C, L = self.d_model, self.n_layer
        mlp = C * self.mlp_in + self.mlp_hidden * C  # weights of the MLP's products
        gates = C * self.n_head if self.block == "recurrent" else 0
        n_matmul = L * (4 * C * C + gates + mlp) + self.vocab * C
        mixer = C * self.head_dim if self.block == "recurrent" else C * T
        return 6 * n_matmul + 12 * L * mixer

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
    # and with the recurrent block (appendix D): a gated linear recurrence for the attention
    "s-recurrent": Config("s-recurrent", 128, 4, 4, 128, block="recurrent"),  # 0.84 M, 5.2 MFLOP/token
    "m-recurrent": Config("m-recurrent", 256, 6, 8, 256, block="recurrent"),  # 4.90 M, 30 MFLOP/token
    "l-recurrent": Config("l-recurrent", 384, 8, 8, 256, block="recurrent"),  # 14.3 M, 87 MFLOP/token
    "xl-recurrent": Config("xl-recurrent", 512, 8, 8, 512, block="recurrent"),  # 25.5 M, 156 MFLOP/token
}


def get_config(name_or_config) -> Config:
    if isinstance(name_or_config, Config):
        return name_or_config
    if isinstance(name_or_config, dict):
        return Config(**name_or_config)
    if name_or_config not in CONFIGS:
        raise ValueError(f"unknown config {name_or_config!r}; choose one of {', '.join(CONFIGS)}")
    return CONFIGS[name_or_config]


def gate_biases(cfg: Config) -> np.ndarray:
    """The recurrent block's gate biases at initialisation, one a head: decays whose
    half-lives spread geometrically from one token to the context, so that at the start some
    heads keep the last few tokens and others the whole sequence. A decay a with half-life
    tau (a^tau = 1/2) is sigmoid(b) for b = log(a / (1 - a))."""
    H = cfg.n_head
    tau = cfg.context ** (np.arange(H) / max(H - 1, 1))
    a = 2.0 ** (-1.0 / tau)
    return np.log(a / (1.0 - a))


class AttnCache:
    """Per-layer attention buffers: q, k, v, the output o, and the probabilities P (or, for
    the attention in tiles, only each row's log-sum-exp)."""

    def __init__(self, z, B, H, T, hd, shared, scores=True, rope=None, chunk=0):
        self.rope = rope  # (cos, sin) for the modern block's RoPE, or None
        self.q, self.k, self.v, self.o = (z(B, H, T, hd) for _ in range(4))
        self.p = z(B, H, T, T) if scores and not chunk else z(0)
        self.lse = z(B, H, T) if not chunk else z(0)
        # the recurrent block: each step's log-decay, and the state at the start of every
        # chunk of ``chunk`` steps and at the end (layers.scan_forward)
        self.chunk = chunk
        self.lam = z(B, H, T) if chunk else z(0)
        self.states = z(B * H, -(-T // chunk) + 1, hd, hd) if chunk else z(0)
        # backward scratch, shared by all layers (only one layer's backward runs at a time)
        self.do, self.dq, self.dk, self.dv, self.dp = (
            shared["do"], shared["dq"], shared["dk"], shared["dv"], shared["dp"])
        self.dlam = shared.get("dlam", z(0))  # the recurrence's: absent for attention


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
    gz: np.ndarray      # the recurrent block's gate logits, one a head (else empty)
    attn: AttnCache = field(repr=False)


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

    ``xp`` is the array module the buffers live in: numpy, or cupy for a model on the GPU
    (the ops object says which: :attr:`GPT.xp`); RoPE's tables are then made on the host and
    copied once.
    """

    def __init__(self, cfg: Config, B: int, T: int, dtype=np.float32, scores: bool = True,
                 arena: bool = True, xp=np):
        self.B, self.T, self.dtype = B, T, np.dtype(dtype)
        self.idx = xp.zeros((B, T), np.int32)
        self.targets = xp.zeros(B * T, np.int32)
        if arena:
            size = _Arena(dtype)
            self._carve(cfg, size, scores)
            raw = xp.zeros(size.used + _Arena.ALIGN // self.dtype.itemsize, dtype)
            address = raw.ctypes.data if xp is np else raw.data.ptr
            skip = -address % _Arena.ALIGN // self.dtype.itemsize
            self.arena = raw[skip:skip + size.used]  # starts on a cache line
            self._carve(cfg, _Arena(dtype, self.arena), scores)
        else:
            self.arena = None
            self._carve(cfg, lambda *s: xp.zeros(s, dtype), scores)
        if cfg.block == "modern":  # RoPE's angles, the same for every layer
            cos, sin = rope_tables(T, cfg.head_dim, dtype)
            if xp is np:
                self.rope_cos[...], self.rope_sin[...] = cos, sin
            else:
                self.rope_cos[...], self.rope_sin[...] = xp.asarray(cos), xp.asarray(sin)

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
        rec = cfg.block == "recurrent"
        chunk = self.chunk = layers.scan_chunk(hd) if rec else 0
        shared = {k: z(B, H, T, hd) for k in ("do", "dq", "dk", "dv")}
        shared["dp"] = z(B, H, T, T) if scores and not rec else z(0)  # no (T, T) buffers in tiles
        shared["dlam"] = z(B, H, T) if rec else z(0)
        self.rope_cos, self.rope_sin = (z(T, hd // 2), z(T, hd // 2)) if modern else (z(0), z(0))
        rope = (self.rope_cos, self.rope_sin) if modern else None
        self.layers = [
            _Layer(x=z(N, C), ln1=z(N, C), ln1_mean=z(N), ln1_rstd=z(N), qkv=z(N, 3 * C),
                   att=z(N, C), mid=z(N, C), ln2=z(N, C), ln2_mean=z(N), ln2_rstd=z(N),
                   u=z(N, cfg.mlp_in), g=z(N, cfg.mlp_hidden), gz=z(N, H) if rec else z(0),
                   attn=AttnCache(z, B, H, T, hd, shared, scores, rope, chunk))
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
        self.dg = z(N, cfg.mlp_hidden) if modern or rec else z(0)  # SwiGLU's output's gradient
        self.dgz = z(N, H) if rec else z(0)  # the gate logits' gradient


class GPT:
    """The model: parameters, gradients, and a forward/backward pair per backend."""

    def __init__(self, config, backend: str = "kernels", *, seed: int = 0, threads=None,
                 dtype=np.float32, arena: bool = True, pool: bool = False):
        self.config = cfg = get_config(config)
        self.dtype = np.dtype(dtype)
        if backend != "numpy" and self.dtype != np.float32:
            raise ValueError(f"backend {backend!r} is float32 only; use backend='numpy' for "
                             f"float64")
        self.ops = make_ops(backend, threads, pool)
        self.backend = backend
        # where the arrays live: numpy's memory, or the GPU's for an ops object on CuPy
        self.xp = getattr(self.ops, "xp", np)
        runs = getattr(self.ops, "blocks", BLOCKS)
        if cfg.block not in runs:
            raise ValueError(f"backend {backend!r} runs the {' and '.join(runs)} blocks, not "
                             f"{cfg.block!r} (config {cfg.name!r}): train it on a CPU backend")
        self.arena = bool(arena)  # False: a new Workspace, buffer by buffer, every forward
        self.shapes = cfg.param_shapes()
        n = cfg.n_params()
        self.flat = self.xp.zeros(n, self.dtype)
        self.grad_flat = self.xp.zeros(n, self.dtype)
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
        on_host = self.xp is np  # else: made on the host, then one copy to the device
        host = self.flat if on_host else np.zeros(self.flat.shape, self.dtype)
        for name, p in (self.params if on_host else self._views(host)).items():
            if name.endswith("gate.b"):
                p[...] = gate_biases(self.config)
            elif name.endswith((".b",)):
                p[...] = 0
            elif name.endswith(("ln1.w", "ln2.w")) or name == "lnf.w":
                p[...] = 1
            else:
                std = resid_std if name.endswith(("proj.w", "fc2.w")) else 0.02
                p[...] = rng.normal(0.0, std, p.shape)
        if not on_host:
            self.load_flat(host)

    def load_flat(self, flat):
        self.flat[...] = flat if self.xp is np else self.xp.asarray(flat, self.dtype)

    def host(self, x) -> np.ndarray:
        """``x`` (one of this model's arrays) in host memory: itself on the CPU, a copy
        from the GPU (one transfer) for a model there."""
        if self.xp is np:
            return x
        TRANSFERS["to_host"] += 1
        return self.xp.asnumpy(x)

    def upload(self, dst, src):
        """dst[...] = src, src a host array: for a model on the GPU, one copy to the device."""
        if self.xp is np:
            dst[...] = src
        else:
            TRANSFERS["to_device"] += 1
            dst[...] = self.xp.asarray(np.ascontiguousarray(src, dst.dtype))

    def workspace(self, B: int, T: int) -> Workspace:
        key = (B, T)
        scores = getattr(self.ops, "needs_scores", True)
        if not self.arena:  # the step that allocates per call: nothing is kept
            return Workspace(self.config, B, T, self.dtype, scores, arena=False, xp=self.xp)
        if key not in self._workspaces:
            self._workspaces[key] = Workspace(self.config, B, T, self.dtype, scores, xp=self.xp)
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
        self.upload(ws.idx, idx)
        P, ops, modern = self.params, self.ops, self.config.block != "gpt2"
        ops.embedding(ws.idx, P["wte"], None if modern else P["wpe"], ws.layers[0].x)
        block = {"gpt2": self._block_forward, "modern": self._modern_block_forward,
                 "recurrent": self._recurrent_block_forward}[self.config.block]
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
        self.upload(ws.targets, np.asarray(targets).reshape(-1))
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

    # --8<-- [start:recurrent_block_forward]
    def _recurrent_block_forward(self, i, L: _Layer, out):
        P, ops, ws, p = self.params, self.ops, self.ws, f"h{i}."
        ops.rmsnorm(L.x, P[p + "ln1.w"], L.ln1, L.ln1_rstd)
        ops.linear(L.ln1, P[p + "attn.w"], None, L.qkv)         # N x C x 3C
        ops.linear(L.ln1, P[p + "gate.w"], P[p + "gate.b"], L.gz)  # N x C x H: a decay a head
        ops.recurrence(L.qkv, L.gz, L.att, L.attn)              # the state carried along T
        ops.linear(L.att, P[p + "proj.w"], None, ws.tmp)        # N x C x C
        ops.add(L.x, ws.tmp, L.mid)
        ops.rmsnorm(L.mid, P[p + "ln2.w"], L.ln2, L.ln2_rstd)
        ops.linear(L.ln2, P[p + "fc.w"], None, L.u)             # N x C x 2h: [W1 | W3]
        ops.swiglu(L.u, L.g)
        ops.linear(L.g, P[p + "fc2.w"], None, ws.tmp)           # N x h x C
        ops.add(L.mid, ws.tmp, out)
    # --8<-- [end:recurrent_block_forward]

    # ------------------------------------------------------------ backward
    def backward(self):
        """Gradients of the last forward's mean loss, into :attr:`grads` (overwritten)."""
        ws = self.ws
        if ws is None:
            raise RuntimeError("backward() before forward(idx, targets)")
        P, G, ops, modern = self.params, self.grads, self.ops, self.config.block != "gpt2"
        head = "wte" if self.config.tied else "lm_head"
        # LM head: writes dwte (tied) before the embedding adds its share below.
        ops.head_backward(ws.dlogits, ws.lnf, P[head], ws.dln, G[head])
        ws.dx[...] = 0
        if modern:
            ops.rmsnorm_backward(ws.dln, ws.out, P["lnf.w"], ws.lnf_rstd, ws.dx, G["lnf.w"])
        else:
            ops.layernorm_backward(ws.dln, ws.out, P["lnf.w"], ws.lnf_mean, ws.lnf_rstd, ws.dx,
                                   G["lnf.w"], G["lnf.b"])
        block = {"gpt2": self._block_backward, "modern": self._modern_block_backward,
                 "recurrent": self._recurrent_block_backward}[self.config.block]
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

    def _swiglu_branch_backward(self, i, L: _Layer):
        """The modern and recurrent blocks' MLP branch backward, then their output
        projection's: ws.datt holds the gradient of the mixer's output on return."""
        P, G, ops, ws, p = self.params, self.grads, self.ops, self.ws, f"h{i}."
        ops.linear_backward(ws.dx, L.g, P[p + "fc2.w"], ws.dg, G[p + "fc2.w"], None)
        ops.swiglu_backward(L.u, ws.dg, ws.dh)
        ops.linear_backward(ws.dh, L.ln2, P[p + "fc.w"], ws.dln, G[p + "fc.w"], None)
        ops.rmsnorm_backward(ws.dln, L.mid, P[p + "ln2.w"], L.ln2_rstd, ws.dx, G[p + "ln2.w"])
        ops.linear_backward(ws.dx, L.att, P[p + "proj.w"], ws.datt, G[p + "proj.w"], None)

    def _modern_block_backward(self, i, L: _Layer):
        P, G, ops, ws, p = self.params, self.grads, self.ops, self.ws, f"h{i}."
        self._swiglu_branch_backward(i, L)
        ops.attention_backward(ws.datt, ws.dqkv, L.attn)
        ops.linear_backward(ws.dqkv, L.ln1, P[p + "attn.w"], ws.dln, G[p + "attn.w"], None)
        ops.rmsnorm_backward(ws.dln, L.x, P[p + "ln1.w"], L.ln1_rstd, ws.dx, G[p + "ln1.w"])

    def _recurrent_block_backward(self, i, L: _Layer):
        P, G, ops, ws, p = self.params, self.grads, self.ops, self.ws, f"h{i}."
        self._swiglu_branch_backward(i, L)
        ops.recurrence_backward(ws.datt, ws.dqkv, ws.dgz, L.attn)
        ops.linear_backward(ws.dqkv, L.ln1, P[p + "attn.w"], ws.dln, G[p + "attn.w"], None)
        ops.linear_backward(ws.dgz, L.ln1, P[p + "gate.w"], ws.dln, G[p + "gate.w"],
                            G[p + "gate.b"], accumulate=True)
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
            logits = self.host(self.forward(idx)[len(window) - 1]).astype(np.float64)
            z = logits / max(temperature, 1e-6)
            prob = np.exp(z - z.max())
            prob /= prob.sum()
            tokens.append(int(rng.choice(len(prob), p=prob)))
        return bytes(tokens[len(start):])
