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
# # Appendix B, the notebook: others' models
#
# This notebook shows the appendix's measurements: GGUF files at SmolLM2-135M's and
# Qwen2.5-0.5B's shapes, decoded and prompted by smallem's C forward beside llama.cpp on the
# same file. By default it reads this machine's record (`figures/records/others.decode.json`,
# written by `smallem bench-others`) and measures only if it is missing. `SMALLEM_QUICK=1`
# measures tiny models in seconds (that is how the test suite runs it); `SMALLEM_REMEASURE=1`
# measures again in full. Without llama.cpp (`make llama`) only our side is measured, and
# the K-quant file is not made.

# %%
import os
import tempfile
from pathlib import Path

import numpy as np
from IPython.display import Markdown, display

from smallem.generating import gguf_file, gguf_model, gguf_products
from smallem.generating.forward import Forward
from smallem.book import figures, others, records
from smallem.book.others import files

QUICK = os.environ.get("SMALLEM_QUICK") == "1"
REMEASURE = os.environ.get("SMALLEM_REMEASURE") == "1"
# this host, and whether it is the machine of the record read below: the live cells run
# here, the tables and figures are the record's
SAME_HOST, _host = records.host_check(others.RECORD)
print(_host)
print(f"int8 products {'here' if SAME_HOST else 'on this host'}:", gguf_products.instruction())

# %% [markdown]
# ## One file, read and checked
#
# A tiny file of the llama architecture, written here with random weights: what `smallem run
# --info` prints of it, then the C forward against the float64 oracle that rounds as it does.

# %%
tmp = Path(tempfile.mkdtemp())
path = files.write_random(tmp / "tiny.gguf", files.SHAPES["tiny-llama"])
mf = gguf_file.open_model(path)
print(mf.hyper)
ids = [1, 2, 3, 4, 5]
c = Forward.from_gguf(mf, threads=1).forward(ids)
ref = gguf_model.Reference(mf, np.float64, like_llama=True).forward(ids)
print("largest difference over the logits' largest:", np.abs(c - ref).max() / np.abs(ref).max())

# %% [markdown]
# ## Measure, or read the record

# %%
if QUICK or REMEASURE or not records.exists(others.RECORD):
    others.bench_others(quick=QUICK, progress=False).save()
rec = records.load(others.RECORD)
values = others.report(records.records_dir())
print(figures.machine_line(rec))

# %% [markdown]
# ## Bytes per weight, and the bound they set

# %%
display(Markdown((figures.tables_dir() / "others_types.md").read_text()))

# %% [markdown]
# ## Decode and prompt, beside llama.cpp

# %%
display(Markdown((figures.tables_dir() / "others_speed.md").read_text()))
for k in ("qwen25_q8_0", "qwen25_q4_k_m", "smollm2_q4_0"):
    print(k, "| decode:", figures.plain(values[f"others.{k}.tg_vs_llama"]), "| bound:",
          figures.plain(values[f"others.{k}.tg_vs_bound"]), "| prompt:",
          figures.plain(values[f"others.{k}.pp_vs_llama"]))

# %% [markdown]
# ## Reading ahead
#
# Each decode row prefetches the bytes one page further on. The same decoder at other
# distances (0: none), timed in the same rounds, and each file's rates: the arithmetic alone
# (a gate matrix's rows in L2), the memory alone (chapter 1's read-only stream), the step.

# %%
display(Markdown((figures.tables_dir() / "others_ahead.md").read_text()))
display(Markdown((figures.tables_dir() / "others_rates.md").read_text()))
print("the forward's distance:", values["others.ahead"], "| fastest in this run (the table says by how much):",
      figures.plain(values["others.ahead_best"] or "not measured"))
for k in ("qwen25_q8_0", "qwen25_q4_k_m", "smollm2_q4_0"):
    print(k, "| with the prefetch:",
          figures.plain(values[f"others.{k}.tg_prefetch"] or "not measured"))

# %% [markdown]
# ## Others' blocks in chapter 4's tiles
#
# A Q8_0, Q4_0 or Q5_0 matrix repacked once into chapter 4's tiles (the 4- and 5-bit types
# keep their nibbles) gives the same products as its rows (the same integers and scales,
# another order of float additions); the decoder streams the tiles. (Q4_K has tiles too, on
# its rows' activation; this cell checks the three above, and the tests check Q4_K's.) Both
# layouts, timed in the same rounds.

# %%
for qt in ("Q8_0", "Q4_0", "Q5_0"):
    mq = gguf_file.open_model(files.quantise(path, tmp / f"tiny-{qt}.gguf", qt, None))  # the gguf package's
    tq = next(t for t in mq.tensors.values() if t.type == qt and t.name.startswith("blk."))
    x = np.random.default_rng(5).normal(0, 1, (1, tq.ne[0])).astype(np.float32)
    on_rows, in_tiles = gguf_products.matmul(tq, x), gguf_products.matmul(tq, x, tiles=True)
    print(qt, "tiles against rows, largest difference over the largest output:",
          np.abs(in_tiles - on_rows).max() / np.abs(on_rows).max())
display(Markdown((figures.tables_dir() / "others_tiles.md").read_text()))
print(values["others.tiles_file"], "| tiles against rows:", figures.plain(values["others.tiles_vs_rows"]))
