"""Chapter 4: the GGUF export read back with the gguf package, and llama.cpp on it."""

import subprocess
import sys

import numpy as np
import pytest

import captured

from smallem.generating import decode, gguf_export
from smallem.book.ch4 import llama
from smallem.training.model import GPT, Config
from smallem.generating.quant import dequantize_q8, quantize_q8

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


def test_llama_logits_is_llama_cpps_greedy_path_and_refuses_bad_arguments(tmp_path):
    """Our llama-logits program beside llama.cpp's tools: rows of logits whose argmax is the
    token it fed on, the same as llama-simple's greedy bytes; every bad argument one line on
    stderr and a nonzero status, never a crash; the wrapper says where it is missing."""
    with pytest.raises(FileNotFoundError, match="make llama"):
        llama.logits(tmp_path / "m.gguf", [1], 1, 1, {"bench": str(tmp_path / "x")})
    tools = llama.find()
    if not tools or not tools.get("logits") or not tools.get("simple"):
        pytest.skip("no llama-logits here: `make llama` builds it")
    m = _model("modern", seed=3, std=1.0, d=128, heads=4, context=128)
    path = gguf_export.export(m, tmp_path / "m.gguf")
    prompt = b"def hello(x):"
    chosen, rows = llama.logits(path, list(prompt), 6, 2, tools)
    assert rows.shape == (7, 256) and rows.dtype == np.float32 and np.isfinite(rows).all()
    assert np.array_equal(chosen, rows.argmax(axis=1))
    assert llama.greedy(tools, path, prompt, 6) == bytes(chosen[:6].tolist())
    out = str(tmp_path / "o.bin")
    base = [tools["logits"], "-m", str(path), "-t", "1", "-n", "2", "-o", out]
    bad = {"no arguments": [tools["logits"]],
           "no ids": base,
           "a word for an id": base + ["1,x"],
           "an empty id": base + ["1,,2"],
           "a negative id": base + ["-5"],
           "an id past the vocabulary": base + ["1,256"],
           "two id lists": base + ["1", "2"],
           "no steps": base[:5] + base[7:] + ["1"],
           "bad steps": base[:6] + ["many"] + base[7:] + ["1"],
           "zero threads": base[:4] + ["0"] + base[5:] + ["1"],
           "an unknown option": base + ["--flash", "1"],
           "a missing file": [tools["logits"], "-m", str(tmp_path / "absent.gguf"), "-t", "1",
                              "-n", "1", "-o", out, "1"],
           "not a model": [tools["logits"], "-m", __file__, "-t", "1", "-n", "1", "-o", out,
                           "1"],
           "past the context": base[:6] + ["500"] + base[7:] + ["1"],
           "an unwritable output": base[:8] + [str(tmp_path / "no" / "o.bin"), "1"]}
    for what, cmd in bad.items():
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode in (1, 2), (what, r.returncode, r.stderr)
        assert len(lines) == 1 and lines[0].startswith("llama-logits: "), (what, r.stderr)
    with pytest.raises(llama.LlamaError, match="outside the vocabulary"):
        llama.logits(path, [1, 999], 1, 1, tools)


def _fake_tool(path, body: str):
    import stat

    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


SAMPLES = '[{"samples_ts": [123.0]}]'


def test_a_peer_that_dies_is_retried_once_then_reported(tmp_path):
    """llama-bench dying in its default configuration, of any signal or exit status (SIGILL
    where AMX tiles were not granted, SIGSEGV on a Granite-Rapids-class Xeon), is run again
    without its extra buffer types, and the flags stay for every later run; a peer that
    fails anyway is one line saying how, never a stopped book."""
    from smallem.book.ch4 import llama

    for death in ("kill -ILL $$", "kill -SEGV $$", "exit 1"):
        fake = _fake_tool(tmp_path / "llama-bench",
                          "case \"$*\" in *'--repack 0'*) echo '" + SAMPLES + "'; exit 0;; esac\n"
                          + death + "\n")
        tools = {"bench": str(fake), "from": "test"}
        assert llama.bench(tools, tmp_path / "m.gguf", 1, gen=2) == [123.0]
        assert tools["flags"] == list(llama.NO_EXTRA)
        assert ("SIG" in tools["flags_why"]) == death.startswith("kill")
        assert llama.usable(tools, 1) is None  # its probe runs on quantised files
    broken = _fake_tool(tmp_path / "broken", "echo 'no such model' >&2\nexit 3\n")
    why = llama.usable({"bench": str(broken), "from": "test"}, 1)
    assert why.startswith("llama-bench exited with status 3") and "no such model" in why
    assert llama.usable(None, 1).startswith("not found")
    failed = {"bench": str(fake), "from": "test", "build": {"ok": False, "why": "SIGSEGV"}}
    assert llama.usable(failed, 1) == "its build does not run here: SIGSEGV"


def test_the_probe_runs_quantised_files_where_a_build_dies(tmp_path):
    """The peer is probed on Q8_0 and Q4_0 files, not only on an F16 one: a build that runs
    F32/F16 files and dies on every quantised one (seen on a Xeon) is caught before the
    chapter starts, and llama-simple is probed too (it has no safe configuration)."""
    from smallem.book.ch4 import llama

    bench = _fake_tool(tmp_path / "llama-bench", "echo '" + SAMPLES + "'\n")
    simple = _fake_tool(tmp_path / "llama-simple",
                        "case \"$*\" in *Q4_0*) kill -SEGV $$;; esac\nprintf '%s' \"$5\"xy\n")
    quantize = _fake_tool(tmp_path / "llama-quantize", 'cp "$1" "$2"\n')
    tools = {"bench": str(bench), "simple": str(simple), "quantize": str(quantize), "from": "test"}
    why = llama.usable(tools, 1)
    assert why is not None and why.startswith("llama-simple died of SIGSEGV")


def test_a_peer_dying_in_the_rounds_leaves_its_rows_out_and_says_why(tmp_path, monkeypatch):
    """Appendix B with a llama-bench that passes its probe and then dies of SIGSEGV on one
    file, in both configurations: the record is written, that file's llama.cpp rows are
    missing with the reason, the other file keeps its rows, and the table's note says so."""
    from smallem.book import figures, others
    from smallem.book.others import measuring

    fake = _fake_tool(tmp_path / "llama-bench",
                      "case \"$*\" in --version) echo 'fake 1'; exit 0;; *tiny-qwen2*) "
                      "kill -SEGV $$;; esac\necho '" + SAMPLES + "'\n")
    monkeypatch.setenv("SMALLEM_LLAMA_BENCH", str(fake))
    monkeypatch.setattr(measuring, "ROUNDS", 2)
    rec = measuring.bench_others(quick=True, progress=False, threads=1)
    missing = rec.data["settings"]["missing"]
    assert any(k.startswith("llama.cpp tg (tiny-qwen2") and "SIGSEGV" in v
               for k, v in missing.items()), missing
    names = {(r["name"], r["params"]["model"]) for r in rec.data["results"]}
    assert ("llama_tg", "tiny-llama") in names and ("llama_tg", "tiny-qwen2") not in names
    note = figures.peer_notes(rec.data["settings"]["llama_cpp"], missing)
    assert "not measured (llama-bench died of SIGSEGV" in note
    parts = [r for r in rec.data["results"] if r["name"] == "decode_parts"]  # the rest's parts
    assert {r["params"]["model"] for r in parts} == {"tiny-qwen2", "tiny-llama"}
    assert all(r["params"]["parts"]["attend"] > 0 and r["value"]["n"] == 2 for r in parts)


@pytest.mark.parametrize("name", captured.NAMES)
def test_llama_cpp_is_built_for_each_captured_cpu(name):
    """The build names the instruction sets a CPU has (never -march=native), AMX's tiles
    where the CPU has them and never elsewhere, on every machine met: AVX-512 only where all
    five of ggml's AVX512 flags are there; the safe build turns AMX off again; a build with
    AMX is keyed by the tile-configuration header it includes."""
    from smallem.book.ch4 import llama

    flags = captured.load(name).ident["flags"]
    opts = llama.isa_switches(flags)
    assert "-DGGML_NATIVE=OFF" in opts
    assert llama.amx_on(opts) == ("amx_tile" in flags)
    assert ("-DGGML_AMX_INT8=ON" in opts) == ("amx_tile" in flags and "amx_int8" in flags)
    # CMake takes the last value of a switch: the safe build's options, added after these,
    # leave no AMX on
    assert not llama.amx_on(opts + list(llama.SAFE_BUILD))
    assert ("-DGGML_AVX512=ON" in opts) == ("avx512f" in flags and "avx512bw" in flags)
    assert ("-DGGML_AVX2=ON" in opts) == ("avx2" in flags)
    assert ("-DGGML_AVX512_VNNI=ON" in opts) == ("avx512_vnni" in flags)


def test_the_tile_configuration_header_loads_all_64_bytes(tmp_path):
    """The header a llama.cpp build with AMX includes first: a program built with it at -O3
    fills a configuration as ggml does (in a function of its own, after which it is dead),
    loads it with _tile_loadconfig, and reads the tiles' rows and widths back (GCC 12's own _tile_loadconfig let the compiler drop the tiles' shapes, and
    ggml's kernels died of SIGILL). Compiled on every machine; run where the CPU has AMX."""
    import shutil
    import subprocess

    from smallem.book.ch4 import llama
    from smallem.cpu import machine_info

    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler")
    src = tmp_path / "cfg.cpp"
    src.write_text("""#include <immintrin.h>
__attribute__((noinline)) void load() {
    struct alignas(64) { unsigned char palette, start, pad[14]; unsigned short colsb[16];
                         unsigned char rows[16]; } c = {};
    c.palette = 1;
    for (int i = 0; i < 8; i++) { c.rows[i] = 16; c.colsb[i] = 64; }
    _tile_loadconfig(&c);
}
int main() {
    load();
    alignas(64) unsigned char back[64];
    __asm__ volatile("sttilecfg %0" : "=m"(*(char(*)[64])back));
    for (int i = 0; i < 8; i++)
        if (back[48 + i] != 16 || back[16 + 2 * i] != 64) return 1;
    return 0;
}
""")
    exe = tmp_path / "cfg"  # (without the header, GCC 12 builds one that exits 1 here)
    r = subprocess.run([cxx, "-O3", "-mamx-tile", "-include", str(llama.TILECFG), str(src),
                        "-o", str(exe)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"{cxx} cannot build AMX code: {r.stderr.strip()[-200:]}")
    if "amx_tile" not in machine_info.cpu_identity()["flags"]:
        pytest.skip("this CPU has no AMX tiles: the header compiles, its run waits for one")
    assert subprocess.run([str(exe)]).returncode == 0


def test_one_random_writer_serves_the_appendix_and_the_tests(tmp_path):
    """smallem.generating.gguf_random writes every tensor the reader expects, in the type its draw gives,
    with smallem's bytes padded to the asked vocabulary; a bad architecture or a vocabulary
    too small for the bytes is one clear error."""
    import numpy as np

    from smallem.generating import gguf_file, gguf_random
    from smallem.book.others import files

    p = files.write_random(tmp_path / "q.gguf", files.SHAPES["tiny-qwen2"])
    m = gguf_file.open_model(p)
    assert m.hyper.vocab == 1024 and m.hyper.arch.name == "qwen2" and m.hyper.tied
    seen = []

    def init(name, shape, ne, rng):
        seen.append((name, shape))
        return np.zeros(shape, np.float32)

    gguf_random.write(tmp_path / "l.gguf", "llama", init, d=32, n_layer=1, n_head=2,
                      n_kv_head=1, hidden=48, context=16, vocab=300, head_dim=24)
    h = gguf_file.open_model(tmp_path / "l.gguf").hyper
    assert (h.head_dim, h.vocab, h.n_kv_head) == (24, 300, 1)
    assert ("token_embd.weight", (300, 32)) in seen
    with pytest.raises(ValueError, match="unknown architecture"):
        gguf_random.write(tmp_path / "x.gguf", "nope", init, d=32, n_layer=1, n_head=2,
                          n_kv_head=1, hidden=48, context=16)
    with pytest.raises(ValueError, match="cannot hold the 256 bytes"):
        gguf_random.write(tmp_path / "y.gguf", "llama", init, d=32, n_layer=1, n_head=2,
                          n_kv_head=1, hidden=48, context=16, vocab=100)
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()


def _same_as_the_packages(path):
    """Our reader (smallem.generating.gguf_file.Reader) and gguf.GGUFReader read ``path``
    alike: every key with its types and value, every tensor's name, type, shape, offset,
    byte count and bytes."""
    from smallem.generating import gguf_file

    ours, theirs = gguf_file.Reader(path), gguf.GGUFReader(str(path))
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert keys == list(ours.fields)
    for k in keys:
        f = theirs.fields[k]
        assert [int(t) for t in f.types] == ours.fields[k].types, k
        assert f.contents() == ours.fields[k].value, k
    assert [t.name for t in theirs.tensors] == [t.name for t in ours.tensors]
    for a, b in zip(theirs.tensors, ours.tensors):
        assert (int(a.tensor_type), tuple(int(x) for x in a.shape), a.data_offset, a.n_bytes) \
            == (b.tensor_type, b.shape, b.data_offset, b.n_bytes), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name
    return ours


def test_our_reader_reads_a_vocabulary_as_the_gguf_package_does():
    """The reader written here (the package's made a view for each element of a vocabulary:
    25 s for a 151 936-token one) against the package's on one of llama.cpp's vocabulary
    files."""
    import gguf_models

    vocab = gguf_models.vocab_file("llama-spm")
    if vocab is None:
        pytest.skip("no llama.cpp vocabulary files: `make llama` unpacks them")
    ours = _same_as_the_packages(vocab)
    assert ours.fields["tokenizer.ggml.tokens"].types == [9, 8]
    assert len(ours.fields["tokenizer.ggml.tokens"].value) == 32000


@pytest.mark.parametrize("qtype", [None, "F16", "BF16", "Q8_0", "Q4_K_M"])
def test_our_reader_reads_a_model_as_the_gguf_package_does(tmp_path, qtype):
    """... and on a model file in each of several types (llama.cpp's llama-quantize makes
    them from the F32 file), its bytes' vocabulary of 256 tokens."""
    import gguf_models

    p = gguf_models.write(tmp_path / "m.gguf", "qwen2", None, d=256, hidden=512, n_layer=1)
    if qtype is not None:
        tools = llama.find()
        if not tools or not tools.get("quantize"):
            pytest.skip("no llama-quantize: `make llama` builds it")
        q = tmp_path / f"{qtype}.gguf"
        r = subprocess.run([tools["quantize"], str(p), str(q), qtype], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-500:]
        p = q
    ours = _same_as_the_packages(p)
    assert len(ours.tensors) > 10


def test_the_rest_part_by_part_names_its_largest_part(tmp_path, monkeypatch):
    """Appendix B's parts of a step: with a record whose rest is mostly attention, the page
    gets the attention as the largest part (the regions aside), each meeting's cost (the
    regions' time over their count), and the table a row a file; a record without the probe
    gets no table and parts_measured False."""
    from smallem.book import figures
    from smallem.book.others import reading
    from smallem.book.others.measuring import CASES

    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path))
    monkeypatch.setattr(figures, "figures_dir", lambda: tmp_path)
    m = {"cpu": "test", "cores": 2, "isa": {"isa": "avx2", "extensions": []}}
    rec = {"machine": m, "date": "2026-12-07", "commit": "abc", "settings": {"feed": 32},
           "results": []}
    parts = {"embed": 1e-6, "norm": 5e-6, "round": 4e-6, "products": 30e-6, "positions": 2e-6,
             "attend": 60e-6, "activation": 3e-6, "call": 10e-6}
    for shape, qtype in CASES:
        rec["results"] += [
            {"name": "decode", "unit": "tokens/s", "params": {"model": shape, "type": qtype},
             "value": {"median": 500.0, "min": 490.0, "max": 510.0, "n": 7}},
            {"name": "decode_parts", "unit": "s", "params": {
                "model": shape, "type": qtype, "parts": parts, "teamed": 150.0,
                "fork_join": 0.1e-6},
             "value": {"median": 115e-6, "min": 110e-6, "max": 120e-6, "n": 7}}]
    got = reading._parts(rec)
    key = f"others.{reading.slug(*CASES[-1])}."
    assert got["others.parts_measured"]
    assert got[key + "rest_largest"] == reading.PART_NAMES["attend"]
    assert abs(got[key + "rest_largest_share"] - 60 / 115) < 1e-9
    assert abs(got[key + "meeting_us"] - 0.2) < 1e-9
    assert abs(got[key + "meetings_share"] - 30e-6 / 2e-3) < 1e-9
    table = (tmp_path / "tables" / "others_parts.md").read_text()
    assert table.count("\n| ") >= len(CASES) and "attention" in table
    rec["results"] = []
    got = reading._parts(rec)
    assert not got["others.parts_measured"] and got[key + "rest_largest"] is None
