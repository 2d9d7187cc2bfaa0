"""Others' models: GGUF files of the llama family read (smallem.generating.gguf_file), tokenized
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
from smallem.generating import decode, gguf_export, gguf_file, gguf_model, gguf_products, gguf_tokenizer
from smallem.generating.forward import Forward
from smallem.plumbing import build
from smallem.book.ch4 import llama
from smallem.generating.gguf_file import GGUFError
from smallem.training.model import GPT, Config

VOCABS = ["llama-spm", "llama-bpe", "qwen2", "gpt-2", "phi-3", "gemma-4"]
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
    more = dict(window=3, swa_pattern=2, rope_base_swa=1e4, base=1e6, rope_linear=4.0,
                softcap=20.0) if arch == "gemma3" else {}
    p = gguf_models.write(tmp_path / "m.gguf", arch, None, head_dim=32 if arch == "qwen3" else None,
                          rope_freqs=arch == "llama", **more)
    ids = list(b"hello there")
    for like in (False, True):  # and as llama.cpp rounds (its flash attention, the window)
        ref = gguf_model.Reference(gguf_file.open_model(p), like_llama=like)
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
# The greedy text (what a user sees): our C forward rounds each activation as llama.cpp does
# (Q8_0, Q8_K, f16, bf16, the query to f16) and sums the attention in f16 as ggml's flash
# attention does, so what still parts the two is the order of float sums (and an expf a unit
# apart): a choice closer than NEAR_TIE of the logits' spread may go either way and ends the
# comparison there
NEAR_TIE = {"F32": 1e-3}
PROMPTS = ("Once upon a time", "The capital of France is", "def main():\n")
MIN_COMPARED = 8

# The logits (what the text hides): llama.cpp's own rows, by our llama-logits program (its
# greedy path: prompt as one batch, then one token a step, llama-simple's context), and ours
# teacher-forced along that path, so that the two never part. The distance of a step is
#     max over the vocabulary of |ours - llama.cpp's| / (the standard deviation of llama.cpp's row),
# and every step of STEPS must be within LOGITS_TOL of its file's type. Measured on this
# machine's files (3 prompts x 33 rows each; seed 0, and seed 1 for the first three
# architecture files), the largest distance of any step, over llama / qwen2 / qwen3 (phi3 not
# measured yet):
#   F32 files of ARCH_VOCABS: llama-spm 0.011, llama-bpe 0.033, qwen2 0.015
#   F32 0.005 / 0.025 / 0.015   F16 0.027 / 0.027 / 0.037   BF16 0.20 / 0.15 / 0.19
#   Q8_0 0.30 / 0.50 / 0.62     Q4_0 0.44 / 0.66 / 0.97     Q4_K_M 0.67 / 0.88 / 1.15
#   Q6_K 0.77 / 0.47 / 1.39
# Most steps of an F32 file are ~1e-5 (the order of float sums); the rest, and every larger
# number, is one rounding that lands the other side of its boundary in the two programs (a
# key or value cached in f16, an activation rounded to 8 bits), whose error then flows
# through the layers; the output rows' log-normal lengths make the largest of them stand out.
# The tolerances (llama.LOGITS_TOL) are about twice these; a bias left out or RoPE pairing the
# halves gives 5.5 to 14 (test_the_logits_distance_fails_a_wrong_forward).
LOGITS_TOL, distance = llama.LOGITS_TOL, llama.distance
STEPS = 32


def teacher_forced(mf, ids, chosen, threads=2):
    """Our logits along a given path: the prompt ``ids`` at once, then each of ``chosen``
    (all but its last) one at a time, as llama-logits feeds them."""
    fw = Forward.from_gguf(mf, threads=threads)
    rows = [fw.forward(ids)]
    rows += [fw.forward([int(t)]) for t in chosen[:-1]]
    return np.stack(rows)


def _logits_tool():
    if TOOLS is None or not TOOLS.get("logits"):
        pytest.skip("no llama-logits: `make llama` builds it")
    return TOOLS


def _compare_logits(path, ours_path=None, prompts=PROMPTS, steps=STEPS):
    """The largest step distance between llama.cpp's rows on ``path`` and ours on
    ``ours_path`` (the same file unless given), for each of ``prompts``, along llama.cpp's
    greedy path; also llama.cpp's chosen ids and the prompt ids (of the last prompt)."""
    tools = _logits_tool()
    mf = gguf_file.open_model(path)
    ours_mf = mf if ours_path is None else gguf_file.open_model(ours_path)
    tk = gguf_tokenizer.from_model_file(mf)
    worst = []
    for prompt in prompts:
        ids = tk.encode(prompt)
        chosen, theirs = llama.logits(path, ids, steps, 2, tools)
        assert theirs.shape == (steps + 1, mf.hyper.vocab)
        assert np.array_equal(chosen, theirs.argmax(axis=1))
        worst.append(distance(teacher_forced(ours_mf, ids, chosen), theirs).max())
    return max(worst), mf


@pytest.mark.parametrize("arch,vocab", ARCH_VOCABS)
def test_greedy_tokens_equal_llama_simples_for_each_architecture(tmp_path, arch, vocab):
    """The text a user sees: our greedy tokens (the C forward's, what `smallem run` gives)
    against llama-simple's text on the same F32 file, for the one of PROMPTS whose tokens go
    furthest before a near-tie."""
    _vocab(vocab)
    p = gguf_models.write(tmp_path / "m.gguf", arch, vocab,
                          head_dim=32 if arch == "qwen3" else None)
    simple = _tool("llama-simple")
    mf = gguf_file.open_model(p)
    tk = gguf_tokenizer.from_model_file(mf)
    tie, n, best = NEAR_TIE["F32"], 32, None
    for prompt in PROMPTS:
        ids = tk.encode(prompt)
        ours, margins = _greedy(Forward.from_gguf(mf, threads=2), tk, ids, n)
        first_tie = next((i for i, m in enumerate(margins) if m < tie), len(margins))
        if best is None or first_tie > best[0]:
            best = (first_tie, prompt, ids, ours)
    first_tie, prompt, ids, ours = best
    r = subprocess.run([simple, "-m", str(p), "-n", str(n), prompt], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    assert first_tie >= MIN_COMPARED, f"a near-tie at step {first_tie}"
    want = b"".join(tk.piece(i, True) for i in ids + ours[:first_tie])
    assert r.stdout.startswith(want), (want[:120], r.stdout[:120])


@pytest.mark.parametrize("arch,vocab", ARCH_VOCABS)
def test_logits_equal_llama_cpps_for_each_architecture(tmp_path, arch, vocab):
    """Every row of logits along llama.cpp's greedy path within LOGITS_TOL["F32"] of its own,
    on an F32 file with a real vocabulary."""
    _vocab(vocab)
    p = gguf_models.write(tmp_path / "m.gguf", arch, vocab,
                          head_dim=32 if arch == "qwen3" else None)
    worst, _ = _compare_logits(p)
    assert worst <= LOGITS_TOL["F32"], worst


def test_a_kept_model_file_is_the_file_written_now(tmp_path):
    """gguf_models keeps the files it writes (the kernel cache's folder) and copies them later:
    the copy is byte for byte the file written now, and another argument is another file."""
    _vocab("llama-spm")
    a = gguf_models.write(tmp_path / "a.gguf", "qwen2", "llama-spm", seed=3)
    b = gguf_models.write(tmp_path / "b.gguf", "qwen2", "llama-spm", seed=3)  # kept by now
    now = gguf_models.write(tmp_path / "now.gguf", "qwen2", "llama-spm", seed=3, keep=False)
    assert a.read_bytes() == b.read_bytes() == now.read_bytes()
    other = gguf_models.write(tmp_path / "c.gguf", "qwen2", "llama-spm", seed=4)
    assert other.read_bytes() != now.read_bytes()


def _quantised(tmp_path, arch, qtype, **kw):
    """One F32 file (shapes that fill K-quants' blocks of 256) and, for another type, the file
    llama.cpp's own llama-quantize makes of it: the tensors we read are llama.cpp's bytes."""
    _vocab("llama-spm")
    if arch == "gemma3":  # two layers: one slides (a window the prompts cross), one does not
        kw = {**{k: v for k, v in GEMMA3.items() if k not in ("d", "hidden", "n_head", "n_kv_head")}, **kw}
    src = gguf_models.write(tmp_path / "f32.gguf", arch, "llama-spm", d=256, n_head=4,
                            n_kv_head=2, hidden=512, **{"n_layer": 1, **kw},
                            head_dim=128 if arch == "qwen3" else None)
    if qtype == "F32":
        return src
    tool = _tool("llama-quantize")

    def quantize(out):
        r = subprocess.run([tool, str(src), str(out), qtype], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-500:]

    # kept as the written files are, under the F32 file's bytes and the tool's identity
    return gguf_models.kept(tmp_path / f"{qtype}.gguf", f"quantize:{qtype}:{build.file_identity(tool)}:"
                            f"{gguf_models.digest(src)}", quantize)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("arch", list(gguf_file.ARCHS))
def test_logits_equal_llama_cpps_for_each_type(tmp_path, arch, qtype):
    """Each type: every row along llama.cpp's greedy path within LOGITS_TOL of its own."""
    p = _quantised(tmp_path, arch, qtype)
    worst, mf = _compare_logits(p)
    kinds = set(mf.type_mix())
    assert qtype.split("_M")[0] in kinds, kinds        # Q4_K_M: Q4_K, with some Q6_K
    assert worst <= LOGITS_TOL[qtype], worst


def _halves_pairing(t, h):
    """q and k rows reordered in each head so that a forward pairing neighbours (2i, 2i+1),
    as llama's RoPE does, pairs the original's halves (i, i + head_dim/2): the wrong RoPE."""
    hd = h.head_dim
    order = np.stack([np.arange(hd // 2), np.arange(hd // 2) + hd // 2], axis=1).reshape(-1)
    out = dict(t)
    for name, a in t.items():
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = a.reshape(-1, hd, a.shape[-1])
            out[name] = np.ascontiguousarray(heads[:, order].reshape(a.shape))
    return out


MUTATIONS = {  # a bug in our forward, as the file our side reads
    "no q bias": ("qwen2", lambda t, h: {n: (np.zeros_like(a) if n.endswith("attn_q.bias") else a)
                                         for n, a in t.items()}),
    "no v bias": ("qwen2", lambda t, h: {n: (np.zeros_like(a) if n.endswith("attn_v.bias") else a)
                                         for n, a in t.items()}),
    "RoPE pairs the halves": ("llama", _halves_pairing),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_the_logits_distance_fails_a_wrong_forward(tmp_path, mutation):
    """The tolerances are tight enough to fail a real bug: our side reads a file with one
    part of the model changed as a bug would change it (a bias dropped, RoPE's pairs taken
    from the halves of each head), llama.cpp the file itself; the distance is then far above
    every tolerance (ten times the F32 file's own)."""
    _logits_tool()
    arch, change = MUTATIONS[mutation]
    src = gguf_models.write(tmp_path / "m.gguf", arch, None)
    h = gguf_file.open_model(src).hyper
    bad = _rewrite(tmp_path, "bad.gguf", lambda k, t: (k, change(t, h), arch), src=src)
    same, _ = _compare_logits(src, src)
    worst, _ = _compare_logits(src, bad)
    assert same <= LOGITS_TOL["F32"], same
    assert worst > max(10 * LOGITS_TOL["F32"], max(LOGITS_TOL.values())), (mutation, worst)


# ---------------------------------------------------------------- gemma3

# gemma3 at a small shape: a window of 6 (prompt and generated tokens cross it many times),
# layer 0 sliding (rope base 10 000) and layer 1 global (base 10^6, linear scaling 8, as
# gemma3:4b's global layers), the embedding scaled by sqrt(d); gemma's own 262 144 tokens
GEMMA3 = dict(d=256, n_head=4, n_kv_head=2, hidden=512, n_layer=2, window=6, swa_pattern=2,
              base=1e6, rope_base_swa=1e4, rope_linear=8.0, rope_scaling="linear")
# the oracle rounds as llama.cpp does; what parts them is the order of float sums: a choice
# closer than this of the logits' spread may go either way and ends the comparison there
GEMMA3_TIE = {"F32": 1e-3, "Q8_0": 0.1, "Q4_K_M": 0.1}


@pytest.fixture(scope="module")
def gemma3_f32(tmp_path_factory):
    _vocab("gemma-4")
    return gguf_models.write(tmp_path_factory.mktemp("gemma3") / "F32.gguf", "gemma3",
                             "gemma-4", **GEMMA3)


def _against_llama_simple(path, tie, model, n=32):
    """The greedy tokens of ``model`` ("c": the C forward, what `smallem run` gives;
    "oracle": the numpy forward that rounds as llama.cpp does, float32, its matrices kept)
    against llama-simple's text on the same file, for the first of PROMPTS whose tokens go
    furthest before a near-tie; at least MIN_COMPARED equal."""
    simple = _tool("llama-simple")
    mf = gguf_file.open_model(path)
    tk = gguf_tokenizer.from_model_file(mf)
    best = None
    for prompt in PROMPTS:
        ids = tk.encode(prompt)
        ref = (Forward.from_gguf(mf, threads=2) if model == "c" else
               gguf_model.Reference(mf, np.float32, like_llama=True, keep=True))
        ours, margins = _greedy(ref, tk, ids, n)
        first_tie = next((i for i, m in enumerate(margins) if m < tie), len(margins))
        if best is None or first_tie > best[0]:
            best = (first_tie, prompt, ids, ours)
        if first_tie == len(margins):  # no later prompt can go further
            break
    first_tie, prompt, ids, ours = best
    r = subprocess.run([simple, "-m", str(path), "-n", str(n), prompt], capture_output=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    assert first_tie >= MIN_COMPARED, f"a near-tie at step {first_tie}"
    want = b"".join(tk.piece(i, True) for i in ids + ours[:first_tie])
    assert r.stdout.startswith(want), (want[:120], r.stdout[:120])
    return mf, ids, first_tie


@pytest.mark.parametrize("qtype,model", [("F32", "c"), ("Q8_0", "c"), ("Q4_K_M", "c"),
                                         ("F32", "oracle")])
def test_gemma3s_greedy_tokens_equal_llama_simples(tmp_path, gemma3_f32, qtype, model):
    """gemma3 (sliding window, post norms, GeGLU, scaled embedding, q/k norms, per-layer rope)
    through the C forward, and on F32 through the numpy oracle that rounds as llama.cpp does,
    against llama-simple, on one F32 file with gemma's vocabulary and its llama-quantize
    copies."""
    p = gemma3_f32
    if qtype != "F32":
        p = tmp_path / f"{qtype}.gguf"
        r = subprocess.run([_tool("llama-quantize"), str(gemma3_f32), str(p), qtype],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-500:]
    mf, ids, compared = _against_llama_simple(p, GEMMA3_TIE[qtype], model)
    h = mf.hyper
    assert h.window == 6 and h.swa_layers == (True, False) and h.arch.embed_scale
    assert h.rope_scale == 1 / 8 and h.rope_base_swa == 1e4 and h.rope_base == 1e6
    assert len(ids) + compared > h.window + 2              # the window is crossed
    assert qtype.split("_M")[0] in set(mf.type_mix())


def test_gemma3s_differences_each_change_the_logits(tmp_path):
    """Each of gemma3's differences changes the oracle's logits: the window (past it, not
    before), the post norms and their weights, the embedding's scale, the window layers' rope
    base, GeGLU, the softcap; and the window's layers are read as llama.cpp reads them."""
    import dataclasses
    kw = dict(d=64, n_layer=2, window=4, swa_pattern=2, base=1e6, rope_base_swa=1e4)
    ids = list(b"a longer prompt")
    p = gguf_models.write(tmp_path / "w.gguf", "gemma3", None, **kw)

    def logits(arch=None, **change):
        mf = gguf_file.open_model(p)
        a = dataclasses.replace(mf.hyper.arch, **(arch or {}))
        mf.hyper = dataclasses.replace(mf.hyper, arch=a, **change)
        return gguf_model.Reference(mf).forward(ids, all_logits=True)

    base = logits()
    far = lambda x: np.abs(x - base).max() > 1e-3 * np.abs(base).max()  # noqa: E731
    wide = logits(window=len(ids))                    # a window that hides nothing
    assert np.array_equal(base[:4], wide[:4]) and far(wide)   # the same until it slides
    for change in (dict(swa_layers=(False, False)), dict(rope_base_swa=1e6),
                   dict(arch={"embed_scale": False}), dict(arch={"post_norms": False}),
                   dict(arch={"mlp": "swiglu"}), dict(softcap=5.0)):
        assert far(logits(**change)), change
    mf = gguf_file.open_model(p)                      # a post norm's weights are read
    t = mf.tensors["blk.1.post_ffw_norm.weight"]
    t.data = np.asarray(t.data) * 2
    assert far(gguf_model.Reference(mf).forward(ids, all_logits=True))
    # llama.cpp's pattern: a period n slides every layer but each n-th (the default 6), or a
    # bool a layer; no window key, no window
    h = gguf_file.open_model(gguf_models.write(tmp_path / "d.gguf", "gemma3", None, n_layer=7,
                                               window=4)).hyper
    assert h.swa_layers == (True,) * 5 + (False, True) and h.is_swa(0) and not h.is_swa(5)
    h = gguf_file.open_model(gguf_models.write(tmp_path / "l.gguf", "gemma3", None, n_layer=3,
                                               window=4, swa_pattern=[False, True, True])).hyper
    assert h.swa_layers == (False, True, True)
    h = gguf_file.open_model(gguf_models.write(tmp_path / "n.gguf", "gemma3", None)).hyper
    assert h.window == 0 and not h.is_swa(0) and h.attn_scale == 1 / np.sqrt(h.head_dim)
    bad = gguf_models.write(tmp_path / "b.gguf", "gemma3", None, n_layer=3, window=4,
                            swa_pattern=[True, False])
    with pytest.raises(GGUFError, match="sliding_window_pattern has 2 entries") as e:
        gguf_file.open_model(bad)
    assert "\n" not in str(e.value)


def test_gemma3s_chat_prompt_is_gemmas_turns(tmp_path):
    """The writer gives gemma3 files gemma's turns as their chat template; chat_prompt renders
    them (a system message opens the first user turn, the assistant's turns are the model's)."""
    mf = gguf_file.open_model(gguf_models.write(tmp_path / "c.gguf", "gemma3", None))
    tk = gguf_tokenizer.from_model_file(mf)
    got = gguf_model.chat_prompt(mf, tk, [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": " Hi! "},
                                          {"role": "assistant", "content": "Hello."},
                                          {"role": "user", "content": "2+2?"}])
    assert got == (tk.tokens[tk.bos] + "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
                   "<start_of_turn>model\nHello.<end_of_turn>\n"
                   "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n")


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


def _rewrite(tmp_path, name, edit, src=None):
    """A copy of a small good file (or of ``src``) with ``edit(keys, tensors)`` applied
    through the writer."""
    import gguf
    src = gguf.GGUFReader(str(src or _small(tmp_path)))
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
