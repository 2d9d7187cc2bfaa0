"""Appendix B, others' models: llama-family GGUF files (SmolLM2's and Qwen2.5's shapes, in
llama.cpp's quantisations) run by the library's C forward beside llama.cpp on the same file.

The engine is the library's :mod:`smallem.generating.gguf_file`, :mod:`smallem.generating.gguf_tokenizer`,
:mod:`smallem.generating.gguf_model` and the C forward, :mod:`smallem.generating.forward` (``smallem run MODEL.gguf``).
``files`` writes the files measured (random weights at real shapes), ``measuring`` runs the
benchmark into the record, ``reading`` turns it into the page's tables and values, and this
file holds what :mod:`smallem.book` asks of every chapter.
"""

from __future__ import annotations

from .measuring import RECORD, bench_others  # noqa: F401
from .reading import report  # noqa: F401  (what smallem.book asks of a chapter)
from .. import options

RECORDS = (RECORD,)
# the peers its records compare against: record -> {peer: (result name, params)}
PEER_ROWS = {RECORD: {"llama.cpp": ("llama_tg", {}), "llama.cpp's prompt": ("llama_pp", {})}}


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = options.bench_command("bench-others", bench_others,
                                 "appendix B: others' GGUF models beside llama.cpp, write the record",
                                 quick_help="tiny models, seconds (for tests)")
MEASURE = "bench-others"  # the command `make book` runs
