"""Build the book's site for the tests (test_site.py, test_browser.py).

``build(site_dir)`` runs ``mkdocs build --strict`` on the repository's mkdocs.yml
in a subprocess and returns its exit status and log. The docs folder is the
real ``chapters/`` unless a page the nav names does not exist yet (a chapter
still being written): then it is a temporary folder of links to ``chapters/``,
with a stand-in page for each missing one (named in the log and in a visible
skip, so it is never mistaken for the real page). Figures, tables and values are
always the repository's ``figures/`` (the pages include tables from it by path).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "mkdocs.yml"
DOCS = ROOT / "chapters"

# mkdocs' CLI has no --docs-dir; load_config takes it as an override. Logging as the CLI does,
# so the captured log reads like `mkdocs build` output; strict mode still counts the warnings.
_SCRIPT = """
import logging, sys
from mkdocs.commands.build import build
from mkdocs.config import load_config
logging.basicConfig(level=logging.INFO, format="%(levelname)-7s -  %(message)s")
overrides = {"site_dir": sys.argv[2], "strict": True}
if sys.argv[3]:
    overrides["docs_dir"] = sys.argv[3]
build(load_config(sys.argv[1], **overrides))
"""


@dataclass
class Site:
    dir: Path
    returncode: int
    log: str
    stand_ins: list = field(default_factory=list)

    def problems(self) -> str:
        lines = [l for l in self.log.splitlines() if l.startswith(("WARNING", "ERROR"))
                 or "Error" in l or "Aborted" in l]
        return "\n".join(lines[-40:]) or self.log[-4000:]


def nav_entries(config: Path = CONFIG) -> list[str]:
    """The file (or glob) of every page in the nav, as written in mkdocs.yml."""
    from mkdocs.config import load_config

    out = []

    def walk(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                walk(value)
            elif isinstance(value, str) and "://" not in value:
                out.append(value)

    walk(load_config(str(config)).nav or [])
    return out


def _stand_in(path: Path, entry: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".py":
        path.write_text("# %% [markdown]\n# # Stand-in notebook\n# No notebook exists yet.\n\n"
                        "# %%\nprint('stand-in')\n")
    else:
        path.write_text(f"# Stand-in for {entry}\n\nThe page `chapters/{entry}` does not exist "
                        f"yet; the tests build the site with this page in its place.\n")


def docs_dir_for_tests(tmp: Path) -> tuple[Path | None, list[str]]:
    """``(docs dir, stand-ins)``: None if the real ``chapters/`` can be built as it is."""
    missing = [e for e in nav_entries()
               if not (list(DOCS.glob(e)) if "*" in e else (DOCS / e).exists())]
    if not missing:
        return None, []
    docs = tmp / "docs"
    docs.mkdir(parents=True)
    for entry in DOCS.iterdir():
        target = entry.resolve()
        (docs / entry.name).symlink_to(target, target_is_directory=target.is_dir())
    for entry in missing:
        if "*" in entry:  # an empty notebooks/: a real folder holding one stand-in
            folder = docs / Path(entry).parent
            if folder.is_symlink():
                folder.unlink()
            _stand_in(folder / "00_stand_in.py", entry)
        else:
            _stand_in(docs / entry, entry)
    return docs, missing


def build(site_dir: Path, config: Path = CONFIG, docs_dir: Path | None = None,
          stand_ins: list | None = None, env: dict | None = None, timeout: float = 900) -> Site:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", **(env or {}))
    r = subprocess.run([sys.executable, "-c", _SCRIPT, str(config), str(site_dir),
                        str(docs_dir or "")], cwd=config.parent, env=env,
                       capture_output=True, text=True, timeout=timeout)
    log = r.stdout + r.stderr
    if stand_ins:
        log = f"NOTE: built with stand-in pages for {', '.join(stand_ins)}\n" + log
    return Site(Path(site_dir), r.returncode, log, list(stand_ins or []))
