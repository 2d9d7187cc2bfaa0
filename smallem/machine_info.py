"""Describe the machine a measurement ran on: CPU model, cores, caches, OS.

Every measurement record carries this fingerprint, so a number is never
separated from the machine that produced it.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

from . import isa


def usable_cores() -> int:
    """Cores this process may run on (the affinity mask, not the whole machine)."""
    env = os.environ.get("SMALLEM_THREADS")
    if env:
        return max(1, int(env))
    return _affinity_count()


@functools.lru_cache(maxsize=1)
def _affinity_count() -> int:
    # Read once: the system call costs microseconds, and every matmul asks.
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cpu_model() -> str:
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.split(":", 1)[1].strip()
    if platform.system() == "Darwin":
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                             capture_output=True, text=True).stdout.strip()
        if out:
            return out
    return platform.processor() or platform.machine()


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


@functools.lru_cache(maxsize=1)
def caches() -> dict:
    """Per-core L1d and L2, and the L3 shared by this core, in bytes (0 if unknown).

    ``*_instances`` counts how many separate caches of that level the usable
    cores touch (an L3 is often shared, an L2 usually private).
    """
    found = {"L1d": 0, "L2": 0, "L3": 0}
    shared = {"L1d": 1, "L2": 1, "L3": 1}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    if base.is_dir():
        for index in sorted(base.glob("index*")):
            try:
                level = (index / "level").read_text().strip()
                kind = (index / "type").read_text().strip()
                size = _parse_size((index / "size").read_text())
                sharing = (index / "shared_cpu_list").read_text().strip()
            except OSError:
                continue
            name = {"1": "L1d", "2": "L2", "3": "L3"}.get(level)
            if name is None or (level == "1" and kind == "Instruction"):
                continue
            found[name] = size
            shared[name] = _count_cpus(sharing)
    elif platform.system() == "Darwin":
        for name, key in (("L1d", "hw.l1dcachesize"), ("L2", "hw.l2cachesize"), ("L3", "hw.l3cachesize")):
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True).stdout.strip()
            found[name] = int(out) if out.isdigit() else 0
    cores = usable_cores()
    return {
        **{f"{k}_bytes": v for k, v in found.items()},
        **{f"{k}_instances": max(1, -(-cores // shared[k])) for k in found},
    }


def _count_cpus(cpulist: str) -> int:
    n = 0
    for part in cpulist.split(","):
        lo, _, hi = part.partition("-")
        n += (int(hi) - int(lo) + 1) if hi else 1
    return n


def memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def fingerprint() -> dict:
    """The machine part of every record."""
    return {
        "cpu": cpu_model(),
        "arch": platform.machine(),
        "cores": usable_cores(),
        "logical_cpus": os.cpu_count(),
        "isa": isa.describe(),
        "caches": caches(),
        "memory_bytes": memory_bytes(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "hypervisor": "hypervisor" in isa.cpu_flags(),
    }
