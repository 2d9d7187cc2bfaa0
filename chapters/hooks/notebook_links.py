"""mkdocs hook: make ``.md`` links in notebook pages point at the built pages.

mkdocs rewrites ``[x](bibliography.md#smallem-fr)`` in the chapters into the page's
URL, but a notebook page is HTML made by mkdocs-jupyter, so its links stay as
written. A notebook shows tables that the chapters also include (a Markdown
output of ``table_markdown``), whose links are written from the chapters'
folder; so a link is looked up first beside the notebook, then from the top of
the docs folder. A ``.md`` link that names no page fails the build: mkdocs'
own link check does not see notebook pages.
"""

from __future__ import annotations

import posixpath
import re

from mkdocs.exceptions import PluginError

MD_LINK = re.compile(r'href="(?![a-z][a-z0-9+.-]*:|/|#)([^"#?]+\.md)(#[^"]*)?"', re.I)


def on_page_content(html, page, config, files):
    if not page.file.src_uri.endswith(".py"):
        return html
    here = posixpath.dirname(page.file.src_uri)
    bad = []

    def sub(m):
        path, fragment = m.group(1), m.group(2) or ""
        for candidate in (posixpath.join(here, path), path):
            target = files.get_file_from_path(posixpath.normpath(candidate))
            if target is not None:
                return f'href="{target.url_relative_to(page.file)}{fragment}"'
        bad.append(path)
        return m.group(0)

    html = MD_LINK.sub(sub, html)
    if bad:
        raise PluginError(f"notebook {page.file.src_uri} links to {', '.join(sorted(set(bad)))}, "
                          f"which is no page of the site")
    return html
