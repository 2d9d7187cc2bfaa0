"""`smallem run MODEL.gguf`: other people's models (a llama-family GGUF file), streamed
through the C forward (:mod:`smallem.generating.forward`); ``--info`` describes the file; ``--chat`` keeps a
conversation at the terminal through the file's chat template."""

from __future__ import annotations

import sys
import time

from ..book.options import count, number
from smallem.generating.sampling import Sampler
from smallem.generating.forward import DEFAULT_CONTEXT
from smallem.generating.gguf_file import ARCHS
from .generate import Terminal


def add_run_arguments(p):
    p.add_argument("model", help="a GGUF file (" + ", ".join(sorted(ARCHS)) + ")")
    p.add_argument("--info", action="store_true",
                   help="describe the file (architecture, sizes, types, tokenizer) and stop")
    p.add_argument("--prompt", default="", help="the text to continue (UTF-8)")
    p.add_argument("--chat", action="store_true",
                   help="a conversation through the file's chat template (--prompt: the first turn)")
    p.add_argument("--tokens", type=count(0), default=128, help="tokens to generate (default 128)")
    p.add_argument("--context", type=count(1),
                   help="positions the cache holds (default: the file's context, at most "
                        f"{DEFAULT_CONTEXT})")
    p.add_argument("--threads", type=count(1), help="threads (default: every core)")
    p.add_argument("--temperature", type=number(0), default=0.8, help="0: greedy (default 0.8)")
    p.add_argument("--top-k", type=count(0), default=40, help="keep the k most likely (0: all)")
    p.add_argument("--top-p", type=number(0, 1, low_open=True), default=0.95,
                   help="nucleus: keep mass p, in (0, 1] (default 0.95)")
    p.add_argument("--seed", type=int, default=0)


def info_lines(mf, tk) -> list[str]:
    h = mf.hyper
    mix = ", ".join(f"{t} {n} tensors {b / 2**20:.1f} MiB"
                    for t, (n, b) in sorted(mf.type_mix().items(), key=lambda kv: -kv[1][1]))
    return [
        f"file:         {mf.path}",
        f"architecture: {h.arch.name} ({h.arch.described()})",
        f"sizes:        d {h.d}, {h.n_layer} blocks, {h.n_head} heads of {h.head_dim} "
        f"({h.n_kv_head} key/value heads), MLP {h.hidden}, vocabulary {h.vocab}, context "
        f"{h.context}, output {'tied to the embedding' if h.tied else 'its own'}",
        f"RoPE:         base {h.rope_base:g} over {h.rope_dim} features"
        + (", llama 3 frequency factors" if "rope_freqs.weight" in mf.tensors else "")
        + (f", angles times {h.rope_scale:g}" if h.rope_scale != 1 else ""),
        *([f"window:       {sum(h.swa_layers)} of {h.n_layer} blocks attend to the last "
           f"{h.window} positions (RoPE base {h.rope_base_swa:g})"] if h.window else []),
        f"types:        {mix}",
        f"tokenizer:    {tk.model}" + (f" (pre-tokenizer {tk.pre})" if tk.model == "gpt2" else "")
        + f", BOS {tk.bos} {'added' if tk.add_bos else 'not added'}, EOS {tk.eos}",
        f"a token reads {mf.weight_bytes_per_token / 2**20:.1f} MiB of weights",
    ]


def cmd_run(args) -> int:
    from smallem.generating import gguf_file, gguf_model

    from smallem.generating.gguf_tokenizer import from_model_file

    mf = gguf_file.open_model(args.model)
    if args.info:
        print("\n".join(info_lines(mf, from_model_file(mf))))
        return 0
    run = gguf_model.Runner(mf, threads=args.threads, context=args.context)
    sampler = Sampler(args.temperature, args.top_k, args.top_p, args.seed, mf.hyper.vocab)
    out = sys.stdout.buffer if not sys.stdout.isatty() else Terminal(sys.stdout)
    if not args.chat:
        ids = run.tk.encode(args.prompt)
        return _stream(run, ids, args.tokens, sampler, out, False)
    messages = []
    turn = args.prompt
    while True:
        if not turn:
            try:
                turn = input("> ")
            except EOFError:
                return 0
        messages.append({"role": "user", "content": turn})
        text = gguf_model.chat_prompt(mf, run.tk, messages)
        ids = run.tk.encode(text, add_special=False, parse_special=True)
        pieces = []
        _stream(run, ids, args.tokens, sampler, out, False, pieces)
        messages.append({"role": "assistant", "content": b"".join(pieces).decode("utf-8", "replace")})
        print(file=sys.stderr)
        turn = ""


def _stream(run, ids, tokens, sampler, out, keep, pieces=None) -> int:
    start, n = time.perf_counter(), 0
    for piece in run.generate(ids, tokens, sampler, keep_cache=keep):
        out.write(piece)
        out.flush()
        if pieces is not None:
            pieces.append(piece)
        n += 1
    secs = time.perf_counter() - start
    print(f"\n[{len(ids)} prompt tokens, {n} generated in {secs:.2f} s]", file=sys.stderr)
    return 0
