"""Which instruction set the C kernels are built for.

Three levels, best first: ``avx512`` (F/BW/VL/DQ, plus VNNI, BF16, AMX_BF16 and
AMX_INT8 where the CPU has them), ``avx2`` (with FMA and F16C, plus AVX-VNNI where the CPU
has it) and ``generic`` (portable C,
the only level on arm64 or any non-x86 CPU). The best level the CPU supports is
chosen at run time; ``SMALLEM_ISA=avx2`` (or ``generic``, ``avx512``) forces one.

For tests, ``SMALLEM_EMULATE=avx512`` makes the ``avx512`` level (with VNNI, BF16
and AMX) available on an AVX2 CPU that lacks it: the kernels are then compiled with
SIMDe's portable definitions of the AVX-512 intrinsics (Debian's ``libsimde-dev``)
and ``kernels_c/emulate.h``'s of the AMX tile instructions. The results are those of
the AVX-512 code, the speed is not: records refuse to be made in this mode. On a CPU
with AVX-512 it does nothing.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import tempfile
from pathlib import Path

from smallem.plumbing import toolchain

LEVELS = ("avx512", "avx2", "generic")

# What each level needs from the CPU, as Linux spells the flags in /proc/cpuinfo.
REQUIRED = {
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"},
    "avx2": {"avx2", "fma", "f16c"},
    "generic": set(),
}

# Extensions that widen a level when present; each becomes a -m flag and a macro.
# AVX-VNNI (vpdpbusd on ymm, VEX-encoded: Alder Lake and later, Zen 5, Sapphire Rapids) widens
# AVX2: the decoder's int8 product takes it where AVX512_VNNI is not the level's.
OPTIONAL = {"avx512": ("avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8"),
            "avx2": ("avx_vnni",)}
# Compiler flags of an optional extension, where they are not "-m" + its name without "_".
# AMX's tile registers (amx_tile) come with every CPU that has amx_bf16 or amx_int8.
EXTENSION_FLAGS = {"amx_bf16": ("-mamx-tile", "-mamx-bf16"), "amx_int8": ("-mamx-tile", "-mamx-int8"),
                   "avx_vnni": ("-mavxvnni",)}


class ISAError(RuntimeError):
    """The requested instruction set cannot run on this CPU."""


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def parse_cpuinfo(text: str) -> dict:
    """Vendor, family, model, model name and flags of the first CPU in a /proc/cpuinfo text.

    Family and model are ints (-1 where absent, as on arm64); flags a frozenset.
    """
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())

    def number(key):
        try:
            return int(fields.get(key, ""), 0)
        except ValueError:
            return -1

    name = next((fields[k] for k in ("model name", "Model", "Hardware") if fields.get(k)), "")
    return {"vendor": fields.get("vendor_id", ""), "family": number("cpu family"),
            "model": number("model"), "model_name": name,
            "flags": frozenset((fields.get("flags") or fields.get("Features") or "").split())}


@functools.lru_cache(maxsize=1)
def cpuinfo_text() -> str:
    """/proc/cpuinfo, or "" where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, in /proc/cpuinfo spelling."""
    flags = parse_cpuinfo(cpuinfo_text())["flags"]
    if flags:
        return flags
    if platform.system() == "Darwin" and is_x86():
        out = _sysctl("machdep.cpu.features") + " " + _sysctl("machdep.cpu.leaf7_features")
        names = {w.lower() for w in out.split()}
        # macOS writes AVX512VNNI where Linux writes avx512_vnni.
        renames = {"avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16"}
        return frozenset(renames.get(n, n) for n in names)
    return frozenset()


def _sysctl(key: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True).stdout
    except OSError:
        return ""


def supported(level: str, flags: frozenset[str] | None = None) -> bool:
    if level not in LEVELS:
        raise ValueError(f"unknown ISA level {level!r}; choose one of {LEVELS}")
    if level != "generic" and not is_x86():
        return False
    if REQUIRED[level] <= (cpu_flags() if flags is None else flags):
        return True
    return flags is None and emulating(level)  # checked last: an environment lookup costs ~1 us


EMULATE_ENV = "SMALLEM_EMULATE"


def emulating(level: str = "avx512") -> bool:
    """Whether ``level`` runs through SIMDe here (``SMALLEM_EMULATE=avx512`` on a CPU without it).

    Raises :class:`ISAError` if emulation is asked for but cannot be had.
    """
    if level != "avx512" or REQUIRED["avx512"] <= cpu_flags():
        return False
    wanted = os.environ.get(EMULATE_ENV, "")
    if not wanted:
        return False
    if wanted.strip().lower() != "avx512":
        raise ISAError(f"{EMULATE_ENV}={wanted!r}: the only level that can be emulated is avx512")
    reason = emulation_unavailable()
    if reason:
        raise ISAError(f"{EMULATE_ENV}=avx512 cannot be used here: {reason}")
    return True


@functools.lru_cache(maxsize=1)
def emulation_unavailable() -> str | None:
    """Why SIMDe emulation of AVX-512 cannot run on this machine, or None if it can."""
    if not is_x86() or not REQUIRED["avx2"] <= cpu_flags():
        return "it runs on AVX2, which this CPU lacks"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "t.c")
        src.write_text("#include <simde/x86/avx512.h>\nint main(void){return 0;}\n")
        try:
            r = subprocess.run([toolchain.compiler(), *compile_flags("avx2", ()), "-c", str(src),
                                "-o", str(Path(tmp, "t.o"))], capture_output=True, text=True)
        except (OSError, toolchain.BuildError) as e:
            return str(e)
    if r.returncode != 0:
        return "the C compiler finds no SIMDe headers (Debian/Ubuntu: apt install libsimde-dev)"
    return None


@functools.lru_cache(maxsize=1)
def best() -> str:
    return best_of(cpu_flags())  # never emulated


def best_of(flags: frozenset[str]) -> str:
    """The best level a CPU with ``flags`` (/proc/cpuinfo spelling) runs, on x86."""
    return next(level for level in LEVELS if supported(level, flags))


def selected() -> str:
    """The level kernels use: ``SMALLEM_ISA`` if set, else the best supported."""
    forced = os.environ.get("SMALLEM_ISA", "")
    if not forced:
        return best()
    return _forced(forced, os.environ.get(EMULATE_ENV, ""))


@functools.lru_cache(maxsize=8)
def _forced(forced: str, emulate: str) -> str:
    forced = forced.strip().lower()
    if forced not in LEVELS:
        raise ISAError(f"SMALLEM_ISA={forced!r} is not one of {', '.join(LEVELS)}")
    if not supported(forced):
        missing = sorted(REQUIRED[forced] - cpu_flags()) or [platform.machine()]
        raise ISAError(
            f"SMALLEM_ISA={forced} cannot run on this CPU (missing: {', '.join(missing)}); "
            f"this CPU supports: {', '.join(l for l in LEVELS if supported(l))}"
        )
    return forced


WITHOUT_ENV = "SMALLEM_WITHOUT"  # extensions left out although the CPU has them (tests)


def extensions(level: str, flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """Optional extensions of ``level`` that this CPU (or ``flags``) has; for this CPU, less
    those ``$SMALLEM_WITHOUT`` names (``avx_vnni``: the AVX2 level's vpmaddubsw path, tested
    on a CPU that would take vpdpbusd)."""
    if flags is None:  # every kernel call asks: one answer per level and environment
        return _own_extensions(level, os.environ.get(WITHOUT_ENV, ""),
                               os.environ.get(EMULATE_ENV, ""))
    return tuple(e for e in OPTIONAL.get(level, ()) if e in flags)


@functools.lru_cache(maxsize=None)
def _own_extensions(level: str, without_env: str, emulate_env: str) -> tuple[str, ...]:
    if emulating(level):
        return OPTIONAL[level]  # SIMDe and emulate.h have them all
    without = set(without_env.replace(",", " ").split())
    return tuple(e for e in OPTIONAL.get(level, ()) if e in cpu_flags() and e not in without)


def compile_flags(level: str, exts: tuple[str, ...]) -> list[str]:
    """Compiler flags for one level. ``generic`` adds none: it must build anywhere."""
    if level == "generic":
        return []
    flags = ["-mavx2", "-mfma", "-mf16c"]
    if emulating(level):
        return flags + ["-DSM_EMULATE_AVX512"]
    if level == "avx2":
        for e in exts:  # -mavxvnni
            flags += EXTENSION_FLAGS.get(e, ("-m" + e.replace("_", ""),))
    if level == "avx512":
        flags += ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                  "-mprefer-vector-width=512"]
        for e in exts:  # -mavx512vnni -mavx512bf16 -mamx-tile -mamx-bf16
            flags += EXTENSION_FLAGS.get(e, ("-m" + e.replace("_", ""),))
    return flags


def describe() -> dict:
    level = selected()
    return {
        "isa": level,
        "extensions": list(extensions(level)),
        "supported": [l for l in LEVELS if supported(l)],
        "forced": bool(os.environ.get("SMALLEM_ISA")),
        "emulated": emulating(level),
        "arch": platform.machine(),
    }

