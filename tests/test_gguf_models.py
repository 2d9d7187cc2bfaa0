"""Others' models: GGUF files of the llama family read (smallem.gguf_file), tokenized
(gguf_tokenizer) and run (gguf_model), with llama.cpp as the judge where `make llama` built it.

No model can be downloaded here, so the tests write them (tests/gguf_models.py): random
weights, a real vocabulary from llama.cpp's tokenizer test files, F32 written by the
``gguf`` package and every other type made from it by llama.cpp's own ``llama-quantize``.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import gguf_models
from smallem import decode, gguf_export, gguf_file, gguf_model, gguf_run, gguf_tokenizer
from smallem.book.ch4 import llama
from smallem.gguf_file import GGUFError
from smallem.model import GPT, Config

VOCABS = ["llama-spm", "llama-bpe", "qwen2", "gpt-2", "phi-3"]
TOOLS = llama.find()
BIN = Path(TOOLS["bench"]).parent if TOOLS else None


def _vocab(name):
    p = gguf_models.vocab_file(name)
    if p is None:
        pytest.skip("llama.cpp's tokenizer test files are not here: `make llama` unpacks them")
    return p


def _tool(name):
    if BIN is None or not (BIN / name).is_file():
        pytest.skip(f"no {name}: `make llama` builds it")
    return str(BIN / name)


def _cases(path: Path):
    raw = Path(str(path) + ".inp").read_bytes().decode("utf-8", errors="surrogateescape")
    inp = raw.split("\n__ggml_vocab_test__\n")
    if inp and inp[-1] == "":
        inp = inp[:-1]
    out = Path(str(path) + ".out").read_text().split("\n")
    return [(t, [int(x) for x in o.split()]) for t, o in zip(inp, out)]


# ---------------------------------------------------------------- tokenizers

@pytest.mark.parametrize("name", VOCABS)
def test_tokenizer_gives_llama_cpps_ids_for_its_test_files(name):
    path = _vocab(name)
    _, tok = gguf_file.read_metadata(path)
    tk = gguf_tokenizer.Tokenizer(tok, path)
    cases = _cases(path)
    assert len(cases) > 30
    for text, want in cases:
        got = tk.encode(text, add_special=False)
        assert got == want, (name, text)
        assert tk.decode(got) == text, (name, text)


def _small_spm():
    """A SentencePiece-style vocabulary of a few pieces, byte fallback for the rest."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    words = ["\u2581", "a", "b", "c", "\u2581a", "ab", "\u2581ab", "abc", "\u2581abc", "ca"]
    scores = [0.0] * len(pieces) + [-float(i) for i in range(len(words))]
    return {"model": "llama", "tokens": pieces + words, "token_type": types + [1] * len(words),
            "scores": scores, "bos_token_id": 1, "eos_token_id": 2}


def test_spm_merges_by_score_and_falls_back_to_bytes():
    tk = gguf_tokenizer.Tokenizer(_small_spm())
    ids = {t: i for i, t in enumerate(tk.tokens)}
    assert tk.encode("abc") == [1, ids["\u2581abc"]]          # BOS, then the best piece
    assert tk.encode("abc", add_special=False) == [ids["\u2581abc"]]
    # "é" is no piece: its two UTF-8 bytes, as byte tokens
    assert tk.encode("é", add_special=False) == [ids["\u2581"], ids["<0xC3>"], ids["<0xA9>"]]
    assert tk.decode(tk.encode("ab cab é")) == "ab cab é"


def test_control_tokens_are_text_unless_parse_special():
    tk = gguf_tokenizer.Tokenizer(_small_spm())
    plain = tk.encode("a</s>", add_special=False)
    assert 2 not in plain and tk.decode(plain) == "a</s>"
    parsed = tk.encode("a</s>", add_special=False, parse_special=True)
    assert parsed[-1] == 2 and 2 not in parsed[:-1]


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_byte_vocabulary_round_trips_any_text(text):
    tk = gguf_tokenizer.Tokenizer({"model": "gpt2", "pre": "default",
                                   "tokens": gguf_export.byte_tokens(), "merges": ["~ ~"],
                                   "bos_token_id": 0, "eos_token_id": 0})
    ids = tk.encode(text)
    assert ids == list(text.encode())           # smallem's own byte ids, as llama.cpp gives
    assert tk.decode(ids) == text


def test_unsupported_tokenizers_are_one_line_errors():
    with pytest.raises(GGUFError, match="tokenizer model 'bert' is not supported"):
        gguf_tokenizer.Tokenizer({"model": "bert", "tokens": ["a"]})
    with pytest.raises(GGUFError, match="pre-tokenizer 'tekken' is not supported"):
        gguf_tokenizer.Tokenizer({"model": "gpt2", "pre": "tekken", "tokens": ["a"]})
    with pytest.raises(GGUFError, match="scores"):
        gguf_tokenizer.Tokenizer({"model": "llama", "tokens": ["a"], "bos_token_id": 0})


# ---------------------------------------------------------------- the forward

def _modern(seed=0):
    cfg = Config("t", d_model=64, n_layer=2, n_head=4, context=64, block="modern")
    m = GPT(cfg, "kernels", seed=seed)
    rng = np.random.default_rng(seed + 1)
    for p in m.params.values():
        p[...] += rng.normal(0, 0.05, p.shape)
    return m


def test_our_exported_model_runs_as_llama_with_our_decoders_logits(tmp_path):
    """smallem's modern block exported as llama: the GGUF forward (float64, from the file)
    gives the logits chapter 4's f32 decoder gives, from the model itself."""
    m = _modern()
    mf = gguf_file.open_model(gguf_export.export(m, tmp_path / "m.gguf", "f32"))
    assert mf.hyper.arch.name == "llama" and mf.hyper.tied
    tk = gguf_tokenizer.from_model_file(mf)
    ids = tk.encode("def f(x):\n    return x")
    assert ids == list(b"def f(x):\n    return x")
    got = gguf_model.Reference(mf).forward(ids, all_logits=True)
    want = decode.Decoder(m, "f32", 1).all_logits(ids)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


@pytest.mark.parametrize("arch", list(gguf_file.ARCHS))
def test_the_cache_continues_the_full_forward(tmp_path, arch):
    p = gguf_models.write(tmp_path / "m.gguf", arch, None, head_dim=32 if arch == "qwen3" else None,
                          rope_freqs=arch == "llama")
    ref = gguf_model.Reference(gguf_file.open_model(p))
    ids = list(b"hello there")
    full = ref.forward(ids, all_logits=True)
    ref.reset()
    ref.forward(ids[:4])
    for i in range(4, len(ids)):
        step = ref.forward([ids[i]])
        assert np.abs(step - full[i]).max() <= 1e-9 * np.abs(full).max()
    with pytest.raises(ValueError, match="ids outside"):
        ref.forward([10**6])


def test_phi3s_fused_matrices_are_views_of_their_rows(tmp_path):
    """phi3 keeps q, k and v in one matrix and the gate and up in another: opened, they are
    the matrices the forward reads, in that order of rows, views of the file (no copy), and
    no byte is counted twice. Its long-context files are refused in one line."""
    mf = gguf_file.open_model(gguf_models.write(tmp_path / "m.gguf", "phi3", None))
    h, T = mf.hyper, mf.tensors
    fused = {t.name: np.asarray(t.data) for t in mf.reader.tensors}
    assert "blk.0.attn_qkv.weight" not in T and "blk.0.ffn_gate.weight" in T
    q, kv = h.n_head * h.head_dim, h.n_kv_head * h.head_dim
    for i in range(h.n_layer):
        b = f"blk.{i}."
        qkv, up = fused[b + "attn_qkv.weight"], fused[b + "ffn_up.weight"]
        parts = (("attn_q", qkv, 0, q), ("attn_k", qkv, q, kv), ("attn_v", qkv, q + kv, kv),
                 ("ffn_gate", up, 0, h.hidden), ("ffn_up", up, h.hidden, h.hidden))
        for name, whole, r0, n in parts:
            t = T[b + name + ".weight"]
            assert t.ne == (h.d, n) and np.shares_memory(t.data, whole)
            assert np.array_equal(t.dequantize(), whole[r0:r0 + n])
    assert mf.weight_bytes_per_token == sum(
        a.nbytes for name, a in fused.items() if name.startswith("blk.") and a.ndim == 2
    ) + T["output.weight"].nbytes
    long = gguf_models.write(tmp_path / "long.gguf", "phi3", None,
                             extra={"rope_factors_long.weight": np.ones(h.rope_dim // 2)})
    with pytest.raises(GGUFError, match="long-context RoPE factors are not supported"):
        gguf_file.open_model(long)


def _greedy(ref, tk, ids, n):
    """Our greedy tokens after ids, each step's margin between the best two logits over the
    logits' spread, stopping at an end-of-generation token."""
    out, margins = [], []
    lg = ref.forward(ids)
    for _ in range(n):
        top = np.sort(lg)[-2:]
        margins.append((top[1] - top[0]) / lg.std())
        t = int(lg.argmax())
        out.append(t)
        if t in gguf_model.eog_ids(tk):
            break
        lg = ref.forward([t])
    return out, margins


ARCH_VOCABS = [("llama", "llama-spm"), ("llama", "llama-bpe"), ("qwen2", "qwen2"),
               ("qwen3", "qwen2"), ("phi3", "phi-3")]
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_K_M", "Q6_K"]
# Our C forward rounds each activation as llama.cpp does (Q8_0, Q8_K, f16, bf16, the query to
# f16) and sums the attention in f16 as ggml's flash attention does, so what still parts the two
# is the order of float sums (and an expf a unit apart): a choice closer than NEAR_TIE of the
# logits' spread may go either way and ends the comparison there (1e-3 for F32, 0.02 for F16,
# a tenth for the 8-bit types, where such a difference now and then moves one rounding of an
# activation, and a rounding step of a block with a large value is wide)
NEAR_TIE = {"F32": 1e-3, "F16": 0.02}
PROMPTS = ("Once upon a time", "The capital of France is", "def main():\n")
MIN_COMPARED = 8


def _compare_with_llama_simple(path, tie, n=32):
    """Our greedy tokens (the C forward's, what `smallem run` gives) against llama-simple's
    on the same file, for the one of PROMPTS
    (fixed, so the choice is deterministic) whose tokens go furthest before a near-tie."""
    simple = _tool("llama-simple")
    mf = gguf_file.open_model(path)
    tk = gguf_tokenizer.from_model_file(mf)
    best = None
    for prompt in PROMPTS:
        ids = tk.encode(prompt)
        ours, margins = _greedy(gguf_run.Forward(mf, threads=2), tk, ids, n)
        first_tie = next((i for i, m in enumerate(margins) if m < tie), len(margins))
        if best is None or first_tie > best[0]:
            best = (first_tie, prompt, ids, ours, margins)
    first_tie, prompt, ids, ours, margins = best
    r = subprocess.run([simple, "-m", str(path), "-n", str(n), prompt], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    return mf, tk, ids, ours, margins, r.stdout


@pytest.mark.parametrize("arch,vocab", ARCH_VOCABS)
def test_greedy_tokens_equal_llama_simples_for_each_architecture(tmp_path, arch, vocab):
    _vocab(vocab)
    p = gguf_models.write(tmp_path / "m.gguf", arch, vocab,
                          head_dim=32 if arch == "qwen3" else None)
    _, tk, ids, ours, margins, theirs = _compare_with_llama_simple(p, NEAR_TIE["F32"])
    _same_up_to_a_near_tie(tk, ids, ours, margins, theirs, NEAR_TIE["F32"])


def _same_up_to_a_near_tie(tk, ids, ours, margins, theirs, tie):
    first_tie = next((i for i, m in enumerate(margins) if m < tie), len(margins))
    assert first_tie >= MIN_COMPARED, f"a near-tie at step {first_tie}: {margins}"
    want = b"".join(tk.piece(i, True) for i in ids + ours[:first_tie])
    assert theirs.startswith(want), (want[:120], theirs[:120])


@pytest.mark.parametrize("qtype", TYPES[1:])
@pytest.mark.parametrize("arch", list(gguf_file.ARCHS))
def test_greedy_tokens_equal_llama_simples_for_each_type(tmp_path, arch, qtype):
    """Each type made by llama-quantize from one F32 file (shapes that fill K-quants' blocks
    of 256): the tensors we read are llama.cpp's bytes; tokens equal up to the first choice
    closer than NEAR_TIE, and at least MIN_COMPARED of them."""
    _vocab("llama-spm")
    quantize = _tool("llama-quantize")
    src = gguf_models.write(tmp_path / "f32.gguf", arch, "llama-spm", d=256, n_head=4,
                            n_kv_head=2, hidden=512, n_layer=1,
                            head_dim=128 if arch == "qwen3" else None)
    p = tmp_path / f"{qtype}.gguf"
    r = subprocess.run([quantize, str(src), str(p), qtype], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    tie = NEAR_TIE.get(qtype, 0.1)
    mf, tk, ids, ours, margins, theirs = _compare_with_llama_simple(p, tie)
    kinds = set(mf.type_mix())
    assert qtype.split("_M")[0] in kinds, kinds        # Q4_K_M: Q4_K, with some Q6_K
    _same_up_to_a_near_tie(tk, ids, ours, margins, theirs, tie)


@pytest.mark.parametrize("qtype", ["F16", "BF16", "Q8_0", "Q4_0"])
def test_every_type_dequantises_as_the_gguf_package_does(qtype, rng):
    """Tensor.dequantize of a (3, 64) matrix in each type the gguf package can write: the
    package's reference values, bit for bit, in numpy's (rows, columns) order."""
    import gguf
    w = rng.normal(0, 1, (3, 64)).astype(np.float32)
    if qtype == "F16":
        raw = w.astype(np.float16).view(np.uint8)
    else:
        raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
    t = gguf_file.Tensor("w", qtype, (64, 3), raw)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
    got = t.dequantize()
    assert got.shape == (3, 64) and got.dtype == np.float32
    assert np.array_equal(got, want.astype(np.float32))
    assert np.abs(got - w).max() <= 0.2 * np.abs(w).max()   # and it is the matrix, in order


# ---------------------------------------------------------------- bad files

def _small(tmp_path, **kw):
    return gguf_models.write(tmp_path / "ok.gguf", "llama", None, **kw)


def _rewrite(tmp_path, name, edit):
    """A copy of a small good file with ``edit(writer_kwargs)`` applied through the writer."""
    import gguf
    src = gguf.GGUFReader(str(_small(tmp_path)))
    keys = {k: f for k, f in src.fields.items() if not k.startswith("GGUF.")
            and k != "general.architecture"}
    tensors = {t.name: np.asarray(t.data) for t in src.tensors}
    keys, tensors, arch = edit(keys, tensors)
    w = gguf.GGUFWriter(str(tmp_path / name), arch)
    for k, f in keys.items():
        v, t = f.contents(), f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            w.add_array(k, v)
        elif t == gguf.GGUFValueType.STRING:
            w.add_string(k, v)
        elif t == gguf.GGUFValueType.BOOL:
            w.add_bool(k, v)
        elif t == gguf.GGUFValueType.FLOAT32:
            w.add_float32(k, v)
        else:
            w.add_uint32(k, v)
    for n, a in tensors.items():
        w.add_tensor(n, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / name


def test_bad_files_are_one_line_errors(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        gguf_file.open_model(text)
    with pytest.raises(GGUFError, match="cannot be read"):
        gguf_file.open_model(tmp_path / "absent.gguf")
    good = _small(tmp_path).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[:len(good) - 1000])
    with pytest.raises(GGUFError, match="truncated"):
        gguf_file.open_model(cut)
    cases = {
        "arch.gguf": (lambda k, t, a: (k, t, "mamba"), "architecture 'mamba' is not supported"),
        "key.gguf": (lambda k, t, a: ({n: f for n, f in k.items()
                                       if n != "llama.block_count"}, t, a),
                     "'llama.block_count' is missing"),
        "shape.gguf": (lambda k, t, a: (k, {**t, "blk.0.attn_q.weight":
                                            t["blk.0.attn_q.weight"][:, :32].copy()}, a),
                       "blk.0.attn_q.weight.*shape"),
        "type.gguf": (lambda k, t, a: (k, {**t, "blk.1.ffn_up.weight":
                                           t["blk.1.ffn_up.weight"].astype(np.float64)}, a),
                      "F64.*not supported"),
        "tensor.gguf": (lambda k, t, a: (k, {n: v for n, v in t.items()
                                             if n != "blk.1.ffn_down.weight"}, a),
                        "'blk.1.ffn_down.weight' is missing"),
    }
    for name, (edit, msg) in cases.items():
        p = _rewrite(tmp_path, name, lambda k, t: edit(k, t, "llama"))
        with pytest.raises(GGUFError, match=msg) as e:
            gguf_file.open_model(p)
        assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_the_command_reports_a_bad_file_in_one_line_and_exits_2(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    r = subprocess.run([sys.executable, "-m", "smallem", "run", str(bad), "--prompt", "a"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and str(bad) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_the_command_describes_and_generates(tmp_path):
    p = _small(tmp_path)
    info = subprocess.run([sys.executable, "-m", "smallem", "run", str(p), "--info"],
                          capture_output=True, text=True)
    assert info.returncode == 0 and "architecture: llama" in info.stdout
    assert "F32" in info.stdout and "a token reads" in info.stdout
    run = lambda seed: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "smallem", "run", str(p), "--prompt", "ab", "--tokens", "12",
         "--temperature", "3", "--top-p", "1", "--seed", str(seed)], capture_output=True)
    a, b, c = run(1), run(1), run(2)
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout != c.stdout


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_files_load_correctly_or_fail_clearly(tmp_path, data):
    """Truncations anywhere and bytes flipped in the header and tensor table: each file
    either loads (and then runs a token) or is refused with a GGUFError, never anything else."""
    good = (tmp_path / "ok.gguf")
    if not good.exists():
        _small(tmp_path, d=32, n_head=2, n_kv_head=1, hidden=64, n_layer=1)
    raw = bytearray(good.read_bytes())
    table_end = 4000  # the metadata and tensor table of this small file lie in its first KiB's
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, min(table_end, len(raw)) - 1))
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
    p = tmp_path / "mutated.gguf"
    p.write_bytes(bytes(raw))
    try:
        mf = gguf_file.open_model(p)
    except GGUFError as e:
        assert "\n" not in str(e) and str(p) in str(e)
        return
    try:
        tk = gguf_tokenizer.from_model_file(mf)
        ids = tk.encode("ab") or [0]
        logits = gguf_model.Reference(mf).forward(ids[:mf.hyper.context])
    except GGUFError:
        return
    except ValueError as e:  # a prompt that no longer fits what the mutated file declares
        assert "context" in str(e) or "ids outside" in str(e), e
        return
    assert logits.shape == (mf.hyper.vocab,)
