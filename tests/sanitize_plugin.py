"""pytest plugin for the sanitizer run (tests/test_sanitize.py loads it with ``-p``).

It records every C function the tests reach: each ``build.load`` returns the real module
behind a thin proxy that notes (kernel, ISA level, function) on attribute access, and the
set is written to $SMALLEM_CALL_LOG as JSON when the session ends. The outer test then
checks that every function every kernel header declares was entered, at every level.
"""

import json
import os

from smallem.plumbing import build
from smallem.cpu import isa

_entered: set = set()


class _Lib:
    __slots__ = ("_key", "_lib")

    def __init__(self, key, lib):
        self._key, self._lib = key, lib

    def __getattr__(self, name):
        _entered.add((*self._key, name))
        return getattr(self._lib, name)

    def __dir__(self):
        return dir(self._lib)


class _FFI:
    """The module's ffi, whose ``addressof`` takes the proxy (a C function called through a
    pointer, as BatchedGemm calls gemm_f32, counts as entered)."""
    __slots__ = ("_ffi",)

    def __init__(self, ffi):
        self._ffi = ffi

    def addressof(self, lib, *names):
        if isinstance(lib, _Lib):
            _entered.update((*lib._key, n) for n in names)
            lib = lib._lib
        return self._ffi.addressof(lib, *names)

    def __getattr__(self, name):
        return getattr(self._ffi, name)


_real_load = build.load


def _load(name, level=None):
    ffi, lib = _real_load(name, level)
    return _FFI(ffi), _Lib((name, level or isa.selected()), lib)


def pytest_configure(config):
    build.load = _load


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("SMALLEM_CALL_LOG")
    if path:
        with open(path, "w") as f:
            json.dump(sorted(_entered), f)
