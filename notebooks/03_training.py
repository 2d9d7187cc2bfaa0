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
# # Chapter 3, the notebook: a GPT that trains on the CPU
#
# This notebook checks the model's gradients live, then shows chapter 3's measurements: the
# speed of one training step of the xl model on three paths (the numpy reference, smallem's
# kernels, PyTorch), the climb of that step rung by rung, where its time goes before and
# after, the fused kernels and the long attention against what they replace, and short
# training runs of the s model on the Python standard library's source in f32 and in bf16.
# By default it reads this machine's records (`figures/records/ch3.*.json`, written by
# `smallem bench-train`) and measures only if they are missing. `SMALLEM_QUICK=1` runs
# everything on tiny sizes in seconds (that is how the test suite runs it);
# `SMALLEM_REMEASURE=1` measures again in full.

# %%
import os

import numpy as np
from IPython.display import SVG, Markdown, display

from smallem.training import train
from smallem.book import ch3, figures, records
from smallem.checks import assert_close
from smallem.training.model import GPT, Config

QUICK = os.environ.get("SMALLEM_QUICK") == "1"
REMEASURE = os.environ.get("SMALLEM_REMEASURE") == "1"
# this host, and whether it is the machine of the records read below: the live checks run
# here, the tables and figures are the records'
SAME_HOST, _host = records.host_check(ch3.RECORD_STEP)
print(_host)

# %% [markdown]
# ## The four sizes
#
# Parameter counts and training FLOPs per token are computed from each config's shapes
# (`Config.n_params`, `Config.flops_per_token`): six FLOPs per token for every parameter
# that enters a matrix product, plus the attention scores and their weighted sum.

# %%
print(train.list_configs())

# %% [markdown]
# ## Are the gradients right?
#
# Three independent checks on a tiny model, run now. First the numpy reference, in float64,
# against central finite differences of its own loss at a few hundred parameters picked at
# random. Then the kernel path (chapter 2's GEMM and `kernels_c/layers.c`, in float32)
# against the numpy reference on the same weights. Then, if PyTorch is installed, the same
# weights loaded into a PyTorch model whose backward pass is autograd's.

# %%
tiny = Config("tiny", d_model=16, n_layer=2, n_head=4, context=12)
rng = np.random.default_rng(0)
ref = GPT(tiny, "numpy", dtype=np.float64, seed=1)
ref.flat += rng.normal(0, 0.05, ref.flat.shape)
idx, tgt = rng.integers(0, 256, (2, 12)), rng.integers(0, 256, (2, 12))
loss = ref.forward(idx, tgt)
ref.backward()
picked = rng.choice(ref.flat.size, 200, replace=False)
numeric = []
for i in picked:
    old = ref.flat[i]
    ref.flat[i] = old + 1e-6
    hi = ref.forward(idx, tgt)
    ref.flat[i] = old - 1e-6
    lo = ref.forward(idx, tgt)
    ref.flat[i] = old
    numeric.append((hi - lo) / 2e-6)
err = np.abs(np.array(numeric) - ref.grad_flat[picked]).max()
print(f"loss {loss:.4f} nats; worst |analytic - finite difference| over 200 parameters: {err:.1e}")

ker = GPT(tiny, "kernels")
ker.flat[...] = ref.flat
kl = ker.forward(idx, tgt)
ker.backward()
print(f"kernels (float32) loss {kl:.6f} vs numpy (float64) {loss:.6f}")
assert_close(ker.grad_flat, ref.grad_flat.astype(np.float32), rtol=1e-4,
             atol=2e-5 * np.abs(ref.grad_flat).max(), name="kernel gradients")
print("kernel gradients match the reference, every one of", ker.grad_flat.size)
try:
    from smallem.training import torch_gpt
    tl, tg = torch_gpt.loss_and_grads(ref.params, tiny, idx, tgt)
    worst = max(np.abs(ref.grads[k] - tg[k]).max() for k in tg)
    print(f"PyTorch loss {tl:.10f}; worst gradient difference from numpy: {worst:.1e}")
except ImportError:
    print("PyTorch is not installed on this host: that check is skipped (chapter 3's PyTorch "
          "step, in the tables below, is the records')")

# %% [markdown]
# ## Measure, or read the records

# %%
have = records.exists(ch3.RECORD_STEP) and records.exists(ch3.RECORD_RUN)
if QUICK or REMEASURE or not have:
    ch3.bench_train(quick=QUICK, progress=False)
step_rec = records.load(ch3.RECORD_STEP)
run_rec = records.load(ch3.RECORD_RUN)
values = ch3.report(records.records_dir())
print(figures.machine_line(step_rec))

# %% [markdown]
# ## One training step, three ways
#
# Tokens per second of one full step: forward, backward, gradient clipping and AdamW. MFU is
# the model's FLOPs per second over chapter 1's measured f32 peak on the same cores.

# %%
display(Markdown((figures.tables_dir() / "ch3_step.md").read_text()))
for key in ("ch3.kernels_vs_torch", "ch3.kernels_vs_numpy", "ch3.kernels_mfu"):
    print(key, "=", figures.plain(values.get(key, "n/a")))
# the modern step at the batch its target is judged at (the home page quotes it)
print(figures.plain(f"modern step with Muon: {values.get('ch3.modern_accumulated_toks', 'n/a')} "
                    f"at {values.get('ch3.accumulated_tokens', 'n/a')} tokens an optimiser step"))

# %% [markdown]
# ## The climb, rung by rung
#
# Each rung is the step of the rung before with one more switch on; rungs 1 and up are
# timed in turn, round after round, so that the host's drift falls on all of them alike.

# %%
display(Markdown((figures.tables_dir() / "ch3_rungs.md").read_text()))
display(SVG(filename=str(figures.figures_dir() / "ch3_climb.svg")))
for key in ("ch3.target_f32_mfu", "ch3.target_f32_torch", "ch3.target_bf16",
            "ch3.target_bf16_torch"):
    print(key, "=", figures.plain(values.get(key, "n/a")))
# the modern step at the batch its target is judged at (the home page quotes it)
print(figures.plain(f"modern step with Muon: {values.get('ch3.modern_accumulated_toks', 'n/a')} "
                    f"at {values.get('ch3.accumulated_tokens', 'n/a')} tokens an optimiser step"))

# %% [markdown]
# ## Threads that wait: a fork-join on each runtime

# %%
display(Markdown((figures.tables_dir() / "ch3_fork_join.md").read_text()))
print(figures.plain(f"one thread more than cores, spinning forever: "
                    f"{values.get('ch3.fj_over_forever')} | bounded spin: "
                    f"{values.get('ch3.fj_over_pool')}"))

# %% [markdown]
# ## Where the step spends its time, before and after

# %%
if (figures.tables_dir() / "ch3_ops.md").exists():
    display(Markdown((figures.tables_dir() / "ch3_ops.md").read_text()))

# %% [markdown]
# ## The fused kernels, and a long sequence's attention

# %%
display(Markdown((figures.tables_dir() / "ch3_fused.md").read_text()))
# a kernel faster than its bound beats an assumption of the bound, which chapter 3 names:
# the level its bytes were taken to come from
if values.get("ch3.fused_any_above"):
    why = (f"; chapter 1's {values['ch3.fused_above_inner']} plateau was last measured at "
           f"{values['ch3.fused_inner_last_mib']:.0f} MiB, so much of them stayed in the "
           f"{values['ch3.fused_above_inner']}" if values.get("ch3.fused_above_inner") else "")
    print(f"{values['ch3.fused_above']} ran at up to {values['ch3.fused_above_of']:.2f}x its "
          f"bound's rate: the bound took its {values['ch3.fused_above_mib']:.0f} MiB to come "
          f"from {values['ch3.fused_above_level']}{why}")
print(figures.plain(f"T = {values['ch3.long_T']}: tiles {values['ch3.long_tiles_ms']} against "
                    f"matrices {values['ch3.long_matrices_ms']} ({values['ch3.long_tiles_vs']}); "
                    f"memory beyond q, k, v, o: {values['ch3.long_extra_tiles']} against "
                    f"{values['ch3.long_extra_matrices']}"))

# %% [markdown]
# ## The loss curves
#
# The s model trained on the standard library's source in each precision for the same time
# budget (each run's step count is set from that budget before it starts). The loss is in
# bits per byte: the cross-entropy in nats divided by ln 2, and one token is one byte.

# %%
display(SVG(filename=str(figures.figures_dir() / "ch3_loss.svg")))
s = run_rec["settings"]
for name, run in s["runs"].items():
    final = records.value(run_rec, "final_val_bpb", run=name)
    print(f"{name}: {run['total_steps']} steps of {run['batch_size']} x {run['seq_len']} tokens "
          f"in {run['curve']['seconds'][-1]:.1f} s of training (evaluations not counted): "
          f"held-out loss "
          f"{final:.2f} bits per byte ({'below' if final < 2.5 else 'not yet below'} 2.5)")
print("corpus:", s["corpus"]["name"], s["corpus"]["files"], "files, sha256",
      s["corpus"]["sha256"][:16])

# %% [markdown]
# ## What the model writes
#
# Sampled at temperature 0.8 after the prompt `def `, one byte at a time.

# %%
print(run_rec["settings"]["runs"]["f32"]["sample"])

# %% [markdown]
# ## The GPU beside it

# %%
# The GPU side (CUDA through CuPy): measured now if this machine has a GPU, else the last
# recorded GPU measurements with their machine and date, or a line saying there are none.
from smallem.book import gpu
_ = gpu.notebook_section("ch3")
