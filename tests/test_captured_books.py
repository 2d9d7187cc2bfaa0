"""Every captured machine's records render with today's code.

`SMALLEM_RECORDS=tests/machines/<name>/records smallem figures` must make that machine's book,
whatever commit its records were measured at: a record made before a reading needs one of
its fields says "not measured at <commit>" there (``records.not_measured``), and the chapter
goes on. Here each chapter's reading runs on each captured machine's records, as
`smallem figures` runs it, into a scratch folder and without saving a figure (the figures
are still built, only not written), so that a reading which stops on an older record fails
here rather than in someone's `make book`.
"""

from __future__ import annotations

import json
import re

import pytest

import captured
from smallem import book
from smallem.book import figures, records
from smallem.book.machines import reading

NAMES = captured.NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_chapter_reads_the_machines_records(name, tmp_path, monkeypatch):
    rec_dir = captured.MACHINES / name / "records"
    monkeypatch.setenv("SMALLEM_RECORDS", str(rec_dir))
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path))
    monkeypatch.setattr(figures, "DRAW", False)
    # appendix C's columns read every folder, whatever the records folder (test_machines.py
    # builds them); what it reads of this folder is the home page's table, below
    values = book.report_all(rec_dir, only=[c for c in book.CHAPTERS if c != "machines"])
    assert json.loads((figures.tables_dir() / "values.json").read_text()) == values
    here, missing = reading.harvest(rec_dir)
    assert not [why for why in missing.values() if why != "no record"], missing
    reading.glance_rows(here, rec_dir, None)
    # "not measured at <commit>" names the commit of one of this machine's records
    commits = {str(records.load(p.stem, rec_dir).get("commit"))[:7]
               for p in rec_dir.glob("*.json")}
    for key, text in values.items():
        for commit in re.findall(r"not measured at (\S+)", str(text)):
            assert commit.rstrip(".,;:)") in commits, (key, text)
    # every page, rendered for this machine, chooses its sentences without an error, a
    # leftover template token or a "nan" (appendix C's values are the book's, drawn once)
    everything = {**across_values(), **values}
    for page in sorted(PAGES.glob("*.md")):
        if unrecorded(page, everything, rec_dir):
            continue  # a chapter this machine has no record of: its book lacks that page
        text = render_page(page, everything)
        prose = values_hook.FENCE.sub("", text)
        assert not re.search(r"\bnan\b", prose, re.I), (page.name, _around(prose, "nan"))


PAGES = records.ROOT / "chapters"


def _hook():
    import importlib.util

    spec = importlib.util.spec_from_file_location("values_hook", PAGES / "hooks" / "values.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


values_hook = _hook()


def render_page(page, values: dict) -> str:
    return values_hook.render(page.read_text(), values, page.name)


_ACROSS: dict = {}


def across_values() -> dict:
    """Appendix C's values (every captured folder side by side), made once."""
    if not _ACROSS:
        from smallem.book import machines

        _ACROSS.update(machines.report(records.records_dir()) or {})
    return _ACROSS


def unrecorded(page, values: dict, rec_dir) -> bool:
    """True where every key the page lacks belongs to a chapter with no record in
    ``rec_dir`` (a machine captured with only chapters 1 and 2, say)."""
    missing = {k.split(".")[0] for k in values_hook.KEY.findall(page.read_text())
               if k not in values}
    chapters = dict(zip(book.CHAPTERS, book.modules()))
    return bool(missing) and all(
        c in chapters and not any(records.exists(r, rec_dir) for r in chapters[c].RECORDS)
        for c in missing)


def _around(text: str, word: str) -> str:
    i = text.lower().find(word)
    return text[max(0, i - 80):i + 80]


def test_a_page_chooses_the_sentence_that_holds(tmp_path):
    """A branch of a page is rendered only where its fact holds; a name the values lack, or
    a template error, fails with the page's name."""
    from mkdocs.exceptions import PluginError

    page = ("B is {{ ch2.kib }}, {% if ch2.fits %}in the L2{% else %}beyond the L2{% endif %}."
            "\n```c\nfloat c[2][2] = {{0}};\n```\n")
    out = values_hook.render(page, {"ch2.kib": "900 KiB", "ch2.fits": True})
    assert out.startswith("B is 900 KiB, in the L2.") and "{{0}}" in out
    assert "beyond" in values_hook.render(page, {"ch2.kib": "3 MiB", "ch2.fits": False})
    for bad, values in (("{% if ch2.nope %}x{% endif %}", {}), ("{{ ch9.x }}", {}),
                        ("{% if ch2.fits %}x", {"ch2.fits": True})):
        with pytest.raises(PluginError, match="page p.md"):
            values_hook.render(bad, values, "p.md")


def test_an_older_record_says_not_measured_at_its_commit():
    """Zen 5's chapter-2 record predates the loop-order model and rung 5's own blocks: the
    values that need them say so, with the record's commit; the rest are read."""
    rec_dir = captured.MACHINES / "amd-zen5-2c" / "records"
    rec = records.load("ch2.gemm", rec_dir)
    assert not {"blocks_rows", "order"} & set(rec["settings"])
    from smallem.book.ch2 import order, reading as ch2r

    commit = rec["commit"][:7]
    values = order.order_values(rec)
    assert values["ch2.order"] == records.not_measured(
        rec, "the record predates the loop-order model")
    assert values["ch2.order"].startswith(f"not measured at {commit} (")
    _, ladder = ch2r.ladder_rows(rec, rec_dir)
    assert ladder["ch2.kc5"] == records.not_measured(rec, ch2r.PREDATES_ROWS)
    assert ladder["ch2.kc"] == str(rec["settings"]["blocks_ladder"]["kc"])
    rows, kc = ch2r.kc_rows(rec)
    assert kc["ch2.kc_model_gap"].startswith(f"not measured at {commit}")
    assert not any("(model)" in r[0] for r in rows) and len(rows) == 10


REASONED = re.compile(r"not measured(?: at \S+| here \(no| on a GPU yet| \(|:)")


@pytest.mark.parametrize("name", ["book", *NAMES])
def test_not_measured_only_where_the_record_lacks_it(name, tmp_path, monkeypatch):
    """A value that says "not measured" gives its reason (an older record's commit, a peer
    this machine lacked, a chapter with no record), and never stands where this machine's
    record holds what it needs: a peer's "not measured here" only where the record has no
    result of that peer."""
    rec_dir = records.records_dir() if name == "book" else captured.MACHINES / name / "records"
    monkeypatch.setenv("SMALLEM_RECORDS", str(rec_dir))
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path))
    monkeypatch.setattr(figures, "DRAW", False)
    chapters = dict(zip(book.CHAPTERS, book.modules()))
    values = book.report_all(rec_dir, only=[c for c in book.CHAPTERS if c != "machines"])
    bad = []
    for key, text in values.items():
        text = str(text)
        if "not measured" not in text:
            continue
        chapter = chapters.get(key.split(".")[0])
        recorded = chapter is not None and all(records.exists(r, rec_dir)
                                               for r in chapter.RECORDS)
        if recorded and not REASONED.search(text):
            bad.append(f"{key}: {text!r} gives no reason, and the records are there")
    peers = {"ch4": ("llama_tg", "no llama.cpp"), "others": ("llama_tg", "no llama.cpp")}
    for chapter, (result, words) in peers.items():
        mod = chapters.get(chapter)
        if mod is None or not all(records.exists(r, rec_dir) for r in mod.RECORDS):
            continue
        ran = any(records.results(records.load(r, rec_dir), result) for r in mod.RECORDS)
        said = [k for k, v in values.items() if k.startswith(chapter + ".") and words in str(v)]
        if ran and said:
            bad.append(f"{chapter}: says {words!r} at {said[:3]}, and its record has {result}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["book", *NAMES])
def test_no_product_beats_its_peak(name):
    """Chapter 1's peak of a number type is the fastest path it measured for that type (the
    f32 FMA probe; the bf16 dot or AMX's tiles, widened bf16 running at the f32 peak), and
    chapter 2's products on as many cores stay under it, within the 10 % a shared host moves
    a peak between two runs: a GEMM above its chapter's "peak" would make every MFU built on
    that peak too high."""
    rec_dir = records.records_dir() if name == "book" else captured.MACHINES / name / "records"
    if not (records.exists("ch1.machine", rec_dir) and records.exists("ch2.gemm", rec_dir)):
        pytest.skip("no chapter 1 and 2 records")
    ch1r, ch2r = records.load("ch1.machine", rec_dir), records.load("ch2.gemm", rec_dir)
    threads = ch2r["settings"]["threads"]
    peaks = {r["params"]["kind"]: r["value"]["median"]
             for r in records.results(ch1r, "peak", threads=threads)}
    f32 = peaks["f32"]
    bf16 = max([f32] + [v for k, v in peaks.items() if k in ("bf16", "amx_bf16")])
    for r in records.results(ch2r, "dtype"):
        if r["params"].get("threads", threads) != threads:
            continue
        peak = bf16 if r["params"]["dtype"] == "bf16" else f32
        assert r["value"]["median"] <= 1.1 * peak, (r["params"], r["value"]["median"], peak)
