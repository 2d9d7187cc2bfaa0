"""The machines in tests/machines/, as the library would see them there.

Every folder that holds a chapter-1 record is a machine: its identity (the first processor's
block of /proc/cpuinfo, or, where that was not captured, the record's fingerprint), its caches
(cpu0's cache folder, or the record's), its core count, and the inputs of the GEMM's choices
(``feeds``: what its chapter-2 record says its library measured, or, for an older record, what
its chapter-1 record implies). :func:`inject` makes the library take them for this machine's,
so that a test of a machine-dependent decision runs once per captured machine (the ``captured``
fixture in conftest.py) and a suite green on one CPU is green on all of them.

What cannot be injected is the instruction set: the kernels that run are this CPU's. A decision
that depends on the ISA (the level, its extensions, the bf16 paths, the micro-kernel's shape) is
tested through the library's pure functions of the flags, never by running another CPU's code.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from smallem.product import gemm
from smallem.cpu import isa, machine, machine_info
from smallem.book import ch1, records

MACHINES = Path(__file__).parent / "machines"
NAMES = tuple(sorted(d.name for d in MACHINES.iterdir()
                     if (d / "records" / "ch1.machine.json").is_file()))


@dataclass(frozen=True)
class Captured:
    name: str
    ident: dict
    caches: dict
    cores: int
    level: str                      # the best ISA level its flags allow
    feeds: dict                     # gemm.loop_order's and bf16_path's inputs there
    folder: Path = field(repr=False)

    @property
    def records(self) -> Path:
        return self.folder / "records"

    def record(self, name: str) -> dict | None:
        path = self.records / f"{name}.json"
        return records.load(name, self.records) if path.is_file() else None

    @property
    def kernel_shape(self) -> tuple[int, int]:
        """(MR, NR) the micro-kernel of its level has (the model the compiled shape follows)."""
        return gemm.micro_shape(*gemm.REGISTER_FILE[self.level])


def _caches_from_file(path: Path, cores: int) -> dict:
    entries = []
    for line in path.read_text().splitlines():
        fields = dict(kv.split("=", 1) for kv in line.partition(": ")[2].split())
        entries.append({"level": fields["level"], "type": fields["type"], "size": fields["size"],
                        "shared_cpu_list": fields["shared"], "ways": fields.get("ways")})
    return machine_info.caches_from(entries, cores)


def _ident_from_record(machine: dict) -> dict:
    """What a record's fingerprint says of the CPU, in parse_cpuinfo's shape (flags: those its
    ISA levels and extensions need; a record keeps no more)."""
    found = machine["isa"]
    flags = set().union(*(isa.REQUIRED[lv] for lv in found["supported"]), found["extensions"])
    return {"vendor": machine.get("vendor", ""), "family": machine.get("family", -1),
            "model": machine.get("model", -1), "model_name": machine.get("cpu", ""),
            "flags": frozenset(flags)}


def feeds_from_ch1(rec: dict) -> dict:
    """One core's f32 and bf16 probe rates and each core's share of the L3 triad with every
    core reading, as chapter 1 recorded them: what machine.feeds measures, from the staircase."""
    sm = ch1.summary(rec)
    cores = sm["cores"]
    return {"f32_gops_core": sm["peak"]["f32", 1], "bf16_gops_core": sm["peak"]["bf16", 1],
            "l3_gbs_core": sm["triad_plateaus"][cores]["L3"] / cores}


@functools.lru_cache(maxsize=None)
def load(name: str) -> Captured:
    folder = MACHINES / name
    ch1_rec = records.load("ch1.machine", folder / "records")
    fp = ch1_rec["machine"]
    cores = int(fp["cores"])
    cpuinfo = folder / "cpuinfo-cpu0.txt"
    ident = isa.parse_cpuinfo(cpuinfo.read_text()) if cpuinfo.is_file() else _ident_from_record(fp)
    caches_txt = folder / "caches.txt"
    caches = _caches_from_file(caches_txt, cores) if caches_txt.is_file() else dict(fp["caches"])
    level = isa.best_of(ident["flags"])
    ch2_path = folder / "records" / "ch2.gemm.json"
    feeds = None
    if ch2_path.is_file():
        feeds = json.loads(ch2_path.read_text())["settings"].get("feeds")
    if not feeds:
        feeds = feeds_from_ch1(ch1_rec)
    feeds = dict(feeds)
    if "reach_bytes" not in feeds:  # records from before the feeds had it: chapter 1's sweep
        feeds["reach_bytes"] = machine.cache_reach(copy_points(ch1_rec))
    return Captured(name, ident, caches, cores, level, feeds, folder)


def copy_points(rec: dict) -> list[tuple[int, float]]:
    """One thread's copy at each working set of chapter 1's stream sweep: (bytes, GB/s)."""
    return [(r["params"]["bytes"], records.median(r))
            for r in records.results(rec, "stream", kernel="copy", threads=1)]


def inject(m: Captured, monkeypatch) -> Captured:
    """Make the library see machine ``m``: its caches, identity, core count and GEMM feeds;
    the GEMM's blocks and order are then derived again from them at the next product (with
    this CPU's micro-kernel, which is the one that runs)."""
    monkeypatch.setattr(machine_info, "caches", lambda: dict(m.caches))
    monkeypatch.setattr(machine_info, "cpu_identity", lambda: m.ident)
    monkeypatch.setenv("SMALLEM_THREADS", str(m.cores))
    monkeypatch.setattr(gemm, "_feeds", lambda level, cores: dict(m.feeds))
    monkeypatch.setattr(gemm, "_loaded", {})  # blocks and order chosen again, for m
    # the orders timed on this host would say nothing of m: its model's order stands
    monkeypatch.setattr(gemm, "timed_orders", lambda *a, **k: None)
    monkeypatch.delenv(gemm.ORDER_ENV, raising=False)
    monkeypatch.delenv(gemm.BF16_ENV, raising=False)
    return m
