"""The checks a reader makes, on every page rendered for every captured machine.

Each machine's records (the book's own, and every folder in ``tests/machines/``) render every
page (``tests/render_book.py``, as the site does); then the book's records again with each
record removed in turn, as a machine that lacks it would. No page may print a placeholder
inside a sentence, "not measured" inside a paragraph of several sentences, or a module path
in a paragraph (``tests/prose.py`` says what each check reads); no page's source may type a
hardware count into its prose.
"""

from __future__ import annotations

import pytest

import captured
import prose
import render_book
from smallem.book import records

MACHINES = ["book", *captured.NAMES]
_RENDERED: dict = {}


def rendered(name: str, tmp_path_factory, without: str | None = None) -> dict[str, str]:
    key = (name, without)
    if key not in _RENDERED:
        rec_dir = records.records_dir() if name == "book" else captured.MACHINES / name / "records"
        out = tmp_path_factory.mktemp(f"render-{name}-{without or 'all'}")
        if without:
            rec_dir = render_book.without(rec_dir, without, out)
        _RENDERED[key] = render_book.render(rec_dir, out / "pages")
    return _RENDERED[key]


def _check(pages: dict[str, str]) -> list[str]:
    return [f"{page}: {d}" for page, text in pages.items() for d in prose.defects(text)]


@pytest.mark.parametrize("name", MACHINES)
def test_every_page_reads_clean_for_each_machine(name, tmp_path_factory):
    bad = _check(rendered(name, tmp_path_factory))
    assert not bad, f"{len(bad)} defects on {name}'s rendering:\n" + "\n".join(bad)


BOOK_RECORDS = sorted(p.stem for p in records.records_dir().glob("*.json"))


@pytest.mark.parametrize("missing", BOOK_RECORDS)
def test_a_missing_record_drops_its_section_in_one_sentence(missing, tmp_path_factory):
    bad = _check(rendered("book", tmp_path_factory, without=missing))
    assert not bad, f"{len(bad)} defects without {missing}:\n" + "\n".join(bad)


def test_no_page_types_a_hardware_count():
    bad = [f"{page.name}: {d}" for page in sorted(render_book.PAGES.glob("*.md"))
           for d in prose.typed_hardware(page.read_text())]
    assert not bad, "\n".join(bad)


def test_the_checks_catch_what_they_name():
    """Each check fails on the defect it names (a check that cannot fail is no check)."""
    cases = {
        "The peak is 1e+03 tokens/s.\n": "placeholder",
        "It reached n/a (no record ch2.bf16) here.\n": "placeholder",
        "This core starts 2 512-bit FMA(s) a cycle.\n": "placeholder",
        "The L3 is fast. The GPU was not measured on a GPU yet, so this says nothing.\n":
            "not measured",
        "The kernel lives in `kernels_c/gemm.c` and `smallem.product.gemm`.\n": "path",
        "The step ran at 121 % of its DRAM bound, as expected.\n": "above its bound",
        "Ours ran at 1 844 tokens/s against 1 000 tokens/s, 1844.00 times.\n": "not the ratio",
    }
    for text, what in cases.items():
        assert any(what in d for d in prose.defects(text)), text
    clean = ("This machine has no bf16 record, so this section is left out.\n\n"
             "| rung | rate |\n|---|---:|\n| 1 | not measured |\n\n"
             "The product reaches 1 000 Gop/s, almost none of which is wasted.\n\n"
             "It ran at 121 % of its DRAM bound: the assumption that the data comes from DRAM "
             "failed, as 24 MiB fit the L3.\n\n"
             "Ours ran at 1 844 tokens/s against 1 000 tokens/s, 1.84×.\n")
    assert prose.defects(clean) == []
    assert prose.typed_hardware("the core could start two 16-lane FMAs every cycle")
    assert prose.typed_hardware("at 2 FMAs a cycle that is fewer loads")
    assert prose.typed_hardware("(it is inclusive)")
    assert not prose.typed_hardware("it starts {{ ch1.fma_pipes }} FMAs a cycle")
