"""The chapter sources: code included from the real files must sit inside a code fence
(a bare snippet renders as a paragraph of run-together code and headings from `#if`)."""

import re
from pathlib import Path

import pytest

CHAPTERS = sorted((Path(__file__).parent.parent / "chapters").glob("*.md"))
CODE_SNIPPET = re.compile(r'^--8<-- "[^"]+\.(py|c|h|cu):[^"]+"\s*$')


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.name)
def test_code_snippets_are_fenced(page):
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
        if CODE_SNIPPET.match(line):
            assert i > 0 and lines[i - 1].lstrip().startswith("```"), (
                f"{page.name}:{i + 1}: {line.strip()} is not inside a ``` code fence")


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.name)
def test_no_control_characters(page):
    """A tab or other control character in the prose is a mangled escape (a Python "\\t" in
    "\\times" writes a tab, and the formula renders as "imes")."""
    for i, line in enumerate(page.read_text().splitlines(), 1):
        bad = [c for c in line if ord(c) < 32]
        assert not bad, f"{page.name}:{i}: control character {bad[0]!r} in {line.strip()[:60]!r}"


def test_chapter_4_reads_records_without_its_peers(tmp_path, monkeypatch):
    """A machine without llama.cpp or PyTorch still gets every value the page quotes."""
    import json
    import re

    from smallem.book import ch4, records

    src = records.records_dir()
    for name in ("ch1.machine", "ch3.train_step", *ch4.RECORDS):
        data = json.loads((src / f"{name}.json").read_text())
        data["results"] = [r for r in data["results"] if not r["name"].startswith("llama")
                           and not str(r["params"].get("case", "")).startswith("torch")]
        (tmp_path / f"{name}.json").write_text(json.dumps(data))
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path / "figures"))
    values = ch4.report(tmp_path)
    page = (records.ROOT / "chapters" / "4-generation.md").read_text()
    wanted = set(re.findall(r"\{\{\s*(ch4\.[\w.]+)\s*\}\}", page))
    assert wanted <= set(values), sorted(wanted - set(values))
    assert "not measured" in values["ch4.vs_llama_l3"]


def test_the_appendix_reads_without_mpi(tmp_path, monkeypatch):
    """No record, or a record made where MPI was missing: every value the page quotes is there."""
    import re

    from smallem.book import mpi, records

    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path / "figures"))
    (tmp_path / "figures" / "tables").mkdir(parents=True)
    page = (records.ROOT / "chapters" / "a-distributed.md").read_text()
    wanted = set(re.findall(r"\{\{\s*(mpi\.[\w.]+)\s*\}\}", page))
    values = mpi.report(tmp_path)  # no record at all
    assert wanted <= set(values) and values["mpi.measured"] is False
    assert "bench-distributed" in values["mpi.missing_why"]
    monkeypatch.setattr(mpi.measuring, "mpiexec", lambda: None)
    mpi.bench_distributed(quick=True, progress=False).save(tmp_path)
    values = mpi.report(tmp_path)
    assert wanted <= set(values) and values["mpi.measured"] is False
    assert "no mpi4py or mpiexec" in values["mpi.missing_why"]


def _others_record(ours: float, peer: float, pp: float, peer_pp: float):
    """An others.decode record of every case, each sample the rate given (tokens/s)."""
    from smallem.book import others, records
    from smallem.book.others import measuring

    rec = records.Record(others.RECORD, settings={
        "quick": False, "threads": 2, "prompt": 16, "feed": 32, "pp": 512, "rounds": 5,
        "llama_reps": 2, "instruction": "test", "rows_per_call": 64,
        "llama_cpp": {"from": "test", "version": "test", "flags": [], "flags_why": ""}})
    for shape, qtype in measuring.CASES:
        params = {"model": shape, "type": qtype, "threads": 2, "weight_bytes": 100 * 2 ** 20,
                  "file_bytes": 110 * 2 ** 20, "params": 10 ** 8, "type_bytes": {qtype: 100}}
        for name, rate in (("decode", ours), ("llama_tg", peer), ("prefill", pp),
                           ("llama_pp", peer_pp)):
            s = [1 / rate] * 5
            extra = {"prompt_dtype": "f32", "products_per_token": 10 ** 8} if name == "prefill" else {}
            rec.add(name, "tokens/s", {"median": rate, "min": rate, "max": rate, "n": 5},
                    seconds={"median": 1 / rate, "samples": s}, **params, **extra)
        rec.add("prompt_gemm", "Gop/s", {"median": 100.0, "min": 100.0, "max": 100.0, "n": 3},
                **params, prompt_dtype="f32", shape=[512, 1, 1])
    return rec


def test_the_others_appendix_reads_every_value_its_page_quotes(tmp_path, monkeypatch):
    """No record, a record of every case with its verdicts (reached, not reached), each
    value the page quotes is there; the prompt bound is the GEMM's rate over two operations
    a weight."""
    import re
    import shutil

    from smallem.book import others, records

    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path / "figures"))
    (tmp_path / "figures" / "tables").mkdir(parents=True)
    page = (records.ROOT / "chapters" / "b-others.md").read_text()
    jinja = " ".join(re.findall(r"\{[{%](.*?)[}%]\}", page, re.S))
    wanted = set(re.findall(r"(?<![\w/-])(others\.[a-z0-9_]+(?:\.[a-z0-9_]+)?)", jinja))
    values = others.report(tmp_path)
    assert wanted <= set(values) and values["others.measured"] is False
    assert values["others.qwen25_q8_0.pp_bound"] is None         # no record: no figure, typed
    shutil.copy(records.records_dir() / "ch1.machine.json", tmp_path)
    _others_record(ours=50, peer=40, pp=100, peer_pp=90).save(tmp_path)
    values = others.report(tmp_path)
    assert wanted <= set(values)
    assert values["others.qwen25_q8_0.tg_vs_llama"].startswith("reached")      # 1.25 >= 1.0
    assert values["others.qwen25_q8_0.pp_vs_llama"].startswith("not reached")  # 1.11 < 1.5
    assert values["others.smollm2_q4_0.tg_vs_llama"].startswith("reached")     # 1.25 >= 1.2
    assert values["others.qwen25_q8_0.pp_bound"] == 500.0   # 100 Gop/s / 2e8 op, typed
    assert values["others.qwen25_q8_0.tg_rate"] == 50 * 100 * 2 ** 20 / 1e9  # GB/s, typed
    _others_record(ours=30, peer=40, pp=100, peer_pp=50).save(tmp_path)
    values = others.report(tmp_path)
    assert values["others.qwen25_q8_0.tg_vs_llama"].startswith("not reached")
    assert values["others.qwen25_q8_0.pp_vs_llama"].startswith("reached")
