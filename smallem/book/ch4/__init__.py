"""Chapter 4, generating without the GPU: the decode ladder timed on one model beside
llama.cpp and PyTorch, the L3 study, the fork-joins per token, and int8's quality.

The decoders, the sampler, the generator, int8 and GGUF are the library's
:mod:`smallem.generating.decode`, :mod:`smallem.generating.quant` and :mod:`smallem.generating.gguf_export`. This package is
the chapter's room in the book: ``measuring`` runs the benchmark into the records (with
``llama`` and ``torch_peer``, the peers), ``reading`` turns them into the page's tables,
figures and values, and this file holds what :mod:`smallem.book` asks of every chapter.
"""

from __future__ import annotations

from .measuring import RECORD, RECORD_QUALITY, bench_generate  # noqa: F401
from .reading import report  # noqa: F401  (what smallem.book asks of a chapter)
from .. import options

RECORDS = (RECORD, RECORD_QUALITY)
# the peers its records compare against: record -> {peer: (result name, params)}
PEER_ROWS = {RECORD: {"llama.cpp": ("llama_tg", {}), "PyTorch": ("decode", {"case": "torch-f32"})},
             RECORD_QUALITY: {"llama.cpp (llama-simple)": ("llama_greedy", {})}}


def add_llama_arguments(p):
    p.add_argument("--force", action="store_true", help="build again even if built")
    p.add_argument("--where", action="store_true", help="print the build's folder, build nothing")


def cmd_llama(args) -> int:
    from . import llama

    if args.where:
        print(llama.build_dir() / "bin")
        return 0
    out = llama.build(force=args.force, log=lambda m: print(m, flush=True))
    return 0 if out["ok"] else 3


# what `smallem` offers for this chapter: name -> (function, add_arguments, help)
COMMANDS = {**options.bench_command("bench-generate", bench_generate,
                                    "chapter 4: time generation, write records"),
            "llama": (cmd_llama, add_llama_arguments,
                      "build the peer llama.cpp once for this machine (into the kernel cache) "
                      "and check it on quantised files")}
MEASURE = "bench-generate"  # the command `make book` runs
