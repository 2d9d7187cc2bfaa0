"""Training: AdamW, a cosine schedule, checkpoints, the CLI and chapter 3's benchmark.

    smallem train --config s --minutes 3                # the default corpus, kernels
    smallem train --config m --steps 2000 --checkpoint runs/m --resume
    smallem bench-train [--quick]                       # chapter 3's records

Python API: :class:`Trainer` (one object per run: model, optimiser, data,
step counter) and :func:`train` (the loop with progress bar, log, validation,
checkpoints and samples).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from smallem.training import checkpoint, data
from smallem.ladder import Ladder, Rung, Where
from smallem.training.model import BACKENDS, CONFIGS, GPT, get_config
from smallem.cpu.timing import measure

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
    """AdamW over the model's flat buffers; decay applies to the leading 2-D weights.
    ``skip`` = (start, end) leaves that span of the flat buffer to another optimiser."""

    name = "adamw"

    def __init__(self, model: GPT, *, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                 clip=1.0, skip=None):
        self.model = model
        self.m = model.xp.zeros_like(model.flat)  # on the model's device
        self.v = model.xp.zeros_like(model.flat)
        self.t = 0
        self.betas, self.eps, self.wd, self.clip = betas, eps, weight_decay, clip
        nd = model.config.n_decayed()
        a, b = skip or (nd, nd)
        self.parts = [(slice(i, j), wd) for i, j, wd in
                      ((0, a, weight_decay), (b, nd, weight_decay), (nd, None, 0.0))
                      if j is None or j > i]

    def clip_scale(self) -> tuple[float, float]:
        """The gradient's global norm, and the factor that clips it to ``clip``. On the GPU
        both are 0-d device arrays: AdamW reads the factor there, the host never waits."""
        if self.model.xp is not np:
            return self.model.ops.clip_scale(self.model.grad_flat, self.clip)
        norm = math.sqrt(self.model.ops.sum_squares(self.model.grad_flat))
        return norm, min(1.0, self.clip / (norm + 1e-6)) if self.clip else 1.0

    # --8<-- [start:adamw_step]
    def step(self, lr: float, clipped=None) -> float:
        """Clip by global norm, then update; returns the norm before clipping."""
        mdl, ops = self.model, self.model.ops
        norm, scale = clipped or self.clip_scale()
        self.t += 1
        for part, wd in self.parts:
            ops.adamw(mdl.flat[part], mdl.grad_flat[part], self.m[part], self.v[part], lr=lr,
                      beta1=self.betas[0], beta2=self.betas[1], eps=self.eps, weight_decay=wd,
                      grad_scale=scale, step=self.t)
        return norm
    # --8<-- [end:adamw_step]


# --8<-- [start:newton_schulz]
# Muon's orthogonalisation: five steps of a quintic Newton-Schulz iteration,
# X <- a X + (b A + c A A) X with A = X X^T, from X = G / |G|_F. Its coefficients are
# chosen to push every singular value of X towards 1 as fast as possible from anywhere
# in (0, 1], not to converge exactly: after five steps they lie roughly in [0.7, 1.2],
# which is what the update needs (Jordan et al., 2024).
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5


def newton_schulz(g, ops=None, steps: int = NS_STEPS, work=None):
    """g (m, n), m <= n, orthogonalised, through ``ops.matmul`` (the model's products: bf16
    for the bf16 backend; on the GPU ``ops.ns_matmul``: bf16 on the tensor cores, see
    smallem.training.gpu_ops) or numpy's where ``ops`` has none. ``work`` = (x, y, a, b): two
    scratch arrays (m, n) and two (m, m) of g's dtype (x may be g itself), made here if not
    given. Returns the one of x and y that holds the result."""
    m, n = g.shape
    if m > n:
        raise ValueError(f"g: expected a wide matrix (m <= n), got shape {g.shape}")
    xp = getattr(ops, "xp", np)  # cupy for the GPU's ops: every array stays on the device
    x, y, a, b = work or (xp.empty((m, n), g.dtype), xp.empty((m, n), g.dtype),
                          xp.empty((m, m), g.dtype), xp.empty((m, m), g.dtype))
    mm = getattr(ops, "ns_matmul", None) or getattr(ops, "matmul", None)

    def prod(p, q, out, trans_b=False, alpha=1.0, beta=0.0):  # out = alpha p q + beta out
        if mm is not None:
            return mm(p, q, trans_b=trans_b, out=out, alpha=alpha, beta=beta)
        out[...] = alpha * (p @ (q.T if trans_b else q)) + (beta * out if beta else 0.0)
        return out

    if xp is np:
        np.multiply(g, 1.0 / (math.sqrt(float(np.vdot(g, g))) + 1e-7), out=x)
    else:  # |G| computed and applied on the device, never read by the host
        ops.scale_to_unit_norm(g, x, 1e-7)
    ca, cb, cc = NS_COEFFS
    for _ in range(steps):
        prod(x, x, a, trans_b=True)               # A = X X^T
        xp.multiply(a, cb, out=b)
        prod(a, a, b, alpha=cc, beta=1.0)         # B = b A + c A A
        xp.multiply(x, ca, out=y)
        prod(b, x, y, beta=1.0)                   # X' = a X + B X
        x, y = y, x
    return x
# --8<-- [end:newton_schulz]


def newton_schulz_flops(cfg, steps: int = NS_STEPS) -> int:
    """FLOPs of one Muon step's orthogonalisations for ``cfg``: per matrix (m, n), m <= n,
    and per Newton-Schulz step, X X^T (m m n), A A (m m m) and B X (m m n) multiply-adds."""
    total = 0
    for name in cfg.hidden_matrices():
        r, c = cfg.param_shapes()[name]
        pieces = [c // 2] * 2 if cfg.block != "gpt2" and name.endswith("fc.w") else [c]
        for width in pieces:
            m, n = sorted((r, width))
            total += 2 * steps * (2 * m * m * n + m ** 3)
    return total


class Muon:
    """Muon (momentum, orthogonalised by Newton-Schulz) for the blocks' weight matrices,
    AdamW for the rest (embeddings, head, gains, biases), as Jordan et al. (2024) do.

    Each matrix's update is its Nesterov momentum orthogonalised, scaled by
    sqrt(max(1, outputs / inputs)) and by ``lr`` times the schedule's factor (the learning
    rate the trainer passes over ``base_lr``). SwiGLU's [W1 | W3] is two matrices, each
    orthogonalised on its own. No weight decay on these matrices, as in the original."""

    name = "muon"

    def __init__(self, model: GPT, *, base_lr: float, lr=0.02, momentum=0.95,
                 weight_decay=0.1, clip=1.0, **adam):
        cfg = model.config
        self.model, self.base_lr, self.lr, self.mu = model, base_lr, lr, momentum
        self.adam = AdamW(model, weight_decay=weight_decay, clip=clip, skip=cfg.hidden_span(),
                          **adam)
        # one matrix ("piece") at a time: SwiGLU's [W1 | W3] is two, a tall matrix is
        # taken transposed (Newton-Schulz runs on the wide orientation); each piece keeps
        # its momentum contiguous, in that orientation
        self.pieces = []  # (name, columns, transposed, momentum)
        for name in cfg.hidden_matrices():
            rows, width = model.params[name].shape
            halves = cfg.block != "gpt2" and name.endswith("fc.w")
            for c in ([slice(0, width // 2), slice(width // 2, None)] if halves else
                      [slice(None)]):
                cols = len(range(width)[c])
                tall = rows > cols
                shape = (cols, rows) if tall else (rows, cols)
                self.pieces.append((name, c, tall, model.xp.zeros(shape, model.flat.dtype)))
        self._work: dict = {}

    def state(self) -> dict:
        """Each matrix's momentum, in the matrix's own shape (for a checkpoint)."""
        out = {n: np.zeros(self.model.params[n].shape, self.model.flat.dtype)
               for n in self.model.config.hidden_matrices()}
        for name, c, tall, mom in self.pieces:
            mom = self.model.host(mom)
            out[name][:, c] = mom.T if tall else mom
        return out

    def load_state(self, state: dict):
        xp = self.model.xp
        for name, c, tall, mom in self.pieces:
            view = state[name][:, c]
            view = view.T if tall else view
            if xp is np:
                np.copyto(mom, view)
            else:  # one copy to the device
                mom[...] = xp.asarray(np.ascontiguousarray(view))

    # the AdamW half's state, under the names the trainer and checkpoints use
    t = property(lambda self: self.adam.t, lambda self, v: setattr(self.adam, "t", v))
    m = property(lambda self: self.adam.m)
    v = property(lambda self: self.adam.v)
    clip = property(lambda self: self.adam.clip)
    wd = property(lambda self: self.adam.wd)

    # --8<-- [start:muon_step]
    def step(self, lr: float) -> float:
        norm, scale = self.adam.clip_scale()
        self.adam.step(lr, clipped=(norm, scale))
        lr_m = self.lr * lr / self.base_lr
        P, G, xp = self.model.params, self.model.grads, self.model.xp  # numpy, or cupy
        for name, c, tall, mom in self.pieces:
            w, g = P[name][:, c], G[name][:, c]     # (inputs, outputs), maybe strided
            step = lr_m * math.sqrt(max(1.0, w.shape[1] / w.shape[0]))
            if tall:
                w, g = w.T, g.T
            if mom.shape not in self._work:
                r, k = mom.shape
                self._work[mom.shape] = tuple(xp.empty(s, mom.dtype)
                                              for s in ((r, k), (r, k), (r, r), (r, r), (r, k)))
            x, y, a, b, z = self._work[mom.shape]
            xp.copyto(y, g)                          # contiguous: numpy's ufuncs would
            y *= scale                               # buffer a strided operand
            mom *= self.mu
            mom += y                                 # momentum: m = mu m + g
            xp.multiply(mom, self.mu, out=x)
            x += y                                   # Nesterov: g + mu m
            o = newton_schulz(x, self.model.ops, work=(x, y, a, b))
            o *= step
            xp.copyto(z, w)
            z -= o
            xp.copyto(w, z)
        return norm
    # --8<-- [end:muon_step]


OPTIMIZERS = ("adamw", "muon")


def _option(help: str, kind: str | None = None, *, how: bool = False, cli: bool = True,
            **more):
    """A TrainSettings field's description for the command line (the commands layer makes
    the option from it): its help, the kind of its values ("count" from 1, "positive", "int",
    "flag", "choice" of ``choices``), whether it says how a run is computed
    rather than what it computes (``how``: a resumed run takes it from the command line, not
    from the checkpoint), and whether the command line offers it at all."""
    return {"help": help, "kind": kind, "how": how, "cli": cli, **more}


# --8<-- [start:settings]
@dataclass(frozen=True)
class TrainSettings:
    """Every option of a training run, defined once. :class:`Trainer` takes it (or its fields
    as keywords), its :meth:`Trainer.settings` and checkpoints write it, :meth:`Trainer.resume`
    reads it back, ``smallem train`` makes one option of each field, and
    :func:`estimate_steps`, the distributed trainer and the book pass it on whole. A new
    option is one field here and the code that uses it."""
    batch_size: int | None = field(default=None, metadata=_option(
        "sequences per step (default per config)", "count"))
    seq_len: int | None = field(default=None, metadata=_option(
        "tokens per sequence (default: the context)", "count"))
    accumulate: int = field(default=1, metadata=_option(
        "micro-batches of --batch-size sequences summed into each optimiser step (default 1)",
        "count", metavar="A"))
    steps: int = field(default=1000, metadata=_option(
        "training steps (default 1000, or from --minutes)", "count", saved_as="total_steps",
        unset=None))
    seed: int = field(default=0, metadata=_option("the seed of the weights and the batches",
                                                  "int"))
    lr: float | None = field(default=None, metadata=_option(
        "peak learning rate (default per config)", "positive"))
    warmup: int | None = field(default=None, metadata=_option(
        "steps of linear warm-up (default a tenth of the steps, at most 100)", "count",
        cli=False))
    weight_decay: float = field(default=0.1, metadata=_option("AdamW's weight decay", cli=False))
    clip: float = field(default=1.0, metadata=_option("gradient norm clip", cli=False))
    optimizer: str = field(default="adamw", metadata=_option(
        "adamw, or muon for the blocks' matrices (AdamW for the rest)", "choice",
        choices=OPTIMIZERS))
    backend: str = field(default="kernels", metadata=_option(
        "kernels, flash, fused, bf16 (the climb's rungs), numpy, or cuda (the GPU)", "choice",
        choices=tuple(BACKENDS), how=True))
    threads: int | None = field(default=None, metadata=_option(
        "threads (default: every usable core)", "count", how=True))
    pool: bool = field(default=False, metadata=_option(
        "run the kernels on smallem's own thread pool, not OpenMP's runtime", "flag", how=True))
    arena: bool = field(default=True, metadata=_option(
        "one arena for every buffer of a step", how=True, cli=False))

    def replace(self, **changes) -> "TrainSettings":
        return dataclasses.replace(self, **changes)

    def how(self) -> dict:
        """The fields that say how the run is computed (backend, threads, pool, arena): what
        a resumed run takes from its caller."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.metadata["how"]}

    @classmethod
    def saved(cls, meta: dict, **how) -> "TrainSettings":
        """The settings a checkpoint's ``meta`` was trained with (:meth:`Trainer.settings`
        writes them), with ``how`` (the fields marked so: backend, threads, pool...) from
        this run; a field the checkpoint lacks keeps its default."""
        kw = {}
        for f in dataclasses.fields(cls):
            if f.metadata["how"]:
                continue
            key = f.metadata.get("saved_as", f.name)
            if key in meta:
                kw[f.name] = meta[key]
        return cls(**kw, **how)
# --8<-- [end:settings]


class Trainer:
    """One training run: model, optimiser, corpus, and where it is (``step``)."""

    def __init__(self, config="s", *, corpus=None, settings: TrainSettings | None = None,
                 **options):
        bad = set(options) - {f.name for f in dataclasses.fields(TrainSettings)}
        if bad:
            raise TypeError(f"Trainer: unknown option(s) {', '.join(sorted(bad))}; the options "
                            f"are TrainSettings' fields")
        self.options = (settings or TrainSettings()).replace(**options)
        o = self.options
        batch_size, seq_len, steps, seed, lr, warmup = (o.batch_size, o.seq_len, o.steps,
                                                        o.seed, o.lr, o.warmup)
        accumulate, optimizer = o.accumulate, o.optimizer
        self.config = get_config(config)
        d = DEFAULTS.get(self.config.name.removesuffix("-modern").removesuffix("-recurrent"),
                         DEFAULTS["m"])
        self.corpus = corpus if isinstance(corpus, data.Corpus) else data.load_corpus(corpus)
        self.B = int(batch_size or d["batch"])
        self.T = int(seq_len or self.config.context)
        if self.T > self.config.context:
            raise ValueError(f"seq_len {self.T} is longer than the context {self.config.context} "
                             f"of config {self.config.name!r}")
        self.total_steps = int(steps)
        if isinstance(accumulate, bool) or not isinstance(accumulate, (int, np.integer)) \
                or accumulate < 1:
            raise ValueError(f"accumulate: expected a whole number of micro-batches >= 1, "
                             f"got {accumulate!r}")
        self.accumulate = int(accumulate)  # micro-batches of B sequences per optimiser step
        self._grad_sum = None
        self.seed = int(seed)
        self.max_lr = float(lr or d["lr"])
        default_warmup = max(1, min(100, self.total_steps // 10))
        self.warmup = int(warmup if warmup is not None else default_warmup)
        self.model = GPT(self.config, o.backend, seed=self.seed, threads=o.threads,
                         arena=o.arena, pool=o.pool)
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer: expected one of {', '.join(OPTIMIZERS)}, "
                             f"got {optimizer!r}")
        self.opt = (Muon(self.model, base_lr=self.max_lr, weight_decay=o.weight_decay,
                         clip=o.clip)
                    if optimizer == "muon" else AdamW(self.model, weight_decay=o.weight_decay,
                                                      clip=o.clip))
        self.step = 0

    def settings(self) -> dict:
        return {"config": self.config.to_dict(), "batch_size": self.B, "seq_len": self.T,
                "accumulate": self.accumulate,
                "total_steps": self.total_steps, "seed": self.seed, "lr": self.max_lr,
                "warmup": self.warmup, "weight_decay": self.opt.wd, "clip": self.opt.clip,
                "backend": self.model.backend, "optimizer": self.opt.name,
                "pool": bool(getattr(self.model.ops.threads, "pool", False)),
                "corpus": self.corpus.describe()}

    # --8<-- [start:train_step]
    def train_step(self) -> dict:
        A, B = self.accumulate, self.B
        x, y = data.batch(self.corpus.train, self.seed, self.step, A * B, self.T)
        lr = lr_at(self.step, self.total_steps, self.max_lr, self.warmup)
        if A == 1:
            loss = self.model.forward(x, y)
            self.model.backward()
        else:
            loss = self._accumulate(x, y)
        norm = self.opt.step(lr)
        self.step += 1
        return {"step": self.step, "loss": loss, "lr": lr, "grad_norm": norm}
    # --8<-- [end:train_step]

    # --8<-- [start:accumulate]
    def _accumulate(self, x, y) -> float:
        """Forward and backward over A micro-batches of B sequences, the gradients summed,
        then averaged: the optimiser sees the gradient of one batch of A B sequences (the
        mean of equal-sized means is the mean), with the activations of a batch of B and one
        more gradient-sized buffer."""
        A, B, g = self.accumulate, self.B, self.model.grad_flat
        if self._grad_sum is None:
            self._grad_sum = self.model.xp.empty_like(g)
        total, loss = self._grad_sum, 0.0
        for i in range(A):
            loss += self.model.forward(x[i * B:(i + 1) * B], y[i * B:(i + 1) * B])
            self.model.backward()
            if i == 0:
                np.copyto(total, g)
            else:  # the model's own element-wise add: on its threads, and its pool
                self.model.ops.add(total, g, total)
        self.model.xp.multiply(total, 1.0 / A, out=g)
        return loss / A
    # --8<-- [end:accumulate]

    def evaluate(self, batches: int = 8) -> float:
        """Validation loss in bits per byte over fixed held-out batches."""
        total = 0.0
        for i in range(batches):
            x, y = data.val_batch(self.corpus.val, i, self.B, self.T)
            total += self.model.forward(x, y)
        return float(total / batches / LN2)  # on the GPU: the one read of the evaluation

    # ------------------------------------------------------------ checkpoints
    def save(self, folder):
        tensors = {}
        m = self.model
        for name, view in m._views(m.host(m.flat)).items():  # a model on the GPU: copied
            tensors["param." + name] = view
        for key, buf in (("adam.m.", self.opt.m), ("adam.v.", self.opt.v)):
            for name, view in m._views(m.host(buf)).items():
                tensors[key + name] = view
        if self.opt.name == "muon":
            for name, mom in self.opt.state().items():
                tensors["muon.m." + name] = mom
        s = self.settings()
        meta = {"step": self.step, "adam_t": self.opt.t, **s,
                "sampler": {"kind": "seed+step", "seed": self.seed, "next_step": self.step}}
        return checkpoint.save(folder, tensors, meta)

    @classmethod
    def resume(cls, folder, *, corpus=None, **how) -> "Trainer":
        """The run saved in ``folder``, to go on with: what it computes from its checkpoint,
        how (``how``: TrainSettings' fields so marked, backend, threads, pool) from the
        caller."""
        tensors, meta = checkpoint.load(folder)
        where = Path(folder) / checkpoint.INDEX
        try:
            cfg = get_config(meta["config"])
            # a checkpoint of this format has each of them (optimizer and accumulate came later)
            missing = [k for k in ("batch_size", "total_steps", "seed", "lr", "warmup",
                                   "weight_decay", "clip", "seq_len") if k not in meta]
            if missing:
                raise KeyError(missing[0])
            t = cls(cfg, corpus=corpus, settings=TrainSettings.saved(meta, **how))
        except (KeyError, TypeError, ValueError) as e:
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
        muon = t.opt.name == "muon"
        if muon:
            expected.update({"muon.m." + k: m.shapes[k] for k in m.config.hidden_matrices()})
        checkpoint.check_tensors(tensors, expected, where)
        for name in m.params:
            m.upload(m.params[name], tensors["param." + name])
        for key, buf in (("adam.m.", t.opt.m), ("adam.v.", t.opt.v)):
            for name, view in m._views(buf).items():
                m.upload(view, tensors[key + name])
        if muon:
            t.opt.load_state({n: tensors["muon.m." + n] for n in m.config.hidden_matrices()})
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
            # read now: the log and the bar show them (on the GPU: a wait for the step)
            out["loss"], out["grad_norm"] = float(out["loss"]), float(out["grad_norm"])
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


def list_configs() -> str:
    lines = ["config  d_model layers heads context   params  GFLOP/token (train)"]
    for c in CONFIGS.values():
        lines.append(f"{c.name:6s} {c.d_model:8d} {c.n_layer:6d} {c.n_head:5d} {c.context:7d} "
                     f"{c.n_params() / 1e6:7.2f}M {c.flops_per_token() / 1e9:10.3f}")
    return "\n".join(lines)


def estimate_steps(config, corpus, minutes, settings: TrainSettings | None = None,
                   **kw) -> int:
    """Steps that fit in ``minutes``, from the median of 4 steps of a throwaway model trained
    with ``settings`` (and ``kw``, TrainSettings' fields)."""
    probe = Trainer(config, corpus=corpus, settings=settings, **{**kw, "steps": 10})
    # the loss read: on the GPU a step returns before its kernels are done
    per_step = measure(lambda: float(probe.train_step()["loss"]), repeats=4, warmup=1).median
    return max(1, int(60 * minutes / per_step))


# --8<-- [start:rungs]
# The climb: each rung is the step of the rung before it with one more switch on: Trainer
# arguments, and "block" for the model's block.
NB = "notebooks/03_training.py:# ## The climb, rung by rung"  # the cell that shows them all
RUNGS = Ladder("chapter 3's climb", [
    Rung(0, "numpy", "the numpy reference", run={"backend": "numpy"},
         where=Where("smallem/training/ops.py:numpy_linear",
                     "chapters/3-training.md:## One training step, three ways", NB,
                     "tests/test_model.py::test_numpy_and_kernels_agree_after_one_step")),
    Rung(1, "kernels", "kernels (f32), each step allocating its buffers",
         run={"backend": "kernels", "arena": False},
         where=Where("smallem/training/ops.py:kernel_linear", "chapters/3-training.md:## The climb", NB,
                     "tests/test_model.py::test_a_step_allocating_per_call_gives_the_arenas_numbers")),
    Rung(2, "pool", "a thread pool of our own",
         run={"backend": "kernels", "arena": False, "pool": True},
         where=Where("kernels_c/pool.c:pool_fork_join", "chapters/3-training.md:### Threads that wait",
                     NB, "tests/test_pool.py::test_a_step_on_the_pool_gives_openmps_bits")),
    Rung(3, "arena", "one arena for every buffer", run={"backend": "kernels", "pool": True},
         where=Where(None, "chapters/3-training.md:### One arena for every buffer", NB,
                     "tests/test_model.py::test_workspace_is_one_arena_of_the_size_the_config_gives")),
    Rung(4, "tiles", "attention in tiles", run={"backend": "flash", "pool": True},
         where=Where("kernels_c/layers/flash.c:flash_forward",
                     "chapters/3-training.md:### Attention without the $T \\times T$ matrix", NB,
                     "tests/test_model.py::test_flash_attention_against_the_reference")),
    Rung(5, "fused", "fused element-wise layers", run={"backend": "fused", "pool": True},
         where=Where("kernels_c/layers/fused.c:bias_gelu",
                     "chapters/3-training.md:### Fused element-wise layers", NB,
                     "tests/test_model.py::test_fused_kernels_match_their_compositions")),
    Rung(6, "bf16", "bf16 products", run={"backend": "bf16", "pool": True},
         where=Where("smallem/training/ops.py:bf16_products", "chapters/3-training.md:### bf16 products",
                     NB, "tests/test_model.py::test_bf16_step_matches_the_rounded_reference")),
    Rung(7, "modern", "the modern block, Muon",
         run={"backend": "bf16", "pool": True, "block": "modern", "optimizer": "muon"},
         where=Where("kernels_c/layers/modern.c:rmsnorm",
                     "chapters/3-training.md:### The modern block, and Muon", NB,
                     "tests/test_train.py::test_muon_matches_its_definition")),
])
# --8<-- [end:rungs]



def rung_settings(i) -> dict:
    """Rung ``i``'s switches (a copy; ``i`` its place or its name), or a clear error for a
    rung that is not one."""
    if isinstance(i, str):
        return dict(RUNGS[i].run)
    if isinstance(i, bool) or not isinstance(i, int):
        raise TypeError(f"rung: expected an int or a rung's name, got {i!r}")
    if not 0 <= i < len(RUNGS):
        raise ValueError(f"rung: expected one of 0..{len(RUNGS) - 1}, got {i}")
    return dict(RUNGS[i].run)


def rung_config(cfg, kw: dict):
    """The config a rung trains: ``cfg``, or its modern-block twin."""
    block = kw.get("block", "gpt2")
    if block == cfg.block:
        return cfg
    return dataclasses.replace(cfg, name=f"{cfg.name}-{block}", block=block)


def rung_trainer(i, cfg, **trainer_kw) -> Trainer:
    kw = rung_settings(i)
    c = rung_config(cfg, kw)
    kw.pop("block", None)
    return Trainer(c, **trainer_kw, **kw)
