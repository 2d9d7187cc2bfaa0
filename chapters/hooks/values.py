"""mkdocs hook: the page written for the machine that built it.

``smallem figures`` computes, from the records, every value a page quotes and every fact a
page's sentences depend on, and writes them to ``figures/tables/values.json`` (keys such as
``ch1.f32_peak``, a number the page formats with a filter, ``{{ ch1.f32_peak | num("Gop/s") }}``,
or ``ch2.has_rows_blocks``, a true/false fact). This hook renders
each Markdown page as a Jinja template over those keys: ``{{ ch1.f32_peak }}`` puts a measured
number into the prose, and ``{% if ch2.has_rows_blocks %} ... {% else %} ... {% endif %}``
keeps the one sentence that holds on this machine, so each branch is written once, in the
page, and a reader sees only what holds where the book was built.

A name that is not in the file, a template error or a template token left in the output fails
the build, naming the page: a number is never left blank or stale. Fenced code blocks are
code, never templates (C's ``{{0}}`` stays as it is).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2
from mkdocs.exceptions import PluginError

# a key is a dotted name (chapter.value), a filter may follow: C initialisers such as {{0}}
# and a template's own loop or macro variables ({{ x | num }}) are not keys
KEY = re.compile(r"\{\{\s*([A-Za-z]\w*\.[\w.\-]+)\s*(?:\|[^{}]*)?\}\}")
FENCE = re.compile(r"^([ \t]*)(```|~~~)[^\n]*\n.*?^\1\2[ \t]*$", re.M | re.S)
TOKEN = re.compile(r"\{\{\s*[A-Za-z]|\{%")


def values_file(config) -> Path:
    # the docs folder's figures/ (a link to the repository's figures/): the same folder
    # the pages take their images from, so values and figures always come from one run
    return Path(config["docs_dir"]) / "figures" / "tables" / "values.json"


def load_values(config) -> dict:
    path = values_file(config)
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PluginError(f"{path} is not valid JSON ({e}); rerun `smallem figures`") from e


def tree(values: dict) -> dict:
    """``{"ch1.peak": v}`` as ``{"ch1": {"peak": v}}``, so that a template writes
    ``ch1.peak``."""
    out: dict = {}
    for key, v in values.items():
        *path, leaf = key.split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise PluginError(f"value key {key!r}: {part!r} is a value and a group")
        node[leaf] = v
    return out


def _protect_code(markdown: str) -> str:
    return FENCE.sub(lambda m: "{% raw %}" + m.group(0) + "{% endraw %}", markdown)


ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False,
                         keep_trailing_newline=True)
# the page formats typed values itself: {{ ch1.peak | num("Gop/s") }}, {{ x | pct }},
# {{ r | times }}, {{ n | plural("pipe") }} (one formatter, smallem.book.figures)
try:
    from smallem.book.figures import FILTERS
except ImportError:  # the site built without the package: the pages then fail on a filter
    FILTERS = {}
ENV.filters.update(FILTERS)


def unrecorded(markdown: str, values: dict) -> list[str]:
    """The chapters whose values the page names but lacks because this machine has no record
    of them (``book.recorded.<chapter>`` false, written by ``smallem figures``): [] where
    every name the page lacks is simply unknown (a typo, an error)."""
    recorded = {k.split(".", 2)[2]: v for k, v in values.items()
                if k.startswith("book.recorded.")}
    missing = {k.split(".")[0] for k in KEY.findall(markdown) if k not in values}
    gone = sorted(c for c in missing if recorded.get(c) is False)
    # a group that is no chapter (ref.*: the reference series' figures a chapter quotes)
    # goes with the chapter that quotes it
    if gone and all(c in gone or c not in recorded for c in missing):
        return gone
    return []


def left_out(markdown: str, values: dict, chapters: list[str]) -> str:
    """The page of a chapter this machine has no record of: its title, and one sentence that
    says so and names the record and the command that makes it."""
    title = next((l for l in markdown.splitlines() if l.startswith("# ")), "# (untitled)")
    names = ", ".join(f"`{values.get(f'book.record.{c}', c)}`" for c in chapters)
    how = ", ".join(f"`smallem {values[f'book.command.{c}']}`" for c in chapters
                    if values.get(f"book.command.{c}"))
    return (f"{title}\n\nThe records this book was built from hold no {names}, so this page is "
            f"left out{f' (run {how} to measure it)' if how else ''}.\n")


_TEMPLATES: dict = {}


def _template(text: str):
    """The page's compiled template, once a text (a build, or a test rendering every page
    for many machines, renders each page many times)."""
    if text not in _TEMPLATES:
        _TEMPLATES[text] = ENV.from_string(text)
    return _TEMPLATES[text]


def render(markdown: str, values: dict, page: str = "page") -> str:
    """The page for these values: its sentences chosen, its numbers put in. PluginError
    (naming the page) for an unknown name, a template error, or a token left behind. A page
    whose chapter has no record here is its title and one sentence (:func:`left_out`)."""
    gone = unrecorded(markdown, values)
    if gone:
        return left_out(markdown, values, gone)
    unknown = sorted({k for k in KEY.findall(markdown) if k not in values})
    if unknown:
        raise PluginError(f"page {page}: unknown value key(s) "
                          + ", ".join("{{ " + k + " }}" for k in unknown))
    try:
        out = _template(_protect_code(markdown)).render(tree(values))
    except jinja2.TemplateError as e:
        line = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise PluginError(f"page {page}{line}: {type(e).__name__}: {e}") from e
    left = [m for m in TOKEN.finditer(FENCE.sub("", out))]
    if left:
        raise PluginError(f"page {page}: a template token is left in the output: "
                          f"{out[left[0].start():left[0].start() + 60]!r}")
    return footnotes(out)


# a verdict's statistics travel with it between these marks (smallem.book.figures.note)
NOTE = re.compile("\u27e6(.*?)\u27e7", re.S)


def footnotes(markdown: str) -> str:
    """Each marked note (a verdict's rounds and test) as a Markdown footnote of the sentence
    that quotes it: the sentence keeps the word and the ratio, the statistics go below."""
    notes: dict[str, int] = {}

    def ref(m):
        n = notes.setdefault(m.group(1).strip(), len(notes) + 1)
        return f"[^v{n}]"

    body = NOTE.sub(ref, markdown)
    if not notes:
        return markdown
    return body.rstrip("\n") + "\n\n" + "".join(
        f"[^v{n}]: {text}\n" for text, n in notes.items())


def on_page_markdown(markdown, page, config, files):
    if not page.file.src_path.endswith(".md"):
        return markdown  # notebooks are rendered by mkdocs-jupyter; their code is code
    if not (KEY.search(markdown) or "{%" in markdown):
        return markdown
    values = load_values(config)
    try:
        return render(markdown, values, page.file.src_path)
    except PluginError as e:
        if KEY.search(markdown) and not values:
            path = values_file(config)
            where = f"{path}" if path.is_file() else f"{path}, which does not exist"
            raise PluginError(f"{e} (not in {where}; run `smallem figures`, or check the "
                              f"chapter's report() in smallem/book)") from e
        raise PluginError(f"{e} (run `smallem figures`, or check the chapter's report() "
                          f"in smallem/book)") from e
