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
        # "ready" and what the child's PyTorch is (its version, threads, CPU kernels and fast
        # paths: build_facts), for the record
        self.facts = json.loads(first[6:] or "{}") if first.startswith("ready") else {}
        if not first.startswith("ready"):
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


def build_facts(torch) -> dict:
    """What this PyTorch is and may take on this CPU: its version, threads, the vector ISA its
    CPU kernels were dispatched to, whether oneDNN (mkldnn) is built in, whether PyTorch finds
    oneDNN's bf16 support here (its bf16 products then go to oneDNN) and whether the CPU
    offers AMX tiles (oneDNN then takes them). A fact a version does not answer is None."""
    def ask(fn):
        try:
            return fn()
        except Exception:  # noqa: BLE001 - an older or newer PyTorch without the call
            return None
    return {"version": torch.__version__, "threads": torch.get_num_threads(),
            "cpu_capability": ask(lambda: torch.backends.cpu.get_cpu_capability()),
            "mkldnn": ask(lambda: bool(torch.backends.mkldnn.is_available())),
            "mkldnn_bf16": ask(lambda: bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())),
            "amx_tile": ask(lambda: bool(torch._C._cpu._is_amx_tile_supported()))}


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
    print("ready " + json.dumps(build_facts(torch)), flush=True)
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
