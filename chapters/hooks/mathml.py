"""mkdocs hook: turn the pages' TeX into MathML when the site is built.

pymdownx.arithmatex (``generic: true``) wraps ``$...$`` in
``<span class="arithmatex">\\(...\\)</span>`` and ``$$...$$`` in
``<div class="arithmatex">\\[...\\]</div>``. Here latex2mathml converts each to a
``<math>`` element, which browsers draw natively: no script, nothing fetched, and
the page reads the same with JavaScript off. TeX that latex2mathml cannot parse
fails the build, naming the page and the formula.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert
from mkdocs.exceptions import PluginError

INLINE = re.compile(r'(<span class="arithmatex">)\\\((.*?)\\\)(</span>)', re.S)
BLOCK = re.compile(r'(<div class="arithmatex">)\\\[(.*?)\\\](</div>)', re.S)


def _converter(page, display):
    def sub(m):
        tex = html.unescape(m.group(2)).strip()
        try:
            math = convert(tex, display=display)
        except Exception as e:  # latex2mathml raises assorted types on bad input
            raise PluginError(f"page {page.file.src_path}: cannot convert the formula "
                              f"{tex!r} to MathML: {type(e).__name__}: {e}") from e
        return m.group(1) + math + m.group(3)
    return sub


def on_page_content(html_text, page, config, files):
    html_text = BLOCK.sub(_converter(page, "block"), html_text)
    return INLINE.sub(_converter(page, "inline"), html_text)
