"""mkdocs hook: expand a glob in the nav (``- Notebooks: notebooks/*.py``).

Each chapter adds its notebook as ``notebooks/NN_name.py``; the nav lists them
all, in file-name order, without anyone editing mkdocs.yml. A notebook's title
is the first Markdown heading in it (mkdocs-jupyter renders it the same way).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError

HEADING = re.compile(r"^#\s+#\s+(.+)$", re.M)  # '# # Title' in a jupytext markdown cell


def _title(path: Path) -> str:
    m = HEADING.search(path.read_text(encoding="utf-8"))
    return m.group(1).strip() if m else path.stem


def _expand(items, docs_dir: Path):
    out = []
    for item in items:
        if isinstance(item, dict):
            (title, value), = item.items()
            if isinstance(value, str) and "*" in value:
                paths = sorted(docs_dir.glob(value))
                if not paths:
                    raise PluginError(f"nav entry {title!r}: no file matches {value!r} "
                                      f"under {docs_dir}")
                value = [{_title(p): p.relative_to(docs_dir).as_posix()} for p in paths]
            elif isinstance(value, list):
                value = _expand(value, docs_dir)
            out.append({title: value})
        else:
            out.append(item)
    return out


def on_config(config):
    if config.nav:
        config.nav = _expand(config.nav, Path(config.docs_dir))
    return config
