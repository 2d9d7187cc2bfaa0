"""The book's ladders: one type for chapter 2's products (:data:`smallem.product.gemm.LADDER`), the GPU's
(:data:`smallem.plumbing.cuda.GPU_LADDER`), chapter 3's training steps and chapter 4's decoders
(:data:`smallem.generating.decode.RUNGS`).

A ladder is a sequence of small rungs, each one idea more than the one before. Each
:class:`Rung` has a name, by which everything addresses it (``LADDER["packed"]``), what it
runs (a callable, or the settings that make one), and :class:`Where` a reader finds it in one
hop: its kernel's marked section, its page's section, its notebook's cell, its test. A test
walks every rung of every ladder and checks that each of those is there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Where:
    """Where a rung is, each as ``path:what to find there`` (paths from the repository's
    root): ``kernel`` a section a ``--8<-- [start:...]`` marker opens (its name after the
    colon), ``page`` and ``notebook`` a text found in the file (a heading, a cell's line),
    ``test`` a test function (``path::name``). None where the rung has no such place (a
    numpy rung has no kernel)."""
    kernel: str | None = None
    page: str | None = None
    notebook: str | None = None
    test: str | None = None


@dataclass(frozen=True)
class Rung:
    """One rung: its place in the ladder, its name, one line for tables, what it runs."""
    index: int
    name: str
    what: str
    run: Any = field(default=None, kw_only=True)      # a callable, or the settings of one
    where: Where = field(default=Where(), kw_only=True)


class Ladder(tuple):
    """Rungs in order, numbered from 0, each addressed by name (``ladder["fused"]``) or by its
    place (``ladder[5]``, as the records keep it)."""

    def __new__(cls, name: str, rungs):
        self = super().__new__(cls, rungs)
        if [r.index for r in self] != list(range(len(self))):
            raise ValueError(f"ladder {name}: rungs must be numbered 0, 1, ... in order, "
                             f"got {[r.index for r in self]}")
        names = [r.name for r in self]
        if len(set(names)) != len(names):
            raise ValueError(f"ladder {name}: two rungs share a name ({names})")
        self.name = name
        self._by_name = {r.name: r for r in self}
        return self

    def __getitem__(self, key):
        if isinstance(key, str):
            try:
                return self._by_name[key]
            except KeyError:
                raise KeyError(f"ladder {self.name} has no rung {key!r}: its rungs are "
                               f"{', '.join(self._by_name)}") from None
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        """A rung's name, a place in the ladder (an int, as records keep it), or a rung."""
        if isinstance(key, str):
            return key in self._by_name
        if isinstance(key, int) and not isinstance(key, bool):
            return 0 <= key < len(self)
        return super().__contains__(key)

    def names(self) -> list[str]:
        return list(self._by_name)

    def number(self, name: str) -> int:
        """The place of the rung called ``name`` (what a record keeps)."""
        return self[name].index
