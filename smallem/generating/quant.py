"""Weights for decoding: int8 with a scale per block of 32, and the tiled layouts that
``kernels_c/forward.c`` streams.

A weight matrix W is (K, N), as the model stores it (y = x W). Its int8 form follows
llama.cpp's Q8_0 exactly, so that the same bytes can be exported to GGUF: each column is
cut into blocks of :data:`QBLOCK` = 32 along K; a block's scale is s = max|w| / 127,
stored as float16, and its weights q = round(w / s) (half away from zero, with s before
rounding to float16), so that w is approximately s q.

:func:`pack_f32` and :func:`pack_q8` reorder a matrix into tiles of :data:`TILE` = 16
output columns (see the comment at the top of ``kernels_c/forward.c``); :class:`Packed`
holds the arrays and the C struct that points at them. :func:`f32_to_bf16` and
:func:`bf16_to_f32` are the other format the products take: bf16, rounded to nearest even.
"""

from __future__ import annotations

import numpy as np

from smallem.plumbing.memory import huge_copy

QBLOCK = 32  # weights per scale, along K
TILE = 16    # output columns per tile: one 64-byte line of f32, or of 16 x 4 int8
GROUP = 8    # tiles whose lines are interleaved, so that a decode block reads one stream


def _pad(n: int, m: int) -> int:
    return -(-n // m) * m


def _round(x: np.ndarray) -> np.ndarray:
    """Round half away from zero, as C's roundf (and ggml's Q8_0) does; numpy's is to even."""
    return np.trunc(x + np.copysign(0.5, x))


def quantize_q8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W (K, N) float -> (q int8 (K32, N), s float16 (K32 / 32, N)), K padded with zeros."""
    w = np.asarray(w, np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_q8: expected a (K, N) matrix, got shape {w.shape}")
    K, N = w.shape
    K32 = _pad(K, QBLOCK)
    wp = np.zeros((K32, N), np.float32)
    wp[:K] = w
    blocks = wp.reshape(K32 // QBLOCK, QBLOCK, N)
    amax = np.abs(blocks).max(axis=1)                       # (nb, N)
    d = amax / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    q = _round(blocks * inv[:, None, :]).clip(-127, 127).astype(np.int8)
    return q.reshape(K32, N), d.astype(np.float16)


def dequantize_q8(q: np.ndarray, s: np.ndarray, K: int | None = None,
                  dtype=np.float64) -> np.ndarray:
    """The weights an int8 matrix stands for: (K, N) in ``dtype`` (float64 for references)."""
    K32, N = q.shape
    w = q.astype(dtype).reshape(K32 // QBLOCK, QBLOCK, N) * s.astype(dtype)[:, None, :]
    return w.reshape(K32, N)[:K if K is not None else K32]


def group_lines(tiles: np.ndarray) -> np.ndarray:
    """[tile][row][...] -> the flat decoder order: groups of GROUP tiles (the last one
    possibly fewer), each group [row][tile in group][...], so that a group's lines
    interleave (``kernels_c/forward.c``'s layout comment)."""
    parts = [np.ascontiguousarray(tiles[g:g + GROUP].swapaxes(0, 1)).reshape(-1)
             for g in range(0, tiles.shape[0], GROUP)]
    return np.concatenate(parts)


def ungroup_lines(flat: np.ndarray, shape: tuple) -> np.ndarray:
    """The inverse of :func:`group_lines`: flat -> [tile][row][...] of ``shape``."""
    out = np.empty(shape, flat.dtype)
    per_tile = int(np.prod(shape[1:]))
    at = 0
    for g in range(0, shape[0], GROUP):
        n = min(GROUP, shape[0] - g)
        block = flat[at:at + n * per_tile].reshape(shape[1], n, *shape[2:])
        out[g:g + n] = block.swapaxes(0, 1)
        at += n * per_tile
    return out


def pack_f32(w: np.ndarray) -> np.ndarray:
    """(K, N) -> the decoder's f32 lines (flat float32): tiles [N16/16][K][16], grouped."""
    K, N = w.shape
    N16 = _pad(N, TILE)
    wp = np.zeros((K, N16), np.float32)
    wp[:, :N] = w
    return group_lines(wp.reshape(K, N16 // TILE, TILE).transpose(1, 0, 2))


def pack_q8(q: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(q (K32, N), s (K32/32, N)) -> (int8 lines of tiles [N16/16][K32/4][16][4], grouped;
    scales [N16/16][K32/32][16] as uint16 bits of float16, grouped the same way), each flat."""
    K32, N = q.shape
    N16, nb = _pad(N, TILE), K32 // QBLOCK
    qp = np.zeros((K32, N16), np.int8)
    qp[:, :N] = q
    sp = np.zeros((nb, N16), np.float16)
    sp[:, :N] = s
    tiles = qp.reshape(K32 // 4, 4, N16 // TILE, TILE).transpose(2, 0, 3, 1)
    scales = sp.reshape(nb, N16 // TILE, TILE).transpose(1, 0, 2)
    return group_lines(tiles), group_lines(scales).view(np.uint16)


class Packed:
    """One weight matrix in the decoder's layout (``kind`` "f32" or "int8"), with its bias,
    and the ``sm_mat`` struct :mod:`smallem.generating.decode`'s C calls take. The arrays it points
    at live as long as this object."""

    def __init__(self, w: np.ndarray, kind: str = "f32", bias: np.ndarray | None = None):
        w = np.asarray(w)
        if w.ndim != 2:
            raise ValueError(f"a weight matrix is (K, N), got shape {w.shape}")
        if kind not in ("f32", "int8"):
            raise ValueError(f"kind: expected 'f32' or 'int8', got {kind!r}")
        self.K, self.N = w.shape
        self.kind = kind
        self.bias = None if bias is None else np.ascontiguousarray(bias, np.float32)
        if self.bias is not None and self.bias.shape != (self.N,):
            raise ValueError(f"bias: expected shape ({self.N},), got {self.bias.shape}")
        # in huge pages (smallem.plumbing.memory): a step's speed then no longer depends on
        # which pages a process's allocator happened to hand the weights
        if kind == "f32":
            self.f = huge_copy(pack_f32(np.asarray(w, np.float32)))
            self.q = self.s = None
        else:
            self.q8 = quantize_q8(w)
            self.f = None
            self.q, self.s = (huge_copy(x) for x in pack_q8(*self.q8))

    @property
    def nbytes(self) -> int:
        """Bytes one product reads: the weights, with their scales."""
        parts = (self.f,) if self.kind == "f32" else (self.q, self.s)
        return int(sum(p.nbytes for p in parts))

    def dequantized(self, dtype=np.float64) -> np.ndarray:
        """The (K, N) weights the product multiplies by (int8: scale times q)."""
        if self.kind == "f32":
            tiles = ungroup_lines(self.f, (_pad(self.N, TILE) // TILE, self.K, TILE))
            return tiles.transpose(1, 0, 2).reshape(self.K, -1)[:, :self.N].astype(dtype)
        return dequantize_q8(*self.q8, self.K, dtype)[:, :self.N]

    def fill(self, ffi, mat):
        """Point the C struct ``mat`` (an ``sm_mat``) at this matrix's arrays."""
        mat.K, mat.N, mat.kind = self.K, self.N, int(self.kind == "int8")
        null = ffi.NULL
        mat.f = ffi.cast("float *", self.f.ctypes.data) if self.f is not None else null
        mat.q = ffi.cast("int8_t *", self.q.ctypes.data) if self.q is not None else null
        mat.s = ffi.cast("uint16_t *", self.s.ctypes.data) if self.s is not None else null
        mat.bias = ffi.cast("float *", self.bias.ctypes.data) if self.bias is not None else null


# ---------------------------------------------------------------- bf16
# bf16 is the top half of a float32: one format for the CPU's products and the GPU's.

def f32_to_bf16(x) -> np.ndarray:
    """Round float32 to bf16 (nearest, ties to even), returned as uint16 bits."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    if nan.any():  # keep NaN a NaN (rounding could carry it into infinity): quiet, same sign
        out[nan] = ((u[nan] >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return out


def bf16_to_f32(h) -> np.ndarray:
    """Widen bf16 bits (uint16) to float32: exact, a 16-bit shift."""
    h = np.asarray(h)
    if h.dtype != np.uint16:
        raise TypeError(f"h: expected dtype uint16 (bf16 bits), got {h.dtype}")
    return (h.astype(np.uint32) << np.uint32(16)).view(np.float32)
