"""Chapter 4: the decoder's products, the KV cache, sampling, the generator and its errors."""

from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

from smallem.training import checkpoint
from smallem.generating import decode
from smallem.generating.forward import ForwardError
from smallem.cpu import isa
from smallem.checks import assert_close
from smallem.training.model import GPT, Config
from smallem.generating.quant import QBLOCK, Packed, dequantize_q8, quantize_q8

SHAPES = [(1, 1, 1), (1, 31, 17), (3, 33, 15), (5, 100, 50), (33, 64, 40), (4, 96, 16),
          (2, 7, 129), (1, 200, 300)]  # rows, K, N: below, across and past a tile and a block


def _model(block="gpt2", d=64, layers=2, heads=4, context=72, seed=0, spread=0.05):
    cfg = Config("t", d_model=d, n_layer=layers, n_head=heads, context=context, block=block)
    m = GPT(cfg, "kernels", seed=seed)
    rng = np.random.default_rng(seed + 100)
    for p in m.params.values():  # away from the init's near-uniform logits, biases included
        p[...] += rng.normal(0, spread, p.shape)
    return m


def test_quantize_q8_is_q8_0(rng):
    w = rng.normal(0, 1, (70, 9)).astype(np.float32)
    w[:32, 3] = 0  # an all-zero block: scale 0, weights 0
    q, s = quantize_q8(w)
    assert q.shape == (96, 9) and s.shape == (3, 9) and q.dtype == np.int8
    assert np.abs(q).max() <= 127 and (q[70:] == 0).all()
    amax = np.abs(np.pad(w, ((0, 26), (0, 0))).reshape(3, 32, 9)).max(axis=1)
    assert_close(s.astype(np.float32), (amax / 127).astype(np.float16).astype(np.float32))
    assert (q[:32, 3] == 0).all() and s[0, 3] == 0
    back = dequantize_q8(q, s, 70)
    # each weight within half a step of its block's scale (plus the scale's f16 rounding)
    step = np.repeat(s.astype(np.float64), 32, axis=0)[:70]
    assert (np.abs(back - w) <= 0.5 * step + 1e-3 * np.abs(w) + 1e-12).all()


def test_quantize_rows_per_block_as_q8_0(rng):
    """One f16 scale a block of 32 (amax / 127, as ggml's Q8_0 rounds it), each value within
    half a step plus what the scale's f16 rounding moves 127 steps; a zero block stays zero."""
    x = rng.normal(0, 3, (5, 45)).astype(np.float32)
    x[2] = 0
    x[3, 32:] = 0
    p, a = decode.quantize_rows(x)
    assert p.shape == (5, 64) and a.shape == (5, 2) and (p[:, 45:] == 0).all()
    xp = np.zeros((5, 64), np.float32)
    xp[:, :45] = x
    amax = np.abs(xp).reshape(5, 2, 32).max(axis=2)
    assert np.array_equal(a, (amax / np.float32(127)).astype(np.float16).astype(np.float32))
    err = np.abs(decode.dequantize_rows(p, a, 45) - x)
    step = np.repeat(a.astype(np.float64), 32, axis=1)[:, :45]
    assert (err <= (0.5 + 127 * 2.0**-11) * step * (1 + 1e-6)).all()
    assert (p[2] == 0).all() and (p[3, 32:] == 0).all() and (a[3, 1] == 0)


@pytest.mark.parametrize("rows,K,N", SHAPES)
@pytest.mark.parametrize("kind", ["f32", "int8"])
def test_product_against_float64(level, rows, K, N, kind, rng):
    w = rng.normal(0, 0.1, (K, N)).astype(np.float32)
    bias = rng.normal(0, 1, N).astype(np.float32)
    x = rng.normal(0, 1, (rows, K)).astype(np.float32)
    pk = Packed(w, kind, bias)
    y0 = rng.normal(0, 1, (rows, N)).astype(np.float32)
    for accumulate in (False, True):
        y = decode.matmul(pk, x, threads=2, y=y0.copy(), accumulate=accumulate)
        if kind == "int8":  # what it multiplies: the dequantised weights and rows
            xin = decode.dequantize_rows(*decode.quantize_rows(x), K)
        else:
            xin = x.astype(np.float64)
        ref = xin @ pk.dequantized() + bias + (y0 if accumulate else 0)
        assert_close(y, ref.astype(np.float32), k=K, name=f"{kind} {rows}x{K}x{N}")


@pytest.mark.parametrize("without", ["", "avx_vnni"], ids=["as-the-cpu-has", "without-avx-vnni"])
def test_both_avx2_int8_paths(without, monkeypatch, rng):
    """The AVX2 level's int8 product, with vpdpbusd on ymm where the CPU has AVX-VNNI and
    vpmaddubsw where it has not (or is told not to use it): both against float64, on every
    shape, one row and many, and the instruction each build says it runs."""
    if not isa.supported("avx2"):
        pytest.skip("this CPU has no AVX2")
    has = "avx_vnni" in isa.cpu_flags()
    if without and not has:
        pytest.skip("this CPU has no AVX-VNNI: the other parameter runs vpmaddubsw already")
    monkeypatch.setenv("SMALLEM_ISA", "avx2")
    monkeypatch.setenv(isa.WITHOUT_ENV, without)
    want = "vpdpbusd (AVX-VNNI)" if has and not without else "vpmaddubsw (AVX2)"
    assert decode.int8_instruction() == want
    assert decode.rung_label(3).endswith(want)
    for rows, K, N in SHAPES:
        w = rng.normal(0, 0.1, (K, N)).astype(np.float32)
        x = rng.normal(0, 1, (rows, K)).astype(np.float32)
        pk = Packed(w, "int8", None)
        ref = decode.dequantize_rows(*decode.quantize_rows(x), K) @ pk.dequantized()
        for threads in (1, 2):
            y = decode.matmul(pk, x, threads=threads)
            assert_close(y, ref.astype(np.float32), k=K, name=f"{want} {rows}x{K}x{N}")


def test_the_int8_instruction_is_the_levels(level):
    exts = isa.extensions(level)
    want = {"generic": "plain C",
            "avx2": "vpdpbusd (AVX-VNNI)" if "avx_vnni" in exts else "vpmaddubsw (AVX2)",
            "avx512": ("vpdpbusd (AVX512-VNNI)" if "avx512_vnni" in exts
                       else "vpmaddubsw (AVX2)")}[level]
    assert decode.int8_instruction(level) == want


def test_the_kernels_shapes_are_the_packers(level):
    """The C side's tile, rows per pass and rows per block, which chapter 4's page quotes,
    against the Python side that packs for it."""
    from smallem.plumbing import build
    from smallem.generating import quant

    _, lib = build.load("forward", level)
    assert lib.sm_tile() == quant.TILE
    assert lib.sm_rows() % lib.sm_block_rows() == 0 and 1 <= lib.sm_block_rows() <= lib.sm_rows()


def test_the_thread_threshold_is_measured(level, monkeypatch):
    m = _model(d=64, layers=1)
    toks = np.arange(20, dtype=np.int32)
    # measured now, not read from what this machine kept: a fork-join and the one-core rate
    # (sm_time_product) at this level
    monkeypatch.setattr(decode.machine, "kept", lambda name, key, measure_it: measure_it())
    dec = decode.Decoder(m, "int8", 2)
    assert isinstance(dec.par_min_bytes, int) and dec.par_min_bytes > 0
    assert_close(dec.all_logits(toks), decode.Decoder(m, "int8", 1).all_logits(toks),
                 rtol=1e-5, atol=1e-5)


def test_the_threshold_times_a_pass_over_every_matrix(monkeypatch):
    """One core's rate is a pass over every matrix of the model, as a token reads them (one
    matrix timed again and again sits in the L2: on a Xeon that rate, three times the L3's,
    kept every product of chapter 4's xl model on one core): the kept key names every
    matrix and their bytes, and the threshold is SYNC_SHARE fork-joins of that pass's rate."""
    seen = {}

    def keep(name, key, measure_it):
        seen[name] = key
        return measure_it()
    monkeypatch.setattr(decode.machine, "kept", keep)
    dec = decode.Decoder(_model(d=64, layers=2), "int8", 2)
    key = seen["par_min_bytes"]
    assert key[-2] == dec.weight_bytes and len(key[-1]) == len(dec.mats) > 4
    assert dec.par_min_bytes > 0


def test_int8_layout(rng):
    """The tile order is the documented one."""
    w = rng.normal(0, 1, (64, 20)).astype(np.float32)
    pk = Packed(w, "int8")
    q, s = pk.q8
    # one group of two tiles: [K32/4][2][16][4]; tile 1, k = 3*4 + 1, output 16 + 2
    assert pk.q.shape == (16 * 2 * 16 * 4,)
    assert pk.q.reshape(16, 2, 16, 4)[3, 1, 2, 1] == q[3 * 4 + 1, 16 + 2]
    big = Packed(rng.normal(0, 1, (32, 200)).astype(np.float32), "int8")  # 13 tiles: 8 + 5
    qb, _ = big.q8
    lines = big.q.reshape(-1, 64)
    # tile 10 (the second group's third), k-group 5: line 8 * 8 + 5 * 5 + 2
    assert (lines[8 * 8 + 5 * 5 + 2].reshape(16, 4) == qb[20:24, 160:176].T).all()
    assert_close(big.dequantized().astype(np.float32),
                 dequantize_q8(qb, big.q8[1], 32).astype(np.float32))


@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_kv_cache_decode_equals_full_recompute(level, block):
    m = _model(block, context=72)
    toks = np.random.default_rng(1).integers(0, 256, 72).astype(np.int32)
    full = m.forward(toks[None]).copy()
    for name, dec in [("numpy", decode.NumpyCache(m)),
                      ("f32", decode.Decoder(m, "f32", 1)),
                      ("f32 pool", decode.Decoder(m, "f32", 2, pool=True, par_min_bytes=0)),
                      ("f32 openmp", decode.Decoder(m, "f32", 2, pool=False, par_min_bytes=0)),
                      ("f32 gemm prefill", decode.Decoder(m, "f32", 1, prefill="gemm"))]:
        # a prompt longer than one pass of rows (32), then every position one by one
        assert_close(dec.prefill(toks[:40]), full[39], rtol=1e-4, atol=1e-5, name=name)
        for i in range(40, 72):
            assert_close(dec.step(int(toks[i])), full[i], rtol=1e-4, atol=1e-5,
                         name=f"{name} at position {i}")
        with pytest.raises(ValueError, match="cache is full|context"):
            dec.step(1)
    assert_close(decode.Decoder(m, "f32", 2, par_min_bytes=0).all_logits(toks), full,
                 rtol=1e-4, atol=1e-5)
    nc = decode.NoCache(m)
    assert_close(nc.prefill(toks[:5]), full[4], rtol=1e-4, atol=1e-5)
    assert_close(nc.step(int(toks[5])), full[5], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_int8_decode_follows_f32(level, block):
    m = _model(block)
    toks = np.random.default_rng(2).integers(0, 256, 60).astype(np.int32)
    f32 = decode.Decoder(m, "f32", 1).all_logits(toks)
    q8 = decode.Decoder(m, "int8", 2, par_min_bytes=0)
    all8 = q8.all_logits(toks)
    q8.reset()
    stepped = [q8.prefill(toks[:10]).copy()] + [q8.step(int(t)).copy() for t in toks[10:]]
    assert_close(np.array(stepped), all8[9:], rtol=1e-4, atol=1e-4)  # one row or many: same
    err = np.abs(all8 - f32).max() / np.abs(f32).max()
    assert 0 < err < 0.05, err
    assert (all8.argmax(1) == f32.argmax(1)).mean() > 0.8


def test_rungs_are_the_ladder():
    m = _model()
    assert [r.index for r in decode.RUNGS] == list(range(len(decode.RUNGS)))
    toks = list(range(20))
    first = None
    for i in range(len(decode.RUNGS)):
        dec = decode.rung_decoder(i, m, threads=2)
        dec.prefill(toks)
        logits = dec.step(7).copy()
        first = logits if first is None else first
        tol = 0.05 * np.abs(first).max() if i >= 3 else 1e-4 * np.abs(first).max()
        assert np.abs(logits - first).max() <= tol, i
    with pytest.raises(ValueError, match="rung"):
        decode.rung_decoder(-1, m)


# ---------------------------------------------------------------- sampling
def test_sampler_seeded_and_top_k_one_is_greedy(rng):
    logits = [rng.normal(0, 2, 256).astype(np.float32) for _ in range(50)]
    a = decode.Sampler(0.9, top_k=40, top_p=0.9, seed=7)
    b = decode.Sampler(0.9, top_k=40, top_p=0.9, seed=7)
    assert [a(x) for x in logits] == [b(x) for x in logits]
    c, d = decode.Sampler(0.9, seed=8), decode.Sampler(0.9, seed=9)
    assert [c(x) for x in logits] != [d(x) for x in logits]  # the seed matters
    one = decode.Sampler(1.5, top_k=1, seed=3)
    greedy = decode.Sampler(0.0)
    assert [one(x) for x in logits] == [greedy(x) for x in logits] == [int(x.argmax()) for x in logits]


def test_sampler_cuts(rng):
    x = rng.normal(0, 1, 256).astype(np.float32)
    top2 = set(np.argsort(-x)[:2].tolist())
    s = decode.Sampler(5.0, top_k=2, seed=0)
    assert {s(x) for _ in range(300)} == top2
    # top-p: a mass held by the first token alone keeps only it
    y = np.full(256, -10.0, np.float32)
    y[17], y[3] = 10.0, 9.0
    s = decode.Sampler(1.0, top_p=0.5, seed=1)
    assert {s(y) for _ in range(50)} == {17}
    s = decode.Sampler(1.0, top_p=1.0, seed=1)
    assert {s(y) for _ in range(400)} == {17, 3}
    # the draw follows softmax(x / T): two tokens at p and 1-p
    z = np.full(256, -50.0, np.float32)
    z[1], z[2] = 0.0, np.log(3.0)
    s = decode.Sampler(1.0, seed=2)
    draws = [s(z) for _ in range(4000)]
    assert abs(draws.count(2) / 4000 - 0.75) < 0.03


@pytest.mark.parametrize("kw,match", [({"temperature": -0.1}, "temperature"),
                                      ({"temperature": float("nan")}, "temperature"),
                                      ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
                                      ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k")])
def test_sampler_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        decode.Sampler(**kw)


# ---------------------------------------------------------------- the generator
def test_generator_prompts_and_the_context():
    m = _model(context=40)
    g = decode.Generator(m, dtype="int8", threads=2)
    out = list(g.generate(b"", 5, temperature=0))            # empty: starts after a newline
    assert len(out) == 5 and all(isinstance(p, bytes) and len(p) == 1 for p in out)
    assert b"".join(g.generate("é\n", 3, seed=1)) == b"".join(g.generate(b"\xc3\xa9\n", 3, seed=1))
    assert len(b"".join(g.generate(b"\xff\xfe\x00", 4))) == 4  # not UTF-8: fine, as bytes
    long = b"".join(g.generate(b"x" * 30, 100, temperature=0))  # past the context: slides
    assert len(long) == 100
    with pytest.raises(ValueError, match="longer than the model's context"):
        list(g.generate(b"y" * 41, 1))
    with pytest.raises(ValueError, match="tokens"):
        list(g.generate(b"a", -1))
    with pytest.raises(TypeError, match="prompt"):
        list(g.generate(123, 1))
    # greedy with f32 equals the decoder's argmax, step by step, and NoCache's too
    g32 = decode.Generator(m, dtype="f32", threads=1)
    text = b"".join(g32.generate(b"abc", 8, temperature=0))
    nc, toks = decode.NoCache(m), list(b"abc")
    want = []
    logits = nc.prefill(toks)
    for _ in range(8):
        want.append(int(np.argmax(logits)))
        logits = nc.step(want[-1])
    assert list(text) == want


def test_the_one_generate_loop_keeps_the_latest_half_of_a_full_context():
    """sampling.generate, the loop of chapter 4's generator and the GGUF runner: a cache
    never holds more than the context; when full it restarts with the latest half of the
    ids (the newest included), and a stop id ends the run before it is kept."""
    from smallem.generating.sampling import generate

    context, cache, refills = 8, [], []

    def logits_after(t):  # the next id is always the last one plus one
        z = np.zeros(64)
        z[(t + 1) % 64] = 1
        return z

    def step(t):
        cache.append(t)
        assert len(cache) <= context
        return logits_after(t)

    def refill(ids):
        cache[:] = ids
        refills.append(list(ids))
        return logits_after(ids[-1])

    history = [1, 2, 3]
    out = list(generate(refill(history), history, 20, lambda z: int(np.argmax(z)),
                        context=context, step=step, refill=refill))
    assert out == list(range(4, 24))
    assert refills[1] == [6, 7, 8, 9]  # full at 8 ids: 9 has no place, the latest 4 go on
    assert all(len(r) <= context for r in refills) and history == cache + [23]
    history = [1]
    stopped = list(generate(refill(history), history, 20, lambda z: int(np.argmax(z)),
                            context=context, step=step, refill=refill, stop={5}))
    assert stopped == [2, 3, 4] and history == [1, 2, 3, 4]


@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_generate_from_a_checkpoint(tmp_path, block):
    from smallem.training.data import Corpus
    from smallem.training.train import Trainer

    text = np.frombuffer(b"def f(x):\n    return x\n" * 50, np.uint8)
    corpus = Corpus("tiny", text, text[:200], "0" * 64, 1)
    cfg = Config("t", d_model=32, n_layer=1, n_head=2, context=32, block=block)
    t = Trainer(cfg, corpus=corpus, batch_size=2, steps=2)
    t.train_step()
    t.save(tmp_path / "ck")
    m = decode.load_model(tmp_path / "ck")
    assert np.array_equal(m.flat, t.model.flat) and m.config == cfg
    r = subprocess.run([sys.executable, "-m", "smallem", "generate", "--checkpoint",
                        str(tmp_path / "ck"), "--prompt", "def", "--tokens", "12", "--seed", "1"],
                       capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    assert len(r.stdout) == 12
    assert r.stdout == b"".join(decode.Generator(m).generate(b"def", 12, seed=1))


def test_a_seed_gives_the_same_text_whatever_the_clock_picks(monkeypatch):
    """The generator's prompt takes the C call by default, so its text cannot depend on which
    prompt path the "auto" timing would pick: with that choice forced to the f32 GEMM, the
    default generator's bytes stay those of the C path, and an "auto" generator's change
    (the test of the test: the two paths do give different text)."""
    m = _model(spread=0.3)

    def run(**kw):
        return b"".join(decode.Generator(m, threads=1, **kw).generate(b"def f(x):", 24, seed=3))

    c = run(prefill="c")
    monkeypatch.setattr(decode.Decoder, "_choose_prefill",
                        lambda self: self.prefill_choice.update({1: "gemm"}))
    assert run() == c
    assert run(prefill="auto") != c


def test_generate_command_errors(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "smallem", "generate", *args],
                              capture_output=True, text=True)

    r = run("--checkpoint", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no checkpoint here" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / checkpoint.INDEX).write_text("{not json")
    r = run("--checkpoint", str(tmp_path / "bad"))
    assert r.returncode == 2 and "not a readable checkpoint" in r.stderr
    assert (tmp_path / "bad" / checkpoint.INDEX).read_text() == "{not json"  # left as it was
    r = run("--config", "s", "--temperature", "-1")
    assert r.returncode == 2 and "temperature" in r.stderr
    r = run("--config", "s", "--top-p", "2")
    assert r.returncode == 2 and "--top-p" in r.stderr
    r = run("--config", "s", "--prompt", "x" * 200)
    assert r.returncode == 2 and "longer than the model's context" in r.stderr
    r = run()
    assert r.returncode == 2 and "--checkpoint" in r.stderr
    r = run("--config", "s", "--dtype", "f32", "--prefill", "int8", "--tokens", "2")
    assert r.returncode == 2 and "int8" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_decoder_bad_input():
    m = _model()
    with pytest.raises(ValueError, match="dtype"):
        decode.Decoder(m, "int4")
    d = decode.Decoder(m, "int8", 1)
    for bad, err in [([], ValueError), ([256], ValueError), ([-1], ValueError),
                     (np.array([1.5]), TypeError), ([[1, 2]], ValueError)]:
        with pytest.raises(err):
            d.prefill(bad)
    assert d.pos == 0  # nothing was written
    with pytest.raises(ValueError, match="context"):
        d.prefill(list(range(73)))
    with pytest.raises(ValueError, match="vocabulary"):
        d.step(300)
    with pytest.raises(ValueError, match="float32"):
        decode.matmul(Packed(np.zeros((4, 4), np.float32)), np.zeros((1, 4)))
    assert QBLOCK == 32


def test_every_process_decodes_with_the_same_choices():
    """The thread threshold and the prompt path decide a decoder's speed; each is measured
    once on a machine and kept, so two fresh processes make the same choices (timed anew in
    each, they flipped with the noise: 0.96-1.19 MB and 859-1 157 tokens/s on one Xeon)."""
    import json
    code = ("import json; from smallem.generating import decode; "
            "from tests.test_decode import _model; "
            "d = decode.Decoder(_model(), 'int8', 2, prefill='auto'); "
            "print(json.dumps([d.par_min_bytes, sorted(d.prefill_choice.items())]))")
    root = Path(__file__).resolve().parent.parent
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           cwd=root, timeout=600) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    first, second = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert first == second and first[0] > 0


def test_fresh_processes_are_timed_in_turn():
    """Chapter 4's fresh processes (book.ch4.processes): each process reports its choices and
    one sample a round; two of them on the smallest config take the same threshold."""
    from smallem.book.ch4 import processes
    got = processes.measure("s", 2, 2, 3, list(b"def "), list(b"    "))
    assert len(got) == 2
    for g in got:
        assert len(g["samples"]) == 3 and all(s > 0 for s in g["samples"])
        assert g["tokens"] == 4
    assert got[0]["par_min_bytes"] == got[1]["par_min_bytes"] > 0


def test_a_dead_process_is_one_line():
    from smallem.book.ch4 import processes
    with pytest.raises(RuntimeError, match=r"died \(exit 1\).*ValueError"):
        processes.measure("no-such-config", 2, 1, 1, [1], [2])


def _process_record(meds, par_min=(1000, 1000), missing=None):
    rec = {"settings": {"processes": {"processes": len(meds), "rounds": 7, "config": "s",
                                      "timed_per_turn": 3}, **({"missing": missing} if missing else {})},
           "machine": {"cpu": "test", "cores": 2, "isa": {"isa": "avx2", "extensions": []}}, "date": "2026-12-06", "commit": "x", "results": []}
    for i, (m, pm) in enumerate(zip(meds, par_min)):
        secs = [1 / (m * (1 + 0.001 * k)) for k in range(7)]
        rec["results"].append({"name": "process_decode", "unit": "tokens/s",
                               "value": {"median": m}, "seconds": {"median": 1 / m, "samples": secs},
                               "params": {"process": i, "par_min_bytes": pm, "ahead": 4096}})
    return rec


@pytest.mark.parametrize("meds, word", [((1000, 990), "reached"), ((1000, 800), "not reached")])
def test_the_processes_verdict_can_fail(meds, word, tmp_path, monkeypatch):
    """The slowest process against the fastest at 0.95: within 1 % it is reached, at 0.8 it is
    not; a record without the measurement drops the section (procs_measured False)."""
    from smallem.book.ch4 import reading
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path))
    values = {}
    targets = reading._processes(_process_record(meds), values)
    assert values["ch4.procs_measured"] and values["ch4.procs_same_choices"]
    assert values["ch4.procs_verdict"].startswith(word), values["ch4.procs_verdict"]
    assert len(targets) == 1
    values = {}
    assert reading._processes(_process_record(meds, (1000, 2000)), values)
    assert not values["ch4.procs_same_choices"] and values["ch4.procs_par_min_kib"] == [1000 / 1024, 2000 / 1024]
    empty = {"settings": {"missing": {"fresh processes": "a decoding process died"}}, "results": []}
    values = {}
    assert reading._processes(empty, values) == []
    assert not values["ch4.procs_measured"] and values["ch4.procs_missing"].startswith("a decoding")


def test_threshold_for_threads(monkeypatch):
    """Products smaller than the threshold run on one thread; the threshold is derived."""
    m = _model()
    d = decode.Decoder(m, "int8", 2)
    assert d.par_min_bytes > 0
    assert decode.Decoder(m, "int8", 1).par_min_bytes == 0
    # derived from the team's fork-join: free meetings share everything, and meetings that
    # cost a second each keep every product of this model on one thread (measured here, not
    # read from what this machine kept)
    monkeypatch.setattr(decode.machine, "kept", lambda name, key, measure_it: measure_it())
    monkeypatch.setattr(decode._pool, "fork_join_seconds", lambda *a: 0.0)
    assert decode.Decoder(m, "int8", 2).par_min_bytes == 0
    monkeypatch.setattr(decode._pool, "fork_join_seconds", lambda *a: 1.0)
    assert decode.Decoder(m, "int8", 2).par_min_bytes > max(pk.nbytes for pk in d.mats)
    monkeypatch.undo()
    serial = decode.Decoder(m, "int8", 2, par_min_bytes=1 << 40)
    toks = list(range(30))
    assert_close(serial.all_logits(toks), decode.Decoder(m, "int8", 2, par_min_bytes=0)
                 .all_logits(toks), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_the_measured_prompt_path_gives_the_same_logits(block):
    """prefill="auto": the decoder times both prompt paths at two lengths when it is made,
    keeps a choice for each, and whichever path a prompt takes, its logits and the cache it
    leaves are those of the int8 call's path (the same decode follows)."""
    m = _model(block, context=4 * 4 * 32)  # half the context is past the short prompt
    auto = decode.Decoder(m, "int8", 2, prefill="auto")
    assert set(auto.prefill_choice.values()) <= {"c", "gemm", "int8"}
    assert len(auto.prefill_choice) == 2 and auto.pos == 0
    ref = decode.Decoder(m, "int8", 2, prefill="c")
    rng = np.random.default_rng(3)
    for n in sorted(auto.prefill_choice):
        toks = rng.integers(0, m.config.vocab, n)
        auto.reset(), ref.reset()
        a, r = auto.prefill(toks).copy(), ref.prefill(toks).copy()
        # the GEMM path is f32 and the C path int8: agree to int8's error
        assert_close(a, r, atol=0.05, rtol=0.05, name=f"prompt of {n} ({auto._prefill_path(n)})")
        assert_close(auto.step(5).copy(), ref.step(5).copy(), atol=0.05, rtol=0.05,
                     name="the step after it")
    with pytest.raises(ValueError, match="'c', 'gemm', 'int8', 'auto'"):
        decode.Decoder(m, "int8", 1, prefill="fast")


def test_the_prompt_has_its_own_threads():
    """Rungs 2 and 3 decode on one core and take the prompt through the GEMM branch on the
    model's threads: the same logits and cache as on one thread, the step stays on one, and a
    call with more threads than the workspace was carved for is refused, not run."""
    m = _model(context=4 * 4 * 32)
    one = decode.Decoder(m, "f32", 1, prefill="gemm")
    two = decode.Decoder(m, "f32", 1, prefill="gemm", prompt_threads=2)
    assert (one.threads, one.prompt_threads) == (1, 1)
    assert (two.threads, two.prompt_threads) == (1, 2)
    assert int(two._m.max_threads) == 2 and two.par_min_bytes == 0
    toks = np.random.default_rng(5).integers(0, m.config.vocab, 100)
    assert_close(two.prefill(toks).copy(), one.prefill(toks).copy(), rtol=1e-5, atol=1e-5)
    assert_close(two.step(3).copy(), one.step(3).copy(), rtol=1e-5, atol=1e-5)
    one.reset()
    with pytest.raises(ForwardError, match="more threads"):
        one._run(np.zeros(1, np.int32), np.empty((1, m.config.vocab), np.float32), False, 2)
    assert one.pos == 0
    for i in ("c_call", "int8"):
        assert decode.rung_decoder(i, m, threads=2).prompt_threads == 2


@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_the_int8_decoders_prompt_through_the_integer_gemm(block):
    """prefill="int8": the int8 weights as Q8_0 rows through kernels_c/forward/qgemm.c, the
    activations rounded per block of 32 as the C path's are: the
    prompt's logits and the step after it agree with the C path's to int8's error, the
    decoder's copy holds the tiles' own integers, and an f32 decoder is refused the path."""
    m = _model(block, context=4 * 4 * 32)
    q = decode.Decoder(m, "int8", 2, prefill="int8")
    ref = decode.Decoder(m, "int8", 2, prefill="c")
    assert q.int8_prompt and not ref.int8_prompt
    toks = np.random.default_rng(4).integers(0, m.config.vocab, 150)
    assert_close(q.prefill(toks).copy(), ref.prefill(toks).copy(), atol=0.05, rtol=0.05,
                 name="prompt through the integer GEMM")
    assert_close(q.step(5).copy(), ref.step(5).copy(), atol=0.05, rtol=0.05, name="the step after")
    t = q.spec.layers[0]["qkv"]
    qq, ss = t.pk.q8
    blocks = t.q8_0.reshape(t.N, -1, 34)
    assert np.array_equal(blocks[:, :, 2:].view(np.int8).transpose(1, 2, 0).reshape(t.K, t.N),
                          qq[:t.K])
    assert np.array_equal(blocks[:, :, :2].copy().view(np.float16)[..., 0].T, ss.astype(np.float16))
    with pytest.raises(ValueError, match="int8"):
        decode.Decoder(m, "f32", 1, prefill="int8")
    with pytest.raises(ValueError, match="path"):
        ref.forward([1, 2], path="int8")


def test_the_integer_gemm_path_follows_the_timed_rates(monkeypatch):
    """forward.int8_path takes the tiles only where prompt_rates timed them faster than the
    vector kernel, and a decoder made then runs its prompt there (gemm_int8 = 2): the same
    logits as the vector kernel's to float32's summing order."""
    from smallem.generating import forward

    rates = {"int8": 2.0, "float": 1.0}
    monkeypatch.setattr(forward, "prompt_rates", lambda level=None: dict(rates))
    assert forward.int8_path() == "vector" and forward.default_prompt_dtype() == "int8"
    rates["amx"] = 1.5
    assert forward.int8_path() == "vector"
    rates["amx"], rates["float"] = 3.0, 2.5
    assert forward.int8_path() == "amx" and forward.default_prompt_dtype() == "int8"
    rates["float"] = 4.0
    assert forward.default_prompt_dtype() != "int8"
    if not forward._q_amx(None):
        return
    m = _model("modern", context=4 * 4 * 32)
    toks = np.random.default_rng(4).integers(0, m.config.vocab, 100)
    got = {}
    for amx in (False, True):
        rates.update({"amx": 3.0 if amx else 1.0, "int8": 2.0, "float": 1.0})
        q = decode.Decoder(m, "int8", 2, prefill="int8")
        assert q._int8_code == (2 if amx else 1)  # what its integer prompt sets gemm_int8 to
        got[amx] = q.prefill(toks).copy()
    assert_close(got[True], got[False], rtol=1e-4, atol=1e-4, name="tiles against the vector kernel")


# ---------------------------------------------------------------- the recurrent block

@pytest.mark.parametrize("prefill", ["c", "gemm"])
def test_the_recurrent_decoder_carries_its_state(level, prefill):
    """Appendix D's decode: the C forward with one state a head in place of the KV cache
    gives the training model's logits for a prompt and every step after it (f32: to
    float32's rounding; int8: to int8's), on one thread and two; reset() starts from a zero
    state again; the rung-1 KV cache refuses the block in one line."""
    m = _model("recurrent", context=80)
    toks = np.random.default_rng(2).integers(0, 256, 70)
    want = m.forward(toks[None].astype(np.int32))[49:].astype(np.float64)
    scale = np.abs(want).max()
    for dtype, tol in (("f32", 1e-5), ("int8", 0.06)):
        for threads in (1, 2) if dtype == "f32" else (2,):
            d = decode.Decoder(m, dtype, threads, prefill=prefill)
            got = [d.prefill(toks[:50]).copy()] + [d.step(int(t)).copy() for t in toks[50:]]
            err = np.abs(np.vstack(got) - want).max() / scale
            assert err <= tol, (dtype, threads, err)
            assert d.k.shape == (2, 4, 16, 16) and d.k.any()
            d.reset()
            assert not d.k.any() and np.array_equal(d.prefill(toks[:50]), got[0])
    with pytest.raises(ValueError, match="no keys and values"):
        decode.NumpyCache(m)


def test_the_recurrent_model_generates():
    m = _model("recurrent", context=64)
    g = decode.Generator(m, dtype="int8", threads=2)
    a = b"".join(g.generate(b"def ", 20, temperature=0.9, top_k=40, seed=3))
    assert a == b"".join(g.generate(b"def ", 20, temperature=0.9, top_k=40, seed=3))
