"""`smallem build`: the C kernels compiled into the cache, for this CPU's level or all."""

from __future__ import annotations


def cmd_build(args) -> int:
    from smallem.plumbing import build
    from smallem.cpu import isa

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
