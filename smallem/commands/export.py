"""`smallem export --gguf FILE`: a model written in llama.cpp's format, f32 or Q8_0
(:func:`smallem.generating.gguf_export.export`)."""

from __future__ import annotations

from smallem.generating.decode import load_model
from smallem.generating.gguf_export import DTYPES, export
from smallem.training.model import GPT


def add_export_arguments(p):
    p.add_argument("--checkpoint", help="a folder `smallem train` wrote")
    p.add_argument("--config", help="no checkpoint: random weights of this config")
    p.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    p.add_argument("--gguf", required=True, help="the GGUF file to write (must not exist)")
    p.add_argument("--dtype", default="f32", choices=DTYPES)
    p.add_argument("--overwrite", action="store_true", help="replace an existing file")


def cmd_export(args) -> int:
    if bool(args.checkpoint) == bool(args.config):
        raise ValueError("give --checkpoint DIR or --config NAME (random weights), one of them")
    model = load_model(args.checkpoint) if args.checkpoint else GPT(args.config, seed=args.seed)
    path = export(model, args.gguf, args.dtype, args.overwrite)  # errors: cli.main's one line
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {args.dtype}, "
          f"{'llama' if model.config.block == 'modern' else 'gpt2'} architecture)")
    return 0
