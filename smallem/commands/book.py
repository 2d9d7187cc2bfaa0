"""`smallem measure` and `smallem figures`: every chapter's measurement in book order, and
the figures, tables and values made from the records (:mod:`smallem.book`)."""

from __future__ import annotations

import subprocess
import sys
import time


def cmd_figures(args) -> int:
    from .. import book
    from ..book import figures

    values = book.report_all()
    print(f"wrote figures and tables to {figures.figures_dir()} ({len(values)} values)")
    return 0


def cmd_measure(args) -> int:
    """Each chapter's measurement in its own process, in book order: a chapter's threads
    and libraries (OpenMP, OpenBLAS, PyTorch) start fresh, as when run by hand."""
    from .. import book

    names = book.measure_commands()
    if args.list:
        print(" ".join(names))
        return 0
    took = []
    for name in names:
        print(f"== smallem {name}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "smallem", name])
        took.append((name, time.perf_counter() - t0))
        if rc:
            return rc
    # where a make book's minutes go, so a reader (and whoever trims it) can see
    print("measured in " + ", ".join(f"{n} {s / 60:.1f} min" for n, s in took)
          + f"; {sum(s for _, s in took) / 60:.1f} min in all", flush=True)
    return 0


def add_measure_arguments(p):
    p.add_argument("--list", action="store_true", help="print the commands, run nothing")
