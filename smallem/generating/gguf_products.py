"""A GGUF file's products in C (``kernels_c/forward/blocks.c``), reading each weight matrix
in the file's own blocks straight from the file's mapping, one at a time, for the tests and
the appendix: the model's forward is the one of every architecture,
:meth:`smallem.generating.forward.Forward.from_gguf`.

Each product first rounds its activation row to the type llama.cpp pairs with the weights'
type (Q8_0 for Q8_0, Q4_0 and Q5_0; Q8_K for Q4_K and Q6_K; F16 and BF16 for themselves),
which is what makes the tokens comparable with llama.cpp's; :func:`quantize` and
:func:`matmul` expose one product, :func:`row` one row decoded. Nothing here copies a
weight: the C side gets the address of each tensor in the mapping and its bytes per row.
"""

from __future__ import annotations

import numpy as np

from smallem import checks
from smallem.plumbing import build, pool as _pool
from smallem.generating.forward import GGUF_ROWS as ROWS, INT8_TYPES, Blocks, Tiled, tileable  # noqa: F401 (the appendix quotes ROWS)
from smallem.generating.gguf_file import TYPES, Tensor


def type_id(name: str) -> int:
    import gguf

    return int(gguf.GGMLQuantizationType[name])


def _lib(team, level=None):
    return team.module("forward", level)


def _fill(ffi, dst, t: Tensor):
    Blocks(t).fill(ffi, dst)


def instruction(level=None) -> str:
    ffi, lib = build.load("forward", level)
    return ffi.string(lib.sm_g_instruction()).decode()


def quantize(type_name: str, x, level=None) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, values) of one activation row rounded as a product with ``type_name``
    weights rounds it: its bytes, and the float64 values they stand for."""
    if type_name not in TYPES:
        raise ValueError(f"type: expected one of {', '.join(TYPES)}, got {type_name!r}")
    ffi, lib = build.load("forward", level)
    x = np.ascontiguousarray(x, np.float32)
    K, tid = x.size, type_id(type_name)
    per = TYPES[type_name][0]
    if K % max(per, 256 if type_name in ("Q4_K", "Q6_K") else per):
        raise ValueError(f"{type_name}: a row of {K} does not fill its activation's blocks")
    out = np.zeros(int(lib.sm_g_act_bytes(tid, K)), np.uint8)
    lib.sm_g_quantize(tid, ffi.cast("float *", x.ctypes.data), K, ffi.cast("void *", out.ctypes.data))
    vals = np.zeros(K, np.float64)
    lib.sm_g_act_values(tid, ffi.cast("void *", out.ctypes.data), K,
                        ffi.cast("double *", vals.ctypes.data))
    return out, vals


def matmul(t: Tensor, x, threads=1, level=None, ahead=None, tiles: bool = False) -> np.ndarray:
    """x (rows, K) by the file's matrix ``t`` (N rows of K): (rows, N) in float32, each group
    of weight rows prefetched ``ahead`` bytes further on (None: the kernel's PREFETCH_AHEAD;
    0: no prefetch); with ``tiles``, a Q8_0 matrix's decode layout instead of its rows
    (:class:`smallem.generating.forward.Tiled`, repacked for this call)."""
    ahead = -1 if ahead is None else checks.nonnegative_int(ahead, "ahead")
    if tiles and not tileable(Blocks(t)):
        raise ValueError(f"tiles: only a Q8_0, Q4_0 or Q5_0 matrix of a K a multiple of 32, or "
                         f"a Q4_K one, has them, not {t.type}")
    team = _pool.team(threads)
    ffi, lib = _lib(team, level)
    x = np.ascontiguousarray(np.atleast_2d(x), np.float32)
    if x.shape[1] != t.ne[0]:
        raise ValueError(f"x: rows of {x.shape[1]}, the matrix takes {t.ne[0]}")
    m = ffi.new("sm_mat *")
    w = Tiled(Blocks(t), ffi, lib) if tiles else Blocks(t)  # held until the call returns
    w.fill(ffi, m)
    y = np.zeros((x.shape[0], m.N), np.float32)
    lib.sm_g_matmul(m, ffi.cast("float *", x.ctypes.data), x.shape[0],
                    ffi.cast("float *", y.ctypes.data), team.n, ahead)
    del w
    return y


def product_seconds(t: Tensor, reps: int = 20, level=None, tiles: bool = False) -> float:
    """Seconds of one row's product by the file's matrix ``t`` on one thread, the best of
    ``reps`` calls (the row rounded as the product rounds it; no Python, no threads in
    the timing); with ``tiles``, a matrix's product in its decode layout (forward.TILE_TYPES)."""
    reps = checks.positive_int(reps, "reps")
    if tiles and not tileable(Blocks(t)):
        raise ValueError(f"tiles: only a Q8_0, Q4_0 or Q5_0 matrix of a K a multiple of 32, or "
                         f"a Q4_K one, has them, not {t.type}")
    ffi, lib = _lib(_pool.team(1), level)
    m = ffi.new("sm_mat *")
    w = Tiled(Blocks(t), ffi, lib) if tiles else Blocks(t)  # held until the timing returns
    w.fill(ffi, m)
    secs = lib.sm_time_product(m, reps)
    del w
    if secs <= 0:
        raise MemoryError("no memory for the product's timing")
    return float(secs)




AMX_INT8_INSTRUCTION = "tdpbssd (AMX tiles)"


def int8_instruction(level=None, amx: bool = False) -> str:
    """The instruction of the prompt's integer GEMM (``kernels_c/forward/qgemm.c``) here: the
    level's vector kernel's, or the tiles' where ``amx``."""
    if amx:
        return AMX_INT8_INSTRUCTION
    ffi, lib = build.load("forward", level)
    return ffi.string(lib.sm_q_instruction()).decode()


def int8_amx(level=None) -> bool:
    """Whether the prompt's integer GEMM can run on AMX tiles here (the build has AMX_INT8
    and Linux granted the tiles)."""
    ffi, lib = build.load("forward", level)
    return bool(lib.sm_q_amx())


def int8_matmul(t: Tensor, x, threads=1, level=None, amx=False) -> np.ndarray:
    """x (rows, K) by the file's matrix ``t`` through the prompt's integer GEMM: x rounded
    to Q8_0 blocks, each block's product an exact integer sum scaled by both scales; on AMX
    tiles where ``amx`` (RuntimeError where :func:`int8_amx` says no), else on the level's
    vector kernel."""
    if t.type not in INT8_TYPES:
        raise ValueError(f"the integer GEMM takes {', '.join(INT8_TYPES)}, not {t.type}")
    team = _pool.team(threads)
    ffi, lib = _lib(team, level)
    x = np.ascontiguousarray(np.atleast_2d(x), np.float32)
    if x.ndim != 2 or x.shape[1] != t.ne[0] or x.shape[0] < 1:
        raise ValueError(f"x: expected (rows >= 1, {t.ne[0]}), got {x.shape}")
    m = ffi.new("sm_mat *")
    _fill(ffi, m, t)
    y = np.zeros((x.shape[0], m.N), np.float32)
    rc = lib.sm_q_matmul_path(m, ffi.cast("float *", x.ctypes.data), x.shape[0],
                              ffi.cast("float *", y.ctypes.data), team.n, int(bool(amx)))
    if rc == -3:
        raise RuntimeError("the integer GEMM on AMX tiles: this build or the OS gives no tiles")
    if rc:
        raise MemoryError("the integer GEMM's scratch") if rc == -2 else ValueError(
            f"the integer GEMM refused a {t.type} matrix of K = {t.ne[0]}")
    return y


def row(t: Tensor, i: int, level=None) -> np.ndarray:
    """Row ``i`` of the matrix as float32, decoded by the C side."""
    ffi, lib = build.load("forward", level)
    m = ffi.new("sm_mat *")
    _fill(ffi, m, t)
    out = np.zeros(t.ne[0], np.float32)
    lib.sm_g_row(m, int(i), ffi.cast("float *", out.ctypes.data))
    return out
