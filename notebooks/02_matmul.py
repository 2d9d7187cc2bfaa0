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
# # Chapter 2, the notebook: the matrix product, from loop order to the peak
#
# This notebook regenerates chapter 2's tables and figures on the machine it runs on.
# By default it reads this machine's record (`figures/records/ch2.gemm.json`, written by
# `smallem gemm`) and measures only if there is none. Set `SMALLEM_QUICK=1` for a
# seconds-long run on tiny sizes (that is how the test suite runs it), or `SMALLEM_REMEASURE=1`
# to measure again in full (a few minutes on two cores).

# %%
import os

import numpy as np
from IPython.display import SVG, Markdown, display

from smallem import checks
from smallem.product import gemm
from smallem.cpu import isa, machine_info
from smallem.book import ch2, compare, figures, records
from smallem.cpu.timing import measure

QUICK = os.environ.get("SMALLEM_QUICK") == "1"

# this host, and whether it is the machine of the record read below: the model's shapes and
# blocks and the live timings are this host's, the tables and figures the record's
SAME_HOST, _host = records.host_check(ch2.RECORD)
print(_host)

# %% [markdown]
# ## The micro-kernel's shape and the block sizes, from the model
#
# Nothing below is tuned for this machine. The micro-kernel's tile (MR rows by NR columns)
# follows from the register file; the three block sizes follow from the caches' size,
# associativity and line size (Low et al., 2016). The chapter explains each formula. The
# model runs here on this host's caches and bandwidth; the record's own choices are printed
# beside its tables below.

# %%
print("the model on this host" + ("" if SAME_HOST else
      " (not the records' machine: chapter 2's tile, blocks and order are the record's, below)"))
level = isa.selected()
vec, regs = gemm.REGISTER_FILE[level]
mr, nr = gemm.micro_shape(vec, regs)
print(f"{level}: {regs} vector registers of {vec} floats -> micro-kernel {mr} x {nr} "
      f"({mr * nr // vec} accumulators; the compiled kernel is {gemm.kernel_shape()})")
geometry = gemm.cache_geometry()
for name, c in geometry.items():
    print(f"  {name}: {c['bytes'] // 1024} KiB, {c['ways']}-way, {c['line']}-byte lines")
blocks, final = gemm.ladder_blocks(), gemm.order_blocks("rows")
order, why = gemm.loop_order(mr, nr, gemm.feeds(), threads=machine_info.usable_cores())
print("blocks of rungs 2-4:", blocks, " of rung 5:", final)
print(f"matmul's order here: {gemm.default_order()} (the model: {order}; rung 5's order needs "
      f"{why['need_gbs']:.1f} GB/s a core from L3, which gives {why['have_gbs']:.1f})")
kc, kc5 = blocks["kc"], final["kc"]
l1 = geometry["L1d"]
print(f"  L1, rungs 2-4: B sliver {kc}x{nr} = {kc * nr * 4 / 1024:.1f} KiB, "
      f"{gemm.l1_ways_for_b(l1['ways'])} of {l1['ways']} ways; A's sliver streams through")
print(f"  L1, rung 5 (tiles along C's rows): A sliver {mr}x{kc5} = {mr * kc5 * 4 / 1024:.1f} KiB, "
      f"{gemm.l1_ways_for_a(l1['ways'])} of {l1['ways']} ways; B's slivers stream through")
print(f"  L2: A block {blocks['mc']}x{kc} = {blocks['mc'] * kc * 4 / 1024:.0f} KiB (rungs 2-4)")

# %% [markdown]
# ## Correct first
#
# Every rung computes the same product; here on an awkward shape (primes, not multiples of
# the tile) against numpy in double precision.

# %%
rng = np.random.default_rng(0)
M, N, K = 67, 53, 101
a = rng.standard_normal((M, K), dtype=np.float32)
b = rng.standard_normal((K, N), dtype=np.float32)
want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
for rung in gemm.LADDER:
    checks.assert_close(rung(a, b), want, k=K, name=rung.label)
checks.assert_close(gemm.matmul(b, a, trans_a=True, trans_b=True), want.T.copy(), k=K)
print("all rungs and the transposed product agree with numpy")

# %% [markdown]
# ## Loop order, live
#
# The first rung's whole gain comes from the order of three loops. A quick measurement on a
# product small enough to take a moment:

# %%
n = 64 if QUICK else 256
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
for rung in gemm.LADDER[:2]:
    t = measure(lambda: rung(a, b), repeats=3)
    print(f"{rung.label:24s} {2 * n**3 / t.median / 1e9:7.2f} Gop/s at {n}^3, "
          f"{records.live_label(SAME_HOST)}")

# %% [markdown]
# ## Measure, or read the record

# %%
data = records.load_or_measure(ch2.RECORD, ch2.run)
print(figures.machine_line(data))
_s = data["settings"]
if "mr" in _s:  # the record's own model, which chapter 2's tables ran: tile, blocks, order
    print(f"the record's model: micro-kernel {_s['mr']} x {_s['nr']}; blocks of rungs 2-4 "
          f"{_s.get('blocks_ladder')}, of rung 5 {_s.get('blocks_rows')}; order "
          f"{_s.get('order')}" + (f" (rung 5's order needs {_s['order_why']['need_gbs']:.1f} GB/s "
                                  f"a core from L3, which gives {_s['order_why']['have_gbs']:.1f})"
                                  if _s.get("order_why") else ""))
values = ch2.report(records.records_dir())
print(figures.plain(f"final rung: {values['ch2.final_gops']} = {values['ch2.final_pct_peak']} of "
                    f"the peak, {values['ch2.final_vs_numpy']} of numpy"))
if values.get("ch2.numpy_runs_differ"):  # the chapter's caveat: numpy's two runs disagree
    print(figures.plain(f"numpy ran at {figures.fmt(values['ch2.ladder_numpy_gops'], 'Gop/s')} in the "
                        f"ladder's rounds and {figures.fmt(values['ch2.sweep_numpy_gops'], 'Gop/s')} in "
                        f"the size sweep's, at the same size: the ratio above rests on the first"))
if values.get("ch2.any_above_model"):  # a bound beaten: which assumption failed (chapter 2)
    print(f"{values['ch2.above_model']} ran above its model by more than the noise: the model "
          f"charges each rung's data to one level of the staircase, and part of it sat in a "
          f"closer one")

# %% [markdown]
# ## The ladder

# %%
tables = figures.figures_dir() / "tables"
display(Markdown((tables / "ch2_ladder.md").read_text()))
display(SVG(filename=str(figures.figures_dir() / "ch2_ladder.svg")))

# %% [markdown]
# ## On the roofline
#
# Every rung does the same work on the same data; what differs is where each reuse of a
# number is served from. So each rung sits at its own intensity, counted against the level
# that feeds its innermost loop, under one core's roof (dashed) or all cores' (rung 5).

# %%
display(SVG(filename=str(figures.figures_dir() / "ch2_roofline.svg")))

# %% [markdown]
# ## Where the cores contend
#
# The micro-kernel alone, its B slivers in L2 or in L3, on one core and on all, each case
# timed in turn with the FMA probe.

# %%
display(Markdown((tables / "ch2_alone.md").read_text()))
print(figures.plain(
    f"on one core, B in L3 instead of L2: {values['ch2.alone_l3_one']}; on all cores, one "
    f"shared block: {values['ch2.alone_l3_shared']}, a block per thread: "
    f"{values['ch2.alone_l3_own']}; the tiles inside the model's products: "
    f"{values['ch2.tiles_range']}"))

# %% [markdown]
# ## Sizes, the model's shapes, bf16

# %%
display(SVG(filename=str(figures.figures_dir() / "ch2_sweep.svg")))
for name in ("ch2_sweep", "ch2_shapes", "ch2_phases", "ch2_bf16"):
    display(Markdown((tables / f"{name}.md").read_text()))
# The FMA probe ran between the samples of one size: what the cores gave at that moment.
print(figures.plain(f"at {values['ch2.beside_n']} the probe gave {values['ch2.beside_peak']}; "
                    f"the product reached {values['ch2.beside_pct']} of it, numpy "
                    f"{values['ch2.beside_numpy_pct']}"))

# %% [markdown]
# ## The thread pool
#
# OpenMP keeps its threads between parallel regions: the same kernel thread ids come back
# on every call, and an empty parallel region costs far less than creating threads.

# %%
print(f"the team's thread ids, {records.live_label(SAME_HOST)}:", gemm.pool_ids(), gemm.pool_ids())
print(figures.plain(f"the record's: empty parallel region {values['ch2.pool_region_us']}, "
                    f"create + join {values['ch2.pool_spawn_us']}; the team's thread ids: "
                    f"{values['ch2.pool_same']} on every call"))

# %%
# The GPU side (CUDA through CuPy): measured now if this machine has a GPU, else the last
# recorded GPU measurements with their machine and date, or a line saying there are none.
from smallem.book import gpu
_ = gpu.notebook_section("ch2")
