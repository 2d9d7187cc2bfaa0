"""mkdocs hook: the site's ``figures/records/`` holds the records its pages were rendered from.

``chapters/figures`` is a link to the repository's ``figures/``, so mkdocs would publish the
committed records (``figures/records/*.json``) whatever ``SMALLEM_RECORDS`` the values were
made from: a book built from another machine's records would link to this one's. ``smallem
figures`` writes ``figures/tables/records.json``, the records it read (the machine's, and the
GPU's from the book's own folder where the machine's has none); this hook publishes exactly
those as ``figures/records/<name>.json``. Without that file (no ``smallem figures`` yet) the
folder is published as it is.
"""

from __future__ import annotations

import json
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

PREFIX = "figures/records/"


def manifest(config) -> dict | None:
    path = Path(config["docs_dir"]) / "figures" / "tables" / "records.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise PluginError(f"{path} is not valid JSON ({e}); rerun `smallem figures`") from e


def on_files(files: Files, config) -> Files:
    read = manifest(config)
    if read is None:
        return files
    for f in [f for f in files if f.src_uri.startswith(PREFIX) and f.src_uri.endswith(".json")]:
        files.remove(f)
    for name, path in sorted(read.get("records", {}).items()):
        if not Path(path).is_file():
            raise PluginError(f"record {name} ({path}) named in figures/tables/records.json is "
                              f"gone; rerun `smallem figures`")
        files.append(File.generated(config, f"{PREFIX}{name}.json", abs_src_path=path))
    return files
