"""`smallem train`: its options and its body, over the library's Trainer (and, with
``--distributed``, :mod:`smallem.training.distributed`'s trainer on every MPI rank)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from smallem.training import checkpoint, data
from ..checks import printable
from ..book.options import count, number
from smallem.training.distributed import Distributed, DistributedTrainer
from smallem.training.model import CONFIGS
from smallem.training.train import DEFAULTS, TrainSettings, Trainer, estimate_steps, list_configs, train


KINDS = {"count": count(1), "positive": number(0, low_open=True), "int": int, None: float}


def add_settings_arguments(p):
    """One option for each field of TrainSettings that the command line offers, made from the
    field: its name (``--batch-size``), its help, its kind of values, its default."""
    for f in dataclasses.fields(TrainSettings):
        m = f.metadata
        if not m["cli"]:
            continue
        flag = "--" + f.name.replace("_", "-")
        if m["kind"] == "flag":
            p.add_argument(flag, action="store_true", help=m["help"])
            continue
        kw = {"help": m["help"], "default": m.get("unset", f.default)}
        if "metavar" in m:
            kw["metavar"] = m["metavar"]
        if m["kind"] == "choice":
            kw["choices"] = list(m["choices"])
        else:
            kw["type"] = KINDS[m["kind"]]
        p.add_argument(flag, **kw)


def settings_from(args, **changes) -> TrainSettings:
    """The TrainSettings the command line gave (an option left out: the field's default)."""
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainSettings)
             if f.metadata["cli"] and getattr(args, f.name, None) is not None}
    return TrainSettings(**{**given, **changes})


def add_train_arguments(p):
    p.add_argument("--config", default="s", choices=list(CONFIGS), metavar="NAME",
                   help=f"model size: {', '.join(CONFIGS)} (default s)")
    p.add_argument("--corpus", help="UTF-8 text file or folder (default: the Python stdlib)")
    add_settings_arguments(p)
    p.add_argument("--minutes", type=number(0, low_open=True),
                   help="time budget; without --steps, sets the step count from the first steps")
    p.add_argument("--eval-every", type=count(1), default=100)
    p.add_argument("--log", help="JSON-lines log (default runs/<config>/log.jsonl)")
    p.add_argument("--checkpoint", help="checkpoint folder (default runs/<config>)")
    p.add_argument("--checkpoint-every", type=count(0), default=200,
                   help="steps between checkpoints (0: only at the end)")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    p.add_argument("--sample-bytes", type=count(0), default=300)
    p.add_argument("--list", action="store_true", help="list the configs and exit")
    p.add_argument("--distributed", action="store_true",
                   help="data-parallel over MPI: run under mpiexec -n N (needs the mpi extra)")
    p.add_argument("--average-every", type=count(1), default=1, metavar="K",
                   help="with --distributed: 1 all-reduces the gradients every step; K > 1 "
                        "is local SGD, weights and moments averaged every K steps")


def cmd_train(args) -> int:
    if args.list:
        print(list_configs())
        return 0
    if args.distributed:
        return cmd_train_distributed(args)
    if args.average_every != 1:
        raise ValueError("--average-every needs --distributed")
    folder = Path(args.checkpoint or Path("runs") / args.config)
    log_path = args.log or folder / "log.jsonl"
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    ts = settings_from(args)
    if args.resume and checkpoint.exists(folder):
        t = Trainer.resume(folder, corpus=args.corpus, **ts.how())
        print(f"resuming {folder} at step {t.step} of {t.total_steps}")
    else:
        if args.resume:
            print(f"no checkpoint in {folder}: starting from scratch")
        corpus = data.load_corpus(args.corpus)
        if args.steps is None and args.minutes:
            ts = ts.replace(steps=estimate_steps(args.config, corpus, args.minutes, ts))
        t = Trainer(args.config, corpus=corpus, settings=ts)
        print(f"config {t.config.name}: {t.config.n_params() / 1e6:.2f} M parameters, "
              f"{t.total_steps} steps of {t.accumulate * t.B} x {t.T} tokens; corpus {t.corpus.name} "
              f"({t.corpus.train.size / 1e6:.1f} MB train, sha256 {t.corpus.sha256[:12]})")
    h = train(t, log_path=log_path, eval_every=args.eval_every, checkpoint_dir=folder,
              checkpoint_every=args.checkpoint_every,
              minutes=args.minutes if args.steps is not None else None,
              sample_bytes=args.sample_bytes)
    if h["val_bpb"]:
        print(f"validation: {h['val_bpb'][-1]:.3f} bits per byte at step {t.step}")
    if "sample" in h:
        print("sample:\n" + (printable(h["sample"]) if sys.stdout.isatty() else h["sample"]))
    print(f"log: {log_path}; checkpoint: {folder}")
    return 0


def cmd_train_distributed(args) -> int:
    """`smallem train --distributed`, on every rank. An error on one rank ends them all."""
    d = Distributed()
    try:
        return _run(args, d)
    except (ValueError, TypeError, LookupError, OSError, RuntimeError) as e:
        if os.environ.get("SMALLEM_DEBUG") == "1" or d.size == 1:
            raise
        d.fail(str(e), 2)


def _run(args, d: Distributed) -> int:
    if args.minutes and args.steps:
        raise ValueError("under --distributed --minutes sets the step count (every rank must "
                         "run the same steps): give --minutes or --steps, not both")
    if getattr(args, "accumulate", 1) != 1:
        raise ValueError("--accumulate: not with --distributed (add ranks or raise the batch)")
    lead = d.rank == 0
    if not lead:  # rank 0 speaks for the job (errors still reach stderr from every rank)
        sys.stdout = open(os.devnull, "w")
    threads = d.threads_and_pin(args.threads)
    folder = Path(args.checkpoint or Path("runs") / args.config)
    log_path = (args.log or folder / "log.jsonl") if lead else None
    if log_path:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    common = dict(dist=d, average_every=args.average_every)
    ts = settings_from(args, threads=threads)
    if args.resume and checkpoint.exists(folder):
        t = DistributedTrainer.resume(folder, corpus=args.corpus, **ts.how(), **common)
        if lead:
            print(f"resuming {folder} at step {t.step} of {t.total_steps} on {d.size} ranks")
    else:
        if args.resume and lead:
            print(f"no checkpoint in {folder}: starting from scratch")
        corpus = data.load_corpus(args.corpus)
        if args.steps is None:  # every rank must run the same steps: rank 0's estimate for all
            est = None
            if lead and args.minutes:
                per = max(1, (args.batch_size or DEFAULTS.get(
                    args.config.removesuffix("-modern"), DEFAULTS["m"])["batch"]) // d.size)
                est = estimate_steps(args.config, corpus, args.minutes, ts, batch_size=per)
            ts = ts.replace(steps=d.comm.bcast(est, root=0) or ts.steps)
        t = DistributedTrainer(args.config, corpus=corpus, settings=ts, **common)
        if lead:
            print(f"config {t.config.name}: {t.total_steps} steps of {t.B} x {t.T} tokens on "
                  f"{d.size} ranks of {threads} thread(s), "
                  + ("gradients all-reduced every step" if t.average_every == 1 else
                     f"local SGD, averaged every {t.average_every} steps"))
    h = train(t, log_path=log_path, eval_every=args.eval_every, checkpoint_dir=folder,
              checkpoint_every=args.checkpoint_every, minutes=None,
              sample_bytes=args.sample_bytes if lead else 0,
              progress=lead and sys.stderr.isatty())
    if lead:
        s = d.stats()
        if h["val_bpb"]:
            print(f"validation: {h['val_bpb'][-1]:.3f} bits per byte at step {t.step}")
        print(f"communication: {s['seconds']:.2f} s in {s['calls']} collectives, "
              f"{s['bytes'] / 1e6:.1f} MB handed to all-reduces by each rank")
        print(f"log: {log_path}; checkpoint: {folder}")
    return 0
