"""GGUF files of a given shape with random weights: one writer for appendix B's models at
their published shapes and for the tests' small models of every architecture.

No machine here can download a model, and neither a decode's speed nor a comparison with
llama.cpp's logits depends on what the weights mean. The writer takes the architecture's
hyper-parameters, a vocabulary (smallem's 256 bytes, padded with unused tokens to the size
the shape asks for, or the tokenizer keys of another GGUF file, such as llama.cpp's
``ggml-vocab-*.gguf`` test files), and a function that draws each tensor; the tensor names and
shapes are :func:`smallem.generating.gguf_file.expected_shapes`', the ones the readers expect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from smallem.generating.gguf_file import ARCHS, Hyper, Reader, expected_shapes
from smallem.generating.gguf_tokenizer import byte_tokens

# (name, numpy shape, GGUF shape ne, rng) -> the tensor, in the type it is stored in
Init = Callable[[str, tuple, tuple, np.random.Generator], np.ndarray]


def _byte_vocabulary(w, size: int) -> int:
    import gguf

    toks = byte_tokens()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks + [f"<unused{i}>" for i in range(size - len(toks))])
    w.add_token_types([gguf.TokenType.NORMAL] * len(toks)
                      + [gguf.TokenType.UNUSED] * (size - len(toks)))
    w.add_token_merges(["~ ~"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)
    return size


def _copied_vocabulary(w, src: Path, skip=()) -> int:
    """Every ``tokenizer.*`` key of ``src`` but ``skip``, as it is there; the number of its
    tokens."""
    import gguf

    r = Reader(src)
    n = 0
    for key, f in r.fields.items():
        if not key.startswith("tokenizer.") or key in skip:
            continue
        t, v = f.types, f.contents()
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


# gemma's chat turns (the shape of Google's template, written here): a system message opens the
# first user turn; the assistant's turns are the model's
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(prefix='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.prefix = m['content'] | trim + '\n\n' %}"
    "{% else %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n'"
    " + ns.prefix + m['content'] | trim + '<end_of_turn>\n' }}"
    "{% set ns.prefix = '' %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
CHAT_TEMPLATES = {"gemma3": GEMMA_TEMPLATE}


def write(path, arch: str, init: Init, *, d: int, n_layer: int, n_head: int, n_kv_head: int,
          hidden: int, context: int, rope_base: float = 10000.0, tied: bool = False,
          head_dim: int | None = None, eps: float = 1e-6, vocab: int = 256,
          tokenizer: Path | None = None, seed: int = 0,
          extra: dict[str, np.ndarray] | None = None, window: int = 0,
          swa_pattern: int | list | None = None, rope_base_swa: float | None = None,
          softcap: float = 0.0, chat_template: str | None = None,
          rope_linear: float = 0.0) -> Path:
    """A model of ``arch`` with the tensors ``init`` draws, to ``path``. The vocabulary is
    ``tokenizer``'s (a GGUF file whose tokenizer keys are copied) or smallem's bytes padded to
    ``vocab`` tokens; ``extra`` adds tensors (name -> array) after the model's own. An
    architecture with a sliding window (gemma3) gets ``window`` (0: none), ``swa_pattern``
    (a period or a bool a layer; None: the architecture's default) and ``rope_base_swa``
    (None: llama.cpp's default, 10000) where given; ``softcap``: the final logits' softcapping
    (0: none). ``rope_linear``: a linear rope scaling factor (the global layers' angles
divided by it; 0: none). ``chat_template``: ``tokenizer.chat_template`` (by default the architecture's
    own from :data:`CHAT_TEMPLATES`, else the vocabulary file's where it has one)."""
    import gguf

    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(sorted(ARCHS))}")
    if tokenizer is None and vocab < 256:  # checked before the file is opened
        raise ValueError(f"a vocabulary of {vocab} tokens cannot hold the 256 bytes")
    path = Path(path)
    if (window or swa_pattern is not None or rope_base_swa is not None) \
            and not ARCHS[arch].swa_period:
        raise ValueError(f"architecture {arch!r} has no sliding window")
    if chat_template is None:
        chat_template = CHAT_TEMPLATES.get(arch)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    skip = ("tokenizer.chat_template",) if chat_template is not None else ()
    V = _copied_vocabulary(w, tokenizer, skip) if tokenizer else _byte_vocabulary(w, vocab)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    hd = head_dim or d // n_head
    a = arch + "."
    for key, v in (("context_length", context), ("embedding_length", d),
                   ("block_count", n_layer), ("feed_forward_length", hidden),
                   ("attention.head_count", n_head), ("attention.head_count_kv", n_kv_head)):
        w.add_uint32(a + key, v)
    if hd != d // n_head:
        w.add_uint32(a + "attention.key_length", hd)
        w.add_uint32(a + "attention.value_length", hd)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", eps)
    w.add_float32(a + "rope.freq_base", rope_base)
    if window:
        w.add_uint32(a + "attention.sliding_window", window)
    if isinstance(swa_pattern, (list, tuple)):
        w.add_array(a + "attention.sliding_window_pattern", [bool(x) for x in swa_pattern])
    elif swa_pattern is not None:
        w.add_uint32(a + "attention.sliding_window_pattern", int(swa_pattern))
    if rope_base_swa is not None:
        w.add_float32(a + "rope.freq_base_swa", rope_base_swa)
    if softcap:
        w.add_float32(a + "final_logit_softcapping", softcap)
    if rope_linear:
        w.add_string(a + "rope.scaling.type", "linear")
        w.add_float32(a + "rope.scaling.factor", rope_linear)
    h = Hyper(ARCHS[arch], d, n_layer, n_head, n_kv_head, hd, hd, hidden, V, context, eps,
              rope_base, hd, tied)
    for name, ne in expected_shapes(h).items():
        w.add_tensor(name, np.ascontiguousarray(init(name, tuple(reversed(ne)), tuple(ne), rng)))
    for name, x in (extra or {}).items():
        w.add_tensor(name, np.ascontiguousarray(x))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
