"""The CUDA kernels: they compile everywhere; on a GPU they match numpy; without one the
package still works and every GPU entry raises one clear error.

Tests that need a device are marked ``gpu`` and skip with the reason (no CuPy, no device);
the compile tests need only NVRTC (through CuPy) or nvcc, and skip visibly if neither exists.
"""

import subprocess
import sys

import numpy as np
import pytest

from smallem import checks
from smallem.plumbing import cuda

REASON = cuda.why_unavailable()
needs_gpu = pytest.mark.skipif(REASON is not None, reason=f"no GPU: {REASON}")
no_gpu_only = pytest.mark.skipif(REASON is None, reason="a GPU is present: the no-GPU path is not taken")

# awkward shapes: 1, primes, one past a tile, non-multiples of 4/8 (the vector-load guards)
SHAPES = [(1, 1, 1), (1, 7, 3), (17, 31, 5), (33, 65, 9), (127, 129, 131), (128, 128, 128),
          (200, 72, 40), (257, 130, 96)]


# ---------------------------------------------------------------- without a GPU too

@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", cuda.kernel_names())
def test_cu_compiles(name, arch):
    try:
        tool = cuda.compile_check(name, arch)
    except cuda.CompilerUnavailable as e:
        pytest.skip(str(e))
    assert tool in ("nvrtc", "nvcc")


def test_kernel_files_found():
    assert {"gemm", "probes"} <= set(cuda.kernel_names())


def test_package_imports_without_gpu():
    code = "import smallem.plumbing.cuda, smallem.book.gpu, smallem.cli; print(smallem.plumbing.cuda.why_unavailable())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@no_gpu_only
def test_gpu_entries_raise_clear_error():
    from smallem.book import gpu
    calls = [lambda: cuda.require(), lambda: cuda.gemm("vec", None, None),
             lambda: cuda.matmul(None, None), lambda: cuda.to_bf16(None),
             lambda: cuda.kernel("gemm", "sgemm_vec"), lambda: gpu.run_ch1(quick=True),
             lambda: gpu.run_ch2(quick=True), lambda: cuda.device_info()]
    for call in calls:
        with pytest.raises(cuda.GPUUnavailable, match="no GPU for smallem"):
            call()


@no_gpu_only
def test_gpu_check_command_fails_clearly(tmp_path, capsys):
    from smallem import cli
    assert cli.main(["gpu-check", "--out", str(tmp_path)]) == 2
    assert "no GPU" in capsys.readouterr().out


def test_tables_without_records(records_tmp, tmp_path):
    from smallem.book import figures, gpu
    values = gpu.report(records_tmp)
    assert values["gpu.ch1_line"] == values["gpu.ch2_line"] == gpu.NOT_MEASURED
    # the facts the pages choose their GPU sentences by: nothing measured, nothing said
    assert values["gpu.measured"] is values["gpu.gemm_measured"] is values["gpu.is_h200"] is False
    assert all(v == gpu.NOT_MEASURED for k, v in values.items() if isinstance(v, str))
    for name in ("gpu_peaks", "gpu_staircase", "gpu_gemm"):
        text = (figures.tables_dir() / f"{name}.md").read_text()
        assert gpu.NOT_MEASURED in text
    assert (figures.figures_dir() / "gpu_gemm.svg").exists()


@no_gpu_only
def test_notebook_section_without_gpu(records_tmp, capsys):
    from smallem.book import gpu
    assert gpu.notebook_section("ch2") is None
    out = capsys.readouterr().out
    assert "No GPU" in out and "recorded yet" in out


def test_tables_from_a_record(records_tmp):
    """A synthetic record (made-up numbers, never committed) renders every table and figure."""
    from smallem.book import figures, gpu, records
    mach = {"cpu": "x", "gpu": {"name": "Test GPU", "compute_capability": "90", "sms": 2,
                                "l2_bytes": 4 * 2**20, "cupy": "0"}}
    r1 = records.Record(gpu.CH1, settings={"quick": True}, machine=mach)
    v = lambda x: {"median": x, "min": x, "max": x, "n": 1}
    r1.add("fma_peak", "Gop/s", v(100.0), kind="f32")
    r1.add("mma_peak", "Gop/s", v(400.0), kind="bf16")
    for dt, x in (("f32", 90.0), ("bf16", 390.0)):
        r1.add("cublas", "Gop/s", v(x), dtype=dt, n=64)
    for k in range(18, 28):
        r1.add("read", "GB/s", v(1000.0 if 2**k <= 2**20 else 300.0), bytes=2**k)
    r1.add("copy", "GB/s", v(280.0), impl="ours", bytes=2**26)
    r1.add("copy", "GB/s", v(290.0), impl="cupy", bytes=2**26)
    r1.save()
    r2 = records.Record(gpu.CH2, settings={"quick": True, "ladder_n": 64}, machine=mach)
    for dt, x in (("f32", 90.0), ("bf16", 390.0)):
        r2.add("cublas", "Gop/s", v(x), dtype=dt, n=64)
    for rung in cuda.GPU_LADDER:
        r2.add("gemm", "Gop/s", v(10.0 * (rung.number + 1)), rung=rung.name, number=rung.number,
               dtype=rung.dtype, n=64, max_rel_err=1e-6, max_rel_err_f64=1e-6)
    r2.save()
    gpu.report(records_tmp)
    final = cuda.RUNGS[cuda.FINAL_F32]
    table = (figures.tables_dir() / "gpu_gemm.md").read_text()
    row = next(line for line in table.splitlines() if f"| {final.name} |" in line)
    assert f"| {100 * 10.0 * (final.number + 1) / 90:.0f} % |" in row
    assert "Test GPU" in table
    if REASON is not None:  # without a GPU the notebook shows the record with its machine
        assert gpu.notebook_section("ch1")["name"] == gpu.CH1


def test_probe_flop_comes_from_the_probe_source(tmp_path, monkeypatch):
    """The FLOP a launch of the compute probes does is counted from the constants their
    CUDA source defines (no copy of them in Python): a source with other constants counts
    other FLOP."""
    from smallem.book import gpu
    src = cuda.source_path("probes").read_text()
    fma = gpu.measuring.probe_flop("fma_f32", 10, 3, 256)
    mma = gpu.measuring.probe_flop("mma_bf16", 10, 3, 256)
    for name, new in (("FMA_CHAINS", 3), ("FMA_UNROLL", 5), ("MMA_CHAINS", 7)):
        assert f"#define {name} " in src
        src = "\n".join(f"#define {name} {new}" if line.startswith(f"#define {name} ") else line
                        for line in src.splitlines())
    (tmp_path / "probes.cu").write_text(src)
    monkeypatch.setattr(cuda, "KERNELS_DIR", tmp_path)
    assert gpu.measuring.probe_flop("fma_f32", 10, 3, 256) == 2 * 3 * 5 * 10 * 3 * 256
    assert gpu.measuring.probe_flop("mma_bf16", 10, 3, 256) == 2 * 16**3 * 7 * 10 * 3 * 256 / 32
    monkeypatch.undo()
    assert (fma, mma) == (gpu.measuring.probe_flop("fma_f32", 10, 3, 256),
                          gpu.measuring.probe_flop("mma_bf16", 10, 3, 256))
    with pytest.raises(ValueError, match="kernel"):
        gpu.measuring.probe_flop("copy", 1, 1, 1)


def test_bf16_bits_round_to_nearest_even():
    x = np.array([1.0, -2.5, 1.0 + 2**-8, 1.0 + 3 * 2**-8, np.inf, 0.0, 3.0e38], np.float32)
    bits = cuda.bf16_bits(x)
    back = cuda.bf16_to_f32(bits)
    assert back[0] == 1.0 and back[1] == -2.5
    assert back[2] == 1.0                   # halfway: ties to the even neighbour (1.0)
    assert back[3] == 1.0 + 2**-6           # halfway: ties to the even neighbour up
    assert np.isinf(back[4]) and back[5] == 0.0
    assert np.isnan(cuda.bf16_to_f32(cuda.bf16_bits(np.array([np.nan], np.float32))))[0]


def test_ladder_is_numbered_in_order():
    assert [r.number for r in cuda.GPU_LADDER] == list(range(len(cuda.GPU_LADDER)))
    assert cuda.FINAL_F32 in cuda.RUNGS and cuda.FINAL_BF16 in cuda.RUNGS


# ---------------------------------------------------------------- on a GPU

@pytest.fixture
def cp():
    if REASON is not None:
        pytest.skip(f"no GPU: {REASON}")
    import cupy
    return cupy


def _ref(A, B):
    return (A.astype(np.float64) @ B.astype(np.float64))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("rung", [r.name for r in cuda.GPU_LADDER])
def test_ladder_matches_numpy(cp, rung, shape, rng):
    M, N, K = shape
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    if cuda.RUNGS[rung].dtype == "bf16":
        a16, b16 = cuda.bf16_bits(A), cuda.bf16_bits(B)
        want = _ref(cuda.bf16_to_f32(a16), cuda.bf16_to_f32(b16))
        got = cuda.gemm(rung, cp.asarray(a16), cp.asarray(b16))
    else:
        want = _ref(A, B)
        got = cuda.gemm(rung, cp.asarray(A), cp.asarray(B))
    checks.assert_close(cp.asnumpy(got), want.astype(np.float32), k=K, name=f"{rung} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", ["f32", "bf16"])
@pytest.mark.parametrize("trans", ["nn", "nt", "tn"])
def test_matmul_variants(cp, kind, trans, shape, rng):
    M, N, K = shape
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    if kind == "bf16":
        A, B = cuda.bf16_to_f32(cuda.bf16_bits(A)), cuda.bf16_to_f32(cuda.bf16_bits(B))
    want = _ref(A, B).astype(np.float32)
    a = np.ascontiguousarray(A.T) if trans == "tn" else A
    b = np.ascontiguousarray(B.T) if trans == "nt" else B
    if kind == "bf16":
        a, b = cuda.bf16_bits(a), cuda.bf16_bits(b)
    got = cuda.matmul(cp.asarray(a), cp.asarray(b), trans_a=trans == "tn", trans_b=trans == "nt")
    checks.assert_close(cp.asnumpy(got), want, k=K, name=f"{kind} {trans} {shape}")


@pytest.mark.gpu
def test_matmul_writes_into_out_and_offsets(cp, rng):
    # a view starting one float into its buffer is contiguous but not 16-byte aligned: the
    # kernels must fall back to scalar loads there
    A = cp.asarray(rng.standard_normal(65 * 36).astype(np.float32))[1:1 + 64 * 36].reshape(64, 36)
    assert A.data.ptr % 16 != 0 and A.flags.c_contiguous
    B = cp.asarray(rng.standard_normal((36, 20)).astype(np.float32))
    out = cp.empty((64, 20), dtype=cp.float32)
    got = cuda.matmul(A, B, out=out)
    assert got is out
    checks.assert_close(cp.asnumpy(out), _ref(cp.asnumpy(A), cp.asnumpy(B)).astype(np.float32), k=36)


@pytest.mark.gpu
def test_to_bf16_matches_host(cp, rng):
    x = rng.standard_normal(1001).astype(np.float32) * 1e3
    x[:3] = [np.nan, np.inf, -0.0]
    assert np.array_equal(cp.asnumpy(cuda.to_bf16(cp.asarray(x))), cuda.bf16_bits(x))


@pytest.mark.gpu
def test_validation(cp):
    A = cp.ones((4, 3), dtype=cp.float32)
    B = cp.ones((3, 5), dtype=cp.float32)
    with pytest.raises(TypeError, match="numpy.ndarray"):
        cuda.gemm("vec", np.ones((4, 3), np.float32), B)
    with pytest.raises(TypeError, match="dtype"):
        cuda.gemm("vec", A.astype(cp.float64), B)
    with pytest.raises(TypeError, match="dtype"):
        cuda.gemm("wmma", A, B)  # float32 given to the bf16 rung
    with pytest.raises(ValueError, match="C-contiguous"):
        cuda.gemm("vec", cp.ones((3, 4), dtype=cp.float32).T, B)
    with pytest.raises(ValueError, match="chain"):
        cuda.gemm("vec", A, cp.ones((4, 5), dtype=cp.float32))
    with pytest.raises(ValueError, match="dimensions"):
        cuda.gemm("vec", cp.ones(3, dtype=cp.float32), B)
    with pytest.raises(ValueError, match="shape"):
        cuda.matmul(A, B, out=cp.empty((5, 4), dtype=cp.float32))
    with pytest.raises(ValueError, match="unknown GPU rung"):
        cuda.gemm("nope", A, B)
    with pytest.raises(ValueError, match="not provided"):
        cuda.matmul(A, B, trans_a=True, trans_b=True)
    if cp.cuda.runtime.getDeviceCount() > 1:
        with cp.cuda.Device(1):
            other = cp.ones((4, 3), dtype=cp.float32)
        with pytest.raises(ValueError, match="lives on GPU"):
            cuda.gemm("vec", other, B)


@pytest.mark.gpu
def test_probes_run(cp, records_tmp):
    """The chapter-1 probes and the ladder run end to end at tiny sizes (no speed checked)."""
    from smallem.book import gpu
    r1 = gpu.run_ch1(quick=True, progress=False)
    assert all(r["value"]["median"] > 0 for r in r1.data["results"])
    r2 = gpu.run_ch2(quick=True, progress=False)
    for r in r2.data["results"]:
        if r["name"] in ("gemm", "sweep"):
            tol = 2e-2 if r["params"]["dtype"] == "bf16" else 1e-4
            assert r["params"]["max_rel_err"] < tol and r["params"]["max_rel_err_f64"] < tol


def test_orchestration_with_fake_cupy(tmp_path):
    """The GPU measurement code end to end against tests/fake_cupy (numpy in CuPy's place):
    catches Python mistakes in launches, records and tables before a GPU is ever lent."""
    import os
    from pathlib import Path
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent / "fake_cupy"),
           "SMALLEM_RECORDS": str(tmp_path / "rec"), "SMALLEM_FIGURES": str(tmp_path / "fig"),
           "MPLBACKEND": "Agg"}
    code = ("from smallem.plumbing import cuda\nfrom smallem.book import gpu\n"
            "assert cuda.why_unavailable() is None\n"
            "gpu.run_ch1(quick=True, progress=False).save()\n"
            "gpu.run_ch2(quick=True, progress=False).save()\n"
            "gpu.report(None)\n"
            "import os, pathlib\n"
            "table = pathlib.Path(os.environ['SMALLEM_FIGURES'], 'tables', 'gpu_gemm.md')\n"
            "assert 'Fake GPU' in table.read_text() and '100 %' in table.read_text()\n"
            "assert gpu.notebook_section('ch2', quick=False)['name'] == 'ch2.gpu'\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
