"""The training text: bytes in, batches out, the same on every machine.

The default corpus needs no download: it is the Python standard library's own
source, the ``.py`` files under ``sysconfig.get_paths()["stdlib"]`` in sorted
order, minus the test suites, IDLE and ``site-packages`` (so installed packages
never change it). Its text depends on the Python version (3.11.7 gives a
different corpus from 3.12.1), so every log and record carries the corpus's
SHA-256 and file count.

Held-out split: file number i of the sorted list is validation when
``i % 20 == 10`` (5% of the files, whole files, so no function is split between
the two sides). A corpus of fewer than 11 files (or one file) holds out its last
10% of bytes instead.

Tokens are bytes (vocabulary 256): no tokenizer to train or ship, and the loss
in nats per token converts straight to bits per byte.

Batches are a pure function of (seed, step): batch number ``step`` draws its B
start offsets from ``numpy.random.default_rng([seed, step])``. A resumed run
therefore needs to remember only the step to see exactly the batches an
uninterrupted run would have seen.
"""

from __future__ import annotations

import functools
import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}
VAL_EVERY, VAL_AT = 20, 10


@dataclass
class Corpus:
    name: str
    train: np.ndarray   # uint8
    val: np.ndarray     # uint8
    sha256: str
    files: int

    def describe(self) -> dict:
        return {"name": self.name, "sha256": self.sha256, "files": self.files,
                "train_bytes": int(self.train.size), "val_bytes": int(self.val.size)}


def stdlib_files() -> list[Path]:
    """The default corpus's file list: sorted, relative order fixed by the path text."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for f in root.rglob("*.py"):
        dirs = f.relative_to(root).parts[:-1]
        if any(d in SKIP_DIRS or d.startswith("test") for d in dirs):
            continue
        out.append(f)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def _text_files(folder: Path) -> list[Path]:
    files = sorted((p for p in folder.rglob("*") if p.is_file()),
                   key=lambda p: p.relative_to(folder).as_posix())
    out = []
    for p in files:
        try:
            p.read_bytes().decode("utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files in a folder are skipped, not an error
        out.append(p)
    return out


def _split(chunks: list[bytes]) -> tuple[bytes, bytes]:
    if len(chunks) > VAL_AT:
        train = [c for i, c in enumerate(chunks) if i % VAL_EVERY != VAL_AT]
        val = [c for i, c in enumerate(chunks) if i % VAL_EVERY == VAL_AT]
        return b"\n".join(train), b"\n".join(val)
    whole = b"\n".join(chunks)
    cut = len(whole) - len(whole) // 10
    return whole[:cut], whole[cut:]


def load_corpus(path: str | Path | None = None) -> Corpus:
    """The stdlib corpus (``path=None``), or a UTF-8 text file, or a folder of them."""
    if path is None:
        return _stdlib_corpus()
    return _load(path)


@functools.lru_cache(maxsize=1)
def _stdlib_corpus() -> Corpus:  # read once per process: 11 MB, the arrays are read-only
    return _load(None)


def _load(path) -> Corpus:
    if path is None:
        files, name = stdlib_files(), f"python{sysconfig.get_python_version()}-stdlib"
        chunks = [f.read_bytes() for f in files]
    else:
        p = Path(path)
        if p.is_dir():
            files = _text_files(p)
            if not files:
                raise ValueError(f"corpus {p}: no UTF-8 text files in this folder")
        elif p.is_file():
            files = [p]
            try:
                p.read_bytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"corpus {p}: not UTF-8 text ({e})") from e
        else:
            raise FileNotFoundError(f"corpus {p}: no such file or folder")
        chunks, name = [f.read_bytes() for f in files], str(p)
    train, val = _split(chunks)
    h = hashlib.sha256()
    for c in chunks:
        h.update(hashlib.sha256(c).digest())
    corpus = Corpus(name, np.frombuffer(train, np.uint8), np.frombuffer(val, np.uint8),
                    h.hexdigest(), len(chunks))
    if corpus.train.size < 2 or corpus.val.size < 2:
        raise ValueError(f"corpus {name}: too small ({len(train)} + {len(val)} bytes)")
    return corpus


def batch(data: np.ndarray, seed: int, step: int, B: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch number ``step``: B windows of T+1 bytes at random offsets -> (inputs, targets)."""
    if data.size < T + 1:
        raise ValueError(f"text of {data.size} bytes is shorter than one window of {T + 1}")
    rng = np.random.default_rng([seed, step])
    starts = rng.integers(0, data.size - T, size=B)
    win = data[starts[:, None] + np.arange(T + 1)].astype(np.int32)
    return win[:, :-1], win[:, 1:]


def val_batch(data: np.ndarray, i: int, B: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Validation batch ``i``: fixed across runs and seeds, so curves compare."""
    return batch(data, 2**31 - 1, i, B, T)
