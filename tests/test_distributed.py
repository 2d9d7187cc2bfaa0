"""The appendix: data-parallel training on MPI, 2-rank jobs under mpiexec.

Skipped, visibly, where mpi4py or mpiexec is missing (`pip install -e '.[mpi]'`)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from smallem.training import distributed
from smallem.training.model import Config
from smallem.training.train import Trainer, train

ROOT = Path(__file__).resolve().parent.parent
TINY = Config("tiny", d_model=16, n_layer=2, n_head=2, context=16)


def mpiexec() -> str:
    exe = distributed.mpiexec()
    if exe is None:
        pytest.skip("no mpi4py or mpiexec: pip install -e '.[mpi]' (mpi4py and MPICH's wheel)")
    return exe


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "corpus.txt"
    rng = np.random.default_rng(0)
    words = ["def", "return", "self", "import", "class", "(", ")", ":", "\n", "    ", "x", "="]
    path.write_text(" ".join(rng.choice(words, 6000)))
    return path


def _env():
    return dict(os.environ, SMALLEM_THREADS="1", SMALLEM_MPI_TIMEOUT="20")


def _ranks(n, script, timeout=120):
    r = subprocess.run([mpiexec(), "-n", str(n), sys.executable, "-c", textwrap.dedent(script)],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def test_rows_split_the_global_batch():
    assert [distributed.rows(8, 2, r) for r in (0, 1)] == [slice(0, 4), slice(4, 8)]
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        distributed.rows(8, 3, 0)


TRAIN = """
    import json, sys
    from smallem.training import data
    from smallem.training.distributed import Distributed, DistributedTrainer
    from smallem.training.model import Config
    from smallem.training.train import train
    d = Distributed()
    t = DistributedTrainer(Config("tiny", d_model=16, n_layer=2, n_head=2, context=16),
                           corpus=data.load_corpus({corpus!r}), batch_size=4, steps={steps},
                           seed=3, threads=1, dist=d, average_every={k})
    h = train(t, sample_bytes=0, progress=False, eval_every={steps}, checkpoint_dir={ck!r})
    if d.rank == 0:
        json.dump({{"loss": h["loss"], "val": h["val_bpb"], "comm": d.stats()}}, open({out!r}, "w"))
"""


def test_all_reduce_every_step_equals_one_process(corpus_file, tmp_path):
    out = tmp_path / "out.json"
    _ranks(2, TRAIN.format(corpus=str(corpus_file), steps=20, k=1, ck=str(tmp_path / "ck"),
                           out=str(out)))
    got = json.loads(out.read_text())
    one = train(Trainer(TINY, corpus=str(corpus_file), batch_size=4, steps=20, seed=3,
                        threads=1), sample_bytes=0, progress=False, eval_every=20)
    np.testing.assert_allclose(got["loss"], one["loss"], rtol=1e-5)
    np.testing.assert_allclose(got["val"], one["val_bpb"], rtol=1e-5)
    # one gradient all-reduce a step, of the whole flat gradient, and the checkpoint is there
    n = Trainer(TINY, corpus=str(corpus_file), batch_size=4).model.grad_flat.nbytes
    assert got["comm"]["bytes"] >= 20 * n
    assert (tmp_path / "ck" / "checkpoint.json").is_file()


def test_local_sgd_finishes_with_equal_ranks(corpus_file, tmp_path):
    out = tmp_path / "out.json"
    # the final save compares every rank's weights and moments bit for bit
    _ranks(2, TRAIN.format(corpus=str(corpus_file), steps=12, k=5, ck=str(tmp_path / "ck"),
                           out=str(out)))
    got = json.loads(out.read_text())
    assert len(got["loss"]) == 12 and np.isfinite(got["val"]).all()
    n = Trainer(TINY, corpus=str(corpus_file), batch_size=4).model.flat.nbytes
    assert got["comm"]["bytes"] < 12 * n  # averages at steps 5, 10 and 12 only (x3 buffers)


def test_a_batch_that_does_not_split_is_one_clear_error(corpus_file, tmp_path):
    r = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "smallem", "train",
                        "--distributed", "--config", "s", "--corpus", str(corpus_file),
                        "--batch-size", "3", "--steps", "2", "--checkpoint", str(tmp_path / "ck")],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "batch size 3 does not split over 2 ranks" in r.stderr
    assert "Traceback" not in r.stderr


def _rank_pid(marker: str, rank: int) -> int | None:
    """The process of rank ``rank`` whose command line names ``marker`` (MPICH sets PMI_RANK)."""
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
            if marker.encode() not in cmd or b"smallem" not in cmd or b"mpiexec" in cmd:
                continue
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env:
            return int(p.name)
    return None


def test_a_killed_rank_ends_the_job_quickly_and_the_run_resumes(corpus_file, tmp_path):
    exe = mpiexec()
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "smallem", "train", "--distributed", "--config", "s",
           "--corpus", str(corpus_file), "--batch-size", "2", "--seq-len", "32", "--steps", "40",
           "--checkpoint", str(ck), "--checkpoint-every", "2", "--eval-every", "1000",
           "--sample-bytes", "0"]
    job = subprocess.Popen([exe, "-n", "2", *cmd], cwd=ROOT, env=_env(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 90
        while time.time() < deadline and job.poll() is None:
            if (ck / "checkpoint.json").is_file() and \
                    json.loads((ck / "checkpoint.json").read_text())["step"] >= 4:
                break
            time.sleep(0.05)
        pid = _rank_pid(str(ck), 1)
        assert job.poll() is None and pid, "the job ended, or rank 1 was not found, before the kill"
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        out, err = job.communicate(timeout=30)
        assert time.monotonic() - killed < 10, "the other rank outlived its peer by 10 s"
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode != 0
    # MPICH's mpiexec names the dead rank; our watchdog speaks where a launcher does not
    assert "BAD TERMINATION" in out + err or "got no answer from the other ranks" in err, \
        out[-1500:] + err[-1500:]
    step = json.loads((ck / "checkpoint.json").read_text())["step"]
    assert 4 <= step < 40
    # resume, on one rank this time: the same global batches, split one way
    r = subprocess.run([exe, "-n", "1", *cmd, "--resume"], cwd=ROOT, env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming {ck} at step {step} of 40 on 1 ranks" in r.stdout
    assert json.loads((ck / "checkpoint.json").read_text())["step"] == 40


def test_the_ring_model_is_its_formula():
    from smallem.book.mpi import reading

    # 2 (N - 1) / N of 100 MB over 10 Gbit/s, for 4 machines: 1.5 x 0.08 s
    assert reading.ring_seconds(100e6, 4, 10) == pytest.approx(0.12)
    assert reading.ring_seconds(100e6, 1, 10) == 0
    # weak scaling: 4 machines of 1000 tokens a 0.5 s step, plus the ring's 0.12 s
    assert reading.model(0.5, 1000, int(100e6), 4, 10) == pytest.approx(4000 / 0.62)
    # local SGD every 10 steps sends 3 buffers a tenth as often
    assert reading.model(0.5, 1000, int(100e6), 4, 10, 10) == pytest.approx(4000 / (0.5 + 0.036))


def test_a_run_resumed_on_another_number_of_ranks_sees_the_same_batches(corpus_file, tmp_path):
    """10 steps on 2 ranks, the other 10 resumed on 1: the losses are one process's 20."""
    ck, log = tmp_path / "ck", tmp_path / "loss.json"
    script = """
        import json, os
        from smallem.training import data
        from smallem.training.distributed import Distributed, DistributedTrainer
        from smallem.training.model import Config
        from smallem.training.train import train
        d = Distributed()
        kw = dict(corpus=data.load_corpus({corpus!r}), threads=1, dist=d)
        if os.path.exists({ck!r} + "/checkpoint.json"):
            t = DistributedTrainer.resume({ck!r}, **kw)
        else:
            t = DistributedTrainer(Config("tiny", d_model=16, n_layer=2, n_head=2, context=16),
                                   batch_size=4, steps=20, seed=3, **kw)
        h = train(t, sample_bytes=0, progress=False, eval_every=0, checkpoint_dir={ck!r},
                  checkpoint_every=10, stop_after=10)
        if d.rank == 0:
            old = json.load(open({log!r})) if os.path.exists({log!r}) else []
            json.dump(old + h["loss"], open({log!r}, "w"))
    """.format(corpus=str(corpus_file), ck=str(ck), log=str(log))
    _ranks(2, script)
    _ranks(1, script)
    one = train(Trainer(TINY, corpus=str(corpus_file), batch_size=4, steps=20, seed=3,
                        threads=1), sample_bytes=0, progress=False, eval_every=0)
    got = json.loads(log.read_text())
    assert len(got) == 20
    np.testing.assert_allclose(got, one["loss"], rtol=1e-5)
