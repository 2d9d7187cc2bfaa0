"""The appendix's measurements: others' models (GGUF files at real shapes) decoded and
prompted by smallem's C forward beside llama.cpp on the same file and threads, in the same
paired rounds (see "How we measure")."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from smallem import checks
from smallem.generating import gguf_file, gguf_products
from smallem.cpu import timing
from smallem.generating.forward import PARTS, TILE_TYPE_NAMES, Blocks, Forward, Tiled, tileable
from smallem.plumbing import pool as _pool
from smallem.cpu.timing import Timing, quick_mode
from .. import records
from ..ch4 import llama
from .files import SHAPES, quantise, write_random

RECORD = "others.decode"
# (shape, type): the files; the quick mode's tiny ones
CASES = (("qwen2.5-0.5b", "Q8_0"), ("qwen2.5-0.5b", "Q4_K_M"), ("smollm2-135m", "Q4_0"))
QUICK_CASES = (("tiny-qwen2", "Q8_0"), ("tiny-llama", "Q4_0"))
PROMPT = 16        # tokens in the cache before the timed decode steps (llama-bench's -d)
FEED = 32          # decode steps timed per round (llama-bench's -n)
PP = 512           # the prompt timed (llama-bench's pp512)
ROUNDS = 7         # rounds: 5 of 5 is the fewest a one-sided test at 5 % can decide on, 6 a two-sided one
PAUSE = 0.05
# prefetch distances (bytes) timed beside the forward's own on the first file: 0 is none
AHEADS = (0, 2048, 8192, 16384)
DOT_BYTES = 256 << 10  # the arithmetic's probe: this much of a matrix, in every captured L2
LLAMA_REPS = 1     # llama-bench repetitions a round, after llama-bench's own warm-up run


def _tokens(n: int, seed: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


def _rounds(cases: dict, rounds: int) -> dict:
    return timing.measure_interleaved({k: c[1] for k, c in cases.items()},
                                      setup={k: c[0] for k, c in cases.items()},
                                      repeats=rounds, warmup=0, pause=PAUSE)


def _add(rec, name, t: Timing, tokens: int, **params):
    per = Timing([s / tokens for s in t.seconds])
    rec.add(name, "tokens/s", per.rate(1.0), seconds={**per.stats(), "samples": per.seconds},
            **params)


def _decode_case(f, prompt_ids: list, feed_ids: list, parts: list | None = None) -> tuple:
    """A decoder's case for the rounds: the prompt into its cache, then the timed steps; where
    ``parts`` is a list, each run's parts a token (Forward.parts_on, the clock on) go to it."""
    sums = f.parts_on() if parts is not None else None

    def setup():
        f.reset()
        f.forward(prompt_ids)

    def run():
        if sums is not None:
            sums[:] = 0.0
        for t in feed_ids:
            f.step(t)
        if sums is not None:
            parts.append(sums / len(feed_ids))
    return setup, run


def _llama_cases(peer: dict, tools, path: Path, threads: int, feed: int, pp: int) -> dict:
    """llama-bench's decode and prompt as cases of the rounds, their rates into ``peer``."""
    def llama_tg():
        peer["tg"].take(lambda: llama.bench(tools, path, threads, gen=feed, depth=PROMPT,
                                            reps=LLAMA_REPS)[-1])

    def llama_pp():
        peer["pp"].take(lambda: llama.bench(tools, path, threads, prompt=pp,
                                            reps=LLAMA_REPS)[-1])
    return {"llama_tg": (lambda: None, llama_tg), "llama_pp": (lambda: None, llama_pp)}


def measure_file(rec, path: Path, shape: str, qtype: str, threads: int, tools, quick: bool,
                 sweep: bool = False):
    """One file's decode and prompt, ours and llama.cpp's, in the same rounds; with them our
    decode without its prefetch (and, where ``sweep``, at each of :data:`AHEADS`), and the
    rest of its step (every product writing zeros instead of reading its weights)."""
    mf = gguf_file.open_model(path)
    feed, pp = (8, 64) if quick else (FEED, PP)
    prompt_ids, feed_ids, pp_ids = _tokens(PROMPT, 1), _tokens(feed, 2), _tokens(pp, 3)
    fw = Forward.from_gguf(mf, threads=threads, context=max(PROMPT + feed, pp))
    tiled = any(isinstance(w, Tiled) for w in fw.mats)
    # the prefetch's distances are timed on the file's rows, and a file whose Q8_0 or Q4_0
    # matrices decode through tiles is timed on its rows too, in the same rounds
    aheads = [a for a in (AHEADS if sweep else (0,)) if a != fw.ahead]
    other = {a: Forward.from_gguf(mf, threads=threads, context=PROMPT + feed, ahead=a,
                                  par_min_bytes=fw.par_min_bytes, repack=False) for a in aheads}
    rows = (Forward.from_gguf(mf, threads=threads, context=PROMPT + feed, repack=False,
                              par_min_bytes=fw.par_min_bytes) if tiled else None)
    # the rest of a step: the same decoder with every product writing zeros, reading nothing,
    # its parts summed by the C forward's clock (Forward.parts_on) in each round
    rest = Forward.from_gguf(mf, threads=threads, context=PROMPT + feed, products=False,
                             par_min_bytes=fw.par_min_bytes)
    rest_parts: list = []

    def decode_case(f, parts=None):
        return _decode_case(f, prompt_ids, feed_ids, parts)

    cases = {"tg": decode_case(fw), "pp": (fw.reset, lambda: fw.forward(pp_ids)),
             "tg_rest": decode_case(rest, rest_parts),
             **{f"tg_ahead_{a}": decode_case(f) for a, f in other.items()},
             **({"tg_rows": decode_case(rows)} if rows else {})}
    peer = {"tg": llama.Rates(), "pp": llama.Rates()}
    if tools:
        cases |= _llama_cases(peer, tools, path, threads, feed, pp)
    ts = _rounds(cases, 2 if quick else ROUNDS)
    gemm_rate = prompt_gemm_rate(fw, pp)
    mix = {t: b for t, (_, b) in mf.type_mix().items()}
    params = {"model": shape, "type": qtype, "threads": threads,
              "weight_bytes": mf.weight_bytes_per_token, "file_bytes": path.stat().st_size,
              "params": int(sum(np.prod(t.ne) for t in mf.tensors.values())),
              "type_bytes": mix}
    _add(rec, "decode", ts["tg"], feed, **params, par_min_bytes=fw.par_min_bytes, ahead=fw.ahead,
         tiles=tiled, tile_bytes=sum(w.nbytes for w in fw.mats if isinstance(w, Tiled)))
    if rows:
        _add(rec, "decode_rows", ts["tg_rows"], feed, **params, ahead=fw.ahead)
    for a in other:
        _add(rec, "decode_ahead", ts[f"tg_ahead_{a}"], feed, **params, ahead=a)
    _add(rec, "decode_rest", ts["tg_rest"], feed, **params)
    value, extra = rest_part_values(rest_parts, ts["tg_rest"], feed, rest)
    rec.add("decode_parts", "s", value, **params, **extra)
    rec.add("dot_rate", "GB/s", dot_rate(mf, threads, 5 if quick else 40, tiles=tiled),
            **params, tiles=tiled)
    if tiled:
        rec.add("dot_rate", "GB/s", dot_rate(mf, threads, 5 if quick else 40), **params,
                tiles=False)
    _add(rec, "prefill", ts["pp"], pp, **params, prompt_dtype=fw.prompt_dtype,
         products_per_token=mf.products_per_token)
    rec.add("prompt_gemm", "Gop/s", gemm_rate, **params, prompt_dtype=fw.prompt_dtype,
            shape=[pp, mf.hyper.hidden, mf.hyper.d])
    for test, vals in peer.items():
        if vals:
            t = Timing([1.0 / v for v in vals])
            rec.add("llama_" + test, "tokens/s", t.rate(1.0),
                    seconds={**t.stats(), "samples": t.seconds}, **params)
        elif vals.why:  # the peer died on this file: said under the table, never fatal
            rec.data["settings"].setdefault("missing", {})[
                f"llama.cpp {test} ({shape} {qtype})"] = vals.why


def rest_part_values(sums: list, t: Timing, tokens: int, f) -> tuple[dict, dict]:
    """The rest of a step part by part, from its rounds: the seconds a token of each part
    (:data:`PARTS` but "teamed": the medians over the rounds of the C forward's sums) and
    "call", what the step spends besides them (the median step less their sum: Python's
    :meth:`Forward.step`, the head's last lines); the regions a token that met as a team; and
    a fork-join of the team alone in a tight loop (the best of 9 runs of 500), the meeting's
    cost where nothing else runs. Returns the value (the rounds' seconds a token) and the
    parameters."""
    per = np.median(np.array(sums), axis=0)
    parts = {p: float(per[i]) for i, p in enumerate(PARTS) if p != "teamed"}
    step = Timing([s / tokens for s in t.seconds])
    parts["call"] = max(0.0, float(np.median(step.seconds)) - sum(parts.values()))
    fj = (min(_pool.fork_join_seconds(f.team.runtime, f.threads, 500) for _ in range(9))
          if f.threads > 1 else 0.0)
    return step.stats(), {"parts": parts, "teamed": float(per[PARTS.index("teamed")]),
                          "fork_join": fj}


def dot_rate(mf, threads: int, reps: int, tiles: bool = False) -> dict:
    """The decode products' arithmetic on its own, in GB/s of weights on ``threads`` cores:
    for each type the file's matrices hold, the first rows of its first matrix that fill
    DOT_BYTES (in every captured core's L2), multiplied by one row on one core, the best of
    ``reps`` calls each, five times; the step's bytes over the sum of each type's bytes over
    its rate, times the cores. Beside the memory's rate it says which of the two a step waits
    on, and what their overlap can reach. With ``tiles``, the products of the types with
    tiles (TILE_TYPE_NAMES) in their tiles (the decoder's layout for them), the others' on
    their rows."""
    from smallem.generating.gguf_file import Tensor, tensor_name

    by_type, first = {}, {}
    for key, t in mf.tensors.items():
        if key.endswith(".weight") and len(t.ne) == 2 and t.ne[1] > 1 and (
                key.startswith("blk.") or key in map(tensor_name, ("embd", "head"))):
            by_type[t.type] = by_type.get(t.type, 0) + t.nbytes
            first.setdefault(t.type, t)
    rates = []
    for _ in range(5):
        secs = 0.0
        for ty, nbytes in by_type.items():
            t = first[ty]
            row = t.nbytes // t.ne[1]
            rows = max(1, min(t.ne[1], DOT_BYTES // row))
            part = Tensor(t.name, t.type, (t.ne[0], rows), np.asarray(t.data)[:rows])
            secs += nbytes / (rows * row / gguf_products.product_seconds(
                part, reps, tiles=tiles and tileable(Blocks(part))))
        rates.append(threads * sum(by_type.values()) / secs / 1e9)
    rates.sort()
    return {"median": rates[len(rates) // 2], "min": rates[0], "max": rates[-1], "n": len(rates)}


def prompt_gemm_rate(fw, rows: int, reps: int = 3) -> dict:
    """The prompt's bound, measured: chapter 2's GEMM on the forward's team and dtype, at
    the shape of the file's gate product (``rows`` tokens by the hidden width by d, the
    largest of a block's products), ``reps`` calls in Gop/s: the integer GEMM on Q8_0 blocks
    where the forward's prompt takes it. A prompt can go no faster than its products at the
    best of them."""
    from smallem.product import gemm

    h = fw.h
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, h.d), np.float32)
    b = rng.standard_normal((h.hidden, h.d), np.float32)
    if fw.prompt_dtype == "int8":  # the integer GEMM, on the Q8_0 blocks of b
        from smallem.generating.gguf_file import Tensor

        q = np.clip(np.rint(b.reshape(-1, 32) * 127 / 4), -127, 127).astype(np.int8)
        blocks = np.zeros((q.shape[0], 34), np.uint8)
        blocks[:, :2] = np.full(len(q), 4 / 127, np.float16).view(np.uint8).reshape(-1, 2)
        blocks[:, 2:] = q.view(np.uint8)
        probe = Tensor("probe", "Q8_0", (h.d, h.hidden), blocks.reshape(h.hidden, -1))
        call = lambda: gguf_products.int8_matmul(probe, a, threads=fw.team,  # noqa: E731
                                                 amx=fw._int8_code == 2)  # the forward's path
    elif fw.prompt_dtype == "bf16":
        a, b = gemm.f32_to_bf16(a), gemm.f32_to_bf16(b)
        call = lambda: gemm.matmul_bf16(a, b, trans_b=True, threads=fw.team)  # noqa: E731
    else:
        call = lambda: gemm.matmul(a, b, trans_b=True, threads=fw.team)  # noqa: E731
    call()
    t = Timing()
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        t.seconds.append(time.perf_counter() - t0)
    return t.rate(2.0 * rows * h.hidden * h.d / 1e9)


def _int8_path() -> str | None:
    from smallem.generating.forward import int8_path

    try:
        return int8_path()
    except Exception:  # noqa: BLE001 (as _prompt_rates: the record says why there)
        return None


def _prompt_rates() -> dict:
    from smallem.generating.forward import prompt_rates

    try:
        return dict(prompt_rates())
    except Exception as e:  # noqa: BLE001 (a record keeps the reason, never stops on it)
        return {"why": f"{type(e).__name__}: {e}"}


def bench_others(quick: bool | None = None, progress: bool = True, threads=None):
    """The appendix's record: each case's decode and prompt, ours and llama.cpp's."""
    quick = quick_mode() if quick is None else quick
    threads = checks.threads(threads)
    tools, why = llama.find(), None
    quantiser = tools  # llama-quantize makes the files even where llama-bench cannot run
    if tools:  # short runs of each test on quantised files: a peer that fails is left out
        why = llama.usable(tools, threads)
        if why:
            tools = None
    rec = records.Record(RECORD, settings={
        "quick": quick, "threads": threads, "prompt": PROMPT, "feed": 8 if quick else FEED,
        "pp": 64 if quick else PP, "rounds": 2 if quick else ROUNDS, "llama_reps": LLAMA_REPS,
        "instruction": gguf_products.instruction(), "rows_per_call": gguf_products.ROWS,
        "int8_instruction": gguf_products.int8_instruction(amx=_int8_path() == "amx"),
        "int8_path": _int8_path(), "int8_vector_instruction": gguf_products.int8_instruction(),
        # the prompt's two GEMMs as the forward timed them to choose (Gop/s, one core)
        "prompt_rates": _prompt_rates(),
        "shapes": {k: vars(SHAPES[k]) for k, _ in (QUICK_CASES if quick else CASES)},
        "llama_cpp": llama.peer_settings(tools),
        # the types the forward decodes through tiles, and whether the tiles are prefetched
        # as the rows are (older records: Q8_0 alone, not prefetched)
        "tile_types": list(TILE_TYPE_NAMES), "tiles_prefetch": True})
    missing = {}
    if why or llama.find() is None:
        missing["llama.cpp"] = why or "not found (`make llama`)"
    with tempfile.TemporaryDirectory() as tmp:
        made, made_one = {}, False
        for shape, qtype in (QUICK_CASES if quick else CASES):
            t0 = time.perf_counter()
            if shape not in made:
                made[shape] = write_random(Path(tmp) / f"{shape}-F16.gguf", SHAPES[shape])
            path = quantise(made[shape], Path(tmp) / f"{shape}-{qtype}.gguf", qtype, quantiser)
            if path is None:
                missing[f"{shape} {qtype}"] = "needs llama-quantize (`make llama`)"
                continue
            measure_file(rec, path, shape, qtype, threads, tools, quick, sweep=not made_one)
            made_one = True
            path.unlink()
            if progress:
                print(f"{shape} {qtype}: {time.perf_counter() - t0:.0f} s", flush=True)
    if missing:
        rec.data["settings"]["missing"] = missing
    return rec
