"""What each of chapter 2's rungs changes, as the page shows it: a diff of two marked sections
of kernels_c/gemm.c, made from the real source whenever the figures are drawn."""

from __future__ import annotations

from pathlib import Path

from smallem.plumbing import build
from smallem.product.gemm import LADDER
from .. import figures

# each rung's code sits between markers named for it in kernels_c/gemm.c (its C name)
RUNG_SECTIONS = [rung.name for rung in LADDER]


def snippet(name: str, path: Path | None = None) -> list[str]:
    """The lines between ``--8<-- [start:name]`` and ``[end:name]`` in kernels_c/gemm.c."""
    path = path or build.KERNELS_DIR / "gemm.c"
    lines = path.read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if f"[start:{name}]" in l)
    end = next(i for i, l in enumerate(lines) if f"[end:{name}]" in l)
    return lines[start + 1:end]


def write_rung_diffs() -> list[Path]:
    """figures/tables/ch2_diff_<a>_<b>.md: what each rung changes, from the real source."""
    import difflib

    out = []
    for old, new in zip(RUNG_SECTIONS, RUNG_SECTIONS[1:]):
        diff = difflib.unified_diff(snippet(old), snippet(new), f"gemm.c: {old}", f"gemm.c: {new}",
                                    n=2, lineterm="")
        path = figures.tables_dir() / f"ch2_diff_{old}_{new}.md"
        figures.write(path, "```diff\n" + "\n".join(diff) + "\n```\n")
        out.append(path)
    return out
