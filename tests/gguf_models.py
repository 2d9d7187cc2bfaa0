"""Llama-family GGUF models with random weights, written with the ``gguf`` package, for the
tests of smallem.generating.gguf_file / gguf_tokenizer / gguf_model (no model can be downloaded here).

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

import hashlib
import os
import shutil
from importlib import metadata
from pathlib import Path

import numpy as np

from smallem.generating import gguf_file, gguf_random
from smallem.plumbing import build
from smallem.book.ch4 import llama

# llama.cpp's tokenizer test files, where `make llama` unpacked its source (once a machine)
VOCAB_DIR = llama.models_dir()


def vocab_file(name: str) -> Path | None:
    if VOCAB_DIR is None:
        return None
    p = VOCAB_DIR / f"ggml-vocab-{name}.gguf"
    return p if p.is_file() else None


# What a written file depends on besides its arguments: the writer's sources, the package that
# packs it and numpy's random streams. A file once written is kept under all of it (the kernel
# cache's folder) and copied from there: packing a vocabulary of 150 000 tokens takes the
# gguf package seconds, and the tests write the same few dozen files every run.
_SOURCES = [Path(gguf_random.__file__), Path(gguf_file.__file__), Path(__file__)]


def _sources_digest() -> str:
    h = hashlib.sha256()
    for src in _SOURCES:
        h.update(src.read_bytes())
    for pkg in ("gguf", "numpy"):
        h.update(metadata.version(pkg).encode())
    return h.hexdigest()[:24]


def _args_key(args: dict) -> str:
    h = hashlib.sha256()
    for k, v in sorted(args.items()):
        if k == "extra":
            for name, x in sorted((v or {}).items()):
                x = np.ascontiguousarray(x, np.float32)
                h.update(f"{name}{x.shape}".encode() + x.tobytes())
        elif k == "vocab" and v:
            f = vocab_file(v)
            h.update(f"vocab={v}:{f and build.file_identity(f)};".encode())
        else:
            h.update(f"{k}={v!r};".encode())
    return h.hexdigest()


def kept(path: Path, key: str, make) -> Path:
    """``make(path)`` once for ``key`` (with this module's sources); later calls copy the kept
    file to ``path``. A folder of older sources is removed when a new one is made, so the
    cache holds one set."""
    root = build.cache_dir() / "gguf-models"
    folder = root / _sources_digest()
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    keep = folder / f"{name}.gguf"
    path = Path(path)
    try:
        shutil.copyfile(keep, path)
        return path
    except FileNotFoundError:  # not kept yet, or removed by a run of other sources just now
        pass
    if not folder.is_dir() and root.is_dir():
        for old in root.iterdir():
            shutil.rmtree(old, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    make(path)
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    shutil.copyfile(path, tmp)
    os.replace(tmp, keep)  # whole or not at all: a parallel writer just wins or loses
    return path


def digest(path: Path) -> str:
    """A file's bytes' digest (a key for what is made from it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def write(path, arch="llama", vocab: str | None = None, d=64, n_layer=2, n_head=4, n_kv_head=2,
          head_dim=None, hidden=128, context=128, seed=0, std=0.3, rope_freqs=False,
          base=10000.0, tied=False, extra=None, keep=True, **arch_keys) -> Path:
    """A model of ``arch`` with random weights, all F32, to ``path`` (kept, see :func:`kept`;
    ``extra``: more tensors,
    name -> float32 array), through the library's one writer (smallem.generating.gguf_random);
    ``arch_keys`` go to it (gemma3's window, swa_pattern, rope_base_swa, softcap). An
    architecture that scales its embedding by sqrt(d) (gemma3) gets an embedding of std
    1/sqrt(d), so that the scaled rows are of the size of what the blocks add."""
    emb_std = 1 / np.sqrt(d) if gguf_file.ARCHS[arch].embed_scale else 1.0

    def init(name, shape, ne, rng):
        if name.endswith("norm.weight"):
            x = 1.0 + rng.normal(0, 0.1, shape)
        elif name == "token_embd.weight":
            x = rng.normal(0, emb_std, shape)
        elif name == "output.weight":  # rows of log-normal lengths: a few tokens stand out
            x = rng.normal(0, 1.0, shape) * np.exp(rng.normal(0, 1.0, (shape[0], 1)))
        elif name.endswith(".bias"):
            x = rng.normal(0, 0.5, shape)
        else:
            x = rng.normal(0, std / np.sqrt(ne[0]) * 4, shape)
        return x.astype(np.float32)

    more = dict(extra or {})
    if rope_freqs:
        hd = head_dim or d // n_head
        more = {"rope_freqs.weight": np.linspace(1, 8, hd // 2).astype(np.float32), **more}
    more = {k: np.asarray(v, np.float32) for k, v in more.items()}
    args = dict(arch=arch, vocab=vocab, d=d, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head,
                head_dim=head_dim, hidden=hidden, context=context, seed=seed, std=std,
                base=base, tied=tied, extra=more, **arch_keys)
    def make(out):
        return gguf_random.write(
            out, arch, init, d=d, n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head,
            hidden=hidden, context=context, rope_base=base, tied=tied, head_dim=head_dim, seed=seed,
            tokenizer=vocab_file(vocab) if vocab else None, extra=more, **arch_keys)
    # keep=False: written now, whatever the cache holds (the test of the cache itself)
    return kept(path, "write:" + _args_key(args), make) if keep else make(Path(path))
