"""Chapter 3, training a GPT on the CPU: the training step timed on every path and rung of
its climb, a short training run per precision, and the reading of their records.

The model, its layers, the rungs' backends and the trainer are the library's
:mod:`smallem.training.model` and :mod:`smallem.training.train`. This package is the chapter's room in the
book: ``measuring`` runs the benchmark into the records, ``reading`` turns them into the
page's tables, figures and values (with ``predicted``, each rung's prediction, ``climb``, each
switch judged against it, ``fused``, the fused kernels against their bounds, and ``run``, the
training runs), and this file holds what :mod:`smallem.book` asks of every chapter, and the
command.
"""

from __future__ import annotations

from .measuring import (OP_GROUPS, RECORD_RUN, RECORD_STEP, RUNGS, bench_train,  # noqa: F401
                        measure_step, profile_step)
from .reading import report  # noqa: F401  (what smallem.book asks of a chapter)
from .. import options

RECORDS = (RECORD_STEP, RECORD_RUN)
# the peers its records compare against: record -> {peer: (result name, params)}
PEER_ROWS = {RECORD_STEP: {"PyTorch": ("step", {"backend": "torch"}),
                           "PyTorch with bf16 autocast": ("step", {"backend": "torch-bf16"})}}


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = options.bench_command("bench-train", bench_train,
                                 "chapter 3: time training steps, write records")
MEASURE = "bench-train"  # the command `make book` runs
