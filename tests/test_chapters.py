"""The chapter sources: code included from the real files must sit inside a code fence
(a bare snippet renders as a paragraph of run-together code and headings from `#if`)."""

import re
from pathlib import Path

import pytest

CHAPTERS = sorted((Path(__file__).parent.parent / "chapters").glob("*.md"))
CODE_SNIPPET = re.compile(r'^--8<-- "[^"]+\.(py|c|h|cu):[^"]+"\s*$')


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.name)
def test_code_snippets_are_fenced(page):
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
        if CODE_SNIPPET.match(line):
            assert i > 0 and lines[i - 1].lstrip().startswith("```"), (
                f"{page.name}:{i + 1}: {line.strip()} is not inside a ``` code fence")
