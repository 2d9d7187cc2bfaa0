"""Chapter 3's measurements: the step on each path, the climb's rungs timed in turn, the
fused kernels and the long attention each against what they replace, and a short training
run in each precision. Everything goes to two records, ``ch3.train_step`` and
``ch3.train_run``.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from smallem import checks
from smallem.training import data, layers
from smallem.product import gemm
from smallem.plumbing import pool
from smallem.training.model import GPT, FlashOps, FusedOps, KernelOps, AttnCache, get_config
from smallem.cpu.timing import Timing, measure, measure_interleaved, quick_mode
from smallem.training.train import Trainer, estimate_steps, newton_schulz_flops, train
# the climb's rungs live in the library beside the trainer they configure, as chapter 2's
# LADDER beside the GEMM and chapter 4's RUNGS beside the decoder
from smallem.training.train import RUNGS, rung_config, rung_settings, rung_trainer  # noqa: F401
from .. import records
from . import torch_child

RECORD_STEP = "ch3.train_step"
RECORD_RUN = "ch3.train_run"

AT = {r.name: r.index for r in RUNGS}  # each rung's place, by its name: what records keep


F32_TOP = AT["fused"]  # the last f32 rung: the one the chapter's f32 target is about


def _torch_step(cfg, B, T, threads, corpus, autocast):
    import torch

    from smallem.training import torch_gpt
    torch.set_num_threads(threads)
    init = GPT(cfg, "numpy", seed=0)
    tr = torch_gpt.TorchTrainer(init.params, cfg, autocast=autocast)
    i = [0]

    def step():
        x, y = data.batch(corpus.train, 0, i[0], B, T)
        i[0] += 1
        tr.step(x, y)
    return step


def measure_step(config, backend: str, B: int, threads: int, *, warmup=1, repeats=3) -> dict:
    """Seconds of one full training step (forward, backward, AdamW) for one backend, or for
    PyTorch eager ("torch") and PyTorch with bf16 autocast ("torch-bf16")."""
    cfg = get_config(config)
    corpus = data.load_corpus()
    T = cfg.context
    if backend in ("torch", "torch-bf16"):
        step = _torch_step(cfg, B, T, threads, corpus, autocast=backend == "torch-bf16")
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
             "bias_residual": "residual adds", "rmsnorm": "LayerNorm",
             "rmsnorm_backward": "LayerNorm", "swiglu": "GELU (+ bias)",
             "swiglu_backward": "GELU (+ bias)",
             # a product not inside a layer's method is the optimiser's: Muon's Newton-Schulz
             "matmul": "Muon's Newton-Schulz"}
MUON_GROUP = OP_GROUPS["matmul"]


def profile_step(trainer: Trainer, steps: int = 2, calls: dict | None = None) -> dict[str, float]:
    """Seconds per step spent in each op (after one warm-up step); "other" is the rest.
    ``calls``, if given, receives each op's calls per step."""
    ops = trainer.model.ops
    spent = dict.fromkeys(OP_GROUPS, 0.0)
    count = dict.fromkeys(OP_GROUPS, 0)
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
                    count[name] += 1
        return run

    for name in OP_GROUPS:
        setattr(ops, name, timed(name, getattr(ops, name)))
    try:
        trainer.train_step()
        for k in spent:
            spent[k], count[k] = 0.0, 0
        t0 = time.perf_counter()
        for _ in range(steps):
            trainer.train_step()
        total = (time.perf_counter() - t0) / steps
    finally:
        for name in OP_GROUPS:
            delattr(ops, name)  # back to the class's methods
    out = {k: v / steps for k, v in spent.items()}
    out["other"] = max(0.0, total - sum(out.values()))
    if calls is not None:
        calls.update({k: v // steps for k, v in count.items() if v})
    return out


def regions_per_step(trainer: Trainer) -> int:
    """Parallel regions one training step forks on the pool (its counter, before and after
    a step): what rung 2's pool saves is this many times the fork-join it saves."""
    _, lib = pool.lib()
    before = lib.pool_regions()
    trainer.train_step()
    return int(lib.pool_regions() - before)


class _Guarded:
    """A peer's step in the paired rounds: where it fails, the failure is kept in ``why``
    and its later calls return at once, so that our rungs' rounds go on and the peer's
    times are thrown away (a peer never stops the book)."""

    def __init__(self, step):
        self.step, self.why = step, None

    def __call__(self):
        if self.why is None:
            try:
                self.step()
            except (RuntimeError, OSError, EOFError) as e:
                self.why = str(e).strip()[-300:] or type(e).__name__


def _measure_climb(rec, cfg, B, threads, quick, corpus):
    """Every built rung after the numpy reference, one trainer each, timed in turn: the
    "rung_step" results (tokens/s, every sample kept for the signed-rank test)."""
    from threadpoolctl import threadpool_limits

    time.sleep(0.5)
    trainers = {i: rung_trainer(i, cfg, corpus=corpus, batch_size=B, steps=100, threads=threads)
                for i, kw in ((r.index, r.run) for r in RUNGS) if kw["backend"] != "numpy"}
    fns = {i: t.train_step for i, t in trainers.items()}
    children = {}
    for peer in PEERS:  # PyTorch in the same rounds, in a process of its own, where installed
        try:
            children[peer] = torch_child.Step(cfg.name, B, cfg.context, threads,
                                              peer == "torch-bf16")
            fns[peer] = _Guarded(children[peer])
            # the peer as it ran: version, threads, CPU kernels, oneDNN and AMX (the page's)
            rec.data["settings"].setdefault("torch_config", {}).update(children[peer].facts)
        except (ImportError, RuntimeError, OSError) as e:  # missing, or died: said on the page
            rec.data["settings"].setdefault("missing", {})[peer] = str(e)[-300:]
    rec.data["settings"]["torch_process"] = "its own (smallem.book.ch3.torch_child)"
    try:
        with threadpool_limits(threads):
            # no pause between samples: a pause costs an untimed call each, and the few
            # milliseconds PyTorch's threads spin after a step are lost in a step of a second
            # a PyTorch step that far behind the rung it is judged against is timed once
            # (on a CPU without a bf16 instruction, autocast's step takes a minute)
            far = {p: r for p, r in PEER_AGAINST.items() if p in fns and r in fns}
            ts = measure_interleaved(fns, repeats=2 if quick else ROUNDS, warmup=1, far=far)
    finally:
        for child in children.values():
            child.close()
    for peer in PEERS:
        if peer in ts and fns[peer].why:  # the peer died in the rounds: its times are void
            ts.pop(peer)
            rec.data["settings"].setdefault("missing", {})[peer] = fns[peer].why
        if peer in ts:
            t = ts.pop(peer)
            rec.add("step", "tokens/s", t.rate(B * cfg.context),
                    seconds={**t.stats(), "samples": list(t.seconds)}, backend=peer)
    for i, t in ts.items():
        c = trainers[i].config
        rec.add("rung_step", "tokens/s", t.rate(B * cfg.context),
                seconds={**t.stats(), "samples": list(t.seconds)}, rung=i, what=rung_label(i),
                config=c.name, flops_per_token=c.flops_per_token(), **rung_settings(i))
    return trainers


# --8<-- [start:accumulate]
def muon_accumulate(cfg, B: int, T: int, margin: float) -> int:
    """Micro-batches of B x T tokens per optimiser step at which Muon fits ``margin``: its
    Newton-Schulz costs the arithmetic of ``equiv`` tokens of training whatever the batch,
    so at equal speed a step of n tokens with Muon takes (n + equiv) / n of one without,
    within the margin from n = equiv (1 - margin) / margin. Half again that many tokens
    leaves room for the block's own differences (SwiGLU's third matrix, Muon's
    element-wise passes)."""
    c = rung_config(cfg, rung_settings("modern"))
    equiv = newton_schulz_flops(c) / c.flops_per_token()
    return max(1, math.ceil(1.5 * equiv * (1 - margin) / margin / (B * T)))
# --8<-- [end:accumulate]


def _measure_accumulated(rec, trainers, A, B, T, quick):
    """Rungs 6 and 7 (GPT-2 with AdamW, the modern block with Muon, both bf16) with ``A``
    micro-batches per optimiser step, timed in turn ("accumulated_step"): what the
    optimiser's cost per step comes to at a batch Muon is used at. The climb's trainers,
    warm already (the first sample also touches the gradient sum's buffer for the first
    time: one gradient's worth of pages against A steps' work); each is set back to one
    micro-batch after."""
    pair = {i: trainers[i] for i in (AT["bf16"], AT["modern"]) if i in trainers}
    for t in pair.values():
        t.accumulate = A
    try:
        ts = measure_interleaved({i: t.train_step for i, t in pair.items()},
                                 repeats=2 if quick else ACCUMULATED_ROUNDS, warmup=0)
    finally:
        for t in pair.values():
            t.accumulate = 1
    for i, t in ts.items():
        rec.add("accumulated_step", "tokens/s", t.rate(A * B * T),
                seconds={**t.stats(), "samples": list(t.seconds)}, rung=i, accumulate=A,
                tokens=A * B * T, config=pair[i].config.name, optimizer=pair[i].opt.name)


ACCUMULATED_ROUNDS = 5  # steps of ~10^4 tokens: 5 of 5 is the fewest rounds a one-sided test can pass
MODERN_MARGIN = 0.15    # the modern bf16 step with Muon, at most this much slower than GPT-2's
ROUNDS = 11  # a round of the climb is ~10 s; at 7 the rounds could not show a 10 % change on Zen 4
PEERS = ("torch", "torch-bf16")  # PyTorch eager, in f32 and with bf16 autocast
PEER_AGAINST = {"torch": F32_TOP, "torch-bf16": AT["bf16"]}  # the rung each peer's target judges


# each fused kernel's op, as the profile counts its calls
FUSED_OPS = {"bias + GELU": "bias_gelu", "GELU backward + bias gradient": "gelu_backward_bias",
             "bias + residual + LayerNorm": "residual_layernorm", "bias + residual": "bias_residual"}
# --8<-- [start:fused_bytes]
# The floats each version reads and writes per element of its tensor (N x width): what the
# code names, counting a write as one pass (a CPU that reads a line before writing it
# moves more); and the fused kernel's floating-point operations per element, counted from
# its code (an exp is about 20: the clamp, the range reduction, six steps of the polynomial
# as multiply-adds of two, the scaling).
FUSED = {  # op: (tensor width in d, passes unfused, passes fused, operations per element)
    "bias + GELU": (4, 4, 3, 29),                    # u in+out, u in, g out | u in+out, g
    "GELU backward + bias gradient": (4, 4, 3, 38),  # x, dy in, dx out, dx in | x, dy, dx
    "bias + residual + LayerNorm": (1, 7, 4, 10),    # t in+out; x, t in, mid out; mid, out
    "bias + residual": (1, 5, 3, 2),                 # t in+out; x, t in, out | x, t in, out
}
# --8<-- [end:fused_bytes]


def _fused_calls(name, ops, N, C, rng):
    W = C * FUSED[name][0]
    f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
    x, t, u, g, bias, w, b = f(N, W), f(N, W), f(N, W), f(N, W), f(W), f(W), f(W)
    mid, out, mean, rstd, db = f(N, W), f(N, W), f(N), f(N), f(W)
    return {"bias + GELU": lambda: ops.bias_gelu(u, bias, g),
            "GELU backward + bias gradient": lambda: ops.gelu_backward_bias(u, t, g, db),
            "bias + residual + LayerNorm": lambda: ops.residual_layernorm(
                x, t, bias, mid, w, b, out, mean, rstd),
            "bias + residual": lambda: ops.bias_residual(x, t, bias, out)}[name]


def _measure_fused(rec, cfg, B, threads, quick):
    """Each fused kernel timed in turn with the composition it replaces, on the shapes of
    the benchmark's step: "fused_op" results with the bytes each version moves."""
    N, C = B * cfg.context, cfg.d_model
    rng = np.random.default_rng(0)
    for name, (width, unfused, fused, _) in FUSED.items():
        fns = {False: _fused_calls(name, KernelOps(threads, pool=True), N, C, rng),
               True: _fused_calls(name, FusedOps(threads, pool=True), N, C, rng)}
        ts = measure_interleaved(fns, repeats=3 if quick else 9, warmup=1,
                                 min_sample=0.002 if quick else 0.02)
        for is_fused, t in ts.items():
            nbytes = 4 * N * C * width * (fused if is_fused else unfused)
            rec.add("fused_op", "calls/s", t.rate(1.0),
                    seconds={**t.stats(), "samples": list(t.seconds)}, op=name, fused=is_fused,
                    bytes=nbytes, tensor_bytes=4 * N * C * width)


def _measure_long_attention(rec, cfg, threads, quick):
    """The attention (forward + backward) of one sequence of ``T`` tokens with the config's
    heads, as matrices and in tiles, timed in turn; and the memory each keeps beyond q, k,
    v and o: the (T, T) probabilities and their gradient, against the row statistics and
    the tiles' scratch."""
    T = 256 if quick else 2048
    H, hd, B = cfg.n_head, cfg.head_dim, 1
    rng = np.random.default_rng(0)
    qkv = rng.normal(size=(B * T, 3 * cfg.d_model)).astype(np.float32)
    dout = rng.normal(size=(B * T, cfg.d_model)).astype(np.float32)
    out, dqkv = np.empty_like(dout), np.empty_like(qkv)
    fns, extra = {}, {}
    for kind, ops in (("matrices", KernelOps(threads, pool=True)),
                      ("tiles", FlashOps(threads, pool=True))):
        z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
        shared = {k: z(B, H, T, hd) for k in ("do", "dq", "dk", "dv")}
        scores = kind == "matrices"
        shared["dp"] = z(B, H, T, T) if scores else z(0)
        a = AttnCache(z, B, H, T, hd, shared, scores)

        def run(ops=ops, a=a):
            ops.attention(qkv, out, a)
            ops.attention_backward(dout, dqkv, a)
        fns[kind] = run
        run()
        extra[kind] = 4 * (a.p.size + a.dp.size + (0 if scores else a.lse.size
                                                   + ops.flash_scratch(T, hd).size))
    ts = measure_interleaved(fns, repeats=2 if quick else ROUNDS, warmup=1)
    for kind, t in ts.items():
        rec.add("long_attention", "calls/s", t.rate(1.0),
                seconds={**t.stats(), "samples": list(t.seconds)},
                attention=kind, T=T, heads=H, head_dim=hd, extra_bytes=extra[kind])


# --8<-- [start:fork_join_cases]
def fork_join_cases(cores: int, quick: bool):
    """(what, kind, threads, spin, reps): the fork-joins chapter 3 times. Spin is the pool's
    waiting policy (pool.SPIN_NS, 0: sleep at once, None: spin forever); reps per sample."""
    r = 200 if quick else 20000
    return [("pool", "pool", cores, pool.SPIN_NS, r),
            ("OpenMP", "openmp", cores, None, r),
            ("a thread created per call", "create", cores, None, r // 10),
            ("pool, sleeping at once", "pool", cores, 0, r),
            ("pool, spinning forever", "pool", cores, None, r),
            ("pool, one thread more than cores", "pool", cores + 1, pool.SPIN_NS, r // 10),
            ("OpenMP, one thread more than cores", "openmp", cores + 1, None, r // 10),
            ("pool, one more, spinning forever", "pool", cores + 1, None, max(5, r // 400))]
# --8<-- [end:fork_join_cases]


def _measure_fork_join(rec, threads, quick):
    """Microseconds per fork-join of an empty region ("fork_join" results), and per barrier
    inside one ("barrier"), five samples each."""
    old = pool.set_spin(pool.SPIN_NS)
    try:
        for what, kind, n, spin, reps in fork_join_cases(threads, quick):
            if kind == "pool":
                pool.set_spin(spin)
            t = Timing([pool.fork_join_seconds(kind, n, reps) for _ in range(3 if quick else 5)])
            pool.set_spin(pool.SPIN_NS)
            rec.add("fork_join", "us", Timing([1e6 * x for x in t.seconds]).stats(), what=what,
                    kind=kind, threads=n, spin_ns=spin, reps=reps)
        for kind in ("pool", "openmp"):
            reps = 2000 if quick else 200000
            t = Timing([pool.barrier_seconds(kind, threads, reps) for _ in range(3 if quick
                                                                               else 5)])
            rec.add("barrier", "us", Timing([1e6 * x for x in t.seconds]).stats(), kind=kind,
                    threads=threads, reps=reps)
    finally:
        pool.set_spin(old)


# The training runs of config s, each for the same wall-clock budget: GPT-2 in f32 (rung
# 5) and in bf16 (rung 6), and the modern block in bf16 with Muon (rung 7).
RUNS = (("f32", AT["fused"]), ("bf16", AT["bf16"]), ("modern", AT["modern"]))
RUN_MINUTES = 1.0  # of training each run (evaluations not counted): the curves, not a model to keep


# the rungs whose step the real run's size is timed on, beside the run's own (rung 5):
# the matrices' attention, the attention in tiles, and the fused layers on top of the tiles
RUN_SIZE_RUNGS = (AT["arena"], AT["tiles"], AT["fused"])


def _run_size_steps(threads, quick, batch, corpus) -> list:
    """The climb's f32 rungs from the arena to the fused layers at the real run's size (config
    s, its batch), timed in turn: the climb above is the xl model's, and a step of another
    size need not climb the same way. [(rung, Timing, tokens per step)]."""
    cfg = get_config("s")
    trainers = {i: rung_trainer(i, cfg, corpus=corpus, batch_size=batch, steps=100,
                                threads=threads) for i in RUN_SIZE_RUNGS}
    ts = measure_interleaved({i: t.train_step for i, t in trainers.items()},
                             repeats=2 if quick else ROUNDS, warmup=1)
    return [(i, ts[i], trainers[i].B * trainers[i].T) for i in RUN_SIZE_RUNGS]


def _runs(threads, quick, progress):
    corpus = data.load_corpus()
    minutes = 0.1 if quick else RUN_MINUTES
    batch = 2 if quick else None
    out = {}
    for name, rung in RUNS:
        time.sleep(0.5)
        kw = dict(corpus=corpus, batch_size=batch, threads=threads)
        steps = 6 if quick else _estimate_rung_steps(rung, minutes, **kw)
        t = rung_trainer(rung, get_config("s"), steps=steps, **kw)
        h = train(t, eval_every=max(1, steps // 10), eval_batches=2 if quick else 8,
                  sample_bytes=20 if quick else 400, progress=progress)
        out[name] = (t, h)
    return out, minutes


def _estimate_rung_steps(rung, minutes, **kw) -> int:
    """Steps of rung ``rung``'s s model that fit in ``minutes`` (train.estimate_steps)."""
    c = rung_config(get_config("s"), rung_settings(rung))
    settings = {k: v for k, v in rung_settings(rung).items() if k != "block"}
    return estimate_steps(c, kw.pop("corpus"), minutes, **kw, **settings)


def _torch_version():
    try:
        import torch
    except ImportError:
        return None
    return torch.__version__


def bench_train(quick: bool | None = None, progress: bool = True, threads: int | None = None):
    """Chapter 3's measurements (see the module's docstring)."""
    quick = quick_mode() if quick is None else quick
    threads = checks.threads(threads)
    cfg_name, B = ("s", 2) if quick else ("xl", 2)
    cfg = get_config(cfg_name)
    repeats = 2 if quick else 3
    corpus = data.load_corpus()
    step_rec = records.Record(RECORD_STEP, settings={
        "quick": quick, "config": cfg.to_dict(), "batch_size": B, "seq_len": cfg.context,
        "threads": threads, "flops_per_token": cfg.flops_per_token(),
        "params": cfg.n_params(), "warmup_steps": 1, "timed_steps": repeats,
        "numpy": np.__version__, "torch": _torch_version(),
        "flash_tile": layers.flash_tile(cfg.head_dim), "bf16_path": gemm.bf16_path(),
        "spin_ns": pool.SPIN_NS,
        "rungs": [[r.index, r.what, r.run] for r in RUNGS]})
    # OpenBLAS's and PyTorch's worker threads spin for a while after their last call: a
    # pause keeps them from competing with the next measurement for the cores.
    time.sleep(0.5)
    # the numpy path is the slow one: one timed step fewer keeps the run short
    r = measure_step(cfg, "numpy", B, threads, repeats=max(2, repeats - 1))
    secs = r["seconds"]
    step_rec.add("step", "tokens/s", Timing([r["tokens"] / s for s in secs]).stats(),
                 seconds=Timing(secs).stats(), backend="numpy")
    if progress:
        print(f"{cfg_name} step, numpy: {r['tokens'] / statistics.median(secs):9.0f} tokens/s "
              f"({statistics.median(secs):.2f} s per step of {r['tokens']} tokens)")
    time.sleep(0.5)
    trainers = _measure_climb(step_rec, cfg, B, threads, quick, corpus)
    # where the time goes: before the climb's f32 kernels, after them, after bf16, at the top
    for i in sorted({AT["arena"], F32_TOP, AT["bf16"], max(trainers)} & set(trainers)):
        calls: dict = {}
        prof = profile_step(trainers[i], steps=1 if quick else 2, calls=calls)
        for op, sec in prof.items():
            step_rec.add("op_seconds", "s", Timing([sec]).stats(),
                         backend=trainers[i].model.backend, rung=i, op=op)
        step_rec.data["settings"].setdefault("op_calls", {})[str(i)] = calls
    if 2 in trainers:
        step_rec.data["settings"]["regions_per_step"] = regions_per_step(trainers[2])
    A = muon_accumulate(cfg, B, cfg.context, MODERN_MARGIN)
    step_rec.data["settings"]["accumulate"] = A
    _measure_accumulated(step_rec, trainers, A, B, cfg.context, quick)
    del trainers
    time.sleep(0.5)
    _measure_fork_join(step_rec, threads, quick)
    _measure_fused(step_rec, cfg, B, threads, quick)
    _measure_long_attention(step_rec, cfg, threads, quick)
    step_rec.save()

    runs, minutes = _runs(threads, quick, progress)
    sizes = _run_size_steps(threads, quick, runs[RUNS[0][0]][0].B, data.load_corpus())
    settings = {"quick": quick, "threads": threads, "minutes": minutes, "runs": {}}
    for name, (t, h) in runs.items():
        elapsed = np.cumsum(h["step_seconds"]).tolist()  # training time, evaluation not counted
        settings["runs"][name] = {
            **t.settings(), "curve": {"step": h["step"], "loss": h["loss"], "seconds": elapsed,
                                      "val_step": h["val_step"], "val_bpb": h["val_bpb"]},
            "sample": h.get("sample", "")}
    first = runs[RUNS[0][0]][0]
    settings.update(first.settings())  # the f32 run's settings stand for the record's own
    run_rec = records.Record(RECORD_RUN, settings=settings)
    for name, (t, h) in runs.items():
        run_rec.add("final_val_bpb", "bits/byte", Timing([h["val_bpb"][-1]]).stats(), run=name)
        run_rec.add("run_seconds", "s", Timing([h["seconds"]]).stats(), run=name)
        tok = [t.B * t.T / s for s in h["step_seconds"][1:] or h["step_seconds"]]
        run_rec.add("train_tokens_per_s", "tokens/s", Timing(tok).stats(), run=name)
    for i, t, tokens in sizes:
        run_rec.add("run_size_step", "tokens/s", t.rate(tokens),
                    seconds={**t.stats(), "samples": list(t.seconds)}, rung=i)
    run_rec.save()
    return step_rec, run_rec


def rung_label(i: int) -> str:
    return RUNGS[i].what


def mfu(tokens_per_s: float, flops_per_token: float, peak_gops: float | None) -> float:
    return math.nan if not peak_gops else tokens_per_s * flops_per_token / 1e9 / peak_gops
