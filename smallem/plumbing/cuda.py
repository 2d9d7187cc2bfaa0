"""The CUDA kernels of ``kernels_cuda/``, loaded through CuPy, and their Python entries.

Each ``kernels_cuda/<name>.cu`` is one CuPy ``RawModule``: NVRTC compiles it for the
current device on first use and CuPy caches the binary on disk (``~/.cupy/kernel_cache``),
keyed by source and options, so an edited kernel is recompiled and nothing else is. The
``.cu`` files include no header, so no CUDA toolkit is needed beside CuPy and NVRTC.

CuPy is optional (``pip install 'smallem[gpu]'``). Without it, or without a device, the
package still imports and the CPU chapters work; any GPU entry raises
:class:`GPUUnavailable` saying what is missing. Every entry validates its arrays
(:func:`array`) before a kernel sees them: the same rules as :func:`smallem.checks.array`,
plus the device the array lives on.

bf16 matrices are CuPy ``uint16`` arrays holding bf16 bit patterns (CuPy and numpy have no
bf16 type): :func:`to_bf16` and :func:`bf16_bits` make them from float32.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smallem import checks, ladder
from smallem.generating import quant
from smallem.plumbing import build
from smallem.plumbing.build import ROOT, cache_dir

KERNELS_DIR = Path(os.environ.get("SMALLEM_CUDA_KERNELS", ROOT / "kernels_cuda"))
OPTIONS = ("-std=c++17",)
INSTALL_HINT = ("pip install 'smallem[gpu]' (CuPy for CUDA 12 with its toolkit wheels; on a "
                "CUDA 13 driver `pip install 'cupy-cuda13x[ctk]'` works too)")


# The host transfers the library makes on purpose (the batch up, the losses or tokens down),
# counted where it makes them: what chapter 3's GPU record reports per step. The fake CuPy
# of the tests counts every transfer, so the tests check that there are no others.
TRANSFERS = {"to_device": 0, "to_host": 0}


class GPUUnavailable(RuntimeError):
    """A GPU entry was called where CuPy or a CUDA device is missing; the message says which."""


class CompilerUnavailable(RuntimeError):
    """Neither NVRTC (through CuPy) nor nvcc is available to compile a .cu file."""


# ---------------------------------------------------------------- is there a GPU?

@functools.lru_cache(maxsize=1)
def why_unavailable() -> str | None:
    """None if CuPy and a CUDA device are usable, else one sentence saying what is missing."""
    try:
        import cupy
    except ImportError as e:
        return f"CuPy is not installed ({e}); {INSTALL_HINT}"
    except Exception as e:  # a broken CUDA library can raise anything at import
        return f"CuPy failed to import: {type(e).__name__}: {e}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"CuPy {cupy.__version__} is installed but finds no CUDA device ({type(e).__name__}: {e})"
    if n < 1:
        return f"CuPy {cupy.__version__} is installed but this machine has no CUDA device"
    return None


def available() -> bool:
    return why_unavailable() is None


def require():
    """The ``cupy`` module, or :class:`GPUUnavailable` if there is no usable GPU."""
    reason = why_unavailable()
    if reason:
        raise GPUUnavailable(f"no GPU for smallem: {reason}")
    import cupy
    return cupy


def device_info() -> dict:
    """The GPU part of a record's machine description."""
    cp = require()
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props.get("name", b"?")
    info = {
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "compute_capability": dev.compute_capability,
        "sms": int(props.get("multiProcessorCount", 0)),
        "memory_bytes": int(props.get("totalGlobalMem", 0)),
        "l2_bytes": int(props.get("l2CacheSize", 0)),
        "smem_per_sm_bytes": int(props.get("sharedMemPerMultiprocessor", 0)),
        "driver": cp.cuda.runtime.driverGetVersion(),
        "runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cupy": cp.__version__,
    }
    for key, out in (("clockRate", "clock_khz"), ("memoryClockRate", "memory_clock_khz"),
                     ("memoryBusWidth", "memory_bus_bits")):
        if key in props:  # CUDA 13 dropped some of these from the properties
            info[out] = int(props[key])
    return info


# ---------------------------------------------------------------- loading kernels

def source_path(name: str) -> Path:
    path = KERNELS_DIR / f"{name}.cu"
    if not path.is_file():
        raise FileNotFoundError(f"CUDA kernel source {path} does not exist")
    return path


def kernel_names() -> list[str]:
    return sorted(p.stem for p in KERNELS_DIR.glob("*.cu"))


# Files with kernels for one architecture only (an "a" target: wgmma, setmaxnreg), compiled for
# it where the device has it: (file, compute capability) -> NVRTC target. Elsewhere they compile
# for the device as every file does, and those kernels are stubs (see probes.cu).
ARCH_SPECIFIC = {("probes", "90"): "sm_90a"}


def module(name: str):
    """The CuPy ``RawModule`` of ``kernels_cuda/<name>.cu`` for the current device."""
    cp = require()
    code = source_path(name).read_text()
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    dev = cp.cuda.Device()
    arch = ARCH_SPECIFIC.get((name, str(dev.compute_capability)))
    return _module(name, digest, dev.id, code, arch)


@functools.lru_cache(maxsize=None)
def _module(name: str, digest: str, device: int, code: str, arch: str | None = None):
    import cupy
    nvrtc = _nvrtc() if arch else None
    if nvrtc is None:
        mod = cupy.RawModule(code=code, options=OPTIONS, name_expressions=None)
    else:
        # A RawModule made from source gets CuPy's own -arch=sm_XY for the device appended to
        # our options (never an "a" target), so NVRTC would be handed two targets. We compile
        # for `arch` ourselves and give CuPy the machine code, which it loads as it is.
        cache = Path(os.environ.get("CUPY_CACHE_DIR", Path.home() / ".cupy" / "kernel_cache"))
        version = "".join(map(str, nvrtc.getVersion()))
        path = cache / f"smallem-{name}-{digest}-{arch}-nvrtc{version}.cubin"
        if not path.is_file():
            cache.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(_nvrtc_cubin(nvrtc, code, f"{name}.cu", arch))
            os.replace(tmp, path)  # atomic: a concurrent process reads a whole file or none
        mod = cupy.RawModule(path=str(path))
    mod.compile()  # compile (or load) now, so an error names the file rather than a launch
    return mod


def kernel(name: str, func: str):
    """The function ``func`` (declared ``extern "C"``) of ``kernels_cuda/<name>.cu``."""
    mod = module(name)
    key = (id(mod), func)  # _module keeps every module alive, so its id stays unique
    if key not in _FUNCTIONS:  # cached: the timing loops launch thousands of times
        _FUNCTIONS[key] = mod.get_function(func)
    return _FUNCTIONS[key]


_FUNCTIONS: dict = {}


def compile_tools() -> list[str]:
    """The compilers :func:`compile_check` can use here: "nvrtc" (CuPy's binding, or the
    NVRTC library of the ``nvidia-cuda-nvrtc`` wheel through ctypes) and "nvcc"."""
    return [t for t, ok in (("nvrtc", _nvrtc() is not None), ("nvcc", nvcc_path() is not None))
            if ok]


def compile_check(name: str, arch: str, tool: str | None = None) -> str:
    """Compile ``kernels_cuda/<name>.cu`` for ``arch`` (e.g. ``sm_80``, ``sm_90a``) without a GPU.

    ``tool``: "nvrtc" (the compiler the kernels meet at run time: CuPy's binding, else the
    NVRTC library of the ``nvidia-cuda-nvrtc`` wheel), "nvcc", or None for the first of the
    two found. Both produce machine code, so the PTX assembler checks the inline ``asm`` too.
    Returns the tool used; raises RuntimeError quoting the compiler on failure and
    :class:`CompilerUnavailable` if the tool asked for (or any) is missing.
    """
    src = source_path(name)
    if tool not in (None, "nvrtc", "nvcc"):
        raise ValueError(f"tool: expected 'nvrtc', 'nvcc' or None, got {tool!r}")
    nvrtc = _nvrtc() if tool in (None, "nvrtc") else None
    if nvrtc is not None:
        code = src.read_text()
        stamp = _checked("nvrtc", _nvrtc_identity(nvrtc), arch, code)
        if not stamp.exists():
            _nvrtc_cubin(nvrtc, code, src.name, arch, str(src))
            stamp.touch()
        return "nvrtc"
    nvcc = nvcc_path() if tool in (None, "nvcc") else None
    if nvcc is None:
        raise CompilerUnavailable(
            f"cannot compile {src} with {tool or 'NVRTC or nvcc'}: no NVRTC (CuPy's, or the "
            f"nvidia-cuda-nvrtc wheel's: {INSTALL_HINT}) and no nvcc" if tool != "nvcc" else
            f"cannot compile {src} with nvcc: nvcc is not installed (set NVCC)")
    stamp = _checked("nvcc", build.file_identity(nvcc), arch, src.read_text())
    if stamp.exists():
        return "nvcc"
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, "-cubin", *nvcc_arch(arch), *OPTIONS, str(src), "-o",
               str(Path(tmp, "k.cubin"))]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"nvcc failed on {src} for {arch}:\n$ {' '.join(cmd)}\n"
                               f"{(r.stderr or r.stdout).strip()}")
    stamp.touch()
    return "nvcc"


def _nvrtc_identity(nvrtc) -> str:
    lib = getattr(getattr(nvrtc, "_lib", None), "_name", None)
    return build.file_identity(lib) if lib else f"{getattr(nvrtc, '__name__', 'nvrtc')}:{nvrtc.getVersion()}"


def _checked(tool: str, identity: str, arch: str, code: str) -> Path:
    """The stamp that says this source compiled for ``arch`` with this compiler and
    :data:`OPTIONS` (the .cu files include nothing, so the text is the whole input): a
    second check of unchanged code with an unchanged compiler is a file lookup, as ccache
    would make it. Only successes are stamped."""
    key = hashlib.sha256("\0".join([tool, identity, arch, *OPTIONS, code]).encode()).hexdigest()
    folder = cache_dir() / "cuda-checked"
    folder.mkdir(exist_ok=True)
    return folder / key[:32]


def nvcc_arch(arch: str) -> list[str]:
    """nvcc's options for machine code of ``arch`` alone (``sm_90a``: the -gencode form, since
    the -arch=sm_90a shorthand of some nvcc versions also runs a plain sm_90 pass, which
    rejects wgmma)."""
    n = arch.removeprefix("sm_")
    return [f"-gencode=arch=compute_{n},code=sm_{n}"]


def _nvrtc_cubin(nvrtc, code: str, filename: str, arch: str, where: str | None = None) -> bytes:
    """Machine code of ``code`` for ``arch`` through CuPy's NVRTC binding."""
    prog = nvrtc.createProgram(code, filename, [], [])
    try:
        nvrtc.compileProgram(prog, [f"-arch={arch}", *OPTIONS])
        return nvrtc.getCUBIN(prog)
    except Exception as e:
        log = ""
        try:
            log = nvrtc.getProgramLog(prog)
        except Exception:
            pass
        raise RuntimeError(f"NVRTC failed on {where or filename} for {arch}: {e}\n{log}") from e
    finally:
        try:
            nvrtc.destroyProgram(prog)
        except Exception:
            pass


def _nvrtc():
    """An NVRTC binding: CuPy's low-level one if it loads its library, else the NVRTC library
    of the ``nvidia-cuda-nvrtc`` wheel through ctypes (:class:`_CtypesNVRTC`), else None."""
    mod = None
    for path in ("cupy_backends.cuda.libs.nvrtc", "cupy.cuda.nvrtc"):
        try:
            mod = __import__(path, fromlist=["x"])
            break
        except Exception:
            continue
    if mod is not None:
        try:
            mod.getVersion()
            return mod
        except Exception:  # CuPy without the NVRTC library
            pass
    return _CtypesNVRTC.load()


class _CtypesNVRTC:
    """The NVRTC calls :func:`_nvrtc_cubin` and :func:`_module` make, on the library of the
    ``nvidia-cuda-nvrtc`` wheel (a test dependency): NVRTC checked without CuPy or a GPU."""

    _lib = None

    @classmethod
    def load(cls):
        if cls._lib is None:
            import ctypes
            try:
                import nvidia.cuda_nvrtc as pkg
            except ImportError:
                return None
            folders = [Path(p) / "lib" for p in getattr(pkg, "__path__", [])]
            libs = sorted(f for d in folders if d.is_dir() for f in d.glob("libnvrtc.so*")
                          if "builtins" not in f.name and ".alt." not in f.name)
            if not libs:
                return None
            try:
                cls._lib = ctypes.CDLL(str(libs[-1]))
            except OSError:
                return None
        return cls()

    def _check(self, rc, what):
        if rc != 0:
            import ctypes
            self._lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {self._lib.nvrtcGetErrorString(rc).decode()}")

    def createProgram(self, code, name, headers, includes):
        import ctypes
        prog = ctypes.c_void_p()
        self._check(self._lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(),
                                                 name.encode(), 0, None, None),
                    "nvrtcCreateProgram")
        return prog

    def compileProgram(self, prog, options):
        import ctypes
        opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        self._check(self._lib.nvrtcCompileProgram(prog, len(options), opts),
                    "nvrtcCompileProgram")

    def _bytes(self, prog, size_fn, get_fn):
        import ctypes
        n = ctypes.c_size_t()
        self._check(getattr(self._lib, size_fn)(prog, ctypes.byref(n)), size_fn)
        buf = ctypes.create_string_buffer(n.value)
        self._check(getattr(self._lib, get_fn)(prog, buf), get_fn)
        return buf.raw

    def getCUBIN(self, prog):
        return self._bytes(prog, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")

    def getProgramLog(self, prog):
        return self._bytes(prog, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").decode(
            errors="replace").rstrip("\x00")

    def destroyProgram(self, prog):
        import ctypes
        self._lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def getVersion(self):
        import ctypes
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)),
                    "nvrtcVersion")
        return major.value, minor.value


def nvcc_path() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    return None


# ---------------------------------------------------------------- validation

def array(x, name: str, dtype, ndim: int | None = None, shape: tuple | None = None):
    """Check that ``x`` is a C-contiguous CuPy array of ``dtype`` on the current device.

    The rules of :func:`smallem.checks.array` (TypeError for the wrong type or dtype,
    ValueError for a wrong shape or layout), plus the device: an array on another GPU
    is a ValueError, since a kernel launched here would read another device's memory.
    """
    cp = require()
    if isinstance(x, np.ndarray) and not isinstance(x, cp.ndarray):
        raise TypeError(f"{name}: expected a cupy.ndarray on the GPU, got a numpy.ndarray "
                        f"(move it with cupy.asarray({name}))")
    if not isinstance(x, cp.ndarray):
        raise TypeError(f"{name}: expected a cupy.ndarray, got {type(x).__name__}")
    dtype = np.dtype(dtype)
    if x.dtype != dtype:
        what = " (bf16 bits: make them with smallem.plumbing.cuda.to_bf16)" if dtype == np.uint16 else ""
        raise TypeError(f"{name}: expected dtype {dtype}{what}, got {x.dtype}")
    checks.layout(x, name, ndim, shape, module="cupy")
    here = cp.cuda.Device().id
    if x.device.id != here:
        raise ValueError(f"{name}: array lives on GPU {x.device.id} but kernels run on GPU {here}")
    return x


# ---------------------------------------------------------------- bf16

def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16), rounding to nearest even, on the host."""
    return quant.f32_to_bf16(checks.array(np.ascontiguousarray(x, dtype=np.float32), "x",
                                          np.float32))


def bf16_to_f32(bits) -> np.ndarray:
    """bf16 bit patterns (uint16, numpy or CuPy) -> float32 values (same library)."""
    xp = np if isinstance(bits, np.ndarray) else require()
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def to_bf16(x):
    """A CuPy float32 array -> a new CuPy uint16 array of its bf16 bits (nearest even)."""
    cp = require()
    array(x, "x", np.float32)
    y = cp.empty(x.shape, dtype=cp.uint16)
    n = x.size
    if n:
        blocks = min(-(-n // 256), 65535)
        kernel("gemm", "f32_to_bf16")((blocks,), (256,), (x, y, np.int64(n)))
    return y


# ---------------------------------------------------------------- the GEMM ladder

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Rung(ladder.Rung):
    """One step of chapter 2's GPU ladder (:class:`smallem.ladder.Rung`): a kernel of
    kernels_cuda/<module>.cu and how to launch it."""
    func: str = ""
    module: str = "gemm"          # the .cu file (the CuPy module) that holds func
    dtype: str = "f32"            # "f32" or "bf16" (inputs; outputs are always f32)
    threads: tuple = ()           # block shape
    tile: tuple = ()              # (rows of C, columns of C) one block computes
    rows_on_x: bool = False       # grid x walks the rows of C (only the naive rung)
    smem: int = 0                 # dynamic shared memory per block, bytes

    @property
    def number(self) -> int:  # the records' name for its place
        return self.index

    def grid(self, M: int, N: int) -> tuple:
        gx, gy = (_cdiv(M, self.tile[0]), _cdiv(N, self.tile[1])) if self.rows_on_x else \
                 (_cdiv(N, self.tile[1]), _cdiv(M, self.tile[0]))
        if gy > 65535 or gx > 2**31 - 1:
            raise ValueError(f"{self.name}: matrix too large for this launch ({M} x {N})")
        return (gx, gy)


def _gpu_where(marker: str, name: str, module: str = "gemm") -> ladder.Where:
    """Where a GPU rung is: its section of its .cu file, the page's GPU section, the notebook's
    GPU cell, the test of every rung on the CPU's emulation of CUDA."""
    return ladder.Where(kernel=f"kernels_cuda/{module}.cu:{marker}",
                        page="chapters/2-matmul.md:## The GPU beside it",
                        notebook='notebooks/02_matmul.py:gpu.notebook_section("ch2")',
                        test=f"tests/test_cuda_emu.py::test_rung_on_cpu[{name}]")


GPU_LADDER = ladder.Ladder("chapter 2's GPU product", [
    Rung(0, "naive", "naive: one thread per element, a warp reads 32 rows of A", func="sgemm_naive", dtype="f32", threads=(32, 8),
         tile=(32, 8), rows_on_x=True, where=_gpu_where("naive", "naive")),
    Rung(1, "coalesced", "coalesced: a warp reads one 128-byte row of B", func="sgemm_coalesced", dtype="f32", threads=(32, 8),
         tile=(8, 32), rows_on_x=False, where=_gpu_where("coalesced", "coalesced")),
    Rung(2, "smem", "shared-memory tiles, 32 x 32", func="sgemm_smem", dtype="f32", threads=(32, 32),
         tile=(32, 32), rows_on_x=False, where=_gpu_where("smem", "smem")),
    Rung(3, "block1d", "1-D register blocking: 8 elements a thread", func="sgemm_block1d", dtype="f32", threads=(512,),
         tile=(64, 64), rows_on_x=False, where=_gpu_where("block1d", "block1d")),
    Rung(4, "block2d", "2-D register blocking: 8 x 8 elements a thread", func="sgemm_block2d", dtype="f32", threads=(256,),
         tile=(128, 128), rows_on_x=False, where=_gpu_where("block2d", "block2d")),
    Rung(5, "vec", "16-byte loads and stores", func="sgemm_vec", dtype="f32", threads=(256,),
         tile=(128, 128), rows_on_x=False, where=_gpu_where("vec", "vec")),
    Rung(6, "prefetch", "next tile's loads in flight during the products, two buffers", func="sgemm_prefetch", dtype="f32", threads=(256,),
         tile=(128, 128), rows_on_x=False, where=_gpu_where("prefetch", "prefetch")),
    Rung(7, "wmma", "bf16 on the tensor cores (wmma), f32 sums", func="hgemm_wmma", dtype="bf16", threads=(256,),
         tile=(128, 128), rows_on_x=False, where=_gpu_where("wmma", "wmma")),
    Rung(8, "wmma_async", "bf16 wmma fed by cp.async, 3 tiles in flight", func="hgemm_async", dtype="bf16", threads=(256,),
         tile=(128, 128), rows_on_x=False, smem=61440, where=_gpu_where("async", "wmma_async")),
    Rung(9, "mma", "bf16 mma.sync fed by ldmatrix, swizzled tiles, 4 in flight", func="hgemm_mma", module="mma", dtype="bf16", threads=(256,),
         tile=(128, 128), rows_on_x=False, smem=65536, where=_gpu_where("mma", "mma", "mma")),
])
RUNGS = GPU_LADDER  # by name: RUNGS["vec"]
FINAL_F32 = "prefetch"
FINAL_BF16 = "wmma_async"
# the rungs whose kernel also comes for A B^T and A^T B, by (trans_a, trans_b): same module,
# tiles and launch as the rung's A B kernel (vec and wmma have them too, for tests only)
TRANSPOSED = {
    "prefetch": {(False, True): "sgemm_prefetch_nt", (True, False): "sgemm_prefetch_tn"},
    "wmma_async": {(False, True): "hgemm_async_nt", (True, False): "hgemm_async_tn"},
    "mma": {(False, True): "hgemm_mma_nt", (True, False): "hgemm_mma_tn"},
}
# the final kernels for A B^T and A^T B, which matmul calls
VARIANTS = {(RUNGS[r].dtype, ta, tb): func for r in (FINAL_F32, FINAL_BF16)
            for (ta, tb), func in TRANSPOSED[r].items()}


def _sizes(A, B, trans_a: bool, trans_b: bool) -> tuple[int, int, int]:
    M, K = (A.shape[1], A.shape[0]) if trans_a else A.shape
    Kb, N = (B.shape[1], B.shape[0]) if trans_b else B.shape
    if Kb != K:
        raise ValueError(f"A and B do not chain: A{'^T' if trans_a else ''} is {M} x {K}, "
                         f"B{'^T' if trans_b else ''} is {Kb} x {N}")
    for n, what in ((M, "M"), (N, "N"), (K, "K")):
        checks.positive_int(n, what)
    return M, N, K


def gemm(rung: str, A, B, out=None):
    """C = A B with one rung of :data:`GPU_LADDER` (f32 rungs: float32; bf16: uint16 bits)."""
    cp = require()
    if rung not in RUNGS:
        raise ValueError(f"unknown GPU rung {rung!r}; choose one of {', '.join(RUNGS)}")
    r = RUNGS[rung]
    dt = np.float32 if r.dtype == "f32" else np.uint16
    array(A, "A", dt, ndim=2)
    array(B, "B", dt, ndim=2)
    M, N, K = _sizes(A, B, False, False)
    out = _out(cp, out, M, N)
    _launch(r.func, r, M, N, K, A, B, out)
    return out


def matmul(A, B, *, trans_a: bool = False, trans_b: bool = False, out=None):
    """The final kernels for later chapters: A B, A B^T (``trans_b``) or A^T B (``trans_a``).

    float32 inputs go to the f32 SIMT kernel, uint16 (bf16 bits) to the tensor-core
    kernel; the result is float32. ``trans_a`` means A is given as K x M.
    """
    cp = require()
    if trans_a and trans_b:
        raise ValueError("A^T B^T is not provided: compute (B A)^T instead")
    if not isinstance(A, cp.ndarray):
        array(A, "A", np.float32)  # raises the clear TypeError
    kind = "bf16" if A.dtype == np.uint16 else "f32"
    dt = np.uint16 if kind == "bf16" else np.float32
    array(A, "A", dt, ndim=2)
    array(B, "B", dt, ndim=2)
    M, N, K = _sizes(A, B, trans_a, trans_b)
    r = RUNGS[FINAL_BF16 if kind == "bf16" else FINAL_F32]
    func = VARIANTS.get((kind, trans_a, trans_b), r.func)
    out = _out(cp, out, M, N)
    _launch(func, r, M, N, K, A, B, out)
    return out


def _launch(func: str, r: Rung, M: int, N: int, K: int, A, B, out):
    k = kernel(r.module, func)
    if r.smem > 48 * 1024 and k.max_dynamic_shared_size_bytes < r.smem:
        k.max_dynamic_shared_size_bytes = r.smem  # opt in beyond the default 48 KB
    k(r.grid(M, N), r.threads, (np.int32(M), np.int32(N), np.int32(K), A, B, out),
      shared_mem=r.smem)


def _out(cp, out, M: int, N: int):
    if out is None:
        return cp.empty((M, N), dtype=cp.float32)
    return array(out, "out", np.float32, shape=(M, N))
