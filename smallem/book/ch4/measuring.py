"""Chapter 4's measurements: the decode ladder on one model, llama.cpp (and PyTorch) in
the same rounds, the L3 study over model sizes chosen from this machine's caches, the
cost of the threads' fork-joins per token, and the quality of int8 on a model trained
here. Two records: ``ch4.decode`` and ``ch4.quality``.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np

from smallem import checks
from smallem.training import data
from smallem.generating import decode, gguf_export
from smallem.cpu import machine_info, timing
from smallem.plumbing import pool
from smallem.plumbing.build import ROOT
from smallem.training.model import GPT, Config, get_config
from smallem.cpu.timing import Timing, quick_mode
from .. import ch1, records
from . import llama, torch_peer

RECORD = "ch4.decode"
RECORD_QUALITY = "ch4.quality"
LADDER_CONFIG = "xl"  # chapter 3's largest model: its int8 weights fit an L3 of 32 MiB
# The prompt every decode measurement starts from, then the tokens fed one by one.
PROMPT = list(b"def measure(fn, *, repeats=5):\n    \"\"\"Time fn() and keep every sample.")
FEED = list(b"\n    out = []\n    for _ in range(repeats):\n        t0 = time.perf_counter()\n")
PAUSE = 0.05          # seconds before each case's turn
ROUNDS = 7            # rounds, each case once per round: 7 of 7 pass the signed-rank test, 6 of 7 where the 7th is closest
STUDY_LAYERS = 8      # the L3 study's models: 8 blocks, width d from the target size
STUDY_TOP = 8         # ... from half the cores' L2 to STUDY_TOP times the L3
SAMPLE = {"temperature": 0.8, "seed": 0}  # the chapter's sample of the int8 generator
PROMPTS = (b"def ", b"import os\nimport sys\n\n\nclass ", b"    for i in range(")  # quality


def _steps(dec, tokens):
    for t in tokens:
        dec.step(t)


def _rounds(cases: dict, rounds: int) -> dict:
    """Each case is (setup, timed): the shared harness (timing.measure_interleaved) calls
    each case's setup untimed before its timed call, a pause before each, the cases in
    turn, forwards in even rounds and backwards in odd ones (see "How we measure")."""
    return timing.measure_interleaved({k: timed for k, (_, timed) in cases.items()},
                                      setup={k: setup for k, (setup, _) in cases.items()},
                                      repeats=rounds, warmup=0, pause=PAUSE)


def _add(rec, name, timing: Timing, tokens: int, **params):
    per = Timing([s / tokens for s in timing.seconds])  # seconds per token, per round
    rec.add(name, "tokens/s", per.rate(1.0), seconds={**per.stats(), "samples": per.seconds},
            **params)


def _decode_case(dec, feed):
    return (lambda: (dec.reset(), dec.prefill(PROMPT)), lambda: _steps(dec, feed))


def _prefill_case(dec, prompt):
    return (dec.reset, lambda: dec.prefill(prompt))


LLAMA_REPS = 2  # llama-bench repetitions per round, of which the last is kept: steady state


def _llama_cases(tools, path: Path, threads, feed_n, prompt_n, key, cases):
    """llama-bench's tg (after PROMPT's length of cache, as ours) and pp, one sample a round.
    Each round runs LLAMA_REPS repetitions in one llama-bench process and keeps the last: the
    first repetition after llama-bench's own warm-up is often slow, and our side's samples are
    all taken after an untimed call, so steady state is compared with steady state."""
    samples = {"tg": llama.Rates(), "pp": llama.Rates()}

    def tg():
        samples["tg"].take(lambda: llama.bench(tools, path, threads, gen=feed_n,
                                               depth=len(PROMPT), reps=LLAMA_REPS)[-1])

    def pp():
        samples["pp"].take(lambda: llama.bench(tools, path, threads, prompt=prompt_n,
                                               reps=LLAMA_REPS)[-1])

    cases[(key, "tg")] = (lambda: None, tg)
    if prompt_n:
        cases[(key, "pp")] = (lambda: None, pp)
    return samples


def _add_llama(rec, samples, **params):
    for test, vals in samples.items():
        if vals:  # llama-bench's own rates, one per round
            t = Timing([1.0 / v for v in vals])
            rec.add("llama_" + test, "tokens/s", t.rate(1.0),
                    seconds={**t.stats(), "samples": t.seconds}, **params)
        elif vals.why:  # the peer died in these rounds: said on the page, never fatal
            where = ", ".join(f"{k} {v}" for k, v in params.items())
            rec.data["settings"].setdefault("missing", {})[f"llama.cpp {test} ({where})"] = vals.why


def measure_ladder(rec, threads, quick, tools, tmp: Path):
    cfg = get_config("s" if quick else LADDER_CONFIG)
    # on the pool, so that a prefill through the model's GEMM leaves no OpenMP threads
    # spinning on the cores the decode steps after it need
    model = GPT(cfg, "kernels", seed=0, threads=threads, pool=True)
    feed = FEED[:8] if quick else FEED[:64]
    long = [int(b) for b in np.resize(np.frombuffer(bytes(PROMPT + FEED), np.uint8), cfg.context)]
    rounds = 2 if quick else ROUNDS
    decs = {r.index: decode.rung_decoder(r.index, model, threads) for r in decode.RUNGS}
    decs["f32-threads"] = decode.Decoder(model, "f32", threads)  # f32 at rung 4, to compare
    # rung 0 recomputes the prefix per token: timed alone, one round, on fewer tokens
    t0 = _rounds({0: _decode_case(decs[0], feed[:8])}, 1)[0]
    _add(rec, "decode", t0, len(feed[:8]), rung=0, config=cfg.name)
    cases = {}
    for k, dec in decs.items():
        if k != 0:
            cases[(k, "tg")] = _decode_case(dec, feed)
            cases[(k, "pp")] = _prefill_case(dec, long)
    peers = {}
    if tools:
        for dtype in ("q8_0", "f32"):
            path = gguf_export.export(model, tmp / f"ladder-{dtype}.gguf", dtype)
            peers[dtype] = _llama_cases(tools, path, threads, len(feed), len(long), dtype, cases)
    missing = {}
    try:  # PyTorch's decode with a KV cache, f32 and dynamic int8: in a process of its own
        torch_s = torch_peer.measure_in_child(cfg.name, threads, PROMPT, feed, rounds, PAUSE)
    except (ImportError, RuntimeError, OSError) as e:  # missing, or died: said, never fatal
        torch_s, missing = {}, {kind: str(e).strip().splitlines()[-1][-300:] if str(e).strip()
                                else type(e).__name__ for kind in torch_peer.KINDS}
    if missing:
        rec.data["settings"]["missing"] = missing
    for kind, secs in torch_s.items():
        t = Timing(secs)
        rec.add("decode", "tokens/s", t.rate(1.0), seconds={**t.stats(), "samples": secs},
                case=kind, config=cfg.name, threads=threads)
    ts = _rounds(cases, rounds)
    for (k, test), t in ts.items():
        if k in peers:
            continue
        n = len(feed) if test == "tg" else len(long)
        params = {"rung": k} if isinstance(k, int) else {"case": k}
        if isinstance(k, int) or k == "f32-threads":
            dec = decs[k]
            params["weight_bytes"] = dec.weight_bytes if hasattr(dec, "weight_bytes") else \
                4 * matrix_params(cfg)
            params["threads"] = int(getattr(dec, "threads", threads))
            if hasattr(dec, "par_min_bytes"):
                params["par_min_bytes"] = dec.par_min_bytes
            if getattr(dec, "prefill_choice", None):  # rung 5: what the decoder measured
                params["prefill_path"] = dec._prefill_path(len(long))
                params["prefill_choice"] = {str(k): v for k, v in dec.prefill_choice.items()}
        _add(rec, "decode" if test == "tg" else "prefill", t, n, config=cfg.name, **params)
    for dtype, samples in peers.items():
        _add_llama(rec, samples, dtype=dtype, config=cfg.name)
    rec.data["settings"]["ladder"] = {"config": cfg.to_dict(), "prompt": len(PROMPT),
                                      "decode_tokens": len(feed), "prefill_tokens": len(long),
                                      "rounds": rounds, "rung0_tokens": len(feed[:8]),
                                      "llama_reps": LLAMA_REPS,
                                      "rungs": [[r.index, decode.rung_label(r.index)] for r in decode.RUNGS],
                                      "int8_instruction": decode.int8_instruction()}


def matrix_params(cfg) -> int:
    """Weights of the products one token runs through (the blocks' matrices and the head)."""
    C = cfg.d_model
    return cfg.n_layer * (4 * C * C + C * cfg.mlp_in + cfg.mlp_hidden * C) + cfg.vocab * C


def study_sizes(caches: dict, threads: int, memory: int, quick: bool,
                ends: dict | None = None) -> list[int]:
    """Widths d of the L3 study's models: int8 weights from half the cores' L2 to eight
    times the L3, each size a target in bytes, widths in steps of 64; bounded so that the
    biggest model's f32 copies (the model, its gradient buffer, the f32 tiles) take at most
    a quarter of the memory. The L2 and L3 are where chapter 1's measured plateaus end at
    ``threads`` (``ends``: level -> the largest working set inside it) where known, else the
    sizes the system reports."""
    if quick:
        return [64, 128]
    l2 = caches.get("L2_bytes", 0) * min(threads, caches.get("L2_instances", 1) or 1)
    l3 = caches.get("L3_bytes", 0)
    ends = {lv: b for lv, b in (ends or {}).items() if b == b and b > 0}
    l2, l3 = ends.get("L2", l2), ends.get("L3", l3)
    targets = [x for x in (l2 / 2, 2 * l2, l3 / 2, l3, 2 * l3, STUDY_TOP / 2 * l3, STUDY_TOP * l3)
               if x > 0]
    max_params = memory / 4 / 13  # ~13 bytes a parameter across the copies above
    widths = []
    for t in targets:
        params = min(t / 1.0625, max_params)  # Q8_0: 34 bytes per 32 weights
        d = max(64, int(round(math.sqrt(params / (12 * STUDY_LAYERS)) / 64)) * 64)
        if d not in widths:
            widths.append(d)
    return widths


def plateau_ends(threads: int) -> dict:
    """Where chapter 1's measured plateaus end at ``threads`` (level -> bytes), from its record
    in the records folder; {} without one."""
    facts = ch1.facts()
    if facts is None:
        return {}
    ext = facts[f"{ch1.read_stream(facts)}_spans"]  # the stream a decoder's weights are read at
    return {lv: span["last"] for lv, span in ext[threads if threads in ext else max(ext)].items()}


def study_config(d: int) -> Config:
    """The L3 study's model of width ``d``: heads of 64 features, a context of 128."""
    return Config(f"study-{d}", d_model=d, n_layer=STUDY_LAYERS, n_head=max(1, d // 64),
                  context=128)


STUDY_TOKENS = 32      # tokens a round of the study decodes, at most ...
STUDY_MIN_TOKENS = 8   # ... and at least
STUDY_ROUND_S = 0.2    # seconds the int8 decoder's round should last, between the two


def study_tokens(dec, top: int = STUDY_TOKENS) -> int:
    """Tokens a round of the study decodes with ``dec``, sized by need: enough that the
    all-core int8 decoder's round lasts STUDY_ROUND_S (well above the timer's and the
    scheduler's noise; the slower cases' rounds last longer), from one untimed run of a few
    tokens; between STUDY_MIN_TOKENS and ``top``. The big models need few: more would only
    repeat what the first tokens measured."""
    dec.reset()
    dec.prefill(PROMPT)
    t0 = time.perf_counter()
    _steps(dec, FEED[:4])
    per = (time.perf_counter() - t0) / 4
    return int(min(top, max(STUDY_MIN_TOKENS, math.ceil(STUDY_ROUND_S / max(per, 1e-9)))))


def measure_study(rec, threads, quick, tools, tmp: Path):
    fp = machine_info.fingerprint()
    widths = study_sizes(fp["caches"], threads, machine_info.memory_bytes(), quick,
                         plateau_ends(threads))
    top = 4 if quick else STUDY_TOKENS
    rounds = 2 if quick else ROUNDS
    tokens = {}
    for d in widths:
        cfg = study_config(d)
        model = GPT(cfg, "kernels", seed=0)
        cases = {"int8": decode.Decoder(model, "int8", threads),
                 "f32": decode.Decoder(model, "f32", threads),
                 "int8-1": decode.Decoder(model, "int8", 1)}
        feed = FEED[:top if quick else study_tokens(cases["int8"], top)]
        tokens[d] = len(feed)
        bytes_ = {k: dec.weight_bytes for k, dec in cases.items()}
        timed = {k: _decode_case(dec, feed) for k, dec in cases.items()}
        samples = None
        if tools:
            path = gguf_export.export(model, tmp / f"study-{d}.gguf", "q8_0")
            samples = _llama_cases(tools, path, threads, len(feed), 0, "llama", timed)
        ts = _rounds(timed, rounds)
        for k, t in ts.items():
            if k in cases:
                _add(rec, "study", t, len(feed), d=d, params=cfg.n_params(), kind=k, decoded=len(feed),
                     weight_bytes=bytes_[k], threads=int(cases[k].threads),
                     par_min_bytes=cases[k].par_min_bytes)
        if samples:
            _add_llama(rec, samples, study_d=d, params=cfg.n_params(), decoded=len(feed))
            path.unlink()
        del cases, timed, model
    rec.data["settings"]["study"] = {"widths": widths, "layers": STUDY_LAYERS,
                                     "decode_tokens": max(tokens.values()),
                                     "tokens": {str(d): n for d, n in tokens.items()},
                                     "round_seconds": STUDY_ROUND_S, "rounds": rounds}


FORK_JOIN_REPS = 50000  # fork-joins in a row in the one sample this record keeps


def measure_fork_join(rec, threads, quick):
    reps = 2000 if quick else FORK_JOIN_REPS
    for kind in ("pool", "openmp"):
        s = pool.fork_join_seconds(kind, threads, reps)
        rec.add("fork_join", "s", Timing([s]).stats(), kind=kind, threads=threads)


PROCESSES = 10        # fresh processes decoding the ladder's model at rung 4, timed in turn
PROCESS_ROUNDS = 15   # rounds of them
MOST_ROUNDS = max(ROUNDS, PROCESS_ROUNDS)  # "How we measure" quotes the most a comparison takes


def measure_processes(rec, threads, quick):
    """Rung 4's decoder of the ladder's model in PROCESSES fresh processes, each process one
    sample a round, in turn (:mod:`.processes`): whether every process decodes at one speed.
    A process that dies is said in the record's missing, never fatal."""
    from . import processes

    cfg = "s" if quick else LADDER_CONFIG
    n, rounds = (2, 2) if quick else (PROCESSES, PROCESS_ROUNDS)
    try:
        got = processes.measure(cfg, threads, n, rounds, PROMPT,
                                FEED[:8] if quick else FEED[:64])
    except (RuntimeError, OSError, ValueError) as e:
        rec.data["settings"].setdefault("missing", {})["fresh processes"] = str(e)[-300:]
        return
    for i, g in enumerate(got):
        _add(rec, "process_decode", Timing(g["samples"]), g["tokens"], process=i, config=cfg,
             threads=threads, rung=decode.RUNGS[processes.RUNG].index,
             par_min_bytes=g["par_min_bytes"], ahead=g["ahead"])
    rec.data["settings"]["processes"] = {"processes": n, "rounds": rounds, "config": cfg,
                                         "timed_per_turn": processes.TIMED}


def _llama_peer(threads: int) -> tuple[dict | None, str | None]:
    """llama.cpp's tools if they run here (llama.usable's short runs on chapter 4's smallest
    model in Q8_0 and Q4_0), else (None, why)."""
    tools = llama.find()
    why = llama.usable(tools, threads)
    return (None, why) if why else (tools, None)


def bench_decode(quick: bool | None = None, progress: bool = True, threads: int | None = None):
    """Chapter 4's decode record (the ladder, the peers, the L3 study, fork-joins)."""
    quick = quick_mode() if quick is None else quick
    threads = checks.threads(threads)
    tools, why = _llama_peer(threads)
    rec = records.Record(RECORD, settings={
        "quick": quick, "threads": threads, "ladder_config": LADDER_CONFIG,
        "llama_cpp": llama.peer_settings(tools),
        "torch": torch_peer.version(), "tile": 16, "qblock": 32,
        # the decoders' thread threshold and prompt path: measured once a machine and kept
        # (machine.kept), not timed anew by each decoder
        "choices_kept": True, "prompt_int8_path": _int8_path()})
    if why:  # not found, or found and unusable: the page says why
        rec.data["settings"].setdefault("missing", {})["llama.cpp"] = why
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        measure_ladder(rec, threads, quick, tools, Path(tmp))
        if progress:
            print(f"decode ladder: {time.perf_counter() - t:.0f} s", flush=True)
        t = time.perf_counter()
        measure_study(rec, threads, quick, tools, Path(tmp))
        if progress:
            print(f"L3 study: {time.perf_counter() - t:.0f} s", flush=True)
    measure_fork_join(rec, threads, quick)
    t = time.perf_counter()
    measure_processes(rec, threads, quick)
    if progress:
        print(f"fresh processes: {time.perf_counter() - t:.0f} s", flush=True)
    rec.data["settings"]["regions_per_token"] = "5 per block + 1 (four products and the " \
                                                "attention per block, then the head)"
    return rec


# ---------------------------------------------------------------- quality
QUALITY_CONFIG = "s"
QUALITY_MINUTES = 1.0
QUALITY_TOKENS = 200
CHECKPOINT = ROOT / "runs" / "book-ch4"  # kept for the reader's `smallem generate`


def val_bits_per_byte(dec, val: np.ndarray, chunks: int) -> float:
    """Mean cross-entropy in bits of each next byte over ``chunks`` fixed windows of the
    held-out text, each the model's context long, through ``dec.all_logits``."""
    T = dec.config.context
    starts = np.linspace(0, val.size - T - 2, chunks).astype(int)
    total = 0.0
    for s in starts:
        x, y = val[s:s + T].astype(np.int32), val[s + 1:s + T + 1]
        z = dec.all_logits(x).astype(np.float64)
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        total += -logp[np.arange(T), y].mean()
    return total / chunks / math.log(2)


def bench_quality(quick: bool | None = None, progress: bool = True, threads: int | None = None):
    from smallem.training.train import Trainer, estimate_steps, train

    quick = quick_mode() if quick is None else quick
    threads = checks.threads(threads)
    corpus = data.load_corpus()
    minutes = 0.05 if quick else QUALITY_MINUTES
    steps = 3 if quick else estimate_steps(QUALITY_CONFIG, corpus, minutes, threads=threads)
    t = Trainer(QUALITY_CONFIG, corpus=corpus, steps=steps, threads=threads)
    h = train(t, eval_every=max(steps, 1), sample_bytes=0)
    if not quick:
        t.save(CHECKPOINT)
    model = t.model
    chunks = 2 if quick else 24
    tokens = 20 if quick else QUALITY_TOKENS
    rec = records.Record(RECORD_QUALITY, settings={
        "quick": quick, "threads": threads, "config": model.config.to_dict(), "steps": steps,
        "minutes": minutes, "val_chunks": chunks, "greedy_tokens": tokens,
        "prompts": [p.decode() for p in PROMPTS], "corpus": corpus.describe(),
        "train_val_bpb": h["val_bpb"][-1] if h["val_bpb"] else None})
    gens = {dt: decode.Generator(model, dtype=dt, threads=threads) for dt in decode.DTYPES}
    for dt, g in gens.items():
        bpb = val_bits_per_byte(g.decoder, corpus.val, chunks)
        rec.add("val_bpb", "bits/byte", Timing([bpb]).stats(), dtype=dt)
    tools = llama.find()
    with tempfile.TemporaryDirectory() as tmp:
        path = gguf_export.export(model, Path(tmp) / "trained-f32.gguf") if tools else None
        for i, prompt in enumerate(PROMPTS):
            out = {dt: bytes(b"".join(g.generate(prompt, tokens, temperature=0)))
                   for dt, g in gens.items()}
            same = sum(a == b for a, b in zip(out["f32"], out["int8"]))
            first = next((j for j, (a, b) in enumerate(zip(out["f32"], out["int8"])) if a != b),
                         tokens)
            rec.add("greedy_agreement", "fraction", Timing([same / tokens]).stats(), prompt=i,
                    first_difference=first, f32=out["f32"].decode("utf-8", "replace"),
                    int8=out["int8"].decode("utf-8", "replace"))
            if path is not None and tools.get("simple"):
                # llama.cpp stops at the context (learned positions end there); ours slides
                n = min(tokens, model.config.context - len(prompt))
                try:
                    theirs = llama.greedy(tools, path, prompt, n)
                except llama.LlamaError as e:  # the peer failed here: said, not fatal
                    rec.data["settings"].setdefault("missing", {})["llama-simple"] = str(e)
                    path = None
                    continue
                lfirst = next((j for j, (a, b) in enumerate(zip(out["f32"][:n], theirs))
                               if a != b), min(len(theirs), n))
                rec.add("llama_greedy", "tokens", Timing([lfirst]).stats(), prompt=i,
                        compared=n, llama=theirs.decode("utf-8", "replace"))
    sample = b"".join(gens["int8"].generate(PROMPTS[1], 300, **SAMPLE))
    rec.data["settings"]["sample"] = (PROMPTS[1] + sample).decode("utf-8", "replace")
    if progress:
        print(f"quality: {steps} steps of {QUALITY_CONFIG}", flush=True)
    return rec


def _int8_path() -> str | None:
    """Where rung 5's integer prompt runs here (forward.int8_path): "vector" or "amx"."""
    from smallem.generating.forward import int8_path

    try:
        return int8_path()
    except Exception:  # noqa: BLE001 (the page then says nothing of it)
        return None


def bench_generate(quick: bool | None = None, progress: bool = True, threads=None):
    """Both of chapter 4's records (what `make book` runs as `smallem bench-generate`)."""
    rec = bench_decode(quick, progress, threads)
    rec.save()
    q = bench_quality(quick, progress, threads)
    q.save()
    return rec, q
