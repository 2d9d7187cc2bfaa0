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

from smallem.cpu import isa


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


def physical_cores(cpus=None, topology=Path("/sys/devices/system/cpu")) -> int:
    """Physical cores among the CPUs this process may run on (``cpus``: their numbers): the
    distinct (package, core) pairs of their topology. SMT siblings share a core's FMA pipes
    and its L1 and L2, so peaks and per-core caches count cores, not logical CPUs. Where the
    topology cannot be read, every logical CPU counts as a core."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None and hasattr(os, "sched_getaffinity")
                  else cpus if cpus is not None else range(os.cpu_count() or 1))
    seen = set()
    for c in cpus:
        d = Path(topology) / f"cpu{c}" / "topology"
        try:
            seen.add((d.joinpath("physical_package_id").read_text().strip(),
                      d.joinpath("core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return len(seen) or len(cpus)


@functools.lru_cache(maxsize=1)
def cpu_identity() -> dict:
    """:func:`smallem.cpu.isa.parse_cpuinfo` of this machine (empty fields where there is no
    /proc/cpuinfo)."""
    return isa.parse_cpuinfo(isa.cpuinfo_text())


def cpu_model() -> str:
    name = cpu_identity()["model_name"]
    if name:
        return name
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
    entries = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    if base.is_dir():
        for index in sorted(base.glob("index*")):
            try:
                entry = {k: (index / k).read_text().strip()
                         for k in ("level", "type", "size", "shared_cpu_list")}
            except OSError:
                continue
            try:
                entry["ways"] = (index / "ways_of_associativity").read_text().strip()
            except OSError:
                pass
            entries.append(entry)
    elif platform.system() == "Darwin":
        for level, key in (("1", "hw.l1dcachesize"), ("2", "hw.l2cachesize"), ("3", "hw.l3cachesize")):
            out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True).stdout.strip()
            if out.isdigit():
                entries.append({"level": level, "type": "Data" if level == "1" else "Unified",
                                "size": out, "shared_cpu_list": "0"})
    return caches_from(entries, usable_cores())


def caches_from(entries: list[dict], cores: int) -> dict:
    """:func:`caches` from the entries of cpu0's cache folder in sysfs (each a dict of its
    files ``level``, ``type``, ``size``, ``shared_cpu_list`` and, where known, ``ways``), for
    ``cores`` usable cores. ``*_ways`` is the associativity (0 where unknown)."""
    found = {"L1d": 0, "L2": 0, "L3": 0}
    shared = {"L1d": 1, "L2": 1, "L3": 1}
    ways = {"L1d": 0, "L2": 0, "L3": 0}
    for e in entries:
        name = {"1": "L1d", "2": "L2", "3": "L3"}.get(e["level"])
        if name is None or (e["level"] == "1" and e["type"] == "Instruction"):
            continue
        found[name] = _parse_size(e["size"])
        shared[name] = _count_cpus(e["shared_cpu_list"])
        ways[name] = int(e.get("ways") or 0)
    return {
        **{f"{k}_bytes": v for k, v in found.items()},
        **{f"{k}_ways": v for k, v in ways.items()},
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
        **{k: cpu_identity()[k] for k in ("vendor", "family", "model")},
        "arch": platform.machine(),
        "cores": usable_cores(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": min(usable_cores(), physical_cores()),
        "isa": isa.describe(),
        "caches": caches(),
        "memory_bytes": memory_bytes(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "hypervisor": "hypervisor" in isa.cpu_flags(),
    }
