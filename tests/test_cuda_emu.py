"""kernels_cuda/gemm.cu and mma.cu run on the CPU (tests/cuda_emu/emu.h, mma.h), against
numpy, on awkward shapes.

No GPU is needed: every CUDA thread becomes a fiber on the calling thread (switched where it
waits at a barrier), blocks run one after another and
the wmma / cp.async / ldmatrix / mma helpers are replaced by plain C++ with the semantics of
the PTX instructions (mma.h keeps the lanes' fragment layouts). This checks what is most
easily wrong in a kernel written without a GPU at hand - indices, tile edges, bounds, the
transposed layouts, the order of copies and waits - and nothing about speed.
"""

import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smallem import checks
from smallem.plumbing import build, cuda

HERE = Path(__file__).parent / "cuda_emu"
CXX = shutil.which("g++") or shutil.which("clang++")
SHAPES = [(1, 1, 1), (17, 31, 5), (130, 70, 45), (33, 129, 72), (136, 72, 44)]


def emu_headers() -> str:
    """emu.h, and mma.h after it unless emu.h includes it itself."""
    text = (HERE / "emu.h").read_text()
    if '#include "mma.h"' not in text:
        text += '\n#line 1 "tests/cuda_emu/mma.h"\n' + (HERE / "mma.h").read_text()
    return text


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    if CXX is None:
        pytest.skip("no C++ compiler (g++ or clang++) to build the CUDA emulator")
    dyn = "extern __shared__ __align__(128) unsigned char dyn_smem[];"
    text = emu_headers()
    for name in ("gemm", "mma"):  # one unit: launch.cpp calls the kernels of both
        src = cuda.source_path(name).read_text()
        assert dyn in src, f"the emulator expects {name}.cu's dynamic shared memory declaration"
        src = src.replace(dyn, "unsigned char *dyn_smem = emu_dyn_smem;")
        text += f'\n#line 1 "kernels_cuda/{name}.cu"\n' + src
    tmp = tmp_path_factory.mktemp("emu")
    unit = tmp / "emu_gemm.cpp"
    unit.write_text(text + '\n#line 1 "tests/cuda_emu/launch.cpp"\n'
                    + (HERE / "launch.cpp").read_text())
    lib = tmp / "libemu.so"
    r = subprocess.run([CXX, "-O2", "-std=c++20", "-pthread", "-shared", "-fPIC", "-w", f"-I{HERE}",
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


def run(emu, func, rung, M, N, K, A, B, C=None):
    if C is None:
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


# rung 9 (mma.cu) beyond SHAPES, whose K fit in 3 tiles of 32 - as many as its prologue
# issues: K of 5 to 9 tiles, so the 4 stages wrap around and tile kt + 3 refills the stage tile
# kt - 1 was read from; K a multiple of 8 (cp.async with zero fill) or not (element loads)
MMA_SHAPES = [(70, 130, 200), (129, 72, 264), (40, 24, 136), (1, 9, 161)]
MMA_KERNELS = {(False, False): "hgemm_mma", **cuda.TRANSPOSED["mma"]}


def transposed_inputs(rng, M, N, K, ta, tb):
    """bf16 bits of A (K x M if ta) and B (N x K if tb), and A B in float32."""
    A, B, want = inputs(rng, M, N, K, "bf16")
    a = cuda.bf16_bits(np.ascontiguousarray(A.T) if ta else A)
    b = cuda.bf16_bits(np.ascontiguousarray(B.T) if tb else B)
    return a, b, want


@pytest.mark.parametrize("shape", MMA_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("trans", sorted(MMA_KERNELS), ids=lambda t: MMA_KERNELS[t])
def test_mma_pipeline_wraps_around(emu, trans, shape, rng):
    M, N, K = shape
    a, b, want = transposed_inputs(rng, M, N, K, *trans)
    got = run(emu, MMA_KERNELS[trans], cuda.RUNGS["mma"], M, N, K, a, b)
    checks.assert_close(got, want, k=K, name=f"{MMA_KERNELS[trans]} {shape} (emulated)")


@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("func", sorted(cuda.TRANSPOSED["mma"].items()), ids=lambda kv: kv[1])
def test_mma_transposed_on_cpu(emu, func, shape, rng):
    (ta, tb), name = func
    M, N, K = shape
    a, b, want = transposed_inputs(rng, M, N, K, ta, tb)
    got = run(emu, name, cuda.RUNGS["mma"], M, N, K, a, b)
    checks.assert_close(got, want, k=K, name=f"{name} {shape} (emulated)")


def _shifted(x):
    """A copy of x whose data starts one element into its buffer (so 2 or 4 bytes past the
    allocation's alignment)."""
    buf = np.empty(x.size + 1, x.dtype)
    y = buf[1:].reshape(x.shape)
    y[...] = x
    return y


@pytest.mark.parametrize("trans", sorted(MMA_KERNELS), ids=lambda t: MMA_KERNELS[t])
def test_mma_unaligned_rows_and_pointers(emu, trans, rng):
    """Rung 9 where 16-byte loads are not allowed: rows whose length (K; M for A^T, N for B)
    is no multiple of 8; then rows that are, in matrices that start 2 bytes (A, B) and 4 bytes
    (C) into their buffers, so that only element loads and 4-byte stores are legal."""
    func = MMA_KERNELS[trans]
    for (M, N, K), shift in (((70, 130, 45), False), ((43, 29, 37), False), ((40, 72, 112), True)):
        a, b, want = transposed_inputs(rng, M, N, K, *trans)
        C = np.full((M, N), np.nan, np.float32)
        if shift:
            a, b, C = _shifted(a), _shifted(b), _shifted(C)
            assert a.ctypes.data % 16 and b.ctypes.data % 16 and C.ctypes.data % 8
        got = run(emu, func, cuda.RUNGS["mma"], M, N, K, a, b, C)
        checks.assert_close(got, want, k=K, name=f"{func} {(M, N, K)} shifted={shift}")


def test_mma_rung_declares_the_kernels_shared_memory():
    """The ladder launches rung 9 with the tile, threads and dynamic shared memory that
    mma.cu's constants give its four stages."""
    const = lambda name: build.header_constant(name, "mma.cu", cuda.KERNELS_DIR)  # noqa: E731
    stages = const("MM_STAGES") * 2 * const("MM_BM") * const("MM_BK") * 2
    r = cuda.RUNGS["mma"]
    assert r.smem == stages and r.tile == (const("MM_BM"), const("MM_BN")) and r.threads == (256,)
    assert r.smem <= 64 * 1024, "rung 9 keeps to rung 8's 64 KB of shared memory a block"


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
kernels += [(name, cuda.RUNGS[rung], cuda.RUNGS[rung].dtype, ta, tb)
            for rung, names in cuda.TRANSPOSED.items() for (ta, tb), name in names.items()]
from test_cuda_emu import OTHER_VARIANTS
kernels += [(n, cuda.RUNGS[r], cuda.RUNGS[r].dtype, ta, tb) for n, r, ta, tb in OTHER_VARIANTS]
kernels = [k for k in kernels if k[0].startswith({only!r})]
rng = np.random.default_rng(0)
def guarded(a):
    return so.emu_guarded_copy(a.ctypes.data, a.nbytes)
for M, N, K in {shapes!r}:
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


def guarded_run(emu, only: str, shapes: list):
    """GUARD_CHILD in a child process, for the kernels whose names start with ``only``."""
    code = GUARD_CHILD.format(root=str(HERE.parent.parent), tests=str(HERE.parent), lib=emu.path,
                              only=only, shapes=shapes)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (f"a kernel touched memory outside its matrices (exit {r.returncode}); "
                               f"last launch: {r.stdout.strip().splitlines()[-1:]}\n{r.stderr[-2000:]}")


@pytest.mark.slow
def test_no_access_outside_the_matrices(emu):
    """Each matrix ends (and starts) at an inaccessible page: reading a float4 or a 16-byte
    bf16 chunk past the last element, or storing past C, kills the child with SIGSEGV."""
    guarded_run(emu, "", [(17, 31, 5), (40, 24, 20), (136, 72, 44), (20, 136, 12), (130, 70, 45)])


def test_mma_touches_nothing_outside_the_matrices(emu):
    """Rung 9 and its transposed kernels between guard pages, on shapes where the matrices
    end on a 16-byte boundary (so cp.async and its zero fill are taken at every edge: rows past
    M or N, k past K, in A, A^T, B and B^T) and on shapes where they do not."""
    guarded_run(emu, "hgemm_mma", [(17, 31, 5), (33, 40, 24), (40, 24, 136), (130, 136, 72),
                                   (129, 72, 264)])


DEADLOCK = r"""
import sys
sys.path[:0] = [{tests!r}]
import numpy as np
from cuda_emu.emulator import Emulator
code = 'extern "C" __global__ void split(float *x) {{ if (threadIdx.x < 16) __syncwarp(); else __syncthreads(); x[threadIdx.x] = 1; }}\n'
code += 'extern "C" __global__ void early(float *x) {{ if (threadIdx.x >= 40) return; __syncthreads(); x[threadIdx.x] = 1; }}\n'
emu = Emulator(code, "deadlock.cu")
x = np.zeros(64, np.float32)
emu.launch("early", (2,), (64,), (x,))
print("early return ran", int(x.sum()), flush=True)
emu.launch("split", (1,), (32,), (x,))
print("not caught")
"""


def test_a_deadlock_is_reported_not_hung_on():
    """Threads that return early leave the block's barrier (the kernel runs); lanes of one
    warp waiting at two different barriers can never go on: the run stops with the
    emulator's message (a child process: it aborts), instead of hanging."""
    if CXX is None:
        pytest.skip("no C++ compiler (g++ or clang++) to build the CUDA emulator")
    r = subprocess.run([sys.executable, "-c", DEADLOCK.format(tests=str(HERE.parent))],
                       capture_output=True, text=True, timeout=300)
    assert "early return ran 40" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert r.returncode != 0 and "not caught" not in r.stdout, r.stdout
    assert "CUDA emulator: deadlock" in r.stderr, r.stderr[-2000:]
