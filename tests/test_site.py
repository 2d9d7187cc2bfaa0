"""The book's site: it builds with --strict, its math is MathML, its images and links resolve.

The site is built once a session by the ``built_site`` fixture (conftest.py), from the
committed records after ``smallem figures``. The hooks in chapters/hooks/ are also tested
on tiny throwaway sites, so that each failure mode is seen to fail the build.
"""

from __future__ import annotations

import json
import re
import textwrap
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import site_build

HOOKS = site_build.ROOT / "chapters" / "hooks"
SKIP_TEXT_IN = {"code", "pre", "script", "style", "math", "svg", "textarea"}
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


class Page(HTMLParser):
    """What the tests need from one HTML file: prose text, images, links, ids, math."""

    def __init__(self, path: Path):
        super().__init__(convert_charrefs=True)
        self.path = path
        self.stack: list[str] = []
        self.text: list[str] = []
        self.imgs: list[str] = []
        self.links: list[str] = []       # <a href>
        self.resources: list[str] = []   # <link href>, <script src>
        self.ids: set[str] = set()
        self.math_open: list[list] = []  # [tag, depth, has <math>] for arithmatex elements
        self.math_bare: list[str] = []
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        if tag == "img" and a.get("src"):
            self.imgs.append(a["src"])
        elif tag == "a" and a.get("href"):
            self.links.append(a["href"])
        elif tag == "link" and a.get("href"):
            self.resources.append(a["href"])
        elif tag == "script" and a.get("src"):
            self.resources.append(a["src"])
        if tag == "math":
            for m in self.math_open:
                m[2] = True
        if tag in VOID:
            return
        self.stack.append(tag)
        if "arithmatex" in (a.get("class") or "").split():
            self.math_open.append([tag, len(self.stack), False])

    def handle_endtag(self, tag):
        if tag in VOID or tag not in self.stack:
            return
        while self.stack:
            if self.math_open and self.math_open[-1][1] == len(self.stack):
                t, _, ok = self.math_open.pop()
                if not ok:
                    self.math_bare.append(t)
            if self.stack.pop() == tag:
                break

    def handle_data(self, data):
        if not SKIP_TEXT_IN & set(self.stack):
            self.text.append(data)


def html_pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def markdown_pages(site: Path) -> list[Path]:
    """Pages made from chapters/*.md: everything but the rendered notebooks."""
    return [p for p in html_pages(site) if "notebooks" not in p.relative_to(site).parts]


def resolve(site: Path, page: Path, url: str) -> tuple[Path | None, str]:
    """The file in the site an internal URL points to (None for an external one), and its
    fragment."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or url.startswith(("mailto:", "data:", "javascript:")):
        return None, ""
    if not parts.path:
        return page, parts.fragment
    base = site if parts.path.startswith("/") else page.parent
    target = (base / unquote(parts.path).lstrip("/")).resolve()
    if target.is_dir() or parts.path.endswith("/"):
        target = target / "index.html"
    return target, parts.fragment


@pytest.fixture(scope="module")
def site(built_site):
    if built_site.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed (exit {built_site.returncode}):\n"
                    f"{built_site.problems()}", pytrace=False)
    return built_site.dir


def test_site_builds_strict(built_site):
    assert built_site.returncode == 0, built_site.problems()
    for name in built_site.stand_ins:
        # visible in the report: the build passed, but not with the real page
        pytest.skip(f"built with a stand-in page for {name}, which does not exist yet")


def test_every_nav_page_is_built(site):
    names = {p.relative_to(site).as_posix() for p in html_pages(site)}
    for entry in site_build.nav_entries():
        if "*" in entry:
            folder = Path(entry).parent.as_posix()
            assert any(n.startswith(folder + "/") for n in names), f"no page built for {entry}"
        else:
            stem = entry.rsplit(".", 1)[0]
            page = "index.html" if stem == "index" else f"{stem}/index.html"
            assert page in names, f"nav entry {entry} has no page {page}"


def test_math_is_rendered(site):
    pages = markdown_pages(site)
    assert pages
    for path in pages:
        page = Page(path)
        text = "".join(page.text)
        for marker in ("$", "\\(", "\\[", "\\begin{"):
            i = text.find(marker)
            assert i < 0, (f"{path.relative_to(site)}: unrendered math {marker!r} near "
                           f"{text[max(0, i - 60):i + 60]!r}")
        assert not page.math_bare, f"{path.relative_to(site)}: arithmatex element without <math>"


def test_images_exist(site):
    checked = 0
    for path in html_pages(site):
        for src in Page(path).imgs:
            if src.startswith("data:"):
                continue
            target, _ = resolve(site, path, src)
            assert target is not None, f"{path.relative_to(site)}: image from another host {src}"
            assert target.is_file(), f"{path.relative_to(site)}: image {src} is not in the site"
            checked += 1
    print(f"{checked} images checked")


def test_internal_links_resolve(site):
    pages = {p: Page(p) for p in html_pages(site)}
    bad = []
    for path, page in pages.items():
        for url in page.links + page.resources:
            target, fragment = resolve(site, path, url)
            if target is None:
                continue
            where = f"{path.relative_to(site)} -> {url}"
            if not target.exists():
                bad.append(f"{where}: no such file")
            elif fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else Page(target).ids
                if fragment not in ids:
                    bad.append(f"{where}: no id {fragment!r} in the target page")
    assert not bad, "broken internal links:\n" + "\n".join(bad[:30])


# ------------------------------------------------------------ the hooks, on tiny sites

def tiny_site(tmp_path: Path, pages: dict[str, str], values: dict | None = None,
              hooks=("values", "mathml", "notebook_links", "offline"),
              extra: str = "") -> site_build.Site:
    """Build a one-theme, no-plugin site with the book's hooks; return the result."""
    docs = tmp_path / "docs"
    for name, text in pages.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(textwrap.dedent(text))
    if values is not None:
        (docs / "figures" / "tables").mkdir(parents=True)
        (docs / "figures" / "tables" / "values.json").write_text(json.dumps(values))
    config = tmp_path / "mkdocs.yml"
    config.write_text(textwrap.dedent(f"""\
        site_name: tiny
        docs_dir: docs
        exclude_docs: figures/
        theme: {{name: material, font: false}}
        markdown_extensions:
          - pymdownx.arithmatex: {{generic: true}}
        hooks: {json.dumps([str(HOOKS / f'{h}.py') for h in hooks])}
        """) + textwrap.dedent(extra))
    return site_build.build(tmp_path / "site", config=config)


def test_values_are_substituted(tmp_path):
    r = tiny_site(tmp_path, {"index.md": "# T\n\nPeak: {{ ch1.peak }}, twice {{ch1.peak}}.\n"},
                  values={"ch1.peak": "123 Gop/s"})
    assert r.returncode == 0, r.problems()
    html = (r.dir / "index.html").read_text()
    assert "Peak: 123 Gop/s, twice 123 Gop/s." in html


def test_unknown_value_key_fails_the_build(tmp_path):
    r = tiny_site(tmp_path, {"index.md": "# T\n\nok\n",
                             "chapter.md": "# C\n\nPeak {{ ch1.peak }}, clock {{ ch9.nope }}.\n"},
                  values={"ch1.peak": "123 Gop/s"})
    assert r.returncode != 0, "a page with an unknown {{ key }} built without error"
    assert "chapter.md" in r.log and "ch9.nope" in r.log, r.log[-2000:]
    assert "ch1.peak }}" not in r.problems(), "a known key was reported as unknown"


def test_value_key_without_values_file_fails(tmp_path):
    r = tiny_site(tmp_path, {"index.md": "# T\n\n{{ ch1.peak }}\n"})
    assert r.returncode != 0
    assert "ch1.peak" in r.log and "smallem figures" in r.log, r.log[-2000:]


def test_math_becomes_mathml(tmp_path):
    r = tiny_site(tmp_path, {"index.md": r"""
        # T

        Inline $a_{ij} < 2^{10}$ and display:

        $$
        C_{ij} = \sum_{k=0}^{K-1} A_{ik} B_{kj}
        $$
        """})
    assert r.returncode == 0, r.problems()
    page = Page(r.dir / "index.html")
    html = (r.dir / "index.html").read_text()
    assert html.count("<math") == 2 and 'display="block"' in html
    assert not page.math_bare
    assert "\\(" not in "".join(page.text) and "$" not in "".join(page.text)


def test_math_in_a_heading_is_mathml_in_the_table_of_contents(tmp_path):
    r = tiny_site(tmp_path, {"index.md": "# T\n\n## Blocks of $n < 1024$ rows\n\ntext\n\n"
                                         "## Another\n\ntext\n"})
    assert r.returncode == 0, r.problems()
    html = (r.dir / "index.html").read_text()
    assert "\\(" not in "".join(Page(r.dir / "index.html").text)
    assert html.count("<mi>n</mi><mo>&#x0003C;</mo><mn>1024</mn>") >= 2  # heading and contents


def test_bad_math_fails_the_build(tmp_path):
    r = tiny_site(tmp_path, {"index.md": "# T\n\n$\\frac{1}{$ and more\n\n$$\n\\frac{1}{\n$$\n"})
    assert r.returncode != 0, "a formula latex2mathml cannot parse built without error"
    assert "index.md" in r.log, r.log[-2000:]


def test_external_script_fails_the_build(tmp_path):
    r = tiny_site(tmp_path, {"index.md": '# T\n\n<script src="https://cdn.example.org/x.js">'
                                         '</script>\n\n[a link is fine](https://example.org/)\n'})
    assert r.returncode != 0, "a page loading a script from another host built without error"
    assert "https://cdn.example.org/x.js" in r.log and "index.md" in r.log
    assert "https://example.org/" not in r.problems().replace("cdn.example.org", "")


NOTEBOOK_PLUGIN = """
    plugins:
      - mkdocs-jupyter: {include: ["notebooks/*.py"], execute: false}
    """


def test_notebook_links_to_pages_are_rewritten(tmp_path):
    r = tiny_site(tmp_path, {
        "index.md": "# Home\n\n<span id=\"entry\"></span>x\n",
        "notebooks/01_x.py": "# %% [markdown]\n# # N\n# See [home](index.md#entry) and "
                             "[itself](01_x.py).\n\n# %%\nx = 1\n"}, extra=NOTEBOOK_PLUGIN)
    assert r.returncode == 0, r.problems()
    html = (r.dir / "notebooks" / "01_x" / "index.html").read_text()
    assert 'href="../../#entry"' in html and 'href="./"' in html


def test_notebook_link_to_no_page_fails_the_build(tmp_path):
    r = tiny_site(tmp_path, {
        "index.md": "# Home\n",
        "notebooks/01_x.py": "# %% [markdown]\n# # N\n# See [gone](nothere.md).\n"},
        extra=NOTEBOOK_PLUGIN)
    assert r.returncode != 0, "a notebook linking to a missing page built without error"
    assert "nothere.md" in r.log and "01_x.py" in r.log, r.log[-2000:]


def test_site_publishes_the_records_it_was_rendered_from(tmp_path):
    """`smallem figures` names the records it read (figures/tables/records.json); the records
    hook publishes those as figures/records/, not the docs folder's own: a book rendered from a
    captured machine's records links to that machine's raw records, and to the GPU's."""
    from smallem import book

    captured = site_build.ROOT / "tests" / "machines" / "intel-xeon-gnr-2c" / "records"
    read = book.records_read(captured)
    assert read["ch1.machine"] == (captured / "ch1.machine.json").resolve()
    assert read["ch1.gpu"].parent == (site_build.ROOT / "figures" / "records").resolve()
    docs = tmp_path / "docs"
    (docs / "figures" / "records").mkdir(parents=True)
    (docs / "figures" / "tables").mkdir(parents=True)
    (docs / "figures" / "records" / "ch1.machine.json").write_text('{"other": "machine"}')
    (docs / "figures" / "records" / "stale.json").write_text("{}")
    (docs / "figures" / "tables" / "records.json").write_text(json.dumps(
        {"records": {k: str(v) for k, v in read.items()}}))
    (docs / "index.md").write_text("# T\n\n[the record](figures/records/ch1.machine.json)\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(textwrap.dedent(f"""\
        site_name: tiny
        docs_dir: docs
        exclude_docs: /figures/tables/
        theme: {{name: material, font: false}}
        hooks: {json.dumps([str(HOOKS / 'records.py')])}
        """))
    r = site_build.build(tmp_path / "site", config=config)
    assert r.returncode == 0, r.problems()
    published = r.dir / "figures" / "records"
    assert sorted(p.stem for p in published.glob("*.json")) == sorted(read)
    assert (published / "ch1.machine.json").read_bytes() == read["ch1.machine"].read_bytes()
    assert not (r.dir / "figures" / "tables" / "records.json").exists()


def test_style_page_keeps_a_snippet_marker_line(tmp_path):
    """STYLE.md shows the section marker the chapters use; pymdownx.snippets drops such lines
    from an included file, so the snippet_pages hook includes it with the marker escaped."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("snippet_pages", HOOKS / "snippet_pages.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    (tmp_path / "STYLE.md").write_text("a\n(`/* --8<-- [start:x] */ ... /* --8<-- [end:x] */`) b\n")
    text = hook.include('# S\n--8<-- "STYLE.md"\n', tmp_path)
    assert ";--8<-- [start:x]" in text and "/* --8<-- [end:x] */" in text
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text('# S\n\n--8<-- "STYLE.md"\n')
    config = tmp_path / "mkdocs.yml"
    config.write_text(textwrap.dedent(f"""\
        site_name: tiny
        docs_dir: docs
        theme: {{name: material, font: false}}
        markdown_extensions:
          - pymdownx.snippets: {{base_path: ["{tmp_path}"], check_paths: true}}
        hooks: {json.dumps([str(HOOKS / 'snippet_pages.py')])}
        """))
    r = site_build.build(tmp_path / "site", config=config)
    assert r.returncode == 0, r.problems()
    html = (r.dir / "index.html").read_text()
    assert "[start:x]" in html and "[end:x]" in html and ";--8" not in html
