"""The GPU side of chapters 3 and 4 in the book: their tables without records, from records,
and the one prepared script (kernels_cuda/gpu_check.sh --quick) end to end on the fake CuPy,
whose kernels outside gemm.cu and probes.cu run their own CUDA C++ on the CPU emulator."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from smallem.book import figures, gpu, records

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fake_cupy"


def test_gpu_tables_without_records(records_tmp):
    values = gpu.report(records_tmp)
    for key in ("gpu.ch3_line", "gpu.ch3_losses", "gpu.ch4_line", "gpu.ch4_prompt",
                "gpu.ch4_match"):
        assert values[key] == gpu.NOT_MEASURED, key
    assert values["gpu.ch3_measured"] is values["gpu.ch4_measured"] is False
    for name in ("gpu_train", "gpu_decode"):
        text = (figures.tables_dir() / f"{name}.md").read_text()
        rows = [line for line in text.splitlines() if line.startswith("| ") and "GPU |" not in line]
        assert rows and all(line.rstrip().endswith(f"{gpu.NOT_MEASURED} |") for line in rows), text


def test_notebook_section_without_gpu_says_so(records_tmp, capsys):
    if gpu.cuda.why_unavailable() is None:
        pytest.skip("a GPU is present")
    for chapter in ("ch3", "ch4"):
        assert gpu.notebook_section(chapter) is None
        out = capsys.readouterr().out
        assert "No GPU in this run" in out and gpu.NOT_MEASURED in out
    with pytest.raises(ValueError, match="chapter must be one of"):
        gpu.notebook_section("ch9")


def _script_env(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{FAKE}{os.pathsep}{ROOT}",
           "SMALLEM_RECORDS": str(tmp_path / "records"),
           "SMALLEM_FIGURES": str(tmp_path / "figures"),
           "PYTHON": sys.executable, "SMALLEM_COMMIT": "fake0000"}
    env.pop("SMALLEM_QUICK", None)
    return env


@pytest.mark.slow
def test_gpu_check_script_quick_on_the_fake_cupy(tmp_path):
    """The prepared script, --quick, end to end: four records, their tables and the log, at
    most 8 files (what the device tool brings back), every chapter within its limit."""
    if shutil.which("g++") is None and shutil.which("clang++") is None:
        pytest.skip("no C++ compiler for the CUDA emulator behind the fake CuPy")
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "kernels_cuda" / "gpu_check.sh"), str(out), "--quick"],
                       cwd=ROOT, env=_script_env(tmp_path), capture_output=True, text=True,
                       timeout=900)
    log = (out / "gpu_check.log").read_text() if (out / "gpu_check.log").exists() else r.stdout
    assert r.returncode == 0, log[-6000:] + r.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8, files
    for name in ("ch1.gpu", "ch2.gpu", "ch3.gpu", "ch4.gpu"):
        data = json.loads((out / f"{name}.json").read_text())
        assert data["settings"]["quick"] is True and data["results"], name
        assert data["machine"]["gpu"]["name"] == "Fake GPU"
    ch3 = records.load("ch3.gpu", out)
    for r3 in records.results(ch3, "loss_match"):  # the GPU step's losses are the CPU's
        assert r3["value"]["median"] < 1e-3, r3["params"]
        assert r3["params"]["uploads_per_step"] == 2 and r3["params"]["reads"] == 1
    ch4 = records.load("ch4.gpu", out)
    for r4 in records.results(ch4, "greedy_match"):
        assert r4["value"]["median"] == r4["params"]["tokens"], r4["params"]
    tables = (out / "gpu_tables.md").read_text()
    for chapter in ("ch1", "ch2", "ch3", "ch4"):
        assert f"## {chapter} on the GPU" in tables
    assert "skipped" not in log and "FAILED" not in log, log[-4000:]


def test_gpu_records_are_the_books_on_every_rendering(tmp_path):
    """A captured machine's folder holds no GPU record: its book quotes the GPU records the
    book keeps (figures/records), so every page and the home page name the same GPU; a folder
    with a GPU record of its own is read as it is, and an empty one says nothing measured."""
    from smallem.book.gpu import reading
    captured = ROOT / "tests" / "machines" / "intel-xeon-gnr-2c" / "records"
    assert not any(captured.glob("*.gpu.json"))
    assert reading.gpu_dir(captured) == reading.BOOK_RECORDS
    own = tmp_path / "own"
    own.mkdir()
    shutil.copy(captured / "ch1.machine.json", own)
    shutil.copy(reading.BOOK_RECORDS / "ch2.gpu.json", own)
    assert reading.gpu_dir(own) == own and reading.load_gpu("ch1.gpu", own) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert reading.gpu_dir(empty) == empty


def test_an_older_gpu_record_is_said_once_and_typed():
    """The committed H200 records predate the wgmma probe and the mma rung: the values say so
    (typed), and the tensor cores' roof is the faster of the probe and cuBLAS."""
    from smallem.book.gpu import reading
    ch1 = reading.load_gpu("ch1.gpu", reading.BOOK_RECORDS)
    ch2 = reading.load_gpu("ch2.gpu", reading.BOOK_RECORDS)
    v = {**reading.peak_values(ch1), **reading.gemm_values(ch2)}
    assert isinstance(v["gpu.fma_peak"], float) and isinstance(v["gpu.cublas_over_mma"], float)
    assert v["gpu.ch1_older"] is (not v["gpu.has_wgmma"]) and reading.is_hopper(ch1) is True
    assert v["gpu.tensor_ceiling"] >= v["gpu.mma_peak"]
    assert v["gpu.ch2_older"] is (not v["gpu.has_mma_rung"])
    assert isinstance(v["gpu.ladder_n"], int)
    assert "0.0e+00" not in "".join(str(c) for r in reading.gemm_rows(ch2) for c in r)


def test_every_cublas_rate_names_its_size():
    """cuBLAS's rate depends on n: chapter 1 quotes the fastest of its record's sizes, chapter 2
    its ladder's, and each names the size (the committed H200 records: 8192 and 4096)."""
    from smallem.book.gpu import reading
    ch1 = reading.load_gpu("ch1.gpu", reading.BOOK_RECORDS)
    ch2 = reading.load_gpu("ch2.gpu", reading.BOOK_RECORDS)
    v = {**reading.peak_values(ch1), **reading.gemm_values(ch2)}
    for dt in ("f32", "bf16"):
        n = v[f"gpu.cublas_{dt}_n"]
        assert records.value(ch1, "cublas", dtype=dt, n=n) == max(
            r["value"]["median"] for r in records.results(ch1, "cublas", dtype=dt))
    assert all(f"(n = {v['gpu.cublas_f32_n']})" in r[2] for r in reading.peaks_rows(ch1)[:1])
    if v["gpu.cublas_beats_mma"]:
        assert v["gpu.tensor_ceiling_by"].endswith(f"at n = {v['gpu.cublas_bf16_n']}")
    assert v["gpu.ladder_cublas_bf16"] == records.value(ch2, "cublas", dtype="bf16",
                                                       n=v["gpu.ladder_n"])
    assert v["gpu.sweep_n"] is None or v["gpu.sweep_n"] > v["gpu.ladder_n"]
