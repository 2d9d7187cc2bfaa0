"""PyTorch beside us: the same model decoding with a KV cache in eager PyTorch, its
matrices as ``nn.Linear`` in f32, or through ``quantize_dynamic`` (int8 weights, one scale
per tensor, activations quantised per call). A peer, never a dependency: without torch,
:class:`Decoder` raises ImportError and the chapter says so.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

KINDS = ("torch-f32", "torch-int8")


def version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


class Decoder:
    """``reset``, ``prefill`` and ``step`` as :mod:`smallem.generating.decode`'s decoders."""

    def __init__(self, model, kind: str = "torch-f32", threads: int = 1):
        import torch
        from torch import nn

        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
        torch.set_num_threads(int(threads))
        self.torch, self.config, self.kind = torch, model.config, kind
        c, P = model.config, model.params
        self.modern = c.block == "modern"
        t = lambda a: torch.from_numpy(np.ascontiguousarray(a, np.float32))  # noqa: E731

        def linear(w, b=None):  # ours is (in, out); nn.Linear keeps (out, in)
            lin = nn.Linear(w.shape[0], w.shape[1], bias=b is not None)
            with torch.no_grad():
                lin.weight.copy_(t(w.T))
                if b is not None:
                    lin.bias.copy_(t(b))
            return lin

        mods = nn.ModuleDict()
        self.norms = []
        for i in range(c.n_layer):
            n = f"h{i}."
            bias = (lambda name: None) if self.modern else (lambda name: P[n + name + ".b"])
            for name in ("attn", "proj", "fc", "fc2"):
                mods[f"{name}{i}"] = linear(P[n + name + ".w"], bias(name))
            self.norms.append([t(P[n + "ln1.w"]), None if self.modern else t(P[n + "ln1.b"]),
                               t(P[n + "ln2.w"]), None if self.modern else t(P[n + "ln2.b"])])
        mods["head"] = linear((P["wte"] if c.tied else P["lm_head"]).T)
        if kind == "torch-int8":
            from torch.ao.quantization import quantize_dynamic
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the quantized-tensor API's deprecation notice
                mods = quantize_dynamic(mods, {nn.Linear}, dtype=torch.qint8)
        self.mods = mods
        self.wte, self.wpe = t(P["wte"]), None if self.modern else t(P["wpe"])
        self.lnf = (t(P["lnf.w"]), None if self.modern else t(P["lnf.b"]))
        if self.modern:
            from smallem.training.ops import rope_tables
            cos, sin = rope_tables(c.context, c.head_dim)
            self.cos, self.sin = t(cos), t(sin)
        shape = (c.n_layer, c.n_head, c.context, c.head_dim)
        self.k, self.v = torch.zeros(shape), torch.zeros(shape)
        self.pos = 0

    def reset(self):
        self.pos = 0

    def prefill(self, tokens):
        for tok in tokens:
            logits = self.step(int(tok))
        return logits

    def _norm(self, x, w, b):
        F = self.torch.nn.functional
        if b is None:
            return x * self.torch.rsqrt((x * x).mean() + 1e-5) * w
        return F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)

    def _rope(self, x, p):
        a, b = x[:, 0::2], x[:, 1::2]
        c, s = self.cos[p], self.sin[p]
        return self.torch.stack([a * c - b * s, a * s + b * c], dim=-1).reshape(x.shape)

    def step(self, token: int) -> np.ndarray:
        torch, c, p = self.torch, self.config, self.pos
        F = torch.nn.functional
        H, hd, d = c.n_head, c.head_dim, c.d_model
        with torch.inference_mode():
            x = self.wte[token] + (0 if self.wpe is None else self.wpe[p])
            for i, (w1, b1, w2, b2) in enumerate(self.norms):
                qkv = self.mods[f"attn{i}"](self._norm(x, w1, b1)[None])[0]
                q, k, v = (qkv[j * d:(j + 1) * d].view(H, hd) for j in range(3))
                if self.modern:
                    q, k = self._rope(q, p), self._rope(k, p)
                self.k[i, :, p], self.v[i, :, p] = k, v
                s = torch.einsum("hd,htd->ht", q, self.k[i, :, :p + 1]) / math.sqrt(hd)
                o = torch.einsum("ht,htd->hd", s.softmax(-1), self.v[i, :, :p + 1])
                x = x + self.mods[f"proj{i}"](o.reshape(1, d))[0]
                u = self.mods[f"fc{i}"](self._norm(x, w2, b2)[None])[0]
                if self.modern:
                    h = c.mlp_hidden
                    g = F.silu(u[:h]) * u[h:]
                else:
                    g = F.gelu(u, approximate="tanh")
                x = x + self.mods[f"fc2{i}"](g[None])[0]
            logits = self.mods["head"](self._norm(x, *self.lnf)[None])[0]
        self.pos = p + 1
        return logits.numpy()


def time_decode(config: str, threads: int, prompt: list[int], feed: list[int],
                rounds: int, pause: float) -> dict:
    """{kind: [seconds per token, one per round]} for both kinds, in turn each round, on
    the model ``GPT(config, seed=0)`` that chapter 4's ladder decodes."""
    import time

    from smallem.training.model import GPT

    model = GPT(config, "kernels", seed=0)
    decs = {k: Decoder(model, k, threads) for k in KINDS}
    out = {k: [] for k in KINDS}
    for _ in range(rounds):
        for k, dec in decs.items():
            time.sleep(pause)
            dec.reset()
            dec.prefill(prompt)
            t0 = time.perf_counter()
            for tok in feed:
                dec.step(tok)
            out[k].append((time.perf_counter() - t0) / len(feed))
    return out


def measure_in_child(config: str, threads: int, prompt, feed, rounds: int, pause: float) -> dict:
    """:func:`time_decode` in a process of its own: PyTorch's OpenMP threads, once started,
    slow every fork-join of our pool in the same process (from 0.15 to 10 us, measured),
    so the peer never shares a process with the rungs. ImportError where torch is missing."""
    import json
    import subprocess
    import sys

    if version() is None:
        raise ImportError("PyTorch is not installed (pip install torch==2.13.0)")
    args = json.dumps([config, threads, list(prompt), list(feed), rounds, pause])
    r = subprocess.run([sys.executable, "-m", __name__, args], capture_output=True, text=True,
                       timeout=1800)
    if r.returncode:
        raise RuntimeError(f"the PyTorch peer failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(time_decode(*json.loads(sys.argv[1]))))
