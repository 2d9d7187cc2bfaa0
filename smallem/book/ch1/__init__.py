"""Chapter 1, what a CPU is worth: the measurement, the reading of its record, its command.

Measures this machine's limits with the library's probes (:mod:`smallem.cpu.machine`) and writes
them to one record, ``ch1.machine``:

- the clock, from a chain of dependent integer adds (one cycle each), checked against a
  chain of multiplies;
- the theoretical f32 peak, from the clocks and the FMA probe (whole pipes of a real
  width), with the vendors' table of FMA pipes as a cross-check;
- peak compute: f32 FMA, bf16 dot, int8 dot, on one core and on all;
- the memory staircase: STREAM copy/scale/add/triad and a read-only stream (a sum) over
  working sets from 4 KiB to past the L3, on one core and on all, with numpy's copy as a
  peer;
- the starting point of chapter 2: a naive 1024^3 matrix product.

Later chapters read this machine's peaks and bandwidths through :func:`facts`, loaded once.
"""

from __future__ import annotations

from .measuring import (RECORD, RECORDS, PEAK_KINDS, AMX_KINDS, DOT_INSTRUCTION,
                       CLOCK_AGREEMENT, SCALING_FLOOR, ONE_THREAD_FLOOR, THEORY_BAND,
                       poorly_scaled, slow_one_thread, measure_peaks,
                       stream_sizes, measure_numpy_copy, measure_naive_gemm, run)  # noqa: F401
from .reading import (LEVELS, DISTINCT, STAIR_KERNELS, level_sizes, plateaus, spans, staircase_close, facts,
                     summary, theory, record_identity, hw_values, level_of, read_stream, read_stream_name, ridges,
                     ridge_position, staircase_distinct,
                     column_lines_held, naive_gemm_intensity, roofline_figure,
                     staircase_figure, table_rows, table_markdown, narrow_paths,
                     fma_pipes_rows, report, summary_lines)  # noqa: F401
from smallem.cpu.timing import quick_mode


# ---------------------------------------------------------------- command line

def add_machine_arguments(p):
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds not minutes")
    p.add_argument("--no-save", action="store_true", help="print the table, write no record")
    p.add_argument("--save-to", metavar="DIR",
                   help="measure nothing: capture this machine into DIR (tests/machines/<name>): "
                        "its OS files and the records of the make book that ran here")


def cmd_machine(args) -> int:
    if args.save_to:
        import sys

        from ..capture import CaptureError, save_to
        try:
            dest, elsewhere = save_to(args.save_to)
        except CaptureError as e:
            print(f"smallem machine: error: {e}", file=sys.stderr)
            return 2
        print(f"captured this machine into {dest}"
              + (f" (left out, measured elsewhere: {', '.join(elsewhere)})" if elsewhere else ""))
        if not (dest / "name.txt").is_file():
            print(f"now name it as a reader would, for appendix C's column: write e.g. "
                  f"'AMD Zen 4, EPYC (Genoa), 2 cores' into {dest / 'name.txt'}")
        return 0
    quick = args.quick or quick_mode()
    rec = run(quick=quick)
    print("\n" + "\n".join(summary_lines(rec.data)))
    if not args.no_save:
        print(f"record written to {rec.save()}")
    return 0


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = {"machine": (cmd_machine, add_machine_arguments, "chapter 1: measure this machine")}
MEASURE = "machine"  # the command `make book` runs
