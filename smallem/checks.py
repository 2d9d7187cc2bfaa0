"""Argument checks that stand between Python and every C kernel.

cffi hands a C function whatever buffer it is given: a float64 array passed where
the C code reads float32, or a view with strides, is read as garbage or past its
end. Every wrapper runs its arrays through :func:`array` first, so a mistake
becomes a ``TypeError`` or ``ValueError`` naming the argument.
"""

from __future__ import annotations

import numpy as np

from smallem.cpu import machine_info


def array(x, name: str, dtype, ndim: int | None = None, shape: tuple | None = None,
          writable: bool = False) -> np.ndarray:
    """Check that ``x`` is a C-contiguous ndarray of ``dtype`` (and ``ndim``/``shape``).

    ``shape`` may hold ``None`` for a free dimension. Returns ``x`` unchanged:
    nothing is copied behind the caller's back.
    """
    _kind(x, name, dtype)
    layout(x, name, ndim, shape, module="np")
    if writable and not x.flags.writeable:
        raise ValueError(f"{name}: array is read-only but the kernel writes into it")
    return x


def matrix(x, name: str, dtype, writable: bool = False) -> tuple[np.ndarray, int]:
    """A 2-D array of ``dtype`` whose rows are contiguous; returns it and its leading dimension.

    Rows may be further apart than their width (a slice ``big[:, :k]``: lda > k),
    but the elements of a row must be adjacent; anything else is an error, not a copy.
    """
    if (type(x) is np.ndarray and x.dtype is dtype and x.ndim == 2 and x.flags.c_contiguous
            and x.size and (not writable or x.flags.writeable) and max(x.shape) <= 2**31 - 1):
        return x, x.shape[1]  # the usual case, without the checks below
    _kind(x, name, dtype)
    if x.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix, got shape {x.shape}")
    if writable and not x.flags.writeable:
        raise ValueError(f"{name}: array is read-only but the kernel writes into it")
    rows, cols = x.shape
    es = x.itemsize
    if x.size == 0:  # nothing to read or write; the caller handles empty products
        return x, max(cols, 1)
    if cols > 1 and x.strides[1] != es:
        raise ValueError(f"{name}: the elements of a row are not adjacent (strides {x.strides}); "
                         f"pass np.ascontiguousarray({name}), or use trans_a/trans_b "
                         f"for a transpose")
    ld = x.strides[0] // es if rows > 1 else max(cols, 1)
    if rows > 1 and (x.strides[0] % es or ld < cols):
        raise ValueError(f"{name}: rows overlap or are misaligned (strides {x.strides}); "
                         f"pass np.ascontiguousarray({name})")
    if ld > 2**31 - 1 or rows > 2**31 - 1 or cols > 2**31 - 1:
        raise ValueError(f"{name}: shape {x.shape} too large for the C kernels' int sizes")
    return x, max(ld, 1)


def _kind(x, name: str, dtype) -> None:
    """Check that ``x`` is an ndarray of ``dtype``; bf16 travels as uint16 bits."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(x).__name__}")
    dtype = np.dtype(dtype)
    if x.dtype != dtype:
        hint = "f32_to_bf16" if dtype == np.uint16 else f"{name}.astype(np.{dtype})"
        raise TypeError(f"{name}: expected dtype {dtype}, got {x.dtype} (convert with {hint})")


def layout(x, name: str, ndim: int | None, shape: tuple | None, module: str = "np") -> None:
    """Check dimensions, shape (``None`` = any size) and C-contiguity of a numpy or CuPy array."""
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {x.shape}")
    if shape is not None:
        if len(shape) != x.ndim or any(s is not None and s != d for s, d in zip(shape, x.shape)):
            want = "(" + ", ".join("?" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{name}: expected shape {want}, got {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name}: array is not C-contiguous (strides {x.strides}); "
                         f"pass {module}.ascontiguousarray({name})")


def positive_int(n, name: str, limit: int = 2**31 - 1) -> int:
    """An int in [1, limit] (C kernels take ``int`` sizes)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(n).__name__}")
    if not 1 <= n <= limit:
        raise ValueError(f"{name}: expected 1 <= {name} <= {limit}, got {n}")
    return int(n)


def nonnegative_int(n, name: str, limit: int = 2**62) -> int:
    """An int in [0, limit]."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"{name}: expected an int, got {type(n).__name__}")
    if not 0 <= n <= limit:
        raise ValueError(f"{name}: expected 0 <= {name} <= {limit}, got {n}")
    return int(n)


def threads(n) -> int:
    """A thread count: None means every core this process may use."""
    if n is None:
        return machine_info.usable_cores()
    return positive_int(n, "threads", limit=4096)


def assert_close(actual, expected, *, rtol=None, atol=None, k: int = 1, name: str = "result"):
    """Fail loudly, with the worst index, unless ``actual`` matches ``expected``.

    The default tolerance scales with the dtype's epsilon and with ``k``, the
    length of the sums behind each element: rounding error grows like sqrt(k)
    for random data, and like k in the worst case; we allow eps * 4 * sqrt(k) relative
    plus the same times the typical magnitude as absolute slack.
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {actual.shape} != expected {expected.shape}")
    eps = {np.dtype(np.float64): 2.2e-16, np.dtype(np.float32): 1.2e-7,
           np.dtype(np.float16): 9.8e-4}.get(actual.dtype, 7.8e-3)  # else bf16-like
    scale = 4.0 * eps * max(1.0, np.sqrt(k))
    rtol = scale if rtol is None else rtol
    typical = float(np.mean(np.abs(expected))) if expected.size else 0.0
    atol = scale * max(typical, 1e-30) if atol is None else atol
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    if not np.all(np.isfinite(a) == np.isfinite(e)):
        bad = np.argwhere(np.isfinite(a) != np.isfinite(e))[0]
        raise AssertionError(f"{name}: non-finite mismatch at {tuple(bad)}: {a[tuple(bad)]} vs {e[tuple(bad)]}")
    err = np.abs(a - e)
    allowed = atol + rtol * np.abs(e)
    excess = np.where(np.isfinite(e), err - allowed, 0.0)
    if excess.size and excess.max() > 0:
        worst = np.unravel_index(np.argmax(excess), excess.shape)
        n_bad = int((excess > 0).sum())
        raise AssertionError(
            f"{name}: {n_bad} of {excess.size} elements out of tolerance (rtol={rtol:.2e}, "
            f"atol={atol:.2e}); worst at {tuple(int(i) for i in worst)}: got {a[worst]!r}, "
            f"expected {e[worst]!r}, error {err[worst]:.3e}")


_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x20), 0x7F] if c not in (0x09, 0x0A)}


def printable(text: str) -> str:
    """``text`` with control characters (tabs and newlines aside) escaped as \\xNN, so that
    bytes a model wrote cannot move a terminal's cursor or change its state."""
    return text.translate(_CONTROL)
