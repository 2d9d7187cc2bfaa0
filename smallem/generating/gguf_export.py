"""Export a model to GGUF, the file format llama.cpp reads, with the ``gguf`` package.

GPT-2's block goes out as llama.cpp's ``gpt2`` architecture, the modern block as
``llama`` (RMSNorm, RoPE on pairs of consecutive features, which is llama.cpp's "normal"
RoPE and ours, SwiGLU as ffn_gate / ffn_up / ffn_down, no biases). ``dtype`` "f32" writes
every tensor as float32; "q8_0" writes the products' matrices as Q8_0, from the very bytes
the int8 decoder multiplies by (:func:`smallem.generating.quant.quantize_q8`), and the rest as float32.

GGUF stores a matrix the way PyTorch does, (out, in), and ours are (in, out): each is
written transposed. The vocabulary is the 256 bytes, as a ``gpt2`` BPE tokenizer with no
merges: token i is byte i, spelt in GPT-2's byte-to-character map, so llama.cpp turns any
text into the byte ids we use, and back.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from smallem.generating.gguf_file import tensor_name
from smallem.generating.gguf_tokenizer import byte_tokens  # noqa: F401  (the vocabulary the export writes)
from smallem.training.model import GPT
from smallem.training.ops import LN_EPS, ROPE_BASE
from smallem.generating.quant import QBLOCK, quantize_q8

DTYPES = ("f32", "q8_0")


def q8_0_bytes(w: np.ndarray) -> np.ndarray:
    """W (K, N) as GGUF's Q8_0 rows: (N, K / 32 * 34) bytes, each block its float16 scale
    then 32 int8 weights, along K."""
    K, N = w.shape
    if K % QBLOCK:
        raise ValueError(f"Q8_0 needs rows of a multiple of {QBLOCK} weights, got {K}")
    q, s = quantize_q8(w)
    nb = K // QBLOCK
    out = np.zeros((N, nb, 2 + QBLOCK), np.uint8)
    out[:, :, :2] = np.ascontiguousarray(s.T).view(np.uint8).reshape(N, nb, 2)
    out[:, :, 2:] = q.T.reshape(N, nb, QBLOCK).view(np.uint8)
    return out.reshape(N, nb * (2 + QBLOCK))


def tensors(model: GPT) -> dict[str, tuple[np.ndarray, bool]]:
    """{GGUF name: (array as GGUF wants it, (out, in) for a matrix; whether it is a product's
    matrix, hence Q8_0 in a q8_0 file)}. Matrices are given (in, out), our own way round.
    The names are gguf_file's one table's."""
    c, P = model.config, model.params
    modern = c.block == "modern"
    out: dict = {tensor_name("embd"): (P["wte"].T, True)}  # (V, d): its (in, out) is wte.T
    if not modern:
        out[tensor_name("wpe")] = (P["wpe"].T, False)
    if not c.tied:
        out[tensor_name("head")] = (P["lm_head"].T, True)
    out[tensor_name("out_norm_w")] = (P["lnf.w"], False)
    if not modern:
        out[tensor_name("out_norm_b")] = (P["lnf.b"], False)
    d, h = c.d_model, c.mlp_hidden
    for i in range(c.n_layer):
        n = f"h{i}."
        b = lambda part: tensor_name(part, i)  # noqa: E731
        out[b("norm1_w")] = (P[n + "ln1.w"], False)
        out[b("norm2_w")] = (P[n + "ln2.w"], False)
        if modern:
            qkv, fc = P[n + "attn.w"], P[n + "fc.w"]
            out[b("q")] = (qkv[:, :d], True)
            out[b("k")] = (qkv[:, d:2 * d], True)
            out[b("v")] = (qkv[:, 2 * d:], True)
            out[b("o")] = (P[n + "proj.w"], True)
            out[b("gate")] = (fc[:, :h], True)
            out[b("up")] = (fc[:, h:], True)
            out[b("down")] = (P[n + "fc2.w"], True)
            continue
        for w, bias, ours in (("qkv", "bqkv", "attn"), ("o", "bo", "proj"), ("up", "bup", "fc"),
                              ("down", "bdown", "fc2")):
            out[b(w)] = (P[n + ours + ".w"], True)
            out[b(bias)] = (P[n + ours + ".b"], False)
        out[b("norm1_b")] = (P[n + "ln1.b"], False)
        out[b("norm2_b")] = (P[n + "ln2.b"], False)
    return out


def metadata(model: GPT, dtype: str) -> dict:
    """The architecture's keys, as llama.cpp reads them."""
    c = model.config
    arch = "llama" if c.block == "modern" else "gpt2"
    keys = {f"{arch}.context_length": c.context, f"{arch}.embedding_length": c.d_model,
            f"{arch}.feed_forward_length": c.mlp_hidden, f"{arch}.block_count": c.n_layer,
            f"{arch}.attention.head_count": c.n_head}
    if arch == "llama":
        keys.update({"llama.attention.head_count_kv": c.n_head,
                     "llama.attention.layer_norm_rms_epsilon": LN_EPS,
                     "llama.rope.dimension_count": c.head_dim,
                     "llama.rope.freq_base": ROPE_BASE, "llama.vocab_size": c.vocab})
    else:
        keys["gpt2.attention.layer_norm_epsilon"] = LN_EPS
    return {"general.architecture": arch, "general.name": f"smallem-{c.name}", **keys}


def export(model: GPT, path, dtype: str = "f32", overwrite: bool = False) -> Path:
    """Write ``model`` to the GGUF file ``path``. An existing file is kept (FileExistsError)
    unless ``overwrite``; the file appears complete or not at all (temp name, rename)."""
    import gguf

    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if model.config.block == "recurrent":
        raise ValueError("GGUF export knows the GPT-2 and llama blocks, not the recurrent one")
    if model.config.vocab != 256:
        raise ValueError(f"GGUF export knows the byte vocabulary (256), not {model.config.vocab}")
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists: choose another path, or overwrite it on purpose")
    meta = metadata(model, dtype)
    tmp = path.with_name(path.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), meta["general.architecture"])
    try:
        w.add_name(meta["general.name"])
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if dtype == "q8_0"
                        else gguf.LlamaFileType.ALL_F32)
        for key, value in meta.items():
            if key in ("general.architecture", "general.name"):
                continue
            if isinstance(value, float):
                w.add_float32(key, value)
            else:
                w.add_uint32(key, int(value))
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(byte_tokens())
        w.add_token_types([gguf.TokenType.NORMAL] * 256)
        # llama.cpp's BPE wants at least one merge (gguf drops an empty list). "~~" is
        # not a token, so wherever this one merge fires, llama.cpp falls back to the two
        # bytes it is made of: the ids stay byte for byte.
        w.add_token_merges(["~ ~"])
        w.add_bos_token_id(0)   # NUL: never in text, never added (add_bos is false)
        w.add_eos_token_id(0)
        w.add_add_bos_token(False)
        for name, (a, product) in tensors(model).items():
            if a.ndim == 2 and product and dtype == "q8_0":
                w.add_tensor(name, q8_0_bytes(a), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            else:
                a = a.T if a.ndim == 2 else a   # (in, out) -> (out, in)
                w.add_tensor(name, np.ascontiguousarray(a, np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
