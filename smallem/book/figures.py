"""Figures, tables and prose values, made from measurement records only.

Each chapter's ``report(rec_dir)`` (see :mod:`smallem.book`) reads its records, saves
figures with :func:`save`, writes Markdown tables with :func:`write_table`, and returns the
values its page quotes (``{"ch1.f32_peak_all": "102 Gop/s", ...}``), formatted by
:func:`fmt`. Nothing here is typed by hand.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from smallem.plumbing.build import ROOT

def figures_dir() -> Path:
    path = Path(os.environ.get("SMALLEM_FIGURES", ROOT / "figures"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def write(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` whole or not at all (a temporary file, then one rename): a
    reader of figures/ (the site's build, a test beside this one, a notebook) never sees half
    a table, and a run stopped midway leaves the old file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def tables_dir() -> Path:
    path = figures_dir() / "tables"
    path.mkdir(parents=True, exist_ok=True)
    return path


DRAW = True  # False: a reading run for its values only (smallem.book.machines) saves no figure


def save(fig, name: str) -> list[Path]:
    """Save a matplotlib figure as ``figures/<name>.png`` and ``.svg``."""
    import matplotlib.pyplot as plt

    out = []
    if not DRAW:
        plt.close(fig)
        return out
    for ext in ("png", "svg"):
        path = figures_dir() / f"{name}.{ext}"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # whole or not at all, as write()
        fig.savefig(tmp, format=ext, dpi=130 if ext == "png" else None, bbox_inches="tight",
                    metadata={"Date": None} if ext == "svg" else None)
        os.replace(tmp, path)
        out.append(path)
    plt.close(fig)
    return out


# A verdict's statistics are a footnote of the sentence that quotes it: its text carries them
# between these marks (:func:`note`), the site's values hook (chapters/hooks/values.py) makes a
# footnote of them, and :func:`plain` puts them in brackets where there is no page's footnote
# (a table, a terminal, a notebook).
NOTE_OPEN, NOTE_CLOSE = "\u27e6", "\u27e7"
NOTE = re.compile(f"{NOTE_OPEN}(.*?){NOTE_CLOSE}", re.S)


def note(text: str) -> str:
    return f"{NOTE_OPEN}{text}{NOTE_CLOSE}"


def plain(text) -> str:
    """``text`` with its footnotes in brackets, for a table cell or a terminal."""
    return NOTE.sub(lambda m: f" [{m.group(1)}]", str(text))


def table_markdown(rows: list[list], header: list[str], note: str = "") -> str:
    """A Markdown table: first column left-aligned, the numbers right-aligned (a verdict's
    footnote in brackets in its cell)."""
    def cell(x):
        return plain(x).replace("|", "\\|")
    lines = ["| " + " | ".join(map(cell, header)) + " |",
             "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    if note:
        lines += ["", plain(note)]
    return "\n".join(lines) + "\n"


def write_table(name: str, rows: list[list], header: list[str], note: str = "") -> Path:
    """Write a Markdown table to ``figures/tables/<name>.md`` (included by the pages)."""
    return write(tables_dir() / f"{name}.md", table_markdown(rows, header, note))


def fmt(x: float, unit: str = "", digits: int = 3) -> str:
    """A number for prose and tables: ``digits`` significant digits, thin-space thousands,
    never scientific notation (999.7 is "1 000", not "1e+03": a reader compares them, and
    nothing may parse them back). NaN or None: "n/a" (a table cell; prose tests the value)."""
    if x is None or x != x:  # missing or NaN
        return "n/a"
    x = float(x)
    if x and abs(x) < 1000:
        # round to the digits first: 999.7 rounds to 1000 and then takes the thousands form
        x = float(f"{x:.{digits}g}")
    if abs(x) >= 1000:
        s = f"{x:,.0f}".replace(",", "\u202f")
    elif x and abs(x) < 10 ** -(digits + 1):
        s = f"{x:.{digits}g}"  # tiny values (a tolerance): scientific is what a reader expects
    else:
        # as many decimals as the significant digits need, trailing zeros dropped as %g does
        d = max(0, digits - 1 - math.floor(math.log10(abs(x)))) if x else 0
        s = f"{x:.{d}f}"
        if "." in s:
            s = s.rstrip("0").rstrip(".")
    return f"{s} {unit}".strip()


def num(x, unit: str = "", digits: int = 3) -> str:
    """The page's filter ``{{ v | num("Gop/s") }}``: :func:`fmt` for a typed value."""
    return fmt(x, unit, digits)


def pct(x, digits: int = 3) -> str:
    """A fraction as a percentage: 0.464 -> "46.4 %"."""
    return "n/a" if x is None or x != x else fmt(100 * float(x), "%", digits)


def times(x, digits: int = 3) -> str:
    """A ratio as a factor: 1.79 -> "1.79×"."""
    return "n/a" if x is None or x != x else fmt(float(x), "", digits) + "\u00d7"


def plural(n, word: str, many: str | None = None) -> str:
    """"1 pipe", "2 pipes" (``many`` where the plural is not word + s)."""
    one = n is not None and float(n) == 1
    return f"{fmt(n)} {word if one else (many or word + 's')}"


def words(items) -> str:
    """"a", "a and b", "a, b and c"."""
    items = [str(x) for x in items]
    return " and ".join(items) if len(items) < 3 else ", ".join(items[:-1]) + " and " + items[-1]


FILTERS = {"num": num, "pct": pct, "times": times, "plural": plural, "words": words}


def peer_notes(llama_cpp: dict | None, missing: dict) -> str:
    """What a table's note says of its peers: llama.cpp's configuration where it is not the
    default (a retry in the safe configuration, a build without repacking) and every peer or
    row not measured, with why."""
    ll = llama_cpp or {}
    out = ""
    if not llama_cpp and "llama.cpp" not in missing:
        out += " llama.cpp: not measured (not found: `make llama`)."
    if (ll.get("build") or {}).get("safe_build"):
        out += f" llama.cpp's build: {ll['build']['why']}."
    if ll.get("flags_why"):
        out += f" llama-bench: {ll['flags_why']}."
    return out + "".join(f" {k}: not measured ({v})." for k, v in missing.items())


def machine_line(rec: dict) -> str:
    m = rec["machine"]
    return (f"{m['cpu']}, {m['cores']} cores, ISA {m['isa']['isa']}"
            f"{' + ' + '/'.join(m['isa']['extensions']) if m['isa']['extensions'] else ''}; "
            f"measured {rec['date'][:10]}, commit {rec['commit']}"
            + (" (a quick run on tiny sizes, for tests: its numbers are not this machine's)"
               if rec.get("settings", {}).get("quick") else ""))
