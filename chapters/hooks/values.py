"""mkdocs hook: put measured values into the prose.

A chapter writes ``{{ ch1.f32_peak }}`` where a measured number belongs;
``smallem figures`` computes every such value from the records and writes them
to ``figures/tables/values.json``. This hook substitutes them in each Markdown
page before it is rendered. A key that is not in the file fails the build,
naming the page and the key: a number is never left blank or stale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mkdocs.exceptions import PluginError

# a key starts with a letter: C initialisers such as {{0}} in code are left alone
KEY = re.compile(r"\{\{\s*([A-Za-z][\w.\-]*)\s*\}\}")


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


def on_page_markdown(markdown, page, config, files):
    if not page.file.src_path.endswith(".md"):
        return markdown  # notebooks are rendered by mkdocs-jupyter; their code is code
    keys = KEY.findall(markdown)
    if not keys:
        return markdown
    values = load_values(config)
    unknown = sorted({k for k in keys if k not in values})
    if unknown:
        path = values_file(config)
        where = f"{path}" if path.is_file() else f"{path}, which does not exist"
        raise PluginError(
            f"page {page.file.src_path}: unknown value key(s) "
            + ", ".join("{{ " + k + " }}" for k in unknown)
            + f" (not in {where}; run `smallem figures`, or check the chapter's report() in smallem/book)")
    return KEY.sub(lambda m: str(values[m.group(1)]), markdown)
