"""Weights in huge pages: arrays copied into anonymous memory that Linux is asked to back
with 2 MiB pages (``madvise(MADV_HUGEPAGE)``; transparent huge pages in "madvise" mode, the
common default, go only to memory that asks).

A decoder reads every weight once a token. In 4 KiB pages the weights lie wherever the
allocator found room (often the heap's reused, never advised pages), one TLB entry maps 4
KiB of them, and the page walks between the reads cost a share of each step that differs
from one process to the next; in 2 MiB pages one entry maps 512 times as much. The arrays
are carved one after the other out of mappings of CHUNK bytes (a small matrix shares its
pages with the next), each kept alive by the arrays carved from it. Where the system gives
no huge pages (or has no ``madvise``), the copies are in ordinary pages and work the same.
"""

from __future__ import annotations

import mmap
import threading

import numpy as np

HUGE = 2 << 20      # bytes of an x86-64 huge page
CHUNK = 16 * HUGE   # one mapping's bytes, unless an array needs more
ALIGN = 64          # each array starts on a cache line
SMALL = 64 << 10    # arrays under this stay in ordinary memory (a few pages at most)

_lock = threading.Lock()
_current = {"raw": None, "at": 0}


def _mapping(nbytes: int) -> np.ndarray:
    """A new mapping of at least ``nbytes``, advised for huge pages, from a huge page on."""
    size = max(CHUNK, -(-nbytes // HUGE) * HUGE) + HUGE
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(mm, np.uint8)  # keeps mm alive
    skip = -raw.ctypes.data % HUGE
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    if advise is not None:
        try:
            mm.madvise(advise, skip, size - skip)
        except OSError:
            pass  # a kernel without transparent huge pages: ordinary pages
    return raw[skip:]


def huge_copy(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``a`` in memory advised for huge pages, on a cache line."""
    a = np.ascontiguousarray(a)
    if a.nbytes < SMALL:
        return a.copy()
    with _lock:
        raw, at = _current["raw"], _current["at"]
        if raw is None or at + a.nbytes > raw.size:
            raw, at = _mapping(a.nbytes), 0
        _current["raw"], _current["at"] = raw, -(-(at + a.nbytes) // ALIGN) * ALIGN
    out = raw[at:at + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out
