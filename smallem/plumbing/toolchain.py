"""The C compiler the kernels are built with, and the error a failed build raises: below
both :mod:`smallem.plumbing.build` and :mod:`smallem.cpu.isa` (which compiles a one-line probe for SIMDe),
so that neither imports the other to find a compiler."""

from __future__ import annotations

import os
import shutil


class BuildError(RuntimeError):
    """A kernel could not be compiled or loaded; the message quotes the compiler."""


def compiler() -> str:
    """The C compiler: $CC, else cc, gcc or clang, whichever exists first."""
    for name in filter(None, [os.environ.get("CC"), "cc", "gcc", "clang"]):
        path = shutil.which(name.split()[0])
        if path:
            return path
    raise BuildError(
        "no C compiler found (looked for $CC, cc, gcc, clang). smallem builds its kernels "
        "on first use: install one (Debian/Ubuntu: apt install gcc; macOS: xcode-select "
        "--install) or point CC at it.")
