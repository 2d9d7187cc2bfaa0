"""Build the C kernels with cffi, on first use, into a cache.

Each ``kernels_c/<name>.c`` becomes one Python extension module per ISA level;
its exported functions are declared, and only declared, in ``kernels_c/<name>.h``
(plain prototypes that cffi reads as they are; the ``.c`` includes the header).
A module too long for one file keeps the rest in ``kernels_c/<name>/``, whose
``.c`` and ``.h`` files ``<name>.c`` includes: still one translation unit, so
static functions are shared and inlined across the files.
The module's file name carries a hash of everything that changes the machine
code: the kernel source, the files of its folder, every header in ``kernels_c/``,
the cffi declarations, the compiler and its version, the flags and the ISA. Edit
a kernel, call it again, and it is rebuilt; nothing else is.

We run the compiler ourselves (cffi only writes the wrapper C file) so that a
failure can quote the compiler's own message and name the kernel file.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import io
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from smallem.cpu import isa
from smallem.plumbing.toolchain import BuildError, compiler  # noqa: F401 (build's names too)

ROOT = Path(__file__).resolve().parents[2]
KERNELS_DIR = Path(os.environ.get("SMALLEM_KERNELS", ROOT / "kernels_c"))
BASE_FLAGS = ["-O3", "-fPIC", "-std=gnu11", "-Wall", "-Wno-unused-function",
              # keep our copy loops as loops: glibc's memcpy would change what STREAM measures
              "-fno-tree-loop-distribute-patterns"]


@functools.lru_cache(maxsize=None)
def header_constant(name: str, header: str = "common.h", folder: Path | None = None) -> float:
    """The value of ``#define NAME value`` in a kernel source (by default kernels_c/common.h;
    ``folder`` another kernels folder, such as kernels_cuda): the constants the kernels and
    the Python beside them share, defined once, in the kernel's source."""
    import re

    text = ((folder or KERNELS_DIR) / header).read_text()
    found = re.search(rf"^#define {re.escape(name)}\s+([-+0-9.eE]+)f?\b", text, re.M)
    if not found:
        raise BuildError(f"{header} defines no numeric {name}")
    return float(found.group(1))


def header_enum(prefix: str, header: str, folder: Path | None = None) -> dict:
    """{name: value} of a kernel header's ``enum { PREFIX_NAME = value, ... }`` members, the
    names lowercased without the prefix (``MLP_GEGLU = 2`` -> ``{"geglu": 2}``): the ids the C
    side switches on, read from their one definition (cffi reads the same header)."""
    import re

    text = ((folder or KERNELS_DIR) / header).read_text()
    found = {m.group(1).lower(): int(m.group(2))
             for m in re.finditer(rf"\b{re.escape(prefix)}_(\w+)\s*=\s*(\d+)", text)}
    if not found:
        raise BuildError(f"{header} has no enum members {prefix}_*")
    return found


def file_identity(path) -> str:
    """A file's identity (a compiler, a tool, a data file) for a cache key: its resolved path, size and modification time
    (a reinstalled or rebuilt one is another key)."""
    p = Path(path).resolve()
    st = p.stat()
    return f"{p}:{st.st_size}:{st.st_mtime_ns}"


def cache_dir() -> Path:
    base = os.environ.get("SMALLEM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "smallem")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=None)
def compiler_version(cc: str) -> str:
    out = subprocess.run([cc, "--version"], capture_output=True, text=True)
    return out.stdout.splitlines()[0] if out.stdout else cc


# Hot loops start on a 64-byte boundary. Where a loop lands otherwise depends on the code
# around it (cffi's wrapper shifts every address): the same GEMM source, built twice, ran
# 9 % apart on two Zen 3 cores until its micro-kernel loop was aligned (the loop's ~100
# bytes then span two 64-byte fetch windows, not three).
TUNING_FLAGS = ["-falign-loops=64"]


@functools.lru_cache(maxsize=None)
def tuning_flags(cc: str) -> list[str]:
    """TUNING_FLAGS that ``cc`` accepts without a warning (an old compiler just goes without)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "t.c")
        src.write_text("int f(int n){int s=0;for(int i=0;i<n;i++)s+=i;return s;}\n")
        return [f for f in TUNING_FLAGS
                if subprocess.run([cc, "-Werror", f, "-c", str(src), "-o", str(Path(tmp, "t.o"))],
                                  capture_output=True).returncode == 0]


@functools.lru_cache(maxsize=None)
def openmp_flags(cc: str) -> tuple[list[str], list[str]]:
    """(compile flags, link flags) for OpenMP, or empty lists if the compiler has none."""
    if os.environ.get("SMALLEM_OPENMP", "1") == "0":
        return [], []
    candidates = [(["-fopenmp"], ["-fopenmp"])]
    if platform.system() == "Darwin":  # Apple clang: OpenMP comes from Homebrew's libomp
        prefix = "/opt/homebrew/opt/libomp" if platform.machine() == "arm64" else "/usr/local/opt/libomp"
        candidates.insert(0, (["-Xpreprocessor", "-fopenmp", f"-I{prefix}/include"],
                              [f"-L{prefix}/lib", "-lomp"]))
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "t.c")
        src.write_text("#include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}\n")
        for cflags, lflags in candidates:
            r = subprocess.run([cc, *cflags, str(src), "-o", str(Path(tmp, "t")), *lflags],
                               capture_output=True)
            if r.returncode == 0:
                return cflags, lflags
    return [], []


# A module named <name>_pool is <name>.c built with SM_POOL: its OpenMP pragmas run on
# smallem's own thread pool (kernels_c/pool.c, through kernels_c/pool_shim.h), not libgomp.
POOL_SUFFIX = "_pool"
POOL_VARIANTS = ("layers", "gemm", "forward")


def _base(name: str) -> tuple[str, bool]:
    """(the source's name, whether this is its pool variant)."""
    if name.endswith(POOL_SUFFIX) and name[:-len(POOL_SUFFIX)] in POOL_VARIANTS:
        return name[:-len(POOL_SUFFIX)], True
    return name, False


# A kernel that compiles another one into itself (forward.c includes gemm.c: the prompt's
# products call chapter 2's GEMM directly): its cache key covers the other's files too.
INCLUDES = {"forward": ("gemm",)}


def _sources(name: str) -> tuple[Path, list[Path]]:
    """``kernels_c/<name>.c``, and the files it may include: every header in ``kernels_c/``,
    every ``.c`` and ``.h`` file under ``kernels_c/<name>/``, and those of the kernels it
    includes (:data:`INCLUDES`)."""
    name = _base(name)[0]
    src = KERNELS_DIR / f"{name}.c"
    if not src.is_file():
        raise BuildError(f"kernel source {src} does not exist")
    parts = []
    for own in (name, *INCLUDES.get(name, ())):
        parts += sorted(p for p in (KERNELS_DIR / own).rglob("*") if p.suffix in (".c", ".h") and p.is_file())
    others = [KERNELS_DIR / f"{o}.c" for o in INCLUDES.get(name, ())]
    return src, sorted(KERNELS_DIR.glob("*.h")) + others + parts


def cdef_of(name: str) -> str:
    """The declarations cffi exposes: the kernel's header, verbatim (a pool variant adds
    the call that attaches it to the pool)."""
    base, pool = _base(name)
    header = KERNELS_DIR / f"{base}.h"
    if not header.is_file():
        raise BuildError(f"{KERNELS_DIR / (base + '.c')} has no header {header} declaring its functions")
    return header.read_text() + ("void sm_pool_attach(void *api);\n" if pool else "")


def _key(name: str, level: str, exts: tuple[str, ...], cc: str) -> tuple[str, list[str], list[str]]:
    src, deps = _sources(name)
    cdef = cdef_of(name)
    omp_c, omp_l = openmp_flags(cc)
    cflags = BASE_FLAGS + tuning_flags(cc) + isa.compile_flags(level, exts) + omp_c
    cflags = cflags + sanitize_flags()
    if _base(name)[1] and omp_c:  # without OpenMP the pragmas are ignored: no pool either
        cflags = cflags + ["-DSM_POOL"]
    h = hashlib.sha256()
    # each file by its path under kernels_c/ (gemm/driver.c), so that a rename counts too
    files = (p.relative_to(KERNELS_DIR).as_posix().encode() + p.read_bytes() for p in deps)
    for part in [src.read_bytes(), *files,
                 cdef.encode(), " ".join(cflags + omp_l).encode(), compiler_version(cc).encode(),
                 level.encode(), sys.version.encode(), platform.machine().encode()]:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16], cflags, omp_l


def sanitize_flags() -> list[str]:
    """``SMALLEM_SANITIZE=address,undefined`` (or one of them): the kernels built with GCC's
    sanitizers, for tests (a process that loads them needs the runtime preloaded:
    ``LD_PRELOAD=$(gcc -print-file-name=libasan.so)``). The flags are part of the cache key."""
    kinds = [k for k in os.environ.get("SMALLEM_SANITIZE", "").split(",") if k]
    bad = set(kinds) - {"address", "undefined"}
    if bad:
        raise BuildError(f"SMALLEM_SANITIZE: expected address and/or undefined, got {sorted(bad)}")
    if not kinds:
        return []
    # -O1 after BASE_FLAGS' -O3: the sanitizers' usual level, and a build of every kernel at
    # every level in a quarter of the time (the intrinsics are the same instructions either way)
    return [f"-fsanitize={','.join(kinds)}", "-O1", "-fno-omit-frame-pointer", "-g",
            "-fno-sanitize-recover=all"]


def module_path(name: str, level: str, exts: tuple[str, ...]) -> Path:
    cc = compiler()
    digest, _, _ = _key(name, level, exts, cc)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return cache_dir() / f"_smallem_{name}_{level}_{digest}{suffix}"


def compile_module(name: str, level: str, exts: tuple[str, ...] | None = None) -> Path:
    """Compile ``kernels_c/<name>.c`` for ``level`` unless the cache already has it."""
    import cffi

    cc = compiler()
    exts = isa.extensions(level) if exts is None else exts
    digest, cflags, lflags = _key(name, level, exts, cc)
    target = module_path(name, level, exts)
    if target.exists():
        return target
    src, _ = _sources(name)
    modname = target.name.split(".")[0]
    ffi = cffi.FFI()
    ffi.cdef(cdef_of(name))
    # Including the file (rather than pasting it) makes the compiler name the real file and line.
    ffi.set_source(modname, f'#include "{src}"')
    _sweep(cache_dir())
    # A build happens in a folder of its own and lands with one rename: Ctrl-C (or a kill)
    # in the middle leaves no half-written module under the name a later load would trust.
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=BUILDING) as tmp:
        wrapper = Path(tmp, modname + ".c")
        with contextlib.redirect_stdout(io.StringIO()):  # cffi prints 'generating ...'
            ffi.emit_c_code(str(wrapper))
        out = Path(tmp, target.name)
        shared = ["-bundle", "-undefined", "dynamic_lookup"] if platform.system() == "Darwin" else ["-shared"]
        cmd = [cc, *cflags, f"-I{KERNELS_DIR}", f"-I{sysconfig.get_paths()['include']}",
               str(wrapper), *shared, "-o", str(out), *lflags, "-lm"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            msg = (r.stderr or r.stdout).strip()
            raise BuildError(f"compiling {src} for ISA {level} failed:\n$ {' '.join(cmd)}\n{msg}")
        os.replace(out, target)  # atomic: a parallel build of the same key just wins or loses
    return target


BUILDING = "building-"  # the prefix of a build's own folder in the cache
STALE_SECONDS = 3600      # a build folder this old was left by a process killed mid-build


def _sweep(cache: Path) -> None:
    """Remove the folders of builds that were killed before they could clean up."""
    old = time.time() - STALE_SECONDS
    for d in cache.glob(BUILDING + "*"):
        try:
            if d.is_dir() and d.stat().st_mtime < old:
                shutil.rmtree(d, ignore_errors=True)
        except OSError:  # another process swept it first
            pass


@functools.lru_cache(maxsize=None)
def _import(path: str):
    modname = Path(path).name.split(".")[0]
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as e:
        raise BuildError(f"could not load the compiled kernel {path}: {e}") from e
    return module


def _stamp(name: str) -> tuple:
    """Modification times and sizes of the files a kernel is built from: one stat each.

    The folders' own times come first: a file added to or removed from ``kernels_c/`` or
    ``kernels_c/<name>/`` changes them, and so makes :func:`_files` list the files again."""
    base = _base(name)[0]
    folders = tuple(os.stat(d).st_mtime_ns if os.path.isdir(d) else 0
                    for d in (KERNELS_DIR, *(KERNELS_DIR / o for o in (base, *INCLUDES.get(base, ())))))
    out = [folders]
    for path in _files(name, str(KERNELS_DIR), folders):
        st = os.stat(path)
        out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _files(name: str, kernels_dir: str, folders: tuple = ()) -> tuple[str, ...]:
    src, deps = _sources(name)
    return tuple(str(p) for p in [src, *deps])


def load(name: str, level: str | None = None):
    """Return ``(ffi, lib)`` for ``kernels_c/<name>.c``, building it if needed.

    ``level`` defaults to :func:`smallem.cpu.isa.selected` (``SMALLEM_ISA`` or the best
    level). A level the CPU cannot run raises :class:`smallem.cpu.isa.ISAError`
    before anything is loaded, so no illegal instruction can be reached.
    """
    level = level or isa.selected()
    if not isa.supported(level):
        raise isa.ISAError(f"ISA level {level!r} cannot run on this CPU; "
                           f"use smallem.plumbing.build.compile_module to build it without loading")
    now = time.monotonic()
    exts = isa.extensions(level)  # $SMALLEM_WITHOUT may leave one out: another module
    key = (name, level, exts, str(KERNELS_DIR))
    seen = _recent.get(key)
    if seen is not None and now - seen[0] < RECHECK_SECONDS:
        return seen[1]  # checked a moment ago: a human edit takes longer than this
    loaded = _load(name, level, exts, _stamp(name))
    _recent[key] = (time.monotonic(), loaded)
    return loaded


# Kernels are called thousands of times a second; a stat per source file each time
# would cost tens of microseconds, so the sources are re-checked at most this often.
RECHECK_SECONDS = 0.5
_recent: dict = {}


@functools.lru_cache(maxsize=None)
def _load(name: str, level: str, exts: tuple, stamp: tuple):
    # ``stamp`` (file times and sizes) keeps repeated calls cheap; the hash decides rebuilds.
    path = compile_module(name, level, exts)
    module = _import(str(path))
    return module.ffi, module.lib


def kernel_names() -> list[str]:
    return sorted(p.stem for p in KERNELS_DIR.glob("*.c"))
