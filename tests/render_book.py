"""Every page of the book as Markdown, rendered for one machine's records, without mkdocs.

    .venv/bin/python tests/render_book.py tests/machines/intel-xeon-gnr-2c/records /tmp/gnr
    .venv/bin/python tests/render_book.py figures/records /tmp/book --without ch2.bf16

writes ``/tmp/gnr/<page>.md`` for every page in ``chapters/``: the values of that machine's
records put in, the sentences chosen, the tables included in place (a code snippet stays a
``--8<--`` line, unless ``--code`` includes it), the footnotes as the site makes them. The tables and figures go to
``<out>/figures`` (never the repository's ``figures/``). ``--without NAME`` renders as if the
record NAME were missing (a copy of the folder without it). ``tests/test_prose.py`` reads the
same renderings; a reader (or a helper) can read these files as the site's pages.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "chapters"
SNIPPET = re.compile(r'^--8<-- "(figures/tables/[^"]+\.md)"\s*$', re.M)
CODE = re.compile(r'^--8<-- "([^":]+)(?::([\w-]+))?"\s*$', re.M)


def with_code(md: str) -> str:
    """``md`` with every other ``--8<--`` line replaced by what the site includes there: a
    file's section between its ``[start:name]`` and ``[end:name]`` markers, or a whole file
    (the bibliography, the style guide), for a reader of these files."""
    def code(m):
        path = ROOT / m.group(1)
        if not path.is_file():
            return m.group(0)
        lines = path.read_text().splitlines()
        if m.group(2) is None:
            return "\n".join(lines)
        inside, out = False, []
        for line in lines:
            if f"[end:{m.group(2)}]" in line:
                inside = False
            elif f"[start:{m.group(2)}]" in line:
                inside = True
            elif inside and "--8<--" not in line:
                out.append(line)
        return "\n".join(out) if out else m.group(0)
    return CODE.sub(code, md)


@functools.lru_cache(maxsize=1)
def values_hook():
    spec = importlib.util.spec_from_file_location("values_hook", PAGES / "hooks" / "values.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report(rec_dir: Path, out: Path) -> dict:
    """Every chapter's values for ``rec_dir``, its tables written under ``out/figures``."""
    from smallem import book
    from smallem.book import figures

    env = {k: os.environ.get(k) for k in ("SMALLEM_RECORDS", "SMALLEM_FIGURES")}
    os.environ["SMALLEM_RECORDS"] = str(rec_dir)
    os.environ["SMALLEM_FIGURES"] = str(out / "figures")
    old = figures.DRAW
    figures.DRAW = False
    try:
        # every chapter, appendix C's too: its columns read every captured folder (the same on
        # every rendering), its home-page table this machine's records
        values = book.report_all(rec_dir)
    finally:
        figures.DRAW = old
        for k, v in env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return values


def render(rec_dir: Path, out: Path) -> dict[str, str]:
    """``{page name: rendered Markdown}`` for every page, as the site renders it for these
    records."""
    hook = values_hook()
    out.mkdir(parents=True, exist_ok=True)
    values = report(Path(rec_dir), out)
    pages = {}
    for page in sorted(PAGES.glob("*.md")):
        # a page whose chapter has no record here is its title and one sentence (the hook's)
        md = hook.render(page.read_text(), values, page.name)

        def table(m):
            path = out / m.group(1)
            return path.read_text().rstrip("\n") if path.is_file() else m.group(0)

        pages[page.name] = SNIPPET.sub(table, md)
    return pages


def without(rec_dir: Path, name: str, tmp: Path) -> Path:
    """A copy of ``rec_dir`` without the record ``name``."""
    folder = tmp / f"without-{name}"
    shutil.copytree(rec_dir, folder, dirs_exist_ok=True)
    (folder / f"{name}.json").unlink(missing_ok=True)
    return folder


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--without", metavar="NAME", help="render as if this record were missing")
    ap.add_argument("--code", action="store_true",
                    help="include the code and the files the site includes, for a reader")
    a = ap.parse_args(argv)
    rec_dir = a.records.resolve()
    if a.without:
        rec_dir = without(rec_dir, a.without, Path(tempfile.mkdtemp()))
    pages = render(rec_dir, a.out)
    for name, text in pages.items():
        (a.out / name).write_text(with_code(text) if a.code else text)
    sys.path.insert(0, str(Path(__file__).parent))
    from prose import defects

    found = [f"{name}: {d}" for name, text in pages.items() for d in defects(text)]
    print(f"{len(pages)} pages in {a.out}; {len(found)} defects the prose checks find")
    for line in found:
        print("  " + line)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
