"""Checkpoints that a kill at any instant cannot corrupt.

A checkpoint is a folder holding

- ``step00000123.safetensors``: the parameters (``param.<name>``) and AdamW's
  two moments (``adam.m.<name>``, ``adam.v.<name>``), float32;
- ``checkpoint.json``: the config, the step, the seed, the data sampler's
  state, and the name, size and SHA-256 of the tensor file it goes with.

Order of writing: the new tensor file (temp name, fsync, rename), then the JSON
(temp name, fsync, rename), then the old tensor file is deleted. The JSON's
rename is the commit point: before it, ``checkpoint.json`` still names the old
tensor file, which still exists; after it, it names the new one, complete on
disk. A kill between any two of these steps leaves one valid checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

SCHEMA = "smallem.training.checkpoint/1"
INDEX = "checkpoint.json"


class CheckpointError(ValueError):
    """A checkpoint is missing, truncated, corrupt or not smallem's."""


def _fsync_dir(folder: Path):
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # some filesystems (and Windows) cannot open a directory
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes):
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)



def save(folder, tensors: dict[str, np.ndarray], meta: dict) -> Path:
    """Write ``tensors`` and ``meta`` (must hold ``step``) as the folder's checkpoint."""
    from safetensors.numpy import save as st_save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"step{int(meta['step']):08d}.safetensors"
    blob = st_save({k: np.ascontiguousarray(v) for k, v in tensors.items()},
                   metadata={"schema": SCHEMA, "step": str(meta["step"])})
    _write_atomic(folder / name, blob)
    index = dict(meta, schema=SCHEMA, tensors=name, bytes=len(blob),
                 sha256=hashlib.sha256(blob).hexdigest())
    _write_atomic(folder / INDEX, (json.dumps(index, indent=1) + "\n").encode())
    for old in folder.glob("step*.safetensors"):
        if old.name != name:
            old.unlink(missing_ok=True)
    return folder / INDEX


def exists(folder) -> bool:
    return (Path(folder) / INDEX).is_file()


def load(folder) -> tuple[dict[str, np.ndarray], dict]:
    """Read and verify a checkpoint; any problem raises :class:`CheckpointError` naming the file."""
    from safetensors.numpy import load as st_load

    folder = Path(folder)
    index = folder / INDEX if folder.is_dir() else folder
    if not index.is_file():
        raise CheckpointError(f"{index}: no checkpoint here (expected {INDEX} in {folder})")
    try:
        meta = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{index}: not a readable checkpoint index ({e})") from e
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        raise CheckpointError(f"{index}: not a smallem checkpoint (schema "
                              f"{meta.get('schema') if isinstance(meta, dict) else None!r}, "
                              f"expected {SCHEMA!r})")
    path = index.parent / str(meta.get("tensors", ""))
    if not path.is_file():
        raise CheckpointError(f"{path}: tensor file named by {index} is missing")
    size = path.stat().st_size
    if size != meta.get("bytes"):
        raise CheckpointError(f"{path}: truncated or overwritten ({size} bytes, "
                              f"{index} expects {meta.get('bytes')})")
    blob = path.read_bytes()
    if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        raise CheckpointError(f"{path}: contents do not match the SHA-256 in {index} (corrupt)")
    try:
        tensors = st_load(blob)
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from e
    return tensors, meta


def check_tensors(tensors: dict, expected: dict[str, tuple], where: Path | str):
    """Every expected tensor present with its shape and float32, nothing else missing."""
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{where}: tensor {name!r} is missing (a checkpoint of "
                                  f"another model?)")
        t = tensors[name]
        if tuple(t.shape) != tuple(shape) or t.dtype != np.float32:
            raise CheckpointError(f"{where}: tensor {name!r} is {t.dtype}{tuple(t.shape)}, "
                                  f"expected float32{tuple(shape)}")
