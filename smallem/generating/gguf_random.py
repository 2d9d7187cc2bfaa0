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

from smallem.generating.gguf_file import ARCHS, KEYS, Hyper, Reader, expected_shapes, meta_key
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
          extra: dict[str, np.ndarray] | None = None, chat_template: str | None = None,
          **keys) -> Path:
    """A model of ``arch`` with the tensors ``init`` draws, to ``path``. The vocabulary is
    ``tokenizer``'s (a GGUF file whose tokenizer keys are copied) or smallem's bytes padded to
    ``vocab`` tokens; ``extra`` adds tensors (name -> array) after the model's own. ``keys``:
    more metadata by :data:`smallem.generating.gguf_file.KEYS`' names, written where not None
    (gemma3's ``window``, ``swa_pattern`` -- a period or a bool a layer -- and
    ``rope_base_swa``; ``softcap``; ``rope_linear``, a linear rope scaling factor, the type
    left to llama.cpp's default, linear). ``chat_template``: ``tokenizer.chat_template`` (by
    default the architecture's own from :data:`CHAT_TEMPLATES`, else the vocabulary file's
    where it has one)."""
    import gguf

    if arch not in ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(sorted(ARCHS))}")
    if tokenizer is None and vocab < 256:  # checked before the file is opened
        raise ValueError(f"a vocabulary of {vocab} tokens cannot hold the 256 bytes")
    path = Path(path)
    keys = {k: v for k, v in keys.items() if v is not None}
    for k in keys:
        if k not in KEYS:
            raise ValueError(f"unknown metadata {k!r}; known: {', '.join(KEYS)}")
        needs = KEYS[k][2]
        if needs and not getattr(ARCHS[arch], needs):
            raise ValueError(f"architecture {arch!r} has no sliding window" if needs == "swa_period"
                             else f"architecture {arch!r} has no {needs} for {k!r}")
    if chat_template is None:
        chat_template = CHAT_TEMPLATES.get(arch)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    skip = ("tokenizer.chat_template",) if chat_template is not None else ()
    V = _copied_vocabulary(w, tokenizer, skip) if tokenizer else _byte_vocabulary(w, vocab)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    hd = head_dim or d // n_head
    shape = {"context": context, "d": d, "n_layer": n_layer, "hidden": hidden,
             "n_head": n_head, "n_kv_head": n_kv_head}
    if hd != d // n_head:
        shape.update(head_dim=hd, v_dim=hd)
    for k, v in {**shape, "eps": eps, "rope_base": rope_base, **keys}.items():
        name, kind = meta_key(arch, k), KEYS[k][1]
        if kind == "uint32" or (kind == "pattern" and not isinstance(v, (list, tuple))):
            w.add_uint32(name, int(v))
        elif kind == "pattern":
            w.add_array(name, [bool(x) for x in v])
        elif kind == "float32":
            w.add_float32(name, float(v))
        else:
            w.add_string(name, str(v))
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
