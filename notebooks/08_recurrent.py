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
# # Appendix D, the notebook: a block without attention
#
# The recurrent block's scan, three ways, against its float64 definition; a tiny recurrent
# model trained and decoded with a state that does not grow; then the appendix's
# measurements. By default it reads this machine's record (`figures/records/recurrent.scan.json`,
# written by `smallem bench-recurrent`) and measures only if it is missing. `SMALLEM_QUICK=1`
# measures tiny sizes in seconds (that is how the test suite runs it); `SMALLEM_REMEASURE=1`
# measures again in full.

# %%
import os

import numpy as np
from IPython.display import Markdown, display

from smallem.book import figures, records, recurrent
from smallem.checks import assert_close
from smallem.generating import decode
from smallem.training import layers, scan
from smallem.training.model import GPT, Config

QUICK = os.environ.get("SMALLEM_QUICK") == "1"
REMEASURE = os.environ.get("SMALLEM_REMEASURE") == "1"
# this host, and whether it is the machine of the record read below: the live cells run
# here, the tables and figures are the record's
SAME_HOST, _host = records.host_check(recurrent.RECORD)
print(_host)

# %% [markdown]
# ## The scan, three ways, against the definition
#
# A length that leaves a short last chunk, each rung's forward and backward against the
# float64 recurrence.

# %%
rng = np.random.default_rng(0)
BH, T, hd, chunk = 3, 37, 16, 8
q, k, v, dout = (rng.normal(0, 0.5, (BH, T, hd)).astype(np.float32) for _ in range(4))
lam = np.log(rng.uniform(0.5, 1.0, (BH, T))).astype(np.float32)
want_o, _ = scan.reference_forward(q, k, v, lam)
want_grads = scan.reference_backward(q, k, v, lam, dout)
for rung in layers.SCAN_RUNGS:
    o = np.zeros((BH, T, hd), np.float32)
    states = np.zeros((BH, -(-T // chunk) + 1, hd, hd), np.float32)
    layers.scan_forward(q, k, v, lam, o, states, chunk, rung)
    grads = [np.zeros_like(x) for x in (q, k, v, lam)]
    layers.scan_backward(q, k, v, lam, states, dout, *grads, chunk=chunk, rung=rung)
    assert_close(o, want_o.astype(np.float32), k=T * hd, name=f"{rung} forward")
    for g, w, name in zip(grads, want_grads, ("dq", "dk", "dv", "dlam")):
        assert_close(g, w.astype(np.float32), rtol=1e-4, atol=1e-4 * np.abs(w).max(), name=name)
    print(f"{rung}: forward and backward agree with float64; largest |o - o64| "
          f"{np.abs(o - want_o).max():.1e}")
print("the chunk this host's caches give hd = 64:", layers.scan_chunk(64),
      "" if SAME_HOST else "(this host is not the records' machine)")

# %% [markdown]
# ## A tiny recurrent model: trained a step, decoded with a constant state

# %%
cfg = Config("tiny-recurrent", d_model=64, n_layer=2, n_head=4, context=96, block="recurrent")
model = GPT(cfg, "fused", threads=2, seed=1)
ids = rng.integers(0, 256, (2, 96))
print("loss:", round(float(model.forward(ids, ids)), 3))
dec = decode.Decoder(model, "f32", 2)
logits = dec.prefill(ids[0, :80])
ref = model.forward(ids[:1, :80])[-1]
print("C decoder against the training model:", np.abs(logits - ref).max() / np.abs(ref).max(),
      "| state per layer and head:", dec.k.shape[2:], "at position", dec.pos)

# %% [markdown]
# ## Measure, or read the record

# %%
if QUICK or REMEASURE or not records.exists(recurrent.RECORD):
    recurrent.bench_recurrent(quick=QUICK, progress=False).save()
rec = records.load(recurrent.RECORD)
values = recurrent.report(records.records_dir())
print(figures.machine_line(rec), "| measured:", values["rec.measured"])

# %%
for name in ("recurrent_scan", "recurrent_train", "recurrent_decode"):
    display(Markdown((figures.tables_dir() / f"{name}.md").read_text()))
print("threaded against step:", figures.plain(values["rec.scan_target"]))
print("decode flat:", figures.plain(values["rec.decode_flat"]))
print(figures.plain(f"bits/byte, attention: {values['rec.bpb_modern']} | recurrent: "
                    f"{values['rec.bpb_recurrent']}"))
