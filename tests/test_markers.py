"""The sections the pages include from the source (``--8<-- [start:name]`` … ``[end:name]``).

Every section a page, a notebook or a ladder names exists; no file names a section twice; each
opens and closes once, in that order. In the one forward (``kernels_c/forward.c`` and
``kernels_c/forward/``), every section is included by a page or named by a ladder: a marker
nothing reads is a section a reader is promised and never shown.
"""

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARK = re.compile(r"--8<-- \[(start|end):([\w-]+)\]")
REF = re.compile(r'"((?:kernels_c|kernels_cuda|smallem|notebooks)/[\w/.-]+\.\w+):([\w-]+)"')
SOURCES = (".c", ".h", ".cu", ".cuh", ".py")
FORWARD = ("kernels_c/forward.c", "kernels_c/forward/")


def _files():
    for base in ("kernels_c", "kernels_cuda", "smallem", "notebooks"):
        for p in sorted((ROOT / base).rglob("*")):
            if p.suffix in SOURCES and "__pycache__" not in p.parts and p.is_file():
                yield p


def markers() -> dict:
    """{(file, name): [(start or end, line)]} over the sources."""
    out = {}
    for p in _files():
        rel = str(p.relative_to(ROOT))
        for i, line in enumerate(p.read_text(errors="replace").splitlines()):
            for m in MARK.finditer(line):
                if "{" in line or "`" in line:  # a pattern or an example, not a marker
                    continue
                out.setdefault((rel, m.group(2)), []).append((m.group(1), i))
    return out


def references() -> set:
    """(file, name) of every section a page or notebook includes, or a ladder names, or
    chapter 2's rung diffs read (the GEMM ladder's rungs in gemm.c)."""
    from smallem.product.gemm import LADDER

    texts = [p.read_text() for p in sorted((ROOT / "chapters").glob("*.md"))]
    texts += [p.read_text() for p in sorted((ROOT / "notebooks").glob("*.py"))]
    texts += [p.read_text() for p in sorted((ROOT / "smallem").rglob("*.py"))]
    found = {(m.group(1), m.group(2)) for t in texts for m in REF.finditer(t)}
    return found | {("kernels_c/gemm.c", r.name) for r in LADDER}


def test_each_section_opens_and_closes_once():
    bad = {k: v for k, v in markers().items()
           if [kind for kind, _ in v] != ["start", "end"] or v[0][1] >= v[1][1]}
    assert not bad, f"sections opened or closed more than once, or out of order: {bad}"


def test_every_section_named_exists():
    missing = references() - set(markers())
    assert not missing, f"named but not in the source: {sorted(missing)}"


def test_every_section_of_the_forward_is_read():
    unread = sorted(k for k in set(markers()) - references() if k[0].startswith(FORWARD))
    assert not unread, f"sections of the forward that no page includes: {unread}"


@pytest.mark.parametrize("defect", ["twice", "unclosed", "unread"])
def test_the_checks_catch_what_they_name(defect, monkeypatch, tmp_path):
    """Each check fails on its defect, in a copy of the sources with one file broken."""
    src = (ROOT / "kernels_c/forward.c").read_text()
    broken = {"twice": src.replace("[start:mlp]", "[start:forward]", 1),
              "unclosed": src.replace("/* --8<-- [end:mlp] */", "", 1),
              "unread": src + "\n/* --8<-- [start:nobody] */\n/* --8<-- [end:nobody] */\n"}[defect]
    copy = tmp_path / "repo"
    for base in ("kernels_c", "kernels_cuda", "chapters", "notebooks", "smallem"):
        shutil.copytree(ROOT / base, copy / base, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "kernels_c/forward.c").write_text(broken)
    monkeypatch.setitem(globals(), "ROOT", copy)
    check = (test_every_section_of_the_forward_is_read if defect == "unread"
             else test_each_section_opens_and_closes_once)
    with pytest.raises(AssertionError):
        check()
