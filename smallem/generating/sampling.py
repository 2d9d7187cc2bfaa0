"""The next token from logits: greedy, or a seeded draw cut by top-k and top-p, in the
library (not in chapter 4's ladder), for chapter 4's generator and the GGUF runner alike;
and the one loop that generates with it (:func:`generate`), with one rule for a full
context."""

from __future__ import annotations

import math

import numpy as np


class Sampler:
    """Picks the next token from logits: greedy (temperature 0), or a draw from
    softmax(logits / temperature) cut to the ``top_k`` most likely tokens (0: all) and then
    to the smallest set whose probability reaches ``top_p``. Seeded: the same seed and
    logits give the same tokens. Works in buffers made once."""

    def __init__(self, temperature: float = 0.8, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0, vocab: int = 256):
        temperature, top_p = float(temperature), float(top_p)
        if not temperature >= 0 or math.isinf(temperature):
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
        if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0: no cut), got {top_k!r}")
        self.temperature, self.top_k, self.top_p = temperature, int(top_k), top_p
        self.rng = np.random.default_rng(seed)
        self._z = np.empty(vocab, np.float64)

    def __call__(self, logits: np.ndarray) -> int:
        if self.temperature == 0:
            return int(np.argmax(logits))
        z = self._z[:logits.size]
        np.multiply(logits, 1.0 / self.temperature, out=z)
        k = self.top_k if 0 < self.top_k < z.size else z.size
        cand = np.argpartition(z, z.size - k)[z.size - k:] if k < z.size else np.arange(z.size)
        cand = cand[np.argsort(-z[cand], kind="stable")]   # most likely first
        p = np.exp(z[cand] - z[cand[0]])
        p /= p.sum()
        cum = np.cumsum(p)
        keep = int(np.searchsorted(cum, self.top_p * (1 - 1e-12))) + 1 if self.top_p < 1 else p.size
        u = self.rng.random() * cum[keep - 1]
        return int(cand[min(int(np.searchsorted(cum[:keep], u, side="right")), keep - 1)])


def generate(logits, history: list, tokens: int, sampler, *, context: int, step, refill,
             stop=frozenset()):
    """The one generate loop of the CPU decoders (chapter 4's generator, the GGUF runner):
    yields up to ``tokens`` ids, the first sampled from ``logits`` (the prompt's), each next
    from ``step(id)``'s logits, until one is in ``stop``. ``history`` holds the ids in the
    cache and takes each new one. When the cache is full, the latest half of ``history`` is
    given to ``refill(ids)`` (a cache started again with them; their last logits back) and
    generation goes on: the model then sees the latest ``context // 2`` ids, never more than
    its context."""
    for i in range(tokens):
        t = sampler(logits)
        if t in stop:
            return
        history.append(t)
        yield t
        if i + 1 == tokens:
            return
        if len(history) > context:  # t has no place in the cache: keep the latest half
            del history[:-(context // 2)]
            logits = refill(list(history))
        else:
            logits = step(t)
