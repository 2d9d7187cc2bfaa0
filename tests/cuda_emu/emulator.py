"""Any kernels_cuda/*.cu run on the CPU: compiled as C++ after emu.h, every ``extern "C"
__global__`` function given a trampoline that takes its arguments as cuLaunchKernel does (an
array of pointers to the values), and a checker that compares each argument's size and kind
(pointer or value) with the kernel's own parameter list before the launch.

    emu = Emulator.of("train")                       # kernels_cuda/train.cu
    emu.launch("layernorm_fwd", (rows,), (128,), (x, w, b, y, mean, rstd, np.int32(rows), ...))

Arrays (numpy, or the fake CuPy's) go by their data pointer; scalars must be numpy scalars
of the kernel's type (np.int32, np.float32, np.int64, ...): a Python int is refused, since
CuPy would pass it as a 64-bit integer where the kernel may read 32 bits. Builds are cached
by source text in a folder of the temporary directory, so each file compiles once a session.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
KERNELS = HERE.parent.parent / "kernels_cuda"
CXX = shutil.which("g++") or shutil.which("clang++")
GLOBAL = re.compile(r'extern\s+"C"\s+__global__\s+(?:void\s+)?(?:__launch_bounds__\([^)]*\)\s+)?'
                    r'(?:void\s+)?(\w+)\s*\(')
DYN_SMEM = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?([\w ]+?)\s*(\w+)\s*\[\s*\]\s*;")
CACHE = Path(tempfile.gettempdir()) / f"smallem-emu-{os.getuid()}"
_LOCK = threading.Lock()


class EmulatorUnavailable(RuntimeError):
    pass


def kernels_in(code: str) -> list[str]:
    """The names of the ``extern "C" __global__`` functions of a .cu source."""
    return sorted(set(GLOBAL.findall(code)))


def translate(code: str) -> str:
    """The .cu text as the emulator compiles it: dynamic shared memory is emu.h's buffer."""
    return DYN_SMEM.sub(lambda m: f"{m.group(1)} *const {m.group(2)} = "
                                  f"reinterpret_cast<{m.group(1)} *>(emu_dyn_smem);", code)


def unit(code: str, name: str = "kernel.cu") -> str:
    """One C++ translation unit: emu.h, the kernels, a trampoline and signature per kernel."""
    names = kernels_in(code)
    tail = [f'extern "C" int emu_launch_{k}(const unsigned *d, void **a) '
            f'{{ return emu_launch({k}, d, a); }}\n'
            f'extern "C" int emu_signature_{k}(int *out) {{ return emu_signature({k}, out); }}'
            for k in names]
    return ((HERE / "emu.h").read_text() + f'\n#line 1 "{name}"\n' + translate(code)
            + '\n#line 1 "emulator trampolines"\n' + "\n".join(tail) + "\n")


def build(code: str, name: str = "kernel.cu", extra: str = "") -> Path:
    """Compile (once per source text) and return the shared library's path."""
    if CXX is None:
        raise EmulatorUnavailable("no C++ compiler (g++ or clang++) to build the CUDA emulator")
    text = unit(code, name) + extra
    digest = hashlib.sha256((text + (HERE / "emu.h").read_text()
                             + (HERE / "mma.h").read_text()).encode()).hexdigest()[:20]
    lib = CACHE / f"{Path(name).stem}-{digest}.so"
    with _LOCK:
        if lib.exists():
            return lib
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            src = Path(tmp, "unit.cpp")
            src.write_text(text)
            out = Path(tmp, "lib.so")
            r = subprocess.run([CXX, "-O1", "-std=c++20", "-pthread", "-shared", "-fPIC", "-w",
                                f"-I{HERE}", str(src), "-o", str(out)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"the emulator could not compile {name}:\n{r.stderr[-6000:]}")
            os.replace(out, lib)
    return lib


_CTYPES = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
           np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
           np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
           np.dtype(np.int16): ctypes.c_int16, np.dtype(np.uint16): ctypes.c_uint16,
           np.dtype(np.int8): ctypes.c_int8, np.dtype(np.uint8): ctypes.c_uint8}


class Emulator:
    """The kernels of one .cu source, callable on the CPU."""

    _cache: dict = {}

    def __init__(self, code: str, name: str = "kernel.cu"):
        self.name, self.names = name, kernels_in(code)
        self.lib = ctypes.CDLL(str(build(code, name)))
        self._sig: dict[str, list[int]] = {}

    @classmethod
    def of(cls, stem: str) -> "Emulator":
        """kernels_cuda/<stem>.cu's emulator (one per source text)."""
        code = (KERNELS / f"{stem}.cu").read_text()
        key = hashlib.sha256(code.encode()).hexdigest()
        if key not in cls._cache:
            cls._cache[key] = cls(code, f"kernels_cuda/{stem}.cu")
        return cls._cache[key]

    def signature(self, func: str) -> list[int]:
        if func not in self.names:
            raise KeyError(f"{self.name} has no kernel {func!r}")
        if func not in self._sig:
            out = (ctypes.c_int * 64)()
            n = getattr(self.lib, f"emu_signature_{func}")(out)
            self._sig[func] = list(out[:n])
        return self._sig[func]

    def launch(self, func: str, grid, block, args, shared_mem: int = 0):
        """Run ``func`` on a grid, arguments checked against its parameters."""
        sig = self.signature(func)
        if len(args) != len(sig):
            raise TypeError(f"{func}: {len(sig)} parameters, {len(args)} arguments")
        if shared_mem > 256 * 1024:
            raise ValueError(f"{func}: {shared_mem} bytes of dynamic shared memory")
        keep, ptrs = [], (ctypes.c_void_p * max(1, len(args)))()
        for i, (a, s) in enumerate(zip(args, sig)):
            size, pointer = s & 0xFFFF, bool(s >> 16)
            if isinstance(a, np.ndarray):
                if not pointer:
                    raise TypeError(f"{func}: argument {i} is an array, the parameter a value")
                if not a.flags.c_contiguous and a.size:
                    raise ValueError(f"{func}: argument {i} is not contiguous")
                v = ctypes.c_void_p(a.ctypes.data if a.size else 0)
            elif a is None:
                if not pointer:
                    raise TypeError(f"{func}: argument {i} is None, the parameter a value")
                v = ctypes.c_void_p(0)
            elif isinstance(a, np.generic):
                if pointer or np.dtype(a.dtype).itemsize != size:
                    raise TypeError(f"{func}: argument {i} is {a.dtype}, the parameter "
                                    f"{'a pointer' if pointer else f'{size} bytes'}")
                v = _CTYPES[np.dtype(a.dtype)](a.item())
            else:
                raise TypeError(f"{func}: argument {i} is {type(a).__name__}: pass arrays or "
                                f"numpy scalars (np.int32(n)), as CuPy needs them")
            keep.append(v)
            ptrs[i] = ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
        g = (tuple(grid) + (1, 1))[:3]
        b = (tuple(block) + (1, 1))[:3]
        if any(int(x) < 1 for x in g + b):
            raise ValueError(f"{func}: grid {g} block {b}")
        dims = (ctypes.c_uint * 6)(*[int(x) for x in g + b])
        rc = getattr(self.lib, f"emu_launch_{func}")(dims, ptrs)
        if rc != 0:
            raise ValueError(f"{func}: the emulator refused grid {g} block {b} (at most 1024 "
                             f"threads a block)")
