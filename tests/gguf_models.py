"""Llama-family GGUF models with random weights, written with the ``gguf`` package, for the
tests of smallem.gguf_file / gguf_tokenizer / gguf_model (no model can be downloaded here).

The tokenizer comes from one of llama.cpp's vocabulary files (``ggml-vocab-*.gguf`` in the
llama-cpp-python sdist that ``make llama`` unpacks) or, without it, smallem's own 256-byte
vocabulary. Weights are N(0, std); the embedding gets std 1, and the output matrix's rows
N(0, 1) scaled by log-normal lengths, so that the logits spread over several units and a few
tokens stand out: the best two of tens of thousands of equal normals lie about a fifth of
their spread apart, of log-normal rows much further, and greedy choices are seldom near-ties
(the tests check the margin of every choice they compare). The output matrix is the file's own (untied) by
default: tied to the embedding, the residual stream, which is mostly its token's embedding,
would pick its own token again and again, a sequence that tests little.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from smallem import gguf_export
from smallem.book.ch4 import llama
from smallem.gguf_file import ARCHS, Hyper, expected_shapes

# llama.cpp's tokenizer test files, where `make llama` unpacked its source (once a machine)
VOCAB_DIR = llama.models_dir()


def vocab_file(name: str) -> Path | None:
    if VOCAB_DIR is None:
        return None
    p = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    return p if p.is_file() else None


def _copy_tokenizer(w, src: Path | None):
    import gguf

    if src is None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(gguf_export.byte_tokens())
        w.add_token_types([gguf.TokenType.NORMAL] * 256)
        w.add_token_merges(["~ ~"])
        w.add_bos_token_id(0)
        w.add_eos_token_id(0)
        w.add_add_bos_token(False)
        return 256
    r = gguf.GGUFReader(str(src))
    n = 0
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        t = f.types
        v = f.contents()
        if t[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(key, v)
            if key == "tokenizer.ggml.tokens":
                n = len(v)
        elif t[0] == gguf.GGUFValueType.STRING:
            w.add_string(key, v)
        elif t[0] == gguf.GGUFValueType.BOOL:
            w.add_bool(key, v)
        elif t[0] in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64):
            w.add_float32(key, v)
        else:
            w.add_uint32(key, int(v))
    return n


def write(path, arch="llama", vocab: str | None = None, d=64, n_layer=2, n_head=4, n_kv_head=2,
          head_dim=None, hidden=128, context=128, seed=0, std=0.3, rope_freqs=False,
          base=10000.0, tied=False, extra=None) -> Path:
    """A model of ``arch`` with random weights, all F32, to ``path`` (``extra``: more tensors,
    name -> float32 array)."""
    import gguf

    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    V = _copy_tokenizer(w, vocab_file(vocab) if vocab else None)
    hd = head_dim or d // n_head
    a = arch + "."
    w.add_uint32(a + "context_length", context)
    w.add_uint32(a + "embedding_length", d)
    w.add_uint32(a + "block_count", n_layer)
    w.add_uint32(a + "feed_forward_length", hidden)
    w.add_uint32(a + "attention.head_count", n_head)
    w.add_uint32(a + "attention.head_count_kv", n_kv_head)
    if head_dim:
        w.add_uint32(a + "attention.key_length", hd)
        w.add_uint32(a + "attention.value_length", hd)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(a + "rope.freq_base", base)
    h = Hyper(ARCHS[arch], d, n_layer, n_head, n_kv_head, hd, hd, hidden, V, context, 1e-6,
              base, hd, tied)
    for name, ne in expected_shapes(h).items():
        shape = tuple(reversed(ne))
        if name.endswith("norm.weight"):
            x = 1.0 + rng.normal(0, 0.1, shape)
        elif name == "token_embd.weight":
            x = rng.normal(0, 1.0, shape)
        elif name == "output.weight":  # rows of log-normal lengths: a few tokens stand out
            x = rng.normal(0, 1.0, shape) * np.exp(rng.normal(0, 1.0, (shape[0], 1)))
        elif name.endswith(".bias"):
            x = rng.normal(0, 0.5, shape)
        else:
            x = rng.normal(0, std / np.sqrt(ne[0]) * 4, shape)
        w.add_tensor(name, np.ascontiguousarray(x, np.float32))
    if rope_freqs:
        w.add_tensor("rope_freqs.weight", np.linspace(1, 8, hd // 2).astype(np.float32))
    for name, x in (extra or {}).items():
        w.add_tensor(name, np.ascontiguousarray(x, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
