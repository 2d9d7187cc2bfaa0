"""The ``smallem`` command line.

    smallem build [--isa LEVEL|all]    compile the C kernels into the cache
    smallem train ...                  chapter 3: train a GPT on the CPU
    smallem generate ...               chapter 4: text from a checkpoint
    smallem export --gguf FILE ...     chapter 4: the model in llama.cpp's format
    smallem run MODEL.gguf ...         others' models: a llama-family GGUF file
    smallem measure [--list]           every chapter's measurement, in book order (`make book`)
    smallem figures                    regenerate figures and tables from records
    smallem machine | gemm | ...       one chapter's measurement (see `smallem --help`)

The library's commands are in :mod:`smallem.commands`; each chapter's commands come from its book module, through
the one list of chapters in :mod:`smallem.book`. This file only dispatches.
"""

from __future__ import annotations

import argparse
import os
import sys

from .commands import book as book_cmds, build, export, generate, run, train


# name -> (function, add_arguments, help): the library's commands; the book adds its own
COMMANDS = {
    "build": (build.cmd_build, build.add_build_arguments, "compile the C kernels into the cache"),
    "train": (train.cmd_train, train.add_train_arguments, "chapter 3: train a GPT on the CPU"),
    "generate": (generate.cmd_generate, generate.add_generate_arguments,
                 "chapter 4: generate text from a checkpoint, streaming the bytes"),
    "export": (export.cmd_export, export.add_export_arguments,
               "chapter 4: write a model as GGUF (llama.cpp's format), f32 or Q8_0"),
    "run": (run.cmd_run, run.add_run_arguments,
            "others' models: generate from a llama-family GGUF file (--info describes it)"),
    "measure": (book_cmds.cmd_measure, book_cmds.add_measure_arguments,
                "run every chapter's measurement, in book order (what `make book` does)"),
    "figures": (book_cmds.cmd_figures, None, "regenerate figures and tables from records"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad option reported in one line (not the whole usage)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv=None) -> int:
    from . import book

    parser = _Parser(prog="smallem", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (func, add_arguments, help_) in {**COMMANDS, **book.commands()}.items():
        p = sub.add_parser(name, help=help_)
        if add_arguments:
            add_arguments(p)
        p.set_defaults(_func=func)
    args = parser.parse_args(argv)
    try:
        return args._func(args) or 0
    except KeyboardInterrupt:
        print(f"smallem {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, TypeError, LookupError, OSError, RuntimeError) as e:
        # a bad value, a missing or corrupt file, a kernel that cannot be built: one line
        # (SMALLEM_DEBUG=1 shows the traceback)
        if os.environ.get("SMALLEM_DEBUG") == "1":
            raise
        print(f"smallem {args.command}: error: {e} (SMALLEM_DEBUG=1 shows where)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
