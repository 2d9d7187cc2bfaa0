"""The appendix's measurements, one record ``mpi.train``:

- throughput: the same training step (config ``CONFIG``, global batch ``BATCH``) as one
  process with every core's thread, and as ``mpiexec -n <cores>`` ranks of one thread each,
  gradients all-reduced every step; the two take turns, ``ROUNDS`` times;
- what the ranks send: the seconds each step spends in collectives and the bytes each rank
  hands to them;
- the loss against tokens for local SGD averaged every K of ``AVERAGE_EVERY`` steps.

Each run is a child (``python -m smallem.book.mpi.rank``) under MPICH's ``mpiexec``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from smallem.cpu import machine_info
from smallem.training.distributed import mpiexec
from smallem.plumbing.build import ROOT
from smallem.cpu.timing import Timing, quick_mode
from .. import records

RECORD = "mpi.train"
CONFIG = "s"
BATCH = 16            # the global batch, split over the ranks
ROUNDS = 7            # rounds of the throughput pair, each case once: a two-sided signed-rank test
                      # at 5 % calls 7 of 7 (p = 1/64); 5 rounds could never call either side
STEPS = 6             # timed steps a round, after WARMUP
WARMUP = 2
AVERAGE_EVERY = (1, 10, 100)  # the loss curves' schemes (1: gradients all-reduced)
CURVE_STEPS = 200     # steps of each loss curve
CURVE_EVALS = 10      # validation points along it
LINKS_GBIT = (10, 25, 100)    # the model's links
MACHINES = (2, 4, 8, 16)      # ... and machine counts
QUICK = dict(config={"name": "tiny", "d_model": 32, "n_layer": 2, "n_head": 2, "context": 32},
             batch=4, rounds=2, steps=3, warmup=1, curve_steps=20, curve_evals=2)


def _run(exe: str, ranks: int, spec: dict) -> dict:
    env = dict(os.environ, SMALLEM_MPI_TIMEOUT="120")
    r = subprocess.run([exe, "-n", str(ranks), sys.executable, "-m", "smallem.book.mpi.rank",
                        json.dumps(spec)], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=3600)
    if r.returncode:
        raise RuntimeError(f"mpiexec -n {ranks} failed ({r.returncode}): {r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def bench_distributed(quick: bool | None = None, progress: bool = True) -> records.Record:
    quick = quick_mode() if quick is None else quick
    q = QUICK if quick else {}
    cores = machine_info.usable_cores()
    config = q.get("config", CONFIG)
    batch, rounds = q.get("batch", BATCH), q.get("rounds", ROUNDS)
    steps, warmup = q.get("steps", STEPS), q.get("warmup", WARMUP)
    curve_steps, evals = q.get("curve_steps", CURVE_STEPS), q.get("curve_evals", CURVE_EVALS)
    rec = records.Record(RECORD, settings={
        "config": config, "batch": batch, "rounds": rounds, "steps": steps, "warmup": warmup,
        "cores": cores, "average_every": list(AVERAGE_EVERY), "curve_steps": curve_steps,
        "curve_evals": evals, "links_gbit": list(LINKS_GBIT), "machines": list(MACHINES),
        "quick": quick})
    exe = mpiexec()
    if exe is None:
        rec.data["settings"]["missing"] = "no mpi4py or mpiexec (pip install -e '.[mpi]')"
        rec.warn("no MPI here: the appendix's measurements were not made")
        return rec
    ranks = cores if cores > 1 and batch % cores == 0 else 2  # one rank per core, or two
    rec.data["settings"]["ranks"] = ranks
    base = {"config": config, "batch": batch, "steps": warmup + steps, "warmup": warmup}
    cases = {"one process": (1, dict(base, threads=cores, average_every=1)),
             f"{ranks} ranks": (ranks, dict(base, threads=1, average_every=1))}
    per_step = {k: Timing() for k in cases}
    comm = Timing()
    got = {}
    for i in range(rounds):
        for name, (n, spec) in cases.items():
            got[name] = _run(exe, n, spec)
            per_step[name].seconds.append(Timing(got[name]["step_seconds"]).median)
            if n > 1:
                comm.seconds.append(Timing(got[name]["comm_seconds"]).median)
        if progress:
            print(f"round {i + 1} of {rounds}: " + ", ".join(
                f"{k} {got[k]['tokens_per_step'] / per_step[k].seconds[-1]:,.0f} tokens/s"
                for k in cases), flush=True)
    for name, (n, spec) in cases.items():
        r = got[name]
        t = per_step[name]
        rec.add("step", "tokens/s", t.rate(r["tokens_per_step"]),
                seconds={**t.stats(), "samples": t.seconds}, case=name, ranks=n,
                threads=r["threads"], tokens_per_step=r["tokens_per_step"])
    # the path both sides' steps took (the Trainer's defaults, as smallem train --distributed)
    rec.data["settings"].update(backend=got["one process"].get("backend"),
                                pool=got["one process"].get("pool"))
    multi = got[f"{ranks} ranks"]
    rec.add("communication", "s/step", comm.stats(), ranks=ranks,
            bytes_per_step=int(Timing([float(b) for b in multi["comm_bytes"]]).median),
            grad_bytes=multi["grad_bytes"])
    for k in AVERAGE_EVERY:
        spec = dict(base, steps=curve_steps, warmup=0, threads=1, average_every=k,
                    eval_every=max(1, curve_steps // evals))
        r = _run(exe, ranks, spec)
        for step, tokens, bpb in r["curve"]:
            rec.add("val_bpb", "bits/byte", {"median": bpb, "min": bpb, "max": bpb, "n": 1},
                    average_every=k, step=step, tokens=tokens, ranks=ranks)
        t = Timing(r["step_seconds"])
        rec.add("curve_step", "tokens/s", t.rate(r["tokens_per_step"]), average_every=k,
                ranks=ranks, bytes_per_step=sum(r["comm_bytes"]) / len(r["comm_bytes"]))
        if progress:
            print(f"average every {k}: {r['curve'][-1][2]:.3f} bits/byte after "
                  f"{r['curve'][-1][1]:,} tokens", flush=True)
    return rec
