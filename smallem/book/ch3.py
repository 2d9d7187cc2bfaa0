"""Chapter 3, training a GPT on the CPU: the step timed on each path, a short training run,
and the reading of their records.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from .. import checks, data
from ..model import CONFIGS, GPT, get_config
from ..timing import Timing, measure, measure_interleaved, quick_mode
from ..train import LN2, Trainer, _estimate_steps, train
from . import ch1, compare, figures, records, reference

# ---------------------------------------------------------------- benchmark

RECORD_STEP = "ch3.train_step"
RECORD_RUN = "ch3.train_run"
RECORDS = (RECORD_STEP, RECORD_RUN)


def measure_step(config, backend: str, B: int, threads: int, *, warmup=1, repeats=3) -> dict:
    """Seconds of one full training step (forward, backward, AdamW) for one backend."""
    cfg = get_config(config)
    corpus = data.load_corpus()
    T = cfg.context
    if backend == "torch":
        import torch

        from .. import torch_gpt
        torch.set_num_threads(threads)
        init = GPT(cfg, "numpy", seed=0)
        tr = torch_gpt.TorchTrainer(init.params, cfg)
        i = [0]

        def step():
            x, y = data.batch(corpus.train, 0, i[0], B, T)
            i[0] += 1
            tr.step(x, y)
    else:
        t = Trainer(cfg, corpus=corpus, batch_size=B, steps=warmup + repeats, backend=backend,
                    threads=threads)
        step = t.train_step
    from threadpoolctl import threadpool_limits
    with threadpool_limits(threads):  # numpy's BLAS gets the same core count
        secs = measure(step, repeats=repeats, warmup=warmup).seconds
    return {"seconds": secs, "tokens": B * T}


# which op is which cost, for the "where the time goes" table
OP_GROUPS = {"linear": "matrix products (+ bias)", "linear_backward": "matrix products (+ bias)",
             "head": "matrix products (+ bias)", "head_backward": "matrix products (+ bias)",
             "attention": "attention", "attention_backward": "attention",
             "layernorm": "LayerNorm", "layernorm_backward": "LayerNorm",
             "gelu": "GELU (+ bias)", "gelu_backward": "GELU (+ bias)", "add": "residual adds",
             "cross_entropy": "softmax + cross-entropy", "embedding": "embedding",
             "embedding_backward": "embedding", "adamw": "AdamW + gradient norm",
             "sum_squares": "AdamW + gradient norm", "bias_gelu": "GELU (+ bias)",
             "gelu_backward_bias": "GELU (+ bias)", "residual_layernorm": "LayerNorm",
             "bias_residual": "residual adds"}


def profile_step(trainer: Trainer, steps: int = 2) -> dict[str, float]:
    """Seconds per step spent in each op (after one warm-up step); "other" is the rest."""
    ops = trainer.model.ops
    spent = dict.fromkeys(OP_GROUPS, 0.0)
    depth = [0]  # an op made of others (an unfused composition) counts once, as itself

    def timed(name, fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            depth[0] += 1
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    spent[name] += time.perf_counter() - t0
        return run

    for name in OP_GROUPS:
        setattr(ops, name, timed(name, getattr(ops, name)))
    try:
        trainer.train_step()
        for k in spent:
            spent[k] = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        total = (time.perf_counter() - t0) / steps
    finally:
        for name in OP_GROUPS:
            delattr(ops, name)  # back to the class's methods
    out = {k: v / steps for k, v in spent.items()}
    out["other"] = max(0.0, total - sum(out.values()))
    return out


ATTENTION = {"kernels": "matrices", "flash": "tiles"}  # backend -> how it does attention


def _measure_attention(rec, cfg, B, threads, quick):
    """The kernels' step with the attention as (T, T) matrices and in tiles, timed in turn:
    "attention_step" results (tokens/s), with every sample for the sign test."""
    from threadpoolctl import threadpool_limits

    time.sleep(0.5)
    corpus = data.load_corpus()
    trainers = {b: Trainer(cfg, corpus=corpus, batch_size=B, steps=100, backend=b,
                           threads=threads) for b in ATTENTION}
    with threadpool_limits(threads):
        ts = measure_interleaved({b: t.train_step for b, t in trainers.items()},
                                 repeats=2 if quick else 7, warmup=1)
    for b, t in ts.items():
        tokens = B * cfg.context
        rec.add("attention_step", "tokens/s", t.rate(tokens),
                seconds={**t.stats(), "samples": list(t.seconds)}, attention=ATTENTION[b])


def _torch_version():
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def bench_train(quick: bool | None = None, progress: bool = True, threads: int | None = None):
    """Chapter 3's measurements: one step of the big config per backend, and a short run."""
    quick = quick_mode() if quick is None else quick
    threads = checks.threads(threads)
    cfg_name, B = ("s", 2) if quick else ("xl", 2)
    cfg = get_config(cfg_name)
    repeats = 2 if quick else 3
    step_rec = records.Record(RECORD_STEP, settings={
        "quick": quick, "config": cfg.to_dict(), "batch_size": B, "seq_len": cfg.context,
        "threads": threads, "flops_per_token": cfg.flops_per_token(),
        "params": cfg.n_params(), "warmup_steps": 1, "timed_steps": repeats,
        "numpy": np.__version__, "torch": _torch_version()})
    for backend in ("numpy", "kernels", "profile", "torch"):
        # OpenBLAS's and PyTorch's worker threads spin for a while after their last call:
        # a pause keeps them from competing with the next measurement for the cores.
        time.sleep(0.5)
        if backend == "profile":  # where the kernels' step spends its time
            prof = profile_step(Trainer(cfg, corpus=data.load_corpus(), batch_size=B, steps=10,
                                        threads=threads), steps=1 if quick else 2)
            for op, sec in prof.items():
                step_rec.add("op_seconds", "s", Timing([sec]).stats(), backend="kernels", op=op)
            continue
        try:  # the numpy path is the slow one: one timed step fewer keeps the run short
            r = measure_step(cfg, backend, B, threads,
                             repeats=max(2, repeats - 1) if backend == "numpy" else repeats)
        except ImportError as e:
            step_rec.data["settings"].setdefault("missing", {})[backend] = str(e)
            if progress:
                print(f"{backend}: not available ({e})")
            continue
        secs = r["seconds"]
        step_rec.add("step", "tokens/s", Timing([r["tokens"] / s for s in secs]).stats(),
                     seconds=Timing(secs).stats(), backend=backend)
        if progress:
            print(f"{cfg_name} step, {backend:8s}: {r['tokens'] / statistics.median(secs):9.0f} "
                  f"tokens/s ({statistics.median(secs):.2f} s per step of {r['tokens']} tokens)")
    _measure_attention(step_rec, cfg, B, threads, quick)
    step_rec.save()

    # the loss curve: config s on the default corpus, a fixed step count
    time.sleep(0.5)
    run_minutes = 0.1 if quick else 4.0  # about where config s crosses 2.5 bits per byte here
    corpus = data.load_corpus()
    batch = 2 if quick else None
    steps = 6 if quick else _estimate_steps("s", corpus, run_minutes, batch_size=batch,
                                             threads=threads)
    t = Trainer("s", corpus=corpus, batch_size=batch, steps=steps, threads=threads)
    h = train(t, eval_every=max(1, steps // 10), eval_batches=2 if quick else 8,
              sample_bytes=20 if quick else 400, progress=progress)
    run_rec = records.Record(RECORD_RUN, settings={**t.settings(), "quick": quick,
                                                   "threads": threads, "curve": {
                                                       "step": h["step"], "loss": h["loss"],
                                                       "val_step": h["val_step"],
                                                       "val_bpb": h["val_bpb"]},
                                                   "sample": h.get("sample", "")})
    run_rec.add("final_val_bpb", "bits/byte", Timing([h["val_bpb"][-1]]).stats())
    run_rec.add("run_seconds", "s", Timing([h["seconds"]]).stats())
    tok = [t.B * t.T / s for s in h["step_seconds"][1:] or h["step_seconds"]]
    run_rec.add("train_tokens_per_s", "tokens/s", Timing(tok).stats())
    run_rec.save()
    return step_rec, run_rec


def add_bench_train_arguments(p):
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds (for tests)")
    p.add_argument("--threads", type=int, help="threads for every backend (default: all cores)")


def cmd_bench_train(args) -> int:
    step_rec, run_rec = bench_train(quick=args.quick or None, threads=args.threads)
    print(f"wrote {records.records_dir() / (RECORD_STEP + '.json')} and "
          f"{records.records_dir() / (RECORD_RUN + '.json')}")
    return 0


# ---------------------------------------------------------------- figures

def _peak_gflops(rec_dir, threads: int):
    """Chapter 1's measured f32 peak at ``threads`` (or the most threads measured), or None."""
    facts = ch1.facts(rec_dir)
    if facts is None:
        return None
    peaks = {th: v for (kind, th), v in facts["peak"].items() if kind == "f32"}
    return peaks.get(threads, peaks[max(peaks)])


def report(rec_dir) -> dict:
    f = figures.fmt
    values = {}
    rows = [[c.name, c.d_model, c.n_layer, c.n_head, c.context, f(c.n_params() / 1e6, "M"),
             f(c.flops_per_token() / 1e6, "MFLOP")] for c in CONFIGS.values()]
    figures.write_table("ch3_configs", rows, ["config", "d", "layers", "heads", "context",
                                              "parameters", "training FLOPs per token"])
    xl = CONFIGS["xl"]
    values["ch3.xl_params"] = f(xl.n_params() / 1e6, "M")
    values["ch3.xl_flops_per_token"] = f(xl.flops_per_token() / 1e6, "MFLOP")

    if records.exists(RECORD_STEP, rec_dir):
        for k in ("kernels_toks", "kernels_vs_torch",
                  "kernels_vs_numpy", "kernels_mfu", "matmul_share", "attention_share",
                  "rest_share"):
            values[f"ch3.{k}"] = "n/a (not measured)"
        rec = records.load(RECORD_STEP, rec_dir)
        s = rec["settings"]
        peak = _peak_gflops(rec_dir, s["threads"])
        fpt = s["flops_per_token"]
        label = {"numpy": "numpy reference", "kernels": "smallem kernels",
                 "torch": "PyTorch eager (CPU)"}
        rows, toks = [], {}
        for backend in ("numpy", "kernels", "torch"):
            found = records.results(rec, "step", backend=backend)
            if not found:
                why = s.get("missing", {}).get(backend, "not measured")
                rows.append([label[backend], "—", "—", "—", "—", f"not run: {why}"])
                continue
            v = found[0]["value"]["median"]
            toks[backend] = v
            gf = v * fpt / 1e9
            mfu = f"{100 * gf / peak:.1f}%" if peak else "no ch1 record"
            rows.append([label[backend], f(v, "tokens/s"), f(v / s["threads"], "tokens/s"),
                         f(found[0]["seconds"]["median"], "s"), f(gf, "GFLOP/s"), mfu])
        per = reference.CORES
        rows.append([f"reference series, before → after ({reference.CITE})",
                     f"{reference.CH3_XL_STEP_BEFORE_TOKS} → "
                     f"{f(reference.CH3_XL_STEP_AFTER_TOKS)} tokens/s",
                     f"{f(reference.CH3_XL_STEP_BEFORE_TOKS / per)} → "
                     f"{f(reference.CH3_XL_STEP_AFTER_TOKS / per)} tokens/s", "—", "—",
                     f"{100 * reference.CH3_XL_MFU_CPU:.0f}% ({reference.MACHINE})"])
        cfg = s["config"]
        numpy_steps = next((r["value"]["n"] for r in records.results(rec, "step", backend="numpy")),
                           0)
        note = (f"One {cfg['name']} training step (forward, backward, AdamW), "
                f"batch {s['batch_size']} x {s['seq_len']} tokens, {s['threads']} threads, "
                f"median of {s['timed_steps']} steps (numpy: {numpy_steps}) after "
                f"{s['warmup_steps']} warm-up; "
                f"MFU = model FLOPs ({f(fpt / 1e6, 'MFLOP')} per token) / chapter 1's f32 peak"
                f"{' (' + f(peak, 'Gop/s') + ')' if peak else ''}. {figures.machine_line(rec)}.")
        figures.write_table("ch3_step", rows, ["path", "training speed", "per core",
                                               "time per step", "model FLOP rate", "MFU"],
                            note + f" The reference's per-core figure is its {per}-core figure "
                            f"divided by {per}.")
        if "kernels" in toks:
            values["ch3.kernels_toks"] = f(toks["kernels"], "tokens/s")
        if "kernels" in toks and "torch" in toks:
            values["ch3.kernels_vs_torch"] = f(toks["kernels"] / toks["torch"]) + "×"
        if "kernels" in toks and "numpy" in toks:
            values["ch3.kernels_vs_numpy"] = f(toks["kernels"] / toks["numpy"]) + "×"
        if "kernels" in toks and peak:
            values["ch3.kernels_mfu"] = f"{100 * toks['kernels'] * fpt / 1e9 / peak:.1f}%"
        elif "kernels" in toks:
            values["ch3.kernels_mfu"] = "n/a (no chapter-1 record of the peak)"
        values["ch3.threads"] = str(s["threads"])
        values["ch3.ref_mfu"] = f"{100 * reference.CH3_XL_MFU_CPU:.0f}%"
        prof = {r["params"]["op"]: r["value"]["median"] for r in records.results(rec, "op_seconds")}
        if prof:
            total = sum(prof.values())
            groups: dict[str, float] = {}
            for op, sec in prof.items():
                g = OP_GROUPS.get(op, "Python and the rest")
                groups[g] = groups.get(g, 0.0) + sec
            rows = [[g, f(1e3 * sec, "ms"), f"{100 * sec / total:.1f}%"]
                    for g, sec in sorted(groups.items(), key=lambda kv: -kv[1])]
            figures.write_table("ch3_ops", rows, ["op (forward + backward)", "time per step",
                                                  "share"],
                                f"smallem kernels, the same step as above, one profiled step "
                                f"after a warm-up; {figures.machine_line(rec)}.")
            values["ch3.matmul_share"] = (
                f"{100 * groups.get('matrix products (+ bias)', 0) / total:.0f}%")
            values["ch3.attention_share"] = f"{100 * groups.get('attention', 0) / total:.0f}%"
            rest = total - groups.get("matrix products (+ bias)", 0) - groups.get("attention", 0)
            values["ch3.rest_share"] = f"{100 * rest / total:.0f}%"
        values["ch3.bench_batch"] = str(s["batch_size"])
        found = {r["params"]["attention"]: r for r in records.results(rec, "attention_step")}
        values["ch3.matrices_toks"] = f(found["matrices"]["value"]["median"], "tokens/s")
        values["ch3.tiles_toks"] = f(found["tiles"]["value"]["median"], "tokens/s")
        values["ch3.tiles_vs_matrices"] = compare.versus(found["tiles"], found["matrices"])
        values["ch3.tiles_rounds"] = str(found["tiles"]["seconds"]["n"])

    if records.exists(RECORD_RUN, rec_dir):
        rec = records.load(RECORD_RUN, rec_dir)
        s = rec["settings"]
        c = s["curve"]
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(c["step"], np.array(c["loss"]) / LN2, lw=0.8, color="tab:blue",
                label="training batch")
        ax.plot(c["val_step"], c["val_bpb"], "o-", color="tab:red", label="held-out files")
        ax.axhline(2.5, color="grey", ls=":", lw=1, label="2.5 bits per byte")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (bits per byte)")
        ax.set_ylim(0, 8.5)
        ax.set_title(f"config {s['config']['name']}, {s['batch_size']} x {s['seq_len']} "
                     f"tokens per step, {s['corpus']['name']}", fontsize=9)
        ax.legend()
        ax.grid(alpha=0.3)
        figures.save(fig, "ch3_loss")
        final = records.value(rec, "final_val_bpb")
        values["ch3.s_final_bpb"] = f"{final:.2f} bits per byte"
        values["ch3.s_steps"] = str(s["total_steps"])
        values["ch3.s_minutes"] = f(records.value(rec, "run_seconds") / 60, "min", 2)
        values["ch3.s_tokens_per_s"] = f(records.value(rec, "train_tokens_per_s"), "tokens/s")
        values["ch3.corpus_sha"] = s["corpus"]["sha256"][:12]
        values["ch3.corpus_files"] = str(s["corpus"]["files"])
        values["ch3.corpus_mb"] = f((s["corpus"]["train_bytes"] + s["corpus"]["val_bytes"]) / 1e6,
                                    "MB")
        sample = s.get("sample", "")
        path = figures.tables_dir() / "ch3_sample.md"
        # control bytes and broken UTF-8 of an untrained model would break the page: show them as ·
        clean = "".join(ch if ch.isprintable() or ch in "\n\t" else "·" for ch in sample)
        path.write_text("```text\n" + clean.replace("```", "'''") + "\n```\n")
    return values


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = {"bench-train": (cmd_bench_train, add_bench_train_arguments,
                            "chapter 3: time training steps, write records")}
MEASURE = "bench-train"  # the command `make book` runs
