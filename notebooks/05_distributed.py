# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The appendix, the notebook: beyond one machine
#
# This notebook shows the appendix's measurements: one training step as one process with a
# thread per core against one rank per core under `mpiexec`, what the ranks send, local SGD's
# loss against the all-reduce's, and the model of many machines. By default it reads this
# machine's record (`figures/records/mpi.train.json`, written by `smallem bench-distributed`)
# and measures only if it is missing. `SMALLEM_QUICK=1` measures a tiny model in seconds (that
# is how the test suite runs it); `SMALLEM_REMEASURE=1` measures again in full. Without MPI
# (`pip install -e '.[mpi]'`) it says so and shows nothing measured.

# %%
import os

from IPython.display import SVG, Markdown, display

from smallem.training import distributed
from smallem.book import figures, mpi, records

QUICK = os.environ.get("SMALLEM_QUICK") == "1"
REMEASURE = os.environ.get("SMALLEM_REMEASURE") == "1"
# this host, and whether it is the machine of the record read below: the live cells run
# here, the tables and figures are the record's
SAME_HOST, _host = records.host_check(mpi.RECORD)
print(_host)
print("mpiexec:", "found" if distributed.mpiexec() else "not found (pip install -e '.[mpi]')")

# %% [markdown]
# ## Which rows each rank trains on
#
# A global batch of 16 sequences over 1, 2 and 4 ranks: each rank its own slice, the same
# rows whatever the number of ranks, so a run resumed on another N sees the same data.

# %%
for n in (1, 2, 4):
    print(f"{n} rank{'s' if n > 1 else ''}:", [f"{s.start}-{s.stop - 1}" for s in (distributed.rows(16, n, r)
                                                          for r in range(n))])

# %% [markdown]
# ## Measure, or read the record

# %%
if QUICK or REMEASURE or not records.exists(mpi.RECORD):
    mpi.bench_distributed(quick=QUICK, progress=False).save()
rec = records.load(mpi.RECORD)
values = mpi.report(records.records_dir())
print(figures.machine_line(rec))

# %% [markdown]
# ## One process against one rank per core

# %%
display(Markdown((figures.tables_dir() / "mpi_throughput.md").read_text()))
print(figures.plain(f"ranks against one process: {values['mpi.ratio']} ({values['mpi.rounds']} "
                    f"rounds ahead); {values['mpi.mb_per_step']} each per step, "
                    f"{values['mpi.comm_ms']} in collectives ({values['mpi.comm_share']} of the step)"))

# %% [markdown]
# ## Local SGD against the all-reduce

# %%
display(SVG(filename=str(figures.figures_dir() / "mpi_loss.svg")))
print(figures.plain(f"after {values['mpi.curve_tokens']} tokens: all-reduce {values['mpi.bpb_k1']}, "
                    f"every {values['mpi.k_mid']} {values['mpi.bpb_k10']}, "
                    f"every {values['mpi.k_top']} {values['mpi.bpb_k100']} bits per byte"))

# %% [markdown]
# ## Many machines, on paper (a model, not a measurement)

# %%
display(Markdown((figures.tables_dir() / "mpi_model.md").read_text()))
