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
    assert wanted <= set(values) and "not measured" in values["mpi.ratio"]
    monkeypatch.setattr(mpi.measuring, "mpiexec", lambda: None)
    mpi.bench_distributed(quick=True, progress=False).save(tmp_path)
    values = mpi.report(tmp_path)
    assert wanted <= set(values) and "no MPI" in values["mpi.ratio"]
