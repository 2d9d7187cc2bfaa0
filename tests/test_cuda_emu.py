"""kernels_cuda/gemm.cu run on the CPU (tests/cuda_emu/emu.h), against numpy, on awkward shapes.

No GPU is needed: every CUDA thread becomes a host thread, blocks run one after another and
the wmma / cp.async helpers are replaced by plain C++ with the semantics of the PTX
instructions. This checks what is most easily wrong in a kernel written without a GPU at
hand - indices, tile edges, bounds, the transposed layouts - and nothing about speed.
"""

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smallem import checks
from smallem.plumbing import cuda

HERE = Path(__file__).parent / "cuda_emu"
CXX = shutil.which("g++") or shutil.which("clang++")
SHAPES = [(1, 1, 1), (17, 31, 5), (130, 70, 45), (33, 129, 72), (136, 72, 44)]


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler (g++ or clang++) to build the CUDA emulator")
    src = cuda.source_path("gemm").read_text()
    dyn = "extern __shared__ __align__(128) unsigned char dyn_smem[];"
    assert dyn in src, "the emulator expects gemm.cu's dynamic shared memory declaration"
    src = src.replace(dyn, "unsigned char *dyn_smem = emu_dyn_smem;")
    tmp = tmp_path_factory.mktemp("emu")
    unit = tmp / "emu_gemm.cpp"
    unit.write_text((HERE / "emu.h").read_text() + '\n#line 1 "kernels_cuda/gemm.cu"\n' + src
                    + '\n#line 1 "tests/cuda_emu/launch.cpp"\n' + (HERE / "launch.cpp").read_text())
    lib = tmp / "libemu.so"
    r = subprocess.run([CXX, "-O2", "-std=c++20", "-pthread", "-shared", "-fPIC", "-w",
                        str(unit), "-o", str(lib)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return open_lib(lib)


def open_lib(path):
    so = ctypes.CDLL(str(path))
    so.emu_gemm.restype = ctypes.c_int
    so.emu_gemm.argtypes = [ctypes.c_char_p] + [ctypes.c_uint] * 4 + [ctypes.c_int] * 3 + \
                           [ctypes.c_void_p] * 3
    so.emu_f32_to_bf16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
    so.emu_guarded_copy.restype = ctypes.c_void_p
    so.emu_guarded_copy.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    so.path = str(path)
    return so


def run(emu, func, rung, M, N, K, A, B):
    C = np.full((M, N), np.nan, np.float32)  # NaN: an element never written shows up
    gx, gy = rung.grid(M, N)
    bx, by = (tuple(rung.threads) + (1,))[:2]
    rc = emu.emu_gemm(func.encode(), gx, gy, bx, by, M, N, K, A.ctypes.data, B.ctypes.data,
                      C.ctypes.data)
    assert rc == 0, f"emulator does not know {func}"
    return C


def inputs(rng, M, N, K, dtype):
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    if dtype == "bf16":
        A, B = cuda.bf16_to_f32(cuda.bf16_bits(A)), cuda.bf16_to_f32(cuda.bf16_bits(B))
    return A, B, (A.astype(np.float64) @ B.astype(np.float64)).astype(np.float32)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("rung", [r.name for r in cuda.GPU_LADDER])
def test_rung_on_cpu(emu, rung, shape, rng):
    r = cuda.RUNGS[rung]
    M, N, K = shape
    A, B, want = inputs(rng, M, N, K, r.dtype)
    if r.dtype == "bf16":
        A, B = cuda.bf16_bits(A), cuda.bf16_bits(B)
    got = run(emu, r.func, r, M, N, K, A, B)
    checks.assert_close(got, want, k=K, name=f"{rung} {shape} (emulated)")


@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("func", sorted(cuda.VARIANTS.items()), ids=lambda kv: kv[1])
def test_transposed_variants_on_cpu(emu, func, shape, rng):
    (kind, ta, tb), name = func
    M, N, K = shape
    A, B, want = inputs(rng, M, N, K, kind)
    a = np.ascontiguousarray(A.T) if ta else A
    b = np.ascontiguousarray(B.T) if tb else B
    if kind == "bf16":
        a, b = cuda.bf16_bits(a), cuda.bf16_bits(b)
    r = cuda.RUNGS[cuda.FINAL_BF16 if kind == "bf16" else cuda.FINAL_F32]
    got = run(emu, name, r, M, N, K, a, b)
    checks.assert_close(got, want, k=K, name=f"{name} {shape} (emulated)")


# transposed kernels of earlier rungs (the final ones are in cuda.VARIANTS)
OTHER_VARIANTS = [("sgemm_vec_nt", "vec", False, True), ("sgemm_vec_tn", "vec", True, False),
                  ("hgemm_wmma_nt", "wmma", False, True), ("hgemm_wmma_tn", "wmma", True, False)]


@pytest.mark.parametrize("spec", OTHER_VARIANTS, ids=lambda s: s[0])
def test_other_transposed_kernels_on_cpu(emu, spec, rng):
    name, rung, ta, tb = spec
    r = cuda.RUNGS[rung]
    M, N, K = 70, 130, 45
    A, B, want = inputs(rng, M, N, K, r.dtype)
    a = np.ascontiguousarray(A.T) if ta else A
    b = np.ascontiguousarray(B.T) if tb else B
    if r.dtype == "bf16":
        a, b = cuda.bf16_bits(a), cuda.bf16_bits(b)
    got = run(emu, name, r, M, N, K, a, b)
    checks.assert_close(got, want, k=K, name=f"{name} (emulated)")


def test_unaligned_rows_fall_back_to_scalar_loads(emu, rng):
    M, N, K = 40, 36, 36  # K, N multiples of 4 and 8, but A starts 4 bytes into its buffer
    buf = rng.standard_normal(M * K + 1).astype(np.float32)
    A = buf[1:].reshape(M, K)
    assert A.ctypes.data % 16
    B = rng.standard_normal((K, N)).astype(np.float32)
    got = run(emu, "sgemm_vec", cuda.RUNGS["vec"], M, N, K, A, B)
    checks.assert_close(got, (A.astype(np.float64) @ B).astype(np.float32), k=K)


def test_f32_to_bf16_on_cpu(emu, rng):
    x = (rng.standard_normal(1001) * 1e3).astype(np.float32)
    x[:3] = [np.nan, np.inf, -0.0]
    y = np.zeros(x.size, np.uint16)
    emu.emu_f32_to_bf16(x.ctypes.data, y.ctypes.data, x.size)
    assert np.array_equal(y, cuda.bf16_bits(x))


GUARD_CHILD = """
import ctypes, sys
import numpy as np
sys.path[:0] = [{root!r}, {tests!r}]
from smallem.plumbing import cuda
from test_cuda_emu import open_lib
so = open_lib({lib!r})
kernels = [(r.func, r, r.dtype) for r in cuda.GPU_LADDER]
kernels += [(name, cuda.RUNGS[cuda.FINAL_BF16 if kind == "bf16" else cuda.FINAL_F32], kind, ta, tb)
            for (kind, ta, tb), name in cuda.VARIANTS.items()]
from test_cuda_emu import OTHER_VARIANTS
kernels += [(n, cuda.RUNGS[r], cuda.RUNGS[r].dtype, ta, tb) for n, r, ta, tb in OTHER_VARIANTS]
rng = np.random.default_rng(0)
def guarded(a):
    return so.emu_guarded_copy(a.ctypes.data, a.nbytes)
for M, N, K in [(17, 31, 5), (40, 24, 20), (136, 72, 44), (20, 136, 12), (130, 70, 45)]:
    for spec in kernels:
        func, r, kind = spec[:3]
        ta, tb = (spec[3], spec[4]) if len(spec) > 3 else (False, False)
        dt = np.uint16 if kind == "bf16" else np.float32
        A = rng.integers(0, 2**14, (K, M) if ta else (M, K)).astype(dt)
        B = rng.integers(0, 2**14, (N, K) if tb else (K, N)).astype(dt)
        C = np.zeros((M, N), np.float32)
        gx, gy = r.grid(M, N)
        bx, by = (tuple(r.threads) + (1,))[:2]
        print(func, M, N, K, flush=True)
        so.emu_gemm(func.encode(), gx, gy, bx, by, M, N, K, guarded(A), guarded(B), guarded(C))
print("no access outside the matrices")
"""


@pytest.mark.slow
def test_no_access_outside_the_matrices(emu):
    """Each matrix ends (and starts) at an inaccessible page: reading a float4 or a 16-byte
    bf16 chunk past the last element, or storing past C, kills the child with SIGSEGV."""
    code = GUARD_CHILD.format(root=str(HERE.parent.parent), tests=str(HERE.parent), lib=emu.path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (f"a kernel touched memory outside its matrices (exit {r.returncode}); "
                               f"last launch: {r.stdout.strip().splitlines()[-1:]}\n{r.stderr[-2000:]}")
