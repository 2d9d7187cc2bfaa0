"""A GPT-2-style transformer with hand-written forward and backward passes.

No autograd: :meth:`GPT.forward` keeps every activation the backward pass
needs in a :class:`Workspace` allocated once per (config, B, T), and
:meth:`GPT.backward` walks the layers in reverse, writing gradients into one
flat buffer that mirrors the flat parameter buffer. The layer arithmetic lives
in :mod:`smallem.layers`; ``backend="numpy"`` runs the numpy reference,
``backend="kernels"`` runs chapter 2's GEMM and ``kernels_c/layers.c``.

Parameters live in one contiguous float32 array (weights that take weight
decay first, then biases and LayerNorm gains), so that the optimiser, the
gradient norm and the checkpoint each see one buffer, not sixty.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .layers import make_ops

VOCAB = 256  # byte-level tokens


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

    def __post_init__(self):
        for k in ("d_model", "n_layer", "n_head", "context", "vocab"):
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"config {self.name!r}: {k} must be a positive int, got {v!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"config {self.name!r}: n_head={self.n_head} does not divide "
                             f"d_model={self.d_model} (each head gets d_model/n_head features)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter, in storage order: decayed matrices, then the rest."""
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
        n_matmul = L * 12 * C * C + self.vocab * C
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
    """Per-layer attention buffers: q, k, v and the probabilities P."""

    def __init__(self, B, H, T, hd, dtype, shared):
        self.q, self.k, self.v, self.o = (np.zeros((B, H, T, hd), dtype) for _ in range(4))
        self.p = np.zeros((B, H, T, T), dtype)
        # backward scratch, shared by all layers (only one layer's backward runs at a time)
        self.do, self.dq, self.dk, self.dv, self.dp = (
            shared["do"], shared["dq"], shared["dk"], shared["dv"], shared["dp"])
        # one (T, hd) or (T, T) view per (sequence, head), made once: the GEMM loop's operands
        for name in ("q", "k", "v", "o", "p", "do", "dq", "dk", "dv", "dp"):
            a = getattr(self, name)
            setattr(self, name + "_", list(a.reshape(B * H, *a.shape[2:])))


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


class Workspace:
    """Every activation and gradient buffer one (config, B, T) step needs, allocated once.

    For the xl config at B=4, T=512 this is about 0.9 GB: per layer twenty
    (B*T, d) tensors of 4 MiB and the attention probabilities, B*H*T*T floats
    = 32 MiB.
    """

    def __init__(self, cfg: Config, B: int, T: int, dtype=np.float32):
        N, C, H, hd = B * T, cfg.d_model, cfg.n_head, cfg.head_dim
        z = lambda *s: np.zeros(s, dtype)  # noqa: E731
        self.B, self.T, self.dtype = B, T, np.dtype(dtype)
        self.idx = np.zeros((B, T), np.int32)
        self.targets = np.zeros(N, np.int32)
        shared = {k: z(B, H, T, hd) for k in ("do", "dq", "dk", "dv")}
        shared["dp"] = z(B, H, T, T)
        self.layers = [
            _Layer(x=z(N, C), ln1=z(N, C), ln1_mean=z(N), ln1_rstd=z(N), qkv=z(N, 3 * C),
                   att=z(N, C), mid=z(N, C), ln2=z(N, C), ln2_mean=z(N), ln2_rstd=z(N),
                   u=z(N, 4 * C), g=z(N, 4 * C), attn=_Attn(B, H, T, hd, dtype, shared))
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
        self.dh = z(N, 4 * C)


class GPT:
    """The model: parameters, gradients, and a forward/backward pair per backend."""

    def __init__(self, config, backend: str = "kernels", *, seed: int = 0, threads=None,
                 dtype=np.float32):
        self.config = cfg = get_config(config)
        self.dtype = np.dtype(dtype)
        if backend == "kernels" and self.dtype != np.float32:
            raise ValueError("backend 'kernels' is float32 only; use backend='numpy' for float64")
        self.ops = make_ops(backend, threads)
        self.backend = backend
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
        if key not in self._workspaces:
            self._workspaces[key] = Workspace(self.config, B, T, self.dtype)
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
        P, ops = self.params, self.ops
        ops.embedding(ws.idx, P["wte"], P["wpe"], ws.layers[0].x)
        for i, L in enumerate(ws.layers):
            nxt = ws.layers[i + 1].x if i + 1 < len(ws.layers) else ws.out
            self._block_forward(i, L, nxt)
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
        ops.linear(L.att, P[p + "proj.w"], P[p + "proj.b"], ws.tmp)       # N x C x C
        ops.add(L.x, ws.tmp, L.mid)
        ops.layernorm(L.mid, P[p + "ln2.w"], P[p + "ln2.b"], L.ln2, L.ln2_mean, L.ln2_rstd)
        ops.linear(L.ln2, P[p + "fc.w"], P[p + "fc.b"], L.u)              # N x C x 4C
        ops.gelu(L.u, L.g)
        ops.linear(L.g, P[p + "fc2.w"], P[p + "fc2.b"], ws.tmp)           # N x 4C x C
        ops.add(L.mid, ws.tmp, out)
    # --8<-- [end:block_forward]

    # ------------------------------------------------------------ backward
    def backward(self):
        """Gradients of the last forward's mean loss, into :attr:`grads` (overwritten)."""
        ws = self.ws
        if ws is None:
            raise RuntimeError("backward() before forward(idx, targets)")
        P, G, ops = self.params, self.grads, self.ops
        head = "wte" if self.config.tied else "lm_head"
        # LM head: writes dwte (tied) before the embedding adds its share below.
        ops.head_backward(ws.dlogits, ws.lnf, P[head], ws.dln, G[head])
        ws.dx[...] = 0
        ops.layernorm_backward(ws.dln, ws.out, P["lnf.w"], ws.lnf_mean, ws.lnf_rstd, ws.dx,
                               G["lnf.w"], G["lnf.b"])
        for i in reversed(range(self.config.n_layer)):
            self._block_backward(i, ws.layers[i])
        if not self.config.tied:
            G["wte"][...] = 0
        ops.embedding_backward(ws.idx, ws.dx, G["wte"], G["wpe"])
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
        ops.gelu_backward(L.u, ws.dh, ws.dh)
        ops.linear_backward(ws.dh, L.ln2, P[p + "fc.w"], ws.dln, G[p + "fc.w"], G[p + "fc.b"])
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
