"""`smallem generate`: text from a checkpoint (or random weights), streamed byte by byte
through the top of chapter 4's ladder (:class:`smallem.generating.decode.Generator`)."""

from __future__ import annotations

import sys
import time

from ..checks import printable
from ..book.options import count, number
from smallem.generating.decode import DTYPES, Generator, load_model
from smallem.training.model import GPT

def add_generate_arguments(p):
    p.add_argument("--checkpoint", help="a folder `smallem train` wrote")
    p.add_argument("--config", help="no checkpoint: random weights of this config")
    p.add_argument("--prompt", default="", help="the text to continue (UTF-8)")
    p.add_argument("--tokens", type=count(0), default=200, help="bytes to generate (default 200)")
    p.add_argument("--temperature", type=number(0), default=0.8, help="0: greedy (default 0.8)")
    p.add_argument("--top-k", type=count(0), default=0, help="keep the k most likely (0: all)")
    p.add_argument("--top-p", type=number(0, 1, low_open=True), default=1.0,
                   help="nucleus: keep mass p, in (0, 1] (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="int8", choices=DTYPES)
    p.add_argument("--threads", type=count(1), help="threads (default: every usable core)")
    p.add_argument("--prefill", default="c", choices=("c", "gemm", "int8", "auto"),
                   help="the prompt's path: c (default), the same call as each token, so a "
                        "seed gives the same text; gemm, the f32 GEMM; int8, the integer GEMM "
                        "(int8 weights only); auto, whichever is timed faster at start (the "
                        "text can then change with the clock)")
    p.add_argument("--raw", action="store_true",
                   help="write the bytes as they are even to a terminal (a pipe or file always "
                        "gets them raw; a terminal gets control bytes and bad UTF-8 escaped)")


class Terminal:
    """Bytes to a terminal as text: UTF-8 decoded as it comes (a character split across
    bytes waits for its end), invalid bytes and control characters escaped."""

    def __init__(self, stream):
        import codecs

        self.stream = stream
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def write(self, piece: bytes):
        self.stream.write(printable(self.decoder.decode(piece)))

    def flush(self):
        self.stream.flush()


def cmd_generate(args) -> int:
    """Bad options and files raise; ``smallem``'s main reports them in one line."""
    if bool(args.checkpoint) == bool(args.config):
        raise ValueError("give --checkpoint DIR or --config NAME (random weights), one of them")
    model = load_model(args.checkpoint) if args.checkpoint else GPT(args.config, seed=args.seed)
    gen = Generator(model, dtype=args.dtype, threads=args.threads, prefill=args.prefill)
    pieces = gen.generate(args.prompt, args.tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    out = sys.stdout.buffer if args.raw or not sys.stdout.isatty() else Terminal(sys.stdout)
    start, n = time.perf_counter(), 0
    for piece in pieces:
        out.write(piece)
        out.flush()
        n += 1
    secs = time.perf_counter() - start
    print(f"\n[{n} bytes in {secs:.2f} s, {n / secs if secs else 0:.0f} tokens/s, "
          f"{args.dtype}, {gen.decoder.threads} threads]", file=sys.stderr)
    return 0
