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
# # Chapter 4, the notebook: generating without the GPU
#
# This notebook checks the decoder live on a tiny model (the KV cache against recomputing
# everything, int8 against f32, sampling), then shows chapter 4's measurements: the decode
# ladder beside llama.cpp and PyTorch, the L3 study, and the quality of int8 on a model
# trained here. By default it reads this machine's records (`figures/records/ch4.*.json`,
# written by `smallem bench-generate`) and measures only if they are missing.
# `SMALLEM_QUICK=1` runs everything on tiny sizes in seconds (that is how the test suite
# runs it); `SMALLEM_REMEASURE=1` measures again in full.

# %%
import os
import tempfile
from pathlib import Path

import numpy as np
from IPython.display import SVG, Markdown, display

from smallem.generating import decode, gguf_export
from smallem.book import ch4, figures, records
from smallem.checks import assert_close
from smallem.training.model import GPT, Config
from smallem.generating.quant import Packed

QUICK = os.environ.get("SMALLEM_QUICK") == "1"
REMEASURE = os.environ.get("SMALLEM_REMEASURE") == "1"
# this host, and whether it is the machine of the records read below: the live checks run
# here, the tables and figures are the records'
SAME_HOST, _host = records.host_check(ch4.RECORD)
print(_host)

# %% [markdown]
# ## The cache changes nothing but the time
#
# A tiny model with both blocks: the logits of every position, decoded one token at a time
# against the KV cache, equal those of one forward pass over the whole sequence.

# %%
for block in ("gpt2", "modern"):
    tiny = Config("tiny", d_model=64, n_layer=2, n_head=4, context=48, block=block)
    model = GPT(tiny, "kernels", seed=1)
    model.flat += np.random.default_rng(0).normal(0, 0.05, model.flat.shape).astype(np.float32)
    toks = np.random.default_rng(1).integers(0, 256, 48).astype(np.int32)
    full = model.forward(toks[None]).copy()
    dec = decode.Decoder(model, "f32", threads=2)
    worst = np.abs(dec.prefill(toks[:10]) - full[9]).max()
    for i in range(10, 48):
        worst = max(worst, np.abs(dec.step(int(toks[i])) - full[i]).max())
    print(f"{block}: worst |cached - recomputed| over {48 - 9} positions: {worst:.1e}")
    assert worst < 1e-4

# %% [markdown]
# ## int8 weights, exactly what they stand for
#
# The int8 product against float64 arithmetic on the dequantised weights and activations:
# only rounding separates them. Against the f32 weights, the error is the quantisation's.

# %%
rng = np.random.default_rng(2)
w = rng.normal(0, 0.1, (100, 50)).astype(np.float32)
x = rng.normal(0, 1, (3, 100)).astype(np.float32)
pk = Packed(w, "int8")
y = decode.matmul(pk, x)
exact = decode.dequantize_rows(*decode.quantize_rows(x), 100) @ pk.dequantized()
assert_close(y, exact.astype(np.float32), k=100, name="int8 product")
print(f"int8 product vs float64 on the dequantised operands: "
      f"{np.abs(y - exact).max():.1e}; vs the f32 weights: {np.abs(y - x @ w).max():.1e}")

# %% [markdown]
# ## Sampling: seeded, and top-k = 1 is greedy

# %%
g = decode.Generator(model, dtype="int8", threads=2)
a1 = b"".join(g.generate(b"def ", 20, temperature=0.9, top_k=40, seed=3))
a2 = b"".join(g.generate(b"def ", 20, temperature=0.9, top_k=40, seed=3))
k1 = b"".join(g.generate(b"def ", 20, temperature=1.3, top_k=1, seed=4))
greedy = b"".join(g.generate(b"def ", 20, temperature=0))
print("same seed, same bytes:", a1 == a2, "| top-k 1 = greedy:", k1 == greedy)

# %% [markdown]
# ## The GGUF file reads back

# %%
import gguf

with tempfile.TemporaryDirectory() as tmp:
    path = gguf_export.export(model, Path(tmp) / "tiny.gguf", "q8_0")
    reader = gguf.GGUFReader(str(path))
    print(f"{path.name}: {len(reader.tensors)} tensors, architecture "
          f"{bytes(reader.fields['general.architecture'].parts[-1]).decode()}")

# %% [markdown]
# ## Measure, or read the records

# %%
have = records.exists(ch4.RECORD) and records.exists(ch4.RECORD_QUALITY)
if QUICK or REMEASURE or not have:
    ch4.bench_generate(quick=QUICK, progress=False)
rec = records.load(ch4.RECORD)
values = ch4.report(records.records_dir())
print(figures.machine_line(rec))

# %% [markdown]
# ## The ladder, with llama.cpp and PyTorch in the same rounds

# %%
display(Markdown((figures.tables_dir() / "ch4_ladder.md").read_text()))
display(Markdown((figures.tables_dir() / "ch4_targets.md").read_text()))
# a row above its bound says which assumption fails, as the chapter's page does
_share = values.get("ch4.llama_f32_share")
if _share is not None and _share > 1 + (values.get("ch4.noise_margin") or 0.05):
    print(f"llama.cpp's f32 decode ran at {figures.pct(_share)} of the f32 row's bound: above "
          "it, so either part of its weights stayed in a closer level between tokens, or its "
          "reads drew more from the memory than chapter 1's read-only stream, which the bound "
          "takes for the memory's limit (the records do not separate the two)")

# %% [markdown]
# ## Decode speed against model size

# %%
if (figures.figures_dir() / "ch4_l3.svg").exists():
    display(SVG(filename=str(figures.figures_dir() / "ch4_l3.svg")))
# typed values formatted as the page formats them: a factor as ×, a share as a percentage
_shown = {"ch4.big_int8_vs_f32": figures.times, "ch4.big_share": figures.pct}
for key in ("ch4.big_params", "ch4.big_int8_vs_f32", "ch4.big_share", "ch4.small_one_core",
            "ch4.small_all_cores"):
    _v = values.get(key)
    print(key, "=", "n/a" if _v is None else _shown[key](_v) if key in _shown
          else figures.fmt(_v) if isinstance(_v, float) else figures.plain(_v))

# %% [markdown]
# ## What int8 costs in quality

# %%
display(Markdown((figures.tables_dir() / "ch4_quality.md").read_text()))
print(figures.plain(f"validation: {values.get('ch4.bpb_f32')} (f32), {values.get('ch4.bpb_int8')} "
                    f"(int8), change {values.get('ch4.bpb_change')}"))
display(Markdown((figures.tables_dir() / "ch4_sample.md").read_text()))

# %% [markdown]
# ## The balance sheet

# %%
display(Markdown((figures.tables_dir() / "ch4_balance.md").read_text()))

# %% [markdown]
# ## The GPU beside it

# %%
# The GPU side (CUDA through CuPy): measured now if this machine has a GPU, else the last
# recorded GPU measurements with their machine and date, or a line saying there are none.
from smallem.book import gpu
_ = gpu.notebook_section("ch4")
