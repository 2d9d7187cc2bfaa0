"""Generating text: one forward in C (``kernels_c/forward.c``) for every architecture, and the
one class that runs it.

:class:`Forward` packs the C structs from a :class:`Spec` (the architecture's switches, its
shapes, and each weight matrix in its kind: chapter 4's tiles or a GGUF file's blocks), owns
the key/value cache and the work space, measures once the size below which a product stays on
one core, and takes every call down the same C function: a token, or a prompt's rows, whose
products go through chapter 2's GEMM from a length on (the GEMM branch of the C forward, not
a second forward in Python). Two constructors make a Spec: :meth:`Forward.from_gpt` for a
model chapter 3 trained (GPT-2's block or the modern one; chapter 4's decoders,
:class:`smallem.generating.decode.Decoder`), :meth:`Forward.from_gguf` for a GGUF file (appendix B,
``smallem run``).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from smallem import checks
from smallem.cpu import isa, machine
from smallem.plumbing import build
from smallem.plumbing import pool as _pool


# The C side's ids are kernels_c/forward.h's enums, read from there (the names below, and
# KIND_BLOCKS); tests/test_forward_ids.py checks each against the compiled library.
def _names(prefix: str) -> tuple:
    """kernels_c/forward.h's enum members PREFIX_*, as names in the order of their ids (a
    new kind of norm, MLP, RoPE or cache is a member there and its code in C, no line here)."""
    ids = build.header_enum(prefix, "forward.h")
    return tuple(sorted(ids, key=ids.get))


NORMS = _names("NORM")      # layer, rms
MLPS = _names("MLP")        # gelu, swiglu, geglu
ROPES = tuple(None if r == "none" else r for r in _names("ROPE"))   # None, pairs, neox
CACHES = _names("CACHE")    # chapter 4's f32 key tiles, llama.cpp's f16 rows, or the
#                             recurrent block's state (appendix D)
# a call's parts as the C side sums them where sm_model.parts is set (forward.h's PART_*: each
# part's seconds, and "teamed", the count of parallel regions that met as a team)
_PART_IDS = build.header_enum("PART", "forward.h")
PART_COUNT = _PART_IDS.pop("count")
PARTS = tuple(sorted(_PART_IDS, key=_PART_IDS.get))
INT_MAX = 2**31 - 1
GEMM_BLOCK = 512   # a prompt's rows per C call on the GEMM branch: wide enough for the GEMM
KIND_BLOCKS = build.header_enum("KIND", "forward.h")["blocks"]  # sm_mat.kind of a GGUF
# tensor (chapter 4's f32 and int8 tiles are the others)
# ggml's type numbers (the file format's, which the gguf package holds too), as forward.h
# names them (T_*; but our own repacked Q8_0 pairs)
GGML_IDS = {k.upper(): v for k, v in build.header_enum("T", "forward.h").items()
            if k != "q8_0x2"}
Q8_0_ID = GGML_IDS["Q8_0"]
Q4_0_ID = GGML_IDS["Q4_0"]
Q4_K_ID = GGML_IDS["Q4_K"]
Q5_0_ID = GGML_IDS["Q5_0"]
# the GGUF types with a decode layout in tiles (:class:`Tiled`), by id: the C function that
# repacks them, the bytes of tile a row takes per 32 weights (Q8_0's int8, the others' nibbles
# kept, Q5_0's fifth bits beside them), the halves of scales a row takes per 256 weights, and
# what K must be a multiple of
TILE_TYPES = {Q8_0_ID: ("sm_g_tile_q8_0", 32, 8, 32), Q4_0_ID: ("sm_g_tile_q4_0", 16, 8, 32),
              Q5_0_ID: ("sm_g_tile_q5_0", 20, 8, 32), Q4_K_ID: ("sm_g_tile_q4_k", 16, 10, 256)}
TILE_TYPE_NAMES = tuple(next(n for n, i in GGML_IDS.items() if i == t) for t in TILE_TYPES)

ERRORS = {-1: "no tokens", -2: "past the context", -3: "workspace too small",
          -4: "a token id outside the vocabulary",
          -5: "a sliding window or a value width other than the keys' with chapter 4's tiles",
          -6: "more threads than the workspace was carved for"}


class ForwardError(RuntimeError):
    """The C forward refused a call (its code, in words)."""


@dataclass
class Spec:
    """An architecture as the C forward takes it: shapes, switches, and the weights. A matrix
    is anything with ``fill(ffi, sm_mat)`` and ``nbytes`` (:class:`smallem.generating.quant.Packed`,
    :class:`Blocks`); a vector a float32 array or None. ``layers``: one dict a layer, keyed
    by sm_layer's field names (``window`` an int, the rest matrices or vectors)."""
    n_layer: int
    d: int
    n_head: int
    n_kv_head: int
    head_dim: int
    v_dim: int
    hidden: int
    vocab: int
    context: int
    norm: str
    mlp: str
    rope: str | None
    rope_dim: int
    cache: str
    eps: float
    attn_scale: float
    embd: object
    head: object
    layers: list
    switches: dict = field(default_factory=dict)  # sm_model's other fields by name (an
    # architecture's: q_prescaled, embed_scale, softcap -- Hyper.switches), C's zero (off)
    # for those not given
    wpe: np.ndarray | None = None
    out_norm_w: np.ndarray | None = None
    out_norm_b: np.ndarray | None = None
    rope_cos: np.ndarray | None = None
    rope_sin: np.ndarray | None = None
    block_rows: int = 32
    extra: dict = field(default_factory=dict)  # what a caller keeps beside (e.g. the model)


class Blocks:
    """A GGUF tensor for the C side: its rows in the file's blocks, straight from the mapping
    (nothing copied)."""

    def __init__(self, t):
        import gguf

        data = np.asarray(t.data)
        if not data.flags.c_contiguous:
            raise ValueError(f"tensor {t.name!r}: its bytes are not contiguous")
        self.t, self.data, self.tiled = t, data, None
        self.K, self.N = t.ne[0], (t.ne[1] if len(t.ne) > 1 else 1)
        self.type = int(gguf.GGMLQuantizationType[t.type])
        self.nbytes = t.nbytes

    def fill(self, ffi, mat):
        mat.kind, mat.type, mat.K, mat.N = KIND_BLOCKS, self.type, self.K, self.N
        mat.w = ffi.cast("const uint8_t *", self.data.ctypes.data)
        mat.row_bytes = self.nbytes // self.N


class Tiled:
    """A GGUF Q8_0, Q4_0, Q5_0 or Q4_K tensor with its decode layout: the file's blocks (the
    prompt's GEMM and the embedding read them) and, beside them, the same integers and scales
    repacked once into chapter 4's tiles (:data:`TILE_TYPES`: Q4_0, Q5_0 and Q4_K keep their
    nibbles), which every product below the GEMM branch streams instead of the rows.
    ``nbytes``: the tiles' bytes, what a token reads."""

    def __init__(self, blocks: Blocks, ffi, lib):
        if not tileable(blocks):
            raise ValueError("only a Q8_0, Q4_0 or Q5_0 matrix of a K a multiple of 32, or a "
                             "Q4_K one, has tiles")
        self.blocks, self.K, self.N, self.type = blocks, blocks.K, blocks.N, blocks.type
        n16 = -(-self.N // 16) * 16
        fn, per, halves, _ = TILE_TYPES[self.type]
        self.q = np.zeros(n16 * self.K * per // 32, np.uint8)
        self.s = np.zeros(n16 * self.K * halves // 256, np.uint16)
        src = ffi.new("sm_mat *")
        blocks.fill(ffi, src)
        ctype = "int8_t *" if self.type == Q8_0_ID else "uint8_t *"
        if getattr(lib, fn)(src, ffi.cast(ctype, self.q.ctypes.data),
                            ffi.cast("uint16_t *", self.s.ctypes.data)):
            raise ValueError("the C side refused to tile the matrix")
        self.nbytes = self.q.nbytes + self.s.nbytes

    def fill(self, ffi, mat):
        self.blocks.fill(ffi, mat)
        mat.q = ffi.cast("int8_t *", self.q.ctypes.data)
        mat.s = ffi.cast("uint16_t *", self.s.ctypes.data)


def tileable(w) -> bool:
    """Whether a matrix has a decode layout in tiles: a GGUF Q8_0, Q4_0 or Q5_0 tensor of a K
    a multiple of 32, or a Q4_K one (:data:`TILE_TYPES`)."""
    return (isinstance(w, Blocks) and w.type in TILE_TYPES
            and w.K % TILE_TYPES[w.type][3] == 0)


class Rows:
    """A float32 (N, K) array as a GGUF F32 tensor (chapter 4's embedding table)."""

    def __init__(self, a):
        self.data = np.ascontiguousarray(a, np.float32)
        self.N, self.K = self.data.shape
        self.nbytes = self.data.nbytes

    def fill(self, ffi, mat):
        mat.kind, mat.type, mat.K, mat.N = KIND_BLOCKS, 0, self.K, self.N
        mat.w = ffi.cast("const uint8_t *", self.data.ctypes.data)
        mat.row_bytes = 4 * self.K


def module(team, level=None):
    """forward.c's module for a team (its pool variant on chapter 3's pool)."""
    return team.module("forward", level)


class Forward:
    """The C forward of one model, with its cache: ``forward(tokens)`` continues the cache and
    returns the last row's logits (every row's with ``all_logits``); ``step(token)`` one token,
    with no allocation. ``threads`` for every product and the attention (None: every core), on
    chapter 3's pool where ``pool``; ``par_min_bytes`` the size below which a matrix stays on
    one core (None: measured when made); ``gemm_rows`` the prompt length from which a call
    takes the GEMM branch (None: never, for a Spec whose matrices have no plain or block
    form); ``prompt_dtype`` that branch's inputs for GGUF blocks ("int8", "f32" or "bf16"; None:
    :func:`default_prompt_dtype`); ``prompt_threads`` the threads of that branch's calls
    (None: ``threads``), so a decoder whose tokens run on one core can still take its prompt
    through chapter 2's GEMM on every core, as chapter 4's rungs 1 to 4 do; ``ahead`` the
    bytes ahead of its reading that a GGUF matrix's product prefetches (None:
    :func:`prefetch_ahead`, kernels_c/forward/blocks.c's PREFETCH_AHEAD; 0: none);
    ``products`` False, a probe: every GGUF product of a call below the GEMM branch writes
    zeros instead of reading its weights, so that a decode step times everything else (the
    same parallel regions, the norms, the attention, the roundings of the activations);
    ``repack`` False keeps a GGUF Q8_0 matrix's products on the file's rows instead of its
    tiles (:class:`Tiled`, made once a Spec and kept with it)."""

    # A product goes parallel when one core would take SYNC_SHARE fork-joins to stream it.
    # The fork-join is timed in a tight loop, where the waiting thread never stops spinning;
    # inside a token, between regions microseconds apart, one costs several times that on a
    # shared virtual machine (chapter 4's study shows the small models' cost of threads).
    SYNC_SHARE = 32

    def __init__(self, spec: Spec, threads=None, pool: bool = True, par_min_bytes=None,
                 level=None, gemm_rows=None, prompt_dtype=None, prompt_threads=None,
                 ahead=None, products: bool = True, repack: bool = True):
        for name, allowed in (("norm", NORMS), ("mlp", MLPS), ("rope", ROPES), ("cache", CACHES)):
            if getattr(spec, name) not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {getattr(spec, name)!r}")
        self.spec = s = spec
        self.context = s.context
        self.team = _pool.team(threads, pool)
        self.threads = self.team.n
        self.prompt_threads = (self.threads if prompt_threads is None
                               else _pool.team(prompt_threads, pool).n)
        self.level = level
        self.ffi, self.lib = ffi, lib = module(self.team, level)
        self._keep = []
        m = self._m = ffi.new("sm_model *")
        layers = self._layers = ffi.new("sm_layer[]", s.n_layer)
        self.mats = []

        def vec(a):
            if a is None:
                return ffi.NULL
            a = np.ascontiguousarray(a, np.float32)
            self._keep.append(a)
            return ffi.cast("float *", a.ctypes.data)

        def mat(dst, w, count=True):
            if w is None:
                dst.N = 0
                return
            if repack and count and tileable(w):
                if getattr(w, "tiled", None) is None:  # once a Spec: the copy is the model's size
                    w.tiled = Tiled(w, ffi, lib)
                w = w.tiled
            w.fill(ffi, dst)
            self._keep.append(w)
            if count:
                self.mats.append(w)

        for i, L in enumerate(s.layers):
            dst = layers[i]
            for name, value in L.items():
                if name == "window":
                    dst.window = int(value)
                elif name in ("qkv", "q", "k", "v", "o", "up", "gate", "down", "decay"):
                    mat(getattr(dst, name), value)
                else:
                    setattr(dst, name, vec(value))
        for name in ("n_layer", "d", "n_head", "n_kv_head", "head_dim", "v_dim", "hidden",
                     "vocab", "context", "rope_dim"):
            setattr(m, name, int(getattr(s, name)))
        m.norm, m.mlp = NORMS.index(s.norm), MLPS.index(s.mlp)
        m.rope, m.cache = ROPES.index(s.rope), CACHES.index(s.cache)
        m.eps, m.attn_scale = s.eps, s.attn_scale
        for name, value in s.switches.items():  # packed by name: a new switch is no line here
            try:
                setattr(m, name, value)
            except AttributeError:
                raise ValueError(f"sm_model has no field {name!r} (kernels_c/forward.h)") from None
        mat(m.embd, s.embd, count=False)
        mat(m.head, s.head)
        m.wpe, m.out_norm_w, m.out_norm_b = vec(s.wpe), vec(s.out_norm_w), vec(s.out_norm_b)
        m.rope_cos, m.rope_sin = vec(s.rope_cos), vec(s.rope_sin)
        m.layers = layers
        C, nkv = s.context, s.n_kv_head
        if s.cache == "state":  # the recurrent block: one hd x hd state a head, no positions
            self.k = np.zeros((s.n_layer, s.n_head, s.head_dim, s.head_dim), np.float32)
            self.v = np.zeros(1, np.float32)
        elif s.cache == "tiles":  # keys in tiles of 16 positions, (context/16, hd, 16) per head
            self.k = np.zeros((s.n_layer, nkv, -(-C // 16), s.head_dim, 16), np.float32)
            self.v = np.zeros((s.n_layer, nkv, C, s.v_dim), np.float32)
        else:
            self.k = np.zeros((s.n_layer, C, nkv, s.head_dim), np.float16)
            self.v = np.zeros((s.n_layer, C, nkv, s.v_dim), np.float16)
        m.k_cache = ffi.cast("void *", self.k.ctypes.data)
        m.v_cache = ffi.cast("void *", self.v.ctypes.data)
        m.block_rows = s.block_rows
        m.max_threads = max(self.threads, self.prompt_threads)
        self.gemm_rows = None if gemm_rows is None else max(2, int(gemm_rows))
        self.prompt_dtype = None
        if self.gemm_rows is not None:
            from smallem.product import gemm

            order, mc, kc, nc = gemm.default_config(level)
            m.gemm_order, m.gemm_mc, m.gemm_kc, m.gemm_nc = order, mc, kc, nc
            m.amx_kc, m.amx_nc = gemm.kernels(level).amx  # the AMX path's own blocks
            m.gemm_block_rows = GEMM_BLOCK
            self.prompt_dtype = prompt_dtype or default_prompt_dtype(level)
            if self.prompt_dtype not in PROMPT_DTYPES:
                raise ValueError(f"prompt_dtype: expected one of {PROMPT_DTYPES}, got {prompt_dtype!r}")
            floats = (float_prompt_dtype(level) if self.prompt_dtype == "int8"
                      else self.prompt_dtype)
            m.gemm_bf16 = (gemm.BF16_PATHS.index(gemm.bf16_path(level))
                           if floats == "bf16" else -1)
            m.gemm_int8 = INT8_PATHS.index(int8_path(level)) if self.prompt_dtype == "int8" else 0
            self._int8_code = INT8_PATHS.index(int8_path(level))
        m.gemm_rows = INT_MAX
        # a matrix with an integer form: a GGUF type the integer GEMM takes, or chapter 4's
        # int8 weights with their Q8_0 copy
        self.int8_prompt = self.gemm_rows is not None and any(
            int(getattr(w, "int8_type", getattr(w, "type", -1))) in INT8_TYPE_IDS
            for w in self.mats)
        self.work = np.zeros(int(lib.sm_work_floats(m)), np.float32)
        m.work, m.work_floats = ffi.cast("float *", self.work.ctypes.data), self.work.size
        m.par_min_bytes = 0
        self.ahead = m.ahead = (prefetch_ahead() if ahead is None
                                else checks.nonnegative_int(ahead, "ahead"))
        m.products_off = int(not products)
        self.par_min_bytes = (int(par_min_bytes) if par_min_bytes is not None
                              else self._par_min_bytes())
        m.par_min_bytes = self.par_min_bytes
        self.logits = np.zeros(s.vocab, np.float32)
        self._logits_p = ffi.cast("float *", self.logits.ctypes.data)
        self._tok = np.zeros(1, np.int32)
        self._tok_p = ffi.cast("int *", self._tok.ctypes.data)
        self.pos = 0

    # ------------------------------------------------------------ the constructors
    @classmethod
    def from_gguf(cls, mf, context=None, **kw) -> "Forward":
        """A GGUF file's model (:func:`smallem.generating.gguf_file.open_model`): its matrices read in the
        file's blocks; ``context`` the cache's positions (default: the file's, at most
        :data:`DEFAULT_CONTEXT`). The prompt takes the GEMM from :data:`GEMM_MIN_ROWS` rows
        unless ``gemm_rows`` says otherwise."""
        fw = cls(gguf_spec(mf, context), **{"gemm_rows": GEMM_MIN_ROWS, **kw})
        fw.mf, fw.h = mf, mf.hyper
        return fw

    # ------------------------------------------------------------ the threshold
    def _par_min_bytes(self) -> int:
        """Below how many bytes a product (or an attention) runs on one thread: the bytes one
        core streams in SYNC_SHARE fork-joins of the team (the cheapest of several tries of
        each: the machine's cost, not a neighbour's noise). A team that met for less would
        spend more of the token meeting than working. One core's rate is that of a pass over
        every matrix of the model, one product each, as a token reads them (from the level
        that holds the model, not from the L2 that one matrix timed again and again would sit
        in: that rate, three times the L3's on a Xeon, kept products on one core that the team
        streams faster). Measured once on this machine for the team, the level and the
        model's matrices, and kept (:func:`machine.kept`), so every process decodes with the
        same threshold."""
        if self.threads == 1:
            return 0
        dsts = []
        for w in self.mats:
            d = self.ffi.new("sm_mat *")
            w.fill(self.ffi, d)
            dsts.append(d)
        total = sum(w.nbytes for w in self.mats)
        form = [[int(d.kind), int(d.type), int(d.K), int(d.N)] for d in dsts]

        def measure_it():
            fj = min(_pool.fork_join_seconds(self.team.runtime, self.threads, 500)
                     for _ in range(9))
            passes = []
            for _ in range(4):  # the first pass brings the weights to their level
                t = [self.lib.sm_time_product(d, 1) for d in dsts]
                if min(t) <= 0:
                    raise MemoryError("no memory for the product's timing")
                passes.append(sum(t))
            return int(self.SYNC_SHARE * fj * total / min(passes[1:]))

        level = self.level or isa.selected()
        return int(machine.kept("par_min_bytes", [level, sorted(isa.extensions(level)),
                                                  self.team.runtime, self.threads,
                                                  self.SYNC_SHARE, "a pass over the model",
                                                  total, form], measure_it))

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one token reads: every product's matrix (int8's scales too)."""
        return sum(w.nbytes for w in self.mats)

    # ------------------------------------------------------------ the calls
    def reset(self):
        self.pos = 0
        if self.spec.cache == "state":  # a state holds the whole past: a new start is zero
            self.k[...] = 0

    def _check(self, tokens) -> np.ndarray:
        t = np.asarray(tokens)
        if t.ndim > 1 or t.size == 0:
            raise ValueError(f"tokens: expected a non-empty 1-D sequence, got shape {t.shape}")
        if not np.issubdtype(t.dtype, np.integer):
            raise TypeError(f"tokens: expected ints, got {t.dtype}")
        V = self.spec.vocab
        if t.min() < 0 or t.max() >= V:
            raise ValueError(f"tokens: ids must lie in [0, {V}), got {t.min()}..{t.max()}")
        if self.pos + t.size > self.context:
            raise ValueError(f"{t.size} tokens after position {self.pos} do not fit the "
                             f"context of {self.context}")
        return np.ascontiguousarray(t.reshape(-1), np.int32)

    def path(self, n: int) -> str:
        """The path a call of ``n`` rows takes by default: "gemm" from gemm_rows on, else "c"."""
        return "gemm" if self.gemm_rows is not None and n >= self.gemm_rows else "c"

    def forward(self, tokens, all_logits: bool = False, path: str | None = None) -> np.ndarray:
        """The logits after ``tokens`` (the last row's, or every row's with ``all_logits``).
        ``path`` "c": the products of each matrix's own kind; "gemm": the GEMM branch for the
        rows' products (where this forward has it: the integer GEMM for the matrices that have
        an integer form where ``prompt_dtype`` is "int8", chapter 2's float GEMM for the rest);
        "int8": the GEMM branch with the integer GEMM wherever a matrix has an integer form;
        None: :meth:`path`."""
        t = self._check(tokens)
        n = t.size
        path = path or self.path(n)
        if path not in ("c", "gemm", "int8"):
            raise ValueError(f"path: expected 'c', 'gemm' or 'int8', got {path!r}")
        if path != "c" and self.gemm_rows is None:
            raise ValueError(f"path={path!r}: this forward was made without the GEMM branch")
        if path == "int8" and not self.int8_prompt:
            raise ValueError("path='int8': no matrix of this forward has an integer form")
        out = np.empty((n if all_logits else 1, self.spec.vocab), np.float32)
        keep = self._m.gemm_int8
        self._m.gemm_rows = 1 if path != "c" else INT_MAX
        self._m.gemm_int8 = self._int8_code if path == "int8" else keep
        try:
            self._run(t, out, all_logits,
                      self.prompt_threads if path != "c" else self.threads)
        finally:
            self._m.gemm_rows = INT_MAX
            self._m.gemm_int8 = keep
        return out if all_logits else out[0]

    def _run(self, t, out, all_logits, threads):
        rc = self.lib.sm_forward(self._m, self.ffi.cast("int *", t.ctypes.data), t.size, self.pos,
                                 self.ffi.cast("float *", out.ctypes.data), int(all_logits),
                                 threads)
        if rc:
            raise ForwardError(f"sm_forward: {ERRORS.get(rc, rc)}")
        self.pos += t.size

    def parts_on(self) -> np.ndarray:
        """From now on every call adds its parts (:data:`PARTS`) to the array returned, which
        starts at zero: the seconds of the embedding, the norms (and the residual adds), the
        rounding of the products' inputs, the products' parallel regions (the threads'
        meetings included), the positions (biases, the heads' norms and RoPE), the attention
        and the MLP's activation, and the count of regions that met as a team. What a call
        spends besides (its checks, Python's call) is its time less their sum. The clock is
        read twice a part, some 400 times a token."""
        self._parts = np.zeros(PART_COUNT, np.float64)
        self._m.parts = self.ffi.cast("double *", self._parts.ctypes.data)
        return self._parts

    def parts_off(self):
        """Calls stop adding to the array of :meth:`parts_on`."""
        self._m.parts = self.ffi.NULL

    def step(self, token: int) -> np.ndarray:
        """The next token's logits (a view that the next call overwrites)."""
        if not 0 <= token < self.spec.vocab:
            raise ValueError(f"token {token} outside the vocabulary [0, {self.spec.vocab})")
        if self.pos >= self.context:
            raise ValueError(f"the cache is full ({self.context} positions)")
        self._tok[0] = token
        self.lib.sm_forward(self._m, self._tok_p, 1, self.pos, self._logits_p, 0, self.threads)
        self.pos += 1
        return self.logits


PROMPT_DTYPES = ("int8", "bf16", "f32")
# the types the prompt's integer GEMM takes (kernels_c/forward/qgemm.c's sm_q_supported),
# by name and by ggml's number
INT8_TYPES = ("Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K")
INT8_TYPE_IDS = tuple(GGML_IDS[t] for t in INT8_TYPES)
DEFAULT_CONTEXT = 4096  # a GGUF model's cache positions unless the caller asks for more (or fewer)
GGUF_ROWS = 64     # a GGUF prompt's rows per C call off the GEMM: each block of 4 weight rows
                   # meets all of them in L1
GEMM_MIN_ROWS = 64  # from this many prompt rows a GGUF forward takes the GEMM branch


def float_prompt_dtype(level=None) -> str:
    """The GEMM branch's float inputs for GGUF blocks: "bf16" where chapter 2 chose a bf16 path
    that beats its f32 GEMM on this machine (vdpbf16ps where its probe outruns the FMA, or AMX
    tiles), else "f32" (a widened bf16 product is an f32 product with coarser inputs)."""
    from smallem.product import gemm

    return "bf16" if gemm.bf16_path(level) != "widen" else "f32"


PROBE_SHAPE = (128, 512, 1024)  # rows, N, K of the product that picks the prompt's inputs


def prompt_rates(level=None) -> dict:
    """Gop/s on one core of the prompt's products at :data:`PROBE_SHAPE` (the best of 5
    calls each): "int8", the integer GEMM on a Q8_0 matrix (``kernels_c/forward/qgemm.c``)
    on the level's vector kernel, "amx" the same on AMX tiles where the build and the OS
    have them, and "float" the float GEMM with :func:`float_prompt_dtype`'s inputs (its
    panels' dequantisation left out, which favours it). Timed once on this machine for the level and kept
    (:func:`machine.kept`), so that every process, and every call whatever level it names,
    makes the same choice from the same two rates."""
    level = level or isa.selected()
    return _prompt_rates(level)


@functools.lru_cache(maxsize=None)
def _prompt_rates(level: str) -> dict:
    key = [level, sorted(isa.extensions(level)), float_prompt_dtype(level), list(PROBE_SHAPE),
           "amx" if _q_amx(level) else "no amx"]
    return machine.kept("prompt_rates", key, lambda: _time_prompt_rates(level))


def _time_prompt_rates(level: str) -> dict:
    from smallem.product import gemm

    M, N, K = PROBE_SHAPE
    rng = np.random.default_rng(0)
    blocks = np.zeros((N * K // 32, 34), np.uint8)
    blocks[:, :2] = np.full(len(blocks), 0.01, np.float16).view(np.uint8).reshape(-1, 2)
    blocks[:, 2:] = rng.integers(-127, 128, (len(blocks), 32), dtype=np.int8).view(np.uint8)
    x = rng.standard_normal((M, K), np.float32)
    b = rng.standard_normal((N, K), np.float32)
    ffi, lib = build.load("forward", level)
    m = ffi.new("sm_mat *")
    m.kind, m.type, m.K, m.N, m.row_bytes = KIND_BLOCKS, Q8_0_ID, K, N, 34 * K // 32
    m.w = ffi.cast("const uint8_t *", blocks.ctypes.data)
    y = np.zeros((M, N), np.float32)
    calls = {"int8": lambda: lib.sm_q_matmul_path(m, ffi.cast("float *", x.ctypes.data), M,
                                                  ffi.cast("float *", y.ctypes.data), 1, 0)}
    if lib.sm_q_amx():
        calls["amx"] = lambda: lib.sm_q_matmul_path(m, ffi.cast("float *", x.ctypes.data), M,
                                                    ffi.cast("float *", y.ctypes.data), 1, 1)
    if float_prompt_dtype(level) == "bf16":
        xb, bb = gemm.f32_to_bf16(x), gemm.f32_to_bf16(b)
        calls["float"] = lambda: gemm.matmul_bf16(xb, bb, trans_b=True, threads=1, level=level)
    else:
        calls["float"] = lambda: gemm.matmul(x, b, trans_b=True, threads=1, level=level)
    rates = {}
    for name, call in calls.items():
        call()
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - t0)
        rates[name] = 2.0 * M * N * K / best / 1e9
    return rates


INT8_PATHS = ("none", "vector", "amx")  # the C side's gemm_int8: 0, 1, 2


def _q_amx(level) -> bool:
    return bool(build.load("forward", level)[1].sm_q_amx())


def int8_path(level=None) -> str:
    """Where the prompt's integer GEMM runs: "amx" (tiles) where :func:`prompt_rates` timed
    them faster than the level's vector kernel, else "vector"."""
    r = prompt_rates(level)
    return "amx" if r.get("amx", 0.0) > r["int8"] else "vector"


def default_prompt_dtype(level=None) -> str:
    """The GEMM branch's inputs for GGUF blocks: "int8" (the integer GEMM for the types it
    takes, on :func:`int8_path`'s path, the float inputs for the rest) where :func:`prompt_rates`
    timed it faster than the float GEMM here, else :func:`float_prompt_dtype`'s."""
    r = prompt_rates(level)
    return ("int8" if max(r["int8"], r.get("amx", 0.0)) > r["float"]
            else float_prompt_dtype(level))


def prefetch_ahead() -> int:
    """The bytes a GGUF product prefetches ahead of its reading by default: PREFETCH_AHEAD of
    kernels_c/forward/blocks.c."""
    return int(build.header_constant("PREFETCH_AHEAD", "forward/blocks.c"))


def gguf_spec(mf, context=None) -> Spec:
    """The Spec of a GGUF file's model: every switch from its architecture's row
    (:data:`smallem.generating.gguf_file.ARCHS`), every matrix in the file's blocks."""
    from smallem.generating.gguf_file import LAYER, head_name, rope_angles, tensor_name

    h, a = mf.hyper, mf.hyper.arch
    T = mf.tensors
    context = (min(h.context, DEFAULT_CONTEXT) if context is None
               else checks.positive_int(context, "context", limit=h.context))
    vec = lambda n: T[n].dequantize() if n in T else None  # noqa: E731
    blocks = lambda n: Blocks(T[n])  # noqa: E731
    freqs = vec(tensor_name("rope_freqs"))

    def tables(swa):
        ang = rope_angles(h, np.arange(context), freqs, **({"swa": True} if swa else {}))
        return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)

    cos, sin = tables(False)
    swa_tables = None
    layers = []
    for i in range(h.n_layer):
        # every part the file has, by gguf_file's one table: the matrices in their blocks,
        # the vectors in f32 (None where this architecture has none)
        L = {p.ours: (blocks if len(p.ne(h)) == 2 else vec)(tensor_name(p.ours, i))
             for p in LAYER if p.ne is not None}
        if h.is_swa(i):
            if swa_tables is None:
                swa_tables = tables(True)
            L["window"] = h.window
            L["rope_cos"], L["rope_sin"] = swa_tables
        layers.append(L)
    return Spec(
        n_layer=h.n_layer, d=h.d, n_head=h.n_head, n_kv_head=h.n_kv_head, head_dim=h.head_dim,
        v_dim=h.v_dim, hidden=h.hidden, vocab=h.vocab, context=context, norm="rms",
        mlp=a.mlp, rope="neox" if a.rope == "neox" else "pairs", rope_dim=h.rope_dim,
        cache="f16", eps=h.eps, attn_scale=h.attn_scale, switches=h.switches(),
        embd=blocks(tensor_name("embd")), head=blocks(head_name(h)),
        layers=layers, out_norm_w=vec(tensor_name("out_norm_w")), rope_cos=cos,
        rope_sin=sin, block_rows=GGUF_ROWS, extra={"file": mf})
