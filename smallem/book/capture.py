"""Keeping the machines current: ``smallem machine --save-to tests/machines/<name>`` writes
what the OS says of this machine (``lscpu.txt``, ``cpuinfo-cpu0.txt``, ``caches.txt``) and
copies the records of the ``make book`` that just ran here into ``<name>/records/``, after
checking that they are this machine's, measured in full."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from smallem.cpu import machine_info
from . import records

OS_FILES = ("lscpu.txt", "cpuinfo-cpu0.txt", "caches.txt")


class CaptureError(ValueError):
    """The records cannot stand for this machine, or the folder cannot be written."""


def cpuinfo_first(text: str) -> str:
    """The first processor's block of a /proc/cpuinfo text."""
    return text.strip().split("\n\n")[0] + "\n"


def caches_text(base: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> str:
    """One line per cache of cpu0, as tests/machines/README.md describes them."""
    lines = []
    for d in sorted(base.glob("index*")):
        def read(name, d=d):
            p = d / name
            return p.read_text().strip() if p.is_file() else "?"
        lines.append(f"{d.name}: level={read('level')} type={read('type')} size={read('size')} "
                     f"ways={read('ways_of_associativity')} line={read('coherency_line_size')} "
                     f"shared={read('shared_cpu_list')}")
    return "\n".join(lines) + "\n"


KEYS = ("cpu", "vendor", "family", "model", "cores")  # what makes two fingerprints one machine


def check_records(rec_dir: Path, here: dict) -> tuple[list[Path], list[str]]:
    """(the records in ``rec_dir`` measured on a machine like ``here``, the names of those
    made elsewhere): a GPU's records and those a chapter keeps from another machine (chapter
    2's bf16 paths measured elsewhere) are left out. CaptureError where chapter 1's record is
    missing or another machine's, or where a record of this machine is a quick run."""
    files = sorted(Path(rec_dir).glob("*.json"))
    if not any(f.name == "ch1.machine.json" for f in files):
        raise CaptureError(f"{rec_dir} has no ch1.machine.json: run `make book` here first")
    mine = {k: here.get(k) for k in KEYS}
    chosen, elsewhere = [], []
    for f in files:
        data = records.load(f.stem, rec_dir)
        m = data.get("machine", {})
        if {k: m.get(k) for k in KEYS} != mine or m.get("gpu"):
            if f.name == "ch1.machine.json":
                raise CaptureError(f"{f.name} was measured on {m.get('cpu')} with "
                                   f"{m.get('cores')} cores, not on this machine "
                                   f"({mine['cpu']}, {mine['cores']} cores)")
            elsewhere.append(f.name)
            continue
        if data.get("settings", {}).get("quick"):
            raise CaptureError(f"{f.name} is a quick run (tiny sizes): measure in full first")
        chosen.append(f)
    return chosen, elsewhere


def save_to(dest, rec_dir=None, here: dict | None = None) -> tuple[Path, list[str]]:
    """Capture this machine into ``dest`` (created): its OS files, and the records of its last
    ``make book`` in ``dest/records`` in place of those there. Returns the folder and the
    records left out as another machine's."""
    dest = Path(dest)
    rec_dir = Path(rec_dir or records.records_dir())
    chosen, elsewhere = check_records(rec_dir, here or machine_info.fingerprint())
    try:
        (dest / "records").mkdir(parents=True, exist_ok=True)
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True)
        if lscpu.returncode == 0:
            (dest / "lscpu.txt").write_text(lscpu.stdout)
        cpuinfo = Path("/proc/cpuinfo")
        if cpuinfo.is_file():
            (dest / "cpuinfo-cpu0.txt").write_text(cpuinfo_first(cpuinfo.read_text()))
        (dest / "caches.txt").write_text(caches_text())
        for old in (dest / "records").glob("*.json"):   # a record this run did not make
            old.unlink()
        for f in chosen:
            shutil.copy2(f, dest / "records" / f.name)
    except OSError as e:
        raise CaptureError(f"cannot write {dest}: {e.strerror or e}") from None
    return dest, elsewhere
