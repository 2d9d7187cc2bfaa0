"""The same GPT written in PyTorch: an independent check and the speed yardstick.

It takes smallem's parameter dict (weights stored (in, out), as
:mod:`smallem.training.model` keeps them) and runs PyTorch's own layers on it, with
autograd for the backward pass. The tests compare loss and every gradient; the
benchmark times an eager CPU training step with ``torch.optim.AdamW``, in f32 and with
bf16 autocast.
PyTorch is optional: import this module only where torch may be missing.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def to_torch(params: dict[str, np.ndarray], dtype=torch.float32, requires_grad=True) -> dict:
    return {k: torch.tensor(np.array(v), dtype=dtype, requires_grad=requires_grad)
            for k, v in params.items()}


def _rms_norm(x, w, eps=1e-5):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def _rope(x, T):
    """Turn the feature pairs (2i, 2i+1) of x (B, H, T, hd) by t * 10000^(-2i/hd)."""
    hd = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def forward_modern(P: dict, cfg, idx, targets=None):
    """The modern block (RMSNorm, RoPE, SwiGLU, no biases), written from PyTorch's own
    operations: an independent check of smallem.training.model's."""
    idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
    B, T = idx.shape
    C, H, h = cfg.d_model, cfg.n_head, cfg.mlp_hidden
    x = P["wte"][idx]
    for i in range(cfg.n_layer):
        p = f"h{i}."
        qkv = _rms_norm(x, P[p + "ln1.w"]) @ P[p + "attn.w"]
        q, k, v = qkv.view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(_rope(q, T), _rope(k, T), v, is_causal=True)
        x = x + a.transpose(1, 2).reshape(B, T, C) @ P[p + "proj.w"]
        u = _rms_norm(x, P[p + "ln2.w"]) @ P[p + "fc.w"]
        x = x + (F.silu(u[..., :h]) * u[..., h:]) @ P[p + "fc2.w"]
    logits = _rms_norm(x, P["lnf.w"]) @ (P["wte"] if cfg.tied else P["lm_head"]).T
    if targets is None:
        return logits
    t = torch.as_tensor(np.asarray(targets), dtype=torch.long)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))


def forward(P: dict, cfg, idx, targets=None):
    """Loss (mean nats per token) or logits for ``idx`` (B, T)."""
    if getattr(cfg, "block", "gpt2") == "modern":
        return forward_modern(P, cfg, idx, targets)
    if getattr(cfg, "block", "gpt2") != "gpt2":
        raise ValueError(f"the PyTorch oracle has no {cfg.block} block")
    idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
    B, T = idx.shape
    C, H = cfg.d_model, cfg.n_head
    x = P["wte"][idx] + P["wpe"][:T]
    for i in range(cfg.n_layer):
        p = f"h{i}."
        h = F.layer_norm(x, (C,), P[p + "ln1.w"], P[p + "ln1.b"], eps=1e-5)
        qkv = h @ P[p + "attn.w"] + P[p + "attn.b"]
        q, k, v = qkv.view(B, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(B, T, C)
        x = x + a @ P[p + "proj.w"] + P[p + "proj.b"]
        h = F.layer_norm(x, (C,), P[p + "ln2.w"], P[p + "ln2.b"], eps=1e-5)
        h = F.gelu(h @ P[p + "fc.w"] + P[p + "fc.b"], approximate="tanh")
        x = x + h @ P[p + "fc2.w"] + P[p + "fc2.b"]
    x = F.layer_norm(x, (C,), P["lnf.w"], P["lnf.b"], eps=1e-5)
    logits = x @ (P["wte"] if cfg.tied else P["lm_head"]).T
    if targets is None:
        return logits
    t = torch.as_tensor(np.asarray(targets), dtype=torch.long)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), t.reshape(-1))


def loss_and_grads(params: dict, cfg, idx, targets, dtype=torch.float64):
    P = to_torch(params, dtype)
    loss = forward(P, cfg, idx, targets)
    loss.backward()
    return loss.item(), {k: v.grad.numpy() for k, v in P.items()}


class TorchTrainer:
    """An eager PyTorch training step with the same model, optimiser and clipping."""

    def __init__(self, params: dict, cfg, *, lr=3e-4, weight_decay=0.1, clip=1.0,
                 autocast=False):
        self.cfg = cfg
        self.autocast = autocast  # bf16 autocast: products in bf16, master weights f32
        self.P = to_torch(params)
        decay = [v for v in self.P.values() if v.ndim == 2]
        rest = [v for v in self.P.values() if v.ndim != 2]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                      {"params": rest, "weight_decay": 0.0}],
                                     lr=lr, betas=(0.9, 0.95), eps=1e-8)
        self.clip = clip

    def step(self, idx, targets) -> float:
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            loss = forward(self.P, self.cfg, idx, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(self.P.values()), self.clip)
        self.opt.step()
        return loss.item()


def threads(n: int):
    torch.set_num_threads(n)

