"""llama.cpp beside us: where its tools are, and running them on a GGUF file we exported.

llama.cpp is a peer, never a dependency. ``make llama`` builds ``llama-bench`` and
``llama-simple`` from the source that the ``llama-cpp-python`` sdist bundles, into
``build/llama.cpp/bin/``; ``SMALLEM_LLAMA_BENCH`` may point at any other ``llama-bench``
(``llama-simple`` is looked for beside it). Without either, the chapter says it was not
measured.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from ...build import ROOT

ENV = "SMALLEM_LLAMA_BENCH"
BUILT = ROOT / "build" / "llama.cpp" / "bin"


def find() -> dict | None:
    """{"bench": path, "simple": path or None, "from": where it was found}, or None."""
    named = os.environ.get(ENV)
    bench = Path(named) if named else BUILT / "llama-bench"
    if not (bench.is_file() and os.access(bench, os.X_OK)):
        return None
    simple = bench.parent / "llama-simple"
    return {"bench": str(bench), "simple": str(simple) if simple.is_file() else None,
            "from": f"${ENV}" if named else "make llama"}


def version(tools: dict) -> str:
    r = subprocess.run([tools["bench"], "--version"], capture_output=True, text=True, timeout=30)
    text = (r.stdout + r.stderr).strip().splitlines()
    return text[0] if text else "unknown"


def bench(tools: dict, model: Path, threads: int, *, prompt: int = 0, gen: int = 0,
          depth: int = 0, reps: int = 1) -> list[float]:
    """llama-bench's tokens/s samples for one test: prompt processing of ``prompt`` tokens
    (pp), or generation of ``gen`` tokens after ``depth`` cached ones (tg)."""
    cmd = [tools["bench"], "-m", str(model), "-t", str(threads), "-p", str(prompt),
           "-n", str(gen), "-d", str(depth), "-r", str(reps), "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
    rows = json.loads(r.stdout)
    return [float(x) for x in rows[0]["samples_ts"]]


def greedy(tools: dict, model: Path, prompt: bytes, n: int) -> bytes:
    """The ``n`` bytes llama-simple's greedy sampler writes after ``prompt``."""
    if not tools.get("simple"):
        raise FileNotFoundError("no llama-simple beside llama-bench")
    r = subprocess.run([tools["simple"], "-m", str(model), "-n", str(n), prompt],
                       capture_output=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"llama-simple failed ({r.returncode}): {r.stderr[-2000:]!r}")
    out = r.stdout
    if not out.startswith(prompt):
        raise RuntimeError(f"llama-simple did not echo the prompt: {out[:80]!r}")
    return out[len(prompt):len(prompt) + n]
