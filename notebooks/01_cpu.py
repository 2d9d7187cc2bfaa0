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
# # Chapter 1, the notebook: what this CPU is worth
#
# This notebook regenerates chapter 1's table and figures on the machine it runs on.
# By default it reads this machine's record (`figures/records/ch1.machine.json`, written by
# `smallem machine`) and measures only if there is none. Set `SMALLEM_QUICK=1` for a
# seconds-long run on tiny sizes (that is how the test suite runs it), or `SMALLEM_REMEASURE=1`
# to measure again in full (about half a minute).

# %%
from IPython.display import SVG, Markdown, display

from smallem.cpu import machine
from smallem.book import ch1, figures, records

# this host, and whether it is the machine of the record read below: the live cells measure
# this host, the tables and figures come from the record
SAME_HOST, _host = records.host_check(ch1.RECORD)
print(_host)

# %% [markdown]
# ## Measure, or read the record
#
# The record keeps every sample's median, minimum and maximum, the machine's fingerprint,
# the compiler flags and the commit. Everything below is computed from it.

# %%
data = records.load_or_measure(ch1.RECORD, ch1.run)
print(figures.machine_line(data))

# %% [markdown]
# ## The theoretical peak, every factor measured
#
# cores x f32 lanes a cycle x 2 x clock. The clock is the larger of the two chains' (each is
# a lower bound: a dependent chain runs no faster than its latency allows). The lanes are the
# f32 operations a cycle the FMA probe reached (the better of one thread and all cores over
# the cores), halved and rounded to a power of two on a log scale: so many FMAs of the
# kernels' width a cycle. The table of core facts from the vendors' manuals (FMA pipes, L1
# loads, cache inclusivity, each row with its citation) is found by vendor and ISA features;
# looked up by the CPU's model number alone (which a hypervisor may mask) it is the
# cross-check. The reading computes all of this again from the record's clocks and probes
# (`ch1.theory`, `ch1.hw_values`), so an older record gets today's theory.

# %%
theory = ch1.theory(data)
print("theoretical f32 peak:", theory["source"])
print(f"  {theory['flops_per_cycle_per_core']} operations a cycle x {theory['clock_ghz']:.2f} GHz"
      f" (chain of {dict(add='adds', mul='multiplies')[theory['clock_chain']]})"
      f" x {theory['cores']} cores = "
      f"{theory['gops_all']:.0f} Gop/s")
_, values = ch1.table_rows(data)
print("the table of vendors' manuals for this model number:", values["ch1.fma_table"])
print(values["ch1.fma_table_check"])
hw = ch1.hw_values(data, theory)
print(f"measured: {figures.plural(hw['ch1.hw.fmas_per_cycle'], 'FMA')} of "
      f"{hw['ch1.hw.vector_bits']} bits a cycle;",
      "table by ISA features:", hw["ch1.hw.core"] or "no row",
      {k.split(".")[-1]: v for k, v in hw.items()
       if k.split(".")[-1] in ("pipes", "pipe_bits", "loads_per_cycle", "load_bits",
                               "l2_inclusive", "l3_inclusive", "cite")})

# %% [markdown]
# ## The table
#
# Peaks in Gop/s (a multiply and an add count as two operations), bandwidths in GB/s as
# STREAM counts them. "Emulated" means the instruction is missing on this CPU and the probe
# runs the fallback that the AVX2 or plain-C path would use.

# %%
display(Markdown(ch1.table_markdown(data)))
summary = ch1.summary(data)
print(f"f32: measured / theoretical = {summary['f32_fraction_of_theory']:.1%}")
print(f"DRAM triad on one core, in bytes moved / numpy's one-thread copy = "
      f"{summary['dram_moved_vs_numpy']:.1%}")
print(f"naive product (one core): {summary['naive_below_core']:.0f} times below one core's measured f32 "
      f"peak, {summary['naive_below_peak']:.0f} times below all cores'")

# %% [markdown]
# ## The clock, live
#
# One more measurement of the clock, now, both ways: 64 dependent adds of a register per
# loop iteration (one cycle each), and 64 dependent multiplies (three cycles each). Under
# load or on battery the clock moves; that is why the peak is computed from the clock
# measured in the same run (the larger of the two chains'), not from the box's label. A
# live clock far from the record's is this run's: a busy host, or another host than the
# record's machine (the first cell says which).

# %%
for chain in ("add", "mul"):
    clock = machine.measure_clock(repeats=3, chain=chain)
    print(f"clock {records.live_label(SAME_HOST)}, chain of {chain}s: {clock['median'] / 1e9:.2f} GHz "
          f"(min {clock['min'] / 1e9:.2f}, max {clock['max'] / 1e9:.2f})"
          + records.live_note(clock["median"] / 1e9, theory["clock_ghz"], SAME_HOST,
                              "the record's clock", "GHz"))

# %% [markdown]
# ## The staircase and the roofline

# %%
ch1.staircase_figure(data)
display(SVG(filename=str(figures.figures_dir() / "ch1_staircase.svg")))

# %% [markdown]
# ## The read-only stream
#
# A sum of one array, with no stores: a decoder's traffic (chapter 4 takes its bounds from
# it). Live, on one thread, from a working set past the record's L3 plateau, beside the
# triad at the same size and the record's DRAM plateau on one thread; then its plateaus
# from the record, beside the triad's.

# %%
# four times the larger of the L3's plateau and its reported size: past both, as chapter 1's
# staircase reaches for DRAM (a set only twice the L3 can still come partly from it)
_last = summary["triad_spans"][1]["L3"]["last"]
_l3 = (summary.get("caches") or {}).get("L3_bytes") or 0
_ws = (int(min(4 * max(_last, _l3), machine.GiB)) if _last == _last
       else max(256 * machine.MiB, int(min(4 * _l3, machine.GiB))))
_s = machine.Stream(_ws, 1)
_plateaus = {"read": summary.get("read_plateaus", {}), "triad": summary["triad_plateaus"]}
for _k in ("read", "triad"):
    _r = machine.measure_stream_point(_s, _k, _ws, 1, repeats=3)
    _rec = _plateaus[_k].get(1, {}).get("DRAM", float("nan"))
    print(f"{_k:5s} {_ws // machine.MiB} MiB, one thread, {records.live_label(SAME_HOST)}: "
          f"{_r['value']['median']:.1f} GB/s"
          + records.live_note(_r["value"]["median"], _rec, SAME_HOST,
                              "the record's DRAM plateau on one thread,", "GB/s"))
del _s
if "read_plateaus" in summary:
    for _th in sorted(summary["read_plateaus"]):
        print(f"{_th} thread(s): " + ", ".join(
            f"{lv} read {summary['read_plateaus'][_th][lv]:.1f} / triad "
            f"{summary['triad_plateaus'][_th][lv]:.1f} GB/s" for lv in ch1.LEVELS))
else:
    print("this record predates the read-only stream: measure chapter 1 again to see its plateaus")

# %%
n = data["settings"]["gemm_naive_n"]
ch1.roofline_figure([(f"naive {n}³ product", ch1.naive_gemm_intensity(n),
                          records.value(data, "gemm_naive"))], "ch1_roofline",
                    {**ch1.summary(data), "record": data})
display(SVG(filename=str(figures.figures_dir() / "ch1_roofline.svg")))

# %%
# The GPU side (CUDA through CuPy): measured now if this machine has a GPU, else the last
# recorded GPU measurements with their machine and date, or a line saying there are none.
from smallem.book import gpu
_ = gpu.notebook_section("ch1")
