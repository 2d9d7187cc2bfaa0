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
from .. import options

RECORDS = (RECORD,)

# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = options.bench_command("bench-distributed", bench_distributed,
                                 "appendix: time training on MPI ranks, write the record",
                                 threads=False)
MEASURE = "bench-distributed"  # the command `make book` runs
