"""The CUDA kernels: they compile everywhere; on a GPU they match numpy; without one the
package still works and every GPU entry raises one clear error.

Tests that need a device are marked ``gpu`` and skip with the reason (no CuPy, no device);
the compile tests need only NVRTC (through CuPy) or nvcc, and skip visibly if neither exists.
"""

import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from smallem import checks
from smallem.plumbing import build, cuda

REASON = cuda.why_unavailable()
needs_gpu = pytest.mark.skipif(REASON is not None, reason=f"no GPU: {REASON}")
no_gpu_only = pytest.mark.skipif(REASON is None, reason="a GPU is present: the no-GPU path is not taken")

# awkward shapes: 1, primes, one past a tile, non-multiples of 4/8 (the vector-load guards)
SHAPES = [(1, 1, 1), (1, 7, 3), (17, 31, 5), (33, 65, 9), (127, 129, 131), (128, 128, 128),
          (200, 72, 40), (257, 130, 96)]


# ---------------------------------------------------------------- without a GPU too

@pytest.mark.parametrize("tool", ["nvrtc", "nvcc"])
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
@pytest.mark.parametrize("name", cuda.kernel_names())
def test_cu_compiles(name, arch, tool):
    """Every file with both compilers: NVRTC (what CuPy compiles with at run time) and nvcc."""
    try:
        used = cuda.compile_check(name, arch, tool)
    except cuda.CompilerUnavailable as e:
        pytest.skip(str(e))
    assert used == tool


def test_compile_check_reports_the_compilers_error(tmp_path, monkeypatch):
    """A kernel that does not compile fails with the compiler's own message, whichever tool."""
    (tmp_path / "broken.cu").write_text('extern "C" __global__ void k(int *x) { x[0] = y; }\n')
    monkeypatch.setattr(cuda, "KERNELS_DIR", tmp_path)
    tools = cuda.compile_tools()
    if not tools:
        pytest.skip("neither NVRTC nor nvcc here")
    for tool in tools:
        with pytest.raises(RuntimeError, match='"y" is undefined'):
            cuda.compile_check("broken", "sm_80", tool)


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
    wg = gpu.measuring.probe_flop("wgmma_bf16", 10, 3, 256)
    for name, new in (("FMA_CHAINS", 3), ("FMA_UNROLL", 5), ("MMA_CHAINS", 7), ("WG_N", 256),
                      ("WG_CHAINS", 1), ("WG_UNROLL", 6)):
        assert f"#define {name} " in src
        src = "\n".join(f"#define {name} {new}" if line.startswith(f"#define {name} ") else line
                        for line in src.splitlines())
    (tmp_path / "probes.cu").write_text(src)
    monkeypatch.setattr(cuda, "KERNELS_DIR", tmp_path)
    assert gpu.measuring.probe_flop("fma_f32", 10, 3, 256) == 2 * 3 * 5 * 10 * 3 * 256
    assert gpu.measuring.probe_flop("mma_bf16", 10, 3, 256) == 2 * 16**3 * 7 * 10 * 3 * 256 / 32
    assert gpu.measuring.probe_flop("wgmma_bf16", 10, 3, 256) == \
        2 * 64 * 256 * 16 * 1 * 6 * 10 * 3 * 256 / 128
    monkeypatch.undo()
    assert (fma, mma, wg) == (gpu.measuring.probe_flop("fma_f32", 10, 3, 256),
                              gpu.measuring.probe_flop("mma_bf16", 10, 3, 256),
                              gpu.measuring.probe_flop("wgmma_bf16", 10, 3, 256))
    with pytest.raises(ValueError, match="kernel"):
        gpu.measuring.probe_flop("copy", 1, 1, 1)


def _nvcc(*args) -> subprocess.CompletedProcess:
    nvcc = cuda.nvcc_path()
    if nvcc is None:
        pytest.skip("no nvcc: the ptxas report and the PTX text come from it")
    return subprocess.run([nvcc, *args], capture_output=True, text=True)


def _kept(kind: str, name: str, arch: str, make) -> str:
    """nvcc's text ``make()`` for kernels_cuda/<name>.cu, kept in the kernel cache under the
    source's text, nvcc's identity and the options (the .cu files include nothing): a second
    run on unchanged code reads it back instead of compiling again."""
    nvcc = cuda.nvcc_path()
    if nvcc is None:
        pytest.skip("no nvcc: the ptxas report and the PTX text come from it")
    key = hashlib.sha256("\0".join([kind, build.file_identity(nvcc), arch, *cuda.OPTIONS,
                                     cuda.source_path(name).read_text()]).encode()).hexdigest()
    path = build.cache_dir() / "cuda-checked" / f"{kind}-{key[:32]}.txt"
    if not path.is_file():
        text = make()
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path.read_text()


def _ptx(name: str, arch: str) -> str:
    def make():
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp, "k.ptx")
            r = _nvcc("-ptx", *cuda.nvcc_arch(arch), *cuda.OPTIONS,
                      str(cuda.source_path(name)), "-o", str(out))
            assert r.returncode == 0, r.stderr
            return out.read_text()
    return _kept("ptx", name, arch, make)


def ptxas_report(name: str, arch: str) -> tuple[dict, str]:
    """({kernel: {"registers", "stack", "spill_stores", "spill_loads"}}, ptxas's whole output)
    for kernels_cuda/<name>.cu built for ``arch`` by nvcc -Xptxas -v."""
    def make():
        with tempfile.TemporaryDirectory() as tmp:
            r = _nvcc("-cubin", *cuda.nvcc_arch(arch), *cuda.OPTIONS, "-Xptxas", "-v",
                      str(cuda.source_path(name)), "-o", str(Path(tmp, "k.cubin")))
        assert r.returncode == 0, r.stderr
        return r.stdout + r.stderr
    text = _kept("ptxas", name, arch, make)
    out, current = {}, None
    for line in text.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            current = out.setdefault(m.group(1), {})
        elif current is not None and (m := re.search(
                r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)),
                           spill_loads=int(m.group(3)))
        elif current is not None and (m := re.search(r"Used (\d+) registers", line)):
            current["registers"] = int(m.group(1))
    return out, text


# the kernels issue 54 added; every kernel of these files is checked, these must be there
NEW_KERNELS = {"mma": {"hgemm_mma", "hgemm_mma_nt", "hgemm_mma_tn"}, "probes": {"wgmma_bf16"},
               "decode": {"matvec_f32", "quantize_q8", "matvec_q8_dp4a", "matvec_q8_f32",
                          "attend", "pick_token"},
               "train": {f"attn_{k}_h{hd}" for k in ("fwd", "bwd_dkdv", "bwd_dq")
                         for hd in (16, 32, 64)} | {"norm_fwd", "cross_entropy", "adamw"}}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
@pytest.mark.parametrize("name", ["gemm", "mma", "probes", "decode", "train"])
def test_kernels_keep_to_registers(name, arch):
    """ptxas's report for chapter 1 and 2's kernels: no register spilled to local memory and
    no stack frame (an accumulator array indexed at run time would show here), and for the
    wgmma probe on sm_90a no wgmma the assembler had to serialize or fence for us."""
    report, text = ptxas_report(name, arch)
    assert NEW_KERNELS.get(name, set()) <= set(report), (sorted(report), text[-3000:])
    bad = {k: v for k, v in report.items()
           if v.get("spill_stores") or v.get("spill_loads") or v.get("stack")}
    assert not bad, f"{name}.cu for {arch}: local memory in {bad}"
    assert "serializ" not in text and "C7519" not in text, text[-3000:]


def test_wgmma_probe_counts_the_instruction_it_issues():
    """The sm_90a build of probes.cu issues wgmma of exactly the shape whose FLOP probe_flop
    counts (WG_M x WG_N x WG_K from the source's constants), with WG_M * WG_N / 128 f32
    accumulators a thread; other targets build a kernel of the same name without wgmma."""
    from smallem.book import gpu
    ptx = _ptx("probes", "sm_90a")
    found = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m(\d+)n(\d+)k(\d+)\.f32\.bf16\.bf16\s*"
                       r"\{([^}]*)\}", ptx)
    assert found, "no bf16 wgmma in the sm_90a PTX of probes.cu"
    shapes = {tuple(map(int, f[:3])) for f in found}
    assert len(shapes) == 1, shapes
    (m, n, k), = shapes
    const = lambda c: build.header_constant(c, "probes.cu", cuda.KERNELS_DIR)  # noqa: E731
    assert (m, n, k) == (const("WG_M"), const("WG_N"), const("WG_K"))
    assert all(len(f[3].split(",")) == m * n // 128 for f in found)
    flop = gpu.measuring.probe_flop("wgmma_bf16", 7, 5, 256)
    assert flop == 2 * m * n * k * const("WG_CHAINS") * const("WG_UNROLL") * 7 * 5 * 256 / 128
    for step in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                 "wgmma.wait_group.sync.aligned"):
        assert step in ptx
    for arch in ("sm_80", "sm_90"):
        other = _ptx("probes", arch)
        assert ".entry wgmma_bf16" in other and "wgmma.mma_async" not in other


def test_probes_build_for_sm_90a_through_nvrtc(monkeypatch, tmp_path):
    """On a compute capability 9.0 device probes.cu is compiled by NVRTC for sm_90a and handed
    to CuPy as machine code: a RawModule built from source would get CuPy's own -arch=sm_90
    beside ours. Checked with stand-ins for CuPy and its NVRTC binding."""
    assert cuda.ARCH_SPECIFIC[("probes", "90")] == "sm_90a"
    calls = {}

    class NVRTC:
        getVersion = staticmethod(lambda: (12, 9))
        createProgram = staticmethod(lambda code, name, h, i: calls.setdefault("name", name))
        compileProgram = staticmethod(lambda prog, opts: calls.setdefault("options", list(opts)))
        getCUBIN = staticmethod(lambda prog: b"machine code")
        destroyProgram = staticmethod(lambda prog: None)

    class RawModule:
        def __init__(self, **kw):
            calls["module"] = kw

        def compile(self):
            calls["compiled"] = Path(calls["module"]["path"]).read_bytes()

    monkeypatch.setitem(sys.modules, "cupy", type(sys)("cupy"))
    monkeypatch.setattr(sys.modules["cupy"], "RawModule", RawModule, raising=False)
    monkeypatch.setattr(cuda, "_nvrtc", lambda: NVRTC)
    monkeypatch.setenv("CUPY_CACHE_DIR", str(tmp_path))
    cuda._module.cache_clear()
    try:
        cuda._module("probes", "d1", 0, "code", "sm_90a")
    finally:
        cuda._module.cache_clear()
    assert calls["options"][0] == "-arch=sm_90a" and calls["name"] == "probes.cu"
    assert set(calls["module"]) == {"path"} and calls["compiled"] == b"machine code"


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
