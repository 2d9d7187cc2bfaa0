"""llama.cpp beside us: where its tools are, and running them on a GGUF file we exported.

llama.cpp is a peer, never a dependency. ``make llama`` builds ``llama-bench`` and
``llama-simple`` (and ``llama-quantize``) from the source that the ``llama-cpp-python`` sdist bundles, into
``build/llama.cpp/bin/``; ``SMALLEM_LLAMA_BENCH`` may point at any other ``llama-bench``
(``llama-simple`` is looked for beside it). Without either, the chapter says it was not
measured.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from ...build import ROOT

ENV = "SMALLEM_LLAMA_BENCH"
BUILT = ROOT / "build" / "llama.cpp" / "bin"


def find() -> dict | None:
    """{"bench": path, "simple": path or None, "quantize": path or None, "from": where it
    was found}, or None."""
    named = os.environ.get(ENV)
    bench = Path(named) if named else BUILT / "llama-bench"
    if not (bench.is_file() and os.access(bench, os.X_OK)):
        return None
    simple, quantize = bench.parent / "llama-simple", bench.parent / "llama-quantize"
    return {"bench": str(bench), "simple": str(simple) if simple.is_file() else None,
            "quantize": str(quantize) if quantize.is_file() else None,
            "from": f"${ENV}" if named else "make llama"}


def version(tools: dict) -> str:
    r = subprocess.run([tools["bench"], "--version"], capture_output=True, text=True, timeout=30)
    text = (r.stdout + r.stderr).strip().splitlines()
    return text[0] if text else "unknown"


# llama-bench's CPU "extra buffer types" (its AMX kernels, the repacked layouts) switched off:
# on a Linux machine where a process must ask for the AMX tiles (arch_prctl) and this build
# does not, its AMX kernel dies of SIGILL at the first product of several rows
NO_EXTRA = ("--repack", "0")


class LlamaError(RuntimeError):
    """llama.cpp could not be run here; the message says how it failed."""


def _died(rc: int) -> str:
    try:
        return f"died of {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
    except ValueError:
        return f"exited with status {rc}"


def bench(tools: dict, model: Path, threads: int, *, prompt: int = 0, gen: int = 0,
          depth: int = 0, reps: int = 1) -> list[float]:
    """llama-bench's tokens/s samples for one test: prompt processing of ``prompt`` tokens
    (pp), or generation of ``gen`` tokens after ``depth`` cached ones (tg). Where its
    default build dies of an illegal instruction, it runs again without its extra buffer
    types (:data:`NO_EXTRA`), and ``tools["flags"]`` keeps them for every later run, so
    that one record is made with one configuration of the peer."""
    base = [tools["bench"], "-m", str(model), "-t", str(threads), "-p", str(prompt),
            "-n", str(gen), "-d", str(depth), "-r", str(reps), "-o", "json"]
    r = subprocess.run(base + list(tools.get("flags", ())), capture_output=True, text=True,
                       timeout=600)
    if r.returncode == -signal.SIGILL and not tools.get("flags"):
        tools["flags"] = list(NO_EXTRA)
        tools["flags_why"] = (f"its default configuration {_died(r.returncode)} here (its AMX "
                              f"kernels without the tiles granted): run with "
                              f"{' '.join(NO_EXTRA)}")
        r = subprocess.run(base + tools["flags"], capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise LlamaError(f"llama-bench {_died(r.returncode)} ({' '.join(base[3:])}): "
                         f"{r.stderr.strip()[-300:]}")
    rows = json.loads(r.stdout)
    return [float(x) for x in rows[0]["samples_ts"]]


def usable(tools: dict | None, model: Path, threads: int) -> str | None:
    """Why llama.cpp cannot be this chapter's peer here (None if it can): one short run of
    each test the chapter makes, on ``model``. A peer that fails is reported and left out;
    it never stops the book."""
    if tools is None:
        return "not found (`make llama`)"
    try:
        bench(tools, model, threads, gen=2, depth=4)
        bench(tools, model, threads, prompt=8)
    except (LlamaError, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
        return str(e)
    return None


def greedy(tools: dict, model: Path, prompt: bytes, n: int) -> bytes:
    """The ``n`` bytes llama-simple's greedy sampler writes after ``prompt``."""
    if not tools.get("simple"):
        raise FileNotFoundError("no llama-simple beside llama-bench")
    r = subprocess.run([tools["simple"], "-m", str(model), "-n", str(n), prompt],
                       capture_output=True, timeout=600)
    if r.returncode:
        raise LlamaError(f"llama-simple {_died(r.returncode)}: {r.stderr[-300:]!r}")
    out = r.stdout
    if not out.startswith(prompt):
        raise RuntimeError(f"llama-simple did not echo the prompt: {out[:80]!r}")
    return out[len(prompt):len(prompt) + n]
