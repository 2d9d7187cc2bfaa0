"""The book: for each chapter, its measurement, the reading of its records into tables,
figures and values, and its command. The library (``smallem.product.gemm``, ``smallem.training.model``, ...)
never imports from here.

:data:`CHAPTERS` is the one list of the book's modules, in the book's order. Each module has

- ``RECORDS``: the names of the records it writes and reads (``figures/records/<name>.json``);
- ``COMMANDS``: ``{name: (function, add_arguments, help)}``, the ``smallem`` commands it adds;
- ``MEASURE``: the one of those that ``make book`` runs (``smallem measure``), or None;
- ``report(rec_dir) -> dict``: writes its tables and figures from the records and returns the
  values its page quotes as ``{{ key }}``.

``smallem <command>``, ``smallem measure`` (hence ``make book``) and ``smallem figures`` all
read this list; adding a chapter is one module and one line here.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

CHAPTERS = (
    "ch1",   # what a CPU is worth
    "ch2",   # the matrix product
    "gpu",   # chapters 1 and 2 on a GPU, measured where one is lent
    "ch3",   # training a GPT on the CPU
    "ch4",   # generating without the GPU
    "mpi",   # the appendix: beyond one machine, data-parallel training on MPI
    "others",  # appendix B: others' models (GGUF files) beside llama.cpp
    "machines",  # appendix C: every captured machine side by side (reads, never measures)
    "recurrent",  # appendix D: a block without attention, its state carried along the sequence
)


def modules() -> list:
    return [importlib.import_module(f"{__name__}.{name}") for name in CHAPTERS]


def commands() -> dict:
    """Every chapter's commands: {name: (function, add_arguments, help)}, in book order."""
    out: dict = {}
    for module in modules():
        for name, spec in module.COMMANDS.items():
            if name in out:
                raise RuntimeError(f"command {name!r} defined twice ({module.__name__})")
            out[name] = spec
    return out


def measure_commands() -> list[str]:
    """The commands ``smallem measure`` (``make book``) runs, in book order."""
    return [m.MEASURE for m in modules() if m.MEASURE]


def report_all(rec_dir: Path | None = None, only: list[str] | None = None) -> dict:
    """Every chapter's (or only those named) tables and figures from the records in
    ``rec_dir``; the values are also written to ``figures/tables/values.json``, where the
    site's hook (``chapters/hooks/values.py``) substitutes them for ``{{ key }}``."""
    from . import compare, figures, records

    rec_dir = Path(rec_dir or records.records_dir())
    values: dict = compare.method_values()  # the "How we measure" page's
    values["how.rounds_by_chapter"] = rounds_by_chapter()
    for name, module in zip(CHAPTERS, modules()):
        # whether this machine has the chapter's own record: a page whose values are missing
        # for that reason is left out in one sentence (chapters/hooks/values.py)
        values[f"book.recorded.{name}"] = records.exists(module.RECORDS[0], rec_dir)
        values[f"book.record.{name}"] = module.RECORDS[0]
        values[f"book.command.{name}"] = module.MEASURE
        if only and name not in only:
            continue
        values.update(module.report(rec_dir) or {})
    path = figures.tables_dir() / "values.json"
    old = json.loads(path.read_text()) if path.exists() and only else {}
    old.update(values)
    figures.write(path, json.dumps(old, indent=1, sort_keys=True) + "\n")
    write_records_manifest(rec_dir)
    return values


MANIFEST = "records.json"  # in figures/tables: the records the values were read from


def records_read(rec_dir: Path) -> dict[str, Path]:
    """``{name: path}`` of the records a rendering from ``rec_dir`` reads: every record in
    ``rec_dir``, and the GPU's from the folder the GPU reading takes them from (the book's
    own, for a captured machine's folder, which holds none)."""
    from .gpu.reading import GPU_NAMES, gpu_dir

    rec_dir = Path(rec_dir)
    out = {p.stem: p.resolve() for p in sorted(rec_dir.glob("*.json"))} if rec_dir.is_dir() else {}
    gdir = gpu_dir(rec_dir)
    for name in GPU_NAMES:
        if name not in out and (gdir / f"{name}.json").is_file():
            out[name] = (gdir / f"{name}.json").resolve()
    return out


def write_records_manifest(rec_dir: Path) -> Path:
    """``figures/tables/records.json``: the records this run of ``smallem figures`` read, which
    the site's hook (``chapters/hooks/records.py``) publishes as ``figures/records/`` in place
    of the repository's, so the site's raw records are those its pages were rendered from."""
    from . import figures

    path = figures.tables_dir() / MANIFEST
    return figures.write(path, json.dumps({"folder": str(Path(rec_dir).resolve()),
                                           "records": {k: str(v) for k, v in records_read(rec_dir).items()}},
                                          indent=1) + "\n")


# how "How we measure" names the chapters whose measurements run paired rounds
ROUNDS_NAMES = {"ch2": "chapter 2", "ch3": "chapter 3", "ch4": "chapter 4",
                "mpi": "the MPI appendix", "others": "appendix B", "recurrent": "appendix D"}


def rounds_by_chapter() -> str:
    """"15 rounds in chapter 2; 7 in chapter 3, chapter 4 and ...": each chapter's own number of
    paired rounds at most (its measuring module's MOST_ROUNDS where it has comparisons of more
    than one length, else its ROUNDS; chapter 2 takes compare.paired's)."""
    from . import compare

    by: dict[int, list[str]] = {}
    for name, label in ROUNDS_NAMES.items():
        m = importlib.import_module(f"{__name__}.{name}.measuring")
        most = getattr(m, "MOST_ROUNDS", getattr(m, "ROUNDS", compare.ROUNDS))  # its longest
        by.setdefault(int(most), []).append(label)
    parts = [f"{n}{' rounds' if i == 0 else ''} in {compare.listing(labels, '')}"
             for i, (n, labels) in enumerate(sorted(by.items(), reverse=True))]
    return "; ".join(parts)

