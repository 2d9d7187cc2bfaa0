"""Chapter 3 on the GPU (record ``ch3.gpu``): the whole training step of both blocks on the
device (``backend="cuda"``: :mod:`smallem.training.gpu_ops`), timed with CUDA events in
rounds; its losses beside the CPU's for the same seed and batches; the host transfers a
step makes, counted by the library; which products it runs (ours or cuBLAS), from both timed
at the step's largest shape."""

from __future__ import annotations

import time

import numpy as np

from smallem.plumbing import cuda
from smallem.cpu.timing import Timing, quick_mode
from smallem.training.model import get_config
from .. import figures, records
from .measuring import NOT_MEASURED, gpu_measure, machine

CH3 = "ch3.gpu"
ROUNDS = 7
STEPS = [("xl", "adamw"), ("xl-modern", "muon")]   # the steps chapter 3's table ends with
MATCH_STEPS = 20                                    # the "losses equal for 20 steps"
LOSS_RTOL = 1e-3                                    # "to rounding": f32 sums in other orders


# quick mode's model: small enough for the CPU emulator of CUDA behind the fake CuPy
TINY = {"name": "tiny", "d_model": 32, "n_layer": 2, "n_head": 2, "context": 32}


def _config(name: str):
    """A config by name; "tiny" and "tiny-modern" are quick mode's."""
    if name.startswith("tiny"):
        from smallem.training.model import Config
        return Config(**{**TINY, "name": name},
                      block="modern" if name.endswith("-modern") else "gpt2")
    return get_config(name)


def ch3_settings(quick: bool) -> dict:
    if quick:
        return {"quick": True, "steps": [["tiny", "adamw"], ["tiny-modern", "muon"]],
                "batch": 2, "seq": 16, "timed_steps": 1, "rounds": 2, "match_config": "tiny",
                "match_steps": 2, "match_batch": 2, "match_seq": 16}
    return {"quick": False, "steps": [list(s) for s in STEPS], "batch": 8, "seq": 1024,
            "timed_steps": 5, "rounds": ROUNDS, "match_config": "m", "match_steps": MATCH_STEPS,
            "match_batch": 4, "match_seq": 256}


def _trainer(config, optimizer, backend, B, T, steps=1000):
    from smallem.training.train import Trainer
    return Trainer(_config(config), backend=backend, optimizer=optimizer, batch_size=B, seq_len=T,
                   steps=steps, seed=0)


def _steps(trainer, n: int) -> list[float]:
    from smallem.training import gpu_ops
    return gpu_ops.run_steps(trainer, n)


def measure_steps(rec, s: dict, say, products: str) -> None:
    """Each (config, optimizer): rounds of ``timed_steps`` steps between two CUDA events,
    the products where :func:`measure_products` found them faster."""
    B, n = s["batch"], s["timed_steps"]
    for config, optimizer in s["steps"]:
        cfg = _config(config)
        T = min(s["seq"], cfg.context)
        tr = _trainer(config, optimizer, "cuda", B, T)
        tr.model.ops.products = products
        t = gpu_measure(lambda: _steps(tr, n), repeats=s["rounds"], warmup=1, max_time=None)
        per = Timing([x / n for x in t.seconds])
        toks = per.rate(B * T)
        rec.add("gpu_step", "tokens/s", toks, seconds={**per.stats(), "samples": per.seconds},
                config=config, block=cfg.block, optimizer=optimizer, batch=B, seq=T,
                flop_per_token=cfg.flops_per_token(T), products=tr.model.ops.products)
        say(f"  {config:10s} {optimizer:6s} {figures.fmt(toks['median'], 'tokens/s'):>16}")
        del tr
        cuda.require().get_default_memory_pool().free_all_blocks()


def measure_match(rec, s: dict, say) -> None:
    """The same steps on the CPU's kernels and on the GPU, same seed and batches, both
    blocks with AdamW and the modern one with Muon too: the losses side by side."""
    TRANSFERS = cuda.TRANSFERS
    B, T, n = s["match_batch"], s["match_seq"], s["match_steps"]
    base = s["match_config"]
    for config, optimizer in ((base, "adamw"), (f"{base}-modern", "adamw"),
                              (f"{base}-modern", "muon")):
        cpu, backend = _cpu_trainer(config, optimizer, B, T, n)
        want = [float(cpu.train_step()["loss"]) for _ in range(n)]
        gpu = _trainer(config, optimizer, "cuda", B, T, steps=n)
        if optimizer == "muon":  # Newton-Schulz in f32 here, as the CPU's kernels do it
            gpu.model.ops.ns_products = "f32"
        before = dict(TRANSFERS)
        got = _steps(gpu, n)
        moved = {k: TRANSFERS[k] - before[k] for k in TRANSFERS}
        rel = max(abs(a - b) / abs(b) for a, b in zip(got, want))
        v = {"median": rel, "min": rel, "max": rel, "n": n}
        rec.add("loss_match", "relative", v, config=config, optimizer=optimizer, steps=n,
                gpu_losses=got, cpu_losses=want, cpu_backend=backend,
                uploads_per_step=(moved.get("to_device", 0)) / n,
                reads=moved.get("to_host", 0))
        say(f"  {config:10s} {optimizer:6s} largest relative loss difference over {n} steps "
            f"{rel:.1e}")


def _cpu_trainer(config, optimizer, B, T, n):
    """The CPU side of the comparison: our C kernels where they build (cffi and a C compiler
    on the GPU's host), else the numpy reference. Returns (trainer, backend)."""
    try:
        return _trainer(config, optimizer, "kernels", B, T, steps=n), "kernels"
    except Exception as e:  # no cffi or no compiler on this host
        print(f"  the CPU's kernels are unavailable here ({type(e).__name__}: {e}): numpy")
        return _trainer(config, optimizer, "numpy", B, T, steps=n), "numpy"


def measure_products(rec, s: dict) -> str:
    """Our final f32 and bf16 GEMMs against cuBLAS at the step's largest product (the MLP's
    N x C x 4C): the f32 one that is faster is what the step's products run on ("ours" or
    "cublas", the ops' ``products``)."""
    cp = cuda.require()
    cfg = _config(s["steps"][0][0])
    M, K, N = s["batch"] * min(s["seq"], cfg.context), cfg.d_model, cfg.mlp_in
    A = cp.asarray(np.random.default_rng(1).standard_normal((M, K)).astype(np.float32))
    B = cp.asarray(np.random.default_rng(2).standard_normal((K, N)).astype(np.float32))
    out = cp.empty((M, N), dtype=cp.float32)
    a16, b16 = cuda.to_bf16(A), cuda.to_bf16(B)
    from .measuring import cublas_bf16
    fns = {"ours_f32": lambda: cuda.matmul(A, B, out=out),
           "cublas_f32": lambda: cp.matmul(A, B, out=out),
           "ours_bf16": lambda: cuda.matmul(a16, b16, out=out),
           "cublas_bf16": lambda: cublas_bf16(a16, b16, out)}
    for name, fn in fns.items():
        t = gpu_measure(fn, repeats=s["rounds"], warmup=2)
        rec.add("step_product", "Gop/s", t.rate(2.0 * M * N * K / 1e9),
                seconds={**t.stats(), "samples": t.seconds}, impl=name, m=M, n=N, k=K)
    rate = {r["params"]["impl"]: records.median(r)
            for r in records.results(rec.data, "step_product")}
    return "ours" if rate["ours_f32"] > rate["cublas_f32"] else "cublas"


def run_ch3(quick: bool | None = None, progress: bool = True) -> records.Record:
    cuda.require()
    quick = quick_mode() if quick is None else quick
    s = ch3_settings(quick)
    rec = records.Record(CH3, settings=s, machine=machine())
    say = print if progress else (lambda *a, **k: None)
    t0 = time.perf_counter()
    products = measure_products(rec, s)
    rec.data["settings"]["products"] = products
    measure_match(rec, s, say)
    measure_steps(rec, s, say, products)
    say(f"  chapter 3 on the GPU: {time.perf_counter() - t0:.0f} s")
    return rec


# ---------------------------------------------------------------- reading

TRAIN_HEADER = ["", "this CPU", "GPU"]


def _cpu_steps(rec_dir) -> dict:
    """Chapter 3's fastest GPT-2 step and its modern step with Muon on this machine."""
    if not records.exists("ch3.train_step", rec_dir):
        return {}
    steps = records.results(records.load("ch3.train_step", rec_dir), "rung_step")
    out = {}
    for r in steps:
        key = "modern" if "modern" in str(r["params"].get("config", "")) else "gpt2"
        if key not in out or records.median(r) > records.median(out[key]):
            out[key] = r
    return out


def train_rows(rec: dict | None, rec_dir) -> list[list]:
    f = figures.fmt
    cpu = _cpu_steps(rec_dir)
    gpu = {r["params"]["block"]: r for r in records.results(rec, "gpu_step")} if rec else {}
    rows = []
    for block, label in (("gpt2", "GPT-2 step, AdamW"), ("modern", "modern step, Muon")):
        c, g = cpu.get(block), gpu.get(block)
        cpu_cell = (f"{f(c['value']['median'], 'tokens/s')} ({c['params'].get('config', '?')})"
                    if c else "no chapter 3 record on this machine")
        gpu_cell = (f"{f(g['value']['median'], 'tokens/s')} ({g['params']['config']}, "
                    f"{g['params']['batch']} x {g['params']['seq']})" if g else NOT_MEASURED)
        rows.append([label, cpu_cell, gpu_cell])
    m = records.results(rec, "loss_match") if rec else []
    worst = max(m, key=records.median) if m else None
    rows.append(["losses against the CPU's, same batches",
                 "the reference", f"{worst['value']['median']:.1e} at most over "
                 f"{worst['params']['steps']} steps" if worst else NOT_MEASURED])
    rows.append(["host transfers inside a step", "none (one memory)",
                 f"{worst['params']['uploads_per_step']:g} uploads (the batch), "
                 f"{worst['params']['reads']} read{'s' * (worst['params']['reads'] != 1)} "
                 f"(the losses) over {worst['params']['steps']} steps"
                 if worst else NOT_MEASURED])
    return rows


def train_values(rec: dict | None) -> dict:
    if rec is None:
        return {"gpu.ch3_measured": False, "gpu.ch3_line": NOT_MEASURED,
                "gpu.ch3_products": NOT_MEASURED, "gpu.ch3_losses": NOT_MEASURED}
    from .reading import gpu_line
    prods = {r["params"]["impl"]: records.median(r)
             for r in records.results(rec, "step_product")}
    steps = records.results(rec, "gpu_step")
    used = steps[0]["params"]["products"] if steps else "cublas"
    m = records.results(rec, "loss_match")
    ok = all(records.median(r) <= LOSS_RTOL for r in m)
    f = figures.fmt
    return {"gpu.ch3_measured": True, "gpu.ch3_line": gpu_line(rec),
            "gpu.ch3_products": (f"{'our kernels' if used == 'ours' else 'cuBLAS'}, the faster at the "
                                 f"step's largest product, where ours ran "
                                 f"{f(prods.get('ours_f32', 0), 'Gop/s')} in f32 against "
                                 f"cuBLAS's {f(prods.get('cublas_f32', 0), 'Gop/s')}, and "
                                 f"{f(prods.get('ours_bf16', 0), 'Gop/s')} in bf16 (Muon's "
                                 f"Newton-Schulz) against {f(prods.get('cublas_bf16', 0), 'Gop/s')}"),
            "gpu.ch3_losses": _losses_text(m, rec)}


def _losses_text(m: list, rec: dict) -> str:
    """"equal to rounding" where every step's loss is within LOSS_RTOL of the CPU's."""
    if not m:
        return records.not_measured(rec, "no loss comparison in the record")
    worst = max(records.median(r) for r in m)
    steps = min(r["params"]["steps"] for r in m)
    return (("equal to rounding" if worst <= LOSS_RTOL else "not equal to rounding")
            + figures.note(f"the largest relative difference of a step's loss over {steps} "
                           f"steps, both blocks, AdamW and Muon: {worst:.1e} (at most "
                           f"{LOSS_RTOL:g} counts as rounding: float32 sums in other orders)"))


def report_ch3(rec_dir) -> dict:
    from .reading import load_gpu
    rec = load_gpu(CH3, rec_dir)
    note = (f"Measured on the GPU of {rec['machine']['gpu']['name']}; the CPU column is this "
            f"machine's chapter 3." if rec else "")
    figures.write_table("gpu_train", train_rows(rec, rec_dir), TRAIN_HEADER, note)
    return train_values(rec)
