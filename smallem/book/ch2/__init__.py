"""Chapter 2, the matrix product: the ladder measured against numpy, the block-size sweeps,
the model's products, bf16, the thread pool, and the reading of the record ``ch2.gemm``.

The GEMM itself, its ladder and its analytical model are the library's :mod:`smallem.product.gemm`.
This package is the chapter's room in the book: ``measuring`` runs the benchmark into the
record, ``reading`` turns the record into the page's tables, figures and values, and this
file holds what :mod:`smallem.book` asks of every chapter, and the commands.
"""

from __future__ import annotations

import os
import subprocess
import sys

from smallem.cpu.timing import quick_mode
from .. import compare, figures
from .measuring import BF16_RECORD, RECORD, run, run_bf16
from .bf16 import _print_dtype_rows, dtype_rows
from .reading import _blas_line, alone_rows, ladder_rows, pool_values, shape_rows, sweep_rows
from .targets import bf16_target, targets
from .reading import report  # noqa: F401  (what smallem.book asks of a chapter)

RECORDS = (RECORD, BF16_RECORD)
# the peers its records compare against: record -> {peer: (result name, params)}; a
# committed book whose record lacks one fails tests/test_book_records.py
PEER_ROWS = {RECORD: {"numpy (OpenBLAS)": ("numpy", {})}}


# ---------------------------------------------------------------- command line

def add_gemm_arguments(p):
    p.add_argument("--quick", action="store_true", help="tiny sizes, seconds not minutes")
    p.add_argument("--no-save", action="store_true", help="print the table, write no record")


def cmd_gemm_bf16(args) -> int:
    rec = run_bf16(quick=args.quick or quick_mode())
    rows, values = dtype_rows(rec.data, prefix="ch2.bf16_native")
    print(f"{figures.machine_line(rec.data)}; {values['ch2.bf16_native_extensions']}; "
          f"matmul_bf16 takes the {values['ch2.bf16_native_chosen']} path")
    print(f"  probes: f32 FMA {values['ch2.bf16_native_f32_probe']}, "
          f"bf16 dot {values['ch2.bf16_native_bf16_probe']}")
    _print_dtype_rows(rows)
    print(compare.plain(bf16_target(rec.data)))
    if not args.no_save:
        print(f"wrote {rec.save()}")
    return 0


def cmd_gemm(args) -> int:
    # OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (set on some machines for old OpenBLAS builds)
    # slow a current one down; OpenBLAS reads them when it loads, so the benchmark
    # runs in a child process without them. Tests and other commands keep them.
    pinned = [k for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ]
    if pinned and not os.environ.get("_SMALLEM_GEMM_CHILD"):
        env = {k: v for k, v in os.environ.items() if k not in pinned}
        env["_SMALLEM_GEMM_CHILD"] = "1"
        argv = [sys.executable, "-m", "smallem", "gemm"] + (["--quick"] if args.quick else []) + (
            ["--no-save"] if args.no_save else [])
        print(f"running the benchmark without {', '.join(pinned)} (numpy's peer)", file=sys.stderr)
        return subprocess.call(argv, env=env)
    quick = args.quick or quick_mode()
    rec = run(quick=quick)
    rows, values = ladder_rows(rec.data)
    print(f"\n{figures.machine_line(rec.data)}; numpy: {_blas_line(rec.data)}")
    print(f"micro-kernel {values['ch2.mr']}x{values['ch2.nr']}; blocks of rungs 2-4 "
          f"MC={values['ch2.mc']} KC={values['ch2.kc']} NC={values['ch2.nc']}, of rung 5 and "
          f"matmul KC={values['ch2.kc5']} NC={values['ch2.nc5']}")
    width = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"  {r[0]:<{width}}  " + "  ".join(f"{c:>12}" for c in r[1:4]))
    for r in sweep_rows(rec.data)[0]:
        print(f"  sweep {r[0]:>7}: smallem {r[1]:>12}  numpy {r[2]:>12}  ({r[3]})")
    for r in shape_rows(rec.data)[0]:
        print(f"  {r[0]:<36} smallem {r[2]:>12}  numpy {r[3]:>12}  ({r[4]})")
    _print_dtype_rows(dtype_rows(rec.data)[0])
    for r in alone_rows(rec.data)[0]:
        print(f"  micro-kernel alone, B in {r[0]} ({r[1]}), {r[2]} thread(s): {r[3]}, {r[5]} of "
              f"the probe")
    for line in map(compare.plain, targets(rec.data)):
        print("  target: " + line)
    pv = pool_values(rec.data)
    print(f"  parallel region {pv['ch2.pool_region_us']} vs create+join {pv['ch2.pool_spawn_us']}; "
          f"the team's thread ids: {pv['ch2.pool_same']} on every call")
    if not args.no_save:
        path = rec.save()
        print(f"wrote {path}")
    return 0


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = {
    "gemm": (cmd_gemm, add_gemm_arguments, "chapter 2: measure the matrix-product ladder"),
    "gemm-bf16": (cmd_gemm_bf16, add_gemm_arguments,
                  "chapter 2: f32 against bf16 inputs only (for a second CPU, with AVX512_BF16)"),
}
MEASURE = "gemm"  # the command `make book` runs
