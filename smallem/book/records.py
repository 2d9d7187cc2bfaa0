"""Measurement records: one JSON schema for every number in the book.

A record is one file, ``<records dir>/<name>.json``::

    {"schema": "smallem.record/1", "name": "ch1.peaks",
     "date": "...", "commit": "abc1234", "dirty": false,
     "machine": {cpu, arch, cores, isa, caches, os, ...},
     "settings": {...},                        # what the whole run used
     "warnings": ["..."],                      # only when the run doubts itself
     "results": [{"name": ..., "params": {...}, "unit": "Gop/s",
                  "value": {"median", "min", "max", "n"},
                  "seconds": {"median", "min", "max", "n",
                              "samples"}}, ...]}   # samples: paired comparisons only

A paired comparison (two libraries timed in turn, see
:func:`smallem.cpu.timing.measure_interleaved`) keeps every sample in the order
taken, so that sample i of each side is round i.

The records folder is ``figures/records/`` in the repository (committed: they
are what the site shows), or ``$SMALLEM_RECORDS``. Figures and tables are made
from records by :mod:`smallem.book.figures`, never by hand.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

from smallem.cpu import isa, machine_info
from smallem.plumbing.build import ROOT

SCHEMA = "smallem.record/1"


class RecordError(ValueError):
    """A record file is missing, unreadable or not a smallem record."""


def records_dir() -> Path:
    return Path(os.environ.get("SMALLEM_RECORDS", ROOT / "figures" / "records"))


def git_commit() -> tuple[str, bool | None]:
    """(commit, dirty) of the tree being measured.

    ``$SMALLEM_COMMIT``, where set, names the commit instead, and dirty is None (unknown):
    for a copy of the tree measured elsewhere, such as on a lent GPU machine, whose
    ``.git`` may be missing or older than the files beside it.
    Dirty means the code differs from the commit: changes under ``figures/`` (records
    and figures, all generated) do not count, or every record `make book` writes after
    its first would call the tree dirty because of that first record.
    """
    named = os.environ.get("SMALLEM_COMMIT")
    if named:
        return named, None
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", ":(exclude)figures"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10)
        if sha.returncode == 0:
            return sha.stdout.strip(), bool(dirty.stdout.strip())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown", None


class Record:
    """Collects results of one measurement run, then writes them as one file."""

    def __init__(self, name: str, settings: dict | None = None, machine: dict | None = None):
        if isa.emulating():
            raise RecordError(f"{isa.EMULATE_ENV} is set: the AVX-512 kernels run through SIMDe's "
                              f"emulation, whose timings mean nothing; unset it to measure")
        self.name = name
        commit, dirty = git_commit()
        self.data = {
            "schema": SCHEMA,
            "name": name,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit,
            "dirty": dirty,
            "machine": machine or machine_info.fingerprint(),
            "settings": dict(settings or {}),
            "results": [],
        }

    def add(self, name: str, unit: str, value: dict, *, seconds: dict | None = None, **params):
        """One result. ``value`` holds median/min/max/n (see :class:`smallem.cpu.timing.Timing`)."""
        if not {"median", "min", "max"} <= set(value):
            raise ValueError(f"result {name!r}: value needs median, min and max, got {sorted(value)}")
        entry = {"name": name, "params": params, "unit": unit, "value": value}
        if seconds is not None:
            entry["seconds"] = seconds
        self.data["results"].append(entry)
        return entry

    def warn(self, message: str) -> None:
        """Keep a doubt about this run in the record (``warnings``) and say it now."""
        self.data.setdefault("warnings", []).append(message)
        print(f"warning ({self.name}): {message}", file=sys.stderr)

    def save(self, folder: Path | None = None) -> Path:
        folder = Path(folder or records_dir())
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, path)
        return path


def load(name: str, folder: Path | None = None) -> dict:
    path = Path(folder or records_dir()) / f"{name}.json"
    if not path.is_file():
        raise RecordError(f"no record {path}: run the measurement first (e.g. `smallem machine`)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise RecordError(f"record {path} is not valid JSON: {e}") from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise RecordError(f"{path} is not a {SCHEMA} record")
    return data


def exists(name: str, folder: Path | None = None) -> bool:
    return (Path(folder or records_dir()) / f"{name}.json").is_file()


NOT_ON_GPU = "not measured on a GPU yet"  # a GPU's cell before any GPU record exists


def not_measured(rec: dict, why: str = "") -> str:
    """What a page says where a record predates the reading that needs one of its fields:
    "not measured at <commit>", the record's short commit, and why where given. A captured
    machine's older records render with today's code this way, a value at a time."""
    text = f"not measured at {str(rec.get('commit') or 'unknown')[:7]}"
    return f"{text} ({why})" if why else text


def load_or_measure(name: str, run) -> dict:
    """A notebook's first step: this machine's record ``name``, measured by ``run(quick=...)``
    when it is missing or when SMALLEM_QUICK=1 / SMALLEM_REMEASURE=1 ask for a fresh one."""
    quick = os.environ.get("SMALLEM_QUICK") == "1"
    if quick or os.environ.get("SMALLEM_REMEASURE") == "1" or not exists(name):
        rec = run(quick=quick, progress=False)
        rec.save()
        return rec.data
    return load(name)


def results(data: dict, name: str | None = None, **params) -> list[dict]:
    """The results of a record, filtered by name and by exact parameter values."""
    out = []
    for r in data["results"]:
        if name is not None and r["name"] != name:
            continue
        if any(r["params"].get(k) != v for k, v in params.items()):
            continue
        out.append(r)
    return out


def median(result: dict) -> float:
    """A result's median (of its samples)."""
    return result["value"]["median"]


def value(data: dict, name: str, stat: str = "median", **params) -> float:
    """The single result matching ``name`` and ``params``; error if none or several."""
    found = results(data, name, **params)
    if len(found) != 1:
        raise RecordError(f"record {data['name']!r}: {len(found)} results match {name} {params}")
    return found[0]["value"][stat]


# A notebook's live cells run on the host that executes it, which need not be the machine of
# the records it reads (a site built from a captured machine's folder). The parts of a
# record's fingerprint that name the hardware, compared with this host's:
HOST_KEYS = ("cpu", "vendor", "family", "model", "cores")
CACHE_KEYS = ("L1d", "L2", "L3")
FAR = 0.15  # a live figure this far from the record's is said to be this run's


def _size(nbytes) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:g} KiB"


def host_differences(machine: dict, here: dict | None = None) -> list[str]:
    """What separates the machine a record names (its ``machine`` fingerprint, as the record
    stores it) from this host (``here``, :func:`machine_info.fingerprint` by default), one
    phrase each, the record's value first: the CPU's name, vendor, family, model number and
    cores; the ISA level and its extensions; each cache's size and ways. A field the record
    does not store is not compared. Empty where the two are one machine as far as the record
    can tell."""
    here = here or machine_info.fingerprint()
    out = [f"{k} {machine[k]} there, {here.get(k)} here" for k in HOST_KEYS
           if k in machine and machine[k] != here.get(k)]
    isa_r, isa_h = machine.get("isa") or {}, here.get("isa") or {}
    if isinstance(isa_r, dict) and isa_r.get("isa") and isa_r.get("isa") != isa_h.get("isa"):
        out.append(f"ISA {isa_r['isa']} there, {isa_h.get('isa')} here")
    if isinstance(isa_r, dict) and "extensions" in isa_r and (
            sorted(isa_r["extensions"]) != sorted(isa_h.get("extensions") or [])):
        out.append(f"extensions {'/'.join(isa_r['extensions']) or 'none'} there, "
                   f"{'/'.join(isa_h.get('extensions') or []) or 'none'} here")
    c_r, c_h = machine.get("caches") or {}, here.get("caches") or {}
    for lv in CACHE_KEYS:
        b, w = f"{lv}_bytes", f"{lv}_ways"
        if c_r.get(b) and c_r.get(b) != c_h.get(b):
            out.append(f"{lv} {_size(c_r[b])} there, "
                       f"{_size(c_h[b]) if c_h.get(b) else 'none'} here")
        elif c_r.get(w) and c_h.get(w) and c_r[w] != c_h[w]:
            out.append(f"{lv} {c_r[w]}-way there, {c_h[w]}-way here")
    return out


def host_check(name: str, folder: Path | None = None) -> tuple[bool, str]:
    """(same, what a notebook prints first): this host's CPU, cores, ISA and caches, and
    whether it is the machine of the record ``name`` the notebook reads (:func:`host_differences`).
    Where it is not, the text says so and that the live numbers the notebook prints are this
    host's, its tables and figures the records' machine's. A record not yet made is measured
    here, so the host is its machine."""
    here = machine_info.fingerprint()
    ext = here["isa"].get("extensions") or []
    caches = ", ".join(f"{lv} {_size(here['caches'][f'{lv}_bytes'])}" for lv in CACHE_KEYS
                       if here["caches"].get(f"{lv}_bytes"))
    line = (f"this host: {here['cpu']} | {here['cores']} cores | ISA {here['isa']['isa']}"
            f"{' + ' + '/'.join(ext) if ext else ''} | {caches}")
    if not exists(name, folder):
        return True, line
    diff = host_differences(load(name, folder)["machine"], here)
    if not diff:
        return True, line + "\nthe records read below name this host's CPU, cores, ISA and caches"
    return False, (line + "\nthis host is not the machine of the records read below ("
                   + "; ".join(diff) + "): the live numbers this notebook prints are this "
                   "host's, its tables and figures the records' machine's")


def live_label(same: bool) -> str:
    """How a notebook names a number it measures live: "now" on the records' machine, else
    "on this host" (which is not that machine: :func:`host_check`)."""
    return "now" if same else "now, on this host (not the records' machine)"


def live_note(live: float, recorded: float, same: bool, what: str = "the record's",
              unit: str = "") -> str:
    """A comment for a live figure beside the record's: nothing within :data:`FAR` of it,
    else how far off it is and why it may be: this run's, on a host busier now than when the
    record was made, or on another host than the records' machine."""
    if not (live > 0 and recorded > 0) or abs(live / recorded - 1) <= FAR:
        return ""
    side = "below" if live < recorded else "above"
    pct = abs(live / recorded - 1) * 100
    why = ((f"this run's figure, on a host {'busier' if live < recorded else 'quieter'} now, or at "
            f"another clock, than in the record's run") if same
           else "this host's figure, not the records' machine's")
    figure = f"{recorded:.3g}" + (f" {unit}" if unit else "")
    return f" ({pct:.0f} % {side} {what} {figure}: {why})"


# The GPU's records belong to no CPU: a captured machine's folder holds none, and the book
# rendered from it quotes the GPU records the book itself keeps, so that the home page,
# chapters 1 to 4 and the GPU roofline agree on every rendering.
BOOK_RECORDS = ROOT / "figures" / "records"
GPU_NAMES = ("ch1.gpu", "ch2.gpu", "ch3.gpu", "ch4.gpu")


def gpu_dir(rec_dir=None) -> Path:
    """The folder the GPU's records are read from: ``rec_dir`` (default: the records the book
    is rendered from) where it holds any GPU record or none at all (nothing measured yet),
    else, for a machine's records without a GPU's (a captured CPU's), the book's own
    ``figures/records``. The four records always come from one folder, so one GPU's run is
    never mixed with another's."""
    rec_dir = Path(rec_dir or records_dir())
    if any(exists(n, rec_dir) for n in GPU_NAMES):
        return rec_dir
    if not rec_dir.is_dir() or not any(rec_dir.glob("*.json")):
        return rec_dir
    return BOOK_RECORDS


def load_gpu(name: str, rec_dir=None) -> dict | None:
    """A GPU record (``ch1.gpu`` ... ``ch4.gpu``) from :func:`gpu_dir`, or None."""
    try:
        return load(name, gpu_dir(rec_dir))
    except RecordError:
        return None
