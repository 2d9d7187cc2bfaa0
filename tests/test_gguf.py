"""Chapter 4: the GGUF export read back with the gguf package, and llama.cpp on it."""

import subprocess
import sys

import numpy as np
import pytest

from smallem import decode, gguf_export
from smallem.book.ch4 import llama
from smallem.model import GPT, Config
from smallem.quant import dequantize_q8, quantize_q8

gguf = pytest.importorskip("gguf")


def _model(block, seed=0, std=None, d=64, layers=2, heads=2, context=64):
    cfg = Config("t", d_model=d, n_layer=layers, n_head=heads, context=context, block=block)
    m = GPT(cfg, "kernels", seed=seed)
    rng = np.random.default_rng(seed + 1)
    for p in m.params.values():
        if std and p.ndim == 2:
            p[...] = rng.normal(0, std, p.shape)
        else:
            p[...] += rng.normal(0, 0.02, p.shape)
    return m


def _field(reader, key):
    f = reader.fields[key]
    part = f.parts[f.data[0]] if f.data else f.parts[-1]
    if f.types and f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(part).decode()
    return part.tolist()[0] if hasattr(part, "tolist") else part


@pytest.mark.parametrize("block", ["gpt2", "modern"])
@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_round_trip(tmp_path, block, dtype):
    m = _model(block)
    path = gguf_export.export(m, tmp_path / "m.gguf", dtype)
    r = gguf.GGUFReader(str(path))
    want = gguf_export.tensors(m)
    got = {t.name: t for t in r.tensors}
    assert set(got) == set(want)
    for name, (a, product) in want.items():
        t = got[name]
        if a.ndim == 2 and product and dtype == "q8_0":
            assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0, name
            back = gguf.quants.dequantize(t.data, t.tensor_type)      # (out, in)
            q, s = quantize_q8(a)
            assert np.array_equal(back, dequantize_q8(q, s, a.shape[0], np.float32).T), name
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, name
            expect = a.T if a.ndim == 2 else a
            assert np.array_equal(np.asarray(t.data).reshape(expect.shape), expect), name
    arch = "llama" if block == "modern" else "gpt2"
    assert _field(r, "general.architecture") == arch
    for key, value in gguf_export.metadata(m, dtype).items():
        got_v = _field(r, key)
        if isinstance(value, float):
            assert got_v == pytest.approx(value, rel=1e-6), key
        else:
            assert got_v == value, key
    tokens = r.fields["tokenizer.ggml.tokens"]
    spelt = [bytes(tokens.parts[i]).decode() for i in tokens.data]
    assert spelt == gguf_export.byte_tokens() and len(set(spelt)) == 256


def test_byte_tokens_are_gpt2s_map():
    t = gguf_export.byte_tokens()
    assert t[ord("A")] == "A" and t[ord(" ")] == "Ġ" and t[10] == "Ċ" and t[0] == "Ā"


def test_export_keeps_an_existing_file(tmp_path):
    m = _model("gpt2")
    path = tmp_path / "m.gguf"
    path.write_bytes(b"a user's file")
    with pytest.raises(FileExistsError, match="exists"):
        gguf_export.export(m, path)
    assert path.read_bytes() == b"a user's file"
    r = subprocess.run([sys.executable, "-m", "smallem", "export", "--config", "s", "--gguf",
                        str(path)], capture_output=True, text=True)
    assert r.returncode == 2 and "exists" in r.stderr and "Traceback" not in r.stderr
    assert path.read_bytes() == b"a user's file"
    gguf_export.export(m, path, overwrite=True)
    assert path.read_bytes()[:4] == b"GGUF"
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ValueError, match="dtype"):
        gguf_export.export(m, tmp_path / "x.gguf", "q4_0")
    odd = _model("gpt2", d=48, heads=2)  # rows of 48 weights: not whole Q8_0 blocks
    with pytest.raises(ValueError, match="multiple of 32"):
        gguf_export.export(odd, tmp_path / "odd.gguf", "q8_0")
    assert not (tmp_path / "odd.gguf").exists()


@pytest.mark.parametrize("block", ["gpt2", "modern"])
def test_llama_cpp_greedy_equals_ours(tmp_path, block):
    """llama.cpp's greedy bytes on our f32 export are ours, up to the first near-tie of our
    logits (where f32 rounding in a different order may pick the other token)."""
    tools = llama.find()
    if not tools or not tools.get("simple"):
        pytest.skip(f"no llama.cpp here (`make llama`, or ${llama.ENV}); the greedy check needs it")
    m = _model(block, seed=3, std=1.0, d=128, heads=4, context=128)
    path = gguf_export.export(m, tmp_path / "m.gguf")
    prompt = b"def hello(x):\n    return"
    n = 60
    theirs = llama.greedy(tools, path, prompt, n)
    dec = decode.Decoder(m, "f32", 1)
    logits, ours, margins = dec.prefill(list(prompt)), [], []
    for _ in range(n):
        top2 = np.sort(logits)[-2:]
        margins.append(top2[1] - top2[0])
        ours.append(int(np.argmax(logits)))
        logits = dec.step(ours[-1])
    close = next((i for i, g in enumerate(margins) if g < 0.02), n)
    assert close >= 10, "the test model's logits are too flat to compare"
    assert list(theirs[:close]) == ours[:close], (theirs[:close], bytes(ours[:close]))


def test_a_peer_that_dies_is_retried_once_then_reported(tmp_path):
    """llama-bench dying of an illegal instruction (its AMX kernels where Linux has not
    granted the tiles) is run again without its extra buffer types, and the flags stay for
    every later run; a peer that fails anyway is one line saying how, never a stopped book."""
    import json as _json
    import os
    import stat

    from smallem.book.ch4 import llama

    fake = tmp_path / "llama-bench"
    out = _json.dumps([{"samples_ts": [123.0]}])
    fake.write_text("#!/bin/sh\n"
                    "case \"$*\" in *'--repack 0'*) echo '" + out + "'; exit 0;; esac\n"
                    "kill -ILL $$\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    tools = {"bench": str(fake), "from": "test"}
    assert llama.bench(tools, tmp_path / "m.gguf", 1, gen=2) == [123.0]
    assert tools["flags"] == list(llama.NO_EXTRA) and "SIGILL" in tools["flags_why"]
    assert llama.usable(tools, tmp_path / "m.gguf", 1) is None
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'no such model' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    why = llama.usable({"bench": str(broken), "from": "test"}, tmp_path / "m.gguf", 1)
    assert why.startswith("llama-bench exited with status 3") and "no such model" in why
    assert llama.usable(None, tmp_path / "m.gguf", 1).startswith("not found")
    assert os.path.exists(fake)
