"""The book across machines, read from records only.

Every folder of ``tests/machines/`` that holds a chapter-1 record is a machine: the records
of a fresh clone's ``make book`` there. :func:`harvest` runs each chapter's own reading over
such a folder (into a scratch folder, drawing no figure), so that each cell of the page is
the value that machine's own book would print, or "not measured at <commit>" where its
records lack the chapter. :func:`differences` computes, from the same records, the ratios the
page explains. :func:`glance_rows` is the home page's table: the reference series' rows,
this machine's records beside them, and the GPU's where a GPU record exists.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path

from smallem.plumbing import build
from .. import figures, records, reference as ref

MACHINES = build.ROOT / "tests" / "machines"
CHAPTERS_READ = ("ch1", "ch2", "ch3", "ch4", "others")  # the CPU chapters a column shows
f = figures.fmt


def folders(root: Path | None = None) -> list[Path]:
    """The captured machines: folders whose records/ holds ch1.machine.json."""
    root = Path(root or MACHINES)
    return sorted(d for d in root.iterdir() if (d / "records" / "ch1.machine.json").is_file())


def cpu_name(folder: Path) -> str:
    """The CPU as lscpu named it (or the chapter-1 record, where no lscpu.txt was kept)."""
    p = folder / "lscpu.txt"
    if p.is_file():
        m = re.search(r"^Model name:\s*(.+)$", p.read_text(), re.M)
        if m:
            return m.group(1).strip()
    return records.load("ch1.machine", folder / "records")["machine"].get("cpu", folder.name)


def reader_name(folder: Path) -> str:
    """The machine as a reader would name it ("AMD Zen 3, EPYC, 2 cores"): the folder's
    ``name.txt``, written when it was captured by someone who knew the part (a hypervisor
    may mask the model number, so it is not derived from it), else lscpu's model name and
    the cores its records ran on."""
    p = folder / "name.txt"
    if p.is_file() and p.read_text().strip():
        return p.read_text().strip()
    cores = records.load("ch1.machine", folder / "records")["machine"].get("cores")
    return f"{cpu_name(folder)}, {cores} cores" if cores else cpu_name(folder)


def commit_of(rec_dir: Path) -> str:
    """The commit the folder's chapter-1 record was measured at."""
    return records.load("ch1.machine", rec_dir).get("commit", "unknown")[:7]


@contextlib.contextmanager
def scratch_figures():
    """Figures and tables written into a temporary folder, no figure drawn: a chapter's
    reading run for its values only."""
    old, draw = os.environ.get("SMALLEM_FIGURES"), figures.DRAW
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SMALLEM_FIGURES"] = tmp
        figures.DRAW = False
        try:
            yield Path(tmp)
        finally:
            figures.DRAW = draw
            if old is None:
                os.environ.pop("SMALLEM_FIGURES", None)
            else:
                os.environ["SMALLEM_FIGURES"] = old


def harvest(rec_dir: Path) -> tuple[dict, dict]:
    """(values, missing) of the CPU chapters over the records in ``rec_dir``: each chapter's
    report, as its own page would quote it; ``missing`` names each chapter that has no record
    there, or whose record today's reading cannot read (with the reason)."""
    from .. import CHAPTERS, modules

    values, missing = {}, {}
    with scratch_figures():
        for name, module in zip(CHAPTERS, modules()):
            if name not in CHAPTERS_READ:
                continue
            if not any((Path(rec_dir) / f"{r}.json").is_file() for r in module.RECORDS):
                missing[name] = "no record"
                continue
            try:
                values.update(module.report(Path(rec_dir)) or {})
            except (KeyError, ValueError, IndexError, TypeError, ZeroDivisionError) as e:
                missing[name] = f"its record predates this reading ({type(e).__name__}: {e})"
    return values, missing


# (chapter, row label, the value's key, the page section it comes from)
ROWS = (
    ("ch1", "f32 peak, one core", "ch1.f32_peak_core", "1-cpu.md#measuring-the-peak"),
    ("ch1", "f32 peak, every core", "ch1.f32_peak_all", "1-cpu.md#measuring-the-peak"),
    ("ch1", "FMA pipes x width", "machines.fma", "1-cpu.md#the-peak-is-a-product-of-five-numbers"),
    ("ch1", "clock under the f32 probe", "ch1.clock_f32", "1-cpu.md#measuring-the-clock"),
    ("ch1", "fastest bf16 path, every core", "machines.bf16_all", "1-cpu.md#narrower-numbers-bf16-and-int8"),
    ("ch1", "fastest int8 path, every core", "machines.int8_all", "1-cpu.md#narrower-numbers-bf16-and-int8"),
    ("ch1", "L3 triad, one core", "ch1.l3_core", "1-cpu.md#the-memory-staircase"),
    ("ch1", "L3 triad, every core", "ch1.l3_all", "1-cpu.md#the-memory-staircase"),
    ("ch1", "DRAM read, every core", "ch1.dram_read_all", "1-cpu.md#the-memory-staircase"),
    ("ch1", "where L2 ends (one core's triad)", "machines.l2_end", "1-cpu.md#the-memory-staircase"),
    ("ch1", "where L3 ends (one core's triad)", "machines.l3_end", "1-cpu.md#the-memory-staircase"),
    ("ch2", "1024³ product, three loops", "ch2.naive_gops", "2-matmul.md#rung-0-three-loops"),
    ("ch2", "1024³ product, last rung", "ch2.final_gops", "2-matmul.md#rung-5-threads"),
    ("ch2", "last rung's share of the peak", "ch2.final_pct_peak", "2-matmul.md#rung-5-threads"),
    ("ch2", "loop order the model chose", "ch2.order", "2-matmul.md#the-packages-gemm"),
    ("ch2", "micro-kernel (rows x columns)", "machines.tile", "2-matmul.md#rung-3-the-micro-kernel-in-registers"),
    ("ch2", "blocks mc, kc, nc of that order", "machines.blocks", "2-matmul.md#block-sizes-from-the-caches-not-from-tuning"),
    ("ch2", "bf16 path chosen", "ch2.bf16_chosen", "2-matmul.md#bf16-inputs"),
    ("ch3", "xl step, kernels (f32)", "ch3.kernels_toks", "3-training.md#the-climb"),
    ("ch3", "xl step, top of the climb", "ch3.climb_top_toks", "3-training.md#the-climb"),
    ("ch3", "f32 step's share of the peak (MFU)", "ch3.kernels_mfu", "3-training.md#against-the-targets"),
    ("ch3", "modern block with Muon", "ch3.rung7_toks", "3-training.md#the-modern-block-and-muon"),
    ("ch4", "generation, first rung", "ch4.rung0_toks", "4-generation.md#the-ladder"),
    ("ch4", "generation, top rung", "machines.gen_top", "4-generation.md#the-ladder"),
    ("ch4", "top rung against llama.cpp", "ch4.vs_llama_ladder", "4-generation.md#llamacpp-and-pytorch-beside-us"),
    ("ch4", "top rung's share of its read bound", "machines.gen_share", "4-generation.md#the-ladder"),
    ("others", "Qwen2.5-0.5B Q8_0 decode", "others.qwen25_q8_0.tg", "b-others.md#beside-llamacpp"),
    ("others", "SmolLM2-135M Q4_0 decode", "others.smollm2_q4_0.tg", "b-others.md#beside-llamacpp"),
)


def _facts_values(rec_dir: Path) -> dict:
    """Values the chapters do not quote in this form, computed from the same records: where
    the triad's L2 and L3 plateaus end on one core, the micro-kernel's tile, the top decode
    rung and its share of the read bound at the level that holds its weights."""
    from .. import ch1

    out = {}
    facts = ch1.facts(rec_dir)
    if facts:
        spans = facts["triad_spans"][1]
        for lv in ("L2", "L3"):
            if lv in spans:
                out[f"machines.{lv.lower()}_end"] = _size(spans[lv]["last"])
        th = facts["theory"]
        out["machines.fma"] = f"{th['pipes']} x {th['pipe_bits']} bits"
        for kind in ("bf16", "int8"):
            best = max(((k, v) for (k, t), v in facts["peak"].items()
                        if t == facts["cores"] and kind in k), key=lambda kv: kv[1], default=None)
            if best:
                out[f"machines.{kind}_all"] = f"{f(best[1], 'Gop/s')} ({best[0]})"
    if records.exists("ch2.gemm", rec_dir):
        s = records.load("ch2.gemm", rec_dir)["settings"]
        if "mr" in s:
            out["machines.tile"] = f"{s['mr']} x {s['nr']}"
        b = s.get("blocks")
        if isinstance(b, dict) and {"mc", "kc", "nc"} <= set(b):
            out["machines.blocks"] = f"{b['mc']}, {b['kc']}, {b['nc']}"
    if records.exists("ch4.decode", rec_dir) and facts:
        rec = records.load("ch4.decode", rec_dir)
        rungs = sorted({r["params"]["rung"] for r in records.results(rec, "decode")
                        if isinstance(r["params"].get("rung"), int)})
        top = [r for r in records.results(rec, "decode", rung=rungs[-1])] if rungs else []
        if top and "weight_bytes" in top[0]["params"]:
            r = top[0]
            wb, th = r["params"]["weight_bytes"], r["params"].get("threads", facts["cores"])
            level, bw = ch1.level_of(facts, wb, th, ch1.read_stream(facts))
            out["machines.gen_top"] = f(r["value"]["median"], "tokens/s")
            out["machines.gen_share"] = (f"{100 * r['value']['median'] * wb / (bw * 1e9):.0f} % "
                                         f"({level})")
            out["machines.gen_read_gbs"] = bw
    return out


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:g} KiB"


def column(folder: Path) -> dict:
    """One machine's column: {key: text}, with "not measured at <commit>" where its records
    lack the chapter, and its header."""
    rec_dir = folder / "records"
    values, missing = harvest(rec_dir)
    values.update(_facts_values(rec_dir))
    commit = commit_of(rec_dir)
    out = {}
    for chapter, _, key, _ in ROWS:
        if chapter in missing or key not in values:
            why = missing.get(chapter, "")
            out[key] = f"not measured at {commit}" + (f" ({why})" if why.startswith("its") else "")
        else:
            out[key] = values[key]
    out["_header"] = reader_name(folder)
    out["_folder"] = folder.name
    out["_commit"] = commit
    out["_missing"] = missing
    out["_values"] = values
    return out


def gpu_column(rec_dirs: list[Path]) -> dict | None:
    """The GPU's cells from the first chapter-1 GPU record found (a GPU measured them), or
    None where no folder holds one."""
    for d in rec_dirs:
        if not records.exists("ch1.gpu", d):
            continue
        rec = records.load("ch1.gpu", d)
        gpu = rec["machine"].get("gpu")
        if not gpu or not records.results(rec, "fma_peak"):
            continue
        out = {"_header": f"GPU: {gpu.get('name', 'GPU')}", "_commit": rec.get("commit", "?")[:7]}
        out["ch1.f32_peak_all"] = f(records.value(rec, "fma_peak", kind="f32"), "Gop/s")
        mma = records.results(rec, "mma_peak")
        if mma:
            out["machines.bf16_all"] = f"{f(mma[0]['value']['median'], 'Gop/s')} (tensor cores)"
        if records.exists("ch2.gpu", d):
            g = records.load("ch2.gpu", d)
            ladder = [r for r in records.results(g, "gemm") if r["params"].get("dtype") == "f32"]
            if ladder:
                top = max(ladder, key=lambda r: r["params"].get("number", 0))
                out["ch2.final_gops"] = (f"{f(top['value']['median'], 'Gop/s')} "
                                         f"(n = {top['params']['n']})")
                naive = [r for r in ladder if r["params"].get("number") == 0]
                if naive:
                    out["ch2.naive_gops"] = (f"{f(naive[0]['value']['median'], 'Gop/s')} "
                                             f"(n = {naive[0]['params']['n']})")
        return out
    return None


def across_table(cols: list[dict], gpu: dict | None):
    header = ["", *(c["_header"] for c in cols)] + ([gpu["_header"]] if gpu else [])
    rows = []
    for chapter, label, key, link in ROWS:
        row = [f"[{label}]({link})", *(c[key] for c in cols)]
        if gpu:
            row.append(gpu.get(key, f"not measured at {gpu['_commit']}"))
        rows.append(row)
    return rows, header


def number(text) -> float | None:
    """The first number of a value as the chapters print it ("1 429 tokens/s" -> 1429.0)."""
    m = re.search(r"-?[\d\u202f\u2009 ]*\d(?:\.\d+)?", str(text))
    return float(re.sub(r"[\u202f\u2009 ]", "", m.group(0))) if m else None


def _unmeasured(text) -> bool:
    return str(text).startswith("not measured")


def _spread(cols: list[dict], key: str):
    """(lowest, highest) (value, column) over the machines that measured ``key``."""
    got = [(number(c.get(key)), c) for c in cols if key in c and not _unmeasured(c[key])]
    got = [(v, c) for v, c in got if v]
    if len(got) < 2:
        return None
    return min(got, key=lambda t: t[0]), max(got, key=lambda t: t[0])


def _name(c: dict) -> str:
    return c["_header"]


def moved_by(ratio: float, hw: float, hw_name: str, other_name: str) -> str:
    """Which of two factors accounts for most of a ratio between two machines: the hardware
    one (its own ratio ``hw``) where it leaves less than half of the ratio's logarithm
    unexplained, else the other (how much of that hardware each machine reaches)."""
    import math

    if not (ratio > 0 and hw > 0):
        return "the records do not say which factor moves it"
    rest = abs(math.log(ratio) - math.log(hw))
    verb = "move" if " and " in hw_name else "moves"
    if rest <= abs(math.log(ratio)) / 2:
        return f"{hw_name} {verb} it most"
    return f"{other_name} moves it more than {hw_name} {'do' if verb == 'move' else 'does'}"


def differences(cols: list[dict]) -> dict:
    """For each chapter, its number's spread over the machines, the hardware ratio that
    would predict it and which of the two factors (the hardware, or the share of it reached)
    accounts for the most: the sentences the page states, all from the records."""
    out = {f"machines.why_{k}": "fewer than two machines measured this chapter."
           for k in ("ch1", "ch2", "ch3", "ch4")}

    def ends(key):
        sp = _spread(cols, key)
        if not sp:
            return None
        (lo, clo), (hi, chi) = sp
        return clo, chi, hi / lo, (f"ranges from {clo[key]} ({_name(clo)}) to {chi[key]} "
                                   f"({_name(chi)}), {hi / lo:.2f} times")

    def val(c, key):
        return number(c["_values"].get(key)) or float("nan")

    e = ends("ch1.f32_peak_core")
    if e:
        clo, chi, r, text = e
        hw = (val(chi, "ch1.flops_per_cycle") * val(chi, "ch1.clock_f32")
              / (val(clo, "ch1.flops_per_cycle") * val(clo, "ch1.clock_f32")))
        out["machines.why_ch1"] = (
            f"One core's f32 peak {text}; the operations an FMA cycle does times the clock the "
            f"probe ran at predict {hw:.2f} times ({chi['_values'].get('machines.fma', '?')} at "
            f"{chi['_values'].get('ch1.clock_f32', '?')} against "
            f"{clo['_values'].get('machines.fma', '?')} at {clo['_values'].get('ch1.clock_f32', '?')}): "
            f"{moved_by(r, hw, 'the FMA width and the clock', 'something else')}.")
    # chapters 2 and 3: a rate against the cores' f32 peak, and the share of it each reached
    for ch, key, what, share, extra in (
            ("ch2", "ch2.final_gops", "The 1024³ product's last rung", "ch2.final_pct_peak",
             lambda lo, hi: f" (loop orders {lo['ch2.order']} and {hi['ch2.order']})"
             if not any(_unmeasured(c["ch2.order"]) for c in (lo, hi)) else ""),
            ("ch3", "ch3.kernels_toks", "The xl step on the f32 kernels", "ch3.kernels_mfu",
             lambda lo, hi: "")):
        e = ends(key)
        if e:
            clo, chi, r, text = e
            hw = val(chi, "ch1.f32_peak_all") / val(clo, "ch1.f32_peak_all")
            out[f"machines.why_{ch}"] = (
                f"{what} {text}; their f32 peaks differ {hw:.2f} times, and they reach "
                f"{clo[share]} and {chi[share]} of them{extra(clo, chi)}: "
                f"{moved_by(r, hw, 'the peak', 'the share of the peak reached')}.")
    e = ends("machines.gen_top")
    if e:
        clo, chi, r, text = e
        blo, bhi = (c["_values"].get("machines.gen_read_gbs") for c in (clo, chi))
        hw = bhi / blo if blo and bhi else float("nan")
        out["machines.why_ch4"] = (
            f"The top decode rung {text}; the read bandwidth of the level that holds its "
            f"weights differs {hw:.2f} times, and they reach {clo['machines.gen_share']} and "
            f"{chi['machines.gen_share']} of it: "
            f"{moved_by(r, hw, 'the bandwidth', 'the share of the bandwidth reached')}.")
    return out


def glance_rows(values: dict, rec_dir: Path, gpu: dict | None):
    """The home page's table: the reference series' rows, before and after, its figures, this
    machine's (``values``: the book's own, from ``rec_dir``) and the GPU's where measured; each
    of ours links to the section whose table it comes from."""
    nm = f"not measured at {commit_of(rec_dir)}" if records.exists("ch1.machine", rec_dir) else "not measured"

    def v(key, link):
        return f"[{values[key]}]({link})" if key in values and not str(values[key]).startswith("not measured") else nm

    top = f"ch4.rung{int(number(values.get('ch4.rungs', 0)) or 1) - 1}_toks"
    g = gpu or {}
    gnm = "not measured" if not gpu else f"not measured at {gpu['_commit']}"
    acc = ("ch3.modern_accumulated_toks" if "ch3.modern_accumulated_toks" in values
           else "ch3.rung7_toks")
    # like beside like: each row's "before" is where that climb starts (the reference's naive
    # kernels, our numpy step), the reference's GPU figures stand in their own column, and
    # the modern step is quoted at the batch its target is judged at
    rows = [
        ["f32 peak, every core", f"{f(ref.CH1_F32_PEAK_GOPS, 'Gop/s')}",
         v("ch1.f32_peak_all", "1-cpu.md#measuring-the-peak"), "—",
         g.get("ch1.f32_peak_all", gnm)],
        ["1024³ product, three loops → last rung",
         f"{f(ref.CH2_GEMM_1024_NAIVE_GOPS)} → {f(ref.CH2_GEMM_1024_FINAL_GOPS, 'Gop/s')}",
         f"{v('ch2.naive_gops', '2-matmul.md#rung-0-three-loops')} → "
         f"{v('ch2.final_gops', '2-matmul.md#rung-5-threads')}", "—",
         f"{g.get('ch2.naive_gops', gnm)} → {g.get('ch2.final_gops', gnm)}"],
        ["xl training step, tokens/s: the climb's start → its top",
         f"{f(ref.CH3_XL_STEP_BEFORE_TOKS)} (naive kernels) → "
         f"{f(ref.CH3_XL_STEP_AFTER_TOKS, 'tokens/s')}",
         f"{v('ch3.numpy_toks', '3-training.md#the-climb')} (numpy) → "
         f"{v('ch3.climb_top_toks', '3-training.md#the-climb')}", "—", gnm],
        ["xl step's share of the f32 peak", f"{100 * ref.CH3_XL_MFU_CPU:.0f} %",
         v("ch3.kernels_mfu", "3-training.md#against-the-targets"),
         f"{100 * ref.CH3_XL_MFU_GPU:.0f} %", gnm],
        ["modern block with Muon, bf16, tokens/s"
         + (f" ({values['ch3.accumulated_tokens']} tokens an optimiser step)"
            if acc == "ch3.modern_accumulated_toks" else " (the climb's batch)"),
         f"{f(ref.CH3_MODERN_BEFORE_TOKS)} → {f(ref.CH3_MODERN_AFTER_TOKS, 'tokens/s')}",
         v(acc, "3-training.md#the-modern-block-and-muon"), "—", gnm],
        ["one-sequence generation, first → top rung",
         f"{f(ref.CH4_GEN_BEFORE_TOKS)} → {f(ref.CH4_GEN_AFTER_TOKS, 'tokens/s')}",
         f"{v('ch4.rung0_toks', '4-generation.md#the-ladder')} → "
         f"{v(top, '4-generation.md#the-ladder')}",
         f"{f(ref.CH4_GEN_GPU_TOKS, 'tokens/s')}", gnm],
        ["prompt against llama.cpp (chapter 4's model)", "not published",
         v("ch4.pp_vs_llama", "4-generation.md#llamacpp-and-pytorch-beside-us"), "—", gnm],
        ["a one-minute training run, tokens/s (bits per byte)", "not published",
         (f"{v('ch3.s_tokens_per_s', '3-training.md#a-real-run')} "
          f"({values.get('ch3.s_final_bpb', nm)})"), "—", gnm],
    ]
    header = ["", f"reference's CPU ({ref.CPU})", "this machine", f"reference's GPU ({ref.GPU})",
              f"our {gpu['_header']}" if gpu else "our GPU"]
    return rows, header
