"""mkdocs hook: the site loads nothing from another host.

The book must read the same offline and leak nothing about its reader, so every
font, script, style and image comes from site/ itself. Two things would break
that and are removed here: the MathJax loader and the Mermaid loader that
mkdocs-jupyter puts into every notebook page (both from cdnjs; our notebooks
have neither TeX nor Mermaid, and the chapters' math is MathML made at build
time by hooks/mathml.py). Anything else that would be fetched from elsewhere
fails the build, naming the page and the URL. Links (<a href>) are fine: a
reader chooses to follow them.
"""

from __future__ import annotations

import re

from mkdocs.exceptions import PluginError

# mkdocs-jupyter's blocks, as its template (nbconvert's base/mathjax.html.j2) writes them
MATHJAX = re.compile(r"<!-- Load mathjax -->.*?<!-- End of mathjax configuration -->", re.S)
MERMAID = re.compile(r'<script type="module">(?:(?!</script>).)*?import\("https://cdnjs\.'
                     r'cloudflare\.com/ajax/libs/mermaid/.*?</script>', re.S)

EXTERNAL = r"""(?:https?:)?//(?!127\.0\.0\.1[:/]|localhost[:/])[^\s"'<>)]+"""
FETCHED = [
    # elements whose src/href the browser fetches by itself
    re.compile(r"<(?:script|img|iframe|source|video|audio|embed|track|input)\b[^>]*?\s"
               r"(?:src|srcset|poster)\s*=\s*[\"']?(" + EXTERNAL + ")", re.I),
    re.compile(r"<link\b[^>]*?\shref\s*=\s*[\"']?(" + EXTERNAL + ")", re.I),
    re.compile(r"<object\b[^>]*?\sdata\s*=\s*[\"']?(" + EXTERNAL + ")", re.I),
    # CSS and ES-module imports
    re.compile(r"url\(\s*[\"']?(" + EXTERNAL + ")", re.I),
    re.compile(r"@import\s+[\"'](" + EXTERNAL + ")", re.I),
    re.compile(r"\bimport\s*\(?\s*[\"'](" + EXTERNAL + ")", re.I),
]


def on_post_page(output, page, config):
    output = MERMAID.sub("", MATHJAX.sub("", output))
    found = sorted({m.group(1) for pattern in FETCHED for m in pattern.finditer(output)})
    if found:
        raise PluginError(f"page {page.file.src_path} would load from another host: "
                          + ", ".join(found) + " (vendor it into the site, or drop it)")
    return output
