"""Appendix D's measurements: the scan's three rungs, the training step of the recurrent
model against the attention model of the same size at growing contexts, one decoded
token's cost against the position it decodes at, and held-out bits per byte of both after
the same training time (see "How we measure": paired rounds, in turn)."""

from __future__ import annotations

import time

import numpy as np

from smallem import checks
from smallem.cpu import timing
from smallem.cpu.timing import Timing, quick_mode
from smallem.generating import decode
from smallem.plumbing import pool
from smallem.training import data, layers
from smallem.training.model import GPT, Config, get_config
from smallem.training.train import Trainer, estimate_steps, train
from .. import records

RECORD = "recurrent.scan"
ROUNDS = 7
PAUSE = 0.05
SCAN_T, SCAN_BH = 2048, 8            # the scan's rungs: one sequence of xl's eight heads
SIZE = "m"                           # the models compared: chapter 3's m shape, both blocks
CONTEXTS = (512, 1024, 2048, 4096)   # the training step's
STEP_TOKENS = 4096                   # tokens a step at every context (batch = 4096 / T)
POSITIONS = (256, 1024, 4096, 16384)  # decode: the position a token is decoded at
FEED = 32                            # decode steps timed a sample
# decode on one core: the question is the cost against the position, and with a second
# thread the samples of a few milliseconds came out bimodal on a Zen 4 (a worker asleep
# between a step's many parallel regions, or spinning: several times a token's time), which
# no position explains
DECODE_THREADS = 1
RUN_MINUTES = 0.75                   # training time of each model for the bits per byte
BLOCKS = ("modern", "recurrent")     # attention (RMSNorm, RoPE, SwiGLU) and the recurrence


def model_config(block: str, context: int, quick: bool) -> Config:
    """The m shape (or s in quick mode) with ``block``, at ``context``."""
    c = get_config("s" if quick else SIZE)
    return Config(f"{c.name}-{block}-{context}", c.d_model, c.n_layer, c.n_head, context,
                  block=block)


def scan_rungs(rec, threads: int, quick: bool) -> None:
    """The scan's rungs, forward and backward, on the same inputs, in the same rounds."""
    T, BH, hd = (256, 4, 32) if quick else (SCAN_T, SCAN_BH, 64)
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(0, 0.3, (BH, T, hd)).astype(np.float32) for _ in range(3))
    lam = np.log(rng.uniform(0.9, 1.0, (BH, T))).astype(np.float32)
    dout = rng.normal(0, 1, (BH, T, hd)).astype(np.float32)
    chunk = layers.scan_chunk(hd)
    team = pool.team(threads)
    states = np.zeros((BH, -(-T // chunk) + 1, hd, hd), np.float32)
    o, dq, dk, dv = (np.zeros((BH, T, hd), np.float32) for _ in range(4))
    dlam = np.zeros((BH, T), np.float32)
    work = np.zeros(layers.scan_work_floats(T, hd, chunk, team), np.float32)

    def case(rung):
        def run():
            layers.scan_forward(q, k, v, lam, o, states, chunk, rung, team, work)
            layers.scan_backward(q, k, v, lam, states, dout, dq, dk, dv, dlam, chunk, rung,
                                 team, work)
        return run

    ts = timing.measure_interleaved({r: case(r) for r in layers.SCAN_RUNGS},
                                    repeats=2 if quick else ROUNDS, pause=PAUSE)
    flops = 12.0 * BH * T * hd * hd  # the definition's: 4 hd^2 a step forward, x3 with backward
    for rung, t in ts.items():
        rec.add("scan", "GFLOP/s", t.rate(flops / 1e9), seconds=_seconds(t), rung=rung, T=T,
                BH=BH, hd=hd, chunk=chunk, threads=threads if rung == "threaded" else 1,
                flops=flops)


def _seconds(t: Timing) -> dict:
    return t.stats() | {"samples": t.seconds}


def training_steps(rec, threads: int, quick: bool) -> None:
    """One training step (forward, backward) of both blocks at each context, the tokens a
    step the same at every context, in the same rounds."""
    contexts = (64, 128) if quick else CONTEXTS
    tokens = 256 if quick else STEP_TOKENS
    corpus = data.load_corpus()
    cases = {}
    for T in contexts:
        for block in BLOCKS:
            cfg = model_config(block, T, quick)
            t = Trainer(cfg, corpus=corpus, batch_size=max(1, tokens // T), steps=10**6,
                        backend="fused", threads=threads)
            cases[(block, T)] = t
    ts = timing.measure_interleaved({key: _stepper(t) for key, t in cases.items()},
                                    repeats=2 if quick else ROUNDS, pause=PAUSE)
    for (block, T), t in ts.items():
        tr = cases[(block, T)]
        rec.add("train_step", "tokens/s", t.rate(tr.B * T), seconds=_seconds(t), block=block,
                T=T, batch=tr.B, flops_per_token=tr.config.flops_per_token(T),
                params=tr.config.n_params())


def _stepper(trainer):
    """One forward and backward of the trainer's model on a fixed batch (no optimiser: its
    cost is the same for both blocks' matrices)."""
    x, y = data.val_batch(trainer.corpus.val, 0, trainer.B, trainer.T)
    m = trainer.model

    def step():
        m.forward(x, y)
        m.backward()
    return step


def _fill(dec, pos: int) -> None:
    """Stand the decoder at position ``pos``: the KV cache's first ``pos`` rows hold zeros
    instead of a prompt's keys and values, which a step reads all the same (its cost
    depends on how many there are, not on what they hold); a state holds what it holds.
    Then one untimed step, on the threads the sample runs on: it wakes them after the
    pause between samples (timing.measure_interleaved's setup stands in for its untimed
    call), so that a sample of a few milliseconds does not time a wake-up."""
    dec.reset()
    dec.pos = pos
    dec.step(0)


def decode_positions(rec, threads: int, quick: bool) -> None:
    """One token's cost at each position, both blocks, int8 weights, in the same rounds."""
    positions = (64, 256) if quick else POSITIONS
    models = {b: GPT(model_config(b, max(positions) + FEED + 2, quick), "kernels", seed=0)
              for b in BLOCKS}
    decs = {b: decode.Decoder(m, "int8", threads) for b, m in models.items()}
    feed = [int(t) for t in np.random.default_rng(1).integers(0, 256, FEED)]
    cases, setup = {}, {}
    for b, dec in decs.items():
        for p in positions:
            setup[(b, p)] = (lambda d=dec, p=p: _fill(d, p))
            cases[(b, p)] = (lambda d=dec: [d.step(t) for t in feed])
    ts = timing.measure_interleaved(cases, setup=setup, repeats=2 if quick else ROUNDS,
                                    warmup=0, pause=PAUSE)
    for (b, p), t in ts.items():
        dec, c = decs[b], models[b].config
        kv = 2 * 4 * c.n_layer * c.d_model * p if b == "modern" else 0  # f32 keys and values
        state = 2 * 4 * c.n_layer * c.n_head * c.head_dim ** 2 if b == "recurrent" else 0
        per = Timing([s / FEED for s in t.seconds])
        rec.add("decode", "tokens/s", per.rate(1.0), seconds=_seconds(per),
                block=b, position=p, weight_bytes=int(dec.weight_bytes), cache_bytes=kv + state)


def same_time_runs(rec, threads: int, quick: bool, progress: bool) -> None:
    """Both blocks trained for the same minutes on the same corpus (chapter 3's s shape and
    its context); the held-out bits per byte at the end."""
    corpus = data.load_corpus()
    minutes = 0.05 if quick else RUN_MINUTES
    for block in BLOCKS:
        cfg = get_config(f"s-{block}")
        kw = dict(corpus=corpus, batch_size=2 if quick else None, threads=threads,
                  backend="fused")
        steps = 4 if quick else estimate_steps(cfg, corpus, minutes, backend="fused",
                                               threads=threads)
        time.sleep(0.5)
        t = Trainer(cfg, steps=steps, **kw)
        t0 = time.perf_counter()
        h = train(t, eval_every=0, sample_bytes=0, progress=progress, minutes=minutes)
        seconds = time.perf_counter() - t0
        bpb = t.evaluate(2 if quick else 16)
        rec.add("run", "bits/byte", {"median": bpb, "min": bpb, "max": bpb, "n": 1}, block=block, config=cfg.name, steps=t.step,
                seconds=seconds, tokens=t.step * t.B * t.T,
                last_loss=float(h["loss"][-1]) if h["loss"] else None)


def bench_recurrent(quick: bool | None = None, progress: bool = True, threads=None):
    """Appendix D's record: the scan's rungs, the training steps, the decode, the runs."""
    quick = quick_mode() if quick is None else quick
    threads = checks.threads(threads)
    rec = records.Record(RECORD, settings={
        "quick": quick, "threads": threads, "rounds": 2 if quick else ROUNDS,
        "size": "s" if quick else SIZE, "run_minutes": 0.05 if quick else RUN_MINUTES,
        "feed": FEED, "step_tokens": 256 if quick else STEP_TOKENS,
        "decode_threads": DECODE_THREADS})
    for part in (scan_rungs, training_steps, decode_positions):
        t0 = time.perf_counter()
        part(rec, DECODE_THREADS if part is decode_positions else threads, quick)
        if progress:
            print(f"{part.__name__}: {time.perf_counter() - t0:.0f} s", flush=True)
    same_time_runs(rec, threads, quick, progress)
    return rec
