"""`smallem measure` and `smallem figures`: every chapter's measurement in book order, and
the figures, tables and values made from the records (:mod:`smallem.book`)."""

from __future__ import annotations

import subprocess
import sys


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
    for name in names:
        print(f"== smallem {name}", flush=True)
        rc = subprocess.call([sys.executable, "-m", "smallem", name])
        if rc:
            return rc
    return 0


def add_measure_arguments(p):
    p.add_argument("--list", action="store_true", help="print the commands, run nothing")
