"""Chapter 2's tensor-core target on the GPU: our best bf16 rung against cuBLAS's bf16 product
at 4096³, in alternated rounds (results ``tc_target`` of record ``ch2.gpu``), judged by the
one-sided test of the per-round ratios at TC_TARGET."""

from __future__ import annotations

from smallem.plumbing import cuda
from smallem.cpu.timing import Timing, quick_mode
from .. import compare, records
from .measuring import cublas_bf16, gpu_rounds, random_matrix, run_ch2

TC_TARGET = 0.5   # our bf16 product at half cuBLAS's or more
TC_N = 4096
TC_ROUNDS = 7


def measure_tc_target(rec, quick: bool, rung: str | None = None) -> None:
    """``rung`` (default: the last bf16 rung of the ladder) and cuBLAS on the same n³ bf16
    inputs, one CUDA-event sample of each a round, the order alternating."""
    cp = cuda.require()
    n, rounds = (256, 2) if quick else (TC_N, TC_ROUNDS)
    rung = rung or [r.name for r in cuda.GPU_LADDER if r.dtype == "bf16"][-1]
    a16, b16 = cuda.to_bf16(random_matrix((n, n), 5)), cuda.to_bf16(random_matrix((n, n), 6))
    out = cp.empty((n, n), dtype=cp.float32)
    cases = {"ours": lambda: cuda.gemm(rung, a16, b16, out=out),
             "cublas": lambda: cublas_bf16(a16, b16, out)}
    samples = gpu_rounds(cases, rounds, warmup=2)
    for k, sec in samples.items():
        t = Timing(sec)
        rec.add("tc_target", "Gop/s", t.rate(2.0 * n**3 / 1e9),
                seconds={**t.stats(), "samples": sec}, impl=k, rung=rung, n=n)
    del a16, b16, out
    cp.get_default_memory_pool().free_all_blocks()


def run_ch2_with_target(quick: bool | None = None, progress: bool = True) -> records.Record:
    """Chapter 2's GPU record: the ladder and sweeps (:func:`run_ch2`), then the target's rounds."""
    quick = quick_mode() if quick is None else quick
    rec = run_ch2(quick=quick, progress=progress)
    measure_tc_target(rec, quick)
    return rec


def tc_values(rec: dict | None) -> dict:
    """The target's verdict for chapter 2's page: ``gpu.tc_measured`` (the record has the
    target's rounds; an older record does not) and the verdict with its footnote."""
    ours = records.results(rec, "tc_target", impl="ours") if rec else []
    theirs = records.results(rec, "tc_target", impl="cublas") if rec else []
    if not (ours and theirs):
        return {"gpu.tc_measured": False, "gpu.tc_target": None}
    v = compare.against(ours[0], theirs[0], TC_TARGET)
    return {"gpu.tc_measured": True,
            "gpu.tc_target": v.text(f"{100 * v.ratio:.0f} % of cuBLAS at "
                                    f"{ours[0]['params']['n']}³, target "
                                    f"{100 * TC_TARGET:.0f} %, rung "
                                    f"{ours[0]['params']['rung']}")}
