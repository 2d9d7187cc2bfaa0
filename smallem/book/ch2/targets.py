"""Chapter 2's performance targets, checked on its record: benchmarks check speed, tests
don't. A target "smallem >= numpy" is met when the medians say so, or when the sign test on
the paired rounds cannot call smallem slower (within the host's noise)."""

from __future__ import annotations

from ...gemm import BF16_PATHS
from .. import compare, records
from .reading import _bf16_value, _pair_rounds, _peak, shape_pairs


def targets(rec: dict, rec_dir=None) -> list[str]:
    """The performance targets, checked on a record (benchmarks check speed, tests don't)."""
    peak, src = _peak(rec, rec_dir)
    out = []
    for n in (1024, 2048, 4096):
        found = records.results(rec, "sweep", impl="smallem", n=n)
        if not found:
            out.append(f"smallem >= numpy at {n}^3: not measured (quick run)")
            continue
        ours = found[0]["value"]["median"]
        theirs = records.value(rec, "sweep", impl="numpy", n=n)
        out.append(f"smallem >= numpy at {n}^3: {_met(rec, 'sweep', ours, theirs, n=n)} "
                   f"({ours:.1f} vs {theirs:.1f} Gop/s{_rounds_note(rec, 'sweep', n=n)})")
        if n == 2048:
            met = "met" if ours >= 0.85 * peak else "MISSED"
            out.append(f">= 85 % of the f32 peak at 2048^3: {met} "
                       f"({100 * ours / peak:.0f} % of {peak:.1f} Gop/s, {src})")
    pairs = shape_pairs(rec)  # the model's products, forward and backward
    if rec["settings"].get("quick") or not pairs:  # a quick run shrinks them 16 times
        why = "quick run" if pairs else "not in this record"
        out.append(f"smallem >= numpy on the model's shapes: not measured at their size ({why})")
        pairs = []
    for label, ours, theirs in pairs:
        out.append(f"smallem >= numpy on {label}: {_met(rec, 'shape', ours, theirs, label=label)} "
                   f"({ours:.1f} vs {theirs:.1f} Gop/s{_rounds_note(rec, 'shape', label=label)})")
    return out + [bf16_target(rec)]



def _met(rec: dict, name: str, ours: float, theirs: float, **params) -> str:
    """A target "smallem >= numpy": met when the medians say so, and also when they do not
    but the sign test on the paired rounds cannot call smallem slower (within the noise)."""
    if ours >= theirs:
        return "met"
    rounds = _pair_rounds(rec, name, **params)
    if rounds and compare.sign_test(*rounds) >= compare.SIGN_LEVEL:
        return "met (tied: the sign test does not call smallem slower)"
    return "MISSED"


def _rounds_note(rec: dict, name: str, **params) -> str:
    """The medians decide a target; the rounds say how close the call was."""
    rounds = _pair_rounds(rec, name, **params)
    return "" if rounds is None else f"; ahead in {rounds[0]} of {rounds[1]} paired rounds"



BF16_TARGET = 1.7  # bf16 Gop/s over f32 Gop/s, where AVX512_BF16 exists



def bf16_target(rec: dict) -> str:
    """The bf16 target on a record's "dtype" results, with the probes' ratio if measured."""
    what = f"bf16 >= {BF16_TARGET}x f32 where AVX512_BF16 exists"
    if not rec["settings"].get("native_bf16"):
        return f"{what}: not applicable (no AVX512_BF16 here)"
    ratios = []
    for r in records.results(rec, "dtype", dtype="f32"):
        p = r["params"]
        bf16 = [g for q in BF16_PATHS if (g := _bf16_value(rec, q, p["M"], p["K"], p["N"]))]
        if bf16:  # a size timed in f32 only has nothing to compare
            ratios.append(max(bf16) / r["value"]["median"])
    if not ratios:
        return f"{what}: not measured"
    line = (f"{what}: {'met' if min(ratios) >= BF16_TARGET else 'MISSED'} "
            f"(the faster bf16 path: {min(ratios):.2f}x to {max(ratios):.2f}x f32)")
    peaks = [records.results(rec, "peak", kind=k) for k in ("f32", "bf16")]
    if all(peaks):
        ratio = peaks[1][0]["value"]["median"] / peaks[0][0]["value"]["median"]
        line += f"; the bf16 dot probe runs at {ratio:.2f}x the f32 FMA probe on this CPU"
    return line
