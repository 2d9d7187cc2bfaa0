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
# # Appendix C, the notebook: across machines
#
# This notebook reads every captured machine's records (`tests/machines/<name>/records`,
# each a fresh clone's `make book` on that CPU) and sets them side by side, with the GPU's
# and the sentences that say which hardware difference moves each chapter's number. It
# measures nothing; to add this machine, run `make book` and then
# `smallem machine --save-to tests/machines/<name>`.

# %%
from IPython.display import Markdown, display

from smallem.book import figures, machines
from smallem.book.machines import reading

for d in reading.folders():
    print(f"{d.name}: {reading.cpu_name(d)}, records at {reading.commit_of(d / 'records')}")

# %% [markdown]
# ## Side by side

# %%
values = machines.report()
display(Markdown((figures.tables_dir() / "machines_across.md").read_text()))

# %% [markdown]
# ## What moves each number

# %%
for line in reading.summary_lines(values):
    print(line)

# %% [markdown]
# ## At a glance: this machine beside the reference series

# %%
display(Markdown((figures.tables_dir() / "machines_glance.md").read_text()))
