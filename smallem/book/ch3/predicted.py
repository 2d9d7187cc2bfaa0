"""What this machine's own measurements predict for each rung of chapter 3's climb: chapter
1's peaks, chapter 2's product rates and bf16/f32 ratio, the rungs' profiles, and the time the
fused kernels save, each turned into a rung's speed (:func:`predicted`)."""

from __future__ import annotations

import numpy as np

from smallem.product.gemm import LADDER
from smallem.training.model import CONFIGS, Workspace, get_config
from smallem.training.train import newton_schulz_flops
from .. import ch1, figures, records
from ..ch2.bf16 import _bf16_value
from .measuring import AT, F32_TOP, FUSED_OPS, MUON_GROUP, OP_GROUPS

f = figures.fmt


def _peak(rec_dir, kind: str, threads: int):
    """Chapter 1's measured peak of ``kind`` at ``threads`` (or the most threads measured)."""
    facts = ch1.facts(rec_dir)
    if facts is None:
        return None
    peaks = {th: v for (k, th), v in facts["peak"].items() if k == kind}
    return peaks.get(threads, peaks[max(peaks)]) if peaks else None


def _peaks(rec, rec_dir, threads: int) -> dict:
    """Chapter 1's f32 peak and the bf16 peak of the path the step's bf16 products ran on:
    the AMX tiles' (tdpbf16ps) where the bf16 path is AMX and chapter 1 measured it, else the
    vdpbf16ps probe's; "bf16_kind" names which. None where the bf16 products widen to f32
    (a CPU with neither): they run on the f32 FMAs, whose peak is then their precision's."""
    if rec["settings"].get("bf16_path") == "widen":
        return {"f32": _peak(rec_dir, "f32", threads), "bf16": None, "bf16_kind": None}
    amx = rec["settings"].get("bf16_path") == "amx" and _peak(rec_dir, "amx_bf16", threads)
    kind = "amx_bf16" if amx else "bf16"
    return {"f32": _peak(rec_dir, "f32", threads), "bf16": _peak(rec_dir, kind, threads),
            "bf16_kind": "bf16 (AMX)" if amx else "bf16"}



def _profile(rec, rung: int) -> dict:
    """Rung ``rung``'s profiled seconds per step, by group of OP_GROUPS."""
    out: dict = {}
    for r in records.results(rec, "op_seconds", rung=rung):
        group = OP_GROUPS.get(r["params"]["op"], "Python and the rest")
        out[group] = out.get(group, 0.0) + records.median(r)
    return out


def modern_vs_gpt2(p6: dict, p7: dict) -> dict:
    """The modern block's products and attention over GPT-2's, from the profiles of rungs 7
    and 6 (one profiled step each; None where either lacks the part)."""
    return {f"ch3.modern_{key}_vs6": (p7[part] / p6[part] if p6 and p7 and p6.get(part)
                                      and p7.get(part) else None)
            for part, key in (("matrix products (+ bias)", "products"), ("attention", "attention"))}


def fused_saving(rec) -> tuple[float, int] | None:
    """(seconds a step saves through the fused kernels, their calls per step): each fused
    kernel's time saved per call (the fused-op timings, at the step's shapes) times its calls
    in rung 5's profiled step, or, in a record made before the calls were counted, once per
    block each (GPT's block: three forward, the GELU backward); None without the timings."""
    times: dict = {}
    for r in records.results(rec, "fused_op"):
        times.setdefault(r["params"]["op"], {})[r["params"]["fused"]] = r["seconds"]["median"]
    times = {op: t for op, t in times.items() if op in FUSED_OPS and {False, True} <= set(t)}
    if not times:
        return None
    counted = rec["settings"].get("op_calls", {}).get(str(F32_TOP))
    layers = rec["settings"]["config"]["n_layer"]
    calls = {op: counted.get(FUSED_OPS[op], 0) if counted else layers for op in times}
    return (sum(calls[op] * (t[False] - t[True]) for op, t in times.items()),
            sum(calls.values()))


def _predicted_from_products(rec_dir, th: int, fpt: float) -> dict[int, tuple[float, str]]:
    """Rungs 0 and 1: every FLOP of the step at chapter 2's product rate, numpy's and ours,
    on as many threads; {} without chapter 2's record."""
    out = {}
    if records.exists("ch2.gemm", rec_dir):
        g = records.load("ch2.gemm", rec_dir)
        n = g["settings"]["n_ladder"]
        for i, name, params, who in ((AT["numpy"], "numpy", {"threads": th}, "numpy's"),
                                     (AT["kernels"], "rung", {"rung": LADDER["threads"].index},
                                      "our")):
            found = [records.median(r) for r in records.results(g, name, M=n, **params)]
            # a bound is the best the product reached: numpy's in the ladder's rounds and in
            # the sizes table's; ours as the ladder's last rung, and as the package's matmul
            # (which the step calls) in the sizes table and as the f32 inputs of the bf16
            # table, each timed in a run of its own
            impl = "numpy" if i == AT["numpy"] else "smallem"
            found += [records.median(r) for r in records.results(g, "sweep", impl=impl, n=n)]
            if i == AT["kernels"]:
                found += [records.median(r) for r in records.results(
                    g, "dtype", dtype="f32", M=n, K=n, N=n)]
            if found:
                out[i] = (max(found) * 1e9 / fpt,
                          f"every FLOP at {who} {'best ' if len(found) > 1 else ''}{n}³ product rate")
    return out


def _dtype_ratios(g: dict, path: str, threads: int) -> dict[tuple, float]:
    """Chapter 2's bf16 GEMM over its f32 GEMM on ``path``, at each shape (M, K, N) its
    record measured on ``threads`` threads; a record made before the paths were told apart
    has one bf16 result, on the path its build had."""
    out = {}
    for r in records.results(g, "dtype", dtype="f32"):
        M, N, K = (r["params"][k] for k in "MNK")
        if r["params"].get("threads", g["settings"].get("threads")) != threads:
            continue
        b = _bf16_value(g, path, M, K, N)
        if b:
            out[(M, K, N)] = b / records.median(r)
    return out


def bf16_gemm(rec, rec_dir) -> dict | None:
    """Chapter 2's measured bf16 GEMM over its f32 GEMM on the path the step's bf16 products
    take, from chapter 2's own record (its dtype results) or, without them, the second
    machine's record where it was made on this CPU; only a record of this CPU on as many
    threads counts. At the shapes of a model's products (the non-square ones) where chapter 2
    measured them, else over every size (a geometric mean): {"ratio", "shape"}, the shape
    "M×K×N" where it is one; None where no record of this machine has it."""
    path = rec["settings"].get("bf16_path")
    if not path:
        return None
    for name in ("ch2.gemm", "ch2.bf16"):
        if not records.exists(name, rec_dir):
            continue
        g = records.load(name, rec_dir)
        if g["machine"].get("cpu") != rec["machine"].get("cpu"):
            continue
        ratios = _dtype_ratios(g, path, rec["settings"]["threads"])
        model = {s: x for s, x in ratios.items() if len(set(s)) > 1}
        use = model or ratios
        if use:
            shape = "×".join(map(str, next(iter(use)))) if len(use) == 1 else None
            return {"ratio": float(np.exp(np.mean(np.log(list(use.values()))))),
                    "shape": shape}
    return None


def predicted(rec, rec_dir, toks: dict) -> dict[int, tuple[float, str]]:
    """What this machine's own measurements predict for each rung of the climb, in tokens/s,
    and the arithmetic behind it: rung -> (tokens/s, how). From rung 2 on, each prediction
    is the rung before's measured step less the time its one switch can save:

    - 0, 1: the step's model FLOPs at chapter 2's product rate (numpy's, ours) on as many
      threads, an upper bound (the rest of the step is not free);
    - 2 (the pool): the parallel regions one step forks (the pool's counter) times the
      fork-join it saves (chapter 3's OpenMP fork-join less the pool's);
    - 3 (the arena): the bytes of the per-step buffers, which fresh pages make the kernel
      zero on first touch, at chapter 1's DRAM triad bandwidth;
    - 4 (tiles): the products the causal skip removes, half of attention's 12 T^2 C per
      layer and sequence, at the rate rung 3's profiled attention ran;
    - 5 (fused): each fused kernel's calls per step (rung 5's profile) times the time it
      saves per call (the fused-op timings);
    - 6 (bf16): rung 5's products at chapter 2's measured bf16/f32 GEMM ratio where a
      record of this machine has it (bf16_gemm), else at chapter 1's bf16/f32 peak ratio,
      the rest unchanged;
    - 7 (Muon): rung 6 with Newton-Schulz's arithmetic added (newton_schulz_flops, as
      tokens of training: n / (n + equiv)), on the modern block.
    """
    s = rec["settings"]
    th, fpt, cfg = s["threads"], s["flops_per_token"], s["config"]
    n_tok = s["batch_size"] * s["seq_len"]
    out = _predicted_from_products(rec_dir, th, fpt)
    sec = {i: 1.0 / t for i, t in toks.items()}  # seconds per token

    def less(i, saved_s, how):  # rung i-1's measured step less ``saved_s`` per step
        if i - 1 in sec and saved_s == saved_s:
            t = sec[i - 1] - saved_s / n_tok
            if t > 0:
                out[i] = (1.0 / t, how)

    fj = {r["params"]["kind"]: records.median(r) for r in records.results(rec, "fork_join")
          if r["params"]["what"] in ("pool", "OpenMP")}
    regions = s.get("regions_per_step")
    if regions and {"pool", "openmp"} <= set(fj):
        less(AT["pool"], regions * (fj["openmp"] - fj["pool"]) * 1e-6,
             f"{regions} regions × {f(fj['openmp'] - fj['pool'], 'µs')} saved")
    facts = ch1.facts(rec_dir)
    if facts:
        c = get_config(cfg["name"]) if cfg["name"] in CONFIGS else None
        if c is not None:
            nbytes = 4 * Workspace.floats(c, s["batch_size"], s["seq_len"], True)
            dram = ch1.level_of(facts, float("inf"), th)[1]
            less(AT["arena"], nbytes / (dram * 1e9), f"{f(nbytes / 2**20, 'MiB')} zeroed at {f(dram, 'GB/s')}")
    prof3 = _profile(rec, AT["arena"])
    L, T, C = cfg["n_layer"], s["seq_len"], cfg["d_model"]
    att_flops = 12 * L * T * T * C * s["batch_size"]
    if prof3.get("attention"):
        rate = att_flops / prof3["attention"]
        less(AT["tiles"], att_flops / 2 / rate, f"half of attention's {f(att_flops / 1e9, 'GFLOP')} at "
             f"{f(rate / 1e9, 'GFLOP/s')}")
    fused = fused_saving(rec)
    if fused:
        saved, calls = fused
        less(AT["fused"], saved, f"{calls} fused calls, {f(1e3 * saved, 'ms')} saved")
    peaks = _peaks(rec, rec_dir, th)
    prof5 = _profile(rec, F32_TOP)
    gemm = bf16_gemm(rec, rec_dir)
    if prof5 and F32_TOP in sec and (gemm or (peaks["f32"] and peaks["bf16"])):
        mm = prof5.get("matrix products (+ bias)", 0.0)
        ratio = gemm["ratio"] if gemm else peaks["bf16"] / peaks["f32"]
        at = f" at {gemm['shape']}" if gemm and gemm["shape"] else ""
        how = (f"products at chapter 2's bf16/f32 GEMM ratio{at}, {f(ratio)}×" if gemm else
               f"products at the {peaks['bf16_kind']}/f32 peak ratio, {f(ratio)}×")
        less(AT["bf16"], mm * (1 - 1 / ratio) * sec[F32_TOP] * n_tok / sum(prof5.values()), how)
    if AT["bf16"] in toks:
        c = get_config("xl-modern") if "xl-modern" in CONFIGS else None
        rung7 = records.results(rec, "rung_step", rung=AT["modern"])
        if rung7:
            c = get_config(rung7[0]["params"].get("config", "xl-modern"))
        if c is not None:
            equiv = newton_schulz_flops(c) / c.flops_per_token()
            out[AT["modern"]] = (toks[AT["bf16"]] * n_tok / (n_tok + equiv),
                      f"Newton–Schulz = {f(equiv)} tokens' training per step")
    return out


def modern_split(rec, rungs) -> dict | None:
    """Rung 7's prediction in its two parts, each against rung 7's profile, in seconds per
    step: Newton-Schulz ("ns_pred": its arithmetic as tokens of training at rung 6's speed;
    "ns_meas": its profiled time) and the rest of the step ("rest_pred": rung 6's profiled
    step, which the prediction leaves unchanged; "rest_meas": rung 7's profiled step less
    Newton-Schulz); with "other6"/"other7", each profile's time outside the profiled
    operations. None without both profiles or without Newton-Schulz in rung 7's."""
    p6, p7 = _profile(rec, AT["bf16"]), _profile(rec, AT["modern"])
    if not (p6 and p7 and AT["bf16"] in rungs and AT["modern"] in rungs):
        return None
    c = get_config(rungs[AT["modern"]]["params"].get("config", "xl-modern"))
    equiv = newton_schulz_flops(c) / c.flops_per_token()
    ns_meas = p7.get(MUON_GROUP, 0.0)
    if not ns_meas:
        return None
    return {"ns_pred": equiv / records.median(rungs[AT["bf16"]]), "ns_meas": ns_meas,
            "rest_pred": sum(p6.values()), "rest_meas": sum(p7.values()) - ns_meas,
            "other6": p6.get("Python and the rest", 0.0),
            "other7": p7.get("Python and the rest", 0.0)}


def bound_n(rec_dir) -> int | None:
    """The size of chapter 2's square product rungs 0 and 1 are bounded by."""
    if not records.exists("ch2.gemm", rec_dir):
        return None
    return records.load("ch2.gemm", rec_dir)["settings"]["n_ladder"]


def products_rate(rec, rec_dir, mm: float) -> dict:
    """The large products' own rate in rung 3's profile (``mm`` seconds a step; every FLOP
    but attention's T x T part), and its share of the rate rung 1's bound assumes."""
    s = rec["settings"]
    cfg, fpt, th = s["config"], s["flops_per_token"], s["threads"]
    attn = 12 * cfg["n_layer"] * s["seq_len"] * cfg["d_model"]
    bound = _predicted_from_products(rec_dir, th, fpt).get(AT["kernels"])
    rate = (fpt - attn) * s["batch_size"] * s["seq_len"] / mm / 1e9 if mm else None
    return {"ch3.p3_products_gops": rate,
            "ch3.p3_products_of_bound": rate / (bound[0] * fpt / 1e9) if rate and bound else None}

