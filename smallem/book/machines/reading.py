"""The book across machines, read from records only.

Every folder of ``tests/machines/`` that holds a chapter-1 record is a machine: the records
of a fresh clone's ``make book`` there. :func:`harvest` runs each chapter's own reading over
such a folder (into a scratch folder, drawing no figure), so that each cell of the page is
the value that machine's own book would print, or "absent (<commit>)" where its records lack
the chapter. :func:`numbers` computes the typed figures the page compares from the records
themselves (nothing is read back from a formatted cell), and :func:`differences` the
ratios, predictions and names the page's sentences are written from. :func:`glance_rows` is the home page's table: the reference series' rows,
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


_HARVESTED: dict = {}


def harvest(rec_dir: Path) -> tuple[dict, dict]:
    """(values, missing) of the CPU chapters over the records in ``rec_dir``: each chapter's
    report, as its own page would quote it; ``missing`` names each chapter that has no record
    there, or whose record today's reading cannot read (with the reason). Kept for the
    process under the folder's files (name, size, modification time): appendix C reads every
    captured folder on every rendering, and a folder whose files did not change reads the
    same."""
    files = sorted(Path(rec_dir).glob("*.json"))
    key = (str(Path(rec_dir).resolve()),
           tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files))
    if key not in _HARVESTED:
        _HARVESTED[key] = _harvest(rec_dir)
    values, missing = _HARVESTED[key]
    return dict(values), dict(missing)


def _harvest(rec_dir: Path) -> tuple[dict, dict]:
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


# (chapter, row label, the value's key, the page section it comes from, the unit of a typed
# value, whether the row applies to a GPU)
ROWS = (
    ("ch1", "f32 peak per core (chapter 1's rule)", "machines.f32_core", "1-cpu.md#measuring-the-peak"),
    ("ch1", "f32 peak, every core", "machines.f32_all", "1-cpu.md#measuring-the-peak"),
    ("ch1", "FMA pipes (vendor's table)", "machines.fma_table", "1-cpu.md#the-peak-is-a-product-of-five-numbers"),
    ("ch1", "FMAs a cycle (measured)", "machines.fma_measured", "1-cpu.md#the-peak-is-a-product-of-five-numbers"),
    ("ch1", "clock (dependent chain)", "machines.clock", "1-cpu.md#measuring-the-clock"),
    ("ch1", "fastest bf16 path, every core", "machines.bf16_all", "1-cpu.md#narrower-numbers-bf16-and-int8"),
    ("ch1", "fastest int8 path, every core", "machines.int8_all", "1-cpu.md#narrower-numbers-bf16-and-int8"),
    ("ch1", "L3 triad, one core", "machines.l3_core", "1-cpu.md#the-memory-staircase"),
    ("ch1", "L3 triad, every core", "machines.l3_all", "1-cpu.md#the-memory-staircase"),
    ("ch1", "DRAM read, every core", "machines.dram_read_all", "1-cpu.md#the-memory-staircase"),
    ("ch1", "where L2 ends (one core's triad)", "machines.l2_end", "1-cpu.md#the-memory-staircase"),
    ("ch1", "where L3 ends (one core's triad)", "machines.l3_end", "1-cpu.md#the-memory-staircase"),
    ("ch2", "1024³ product, three loops", "machines.naive_gops", "2-matmul.md#rung-0-three-loops"),
    ("ch2", "1024³ product, top f32 rung", "machines.final_gops", "2-matmul.md#rung-5-threads"),
    ("ch2", "top f32 rung's share of the f32 peak", "machines.final_share", "2-matmul.md#rung-5-threads"),
    ("ch2", "loop order the package took (the model's, unless the timing overruled it)", "ch2.order", "2-matmul.md#the-packages-gemm"),
    ("ch2", "micro-kernel (rows x columns)", "machines.tile", "2-matmul.md#rung-3-the-micro-kernel-in-registers"),
    ("ch2", "blocks mc, kc, nc of that order", "machines.blocks", "2-matmul.md#block-sizes-from-the-caches-not-from-tuning"),
    ("ch2", "bf16 path chosen", "ch2.bf16_chosen", "2-matmul.md#bf16-inputs"),
    ("ch3", "xl step, kernels (f32)", "machines.step_toks", "3-training.md#the-climb"),
    ("ch3", "xl step, top of the climb", "ch3.climb_top_toks", "3-training.md#the-climb"),
    ("ch3", "f32 step's share of the f32 peak (MFU, the climb's top f32 rung)", "machines.step_share", "3-training.md#the-climb"),
    ("ch3", "modern block with Muon, the climb's batch", "ch3.rung7_toks", "3-training.md#the-modern-block-and-muon"),
    ("ch4", "generation, first rung", "ch4.rung0_toks", "4-generation.md#the-ladder"),
    ("ch4", "generation, top rung", "machines.gen_top", "4-generation.md#the-ladder"),
    ("ch4", "top rung against llama.cpp", "ch4.vs_llama_ladder", "4-generation.md#llamacpp-and-pytorch-beside-us"),
    ("ch4", "top rung's share of its read bound", "machines.gen_share", "4-generation.md#the-ladder"),
    ("others", "Qwen2.5-0.5B Q8_0 decode", "machines.others_qwen25_q8_0", "b-others.md#beside-llamacpp"),
    ("others", "SmolLM2-135M Q4_0 decode", "machines.others_smollm2_q4_0", "b-others.md#beside-llamacpp"),
)
# the rows a GPU's record can fill; the others do not apply to a GPU ("—")
GPU_ROWS = {"machines.f32_all", "machines.bf16_all", "machines.naive_gops", "machines.final_gops"}
# the unit a typed value of a chapter is printed with in a cell
UNITS = {"ch3.climb_top_toks": "tokens/s", "ch3.rung7_toks": "tokens/s",
         "ch3.numpy_toks": "tokens/s", "ch3.modern_accumulated_toks": "tokens/s",
         "ch3.s_tokens_per_s": "tokens/s", "ch4.rung0_toks": "tokens/s",
         **{f"ch4.rung{i}_toks": "tokens/s" for i in range(12)}, "ch4.top_toks": "tokens/s",
         "ch4.vs_llama_ladder": "×", "ch4.pp_vs_llama": "×"}
# a prediction across machines holds within this factor (and the same direction)
TOLERANCE = 1.5


def cell(v, unit: str = "") -> str:
    """A table cell from a value, typed or already written by its chapter."""
    if isinstance(v, bool) or v is None:
        return "—" if v is None else ("yes" if v else "no")
    if isinstance(v, (int, float)):
        return (figures.times(v) if unit == "×" else figures.pct(v) if unit == "%"
                else f(v, unit))
    return str(v)


def _ch1_numbers(facts: dict) -> dict:
    """Chapter 1's peaks, FMA facts, clock, narrow paths and plateaus' ends."""
    from .. import ch1

    th, cores = facts["theory"], facts["cores"]
    hw = ch1.hw_values(facts["record"], th)
    out = {"f32_core": th["probe_gops_core"], "f32_core_from": th["probe_from"],
           "f32_all": facts["peak"][("f32", cores)], "clock": th["clock_ghz"],
           "lanes": th["lanes"], "vector_bits": hw["ch1.hw.vector_bits"],
           "fmas": hw["ch1.hw.fmas_per_cycle"], "core": hw["ch1.hw.core"],
           "pipes": hw["ch1.hw.pipes"], "pipe_bits": hw["ch1.hw.pipe_bits"],
           "cores": cores,
           "identified": ch1.record_identity(facts["record"]["machine"]) is not None}
    if hw["ch1.hw.pipes"]:  # the vendor's f32 lanes a cycle at the kernels' width
        out["table_lanes"] = hw["ch1.hw.pipes"] * min(hw["ch1.hw.pipe_bits"],
                                                      hw["ch1.hw.vector_bits"]) // 32
    try:
        paths = ch1.narrow_paths(facts)
    except (KeyError, TypeError):
        paths = {}
    for kind in ("bf16", "int8"):
        if paths.get(kind):
            name, _, every = paths[kind][-1]
            out[f"{kind}_all"] = every
            out[f"{kind}_path"] = (f"{kind} fallback, no dot-product instruction"
                                   if "fallback" in name else name)
    spans = facts["triad_spans"]
    one = spans.get(1) or spans[min(spans)]
    for lv in ("L2", "L3"):
        if lv in one:
            out[f"{lv.lower()}_end"] = one[lv]["last"]
    stairs = facts["triad_plateaus"]
    if 1 in stairs and "L3" in stairs[1]:
        out["l3_core"] = stairs[1]["L3"]
    if cores in stairs and "L3" in stairs[cores]:
        out["l3_all"] = stairs[cores]["L3"]
    if "read_plateaus" in facts and cores in facts["read_plateaus"]:
        out["dram_read_all"] = facts["read_plateaus"][cores]["DRAM"]
    return out


def _ch2_numbers(rec_dir: Path) -> dict:
    """The last and the naive rung of chapter 2, and the last one's share of the peak chapter
    2 takes it against (its own rule: chapter 1's record or its run's probe, the higher),
    with that peak and where it comes from, for the cell to name where it is not the f32
    peak of chapter 1 the table shows."""
    out: dict = {}
    if records.exists("ch2.gemm", rec_dir):
        rec = records.load("ch2.gemm", rec_dir)
        try:
            from ..ch2.reading import LADDER, _peak
            n = rec["settings"]["n_ladder"]
            out["final_gops"] = records.value(rec, "rung", rung=LADDER["threads"].index, M=n)
            out["naive_gops"] = records.value(rec, "rung", rung=LADDER["naive"].index, M=n)
            out["final_peak"], out["final_peak_from"] = _peak(rec, rec_dir)
            out["final_share"] = out["final_gops"] / out["final_peak"]
        except (KeyError, IndexError, TypeError, ValueError):
            pass
    return out


def _ch3_numbers(rec_dir: Path, facts: dict) -> dict:
    """Chapter 3's f32 step: tokens a second and their share of the f32 peak."""
    out: dict = {}
    if records.exists("ch3.train_step", rec_dir):
        rec = records.load("ch3.train_step", rec_dir)
        from ..ch3.reading import AT, F32_TOP
        step = records.results(rec, "rung_step", rung=AT["arena"])
        # the share of the peak: the climb's top f32 rung, as the reference's is its final step
        top = records.results(rec, "rung_step", rung=F32_TOP) or step
        if step and "flops_per_token" in rec["settings"]:
            toks = records.median(step[0])
            peak = {t: v for (k, t), v in facts["peak"].items() if k == "f32"}
            p = peak.get(rec["settings"]["threads"], peak[max(peak)])
            out["step_toks"], out["step_peak"] = toks, p
            out["step_share"] = records.median(top[0]) * rec["settings"]["flops_per_token"] / (p * 1e9)
    return out


def top_rung(rec: dict, values: dict | None = None) -> int | None:
    """Chapter 4's top rung: the one its own reading names (``ch4.top_rung``) where it names
    one, else its ladder's last rung, as its reading takes it."""
    top = (values or {}).get("ch4.top_rung")
    if isinstance(top, int) and not isinstance(top, bool):
        return top
    rungs = [i for i, _ in rec["settings"].get("ladder", {}).get("rungs", [])]
    return max(rungs) if rungs else None


def _ch4_numbers(rec_dir: Path, facts: dict, values: dict | None = None) -> dict:
    """Chapter 4's top decode rung (:func:`top_rung`), the level its bytes stream from and
    its share of that level's bound, by chapter 4's own bound: the weights and the cached
    keys and values at the last timed position, held by the level chapter 4's reading names
    (``ch4.reading.holding``), so that the cell is the share the chapter's table prints."""
    from ..ch4 import reading as ch4r

    out: dict = {}
    if records.exists("ch4.decode", rec_dir):
        rec = records.load("ch4.decode", rec_dir)
        rung = top_rung(rec, values)
        found = records.results(rec, "decode", rung=rung) if rung is not None else []
        if found and "weight_bytes" in found[0]["params"]:
            r, s = found[0], rec["settings"]["ladder"]
            data = r["params"]["weight_bytes"] + ch4r._kv_bytes(s, s["decode_tokens"])
            h = ch4r.holding(facts, data, r["params"].get("threads", rec["settings"]["threads"]))
            toks = records.median(r)
            out.update({"gen_top": toks, "gen_rung": rung, "gen_read_gbs": h["bw"] / 1e9,
                        "gen_level": h["level"], "gen_share": toks * data / h["bw"]})
            if h.get("gap_bw"):  # past the cache's plateau, short of DRAM's: both, as chapter 4
                out["gen_dram_share"] = toks * data / h["gap_bw"]
    return out


def _others_numbers(rec_dir: Path) -> dict:
    """Appendix B's decode rates of the two models the table compares."""
    from ..others.measuring import RECORD as OTHERS

    out: dict = {}
    if records.exists(OTHERS, rec_dir):
        rec = records.load(OTHERS, rec_dir)
        for shape, qtype in (("qwen2.5-0.5b", "Q8_0"), ("smollm2-135m", "Q4_0")):
            found = records.results(rec, "decode", model=shape, type=qtype)
            if found:
                slug = f"{shape.split('-')[0].replace('.', '')}_{qtype.lower()}"
                out[f"others_{slug}"] = records.median(found[0])
    return out


def numbers(rec_dir: Path, values: dict | None = None) -> dict:
    """The typed numbers the page compares across machines, each computed from the records
    (never read back from a formatted cell): chapter 1's peaks (the one-core figure by
    chapter 1's rule: the better of one thread and every core over the cores), the FMA facts
    (measured, and the vendor's table), the chain's clock, the plateaus' ends, the last
    rung of chapter 2, the f32 step of chapter 3, the top decode rung of chapter 4 (the one
    chapter 4's ``values`` name, where given) and the appendix B decode rates."""
    from .. import ch1, ch2, ch3  # noqa: F401

    facts = ch1.facts(rec_dir)
    if not facts:
        return {}
    out = _ch1_numbers(facts)
    out.update(_ch2_numbers(rec_dir))
    out.update(_ch3_numbers(rec_dir, facts))
    out.update(_ch4_numbers(rec_dir, facts, values))
    out.update(_others_numbers(rec_dir))
    return out


def _cells(nums: dict) -> dict:
    """The table's cells of the numbers :func:`numbers` computed."""
    out = {}
    if "f32_core" in nums:
        out["machines.f32_core"] = f(nums["f32_core"], "Gop/s") + f" ({nums['f32_core_from']})"
        out["machines.f32_all"] = f(nums["f32_all"], "Gop/s")
        out["machines.fma_table"] = (f"{nums['pipes']} × {nums['pipe_bits']} bits ({nums['core']})"
                                     if nums.get("pipes") else "not in the table"
                                     if nums["identified"] else "the record predates its vendor and model fields")
        out["machines.fma_measured"] = (f"{nums['fmas']} × {nums['vector_bits']}-bit "
                                        f"({nums['lanes']} f32 lanes)")
        out["machines.clock"] = f(nums["clock"], "GHz")
    for kind in ("bf16", "int8"):
        if f"{kind}_all" in nums:
            out[f"machines.{kind}_all"] = f"{f(nums[f'{kind}_all'], 'Gop/s')} ({nums[f'{kind}_path']})"
    for key, unit in (("l3_core", "GB/s"), ("l3_all", "GB/s"), ("dram_read_all", "GB/s"),
                      ("naive_gops", "Gop/s"), ("final_gops", "Gop/s"), ("step_toks", "tokens/s"),
                      ("gen_top", "tokens/s"), ("others_qwen25_q8_0", "tokens/s"),
                      ("others_smollm2_q4_0", "tokens/s")):
        if key in nums:
            out[f"machines.{key}"] = f(nums[key], unit)
    for key in ("l2_end", "l3_end"):
        if key in nums:
            out[f"machines.{key}"] = _size(nums[key])
    for key, peak, source in (("final_share", "final_peak", nums.get("final_peak_from")),
                              ("step_share", "step_peak", "chapter 1's, on its threads")):
        if key in nums:
            # each share against the peak the table shows, or the cell names the one it used
            shown = "f32_all" in nums and f(nums["f32_all"], "Gop/s") == f(nums[peak], "Gop/s")
            out[f"machines.{key}"] = figures.pct(nums[key]) + (
                "" if shown else f" of {f(nums[peak], 'Gop/s')} ({PEAK_FROM.get(source, source)})")
    if "gen_share" in nums:
        out["machines.gen_share"] = f"{figures.pct(nums['gen_share'])} ({nums['gen_level']})" + (
            f", {figures.pct(nums['gen_dram_share'])} (DRAM)" if "gen_dram_share" in nums else "")
    return out


# where chapter 2's peak came from, as a cell of this table names it
PEAK_FROM = {"this run's probe": "chapter 2's own probe", "chapter 1's record": "chapter 1's record"}


def _size(nbytes: float) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:g} KiB"


def column(folder: Path) -> dict:
    """One machine's column: {key: cell}, "not measured (records of <commit>)" where its
    records lack the chapter, and its header; "_numbers" holds the typed numbers the page
    compares (:func:`numbers`)."""
    rec_dir = folder / "records"
    values, missing = harvest(rec_dir)
    nums = numbers(rec_dir, values)
    cells = {**{k: cell(v, UNITS.get(k, "")) for k, v in values.items()}, **_cells(nums)}
    if records.exists("ch2.gemm", rec_dir):
        s = records.load("ch2.gemm", rec_dir)["settings"]
        if "mr" in s:
            cells["machines.tile"] = f"{s['mr']} x {s['nr']}"
        b = s.get("blocks")
        if isinstance(b, dict) and {"mc", "kc", "nc"} <= set(b):
            cells["machines.blocks"] = f"{b['mc']}, {b['kc']}, {b['nc']}"
    commit = commit_of(rec_dir)
    out = {}
    for chapter, _, key, _ in ROWS:
        if chapter in missing and missing[chapter] != "no record":
            out[key] = f"older record ({commit})"
        elif key not in cells or str(cells[key]).startswith(("not measured", "n/a")):
            out[key] = f"absent ({commit})"
        else:
            out[key] = cells[key]
    out["_header"] = reader_name(folder)
    out["_folder"] = folder.name
    out["_commit"] = commit
    out["_missing"] = missing
    out["_values"] = values
    out["_numbers"] = nums
    return out


def gpu_column(rec_dirs: list[Path]) -> dict | None:
    """The GPU's cells from the first chapter-1 GPU record found (a GPU measured them), or
    None where no folder holds one. Its bf16 row is the fastest bf16 product measured: the
    tensor cores' probe or cuBLAS, whichever ran faster, named."""
    for d in rec_dirs:
        if not records.exists("ch1.gpu", d):
            continue
        rec = records.load("ch1.gpu", d)
        gpu = rec["machine"].get("gpu")
        if not gpu or not records.results(rec, "fma_peak"):
            continue
        out = {"_header": f"GPU: {gpu.get('name', 'GPU')}", "_commit": rec.get("commit", "?")[:7],
               "_name": gpu.get("name", "GPU")}
        out["machines.f32_all"] = f(records.value(rec, "fma_peak", kind="f32"), "Gop/s")
        bf16 = [(records.median(r), "tensor-core probe")
                for r in records.results(rec, "mma_peak")]
        bf16 += [(records.median(r), f"cuBLAS, n = {r['params']['n']}")
                 for r in records.results(rec, "cublas") if r["params"].get("dtype") == "bf16"]
        if bf16:
            v, how = max(bf16)
            out["machines.bf16_all"] = f"{f(v, 'Gop/s')} ({how})"
        if records.exists("ch2.gpu", d):
            g = records.load("ch2.gpu", d)
            ladder = [r for r in records.results(g, "gemm") if r["params"].get("dtype") == "f32"]
            if ladder:
                top = max(ladder, key=lambda r: r["params"].get("number", 0))
                out["machines.final_gops"] = (f"{f(top['value']['median'], 'Gop/s')} "
                                              f"(n = {top['params']['n']})")
                naive = [r for r in ladder if r["params"].get("number") == 0]
                if naive:
                    out["machines.naive_gops"] = (f"{f(naive[0]['value']['median'], 'Gop/s')} "
                                                  f"(n = {naive[0]['params']['n']})")
        return out
    return None


def across_table(cols: list[dict], gpu: dict | None):
    header = ["", *(c["_header"] for c in cols)] + ([gpu["_header"]] if gpu else [])
    rows = []
    for chapter, label, key, link in ROWS:
        row = [f"[{label}]({link})", *(c[key] for c in cols)]
        if gpu:
            row.append(gpu.get(key, f"absent ({gpu['_commit']})") if key in GPU_ROWS
                       else "—")
        rows.append(row)
    return rows, header


def _spread(cols: list[dict], key: str):
    """((lowest value, its column), (highest value, its column)) over the machines whose
    records hold the number ``key`` (:func:`numbers`), or None for fewer than two."""
    got = [(c["_numbers"][key], c) for c in cols if c["_numbers"].get(key)]
    if len(got) < 2:
        return None
    return min(got, key=lambda t: t[0]), max(got, key=lambda t: t[0])


def moved_by(ratio: float, hw: float) -> bool:
    """Whether a hardware ratio ``hw`` accounts for most of a ratio between two machines:
    it leaves less than half of the ratio's logarithm unexplained."""
    import math

    if not (ratio > 0 and hw > 0):
        return False
    return abs(math.log(ratio) - math.log(hw)) <= abs(math.log(ratio)) / 2


def within(predicted: float, measured: float, factor: float = TOLERANCE) -> bool:
    """A prediction of a ratio holds: within ``factor`` of the measured one, on the same side
    of 1."""
    if not (predicted > 0 and measured > 0):
        return False
    same_side = (predicted - 1) * (measured - 1) >= 0 or abs(predicted - 1) < 0.05
    return same_side and 1 / factor <= predicted / measured <= factor


def differences(cols: list[dict]) -> dict:
    """For each chapter, its number's spread over the machines (typed: the two ends, their
    machines, the ratio), the hardware ratio that would predict it and whether it accounts
    for most of it: the page writes the sentences."""
    out: dict = {"machines.tolerance": TOLERANCE}

    def ends(ch, key):
        sp = _spread(cols, key)
        out[f"machines.{ch}.shown"] = bool(sp)
        if not sp:
            return None
        (lo, clo), (hi, chi) = sp
        out.update({f"machines.{ch}.lo": lo, f"machines.{ch}.hi": hi,
                    f"machines.{ch}.lo_name": clo["_header"], f"machines.{ch}.hi_name": chi["_header"],
                    f"machines.{ch}.ratio": hi / lo})
        return clo["_numbers"], chi["_numbers"], hi / lo

    e = ends("ch1", "f32_core")
    if e:
        lo, hi, r = e
        table = bool(lo.get("table_lanes") and hi.get("table_lanes"))
        lanes = (hi["table_lanes"] / lo["table_lanes"]) if table else hi["lanes"] / lo["lanes"]
        clock = hi["clock"] / lo["clock"]
        pred = lanes * clock
        out.update({"machines.ch1.lanes_from_table": table,
                    "machines.ch1.lo_lanes": lo["table_lanes"] if table else lo["lanes"],
                    "machines.ch1.hi_lanes": hi["table_lanes"] if table else hi["lanes"],
                    "machines.ch1.lo_clock": lo["clock"], "machines.ch1.hi_clock": hi["clock"],
                    "machines.ch1.lanes_ratio": lanes, "machines.ch1.clock_ratio": clock,
                    "machines.ch1.predicted": pred, "machines.ch1.holds": within(pred, r),
                    "machines.ch1.by_lanes": moved_by(r, lanes) and abs(lanes - 1) > 0.05,
                    "machines.ch1.by_clock": moved_by(r, clock) and abs(clock - 1) > 0.05})
    for ch, key, share, against in (("ch2", "final_gops", "final_share", "final_peak"),
                                    ("ch3", "step_toks", "step_share", "step_peak")):
        e = ends(ch, key)
        if e:
            lo, hi, r = e
            # the peaks the shares are taken against (chapter 2's own rule for its product)
            peak = hi.get(against, hi["f32_all"]) / lo.get(against, lo["f32_all"])
            out.update({f"machines.{ch}.peak_ratio": peak,
                        f"machines.{ch}.lo_share": lo[share], f"machines.{ch}.hi_share": hi[share],
                        f"machines.{ch}.by_peak": moved_by(r, peak)})
    e = ends("ch4", "gen_top")
    if e:
        lo, hi, r = e
        bw = hi["gen_read_gbs"] / lo["gen_read_gbs"]
        out.update({"machines.ch4.bw_ratio": bw,
                    "machines.ch4.lo_share": lo["gen_share"], "machines.ch4.hi_share": hi["gen_share"],
                    "machines.ch4.lo_level": lo["gen_level"], "machines.ch4.hi_level": hi["gen_level"],
                    "machines.ch4.by_bw": moved_by(r, bw)})
    return out


def summary_lines(values: dict) -> list[str]:
    """The page's comparisons in a terminal's words (the notebook prints them)."""
    lines = []
    for ch, what, unit in (("ch1", "one core's f32 peak", "Gop/s"),
                           ("ch2", "the 1024³ product's top f32 rung", "Gop/s"),
                           ("ch3", "the xl step on the f32 kernels", "tokens/s"),
                           ("ch4", "the top decode rung", "tokens/s")):
        if not values.get(f"machines.{ch}.shown"):
            lines.append(f"{ch}: fewer than two machines measured it")
            continue
        lines.append(f"{ch}: {what} from {f(values[f'machines.{ch}.lo'], unit)} "
                     f"({values[f'machines.{ch}.lo_name']}) to {f(values[f'machines.{ch}.hi'], unit)} "
                     f"({values[f'machines.{ch}.hi_name']}), "
                     f"{figures.times(values[f'machines.{ch}.ratio'])}")
    return lines


def glance_rows(values: dict, rec_dir: Path, gpu: dict | None):
    """The home page's table: the reference series' rows, before and after, its figures, this
    machine's (``values``: the book's own, from ``rec_dir``) and the GPU's where measured; each
    of ours links to the section whose table it comes from."""
    nm = (f"not measured (records of {commit_of(rec_dir)})"
          if records.exists("ch1.machine", rec_dir) else "not measured")

    def v(key, link):
        c = (cell(values[key], UNITS.get(key, ""))
             if values.get(key) is not None else "")  # None: this record lacks it
        return nm if not c or c.startswith(("not measured", "n/a")) else f"[{c}]({link})"

    # chapter 4's top rung, as chapter 4 names it (its rate where it publishes one)
    nums = numbers(rec_dir, values)
    top = ("ch4.top_toks" if "ch4.top_toks" in values
           else f"ch4.rung{nums.get('gen_rung', 0)}_toks")
    g = gpu or {}
    gnm = "not measured on a GPU yet" if not gpu else "not measured on the GPU"
    acc = ("ch3.modern_accumulated_toks" if "ch3.modern_accumulated_toks" in values
           else "ch3.rung7_toks")
    # like beside like: each row's "before" is where that climb starts (the reference's naive
    # kernels, our numpy step), the reference's GPU figures stand in their own column, and
    # the modern step is quoted at the batch its target is judged at
    rows = [
        ["f32 peak, every core", f"{f(ref.CH1_F32_PEAK_GOPS, 'Gop/s')}",
         v("machines.f32_all", "1-cpu.md#measuring-the-peak"), "—",
         g.get("machines.f32_all", gnm)],
        ["square product, three loops → top f32 rung (1024³ where no other n is given)",
         f"{f(ref.CH2_GEMM_1024_NAIVE_GOPS)} → {f(ref.CH2_GEMM_1024_FINAL_GOPS, 'Gop/s')}",
         f"{v('machines.naive_gops', '2-matmul.md#rung-0-three-loops')} → "
         f"{v('machines.final_gops', '2-matmul.md#rung-5-threads')}", "—",
         f"{g.get('machines.naive_gops', gnm)} → {g.get('machines.final_gops', gnm)}"],
        ["xl training step, tokens/s: the climb's start → its top",
         f"{f(ref.CH3_XL_STEP_BEFORE_TOKS)} (naive kernels) → "
         f"{f(ref.CH3_XL_STEP_AFTER_TOKS, 'tokens/s')}",
         f"{v('ch3.numpy_toks', '3-training.md#the-climb')} (numpy) → "
         f"{v('ch3.climb_top_toks', '3-training.md#the-climb')}"
         # the top rung named: the reference's top is an f32 step, ours may be bf16
         + (f" ({values['ch3.climb_top']})" if values.get("ch3.climb_top") else ""),
         "—", gnm],
        ["xl step's share of the peak: the reference's final step over its CPU's f32 peak "
         "(recomputed at this book's FLOPs, chapter 3), ours (the climb's top f32 rung) over this "
         "machine's, the reference GPU's as its text gives it (its peak unnamed there)",
         f"{100 * ref.CH3_XL_MFU_CPU:.0f} %",
         v("machines.step_share", "3-training.md#the-climb"),
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
        ["the prompt, our fastest int8 rung's tokens/s over llama.cpp's on the same "
         "Q8_0 file and threads (chapter 4's model; its build: chapter 4)", "not published",
         v("ch4.pp_vs_llama", "4-generation.md#llamacpp-and-pytorch-beside-us"), "—", gnm],
        ["a training run on a one-minute budget (f32), tokens/s (bits per byte)", "not published",
         v('ch3.s_tokens_per_s', '3-training.md#a-real-run')
         + (f" ({values['ch3.s_final_bpb']})" if values.get("ch3.s_final_bpb") is not None
            else ""), "—", gnm],
    ]
    header = ["", f"reference's CPU ({ref.CPU})", "this machine", f"reference's GPU ({ref.GPU})",
              f"our {gpu['_header']}" if gpu else "our GPU"]
    return rows, header
