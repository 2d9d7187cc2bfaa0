"""The ``smallem`` command line.

    smallem build [--isa LEVEL|all]    compile the C kernels into the cache
    smallem machine [--quick]          chapter 1: measure this machine, write the record
    smallem gemm [--quick]             chapter 2: the matrix-product ladder, write the record
    smallem figures                    regenerate figures and tables from records

Each subcommand lives in its chapter's module; this file only dispatches.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> "module:function"; each function takes the parsed args.
# A module adds its own options with an ``add_arguments(parser)`` beside it.
COMMANDS = {
    "build": ("smallem.cli:cmd_build", "compile the C kernels into the cache"),
    "machine": ("smallem.machine:cmd_machine", "chapter 1: measure this machine"),
    "gemm": ("smallem.gemm:cmd_gemm", "chapter 2: measure the matrix-product ladder"),
    "gemm-bf16": ("smallem.gemm:cmd_gemm_bf16",
                  "chapter 2: f32 against bf16 inputs only (for a second CPU, with AVX512_BF16)"),
    "gpu-check": ("smallem.gpu:cmd_gpu_check", "chapters 1-2 on the GPU: measure, write records to --out"),
    "figures": ("smallem.cli:cmd_figures", "regenerate figures and tables from records"),
    "train": ("smallem.train:cmd_train", "chapter 3: train a GPT on the CPU"),
    "bench-train": ("smallem.train:cmd_bench_train", "chapter 3: time training steps, write records"),
}


def cmd_build(args) -> int:
    from . import build, isa

    levels = list(isa.LEVELS) if args.isa == "all" else [args.isa or isa.selected()]
    for level in levels:
        exts = isa.OPTIONAL.get(level, ()) if not isa.supported(level) else isa.extensions(level)
        for name in build.kernel_names():
            path = build.compile_module(name, level, tuple(exts))
            runnable = "" if isa.supported(level) else "  (compiled only: this CPU cannot run it)"
            print(f"{level:8s} {name:12s} {path.name}{runnable}")
    return 0


def add_build_arguments(p):
    p.add_argument("--isa", help="avx512, avx2, generic or all (default: this CPU's level)")


def cmd_figures(args) -> int:
    from . import figures

    values = figures.make_all()
    print(f"wrote figures and tables to {figures.figures_dir()} ({len(values)} values)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="smallem", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (target, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        module_name, func = target.split(":")
        module = importlib.import_module(module_name)
        adder = getattr(module, f"add_{func.removeprefix('cmd_')}_arguments", None)
        if adder:
            adder(p)
        p.set_defaults(_target=target)
    args = parser.parse_args(argv)
    module_name, func = args._target.split(":")
    return getattr(importlib.import_module(module_name), func)(args) or 0


if __name__ == "__main__":
    sys.exit(main())
