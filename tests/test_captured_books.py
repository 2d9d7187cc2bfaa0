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
    here.update(reading._facts_values(rec_dir))
    reading.glance_rows(here, rec_dir, None)
    # "not measured at <commit>" names the commit of one of this machine's records
    commits = {str(records.load(p.stem, rec_dir).get("commit"))[:7]
               for p in rec_dir.glob("*.json")}
    for key, text in values.items():
        for commit in re.findall(r"not measured at (\S+)", str(text)):
            assert commit.rstrip(".,;:)") in commits, (key, text)


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
