"""mkdocs hook: a page that is one Markdown file of the repository's root (``style.md`` is
``--8<-- "STYLE.md"``) gets that file's text whole.

pymdownx.snippets drops every line of an included file that looks like a section marker
(``--8<-- [start:name]``), even inside backticks: STYLE.md, which shows the marker the chapters
use, lost that line and the page read cut. This hook puts the file's text in the page itself
before the snippets extension runs, with the first marker of each such line escaped (``;``,
the extension's own escape, which it removes), so the page shows the line as written.
"""

from __future__ import annotations

import re
from pathlib import Path

WHOLE = re.compile(r'^--8<-- "([A-Za-z][\w-]*\.md)"[ \t]*$', re.M)
MARKER = re.compile(r"-{1,}8<-{1,}[ \t]+\[[ \t]*(?:start|end)[ \t]*:[ \t]*[a-z][-_0-9a-z]*[ \t]*\]")


def escape_markers(text: str) -> str:
    """Each line holding a section marker, its first marker escaped for pymdownx.snippets."""
    out = []
    for line in text.split("\n"):
        m = MARKER.search(line)
        out.append(line[:m.start()] + ";" + line[m.start():] if m else line)
    return "\n".join(out)


def include(markdown: str, root: Path) -> str:
    def whole(m):
        path = root / m.group(1)
        return escape_markers(path.read_text(encoding="utf-8")) if path.is_file() else m.group(0)

    return WHOLE.sub(whole, markdown)


def on_page_markdown(markdown, page, config, files):
    return include(markdown, Path(config["config_file_path"]).parent)
