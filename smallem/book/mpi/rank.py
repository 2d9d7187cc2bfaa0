"""What each rank of the appendix's measurement runs (``mpiexec -n N python -m
smallem.book.mpi.rank '<json>'``): one training run, its steps timed, then rank 0 prints
one JSON line: per-step seconds and communication seconds (after the warm-up steps),
the bytes each rank handed to all-reduces per step, and the validation curve."""

from __future__ import annotations

import json
import sys
import time

from smallem.training.distributed import Distributed, DistributedTrainer
from smallem.training.model import Config, get_config


def run(spec: dict) -> dict | None:
    d = Distributed()
    threads = d.threads_and_pin(spec["threads"])
    cfg = Config(**spec["config"]) if isinstance(spec["config"], dict) else get_config(spec["config"])
    t = DistributedTrainer(cfg, corpus=spec.get("corpus"), batch_size=spec["batch"],
                           seq_len=spec.get("seq_len"), steps=spec["steps"], seed=0,
                           threads=threads, dist=d, average_every=spec["average_every"])
    step_s, comm_s, nbytes, curve = [], [], [], []
    eval_every = spec.get("eval_every") or 0
    for i in range(spec["steps"]):
        t0 = time.perf_counter()
        out = t.train_step()
        dt = time.perf_counter() - t0
        if i >= spec.get("warmup", 0):
            step_s.append(dt)
            comm_s.append(out["comm_seconds"])
            nbytes.append(out["comm_bytes"])
        if eval_every and (t.step % eval_every == 0 or t.step == t.total_steps):
            curve.append((t.step, t.step * t.B * t.T, t.evaluate(spec.get("eval_batches", 4))))
    if d.rank:
        return None
    kept = t.settings()
    return {"ranks": d.size, "threads": threads, "tokens_per_step": t.B * t.T,
            "backend": kept["backend"], "pool": kept["pool"],
            "step_seconds": step_s, "comm_seconds": comm_s, "comm_bytes": nbytes,
            "grad_bytes": int(t.model.grad_flat.nbytes), "curve": curve}


if __name__ == "__main__":
    result = run(json.loads(sys.argv[1]))
    if result is not None:
        print(json.dumps(result), flush=True)
