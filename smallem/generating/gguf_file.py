"""Other people's models: a llama-family GGUF file, read here (:class:`Reader`), with the
``gguf`` package's table of types.

:func:`open_model` maps the file (:class:`Reader`: the metadata, the tensor table and
each tensor's bytes as a view of the mapping, no copy of a quantised weight), then checks
everything the forward will rely on before it runs: the architecture is one of
:data:`ARCHS`, the keys it needs are there, every tensor it reads exists with the shape the
metadata implies, in a type :data:`TYPES` knows, and lies inside the file. Whatever is
wrong comes back as one :class:`GGUFError` naming the file and the fault, never as a
traceback from deep inside the reader, nor as a read past the mapping later.

An architecture is a small table of differences over one forward (:class:`Arch`): where
llama.cpp's ``llama``, ``qwen2``, ``qwen3``, ``phi3`` and ``gemma3`` differ is the rotary pairing,
biases on q, k and v, an RMSNorm over each head's q and k, matrices stored fused (phi3's q, k
and v in one, its gate and up in another: :func:`open_model` splits them into views of their
rows, so the forward reads the same names for every architecture), where the query is scaled,
and gemma3's GeGLU, norms after the attention and the MLP, scaled embedding and sliding window
on five layers of six (with their own rope base; :class:`Hyper`'s ``window``, ``swa_layers``).
GGUF counts a tensor's dimensions innermost
first (``ne``); a matrix of ``ne = [n_in, n_out]`` is stored as ``n_out`` rows of ``n_in``
weights, which is the order a product of one activation row by it reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class GGUFError(ValueError):
    """A GGUF file this code cannot run, with the reason in one line."""


def _says(default, words: str):
    return field(default=default, metadata={"says": words})


@dataclass(frozen=True)
class Arch:
    """How one architecture differs from llama's forward (each switch with the words
    ``smallem run --info`` says it in)."""
    name: str
    rope: str = _says("norm", "RoPE")  # pairs (2i, 2i+1): llama.cpp's "normal"; "neox": (i, i + half)
    qkv_bias: bool = _says(False, "q/k/v biases")  # q, k and v products have biases (qwen2)
    qk_norm: bool = _says(False, "q/k norms")  # an RMSNorm over each head's q and k before RoPE (qwen3)
    fused: bool = _says(False, "fused q/k/v and gate/up")  # q, k, v in one attn_qkv matrix,
    # gate and up in one ffn_up of twice the rows (phi3): split into row views when opened
    q_prescaled: bool = _says(False, "query scaled before the keys")  # the query times
    # Hyper.attn_scale before it meets the keys, the scores unscaled (phi3, gemma3): the same
    # sum, another f16 rounding
    mlp: str = _says("swiglu", "MLP")  # silu(gate) * up; "geglu": gelu(gate) * up, gelu's tanh form (gemma3)
    post_norms: bool = _says(False, "norms after attention and MLP")  # an RMSNorm of the
    # attention's and of the MLP's output before each residual add: blk.N.post_attention_norm,
    # blk.N.post_ffw_norm (gemma3)
    embed_scale: bool = _says(False, "embedding scaled")  # the embedding row times sqrt(d) (gemma3)
    swa_period: int = _says(0, "sliding-window period")  # reads a sliding window
    # (attention.sliding_window) and which layers use it: the file's sliding_window_pattern (a
    # bool a layer, or a period), else this period, llama.cpp's default: layer i uses the
    # window unless i % period == period - 1 (gemma3: 6). 0: no window

    def described(self) -> str:
        """Every switch in its words: "RoPE neox, q/k/v biases True, ..."."""
        import dataclasses
        return ", ".join(f"{f.metadata['says']} {getattr(self, f.name)}"
                         for f in dataclasses.fields(self) if "says" in f.metadata)


ARCHS = {
    "llama": Arch("llama"),
    "qwen2": Arch("qwen2", rope="neox", qkv_bias=True),
    "qwen3": Arch("qwen3", rope="neox", qk_norm=True),
    "phi3": Arch("phi3", rope="neox", fused=True, q_prescaled=True),
    "gemma3": Arch("gemma3", rope="neox", qk_norm=True, q_prescaled=True, mlp="geglu",
                   post_norms=True, embed_scale=True, swa_period=6),
}

# --8<-- [start:names]
# The one table of tensor names: every tensor a forward here reads from a GGUF file (or the
# exporter writes), one row each: its name in our forward (the layer keys of forward.py's
# Spec, the parts the numpy reference reads), its name in the file (a layer's after
# "blk.<i>."), when an architecture has it, and its ne (innermost first) from the Hyper.
# llama.cpp keeps the same in LLM_TENSOR_NAMES; a new architecture that reuses these parts
# adds no row.
@dataclass(frozen=True)
class Part:
    ours: str
    gguf: str
    when: object    # Hyper -> bool: whether a file of that shape has it
    ne: object      # Hyper -> tuple, or None: a tensor no forward here reads (written for
                    # llama.cpp's gpt2 by gguf_export; its shape is the exporter's)


def _always(h):
    return True


def _never(h):
    return False


def _flag(name):
    return lambda h: bool(getattr(h.arch, name))


def _q(h):
    return h.n_head * h.head_dim


def _kv(h):
    return h.n_kv_head * h.head_dim


def _v(h):
    return h.n_kv_head * h.v_dim


TOP = (
    Part("embd", "token_embd.weight", _always, lambda h: (h.d, h.vocab)),
    Part("out_norm_w", "output_norm.weight", _always, lambda h: (h.d,)),
    Part("head", "output.weight", lambda h: not h.tied, lambda h: (h.d, h.vocab)),
    Part("rope_freqs", "rope_freqs.weight", _never, None),  # llama 3's, where the file has it
    Part("wpe", "position_embd.weight", _never, None),
    Part("out_norm_b", "output_norm.bias", _never, None),
)
LAYER = (  # in the order a file of the random writer (gguf_random) draws them
    Part("norm1_w", "attn_norm.weight", _always, lambda h: (h.d,)),
    Part("q", "attn_q.weight", _always, lambda h: (h.d, _q(h))),
    Part("k", "attn_k.weight", _always, lambda h: (h.d, _kv(h))),
    Part("v", "attn_v.weight", _always, lambda h: (h.d, _v(h))),
    Part("o", "attn_output.weight", _always, lambda h: (h.n_head * h.v_dim, h.d)),
    Part("norm2_w", "ffn_norm.weight", _always, lambda h: (h.d,)),
    Part("gate", "ffn_gate.weight", _always, lambda h: (h.d, h.hidden)),
    Part("up", "ffn_up.weight", _always, lambda h: (h.d, h.hidden)),
    Part("down", "ffn_down.weight", _always, lambda h: (h.hidden, h.d)),
    Part("bq", "attn_q.bias", _flag("qkv_bias"), lambda h: (_q(h),)),
    Part("bk", "attn_k.bias", _flag("qkv_bias"), lambda h: (_kv(h),)),
    Part("bv", "attn_v.bias", _flag("qkv_bias"), lambda h: (_v(h),)),
    Part("q_norm", "attn_q_norm.weight", _flag("qk_norm"), lambda h: (h.head_dim,)),
    Part("k_norm", "attn_k_norm.weight", _flag("qk_norm"), lambda h: (h.head_dim,)),
    Part("post1_w", "post_attention_norm.weight", _flag("post_norms"), lambda h: (h.d,)),
    Part("post2_w", "post_ffw_norm.weight", _flag("post_norms"), lambda h: (h.d,)),
    # GPT-2's, which the exporter writes for llama.cpp and no forward here reads
    Part("qkv", "attn_qkv.weight", _never, None),
    Part("bqkv", "attn_qkv.bias", _never, None),
    Part("bo", "attn_output.bias", _never, None),
    Part("norm1_b", "attn_norm.bias", _never, None),
    Part("norm2_b", "ffn_norm.bias", _never, None),
    Part("bup", "ffn_up.bias", _never, None),
    Part("bdown", "ffn_down.bias", _never, None),
)
# A fused architecture's file holds these parts as one matrix each, their rows in this order
# (phi3); opening it splits the matrix into the parts' row views.
FUSED = (("qkv", ("q", "k", "v")), ("up", ("gate", "up")))
_BY_OURS = {p.ours: p for p in TOP + LAYER}
# --8<-- [end:names]


def tensor_name(part: str, layer: int | None = None) -> str:
    """The file's name of our ``part`` (the table above), in ``layer`` where given."""
    gguf = _BY_OURS[part].gguf
    return gguf if layer is None else f"blk.{layer}.{gguf}"


def head_name(h) -> str:
    """The logits' matrix: the file's output matrix, or the embedding where it has none."""
    return tensor_name("embd" if h.tied else "head")


# the tensor types a product can read, with (weights per block, bytes per block)
# (Q5_0 is in Q4_K_M files whose rows are not a multiple of 256: llama-quantize's fallback)
TYPES = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34), "Q4_0": (32, 18),
         "Q5_0": (32, 22), "Q4_K": (256, 144), "Q6_K": (256, 210)}


# Every metadata key the reader reads and the writer (smallem.generating.gguf_random) writes,
# after "<architecture>.": name -> (key, GGUF type, what an architecture must have to carry
# it). The one spelling of each key; an architecture's new constant is one row here.
KEYS = {
    "context": ("context_length", "uint32", None),
    "d": ("embedding_length", "uint32", None),
    "n_layer": ("block_count", "uint32", None),
    "hidden": ("feed_forward_length", "uint32", None),
    "n_head": ("attention.head_count", "uint32", None),
    "n_kv_head": ("attention.head_count_kv", "uint32", None),
    "head_dim": ("attention.key_length", "uint32", None),
    "v_dim": ("attention.value_length", "uint32", None),
    "rope_dim": ("rope.dimension_count", "uint32", None),
    "eps": ("attention.layer_norm_rms_epsilon", "float32", None),
    "rope_base": ("rope.freq_base", "float32", None),
    "rope_scaling": ("rope.scaling.type", "string", None),
    "rope_linear": ("rope.scaling.factor", "float32", None),
    "rope_linear_old": ("rope.scale_linear", "float32", None),   # the older spelling
    "window": ("attention.sliding_window", "uint32", "swa_period"),
    "swa_pattern": ("attention.sliding_window_pattern", "pattern", "swa_period"),
    "rope_base_swa": ("rope.freq_base_swa", "float32", "swa_period"),
    "softcap": ("final_logit_softcapping", "float32", None),
}


def meta_key(arch: str, name: str) -> str:
    """The full metadata key of :data:`KEYS`' ``name`` for the architecture ``arch``."""
    return f"{arch}.{KEYS[name][0]}"


@dataclass(frozen=True)
class Hyper:
    """The shapes and constants of the forward, from the file's metadata."""
    arch: Arch
    d: int              # embedding width
    n_layer: int
    n_head: int
    n_kv_head: int      # GQA: each key/value head serves n_head / n_kv_head query heads
    head_dim: int       # of q and k
    v_dim: int          # of v
    hidden: int         # the MLP's inner width
    vocab: int
    context: int
    eps: float          # RMSNorm's
    rope_base: float
    rope_dim: int       # features of a head that turn (the rest pass through)
    tied: bool          # no output.weight: the head is token_embd
    window: int = 0     # sliding window of the layers in swa_layers: a query at position p
                        # sees keys at t with p - t < window (0: no window)
    swa_layers: tuple = ()  # one bool a layer, True where it uses the window (() with none)
    rope_base_swa: float = 10000.0  # the rope base of the window's layers (which also
                                    # take no frequency scaling)
    rope_scale: float = 1.0  # the global layers' linear rope scaling: angles times this
                             # (1 / rope.scaling.factor)
    attn_scale: float = 0.0  # the query's scale (q_prescaled) or else the scores':
                             # 1/sqrt(head_dim) (what 0 becomes) but for gemma3 (_attn_scale)
    softcap: float = 0.0     # logits -> softcap * tanh(logits / softcap) where nonzero

    def __post_init__(self):
        if not self.attn_scale:
            object.__setattr__(self, "attn_scale", float(1 / np.sqrt(self.head_dim)))

    def is_swa(self, layer: int) -> bool:
        return bool(self.window) and bool(self.swa_layers) and bool(self.swa_layers[layer])

    @property
    def group(self) -> int:
        return self.n_head // self.n_kv_head

    def switches(self) -> dict:
        """The architecture's switches as the C forward takes them, by sm_model's field names
        (kernels_c/forward.h; smallem.generating.forward packs them by name): the query
        scaled before the keys, the embedding's scale (0: none), the logits' softcap (0:
        none). A new switch is a row here and its field there."""
        return {"q_prescaled": int(self.arch.q_prescaled),
                "embed_scale": float(np.float32(np.sqrt(self.d))) if self.arch.embed_scale else 0.0,
                "softcap": self.softcap}


@dataclass
class Tensor:
    """One tensor of the file: its type name, ``ne`` (innermost first) and its bytes, a view
    of the file's mapping."""
    name: str
    type: str
    ne: tuple
    data: np.ndarray = field(repr=False)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dequantize(self) -> np.ndarray:
        """float32, shaped (ne[-1], ..., ne[0]): the ``gguf`` package's reference dequantiser."""
        import gguf

        qt = gguf.GGMLQuantizationType[self.type]
        if self.type == "F32":
            out = np.asarray(self.data, np.float32)
        elif self.type == "F16":
            out = np.asarray(self.data).view(np.float16).astype(np.float32)
        else:
            out = gguf.quants.dequantize(np.asarray(self.data), qt).astype(np.float32)
        return out.reshape(tuple(reversed(self.ne)))

    def rows(self, index) -> np.ndarray:
        """float32 (len(index), ne[0]): the rows ``index`` of a matrix, dequantised alone (an
        embedding lookup without the whole table)."""
        import gguf

        raw = np.asarray(self.data).reshape(int(np.prod(self.ne[1:])), -1)[np.asarray(index)]
        if self.type == "F32":
            return np.asarray(raw, np.float32).reshape(len(raw), self.ne[0])
        if self.type == "F16":
            return raw.view(np.float16).astype(np.float32).reshape(len(raw), self.ne[0])
        out = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[self.type])
        return out.astype(np.float32).reshape(len(raw), self.ne[0])


@dataclass
class ModelFile:
    path: Path
    hyper: Hyper
    meta: dict          # every metadata key -> its value (arrays of more than 64 left out)
    tensors: dict       # name -> Tensor
    tokenizer: dict     # the tokenizer.ggml.* keys, arrays whole
    reader: object = field(repr=False, default=None)

    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes one decode step reads: every block's matrices and the head (one embedding
        row besides, which is nothing)."""
        h = self.hyper
        names = [n for n in self.tensors if n.startswith("blk.") and n.endswith(".weight")
                 and self.tensors[n].data.ndim == 2]
        head = self.tensors[head_name(h)]
        return sum(self.tensors[n].nbytes for n in names) + head.nbytes

    @property
    def products_per_token(self) -> int:
        """Multiply-adds one token's products take: a weight each, over the same matrices
        as :attr:`weight_bytes_per_token` (the attention's own products aside)."""
        h = self.hyper
        names = [n for n in self.tensors if n.startswith("blk.") and n.endswith(".weight")
                 and self.tensors[n].data.ndim == 2]
        names.append(head_name(h))
        return sum(int(np.prod(self.tensors[n].ne)) for n in names)

    def type_mix(self) -> dict:
        """{type: (tensors, bytes)} over the whole file."""
        out: dict = {}
        for t in self.tensors.values():
            n, b = out.get(t.type, (0, 0))
            out[t.type] = (n + 1, b + t.nbytes)
        return out


def _fail(path, what: str):
    raise GGUFError(f"{path}: {what}")


# GGUF's value types (gguf.GGUFValueType): the fixed-size ones as numpy dtypes
_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
           10: "<u8", 11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


@dataclass
class Field:
    """One metadata key's value: ``types`` as the ``gguf`` package lists them (an array's
    type, then its elements'), ``value`` an int, float, bool, str or list of them."""
    types: list
    value: object

    def contents(self):
        return self.value


@dataclass
class TensorInfo:
    """One row of the file's tensor table; ``data`` a view of the mapping (None where the
    tensor would run past the end of the file, which :func:`_tensors` reports)."""
    name: str
    tensor_type: int
    shape: tuple
    n_bytes: int
    data_offset: int
    data: object


class Reader:
    """A GGUF file's metadata and tensor table, its tensors views of one read-only mapping.

    Written here rather than taken from ``gguf.GGUFReader``, which makes a numpy view for
    every element of every array: a 151 936-token vocabulary took it 25 s, and takes this 0.3.
    Every length is checked against the bytes that remain before anything is read, so a
    damaged count fails at once instead of looping; any fault raises ValueError (GGUFError's
    base), which :func:`_read` words as one line."""

    def __init__(self, path):
        import gguf

        self.mm = np.memmap(path, dtype=np.uint8, mode="r")
        self.buf = memoryview(self.mm)
        self.pos = 4
        version = self._fixed("<u4")
        if version & 0xFFFF == 0:
            raise ValueError("a big-endian GGUF file")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (this reads 2 and 3)")
        n_tensors, n_kv = self._fixed("<u8"), self._fixed("<u8")
        self._room(n_kv, 13, "metadata keys")
        self.fields = {}
        for _ in range(n_kv):
            key = self._string()
            self.fields[key] = self._field(self._fixed("<u4"))
        self._room(n_tensors, 24, "tensors")
        table = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._fixed("<u4")
            if n_dims > 8:
                raise ValueError(f"tensor {name!r} has {n_dims} dimensions")
            self._room(n_dims, 8, "dimensions")
            dims = tuple(int(x) for x in self._array("<u8", n_dims))
            table.append((name, dims, self._fixed("<u4"), self._fixed("<u8")))
        align = self.fields.get("general.alignment")
        align = 32 if align is None else align.value
        if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
            raise ValueError(f"general.alignment {align!r} is not a power of two")
        start = -(-self.pos // align) * align
        size = len(self.mm)
        self.tensors = []
        for name, dims, kind, offset in table:
            try:
                per, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
            except (ValueError, KeyError):
                raise ValueError(f"tensor {name!r} is of type {kind}, which ggml does not know") from None
            n = int(np.prod(dims, dtype=object)) if dims else 1
            n_bytes, at = n // per * nbytes, start + offset
            data = None
            if at + n_bytes <= size:
                raw = self.mm[at:at + n_bytes]
                shape = tuple(reversed(dims))
                if kind in (0, 1):  # F32, F16: the values; any other type: bytes a row
                    data = raw.view("<f4" if kind == 0 else "<f2").reshape(shape)
                elif dims[0] % per:
                    raise ValueError(f"tensor {name!r}: rows of {dims[0]} do not fill its "
                                     f"type's blocks of {per}")
                else:
                    data = raw.reshape(shape[:-1] + (dims[0] // per * nbytes,))
            self.tensors.append(TensorInfo(name, kind, dims, n_bytes, at, data))

    def _room(self, count: int, each: int, what: str) -> None:
        if count * each > len(self.buf) - self.pos:
            raise ValueError(f"{count} {what} cannot fit in the {len(self.buf) - self.pos} "
                             f"bytes left")

    def _array(self, dtype: str, count: int):
        dt = np.dtype(dtype)
        self._room(count, dt.itemsize, "values")
        out = np.frombuffer(self.buf, dt, count, self.pos)
        self.pos += count * dt.itemsize
        return out

    def _fixed(self, dtype: str):
        return self._array(dtype, 1)[0].item()

    def _string(self) -> str:
        n = self._fixed("<u8")
        self._room(n, 1, "string bytes")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def _strings(self, count: int) -> list:
        """``count`` strings at once (a vocabulary: 262 144 of them in gemma's)."""
        import struct

        buf, pos, end, out = self.buf, self.pos, len(self.buf), []
        length = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise ValueError("a string runs past the end of the file")
            (n,) = length(buf, pos)
            if pos + 8 + n > end:
                raise ValueError("a string runs past the end of the file")
            out.append(str(buf[pos + 8:pos + 8 + n], "utf-8"))
            pos += 8 + n
        self.pos = pos
        return out

    def _field(self, kind: int) -> Field:
        if kind in _SCALAR:
            return Field([kind], self._fixed(_SCALAR[kind]))
        if kind == _STRING:
            return Field([kind], self._string())
        if kind != _ARRAY:
            raise ValueError(f"metadata value type {kind}")
        sub, n = self._fixed("<u4"), self._fixed("<u8")
        if sub in _SCALAR:
            return Field([kind, sub], self._array(_SCALAR[sub], n).tolist())
        if sub == _STRING:
            self._room(n, 8, "strings")
            return Field([kind, sub], self._strings(n))
        self._room(n, 12, "arrays")
        items = [self._field(sub) for _ in range(n)]
        return Field([kind, *(items[0].types if items else [sub])], [f.value for f in items])


def _read(path: Path) -> Reader:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        _fail(path, f"cannot be read ({e.strerror or e})")
    if magic != b"GGUF":
        _fail(path, "not a GGUF file (it does not begin with the bytes 'GGUF')")
    try:
        return Reader(path)
    except Exception as e:  # noqa: BLE001 - a damaged file fails wherever its parse goes wrong
        _fail(path, f"damaged or truncated GGUF file ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else 'no detail'})")


def _value(f):
    """A scalar field's value, a string field's text, or an array field's list."""
    return f.contents() if f.types else None


def _fields(path, reader) -> tuple[dict, dict]:
    meta, tok = {}, {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            if key.startswith("tokenizer.ggml."):
                tok[key[len("tokenizer.ggml."):]] = _value(f)
            elif (f.types[0] == _ARRAY and len(f.value) > 64
                  and not key.endswith(".sliding_window_pattern")):
                continue
            else:
                meta[key] = _value(f)
        except (UnicodeDecodeError, IndexError, ValueError) as e:
            _fail(path, f"metadata key {key!r} cannot be read ({type(e).__name__})")
    return meta, tok


def _need(path, meta, key, kind=int, default=None):
    if key not in meta:
        if default is not None:
            return default
        _fail(path, f"metadata key {key!r} is missing")
    v = meta[key]
    if kind is int and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
        _fail(path, f"metadata key {key!r} is {v!r}, expected a positive integer")
    if kind is float and not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
        _fail(path, f"metadata key {key!r} is {v!r}, expected a positive number")
    return kind(v)


def _hyper(path, meta, tok, tensors) -> Hyper:
    name = meta.get("general.architecture")
    if not isinstance(name, str):
        _fail(path, "metadata key 'general.architecture' is missing")
    if name not in ARCHS:
        _fail(path, f"architecture {name!r} is not supported (supported: {', '.join(ARCHS)})")
    def k(n):
        return meta_key(name, n)

    d = _need(path, meta, k("d"))
    n_head = _need(path, meta, k("n_head"))
    n_kv = _need(path, meta, k("n_kv_head"), default=n_head)
    if n_head % n_kv:
        _fail(path, f"{n_head} query heads cannot share {n_kv} key/value heads evenly")
    hd = _need(path, meta, k("head_dim"), default=d // n_head)
    vocab = len(tok["tokens"]) if isinstance(tok.get("tokens"), list) else None
    if vocab is None:
        _fail(path, "metadata key 'tokenizer.ggml.tokens' is missing")
    rope_dim = _need(path, meta, k("rope_dim"), default=hd)
    if rope_dim > hd or rope_dim % 2:
        _fail(path, f"{KEYS['rope_dim'][0]} {rope_dim} does not fit a head of {hd}")
    n_layer = _need(path, meta, k("n_layer"))
    arch = ARCHS[name]
    window, swa, base_swa = 0, (), 10000.0
    if arch.swa_period and meta.get(k("window"), 0) != 0:
        window = _need(path, meta, k("window"))
        swa = _swa_layers(path, meta.get(k("swa_pattern")), n_layer, arch.swa_period)
        base_swa = _need(path, meta, k("rope_base_swa"), float, default=10000.0)
    softcap = 0.0
    if k("softcap") in meta:
        softcap = _need(path, meta, k("softcap"), float)
    return Hyper(arch=arch, d=d, n_layer=n_layer,
                 n_head=n_head, n_kv_head=n_kv, head_dim=hd,
                 v_dim=_need(path, meta, k("v_dim"), default=hd),
                 hidden=_need(path, meta, k("hidden")), vocab=vocab,
                 context=_need(path, meta, k("context")),
                 eps=_need(path, meta, k("eps"), float),
                 rope_base=_need(path, meta, k("rope_base"), float, default=10000.0),
                 rope_dim=rope_dim, tied=tensor_name("head") not in tensors,
                 window=window, swa_layers=swa, rope_base_swa=base_swa,
                 rope_scale=_rope_scale(path, meta, name),
                 attn_scale=_attn_scale(name, d, n_layer, n_head, hd), softcap=softcap)


def _swa_layers(path, pattern, n_layer: int, period: int) -> tuple:
    """Which layers use the window, as llama.cpp's load_swa_pattern reads them: the file's
    sliding_window_pattern, one bool a layer or a period n (layer i slides unless
    i % n == n - 1; 0: all), or else the architecture's period."""
    if isinstance(pattern, list):
        if len(pattern) != n_layer or not all(isinstance(x, bool) for x in pattern):
            _fail(path, f"attention.sliding_window_pattern has {len(pattern)} entries, "
                        f"expected a bool for each of {n_layer} layers")
        return tuple(pattern)
    if pattern is not None:
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 0:
            _fail(path, f"attention.sliding_window_pattern is {pattern!r}, expected a period "
                        f"or a bool a layer")
        period = pattern
    return tuple(period == 0 or i % period < period - 1 for i in range(n_layer))


def _rope_scale(path, meta, name) -> float:
    """The global layers' angle factor: 1 / rope.scaling.factor for linear scaling (llama.cpp's
    default type), 1 for "none"; other types (yarn, longrope) change the angles otherwise and
    are refused where a factor asks for them."""
    kind = meta.get(meta_key(name, "rope_scaling"), "linear")
    k = meta_key(name, "rope_linear")
    if k not in meta:
        k = meta_key(name, "rope_linear_old")
    factor = meta.get(k, 0.0)
    if factor != 0.0:
        factor = _need(path, meta, k, float)
    if kind == "none" or factor in (0.0, 1.0):
        return 1.0
    if kind != "linear":
        _fail(path, f"rope scaling {kind!r} (factor {factor:g}) is not supported (supported: "
                    f"linear, none)")
    return 1.0 / factor


def _attn_scale(name: str, d: int, n_layer: int, n_head: int, hd: int) -> float:
    """llama.cpp's f_attention_scale, in float32: 1/sqrt(head_dim), but for gemma3's 27B
    (62 layers, as llama.cpp tells it) 1/sqrt(d / n_head)."""
    n = d // n_head if name == "gemma3" and n_layer == 62 else hd
    return float(np.float32(1) / np.sqrt(np.float32(n)))


def rope_angles(h: Hyper, positions, freqs=None, swa: bool = False) -> np.ndarray:
    """(len(positions), rope_dim / 2) angles, in float64: position times
    base^(-2i / rope_dim), divided by ``freqs`` (llama 3's factors) where given. ``swa``: the
    angles of a sliding-window layer (``h.is_swa(layer)``), base ``rope_base_swa`` and no
    scaling, as llama.cpp's get_rope_freq_base/scale give them; else base ``rope_base`` times
    the file's linear scaling ``rope_scale``."""
    i = np.arange(0, h.rope_dim, 2, dtype=np.float64)
    base, scale = (h.rope_base_swa, 1.0) if swa else (h.rope_base, h.rope_scale)
    theta = base ** (-i / h.rope_dim) * scale
    if freqs is not None:
        theta = theta / np.asarray(freqs, np.float64)
    return np.asarray(positions, np.float64)[:, None] * theta[None, :]


def expected_shapes(h: Hyper) -> dict:
    """{tensor name: ne} of every tensor the forward reads, as the file stores it (a fused
    architecture's parts as their one matrix; ``rope_freqs.weight`` only where the file has
    it, which :func:`open_model` checks apart)."""
    out = {p.gguf: p.ne(h) for p in TOP if p.when(h)}
    fused = {part: whole for whole, parts in FUSED for part in parts} if h.arch.fused else {}
    for i in range(h.n_layer):
        for p in LAYER:
            if not p.when(h):
                continue
            if p.ours not in fused:
                out[tensor_name(p.ours, i)] = p.ne(h)
                continue
            whole = tensor_name(fused[p.ours], i)  # its width adds up the parts' in their order
            d, n = out.get(whole, (p.ne(h)[0], 0))
            out[whole] = (d, n + p.ne(h)[1])
    return out


def _tensors(path, reader) -> dict:
    import gguf

    size = os.path.getsize(path)
    out = {}
    for t in reader.tensors:
        try:
            tname = gguf.GGMLQuantizationType(int(t.tensor_type)).name
        except ValueError:
            tname = f"type {int(t.tensor_type)}"
        ne = tuple(int(x) for x in t.shape)
        n = int(np.prod(ne)) if ne else 0
        if tname in TYPES:
            per, nbytes = TYPES[tname]
            if ne[0] % per:
                _fail(path, f"tensor {t.name!r}: rows of {ne[0]} do not fill {tname}'s "
                            f"blocks of {per}")
            want = n // per * nbytes
        else:
            want = None
        end = int(t.data_offset) + (want if want is not None else int(t.n_bytes))
        if end > size:
            _fail(path, f"tensor {t.name!r} ends at byte {end}, past the end of the file "
                        f"({size} bytes): the file is truncated")
        if want is not None and t.data.nbytes != want:
            _fail(path, f"tensor {t.name!r} has {t.data.nbytes} bytes, {tname} {list(ne)} "
                        f"needs {want}")
        if t.name in out:
            _fail(path, f"tensor {t.name!r} appears twice")
        out[t.name] = Tensor(t.name, tname, ne, t.data)
    return out


def read_metadata(path) -> tuple[dict, dict]:
    """(metadata, tokenizer keys) of a GGUF file, tensors unread: enough for a vocabulary
    file such as llama.cpp's ggml-vocab-*.gguf."""
    path = Path(path)
    return _fields(path, _read(path))


def open_model(path) -> ModelFile:
    """Read and check a GGUF file of a supported architecture (see the module docstring)."""
    path = Path(path)
    reader = _read(path)
    meta, tok = _fields(path, reader)
    tensors = _tensors(path, reader)
    h = _hyper(path, meta, tok, tensors)
    for name, ne in expected_shapes(h).items():
        t = tensors.get(name)
        if t is None:
            _fail(path, f"tensor {name!r} is missing")
        if t.ne != ne:
            _fail(path, f"tensor {name!r} has shape {list(t.ne)}, the metadata implies {list(ne)}")
        if t.type not in TYPES:
            _fail(path, f"tensor {name!r} is {t.type}, which is not supported "
                        f"(supported: {', '.join(TYPES)})")
        if len(ne) == 1 and t.type != "F32":
            _fail(path, f"tensor {name!r} is {t.type}; norms and biases must be F32")
    if tensor_name("rope_freqs") in tensors:
        t = tensors[tensor_name("rope_freqs")]
        if t.ne != (h.rope_dim // 2,) or t.type != "F32":
            _fail(path, f"tensor 'rope_freqs.weight' is {t.type} {list(t.ne)}, expected F32 "
                        f"[{h.rope_dim // 2}]")
    long_rope = sorted(n for n in tensors if n.startswith("rope_factors_")
                       or ".rope_factors_" in n)
    if long_rope:  # phi3's 128k variants: other angles and a scaled attention, not built here
        _fail(path, f"tensor {long_rope[0]!r}: long-context RoPE factors are not supported")
    if h.arch.fused:
        tensors = _split_fused(h, tensors)
    return ModelFile(path, h, meta, tensors, tok, reader)


def _split_fused(h: Hyper, tensors: dict) -> dict:
    """phi3's fused matrices as the separate ones the forward reads: attn_qkv's rows are q's,
    then k's, then v's; ffn_up's are the gate's, then up's (ggml's swiglu takes silu of the
    first half). A row is whole blocks of any type, so each part is a view of the mapping's
    rows, no copy. The fused names leave the table, so no byte counts twice."""
    out = dict(tensors)
    for i in range(h.n_layer):
        for whole, parts in FUSED:
            t = out.pop(tensor_name(whole, i))
            rows = np.asarray(t.data).reshape(t.ne[1], -1)
            r0 = 0
            for part in parts:
                n, full = _BY_OURS[part].ne(h)[1], tensor_name(part, i)
                out[full] = Tensor(full, t.type, (t.ne[0], n), rows[r0:r0 + n])
                r0 += n
    return out
