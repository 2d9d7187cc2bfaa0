"""Appendix C, the book across machines: every captured machine's records side by side
(``tests/machines/<name>/records``: a fresh clone's ``make book`` on that CPU) with the GPU's,
the hardware differences that explain them, and the home page's table at a glance.

``reading`` reads the records into the tables and values; :mod:`smallem.book.capture` keeps
the folders current (``smallem machine --save-to tests/machines/<name>``, chapter 1's command). Nothing is
measured here: ``MEASURE`` is None, and the page is rebuilt from the committed records.
"""

from __future__ import annotations

from pathlib import Path

from .. import figures, records
from . import reading

# what the home page's table reads of this machine (the columns across machines read every
# captured folder's records; nothing here writes a record)
RECORDS = ("ch1.machine", "ch2.gemm", "ch3.train_step", "ch4.decode", "ch1.gpu")
COMMANDS: dict = {}
MEASURE = None


def report(rec_dir=None) -> dict:
    """The page's table across machines and the home page's table at a glance."""
    rec_dir = Path(rec_dir or records.records_dir())
    cols = [reading.column(d) for d in reading.folders()]
    gpu = reading.gpu_column([rec_dir, *(d / "records" for d in reading.folders())])
    rows, header = reading.across_table(cols, gpu)
    figures.write_table(
        "machines_across", rows, header,
        "Each column is one machine's records, as its own book quotes them (chapter 1's "
        "figures on every core it had); \"absent\", with the commit that machine's records "
        "were made at, where they lack the chapter or the figure"
        + ("; \"older record\", with its commit, where today's reading cannot read it"
           if any(c[k].startswith("older record") for c in cols for _, _, k, _ in reading.ROWS)
           else "")
        + "; \"—\" where a row does not apply to a GPU. The one-core "
        "peak is chapter 1's: the better of one thread's probe and every core's over the "
        "cores. FMA pipes: the vendor's table of chapter 1 (by vendor and ISA features); FMAs "
        "a cycle: chapter 1's probe over the chain's clock. A level ends at the largest "
        "working set one core's triad still ran at that level's plateau. Row labels link to "
        "the section each value comes from.")
    values = reading.differences(cols)
    values["machines.count"] = len(cols)
    values["machines.gpu"] = gpu["_name"] if gpu else None
    # the column whose records these pages were built from (a captured folder's, rendered as
    # the book), else None
    values["machines.own_column"] = next(
        (reading.reader_name(d) for d in reading.folders()
         if (d / "records").resolve() == rec_dir.resolve()), None)
    here, _ = reading.harvest(rec_dir)
    here.update(reading._cells(reading.numbers(rec_dir, here)))
    g_rows, g_header = reading.glance_rows(here, rec_dir, gpu)
    figures.write_table(
        "machines_glance", g_rows, g_header,
        f"The reference's figures are quoted from [its series](bibliography.md#smallem-fr); "
        f"this machine's are its records' ({figures.machine_line(records.load('ch1.machine', rec_dir)) if records.exists('ch1.machine', rec_dir) else 'none here'}).")
    return values
