"""The types of the commands' options, the library's (smallem/commands/) and the chapters':
a count and a bounded number, each a clear one-line error for anything else (argparse
reports it as the option's)."""

from __future__ import annotations

import argparse
import math


def count(minimum: int = 1):
    """An argparse type: an int >= ``minimum``; anything else is the option's error."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if n < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {n}")
        return n
    parse.__name__ = "count"
    return parse


def number(low: float, high: float = float("inf"), low_open: bool = False):
    """An argparse type: a finite float in [low, high] ((low, high] if ``low_open``)."""
    def parse(text):
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(x) or x < low or x > high or (low_open and x == low):
            if math.isinf(high):
                want = f"a number {'>' if low_open else '>='} {low:g}"
            else:
                want = f"a number in {'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"expected {want}, got {text}")
        return x
    parse.__name__ = "number"
    return parse


def bench_command(name: str, run, help_: str, *, threads: bool = True,
                  quick_help: str = "tiny sizes, seconds (for tests)") -> dict:
    """A chapter's benchmark as a ``smallem`` command, ``{name: (function, add_arguments,
    help)}`` (what :mod:`smallem.book` asks a chapter's ``COMMANDS`` for): ``--quick`` and,
    with ``threads``, ``--threads``, handed to ``run(quick=..., threads=...)``; each record
    it returns (one, or a tuple) is saved and named."""
    def add_arguments(p):
        p.add_argument("--quick", action="store_true", help=quick_help)
        if threads:
            p.add_argument("--threads", type=count(1), help="threads (default: all cores)")

    def command(args) -> int:
        kw = {"threads": args.threads} if threads else {}
        out = run(quick=args.quick or None, **kw)
        for rec in out if isinstance(out, tuple) else (out,):
            print(f"wrote {rec.save()}")
        return 0

    command.__name__ = "cmd_" + name.replace("-", "_")
    return {name: (command, add_arguments, help_)}
