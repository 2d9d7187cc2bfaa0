"""The GPU side of chapters 1 to 4, measured through CuPy.

Chapter 1 (record ``ch1.gpu``): the f32 FMA peak of the CUDA cores, the bf16 peak of the
tensor cores, cuBLAS beside both, and the memory staircase (L2 and HBM read bandwidth over
working sets, a copy beside CuPy's). Chapter 2 (record ``ch2.gpu``): every rung of
:data:`smallem.plumbing.cuda.GPU_LADDER` at one size, and the final kernels over sizes, each beside
cuBLAS measured in the same run.

GPU time is taken with CUDA events around each call (a host clock would time the launch,
not the kernel); samples are kept in a :class:`smallem.cpu.timing.Timing` like every other
measurement. Chapter 3 (record ``ch3.gpu``, :mod:`.training`): the training step of both
blocks on the device, its losses beside the CPU's. Chapter 4 (``ch4.gpu``, :mod:`.decoding`):
one sequence decoded on the device, f32 and int8, the prompt as one product per matrix.
Without a GPU, :func:`notebook_section` shows the last committed records and :func:`report`
writes tables that say nothing has been measured yet.
"""

from __future__ import annotations

import time
from pathlib import Path

from smallem.plumbing import cuda
from smallem.cpu.timing import quick_mode
from .. import figures
from .measuring import (CH1, CH2, RECORDS, NOT_MEASURED, gpu_measure, machine, fma_peak,
                       mma_peak, read_bandwidth, copy_bandwidth, random_matrix, cublas_gemm,
                       cublas_bf16, ch1_settings, run_ch1, ch2_settings, CHECK_ROWS,
                       measure_rung, run_ch2)  # noqa: F401
from .tensor import TC_TARGET, measure_tc_target, run_ch2_with_target, tc_values  # noqa: F401
from .training import CH3, run_ch3, report_ch3, train_rows, TRAIN_HEADER  # noqa: F401
from .decoding import CH4, run_ch4, report_ch4, decode_rows, DECODE_HEADER  # noqa: F401
from .reading import (gpu_line, l2_plateau, peaks_rows, PEAKS_HEADER, STAIR_HEADER,
                     GEMM_HEADER, stair_rows, gemm_rows, staircase_figure, roofline_figure,
                     gemm_figure, load, load_gpu, gpu_dir)  # noqa: F401
from . import reading as _reading

RECORDS = (CH1, CH2, CH3, CH4)


def report(rec_dir) -> dict:
    """Every GPU table and figure from the records, and the values the pages quote."""
    return {**_reading.report(rec_dir), **tc_values(load_gpu(CH2, rec_dir)),
            **report_ch3(rec_dir), **report_ch4(rec_dir)}


# ---------------------------------------------------------------- notebooks

def _markdown(rows: list[list], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _show(text: str):
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
        if get_ipython() is not None:
            display(Markdown(text))
            return
    except ImportError:
        pass
    print(text)


def _show_svg(name: str):
    try:
        from IPython import get_ipython
        from IPython.display import SVG, display
        if get_ipython() is not None:
            display(SVG(filename=str(figures.figures_dir() / f"{name}.svg")))
    except ImportError:
        pass


def notebook_section(chapter: str, quick: bool | None = None):
    """The GPU part of a chapter's notebook: measure if there is a GPU, else show the records.

    With a GPU: in quick mode measure tiny sizes; otherwise reuse this GPU's record if one
    exists, else measure and save it. Without one: one line saying why, then the last
    committed records with their machine and date, or a line saying there are none yet.
    Returns the record shown (a dict) or None.
    """
    if chapter not in NAMES:
        raise ValueError(f"chapter must be one of {', '.join(NAMES)}, got {chapter!r}")
    quick = quick_mode() if quick is None else quick
    name, run = NAMES[chapter]
    reason = cuda.why_unavailable()
    rec = load_gpu(name)
    if reason is None:
        here = cuda.device_info()["name"]
        if quick or rec is None or rec["machine"].get("gpu", {}).get("name") != here:
            r = run(quick=quick, progress=False)
            r.save()
            rec = r.data
    else:
        print(f"No GPU in this run ({reason}).")
        if rec is None:
            print(f"No GPU measurements have been recorded yet ({name}): {NOT_MEASURED}.")
            return None
        print(f"Showing the last recorded GPU measurements: {gpu_line(rec)}.")
    _show("\n\n".join(_markdown(rows, header) for rows, header in _tables(chapter, rec)))
    if chapter == "ch1":
        staircase_figure(rec)
        roofline_figure(rec, load("ch1.machine"))
        _show_svg("gpu_staircase")
        _show_svg("gpu_roofline")
    elif chapter == "ch2":
        gemm_figure(rec)
        _show_svg("gpu_gemm")
    if reason is None:
        print(f"Measured just now on {gpu_line(rec)}.")
    return rec


# each chapter's GPU record and the function that measures it
NAMES = {"ch1": (CH1, run_ch1), "ch2": (CH2, run_ch2_with_target), "ch3": (CH3, run_ch3),
         "ch4": (CH4, run_ch4)}


def _tables(chapter: str, rec: dict) -> list:
    """The (rows, header) of each table a chapter's GPU record makes."""
    from .. import records
    here = records.records_dir()
    return {"ch1": lambda: [(peaks_rows(rec), PEAKS_HEADER), (stair_rows(rec), STAIR_HEADER)],
            "ch2": lambda: [(gemm_rows(rec), GEMM_HEADER)],
            "ch3": lambda: [(train_rows(rec, here), TRAIN_HEADER)],
            "ch4": lambda: [(decode_rows(rec, here), DECODE_HEADER)]}[chapter]()


# ---------------------------------------------------------------- command line

def add_gpu_check_arguments(p):
    p.add_argument("--out", required=True,
                   help="folder for the records (ch1.gpu.json ... ch4.gpu.json)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds not minutes")
    p.add_argument("--only", choices=list(NAMES), help="measure one chapter only")


def cmd_gpu_check(args) -> int:
    reason = cuda.why_unavailable()
    if reason:
        print(f"smallem gpu-check: no GPU: {reason}")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    quick = args.quick or quick_mode()
    print(f"GPU: {cuda.device_info()}")
    t0 = time.perf_counter()
    for name in cuda.kernel_names():  # compile first: a compiler error should stop us early
        cuda.module(name)
    print(f"compiled {', '.join(cuda.kernel_names())} in {time.perf_counter() - t0:.1f} s")
    failed = []
    for chapter, (name, run) in NAMES.items():
        if args.only and args.only != chapter:
            continue
        t0 = time.perf_counter()
        try:  # one chapter's failure must not lose the others' records
            rec = run(quick=quick)
        except Exception as e:  # reported, and the command fails at the end
            print(f"{chapter}: FAILED: {type(e).__name__}: {e}")
            failed.append(chapter)
            continue
        print(f"{chapter}: wrote {rec.save(out)} in {time.perf_counter() - t0:.0f} s")
    text = []  # the tables of every record in --out so far (one chapter a call, or all)
    for chapter, (name, _) in NAMES.items():
        rec = load(name, out)
        for rows, header in (_tables(chapter, rec) if rec else []):
            text += [f"## {chapter} on the GPU", _markdown(rows, header), ""]
    (out / "gpu_tables.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 1 if failed else 0


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = {"gpu-check": (cmd_gpu_check, add_gpu_check_arguments,
                          "chapters 1-4 on the GPU: measure, write records to --out")}
MEASURE = None  # needs a GPU: `smallem gpu-check` runs on a lent machine (gpu_check.sh)  # the command `make book` runs
