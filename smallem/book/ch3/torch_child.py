"""PyTorch's training step in a process of its own, driven one step at a time.

Chapter 3's climb times PyTorch in the same rounds as our rungs. In one process its OpenMP
threads, once started, slow every fork-join of our pool (chapter 4 measured it), so the peer
runs here, in a child that builds the same model from the same seed and runs one step (the
next batch of the corpus) each time the parent asks. :class:`Step` is the parent's side: a
callable that asks for one step and waits for it, so the harness times it like any rung
(the pipe's round trip is microseconds against a step of a second).
"""

from __future__ import annotations

import json
import subprocess
import sys


class Step:
    """One PyTorch training step per call, in a child process. ImportError where torch is
    not installed; RuntimeError if the child fails."""

    def __init__(self, config: str, batch: int, seq_len: int, threads: int, autocast: bool):
        args = json.dumps([config, batch, seq_len, threads, autocast])
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, args], text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        first = self.proc.stdout.readline().strip()
        if first != "ready":
            err = self.proc.stderr.read()[-2000:] if not first else first
            self.close()
            if first.startswith("no torch"):
                raise ImportError(first.partition(": ")[2])
            raise RuntimeError(f"the PyTorch step did not start: {err}")

    def __call__(self):
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().strip()
        if line != "ok":
            raise RuntimeError(f"the PyTorch step failed: {line or self.proc.stderr.read()[-2000:]}")

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            f.close()

    def __del__(self):
        if getattr(self, "proc", None) is not None and self.proc.poll() is None:
            self.proc.kill()


def _serve(config: str, batch: int, seq_len: int, threads: int, autocast: bool):
    try:
        import torch
    except ImportError:
        print("no torch: PyTorch is not installed (pip install torch==2.13.0)", flush=True)
        return
    from smallem.training import data, torch_gpt
    from smallem.training.model import GPT, get_config

    torch.set_num_threads(threads)
    cfg = get_config(config)
    corpus = data.load_corpus()
    trainer = torch_gpt.TorchTrainer(GPT(cfg, "numpy", seed=0).params, cfg, autocast=autocast)
    print("ready", flush=True)
    i = 0
    for line in sys.stdin:
        if line.strip() != "step":
            break
        x, y = data.batch(corpus.train, 0, i, batch, seq_len)
        i += 1
        trainer.step(x, y)
        print("ok", flush=True)


if __name__ == "__main__":
    _serve(*json.loads(sys.argv[1]))
