"""Chapter 2's performance targets, checked on its record: benchmarks check speed, tests
don't. Each is judged by :func:`smallem.book.compare.against` on the paired rounds: met only
when the one-sided signed-rank test says smallem's per-round ratio is at or above the target (a parity
target, "smallem >= numpy", at the parity margin)."""

from __future__ import annotations

from smallem.product.gemm import BF16_PATHS
from .. import compare, records
from .bf16 import AMX_TARGET
from .reading import _peak, shape_pairs

PEAK_SHARE = 0.85  # the final GEMM at 2048^3, against chapter 1's f32 probe on every core


def _pair(rec: dict, name: str, **params) -> tuple[dict, dict] | None:
    ours = records.results(rec, name, impl="smallem", **params)
    theirs = records.results(rec, name, impl="numpy", **params)
    return (ours[0], theirs[0]) if ours and theirs else None


def targets(rec: dict, rec_dir=None) -> list[str]:
    """The performance targets, checked on a record (benchmarks check speed, tests don't)."""
    peak, src = _peak(rec, rec_dir)
    out = []
    for n in (1024, 2048, 4096):
        pair = _pair(rec, "sweep", n=n)
        if not pair:
            out.append(f"smallem >= numpy at {n}^3: not measured (quick run)")
            continue
        ours, theirs = pair
        v = compare.against(ours, theirs, 1.0)
        out.append(f"smallem >= numpy at {n}^3: " + v.text(
            f"{ours['value']['median']:.1f} vs {theirs['value']['median']:.1f} Gop/s, "
            f"{compare.fmt(v.ratio)} times, target 1"))
        if n == 2048:
            v = compare.against_bound(ours, peak, PEAK_SHARE)
            out.append(f">= {100 * PEAK_SHARE:.0f} % of the f32 peak at 2048^3: " + v.text(
                f"{100 * v.ratio:.0f} % of {peak:.1f} Gop/s ({src}), target "
                f"{100 * PEAK_SHARE:.0f} %"))
    pairs = shape_pairs(rec)  # the model's products, forward and backward
    if rec["settings"].get("quick") or not pairs:  # a quick run shrinks them 16 times
        why = "quick run" if pairs else "not in this record"
        out.append(f"smallem >= numpy on the model's shapes: not measured at their size ({why})")
        pairs = []
    for label, _, _ in pairs:
        ours, theirs = _pair(rec, "shape", label=label)
        v = compare.against(ours, theirs, 1.0)
        out.append(f"smallem >= numpy on {label}: " + v.text(
            f"{ours['value']['median']:.1f} vs {theirs['value']['median']:.1f} Gop/s, "
            f"{compare.fmt(v.ratio)} times, target 1"))
    return out + [bf16_target(rec), amx_target(rec)]


def amx_target(rec: dict) -> str:
    """The AMX path's last rung against the tile probe timed in the same rounds (issue 66)."""
    what = f"AMX bf16 GEMM >= {100 * AMX_TARGET:.0f} % of the AMX bf16 probe"
    rungs = sorted(records.results(rec, "amx_rung"), key=lambda r: r["params"]["rung"])
    probe = records.results(rec, "amx_probe")
    if not rungs or not probe:
        return f"{what}: not measured (no AMX tiles, or a record from before the AMX ladder)"
    v = compare.against(rungs[-1], probe[0], AMX_TARGET)
    p = rungs[-1]["params"]
    return f"{what}: " + v.text(f"{100 * v.ratio:.0f} % at {p['M']}x{p['K']}x{p['N']}, "
                                f"target {100 * AMX_TARGET:.0f} %")



BF16_TARGET = 1.7  # bf16 Gop/s over f32 Gop/s, where AVX512_BF16 exists



def bf16_target(rec: dict) -> str:
    """The bf16 target on a record's "dtype" results (f32 and each bf16 path timed in the same
    rounds): judged on the slowest shape's fastest path, with the probes' ratio if measured."""
    what = f"bf16 >= {BF16_TARGET}x f32 where AVX512_BF16 exists"
    if not rec["settings"].get("native_bf16"):
        return f"{what}: not applicable (no AVX512_BF16 here)"
    verdicts = []
    for r in records.results(rec, "dtype", dtype="f32"):
        p = r["params"]
        bf16 = [b for q in BF16_PATHS if (b := _bf16_result(rec, q, p["M"], p["K"], p["N"]))]
        if bf16:  # a size timed in f32 only has nothing to compare
            best = max(bf16, key=lambda b: records.median(b))
            verdicts.append((f"{p['M']}x{p['K']}x{p['N']}",
                             compare.against(best, r, BF16_TARGET)))
    if not verdicts:
        return f"{what}: not measured"
    shape, worst = min(verdicts, key=lambda sv: (sv[1].met, sv[1].ratio))
    line = f"{what}: " + worst.text(
        f"the faster bf16 path {compare.fmt(worst.ratio)} times f32 at {shape}, the shape "
        f"furthest from the target, target {BF16_TARGET:g}")
    peaks = [records.results(rec, "peak", kind=k) for k in ("f32", "bf16")]
    if all(peaks):
        ratio = records.median(peaks[1][0]) / records.median(peaks[0][0])
        line += f"; the bf16 dot probe runs at {ratio:.2f}x the f32 FMA probe on this CPU"
    return line


def _bf16_result(rec: dict, path: str, M, K, N) -> dict | None:
    for r in records.results(rec, "dtype", dtype="bf16", M=M, K=K, N=N):
        # records made before the two paths have one bf16 result, on the path the build had
        got = r["params"].get("path", "native" if rec["settings"]["native_bf16"] else "widen")
        if got == path:
            return r
    return None
