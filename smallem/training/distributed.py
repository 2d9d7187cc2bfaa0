"""Data-parallel training on MPI (mpi4py): every rank trains on its slice of each batch.

    mpiexec -n 2 smallem train --distributed --config s --steps 200
    mpiexec -n 2 smallem train --distributed --average-every 10 --config s --steps 200

``average_every`` (K) is the scheme:

- K = 1: every step the ranks' gradients are averaged, one all-reduce of the flat gradient,
  before the optimiser; every rank then makes the update one process would make with the
  whole batch (equal to rounding: the sums are grouped differently).
- K > 1, local SGD: each rank steps on its own slice alone, and every K steps (and at the
  last step, and before a checkpoint) the weights *and* the optimiser's moments are
  averaged. Averaging the moments keeps each rank's whole state equal after every average,
  so the checkpoint rank 0 writes is every rank's and a resumed run, with any number of
  ranks, starts from one state. (The average of the ranks' second moments is not the second
  moment of the averaged gradient; it is the choice that keeps the ranks one model.)

Rank r's rows of the global batch are :func:`rows` (B, N, r) of ``data.batch(seed, step)``:
a pure function of the step and the rank, so a resumed run sees the same data, with the same
N or another. The loss logged is the global batch's mean (one scalar all-reduce a step).
Rank 0 writes the log and the checkpoints; before one is written every rank's weights are
compared bit for bit (a CRC each, gathered).

Faults: a rank that dies would leave the others in a collective that never completes.
MPICH's ``mpiexec`` (Hydra) ends the whole job within a couple of seconds and says which
process died ("BAD TERMINATION ... EXIT CODE: 9"). Under a launcher that does not, each
collective here is non-blocking and polled: past ``timeout`` seconds (SMALLEM_MPI_TIMEOUT)
without an answer, the rank says which collective, at which step, and ends the job
(MPI_Abort). An error on one rank (a bad option, a missing file) ends the job the same way.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import zlib

import numpy as np

from smallem.training import data
from smallem.training.train import LN2, Trainer, lr_at

TIMEOUT_ENV = "SMALLEM_MPI_TIMEOUT"
TIMEOUT = 60.0  # seconds a collective may wait before the rank gives up on its peers


def mpi():
    """mpi4py's MPI module, or a clear error."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise RuntimeError("--distributed needs mpi4py and an MPI library: "
                           "pip install -e '.[mpi]' (mpi4py with MPICH's wheel), then run "
                           "under mpiexec -n N") from e
    return MPI


def mpiexec() -> str | None:
    """The ``mpiexec`` to launch ranks with: MPICH's beside this Python (the mpich wheel's),
    else one on PATH; None without it or without mpi4py."""
    import shutil
    from pathlib import Path

    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    exe = Path(sys.executable).with_name("mpiexec")
    return str(exe) if exe.exists() else shutil.which("mpiexec")


def rows(B: int, n: int, rank: int) -> slice:
    """Rank ``rank``'s rows of a global batch of ``B`` sequences split over ``n`` ranks."""
    if B % n:
        raise ValueError(f"batch size {B} does not split over {n} ranks: use a multiple of {n}")
    per = B // n
    return slice(rank * per, (rank + 1) * per)


class Distributed:
    """The world communicator, with the waits watched and the communication counted."""

    def __init__(self, comm=None, timeout: float | None = None):
        MPI = mpi()
        self.MPI = MPI
        self.comm = comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        local = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        local.Free()
        self.timeout = float(timeout if timeout is not None
                             else os.environ.get(TIMEOUT_ENV, TIMEOUT))
        self.step = 0           # for the messages
        self.seconds = 0.0      # time spent in collectives (waiting for peers included)
        self.bytes = 0          # payload bytes this rank handed to all-reduces
        self.calls = 0
        self._say_when_ended()

    # -------------------------------------------------------------- placement
    def threads_and_pin(self, threads: int | None) -> int:
        """Threads for this rank (default: this host's cores over its ranks), pinned to their
        own cores when the host has enough, so two ranks' threads never share a core."""
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        per = threads or max(1, len(allowed) // self.local_size)
        if allowed and per * self.local_size <= len(allowed):
            mine = allowed[self.local_rank * per:(self.local_rank + 1) * per]
            os.sched_setaffinity(0, mine)  # before any kernel starts its threads
        return int(per)

    # -------------------------------------------------------------- collectives
    def _wait(self, req, what: str):
        t0 = time.perf_counter()
        while not req.Test():
            waited = time.perf_counter() - t0
            if waited > self.timeout:
                self.fail(f"{what} at step {self.step} got no answer from the other ranks in "
                          f"{self.timeout:.0f} s: a rank has stopped or hangs (its own output "
                          f"says why)")
            if waited > 1e-3:
                time.sleep(1e-4)

    def mean_(self, buf: np.ndarray, what: str = "all-reduce") -> np.ndarray:
        """Average ``buf`` over the ranks, in place (one rank: nothing to do, nothing counted)."""
        if self.size == 1:
            return buf
        t0 = time.perf_counter()
        self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM), what)
        buf *= buf.dtype.type(1.0 / self.size)
        self.seconds += time.perf_counter() - t0
        self.bytes += buf.nbytes
        self.calls += 1
        return buf

    def mean(self, x: float, what: str = "loss") -> float:
        return float(self.mean_(np.array([x], np.float64), what)[0])

    def check_equal(self, arrays, what: str):
        """Raise unless every rank holds the same bits in ``arrays`` (a CRC each, gathered)."""
        crc = 0
        for a in arrays:
            crc = zlib.crc32(np.ascontiguousarray(a).view(np.uint8), crc)
        mine = np.array([crc], np.int64)
        got = np.zeros(self.size, np.int64)
        self._wait(self.comm.Iallgather(mine, got), f"comparing {what}")
        if len(set(got.tolist())) != 1:
            raise RuntimeError(f"step {self.step}: the ranks' {what} differ "
                               f"(CRCs {[hex(int(c)) for c in got]})")

    def fail(self, message: str, code: int = 3):
        print(f"smallem train (rank {self.rank} of {self.size}): error: {message}",
              file=sys.stderr, flush=True)
        self.comm.Abort(code)

    def _say_when_ended(self):
        """A rank ended by SIGTERM (a scheduler, or mpiexec ending the job) says where."""
        def said(signum, frame):
            print(f"smallem train (rank {self.rank} of {self.size}): ended by SIGTERM at step "
                  f"{self.step}; the last checkpoint is intact: rerun with --resume",
                  file=sys.stderr, flush=True)
            os._exit(128 + signum)
        try:
            signal.signal(signal.SIGTERM, said)
        except ValueError:  # not the main thread
            pass

    def stats(self) -> dict:
        return {"seconds": self.seconds, "bytes": self.bytes, "calls": self.calls}


class DistributedTrainer(Trainer):
    """A :class:`smallem.training.train.Trainer` whose rank trains on its rows of each global batch
    (``batch_size`` is the global batch) and meets the others as ``average_every`` says."""

    def __init__(self, *args, dist: Distributed | None = None, average_every: int = 1, **kw):
        super().__init__(*args, **kw)
        if self.accumulate != 1:
            raise ValueError("accumulate: not with --distributed (each rank's rows are its "
                             "share of one batch; add ranks or raise the batch instead)")
        if dist is not None:
            self.attach(dist, average_every)

    def attach(self, dist: Distributed, average_every: int = 1):
        if int(average_every) < 1:
            raise ValueError(f"average_every must be >= 1, got {average_every}")
        self.dist, self.average_every = dist, int(average_every)
        self.rows = rows(self.B, dist.size, dist.rank)
        self._averaged = True
        dist.step = self.step
        dist.check_equal([self.model.flat], "initial weights")
        return self

    def _state(self) -> list[np.ndarray]:
        """Everything local SGD averages: the weights and the optimiser's moments."""
        out = [self.model.flat, self.opt.m, self.opt.v]
        if self.opt.name == "muon":
            out += [mom for *_, mom in self.opt.pieces]
        return out

    def average(self):
        for a in self._state():
            self.dist.mean_(a, "averaging the weights and moments")
        self._averaged = True

    def train_step(self) -> dict:
        d = self.dist
        before = (d.seconds, d.bytes)
        x, y = data.batch(self.corpus.train, self.seed, self.step, self.B, self.T)
        lr = lr_at(self.step, self.total_steps, self.max_lr, self.warmup)
        loss = self.model.forward(x[self.rows], y[self.rows])
        self.model.backward()
        if self.average_every == 1:
            d.mean_(self.model.grad_flat, "the gradients' all-reduce")
        norm = self.opt.step(lr)
        self.step += 1
        d.step = self.step
        self._averaged = False
        if self.average_every > 1 and (self.step % self.average_every == 0
                                       or self.step == self.total_steps):
            self.average()
        loss = d.mean(loss)
        return {"step": self.step, "loss": loss, "lr": lr, "grad_norm": norm,
                "comm_seconds": d.seconds - before[0], "comm_bytes": d.bytes - before[1]}

    def evaluate(self, batches: int = 8) -> float:
        """The validation loss of the global batches: each rank its rows, then the mean."""
        total = 0.0
        for i in range(batches):
            x, y = data.val_batch(self.corpus.val, i, self.B, self.T)
            total += self.model.forward(x[self.rows], y[self.rows])
        return self.dist.mean(total, "the validation loss") / batches / LN2

    def save(self, folder):
        """Rank 0 writes; every rank first averages (local SGD) and proves its state equal."""
        if self.average_every > 1 and not self._averaged:
            self.average()
        self.dist.check_equal(self._state(), "weights and moments")
        if self.dist.rank == 0:
            return super().save(folder)
        return None

    @classmethod
    def resume(cls, folder, *, dist: Distributed, average_every: int = 1, **kw):
        t = super().resume(folder, **kw)
        return t.attach(dist, average_every)

    def settings(self) -> dict:
        s = super().settings()
        if getattr(self, "dist", None) is not None:
            s["distributed"] = {"ranks": self.dist.size, "average_every": self.average_every}
        return s
