"""llama.cpp beside us: building it once per machine, probing it, and running its tools on a
GGUF file.

llama.cpp is a peer, never a dependency. ``smallem llama`` (``make llama``, and ``make book``
unless told ``PEERS=0``) builds ``llama-bench``, ``llama-simple`` and ``llama-quantize`` from
the source that the ``llama-cpp-python`` sdist bundles, once per machine, into the kernel
cache (:func:`build_dir`: keyed by the version, the instruction sets and the compiler, so a
second clone on the same machine finds it and another CPU builds its own). The build names
the instruction sets this CPU has instead of ``-march=native`` (a native build died on every
quantised file on two of the Xeons met so far, SIGILL on one, SIGSEGV on another), AMX's
tiles included where the CPU has them. GCC 12's ``_tile_loadconfig`` tells the compiler that
its ``ldtilecfg`` reads 8 bytes of the 64-byte configuration, so at -O3 the compiler drops
the stores of the tiles' rows and widths: ggml's AMX kernels then load a configuration with
no tile shaped, and the first ``tilezero`` dies of SIGILL (found on an Emerald Rapids with
gdb, on the check's decode after a cached prefix of 4; a RelWithDebInfo build, -O2, kept the
stores and ran). A build with AMX therefore includes :data:`TILECFG` first in every C++
file, which loads the configuration through an operand of all its 64 bytes. Right after
building, :func:`check` runs the tools on quantised files; a build that dies there is made
again without the runtime repacking of the weights and without AMX, and a build that still
dies is kept with its reason, so that every chapter says why its peer is missing. ``SMALLEM_LLAMA_BENCH`` may point at any other ``llama-bench``
(``llama-simple`` is looked for beside it).

Every run of a tool goes through :func:`bench` or :func:`greedy`: a death (any signal, any
exit status) is retried once in the safe configuration (:data:`NO_EXTRA`: no repacked or
AMX buffers), which is then kept for every later run and written into the record; a tool
that still fails raises :class:`LlamaError`, which the chapters turn into "not measured:
<why>". A peer never stops the book.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smallem.plumbing import build as kbuild
from smallem.cpu import machine_info

ENV = "SMALLEM_LLAMA_BENCH"
VERSION = "0.3.36"  # the llama-cpp-python sdist whose vendor/llama.cpp is built
TOOLS = ("llama-bench", "llama-simple", "llama-quantize")
# our own program beside them (llama_logits.cpp here): llama.cpp's logits row by row, the
# oracle of the logits tests; linked against the static libraries of the same build, which are
# kept in lib/ (with the headers in include/) so that a change of the program relinks it alone
LOGITS = "llama-logits"
LOGITS_SOURCE = Path(__file__).with_name("llama_logits.cpp")
# the layout of a build folder: part of its key, so that a machine with an older build (one
# without llama-logits and lib/) builds once more
LAYOUT = 2
# llama.cpp's CMake switch for each instruction set, by the /proc/cpuinfo flag that says the
# CPU has it (ggml's GGML_AVX512 asks for F, CD, VL, DQ and BW together)
ISA_SWITCHES = (
    ("GGML_SSE42", ("sse4_2",)), ("GGML_AVX", ("avx",)), ("GGML_AVX2", ("avx2",)),
    ("GGML_BMI2", ("bmi2",)), ("GGML_FMA", ("fma",)), ("GGML_F16C", ("f16c",)),
    ("GGML_AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)), ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)))
# the build's safe configuration: no runtime repacking, no AMX kernels (both repack weights
# into buffers of their own, where builds have died)
SAFE_BUILD = ("-DGGML_CPU_REPACK=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF",
              "-DGGML_AMX_BF16=OFF")
# AMX's switches, by the /proc/cpuinfo flags that say the CPU has them
AMX_SWITCHES = (("GGML_AMX_TILE", ("amx_tile",)), ("GGML_AMX_INT8", ("amx_tile", "amx_int8")),
                ("GGML_AMX_BF16", ("amx_tile", "amx_bf16")))
# included first in every C++ file of a build with AMX (see the module's docstring)
TILECFG = Path(__file__).with_name("amx_tilecfg.h")


def isa_switches(flags=None) -> list[str]:
    """The CMake options that build llama.cpp for a CPU with these /proc/cpuinfo ``flags``
    (default: this one's): each instruction set it has named, AMX's tiles included where it
    has them (its AMX kernels then take the prompt's quantised products). The native build
    (``-march=native``) that died on two Xeons is never made; a build with AMX that dies on
    the check's quantised files is made again without it (SAFE_BUILD)."""
    flags = set(machine_info.cpu_identity()["flags"] if flags is None else flags)
    out = ["-DGGML_NATIVE=OFF"]
    for switch, need in ISA_SWITCHES + AMX_SWITCHES:
        out.append(f"-D{switch}={'ON' if all(f in flags for f in need) else 'OFF'}")
    return out


def amx_on(options: list[str]) -> bool:
    """Whether a build with these CMake ``options`` has AMX's kernels (CMake takes the last
    value a switch is given)."""
    final = dict(o.partition("=")[::2] for o in options)
    return any("AMX" in k and v == "ON" for k, v in final.items())


# the weight types llama.cpp's AMX kernels take, at the bundled version (VERSION):
# qtype_has_amx_kernels in ggml/src/ggml-cpu/amx/common.h; the others run on its other kernels
AMX_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")
AMX_OFF = ("no_amx", "safe", "older")  # why a recorded build had no AMX kernels: its pages' keys


def amx_off_reason(options: list[str], has_amx: bool, safe_build: bool) -> str | None:
    """Why a recorded build ran without AMX's kernels, one of :data:`AMX_OFF`: the CPU has no
    AMX ("no_amx"), its default build died on the check and the safe one left AMX out
    ("safe"), or the build predates the builds with AMX ("older"); None where AMX was on or
    the record keeps no options."""
    if not options or amx_on(options):
        return None
    return "no_amx" if not has_amx else "safe" if safe_build else "older"


def source_dir() -> Path:
    """Where the sdist is unpacked, once per machine and version (its models/ folder holds
    llama.cpp's tokenizer test files)."""
    return kbuild.cache_dir() / f"llama.cpp-{VERSION}" / "src"


def models_dir() -> Path | None:
    """llama.cpp's vocabulary test files (ggml-vocab-*.gguf with .inp/.out), if unpacked."""
    p = source_dir() / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp" / "models"
    return p if p.is_dir() else None


def build_dir(flags=None) -> Path:
    """This machine's build: the version, the CMake options and the compiler in its key."""
    cc = kbuild.compiler()
    opts = isa_switches(flags)
    fix = hashlib.sha256(TILECFG.read_bytes()).hexdigest()[:12] if amx_on(opts) else None
    key = json.dumps([VERSION, opts, kbuild.compiler_version(cc), LAYOUT] + ([fix] if fix else []))
    return (kbuild.cache_dir() / f"llama.cpp-{VERSION}"
            / f"build-{hashlib.sha256(key.encode()).hexdigest()[:12]}")


def find() -> dict | None:
    """{"bench", "simple", "quantize", "logits": paths (or None), "from": where, "build": the
    check's verdict (None for a named llama-bench)}, or None where there is no llama-bench."""
    named = os.environ.get(ENV)
    bench = Path(named) if named else build_dir() / "bin" / "llama-bench"
    if not (bench.is_file() and os.access(bench, os.X_OK)):
        return None
    simple, quantize = bench.parent / "llama-simple", bench.parent / "llama-quantize"
    logits_ = bench.parent / LOGITS
    checked = bench.parent.parent / "check.json"
    return {"bench": str(bench), "simple": str(simple) if simple.is_file() else None,
            "quantize": str(quantize) if quantize.is_file() else None,
            "logits": str(logits_) if logits_.is_file() else None,
            "from": f"${ENV}" if named else "smallem llama",
            "build": None if named or not checked.is_file() else json.loads(checked.read_text())}


def version(tools: dict) -> str:
    try:
        r = subprocess.run([tools["bench"], "--version"], capture_output=True, text=True,
                           timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    text = (r.stdout + r.stderr).strip().splitlines()
    return text[0] if text else "unknown"


# llama-bench's CPU "extra buffer types" (its AMX kernels, the repacked layouts) switched off
NO_EXTRA = ("--repack", "0")


class LlamaError(RuntimeError):
    """llama.cpp could not be run here; the message says how it failed."""


def _died(rc: int) -> str:
    try:
        return f"died of {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
    except ValueError:
        return f"exited with status {rc}"


def _run(cmd: list[str], timeout: float, text: bool = True):
    try:
        return subprocess.run(cmd, capture_output=True, text=text, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise LlamaError(f"{Path(cmd[0]).name} did not finish in {timeout:.0f} s") from e
    except OSError as e:
        raise LlamaError(f"{Path(cmd[0]).name} could not start: {e}") from e


def bench(tools: dict, model: Path, threads: int, *, prompt: int = 0, gen: int = 0,
          depth: int = 0, reps: int = 1) -> list[float]:
    """llama-bench's tokens/s samples for one test: prompt processing of ``prompt`` tokens
    (pp), or generation of ``gen`` tokens after ``depth`` cached ones (tg). Where its
    default configuration dies (any signal, any exit status), it runs again without its
    extra buffer types (:data:`NO_EXTRA`), and ``tools["flags"]`` keeps them for every later
    run, so that one record is made with one configuration of the peer."""
    base = [tools["bench"], "-m", str(model), "-t", str(threads), "-p", str(prompt),
            "-n", str(gen), "-d", str(depth), "-r", str(reps), "-o", "json"]
    r = _run(base + list(tools.get("flags", ())), 600)
    if r.returncode and not tools.get("flags"):
        tools["flags"] = list(NO_EXTRA)
        tools["flags_why"] = (f"its default configuration {_died(r.returncode)} here: run "
                              f"with {' '.join(NO_EXTRA)} (no repacked or AMX buffers)")
        r = _run(base + tools["flags"], 600)
    if r.returncode:
        raise LlamaError(f"llama-bench {_died(r.returncode)} ({' '.join(base[3:])}"
                         f"{' ' + ' '.join(tools['flags']) if tools.get('flags') else ''})"
                         + (f": {r.stderr.strip()[-200:]}" if r.stderr.strip() else ""))
    try:
        rows = json.loads(r.stdout)
        return [float(x) for x in rows[0]["samples_ts"]]
    except (ValueError, LookupError, TypeError) as e:
        raise LlamaError(f"llama-bench wrote no samples ({e})") from e


def greedy(tools: dict, model: Path, prompt: bytes, n: int) -> bytes:
    """The ``n`` bytes llama-simple's greedy sampler writes after ``prompt``."""
    if not tools.get("simple"):
        raise FileNotFoundError("no llama-simple beside llama-bench")
    r = _run([tools["simple"], "-m", str(model), "-n", str(n), prompt], 600, text=False)
    if r.returncode:
        raise LlamaError(f"llama-simple {_died(r.returncode)}: {r.stderr[-200:]!r}")
    out = r.stdout
    if not out.startswith(prompt):
        raise LlamaError(f"llama-simple did not echo the prompt: {out[:80]!r}")
    return out[len(prompt):len(prompt) + n]


def logits(path, ids, steps: int, threads: int, tools: dict | None = None):
    """llama.cpp's greedy decoding of ``steps`` tokens after the prompt ``ids`` (token ids, fed
    as they are: no BOS added) on the GGUF file ``path``, by our ``llama-logits`` program:
    (chosen, rows), ``rows`` float32 of shape (steps + 1, n_vocab) -- row 0 at the prompt's last
    position, row k after chosen[k - 1] -- and ``chosen`` int64 of length steps + 1, the first
    largest logit of each row (the first ``steps`` of them were fed back). Its context is
    llama-simple's (llama_context_default_params: flash attention "auto", K and V caches in
    F16; the prompt as one batch). Raises FileNotFoundError where there is no llama-logits
    (``make llama`` builds it) and :class:`LlamaError` where it fails."""
    import numpy as np

    tools = find() if tools is None else tools
    prog = (tools or {}).get("logits")
    if not prog or not os.access(prog, os.X_OK):
        raise FileNotFoundError(
            "no llama-logits: `make llama` builds it beside llama.cpp's tools"
            + (f" (looked in {Path(tools['bench']).parent})" if tools else ""))
    ids = [int(i) for i in ids]
    if not ids or min(ids) < 0:
        raise ValueError(f"logits wants one token id or more, all >= 0 (got {ids[:8]})")
    if int(steps) != steps or steps < 0 or int(threads) != threads or threads < 1:
        raise ValueError(f"logits wants steps >= 0 and threads >= 1 (got {steps}, {threads})")
    with tempfile.TemporaryDirectory(prefix="llama-logits-") as tmp:
        out = Path(tmp) / "logits.bin"
        r = _run([prog, "-m", str(path), "-t", str(int(threads)), "-n", str(int(steps)),
                  "-o", str(out), ",".join(map(str, ids))], 600)
        if r.returncode:
            said = r.stderr.strip().splitlines()
            raise LlamaError(f"llama-logits {_died(r.returncode)}"
                             + (f": {said[-1][:300]}" if said else ""))
        raw = out.read_bytes()
    head = np.frombuffer(raw[:8], dtype="<i4")
    if head.size != 2 or head[0] != steps + 1 or head[1] < 1:
        raise LlamaError(f"llama-logits wrote a header {head.tolist()} for {steps + 1} rows")
    rows, vocab = int(head[0]), int(head[1])
    if len(raw) != 8 + 4 * rows + 4 * rows * vocab:
        raise LlamaError(f"llama-logits wrote {len(raw)} bytes for {rows} rows of {vocab}")
    chosen = np.frombuffer(raw, dtype="<i4", count=rows, offset=8).astype(np.int64)
    out_rows = np.frombuffer(raw, dtype="<f4", offset=8 + 4 * rows).reshape(rows, vocab)
    return chosen, out_rows.astype(np.float32)


# How near our logits must be to llama.cpp's (tests/test_gguf_models.py, appendix B): the
# distance of a step (:func:`distance`) is the largest |ours - llama.cpp's| over the vocabulary
# divided by the standard deviation of llama.cpp's row, and every step of a comparison must lie
# within the tolerance of its file's type. The measured maxima are in the tests' comments.
LOGITS_TOL = {"F32": 0.1, "F16": 0.1, "BF16": 0.5, "Q8_0": 1.5, "Q4_0": 2.0,
              "Q4_K_M": 2.5, "Q6_K": 3.0}


def distance(ours, theirs):
    """Each row's (step's) largest |ours - theirs| over theirs' standard deviation."""
    import numpy as np

    ours = np.atleast_2d(np.asarray(ours, np.float64))
    theirs = np.atleast_2d(np.asarray(theirs, np.float64))
    if ours.shape != theirs.shape:
        raise ValueError(f"distance: rows of shape {ours.shape} and {theirs.shape}")
    return np.abs(ours - theirs).max(axis=1) / theirs.std(axis=1)


def _probe_files(tmp: Path, tools: dict) -> list[Path]:
    """Chapter 4's smallest model (random weights) in Q8_0 and Q4_0: the types whose kernels
    (repacked, AMX) are where a build dies; an F32/F16 file alone would not show it. Q4_0 is
    made by the tools' own llama-quantize where there is one; Q8_0 by our export."""
    from smallem.generating import gguf_export
    from smallem.training.model import GPT, get_config

    model = GPT(get_config("s"), "numpy", seed=0)
    out = [gguf_export.export(model, tmp / "probe-Q8_0.gguf", "q8_0")]
    if tools.get("quantize"):
        f32 = gguf_export.export(model, tmp / "probe-F32.gguf")
        q4 = tmp / "probe-Q4_0.gguf"
        r = _run([tools["quantize"], str(f32), str(q4), "Q4_0"], 600)
        if r.returncode:
            raise LlamaError(f"llama-quantize {_died(r.returncode)} making a Q4_0 file: "
                             f"{r.stderr.strip()[-200:]}")
        out.append(q4)
    return out


def usable(tools: dict | None, threads: int, model: Path | None = None) -> str | None:
    """Why llama.cpp cannot be a peer here (None if it can): a build whose check failed, or
    one short run of each test (tg, pp, and llama-simple's greedy text) on quantised files
    (``model`` too where given). llama-bench's death switches ``tools`` to its safe
    configuration (see :func:`bench`); a peer that still fails is reported, never fatal."""
    if tools is None:
        return "not found (`make llama`)"
    if tools.get("build") and not tools["build"].get("ok"):
        return f"its build does not run here: {tools['build'].get('why')}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for path in _probe_files(Path(tmp), tools) + ([model] if model else []):
                bench(tools, path, threads, gen=2, depth=4)
                bench(tools, path, threads, prompt=8)
                if tools.get("simple"):
                    greedy(tools, path, b"ab", 2)
    except (LlamaError, RuntimeError, OSError, ValueError, KeyError) as e:
        return str(e)
    return None


def peer_settings(tools: dict | None) -> dict | None:
    """What a record says of the peer it ran: where it came from, its version, its build's
    check and the configuration its runs used (with why, where it is not the default)."""
    if tools is None:
        return None
    return {"from": tools["from"], "version": version(tools),
            "build": tools.get("build"), "flags": tools.get("flags", []),
            "flags_why": tools.get("flags_why", "")}


# ---------------------------------------------------------------- building it, once a machine

def _unpack(log) -> Path:
    """The sdist, downloaded and unpacked into :func:`source_dir` once per machine."""
    src = source_dir()
    tree = src / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    if tree.is_dir():
        return tree
    src.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=src.parent, prefix="unpacking-") as tmp:
        log(f"downloading the llama-cpp-python {VERSION} sdist (its vendor/llama.cpp)")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                            "--no-binary", ":all:", f"llama-cpp-python=={VERSION}", "-d", tmp],
                           capture_output=True, text=True)
        tars = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if r.returncode or not tars:
            raise LlamaError(f"could not download llama-cpp-python=={VERSION}: "
                             f"{r.stderr.strip().splitlines()[-1:] or 'no sdist'}")
        out = Path(tmp) / "src"
        out.mkdir()
        subprocess.run(["tar", "xzf", str(tars[0]), "-C", str(out)], check=True)
        try:
            os.replace(out, src)
        except OSError:  # another process unpacked it first
            pass
    return tree


def _cmake(tree: Path, where: Path, options: list[str], log) -> None:
    where.mkdir(parents=True, exist_ok=True)
    cfg = ["cmake", "-S", str(tree), "-B", str(where / "cmake"), "-DCMAKE_BUILD_TYPE=Release",
           "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
           "-DBUILD_SHARED_LIBS=OFF", *options]
    if amx_on(options):  # the tile configuration loaded whole (the module's docstring)
        shutil.copy2(TILECFG, where / TILECFG.name)
        cfg.append(f"-DCMAKE_CXX_FLAGS=-include {where / TILECFG.name}")
    for cmd, name in ((cfg, "cmake.log"),
                      (["cmake", "--build", str(where / "cmake"), "-j", str(os.cpu_count() or 1),
                        "--target", *TOOLS, "llama"], "build.log")):
        with open(where / name, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            if subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT):
                raise LlamaError(f"llama.cpp's {'configuration' if name == 'cmake.log' else 'build'}"
                                 f" failed: see {where / name}")
    (where / "bin").mkdir(exist_ok=True)
    for t in TOOLS:
        shutil.copy2(where / "cmake" / "bin" / t, where / "bin" / t)
    _keep_libs(tree, where)
    _link_logits(where)


def _keep_libs(tree: Path, where: Path) -> None:
    """What linking llama-logits needs once cmake/ is gone (~1 GB of objects): the static
    libraries llama-simple is linked with (lib/), llama.cpp's headers (include/), and the
    compiler and the rest of llama-simple's link line (lib/link.json)."""
    cmake = where / "cmake"
    link_txt = cmake / "examples" / "simple" / "CMakeFiles" / "llama-simple.dir" / "link.txt"
    cache = (cmake / "CMakeCache.txt").read_text()
    cxx = next((ln.split("=", 1)[1] for ln in cache.splitlines()
                if ln.startswith("CMAKE_CXX_COMPILER:")), "c++")
    words = [w.strip('"') for w in link_txt.read_text().split()]
    libs, rest, skip = [], [], False
    for w in words[1:]:  # words[0] is the compiler
        if skip:
            skip = False
        elif w == "-o":
            skip = True
        elif w.endswith(".o"):
            pass
        elif w.endswith(".a") and not os.path.isabs(w):  # the build's own, relative to it
            libs.append(w)
        else:  # the flags, and the system's libraries (OpenMP's, pthread's) by their paths
            rest.append(w)
    lib, inc = where / "lib", where / "include"
    for d in (lib, inc):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
    kept = []
    for a in libs:
        src = cmake / "examples" / "simple" / a  # the link line runs in the target's folder
        if not src.is_file():
            raise LlamaError(f"llama-simple's link line names {a}, which is not in {cmake}")
        shutil.copy2(src, lib / src.name)
        if src.name not in kept:
            kept.append(src.name)
    for d in (tree / "include", tree / "ggml" / "include"):
        for h in d.glob("*.h"):
            shutil.copy2(h, inc / h.name)
    (lib / "link.json").write_text(json.dumps(
        {"cxx": cxx, "libs": kept, "rest": rest}, indent=1) + "\n")


def _link_logits(where: Path) -> Path:
    """Compile and link our llama-logits (:data:`LOGITS_SOURCE`) against the kept libraries,
    into bin/ (through a temporary name, so a half-written program is never found); the
    source's hash beside it says which source it was made from."""
    lib = where / "lib"
    try:
        link = json.loads((lib / "link.json").read_text())
    except (OSError, ValueError) as e:
        raise LlamaError(f"no libraries to link llama-logits with in {lib} ({e}): "
                         f"`smallem llama --force` builds them") from e
    out = where / "bin" / LOGITS
    tmp = out.with_name(f".{LOGITS}-{os.getpid()}")
    cmd = [link["cxx"], "-std=c++17", "-I", str(where / "include"),
           str(LOGITS_SOURCE), "-o", str(tmp), "-Wl,--start-group",
           *[str(lib / a) for a in link["libs"]], "-Wl,--end-group", *link["rest"]]
    with open(where / "logits.log", "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc:
        tmp.unlink(missing_ok=True)
        raise LlamaError(f"llama-logits did not compile: see {where / 'logits.log'}")
    os.replace(tmp, out)
    out.with_name(LOGITS + ".source").write_text(_source_hash() + "\n")
    return out


def _source_hash() -> str:
    return hashlib.sha256(LOGITS_SOURCE.read_bytes()).hexdigest()


def logits_current(where: Path | None = None) -> bool:
    """Whether bin/llama-logits was made from the present llama_logits.cpp."""
    stamp = (where or build_dir()) / "bin" / (LOGITS + ".source")
    return stamp.is_file() and stamp.read_text().strip() == _source_hash()


def check(tools: dict, threads: int) -> str | None:
    """Why a fresh build does not run here (None if it does): llama-bench and llama-simple,
    in their default configurations, on quantised files."""
    tools = {**tools, "flags": [], "build": None}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for path in _probe_files(Path(tmp), tools):
                bench({**tools, "flags": ["--repack", "1"]}, path, threads, gen=2, depth=4)
                bench({**tools, "flags": ["--repack", "1"]}, path, threads, prompt=8)
                greedy(tools, path, b"ab", 2)
                if tools.get("logits"):
                    logits(path, [1, 2], 2, threads, tools)
    except (LlamaError, RuntimeError, OSError, ValueError) as e:
        return str(e)
    return None


def build(force: bool = False, log=print) -> dict:
    """Build llama.cpp's tools for this machine (once: a later call finds them) and check
    them on quantised files; returns the check's verdict, also kept in ``check.json``."""
    where = build_dir()
    verdict = where / "check.json"
    if verdict.is_file() and (where / "bin" / "llama-bench").is_file() and not force:
        out = json.loads(verdict.read_text())
        if not logits_current(where):  # our program changed (or is missing): relink it alone
            log(f"linking {LOGITS} from {LOGITS_SOURCE.name} against the kept libraries")
            _link_logits(where)
        log(f"llama.cpp {VERSION} already built for this machine in {where / 'bin'} "
            + ("(checked on quantised files)" if out["ok"] else f"(does not run here: {out['why']})"))
        return out
    tree = _unpack(log)
    threads = min(2, os.cpu_count() or 1)
    t0 = time.perf_counter()
    options = isa_switches()
    if where.exists():
        shutil.rmtree(where)
    log(f"building llama.cpp {VERSION} into {where} (a few minutes; {' '.join(options[1:])})")
    _cmake(tree, where, options, log)
    tools = {"bench": str(where / "bin" / "llama-bench"),
             "simple": str(where / "bin" / "llama-simple"),
             "quantize": str(where / "bin" / "llama-quantize"),
             "logits": str(where / "bin" / LOGITS), "from": "smallem llama"}
    why = check(tools, threads)
    out = {"version": VERSION, "options": options, "ok": why is None, "why": why,
           "safe_build": False, "seconds": None}
    if why:  # the safe configuration of the build: weights not repacked at load
        log(f"llama.cpp's build fails on a quantised file here ({why}): building it again "
            f"with {' '.join(SAFE_BUILD)}")
        options = options + list(SAFE_BUILD)
        _cmake(tree, where, options, log)
        why2 = check(tools, threads)
        out.update(options=options, ok=why2 is None, safe_build=True,
                   why=why2 if why2 else f"the default build {why}; rebuilt with "
                                         f"{' '.join(SAFE_BUILD)}, which runs")
    out["seconds"] = round(time.perf_counter() - t0, 1)
    shutil.rmtree(where / "cmake", ignore_errors=True)  # ~1 GB of objects; bin/ is what runs
    verdict.write_text(json.dumps(out, indent=1) + "\n")
    log(f"llama.cpp in {where / 'bin'}: " + ("checked on quantised files"
                                            if out["ok"] else f"does not run here: {out['why']}")
        + f" ({out['seconds'] / 60:.1f} min)")
    return out


class Rates(list):
    """llama-bench's tokens/s for one test, one a round, as a chapter's paired rounds take
    them: a run that fails (after :func:`bench`'s retry) ends the series, which then keeps no
    sample and says why in ``why``; the rounds of our side go on."""

    def __init__(self):
        super().__init__()
        self.why: str | None = None

    def take(self, call) -> None:
        if self.why is not None:
            return
        try:
            self.append(call())
        except LlamaError as e:
            self.why = str(e)
            self.clear()
