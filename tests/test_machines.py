"""Appendix C, across machines: its tables build from the committed records of every captured
machine, a machine with partial records renders, the cells are the records' numbers, and
`smallem machine --save-to` captures this machine only from its own full records."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from smallem.book import capture, ch1, figures, machines, records
from smallem.book.machines import reading


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path / "figures"))
    return tmp_path


def test_both_tables_build_from_the_committed_records(scratch):
    values = machines.report(records.records_dir())
    across = (figures.tables_dir() / "machines_across.md").read_text()
    glance = (figures.tables_dir() / "machines_glance.md").read_text()
    names = [d.name for d in reading.folders()]
    assert len(names) >= 4 and "amd-zen3-2c" in names        # Zen 3's, from shared/machines
    header = across.splitlines()[0]
    for d in reading.folders():  # each column headed as a reader names it, not by its folder
        assert reading.reader_name(d) in header and d.name not in header
    assert "GPU: NVIDIA H200" in header                          # the GPU's column
    assert across.count("\n| [") == len(reading.ROWS)
    for ch in ("ch1", "ch2", "ch3", "ch4"):                      # typed: numbers and names
        assert values[f"machines.{ch}.shown"] is True
        assert isinstance(values[f"machines.{ch}.ratio"], float) and values[f"machines.{ch}.ratio"] >= 1
        assert values[f"machines.{ch}.hi"] >= values[f"machines.{ch}.lo"]
    assert "e+" not in across
    rows = [line for line in glance.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 8                                     # the header and eight rows
    assert figures.fmt(1314, "Gop/s") in glance                   # the reference's, quoted


def test_each_cell_is_its_machines_record(scratch):
    """The f32 peak and the micro-kernel's tile in every column, recomputed here from that
    machine's records by another route."""
    for d in reading.folders():
        col = reading.column(d)
        facts = ch1.facts(d / "records")
        assert col["machines.f32_all"] == figures.fmt(facts["peak"][("f32", facts["cores"])], "Gop/s")
        # chapter 1's rule for the one-core peak: the better of one thread and all cores / cores
        best = max(facts["peak"][("f32", 1)], facts["peak"][("f32", facts["cores"])] / facts["cores"])
        assert col["_numbers"]["f32_core"] == pytest.approx(best)
        # the FMA facts: measured FMAs a cycle and the vendor's table, as chapter 1 states them
        hw = ch1.hw_values(facts["record"], facts["theory"])
        assert col["machines.fma_measured"].startswith(
            f"{hw['ch1.hw.fmas_per_cycle']} × {hw['ch1.hw.vector_bits']}-bit")
        if hw["ch1.hw.pipes"]:
            assert col["machines.fma_table"].startswith(f"{hw['ch1.hw.pipes']} × {hw['ch1.hw.pipe_bits']} bits")
        s = records.load("ch2.gemm", d / "records")["settings"] if records.exists("ch2.gemm", d / "records") else {}
        if "ch2" in col["_missing"]:     # a record today's reading cannot read says so
            assert col["machines.tile"] == f"older record ({col['_commit']})"
        elif "mr" in s:
            assert col["machines.tile"] == f"{s['mr']} x {s['nr']}"
        assert col["_commit"] == records.load("ch1.machine", d / "records")["commit"][:7]


def test_a_machine_with_partial_records_says_what_it_lacks(scratch, monkeypatch):
    src = reading.folders()[0]
    root = scratch / "machines"
    (root / "partial" / "records").mkdir(parents=True)
    shutil.copy(src / "records" / "ch1.machine.json", root / "partial" / "records")
    shutil.copy(src / "lscpu.txt", root / "partial")
    monkeypatch.setattr(reading, "MACHINES", root)
    values = machines.report(records.records_dir())
    across = (figures.tables_dir() / "machines_across.md").read_text()
    commit = records.load("ch1.machine", src / "records")["commit"][:7]
    row = next(line for line in across.splitlines() if "1024³ product, top f32 rung" in line)
    assert f"absent ({commit})" in row
    row = next(line for line in across.splitlines() if "f32 peak, every core" in line)
    assert "Gop/s" in row
    assert values["machines.ch2.shown"] is False


def test_differences_are_ratios_of_the_columns():
    """The page's comparisons from typed numbers: the spread, the lanes and clock that predict
    it (judged within the tolerance), never a number read back from a cell."""
    def col(name, peak, lanes, clock):
        return {"_header": f"{name}: cpu",
                "_numbers": {"f32_core": peak, "lanes": lanes, "table_lanes": lanes,
                             "clock": clock}}
    out = reading.differences([col("a", 100.0, 16, 3.0), col("b", 200.0, 32, 3.0)])
    assert out["machines.ch1.ratio"] == 2.0 and out["machines.ch1.predicted"] == 2.0
    assert out["machines.ch1.holds"] and out["machines.ch1.by_lanes"]
    assert not out["machines.ch1.by_clock"] and out["machines.ch1.lanes_from_table"]
    out = reading.differences([col("a", 100.0, 16, 3.0), col("b", 400.0, 16, 3.0)])
    assert not out["machines.ch1.holds"]                       # 1x predicted, 4x measured
    assert out["machines.ch2.shown"] is False
    assert reading.within(1.4, 1.0) and not reading.within(1.6, 1.0)
    assert not reading.within(0.8, 1.3)                        # the other side of one
    assert not hasattr(reading, "number")                      # nothing parsed back


def _records_like(tmp_path, folder="recs", **change):
    """A records folder holding this book's chapter-1 record, changed as asked; and its
    machine's fingerprint."""
    rec_dir = tmp_path / folder
    rec_dir.mkdir()
    here = records.load("ch1.machine", records.records_dir())
    here["machine"].update(change.pop("machine", {}))
    here["settings"].update(change)
    (rec_dir / "ch1.machine.json").write_text(json.dumps(here))
    return rec_dir, dict(here["machine"])


def test_capture_writes_the_os_files_and_this_machines_records(tmp_path):
    rec_dir, fp = _records_like(tmp_path)
    gpu = records.load("ch1.gpu", records.records_dir())       # a GPU's record: left out
    (rec_dir / "ch1.gpu.json").write_text(json.dumps(gpu))
    (tmp_path / "m" / "records").mkdir(parents=True)
    (tmp_path / "m" / "records" / "stale.json").write_text("{}")  # an older run's: replaced
    dest, elsewhere = capture.save_to(tmp_path / "m", rec_dir=rec_dir, here=fp)
    assert elsewhere == ["ch1.gpu.json"]
    assert sorted(p.name for p in (dest / "records").iterdir()) == ["ch1.machine.json"]
    assert (dest / "caches.txt").read_text().startswith("index")
    assert "processor" in (dest / "cpuinfo-cpu0.txt").read_text()
    with pytest.raises(capture.CaptureError, match="not on this machine"):
        capture.save_to(tmp_path / "n", rec_dir=rec_dir, here={**fp, "cores": fp["cores"] + 1})
    quick_dir, fp2 = _records_like(tmp_path, "quick", quick=True)
    with pytest.raises(capture.CaptureError, match="quick"):
        capture.save_to(tmp_path / "o", rec_dir=quick_dir, here=fp2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(capture.CaptureError, match="make book"):
        capture.save_to(tmp_path / "p", rec_dir=tmp_path / "empty", here=fp2)


def test_save_to_refuses_another_machines_records_in_one_line(tmp_path):
    rec_dir, _ = _records_like(tmp_path, machine={"cpu": "another CPU"})
    r = subprocess.run([sys.executable, "-m", "smallem", "machine", "--save-to", str(tmp_path / "m")],
                       capture_output=True, text=True,
                       env={**os.environ, "SMALLEM_RECORDS": str(rec_dir)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "not on this machine" in r.stderr
    assert not (tmp_path / "m" / "records" / "ch1.machine.json").exists()


def test_shares_are_those_of_the_chapters_and_their_peaks(scratch):
    """The top decode rung's share of its read bound is the one chapter 4's table prints for
    that rung (the rung chapter 4 calls its top); the last rung's share of the f32 peak is
    against the peak the table shows, or its cell names the peak it took."""
    import re

    from smallem.book import ch4

    for d in reading.folders():
        col, rec_dir = reading.column(d), d / "records"
        nums = col["_numbers"]
        if "final_share" in nums and " of " not in col["machines.final_share"]:
            assert figures.pct(nums["final_gops"] / nums["f32_all"]) == col["machines.final_share"]
        if "gen_share" not in nums or "ch4" in col["_missing"]:
            continue
        if "ch4.top_rung" in col["_values"]:
            assert nums["gen_rung"] == col["_values"]["ch4.top_rung"]
        with reading.scratch_figures():
            ch4.report(rec_dir)
            table = (figures.tables_dir() / "ch4_ladder.md").read_text()
        row = next(line for line in table.splitlines() if line.startswith(f"| {nums['gen_rung']} |"))
        # inside a plateau "N % of it"; past a cache's plateau, short of DRAM's, "N % and M %
        # of them" (the cache's bound first)
        printed = re.search(r"(\d+) % (?:of it|and \d+ % of them)", row).group(1)
        assert f"{100 * nums['gen_share']:.0f}" == printed, (d.name, row)
