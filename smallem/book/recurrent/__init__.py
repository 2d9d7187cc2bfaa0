"""Appendix D, a block without attention: the recurrent block's scan (the library's
:mod:`smallem.training.scan` and ``kernels_c/layers/scan.c``), its training step and its
decode beside the attention model's of the same size, and what each learns in the same
time. ``measuring`` runs the benchmark into the record, ``reading`` turns it into the page's
tables and values, and this file holds what :mod:`smallem.book` asks of every chapter.
"""

from __future__ import annotations

from .measuring import RECORD, bench_recurrent  # noqa: F401
from .reading import report  # noqa: F401  (what smallem.book asks of a chapter)
from .. import options

RECORDS = (RECORD,)


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = options.bench_command("bench-recurrent", bench_recurrent,
                                 "appendix D: the recurrent block beside attention, write the record")
MEASURE = "bench-recurrent"  # the command `make book` runs
