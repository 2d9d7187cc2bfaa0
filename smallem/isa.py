"""Which instruction set the C kernels are built for.

Three levels, best first: ``avx512`` (F/BW/VL/DQ, plus VNNI and BF16 where the
CPU has them), ``avx2`` (with FMA and F16C) and ``generic`` (portable C, the only
level on arm64 or any non-x86 CPU). The best level the CPU supports is chosen at
run time; ``SMALLEM_ISA=avx2`` (or ``generic``, ``avx512``) forces one.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess

LEVELS = ("avx512", "avx2", "generic")

# What each level needs from the CPU, as Linux spells the flags in /proc/cpuinfo.
REQUIRED = {
    "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"},
    "avx2": {"avx2", "fma", "f16c"},
    "generic": set(),
}

# Extensions that widen a level when present; each becomes a -m flag and a macro.
OPTIONAL = {"avx512": ("avx512_vnni", "avx512_bf16")}


class ISAError(RuntimeError):
    """The requested instruction set cannot run on this CPU."""


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, in /proc/cpuinfo spelling."""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
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
    flags = cpu_flags() if flags is None else flags
    return REQUIRED[level] <= flags


@functools.lru_cache(maxsize=1)
def best() -> str:
    return next(level for level in LEVELS if supported(level))


def selected() -> str:
    """The level kernels use: ``SMALLEM_ISA`` if set, else the best supported."""
    forced = os.environ.get("SMALLEM_ISA", "")
    if not forced:
        return best()
    return _forced(forced)


@functools.lru_cache(maxsize=8)
def _forced(forced: str) -> str:
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


def extensions(level: str, flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """Optional extensions of ``level`` that this CPU (or ``flags``) has."""
    flags = cpu_flags() if flags is None else flags
    return tuple(e for e in OPTIONAL.get(level, ()) if e in flags)


def compile_flags(level: str, exts: tuple[str, ...]) -> list[str]:
    """Compiler flags for one level. ``generic`` adds none: it must build anywhere."""
    if level == "generic":
        return []
    flags = ["-mavx2", "-mfma", "-mf16c"]
    if level == "avx512":
        flags += ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                  "-mprefer-vector-width=512"]
        flags += ["-m" + e.replace("_", "") for e in exts]  # -mavx512vnni -mavx512bf16
    return flags


def describe() -> dict:
    level = selected()
    return {
        "isa": level,
        "extensions": list(extensions(level)),
        "supported": [l for l in LEVELS if supported(l)],
        "forced": bool(os.environ.get("SMALLEM_ISA")),
        "arch": platform.machine(),
    }

