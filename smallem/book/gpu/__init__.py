"""The GPU side of chapters 1 and 2, measured through CuPy.

Chapter 1 (record ``ch1.gpu``): the f32 FMA peak of the CUDA cores, the bf16 peak of the
tensor cores, cuBLAS beside both, and the memory staircase (L2 and HBM read bandwidth over
working sets, a copy beside CuPy's). Chapter 2 (record ``ch2.gpu``): every rung of
:data:`smallem.plumbing.cuda.GPU_LADDER` at one size, and the final kernels over sizes, each beside
cuBLAS measured in the same run.

GPU time is taken with CUDA events around each call (a host clock would time the launch,
not the kernel); samples are kept in a :class:`smallem.cpu.timing.Timing` like every other
measurement. Without a GPU, :func:`notebook_section` shows the last committed records and
:func:`report` writes tables that say nothing has been measured yet.
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
from .reading import (gpu_line, l2_plateau, peaks_rows, PEAKS_HEADER, STAIR_HEADER,
                     GEMM_HEADER, stair_rows, gemm_rows, staircase_figure, roofline_figure,
                     gemm_figure, load, report)  # noqa: F401


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
    if chapter not in ("ch1", "ch2"):
        raise ValueError(f"chapter must be 'ch1' or 'ch2', got {chapter!r}")
    quick = quick_mode() if quick is None else quick
    name = CH1 if chapter == "ch1" else CH2
    reason = cuda.why_unavailable()
    rec = load(name)
    if reason is None:
        here = cuda.device_info()["name"]
        if quick or rec is None or rec["machine"].get("gpu", {}).get("name") != here:
            run = run_ch1 if chapter == "ch1" else run_ch2
            r = run(quick=quick, progress=False)
            r.save()
            rec = r.data
    else:
        print(f"No GPU in this run ({reason}).")
        if rec is None:
            print(f"No GPU measurements have been recorded yet ({name}): {NOT_MEASURED}.")
            return None
        print(f"Showing the last recorded GPU measurements: {gpu_line(rec)}.")
    if chapter == "ch1":
        _show(_markdown(peaks_rows(rec), PEAKS_HEADER))
        _show(_markdown(stair_rows(rec), STAIR_HEADER))
        staircase_figure(rec)
        roofline_figure(rec, load("ch1.machine"))
        _show_svg("gpu_staircase")
        _show_svg("gpu_roofline")
    else:
        _show(_markdown(gemm_rows(rec), GEMM_HEADER))
        gemm_figure(rec)
        _show_svg("gpu_gemm")
    if reason is None:
        print(f"Measured just now on {gpu_line(rec)}.")
    return rec


# ---------------------------------------------------------------- command line

def add_gpu_check_arguments(p):
    p.add_argument("--out", required=True, help="folder for the records (ch1.gpu.json, ch2.gpu.json)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds not minutes")
    p.add_argument("--only", choices=["ch1", "ch2"], help="measure one chapter only")


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
    recs = {}
    for chapter, run in (("ch1", run_ch1), ("ch2", run_ch2)):
        if args.only and args.only != chapter:
            continue
        t0 = time.perf_counter()
        rec = run(quick=quick)
        print(f"{chapter}: wrote {rec.save(out)} in {time.perf_counter() - t0:.0f} s")
        recs[chapter] = rec.data
    text = []
    if "ch1" in recs:
        text += ["## GPU peaks", _markdown(peaks_rows(recs["ch1"]), PEAKS_HEADER), "",
                 "## GPU staircase", _markdown(stair_rows(recs["ch1"]), STAIR_HEADER), ""]
    if "ch2" in recs:
        text += ["## GPU GEMM ladder", _markdown(gemm_rows(recs["ch2"]), GEMM_HEADER), ""]
    (out / "gpu_tables.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = {"gpu-check": (cmd_gpu_check, add_gpu_check_arguments,
                          "chapters 1-2 on the GPU: measure, write records to --out")}
MEASURE = None  # needs a GPU: `smallem gpu-check` runs on a lent machine (gpu_check.sh)  # the command `make book` runs
