"""The checks a careful reader makes of a rendered page, as functions the tests call.

:func:`defects` reads one page as the site renders it (Markdown, values put in, sentences
chosen: ``tests/render_book.py``) and lists what no page may print:

- a placeholder inside a sentence: "n/a", "nan", "None", a plural stub "FMA(s)", scientific
  notation ("1e+03"), a template token, "no record ...";
- "not measured" inside a paragraph of more than one sentence: a missing or older record
  makes its section say so once, in one sentence at its head, and leaves its body out
  (a table's cell may say "not measured": a column where a peer did not run);
- a module or folder path in a paragraph (``smallem.cpu.machine``, ``kernels_c/gemm.c``):
  plumbing belongs in code blocks, captions and the notebooks;
- a measured rate above its bound, peak or roof by more than the noise (5 %) in a paragraph
  that does not say which assumption of the bound failed (or that it is no bound);
- a factor that a sentence quotes beside exactly two quantities of one unit ("1 493 tokens/s
  against 1 732 tokens/s, 0.86×") which is neither's ratio to the other (3 %: rounding).

:func:`typed_hardware` reads a page's *source* (its template) for a hardware count typed
into prose ("two 16-lane FMAs every cycle", "(it is inclusive)"): such a fact comes from
chapter 1's measurement or from its one cited table, through a value.
"""

from __future__ import annotations

import re

FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})[^\n]*\n.*?^\1\2[ \t]*$", re.M | re.S)
RAW = re.compile(r"\{%\s*raw\s*%\}.*?\{%\s*endraw\s*%\}", re.S)

# never in a page's prose
PLACEHOLDER = re.compile(
    r"\b[nN]/[aA]\b|\b[nN]a[nN]\b|\bNone\b|\w\(s\)|\b\d(?:\.\d+)?e\+\d+\b|\{\{|\{%"
    r"|no record \S|\bnot measured at [0-9a-f]{7}\b")
NOT_MEASURED = re.compile(r"not measured|not recorded", re.I)
# a module path (smallem.x.y) or a file or folder of the repository, outside a link target
PATH = re.compile(r"\bsmallem\.[a-z_]+(?:\.[a-z_]+)*|\b(?:kernels_c|kernels_cuda|smallem|tests|"
                  r"figures|notebooks)/[\w./-]*")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
# "121 % of its DRAM bound", "at 1.6 times its bound": a bound that a measurement beats
ABOVE_BOUND = re.compile(r"\b(\d{3,}(?:\.\d+)?) ?% of (?:(?:its|the|this|that|a|chapter 1's)\s+)?"
                         r"(?:[\w\-]+\s+){0,3}(?:bound|peak|roof|ceiling|limit)\b", re.I)
EXPLAINED = re.compile(r"assumption|is not a bound|is no bound|not a ceiling|failed|does not hold"
                       r"|cannot be a bound|wrong bound", re.I)
NOISE = 1.05
# two quantities of one unit and the factor between them, within one sentence
NUMBER = r"(\d{1,3}(?:[\u202f ,]\d{3})+|\d+(?:\.\d+)?)"
QUANTITY = re.compile(NUMBER + r"\s(Gop/s|GB/s|tokens/s|ms|µs|GHz|MiB|KiB|GiB)(?![\w/])")
FACTOR = re.compile(r"(\d+(?:\.\d+)?)×|(\d+\.\d+) times\b")


def _number(text: str) -> float:
    return float(re.sub(r"[\u202f ,]", "", text))


def ratio_defects(paragraph: str) -> list[str]:
    """The factors of a paragraph's sentences that are not the ratio of the two quantities
    of one unit the sentence names (a sentence with other numbers is not judged)."""
    out = []
    for sentence in re.split(r"(?<=[.;])\s+", paragraph):
        qs = [(_number(m.group(1)), m.group(2)) for m in QUANTITY.finditer(sentence)]
        fs = FACTOR.findall(sentence)
        if len(fs) != 1 or len(qs) != 2 or qs[0][1] != qs[1][1] or not qs[0][0] or not qs[1][0]:
            continue
        z = _number(fs[0][0] or fs[0][1])
        a, b = qs[0][0], qs[1][0]
        if not any(abs(z / c - 1) < 0.03 for c in (a / b, b / a)):
            out.append(f"a factor {z} that is not the ratio of {a} and {b} {qs[0][1]}: "
                       f"{sentence[:200]}")
    return out


SENTENCE_END = re.compile(r"[.!?](?:\[\^\w+\])?(?:\s+|$)(?=[A-Z(\"*]|$)")


def blocks(markdown: str) -> list[tuple[str, str]]:
    """The page's blocks outside code fences as ``(kind, text)``: kind is "table" (a table
    row), "heading", "caption" (an image or a figure's line), "html", "snippet" or "prose"
    (a paragraph or a list item, its lines joined)."""
    text = FENCE.sub("\n", markdown)
    out: list[tuple[str, str]] = []
    para: list[str] = []

    def flush():
        if para:
            out.append(("prose", " ".join(s.strip() for s in para)))
            para.clear()

    for line in text.splitlines():
        s = line.strip()
        if not s:
            flush()
            continue
        if s.startswith("|"):
            flush()
            out.append(("table", s))
        elif s.startswith("#"):
            flush()
            out.append(("heading", s))
        elif s.startswith("![") or s.startswith("<"):
            flush()
            out.append(("caption" if s.startswith("![") else "html", s))
        elif s.startswith("--8<--"):
            flush()
            out.append(("snippet", s))
        elif re.match(r"([-*+]|\d+\.)\s", s) or s.startswith("[^") or s.startswith("!!!"):
            flush()  # a list item, a footnote or an admonition starts a block of its own
            para.append(s)
        else:
            para.append(s)
    flush()
    return out


def sentences(text: str) -> int:
    """How many sentences a paragraph holds (an abbreviation may miscount; the checks only
    ask whether it is one)."""
    body = re.sub(r"\b(e\.g|i\.e|cf|vs|etc|approx|Fig|No)\.", "_", text)
    body = re.sub(r"\d\.\d", "0", body)
    return max(1, len([m for m in SENTENCE_END.finditer(body.strip())]))


def defects(markdown: str) -> list[str]:
    """Every defect of :func:`blocks`' kinds the module's doc lists, as one line each."""
    found = []
    for kind, text in blocks(markdown):
        if kind in ("snippet", "html"):
            continue
        if kind in ("prose", "heading"):
            for m in PLACEHOLDER.finditer(text):
                found.append(f"placeholder {m.group(0)!r} in: {_around(text, m)}")
        elif kind == "table":
            for m in re.finditer(r"\bnan\b|\bNone\b|\w\(s\)|\b\d(?:\.\d+)?e\+\d+\b|\{\{", text):
                found.append(f"placeholder {m.group(0)!r} in a table row: {_around(text, m)}")
        if kind == "prose":
            m = NOT_MEASURED.search(text)
            if m and sentences(text) > 1:
                found.append("'not measured' inside a paragraph of several sentences (say it "
                             f"once, at the section's head): {_around(text, m)}")
            for m in ABOVE_BOUND.finditer(text):
                if float(m.group(1)) > 100 * NOISE and not EXPLAINED.search(text):
                    found.append("a rate above its bound with no word on which assumption "
                                 f"failed: {_around(text, m)}")
            found += ratio_defects(text)
            bare = LINK_TARGET.sub("]", text)
            for m in PATH.finditer(bare):
                found.append(f"a module or folder path in a paragraph: {_around(bare, m)}")
    return found


# "two 16-lane FMAs", "2 FMAs a cycle", "one 512-bit pipe", "(it is inclusive)", "4 loads per cycle"
COUNT = r"(?:\d+|one|two|three|four|a single)"
HARDWARE = re.compile(
    rf"\b{COUNT}\s+(?:\d+-lane\s+|\d+-bit\s+)?(?:FMAs?|FMA pipes?|pipes?|loads?|stores?)"
    rf"(?:\s+(?:every|a|per|each)\s+cycle)\b|"
    rf"\b{COUNT}\s+\d+-(?:lane|bit)\s+(?:FMAs?|pipes?)\b|"
    r"\bit is (?:inclusive|exclusive|non-inclusive)\b", re.I)


def typed_hardware(template: str) -> list[str]:
    """Hardware counts typed into a page's source, outside its code blocks and its Jinja
    expressions: each one line."""
    text = FENCE.sub("\n", RAW.sub("", template))
    text = re.sub(r"\{\{.*?\}\}", "X", text)
    return [f"typed hardware fact: {_around(text, m)}" for m in HARDWARE.finditer(text)]


def _around(text: str, m: re.Match, n: int = 70) -> str:
    return text[max(0, m.start() - n):m.end() + n].replace("\n", " ")
