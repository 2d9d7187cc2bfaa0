"""The appendix's GGUF files: others' models at their real shapes, with random weights.

No machine here can download a model, and speed does not depend on what the weights say:
a decode step reads every weight once whatever its value, a prompt multiplies them all.
So the appendix writes files of the published shapes (:data:`SHAPES`, from each model's
``config.json``, cited in the bibliography) with random weights in F16, and makes each
quantisation from that file with llama.cpp's own ``llama-quantize`` where ``make llama``
built it; without it, the ``gguf`` package quantises Q8_0 and Q4_0 and the K-quant mix is
not made. The vocabulary is smallem's 256 bytes padded with unused tokens to the model's
size, so that the embedding and the head have their real shapes.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smallem.generating import gguf_file, gguf_random
from smallem.generating.gguf_file import ARCHS, Hyper, expected_shapes


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str
    d: int
    n_layer: int
    n_head: int
    n_kv_head: int
    hidden: int
    vocab: int
    context: int
    rope_base: float
    tied: bool = True


SHAPES = {
    # HuggingFaceTB/SmolLM2-135M's config.json
    "smollm2-135m": Shape("SmolLM2-135M", "llama", 576, 30, 9, 3, 1536, 49152, 8192, 100000.0),
    # Qwen/Qwen2.5-0.5B's config.json
    "qwen2.5-0.5b": Shape("Qwen2.5-0.5B", "qwen2", 896, 24, 14, 2, 4864, 151936, 32768, 1000000.0),
    # a tiny model of each for the quick mode (tests)
    "tiny-llama": Shape("tiny llama", "llama", 256, 2, 4, 2, 512, 1024, 1024, 10000.0),
    "tiny-qwen2": Shape("tiny qwen2", "qwen2", 256, 2, 4, 2, 512, 1024, 1024, 10000.0),
}


def hyper(s: Shape) -> Hyper:
    hd = s.d // s.n_head
    return Hyper(ARCHS[s.arch], s.d, s.n_layer, s.n_head, s.n_kv_head, hd, hd, s.hidden,
                 s.vocab, s.context, 1e-6, s.rope_base, hd, s.tied)


def weights(s: Shape) -> int:
    """The model's parameter count (its matrices, embedding and norms)."""
    return sum(int(np.prod(ne)) for ne in expected_shapes(hyper(s)).values())


def _init(name: str, shape: tuple, ne: tuple, rng) -> np.ndarray:
    """F16 matrices N(0, 1/K) (K the row's length, so that each product keeps its
    activations' scale), F32 norms near 1 and biases near 0."""
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape, np.float32)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.1 * rng.standard_normal(shape, np.float32)).astype(np.float32)
    return (rng.standard_normal(shape, np.float32) / np.float32(np.sqrt(ne[0]))).astype(np.float16)


def write_random(path: Path, s: Shape, seed: int = 0) -> Path:
    """A GGUF file of shape ``s`` (smallem.generating.gguf_random's writer, with :func:`_init`)."""
    return gguf_random.write(path, s.arch, _init, d=s.d, n_layer=s.n_layer, n_head=s.n_head,
                             n_kv_head=s.n_kv_head, hidden=s.hidden, context=s.context,
                             rope_base=s.rope_base, tied=s.tied, vocab=s.vocab, seed=seed)


PACKAGE_TYPES = ("Q8_0", "Q4_0", "Q5_0", "BF16", "F16")  # what the gguf package can quantise


def quantise(src: Path, dst: Path, qtype: str, tools: dict | None) -> Path | None:
    """``src`` in ``qtype``: llama-quantize's where it is built, else the gguf package's for
    :data:`PACKAGE_TYPES`, else None (the type is not made). Norms and biases stay as they
    are."""
    q = tools and tools.get("quantize")
    if q:
        r = subprocess.run([q, str(src), str(dst), qtype], capture_output=True, text=True,
                           timeout=1800)
        if r.returncode:
            raise RuntimeError(f"llama-quantize {qtype} failed: {r.stderr.strip()[-300:]}")
        return dst
    if qtype not in PACKAGE_TYPES:
        return None
    import gguf

    r = gguf_file.Reader(src)
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        v, t = f.contents(), f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                w.add_array(k, v)
            else:
                w.add_key_value(k, v, t, sub_type=sub)
        else:
            w.add_key_value(k, v, t)
    qt = gguf.GGMLQuantizationType[qtype]
    for t in r.tensors:
        a = np.asarray(t.data)
        if a.ndim == 2:
            w.add_tensor(t.name, gguf.quants.quantize(a.astype(np.float32), qt), raw_dtype=qt)
        else:
            w.add_tensor(t.name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
