"""Chapter 4 on the GPU (record ``ch4.gpu``): one sequence decoded on the device
(:class:`smallem.generating.gpu_decode.GPUDecoder`), f32 and int8 (Q8_0), the token step as one
CUDA graph or launch by launch; the greedy tokens beside the CPU decoder's; the prompt as one
product per matrix against the prompt token by token, in alternated rounds; the int8 product
with and without ``dp4a`` over layer widths, from which the decoder's switch is taken."""

from __future__ import annotations

import time

import numpy as np

from smallem.plumbing import cuda
from smallem.cpu.timing import Timing, quick_mode
from .. import compare, figures, records
from .measuring import NOT_MEASURED, gpu_measure, gpu_rounds, machine

CH4 = "ch4.gpu"
ROUNDS = 7
PROMPT_TARGET = 5.0      # the prompt as one product per matrix, over token by token
MATCH_TOKENS = 64        # greedy tokens compared with the CPU decoder's


def ch4_settings(quick: bool) -> dict:
    from smallem.book.ch4.measuring import LADDER_CONFIG
    if quick:
        return {"quick": True, "config": "tiny", "decode_tokens": 4, "prompt_tokens": 8,
                "match_tokens": 4, "rounds": 2, "widths": [32, 64]}
    return {"quick": False, "config": LADDER_CONFIG, "decode_tokens": 256,
            "prompt_tokens": 512, "match_tokens": MATCH_TOKENS, "rounds": ROUNDS,
            "widths": [256, 512, 1024, 2048, 4096, 8192, 16384]}


def _model(name: str, tied: bool = True):
    """Chapter 4's model with random weights; untied for the greedy comparison, where a tied
    head makes a random model repeat one token, which would check nothing."""
    import dataclasses
    from smallem.training.model import GPT
    from .training import _config
    return GPT(dataclasses.replace(_config(name), tied=tied), "numpy", seed=1)


def _prompt(n: int, vocab: int) -> list[int]:
    from smallem.book.ch4.measuring import PROMPT
    return [int(t) % vocab for t in np.resize(np.array(PROMPT), n)]


def measure_match(rec, s: dict, say) -> None:
    """Greedy tokens of the GPU decoder (f32) against the CPU's f32 decoder's."""
    from smallem.generating import decode, gpu_decode
    model = _model(s["config"], tied=False)
    n, prompt = s["match_tokens"], _prompt(16, model.config.vocab)
    cpu = decode.Decoder(model, "f32", threads=1)
    logits, want = cpu.prefill(prompt), []
    for _ in range(n):
        want.append(int(np.argmax(logits)))
        logits = cpu.step(want[-1])
    for graph in (True, False):
        got = gpu_decode.GPUDecoder(model, "f32", graph=graph).generate_greedy(prompt, n)
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), n)
        rec.add("greedy_match", "tokens", {"median": same, "min": same, "max": same, "n": 1},
                tokens=n, graph=graph, gpu_tokens=[int(t) for t in got], cpu_tokens=want,
                distinct=len(set(want)))
        say(f"  greedy tokens equal to the CPU decoder's: {same} of {n} (graph {graph})")


def measure_decode(rec, model, s: dict, say, table: dict) -> None:
    """Tokens per second of each decoder: f32 with its graph and without, int8 with dp4a
    switched by ``table`` (the measured crossover), everywhere, and nowhere."""
    from smallem.generating import gpu_decode
    n, prompt = s["decode_tokens"], _prompt(16, model.config.vocab)
    for dtype, dp4a, graph in (("f32", False, True), ("f32", False, False),
                               ("int8", "auto", True), ("int8", True, True),
                               ("int8", False, True)):
        dec = gpu_decode.GPUDecoder(model, dtype, dp4a=dp4a, graph=graph,
                                    dp4a_table=table if dp4a == "auto" else None)
        t = gpu_measure(lambda: dec.generate_greedy(prompt, n), repeats=s["rounds"],
                        warmup=1, max_time=None)
        rec.add("gpu_decode", "tokens/s", t.rate(n), seconds={**t.stats(), "samples": t.seconds},
                dtype=dtype, dp4a=dp4a, graph=graph, tokens=n, prompt=len(prompt),
                weight_bytes=int(getattr(dec, "weight_bytes", 0)))
        say(f"  decode {dtype:4s} dp4a {dp4a!s:5s} graph {graph!s:5s} "
            f"{figures.fmt(t.rate(n)['median'], 'tokens/s'):>16}")


def measure_prompt(rec, model, s: dict, say) -> None:
    """Time to first token: the prompt as one product per matrix, and token by token, in
    alternated rounds (the CUDA events of one round around each)."""
    from smallem.generating import gpu_decode
    P = min(s["prompt_tokens"], model.config.context)
    prompt = _prompt(P, model.config.vocab)
    dec = gpu_decode.GPUDecoder(model, "f32", graph=False)
    cases = {"gemm": lambda: (dec.reset(), dec.prefill(prompt)),
             "tokenwise": lambda: (dec.reset(), dec.prefill_tokenwise(prompt))}
    samples = gpu_rounds(cases, s["rounds"])
    for k, sec in samples.items():
        t = Timing(sec)
        rec.add("prompt", "tokens/s", t.rate(P), seconds={**t.stats(), "samples": sec},
                path=k, tokens=P)
    say(f"  prompt of {P}: one product per matrix {figures.fmt(P / np.median(samples['gemm']), 'tokens/s')}, "
        f"token by token {figures.fmt(P / np.median(samples['tokenwise']), 'tokens/s')}")


def measure_dp4a(rec, s: dict, say) -> dict:
    """The int8 product with and without dp4a at each width (a square layer): the decoder's
    switch, {width: dp4a ahead}, taken from these medians (gpu_decode.dp4a_crossover)."""
    from smallem.generating import gpu_decode
    times = {}
    for w in s["widths"]:
        for dp4a in (True, False):
            fn = gpu_decode.int8_product_case(w, w, dp4a=dp4a)
            t = times[w, dp4a] = gpu_measure(fn, repeats=s["rounds"], warmup=2)
            rec.add("int8_product", "GB/s", t.rate(w * w * 34 / 32 / 1e9),
                    seconds={**t.stats(), "samples": t.seconds}, width=w, dp4a=dp4a)
        say(f"  int8 product {w:6d}: dp4a {times[w, True].median * 1e6:8.1f} us, "
            f"without {times[w, False].median * 1e6:8.1f} us")
    return gpu_decode.dp4a_crossover(s["widths"], lambda w, d: times[w, d].median)


def run_ch4(quick: bool | None = None, progress: bool = True) -> records.Record:
    cuda.require()
    quick = quick_mode() if quick is None else quick
    s = ch4_settings(quick)
    rec = records.Record(CH4, settings=s, machine=machine())
    say = print if progress else (lambda *a, **k: None)
    t0 = time.perf_counter()
    model = _model(s["config"])
    rec.data["settings"]["model"] = model.config.to_dict()
    measure_match(rec, s, say)
    measure_prompt(rec, model, s, say)
    table = measure_dp4a(rec, s, say)
    rec.data["settings"]["dp4a_table"] = {str(w): bool(v) for w, v in table.items()}
    measure_decode(rec, model, s, say, table)
    say(f"  chapter 4 on the GPU: {time.perf_counter() - t0:.0f} s")
    return rec


# ---------------------------------------------------------------- reading

DECODE_HEADER = ["", "this CPU", "GPU"]


def _cpu_decode(rec_dir) -> dict | None:
    """Chapter 4's top rung on this machine."""
    if not records.exists("ch4.decode", rec_dir):
        return None
    rec = records.load("ch4.decode", rec_dir)
    rungs = [r for r in records.results(rec, "decode") if "rung" in r["params"]]
    return max(rungs, key=lambda r: r["params"]["rung"]) if rungs else None


def _one(rec, name, **params):
    found = records.results(rec, name, **params) if rec else []
    return found[0] if found else None


def prompt_verdict(rec: dict | None):
    g, t = _one(rec, "prompt", path="gemm"), _one(rec, "prompt", path="tokenwise")
    return compare.against(g, t, PROMPT_TARGET) if g and t else None


def decode_rows(rec: dict | None, rec_dir) -> list[list]:
    f = figures.fmt
    cpu = _cpu_decode(rec_dir)
    rows = []
    for dtype, label in (("f32", "decode, f32 weights"), ("int8", "decode, int8 weights")):
        g = _one(rec, "gpu_decode", dtype=dtype, dp4a="auto" if dtype == "int8" else False,
                 graph=True)
        here = (f(records.median(cpu), "tokens/s") + f" (rung {cpu['params']['rung']})"
                if cpu else "no chapter 4 record on this machine")
        rows.append([label, here if dtype == "int8" else "—",
                     f(records.median(g), "tokens/s") if g else NOT_MEASURED])
    ng, gr = (_one(rec, "gpu_decode", dtype="f32", dp4a=False, graph=x) for x in (False, True))
    rows.append(["the token step as one CUDA graph, over launch by launch", "—",
                 f"{gr['value']['median'] / ng['value']['median']:.2f}x" if ng and gr else NOT_MEASURED])
    v = prompt_verdict(rec)
    rows.append(["prompt as one product per matrix, over token by token", "—",
                 f"{v.ratio:.1f}x: {v.word}" if v else NOT_MEASURED])
    m = _one(rec, "greedy_match", graph=True)
    rows.append(["greedy tokens equal to the CPU decoder's", "the reference",
                 f"{m['value']['median']} of {m['params']['tokens']}" if m else NOT_MEASURED])
    return rows


def crossover(rec: dict | None) -> int | None:
    """The widest layer at which dp4a is still ahead (None: never, or not measured)."""
    rows = records.results(rec, "int8_product") if rec else []
    ahead = [w for w in sorted({r["params"]["width"] for r in rows})
             if records.median(_one(rec, "int8_product", width=w, dp4a=True))
             > records.median(_one(rec, "int8_product", width=w, dp4a=False))]
    return max(ahead) if ahead else None


def decode_values(rec: dict | None) -> dict:
    if rec is None:
        return {"gpu.ch4_measured": False, "gpu.ch4_line": NOT_MEASURED,
                "gpu.ch4_prompt": NOT_MEASURED, "gpu.ch4_dp4a": NOT_MEASURED,
                "gpu.ch4_match": NOT_MEASURED}
    from .reading import gpu_line
    v = prompt_verdict(rec)
    w = crossover(rec)
    m = _one(rec, "greedy_match", graph=True)
    return {"gpu.ch4_measured": True, "gpu.ch4_line": gpu_line(rec),
            "gpu.ch4_prompt": v.text(f"{v.ratio:.1f} times, target {PROMPT_TARGET:g}") if v else NOT_MEASURED,
            "gpu.ch4_dp4a": (f"up to layers {w} wide" if w else "at no width measured"),
            "gpu.ch4_match": (f"{m['value']['median']} of {m['params']['tokens']}" if m else NOT_MEASURED)}


def report_ch4(rec_dir) -> dict:
    from .reading import load_gpu
    rec = load_gpu(CH4, rec_dir)
    note = (f"Measured on the GPU of {rec['machine']['gpu']['name']}; the CPU column is this "
            f"machine's chapter 4 (its top rung)." if rec else "")
    figures.write_table("gpu_decode", decode_rows(rec, rec_dir), DECODE_HEADER, note)
    return decode_values(rec)
