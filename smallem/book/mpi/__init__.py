"""The appendix, beyond one machine: data-parallel training on MPI, measured on this
machine's cores (ranks of one thread against one process with every thread), the loss
of local SGD against the gradients' all-reduce, and a model of N machines over a link.

The engine is the library's :mod:`smallem.training.distributed` (``smallem train --distributed``).
``measuring`` runs the benchmark into the record (each run a child under ``mpiexec``, with
``rank`` as what every rank runs), ``reading`` turns it into the page's tables, figure and
values, and this file holds what :mod:`smallem.book` asks of every chapter.
"""

from __future__ import annotations

from .measuring import RECORD, bench_distributed  # noqa: F401
from .reading import report  # noqa: F401  (what smallem.book asks of a chapter)

RECORDS = (RECORD,)


def add_bench_distributed_arguments(p):
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds (for tests)")


def cmd_bench_distributed(args) -> int:
    rec = bench_distributed(quick=args.quick or None)
    print(f"wrote {rec.save()}")
    return 0


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = {"bench-distributed": (cmd_bench_distributed, add_bench_distributed_arguments,
                                  "appendix: time training on MPI ranks, write the record")}
MEASURE = "bench-distributed"  # the command `make book` runs
