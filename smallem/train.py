"""Training: AdamW, a cosine schedule, checkpoints, the CLI and chapter 3's benchmark.

    smallem train --config s --minutes 3                # the default corpus, kernels
    smallem train --config m --steps 2000 --checkpoint runs/m --resume
    smallem bench-train [--quick]                       # chapter 3's records

Python API: :class:`Trainer` (one object per run: model, optimiser, data,
step counter) and :func:`train` (the loop with progress bar, log, validation,
checkpoints and samples).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np

from . import checkpoint, data, records
from .model import CONFIGS, GPT, get_config

LN2 = math.log(2.0)

# Per-config defaults: small models take a larger learning rate.
DEFAULTS = {"s": dict(lr=3e-3, batch=16), "m": dict(lr=1.5e-3, batch=16),
            "l": dict(lr=1e-3, batch=8), "xl": dict(lr=6e-4, batch=4)}


def lr_at(step: int, total: int, max_lr: float, warmup: int, min_ratio: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_ratio * max_lr``."""
    if step < warmup:
        return max_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    low = max_lr * min_ratio
    return low + 0.5 * (max_lr - low) * (1.0 + math.cos(math.pi * progress))


class AdamW:
    """AdamW over the model's flat buffers; decay applies to the leading 2-D weights."""

    def __init__(self, model: GPT, *, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 clip=1.0):
        self.model = model
        self.m = np.zeros_like(model.flat)
        self.v = np.zeros_like(model.flat)
        self.t = 0
        self.betas, self.eps, self.wd, self.clip = betas, eps, weight_decay, clip
        self.n_decay = model.config.n_decayed()

    # --8<-- [start:adamw_step]
    def step(self, lr: float) -> float:
        """Clip by global norm, then update; returns the norm before clipping."""
        mdl, ops = self.model, self.model.ops
        norm = math.sqrt(ops.sum_squares(mdl.grad_flat))
        scale = min(1.0, self.clip / (norm + 1e-6)) if self.clip else 1.0
        self.t += 1
        nd = self.n_decay
        for part, wd in ((slice(0, nd), self.wd), (slice(nd, None), 0.0)):
            ops.adamw(mdl.flat[part], mdl.grad_flat[part], self.m[part], self.v[part], lr=lr,
                      beta1=self.betas[0], beta2=self.betas[1], eps=self.eps, weight_decay=wd,
                      grad_scale=scale, step=self.t)
        return norm
    # --8<-- [end:adamw_step]


class Trainer:
    """One training run: model, optimiser, corpus, and where it is (``step``)."""

    def __init__(self, config="s", *, corpus=None, batch_size=None, steps=1000, seed=0,
                 backend="kernels", threads=None, lr=None, warmup=None, weight_decay=0.1,
                 clip=1.0, seq_len=None):
        self.config = get_config(config)
        d = DEFAULTS.get(self.config.name, DEFAULTS["m"])
        self.corpus = corpus if isinstance(corpus, data.Corpus) else data.load_corpus(corpus)
        self.B = int(batch_size or d["batch"])
        self.T = int(seq_len or self.config.context)
        if self.T > self.config.context:
            raise ValueError(f"seq_len {self.T} is longer than the context {self.config.context} "
                             f"of config {self.config.name!r}")
        self.total_steps = int(steps)
        self.seed = int(seed)
        self.max_lr = float(lr or d["lr"])
        default_warmup = max(1, min(100, self.total_steps // 10))
        self.warmup = int(warmup if warmup is not None else default_warmup)
        self.model = GPT(self.config, backend, seed=self.seed, threads=threads)
        self.opt = AdamW(self.model, weight_decay=weight_decay, clip=clip)
        self.step = 0

    def settings(self) -> dict:
        return {"config": self.config.to_dict(), "batch_size": self.B, "seq_len": self.T,
                "total_steps": self.total_steps, "seed": self.seed, "lr": self.max_lr,
                "warmup": self.warmup, "weight_decay": self.opt.wd, "clip": self.opt.clip,
                "backend": self.model.backend, "corpus": self.corpus.describe()}

    # --8<-- [start:train_step]
    def train_step(self) -> dict:
        x, y = data.batch(self.corpus.train, self.seed, self.step, self.B, self.T)
        lr = lr_at(self.step, self.total_steps, self.max_lr, self.warmup)
        loss = self.model.forward(x, y)
        self.model.backward()
        norm = self.opt.step(lr)
        self.step += 1
        return {"step": self.step, "loss": loss, "lr": lr, "grad_norm": norm}
    # --8<-- [end:train_step]

    def evaluate(self, batches: int = 8) -> float:
        """Validation loss in bits per byte over fixed held-out batches."""
        total = 0.0
        for i in range(batches):
            x, y = data.val_batch(self.corpus.val, i, self.B, self.T)
            total += self.model.forward(x, y)
        return total / batches / LN2

    # ------------------------------------------------------------ checkpoints
    def save(self, folder):
        tensors = {}
        m = self.model
        for name in m.params:
            tensors["param." + name] = m.params[name]
        for key, buf in (("adam.m.", self.opt.m), ("adam.v.", self.opt.v)):
            for name, view in m._views(buf).items():
                tensors[key + name] = view
        s = self.settings()
        meta = {"step": self.step, "adam_t": self.opt.t, **s,
                "sampler": {"kind": "seed+step", "seed": self.seed, "next_step": self.step}}
        return checkpoint.save(folder, tensors, meta)

    @classmethod
    def resume(cls, folder, *, corpus=None, backend="kernels", threads=None) -> "Trainer":
        tensors, meta = checkpoint.load(folder)
        where = Path(folder) / checkpoint.INDEX
        try:
            cfg = get_config(meta["config"])
            t = cls(cfg, corpus=corpus, batch_size=meta["batch_size"], steps=meta["total_steps"],
                    seed=meta["seed"], backend=backend, threads=threads, lr=meta["lr"],
                    warmup=meta["warmup"], weight_decay=meta["weight_decay"], clip=meta["clip"],
                    seq_len=meta["seq_len"])
        except (KeyError, TypeError) as e:
            raise checkpoint.CheckpointError(f"{where}: missing or bad field {e}") from e
        want = meta["corpus"]["sha256"]
        if t.corpus.sha256 != want:
            raise checkpoint.CheckpointError(
                f"{where}: trained on corpus {meta['corpus']['name']} (sha256 {want[:12]}), "
                f"but this run's corpus {t.corpus.name} has sha256 {t.corpus.sha256[:12]}")
        m = t.model
        expected = {"param." + k: s for k, s in m.shapes.items()}
        expected.update({"adam.m." + k: s for k, s in m.shapes.items()})
        expected.update({"adam.v." + k: s for k, s in m.shapes.items()})
        checkpoint.check_tensors(tensors, expected, where)
        for name in m.params:
            m.params[name][...] = tensors["param." + name]
        for key, buf in (("adam.m.", t.opt.m), ("adam.v.", t.opt.v)):
            for name, view in m._views(buf).items():
                view[...] = tensors[key + name]
        t.step, t.opt.t = int(meta["step"]), int(meta["adam_t"])
        return t


def train(trainer: Trainer, *, log_path=None, eval_every=100, eval_batches=8,
          checkpoint_dir=None, checkpoint_every=0, minutes=None, sample_bytes=300,
          progress=True, stop_after=None) -> dict:
    """Run ``trainer`` to its ``total_steps`` (or for ``minutes``); return the history.

    ``stop_after`` ends this call after that many steps (an interruption, for
    tests); ``minutes`` stops at the first step boundary past the budget.
    """
    from tqdm import tqdm

    log = open(log_path, "a") if log_path else None

    def write(entry):
        if log:
            log.write(json.dumps(entry) + "\n")
            log.flush()

    write({"kind": "start", "resumed_at": trainer.step, "time": time.time(),
           **trainer.settings()})
    history = {"step": [], "loss": [], "val_step": [], "val_bpb": [], "step_seconds": []}
    tokens = trainer.B * trainer.T
    bar = tqdm(total=trainer.total_steps, initial=trainer.step, disable=not progress,
               unit="step", desc=f"train {trainer.config.name}")
    start, done = time.perf_counter(), 0
    try:
        while trainer.step < trainer.total_steps:
            t0 = time.perf_counter()
            out = trainer.train_step()
            dt = time.perf_counter() - t0
            done += 1
            out.update(kind="train", tokens_per_s=tokens / dt, seconds=dt)
            write(out)
            for k in ("step", "loss"):
                history[k].append(out[k])
            history["step_seconds"].append(dt)
            bar.update()
            bar.set_postfix(loss=f"{out['loss']:.3f}", tok_s=f"{tokens / dt:,.0f}")
            last = trainer.step == trainer.total_steps
            if eval_every and (trainer.step % eval_every == 0 or last):
                bpb = trainer.evaluate(eval_batches)
                history["val_step"].append(trainer.step)
                history["val_bpb"].append(bpb)
                write({"kind": "val", "step": trainer.step, "val_bpb": bpb})
                bar.write(f"step {trainer.step}: validation {bpb:.3f} bits/byte")
            if checkpoint_dir and checkpoint_every and (trainer.step % checkpoint_every == 0
                                                        or last):
                trainer.save(checkpoint_dir)
            if stop_after is not None and done >= stop_after:
                break
            if minutes is not None and time.perf_counter() - start > 60 * minutes:
                break
    finally:
        bar.close()
    if checkpoint_dir:
        trainer.save(checkpoint_dir)
    if sample_bytes:
        text = trainer.model.generate(b"def ", sample_bytes, seed=trainer.seed)
        history["sample"] = "def " + text.decode("utf-8", errors="replace")
        write({"kind": "sample", "step": trainer.step, "text": history["sample"]})
    history["seconds"] = time.perf_counter() - start
    if log:
        log.close()
    return history


# ---------------------------------------------------------------- CLI: train

def add_train_arguments(p):
    p.add_argument("--config", default="s", help=f"model size: {', '.join(CONFIGS)} (default s)")
    p.add_argument("--corpus", help="UTF-8 text file or folder (default: the Python stdlib)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default per config)")
    p.add_argument("--seq-len", type=int, help="tokens per sequence (default: the context)")
    p.add_argument("--steps", type=int, help="training steps (default 1000)")
    p.add_argument("--minutes", type=float,
                   help="time budget; without --steps, sets the step count from the first steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, help="peak learning rate (default per config)")
    p.add_argument("--backend", default="kernels", choices=["kernels", "numpy"])
    p.add_argument("--threads", type=int, help="threads (default: every usable core)")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--log", help="JSON-lines log (default runs/<config>/log.jsonl)")
    p.add_argument("--checkpoint", help="checkpoint folder (default runs/<config>)")
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--sample-bytes", type=int, default=300)
    p.add_argument("--list", action="store_true", help="list the configs and exit")


def list_configs() -> str:
    lines = ["config  d_model layers heads context   params  GFLOP/token (train)"]
    for c in CONFIGS.values():
        lines.append(f"{c.name:6s} {c.d_model:8d} {c.n_layer:6d} {c.n_head:5d} {c.context:7d} "
                     f"{c.n_params() / 1e6:7.2f}M {c.flops_per_token() / 1e9:10.3f}")
    return "\n".join(lines)


def _estimate_steps(config, corpus, minutes, **kw) -> int:
    """Steps that fit in ``minutes``, from the median of 4 steps of a throwaway model."""
    probe = Trainer(config, corpus=corpus, steps=10, **kw)
    per_step = statistics.median(_time_steps(probe.train_step, warmup=1, repeats=4))
    return max(1, int(60 * minutes / per_step))


def cmd_train(args) -> int:
    if args.list:
        print(list_configs())
        return 0
    folder = Path(args.checkpoint or Path("runs") / args.config)
    log_path = args.log or folder / "log.jsonl"
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    if args.resume and checkpoint.exists(folder):
        t = Trainer.resume(folder, corpus=args.corpus, backend=args.backend, threads=args.threads)
        print(f"resuming {folder} at step {t.step} of {t.total_steps}")
    else:
        if args.resume:
            print(f"no checkpoint in {folder}: starting from scratch")
        corpus = data.load_corpus(args.corpus)
        steps = args.steps
        if steps is None:
            steps = 1000 if not args.minutes else _estimate_steps(
                args.config, corpus, args.minutes, batch_size=args.batch_size, seed=args.seed,
                backend=args.backend, threads=args.threads, seq_len=args.seq_len)
        t = Trainer(args.config, corpus=corpus, batch_size=args.batch_size, steps=steps,
                    seed=args.seed, backend=args.backend, threads=args.threads, lr=args.lr,
                    seq_len=args.seq_len)
        print(f"config {t.config.name}: {t.config.n_params() / 1e6:.2f} M parameters, "
              f"{t.total_steps} steps of {t.B} x {t.T} tokens; corpus {t.corpus.name} "
              f"({t.corpus.train.size / 1e6:.1f} MB train, sha256 {t.corpus.sha256[:12]})")
    h = train(t, log_path=log_path, eval_every=args.eval_every, checkpoint_dir=folder,
              checkpoint_every=args.checkpoint_every,
              minutes=args.minutes if args.steps is not None else None,
              sample_bytes=args.sample_bytes)
    if h["val_bpb"]:
        print(f"validation: {h['val_bpb'][-1]:.3f} bits per byte at step {t.step}")
    if "sample" in h:
        print("sample:\n" + h["sample"])
    print(f"log: {log_path}; checkpoint: {folder}")
    return 0


# ---------------------------------------------------------------- benchmark

RECORD_STEP = "ch3.train_step"
RECORD_RUN = "ch3.train_run"


def quick_mode() -> bool:
    return os.environ.get("SMALLEM_QUICK") == "1"


def _time_steps(step_fn, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        step_fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step_fn()
        out.append(time.perf_counter() - t0)
    return out


def measure_step(config, backend: str, B: int, threads: int, *, warmup=1, repeats=3) -> dict:
    """Seconds of one full training step (forward, backward, AdamW) for one backend."""
    cfg = get_config(config)
    corpus = data.load_corpus()
    T = cfg.context
    if backend == "torch":
        import torch

        from . import torch_gpt
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
        secs = _time_steps(step, warmup, repeats)
    return {"seconds": secs, "tokens": B * T}


# which op is which cost, for the "where the time goes" table
OP_GROUPS = {"linear": "matrix products (+ bias)", "linear_backward": "matrix products (+ bias)",
             "head": "matrix products (+ bias)", "head_backward": "matrix products (+ bias)",
             "attention": "attention", "attention_backward": "attention",
             "layernorm": "LayerNorm", "layernorm_backward": "LayerNorm",
             "gelu": "GELU", "gelu_backward": "GELU", "add": "residual adds",
             "cross_entropy": "softmax + cross-entropy", "embedding": "embedding",
             "embedding_backward": "embedding", "adamw": "AdamW + gradient norm",
             "sum_squares": "AdamW + gradient norm"}


def profile_step(trainer: Trainer, steps: int = 2) -> dict[str, float]:
    """Seconds per step spent in each op (after one warm-up step); "other" is the rest."""
    ops = trainer.model.ops
    spent = dict.fromkeys(OP_GROUPS, 0.0)

    def timed(name, fn):
        def run(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
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


def _stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def _torch_version():
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def bench_train(quick: bool | None = None, progress: bool = True, threads: int | None = None):
    """Chapter 3's measurements: one step of the big config per backend, and a short run."""
    from . import checks

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
                step_rec.add("op_seconds", "s", _stats([sec]), backend="kernels", op=op)
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
        step_rec.add("step", "tokens/s", _stats([r["tokens"] / s for s in secs]),
                     seconds=_stats(secs), backend=backend)
        if progress:
            print(f"{cfg_name} step, {backend:8s}: {r['tokens'] / statistics.median(secs):9.0f} "
                  f"tokens/s ({statistics.median(secs):.2f} s per step of {r['tokens']} tokens)")
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
    run_rec.add("final_val_bpb", "bits/byte", _stats([h["val_bpb"][-1]]))
    run_rec.add("run_seconds", "s", _stats([h["seconds"]]))
    tok = [t.B * t.T / s for s in h["step_seconds"][1:] or h["step_seconds"]]
    run_rec.add("train_tokens_per_s", "tokens/s", _stats(tok))
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
    try:
        rec = records.load("ch1.machine", rec_dir)
    except records.RecordError:
        return None
    peaks = {r["params"]["threads"]: r["value"]["median"]
             for r in records.results(rec, "peak", kind="f32")}
    if not peaks:
        return None
    return peaks.get(threads, peaks[max(peaks)])


def make_figures(rec_dir) -> dict:
    from . import figures, reference

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
        for k in ("numpy_toks", "kernels_toks", "torch_toks", "kernels_vs_torch",
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
                rows.append([label[backend], "—", "—", "—", f"not run: {why}"])
                continue
            v = found[0]["value"]["median"]
            toks[backend] = v
            gf = v * fpt / 1e9
            mfu = f"{100 * gf / peak:.1f}%" if peak else "no ch1 record"
            rows.append([label[backend], f(v, "tokens/s"),
                         f(found[0]["seconds"]["median"], "s"), f(gf, "GFLOP/s"), mfu])
        rows.append([f"reference series, before → after ({reference.CITE})",
                     f"{reference.CH3_XL_STEP_BEFORE_TOKS} → "
                     f"{f(reference.CH3_XL_STEP_AFTER_TOKS)} tokens/s", "—", "—",
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
        figures.write_table("ch3_step", rows, ["path", "training speed", "time per step",
                                               "model FLOP rate", "MFU"], note)
        for k, v in toks.items():
            values[f"ch3.{k}_toks"] = f(v, "tokens/s")
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
        values["ch3.quick_note"] = (
            "*These numbers come from a quick run (config s, tiny batch) made while the code was "
            "written; `smallem bench-train` replaces them with the full measurement.*"
            if s.get("quick") else "")
        values["ch3.bench_batch"] = str(s["batch_size"])
        values["ch3.bench_config"] = cfg["name"]

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
        values["ch3.s_params"] = f(s["config"]["d_model"] and get_config(s["config"]).n_params()
                                   / 1e6, "M")
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
