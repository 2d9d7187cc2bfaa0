"""mkdocs hook: turn the pages' TeX into MathML when the site is built.

pymdownx.arithmatex (``generic: true``) wraps ``$...$`` in
``<span class="arithmatex">\\(...\\)</span>`` and ``$$...$$`` in
``<div class="arithmatex">\\[...\\]</div>``. Here latex2mathml converts each to a
``<math>`` element, which browsers draw natively: no script, nothing fetched, and
the page reads the same with JavaScript off. TeX that latex2mathml cannot parse
fails the build, naming the page and the formula. A heading's math is converted in
the table of contents too, where it would otherwise show as TeX.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert
from mkdocs.exceptions import PluginError

INLINE = re.compile(r'(<span class="arithmatex">)\\\((.*?)\\\)(</span>)', re.S)
BLOCK = re.compile(r'(<div class="arithmatex">)\\\[(.*?)\\\](</div>)', re.S)
# In the table of contents a heading's math arrives as plain text, delimiters and all.
TOC_MATH = re.compile(r"\\\((.*?)\\\)", re.S)


def to_mathml(tex: str, display: str, page) -> str:
    try:
        return convert(tex.strip(), display=display)
    except Exception as e:  # latex2mathml raises assorted types on bad input
        raise PluginError(f"page {page.file.src_path}: cannot convert the formula "
                          f"{tex!r} to MathML: {type(e).__name__}: {e}") from e


def _toc_titles(items, page):
    for item in items:
        item.title = TOC_MATH.sub(
            lambda m: to_mathml(html.unescape(m.group(1)), "inline", page), item.title)
        _toc_titles(item.children, page)


def on_page_content(html_text, page, config, files):
    for pattern, display in ((BLOCK, "block"), (INLINE, "inline")):
        html_text = pattern.sub(
            lambda m: m.group(1) + to_mathml(html.unescape(m.group(2)), display, page) + m.group(3),
            html_text)
    _toc_titles(page.toc, page)
    return html_text
