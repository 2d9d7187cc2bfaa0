"""Chapter 4's balance sheet: the series' training and generating figures, ours beside the
reference's (and our GPU's, where its records hold them)."""

from __future__ import annotations

from smallem.generating import decode
from .. import figures, records, reference
from .measuring import RECORD

f = figures.fmt
AT = {r.name: r.index for r in decode.RUNGS}  # each rung's place, by its name: what records keep


def _one(rec, name, **params):
    found = records.results(rec, name, **params)
    return found[0] if found else None


def top_rung(rec) -> int | None:
    """The ladder's top rung: its fastest int8 rung (the median decode), which the page's
    "top" decode, its verdict against llama.cpp and the balance sheet take; the last rung
    where no int8 rung was timed."""
    rungs = [i for i, _ in rec["settings"]["ladder"]["rungs"]]
    timed = {i: r for i in rungs if i >= AT["int8"] and (r := _one(rec, "decode", rung=i))}
    if timed:
        return max(timed, key=lambda i: records.median(timed[i]))
    return max(rungs) if rungs else None


def _gpu_cell(rec_dir, chapter: str) -> str:
    """Our GPU's figure for the balance sheet: the GPT-2 step (ch3.gpu) or the int8 decode
    with its graph (ch4.gpu), or why there is none."""
    rec = records.load_gpu(  # the GPU's records, from the folder its chapters read
        f"{chapter}.gpu", rec_dir)
    if rec is None:
        return records.NOT_ON_GPU
    found = (records.results(rec, "gpu_step", block="gpt2") if chapter == "ch3" else
             records.results(rec, "gpu_decode", dtype="int8", dp4a="auto", graph=True))
    return f(records.median(found[0]), "tokens/s") if found else records.NOT_ON_GPU


def balance(rec_dir):
    """The series' balance sheet: training and generating, ours beside the reference's."""
    rows = []
    steps = (records.results(records.load("ch3.train_step", rec_dir), "rung_step")
             if records.exists("ch3.train_step", rec_dir) else [])
    if steps:  # none in a record that predates chapter 3's climb
        best = max(steps, key=records.median)
        rows.append(["train, xl step", f(records.median(best), "tokens/s"),
                     f"{reference.CH3_XL_STEP_BEFORE_TOKS} → {f(reference.CH3_XL_STEP_AFTER_TOKS)} tokens/s",
                     f"— (given as {100 * reference.CH3_XL_MFU_GPU:.0f} % of its peak, not in tokens/s)",
                     _gpu_cell(rec_dir, "ch3")])
    if records.exists(RECORD, rec_dir):
        rec = records.load(RECORD, rec_dir)
        top = top_rung(rec)
        r = _one(rec, "decode", rung=top)
        if r:
            rows.append([f"generate, one sequence ({rec['settings']['ladder']['config']['name']}, "
                         f"rung {top}, the fastest)",
                         f(records.median(r), "tokens/s"),
                         f"{reference.CH4_GEN_BEFORE_TOKS} → {f(reference.CH4_GEN_AFTER_TOKS)} tokens/s",
                         f(reference.CH4_GEN_GPU_TOKS, "tokens/s"), _gpu_cell(rec_dir, "ch4")])
    head = ["", "ours, this machine", f"reference CPU ({reference.CORES} cores)", "reference GPU",
            "ours, GPU"]
    if all(row[-1] == records.NOT_ON_GPU for row in rows):  # no GPU record: no column of it
        rows, head = [row[:-1] for row in rows], head[:-1]
    figures.write_table("ch4_balance", rows, head,
                        f"Reference figures from {reference.CITE}, on {reference.MACHINE}; "
                        f"ours from this book's records on this machine (chapter 3's best rung "
                        f"for training, chapter 4's fastest int8 rung for generating).")
