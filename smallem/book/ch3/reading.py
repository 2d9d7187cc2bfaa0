"""Chapter 3's records read into the page's tables, figures and values."""

from __future__ import annotations

import math

import numpy as np

from smallem.training import layers
from smallem.training.model import CONFIGS, Workspace, get_config
from smallem.training.train import newton_schulz_flops
from .. import ch1, compare, figures, records, reference
from .measuring import (F32_TOP, MODERN_MARGIN, MUON_GROUP, OP_GROUPS, RECORD_RUN, RECORD_STEP,
                        RUNGS, AT, mfu, rung_label)
from .climb import CELL_TEST, TOLERANCE, cell, outcome_note, switches, within_times
from .fused import fused_table, roofline
from .predicted import (_peak, _peaks, _profile, bf16_gemm, bound_n, modern_split,
                        modern_vs_gpt2, predicted, products_rate)
from .run import RUN_KEYS, run_figure_and_values

f = figures.fmt
F32_MFU_TARGET = 0.75    # the f32 step after rung 5, against chapter 1's f32 probe
F32_TORCH_TARGET = 1.5   # ... and against PyTorch eager f32
BF16_TARGET = 1.6        # the bf16 step against our f32 step, where a fast bf16 path exists


def target_values() -> dict:
    """The targets, for the page's list (the page states none of them itself)."""
    return {"ch3.target_f32_mfu_is": f"{100 * F32_MFU_TARGET:.0f} %",
            "ch3.target_f32_torch_is": f"{F32_TORCH_TARGET:g} times",
            "ch3.target_bf16_is": f"{BF16_TARGET:g} times",
            "ch3.target_modern_is": f"{100 * MODERN_MARGIN:.0f} %",
            "ch3.tolerance": TOLERANCE,  # a prediction's: the same sign, within this factor
            # bf16 keeps 8 significant bits: rounding to the nearest moves a value by 2^-8 at most
            "ch3.bf16_rounding": f"{100 * 2.0 ** -8:.1f} %"}


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def _configs_table(values):
    xl = CONFIGS["xl"]
    full, tiles = (Workspace.floats(xl, 4, xl.context, scores) for scores in (True, False))
    values["ch3.xl_workspace_b4"] = f(4 * full / 2**30, "GiB")
    values["ch3.xl_scores_share"] = f"{100 * (full - tiles) / full:.0f} %"  # P and dP
    rows = [[c.name, c.d_model, c.n_layer, c.n_head, c.context, f(c.n_params() / 1e6, "M"),
             f(c.flops_per_token() / 1e6, "MFLOP")] for c in CONFIGS.values()]
    figures.write_table("ch3_configs", rows, ["config", "d", "layers", "heads", "context",
                                              "parameters", "training FLOPs per token"])
    xl = CONFIGS["xl"]
    values["ch3.xl_params"] = f(xl.n_params() / 1e6, "M")
    values["ch3.xl_flops_per_token"] = f(xl.flops_per_token() / 1e6, "MFLOP")
    # the blocks' arithmetic: flops_per_token less the head's 6 V d; QK^T and PV are its
    # 12 L d T, one part in (6d + T) / T
    attn = 12 * xl.n_layer * xl.d_model * xl.context
    blocks = xl.flops_per_token() - 6 * xl.vocab * xl.d_model
    values["ch3.xl_attention_share"] = f"{100 * attn / blocks:.0f} %"
    values["ch3.xl_attention_part"] = f"{blocks / attn:.0f}"


def _step_table(rec, rec_dir, rungs, values):
    s = rec["settings"]
    peaks = _peaks(rec, rec_dir, s["threads"])
    peak = peaks["f32"]
    fpt = s["flops_per_token"]
    found = {r["params"]["backend"]: r for r in records.results(rec, "step")}
    if AT["arena"] in rungs:
        found["kernels"] = rungs[AT["arena"]]
    label = {"numpy": "numpy reference", "kernels": "smallem kernels",
             "torch": "PyTorch eager (CPU, f32)", "torch-bf16": "PyTorch eager, bf16 autocast"}
    rows, toks = [], {}
    for backend, name in label.items():
        r = found.get(backend)
        if r is None:
            why = s.get("missing", {}).get(backend, "not measured")
            rows.append([name, "—", "—", "—", "—", f"not run: {why}"])
            continue
        v = toks[backend] = records.median(r)
        rows.append([name, f(v, "tokens/s"), f(v / s["threads"], "tokens/s"),
                     f(r["seconds"]["median"], "s"), f(v * fpt / 1e9, "GFLOP/s"),
                     _step_mfu(v, fpt, peaks, backend == "torch-bf16")])
    per, ref = reference.CORES, reference
    rows.append([f"reference series on its CPU ({ref.CPU}), before → after ({ref.CITE})",
                 f"{ref.CH3_XL_STEP_BEFORE_TOKS} → {f(ref.CH3_XL_STEP_AFTER_TOKS)} "
                 f"tokens/s", f"{f(ref.CH3_XL_STEP_BEFORE_TOKS / per)} → "
                 f"{f(ref.CH3_XL_STEP_AFTER_TOKS / per)} tokens/s", "—",
                 f(ref.CH3_XL_STEP_AFTER_TOKS * fpt / 1e9, "GFLOP/s"),
                 f"{_pct(ref.CH3_XL_MFU_CPU)} of f32 (its CPU's, {f(ref.CH1_F32_PEAK_GOPS, 'Gop/s')})"])
    cfg = s["config"]
    numpy_n = found["numpy"]["value"]["n"] if "numpy" in found else 0
    note = (f"One {cfg['name']} training step (forward, backward, AdamW), batch "
            f"{s['batch_size']} x {s['seq_len']} tokens, {s['threads']} threads, the median of "
            f"{numpy_n} steps for numpy, of the climb's "
            f"{found['kernels']['seconds']['n'] if 'kernels' in found else 0} rounds for "
            f"smallem (its rung 3) and PyTorch, after {s['warmup_steps']} warm-up; MFU = model FLOPs ({f(fpt / 1e6, 'MFLOP')} per "
            f"token) / chapter 1's f32 peak{' (' + f(peak, 'Gop/s') + ')' if peak else ''}"
            + (f", and for the bf16 autocast step / its {peaks['bf16_kind']} peak "
               f"({f(peaks['bf16'], 'Gop/s')}) first" if peaks["bf16"] else "") +
            f". {figures.machine_line(rec)}. The reference's per-core figure is its {per}-core "
            f"figure divided by {per}; its MFU is its after-step's speed at this table's FLOPs "
            f"per token over its own f32 peak (its table gives an efficiency without saying "
            f"how it counts).")
    figures.write_table("ch3_step", rows, ["path", "training speed", "per core",
                                           "time per step", "model FLOP rate",
                                           "MFU (of the peak named)"], note)
    for k in ("kernels_toks", "kernels_vs_numpy", "kernels_mfu"):
        values[f"ch3.{k}"] = "n/a (not measured: the record has no such step)"
    if "kernels" in toks:
        values["ch3.kernels_toks"] = f(toks["kernels"], "tokens/s")
        values["ch3.kernels_mfu"] = _pct(mfu(toks["kernels"], fpt, peak)) if peak else None
        for other in ("torch", "numpy"):
            if other in toks:
                values[f"ch3.kernels_vs_{other}"] = f(toks["kernels"] / toks[other]) + "×"
    values["ch3.threads"] = str(s["threads"])
    values["ch3.regions_per_step"] = str(s.get("regions_per_step") or "n/a")
    values.update({"ch3.ref_mfu": reference.CH3_XL_MFU_CPU, "ch3.ref_cpu": reference.CPU,
                   "ch3.ref_toks": reference.CH3_XL_STEP_AFTER_TOKS,
                   "ch3.ref_peak": reference.CH1_F32_PEAK_GOPS})
    values["ch3.bench_batch"] = str(s["batch_size"])
    N, C = s["batch_size"] * s["seq_len"], cfg["d_model"]  # the element-wise layers' tensors
    values["ch3.elementwise_sizes"] = f"{f(4 * N * C / 2**20, 'MiB')} to " \
                                      f"{f(4 * N * 4 * C / 2**20, 'MiB')}"
    values["ch3.spin_us"] = f(1e-3 * s.get("spin_ns", float("nan")), "µs")
    scores = 4 * s["batch_size"] * cfg["n_head"] * s["seq_len"] ** 2  # B H T^2 floats, bytes
    values["ch3.scores_block"] = f(scores / 2**20, "MiB")
    values["ch3.scores_step"] = f(cfg["n_layer"] * scores / 2**20, "MiB")
    return toks


def _step_mfu(v: float, fpt: float, peaks: dict, bf16: bool) -> str:
    """A step's MFU for the step table's cell, naming the peak: a bf16 step's against its
    precision's peak first, then against the f32 peak."""
    if not peaks["f32"]:
        return "no ch1 record"
    f32 = f"{_pct(mfu(v, fpt, peaks['f32']))} of f32"
    if bf16 and peaks["bf16"]:
        return f"{_pct(mfu(v, fpt, peaks['bf16']))} of {peaks['bf16_kind']} ({f32})"
    return f32


def _rungs_table(rec, rec_dir, rungs, step_toks, values):
    """The climb's table (each rung against the one before and its prediction, the
    reference), its figure, its headline and its targets."""
    s = rec["settings"]
    fpt, th = s["flops_per_token"], s["threads"]
    peaks = _peaks(rec, rec_dir, th)
    toks = {i: records.median(r) for i, r in rungs.items()}
    if "numpy" in step_toks:
        toks[AT["numpy"]] = step_toks["numpy"]
    pred = predicted(rec, rec_dir, toks)
    cells, climb = switches(rungs, toks, pred, _parts_missed(rec, rungs))
    values.update(climb)
    rows = _rung_rows(rungs, toks, pred, cells, peaks, fpt, values)
    ref = reference
    rows.append(["ref.", f"the reference series, xl GPT-2 step ({ref.CITE}, {ref.MACHINE})",
                 f"{ref.CH3_XL_STEP_BEFORE_TOKS} → {f(ref.CH3_XL_STEP_AFTER_TOKS)} tokens/s",
                 "—", "—", "—", "—", f"{_pct(ref.CH3_XL_MFU_CPU)} (its CPU's peak)", "—"])
    rows.append(["ref.", "the reference series, modern bf16 step with Muon",
                 f"{f(ref.CH3_MODERN_BEFORE_TOKS)} → {f(ref.CH3_MODERN_AFTER_TOKS)} tokens/s",
                 "—", "—", "—", "—", "—", "—"])
    figures.write_table(
        "ch3_rungs", rows, ["rung", "switched on", "training speed", "against the rung before",
                            "predicted (from what)", "predicted change",
                            "the prediction", "MFU (f32 peak)",
                            "MFU (its precision's peak)"],
        f"The {s['config']['name']} step, batch {s['batch_size']} x {s['seq_len']}, "
        f"{th} threads. Rungs 1 and up: one trainer each, timed in turn, "
        f"{next(iter(rungs.values()))['seconds']['n'] if rungs else 0} rounds after a warm-up "
        f"step; each rung has every switch of the rungs above it. MFU counts attention's "
        f"whole T x T square, as the convention does; from rung 4 the tiles compute only its "
        f"causal half. "
        + (f"Peaks: chapter 1's f32 ({f(peaks['f32'], 'Gop/s')}) and {peaks['bf16_kind']} "
           f"({f(peaks['bf16'], 'Gop/s')}) probes on as many threads. "
           if peaks["f32"] and peaks["bf16"] else "") +
        f"{outcome_note()} {CELL_TEST} {figures.machine_line(rec)}.")
    _climb_figure(toks, s, pred, {b: records.median(r) for b, r in
                                  ((r["params"]["backend"], r) for r in records.results(rec, "step"))
                                  if b.startswith("torch")})
    # the headline: the fastest rung on the climb's own model (rung 7 trains another block
    # with another optimiser; its tokens/s are not the same work)
    same = [i for i in toks if i not in rungs or rungs[i]["params"].get("config") == s["config"]["name"]]
    top = max(same, key=toks.get)
    values["ch3.climb_top"] = rung_label(top)
    values["ch3.climb_top_toks"] = f(toks[top], "tokens/s")
    if AT["numpy"] in toks:
        values["ch3.climb_vs_numpy"] = f(toks[top] / toks[AT["numpy"]]) + "×"
        values["ch3.numpy_toks"] = f(toks[AT["numpy"]], "tokens/s")
    if AT["modern"] in rungs:
        values["ch3.rung7_toks"] = f(toks[AT["modern"]], "tokens/s")
    # each rung against the one before (tiles against the arena: "tiles_vs_matrices")
    for i, j in ((r.index, r.index - 1) for r in RUNGS[AT["pool"]:] if r.name != "tiles"):
        if i in rungs and j in rungs:
            values[f"ch3.rung{i}_vs_{j}"] = compare.versus(rungs[i], rungs[j])
    # the arena's rung against the first, which has neither the pool nor the arena (a ratio of
    # the medians, typed: 0.97 is 3 % slower)
    first = AT["pool"] - 1
    values["ch3.rung3_over_1"] = (toks[AT["arena"]] / toks[first]
                                  if AT["arena"] in rungs and first in rungs else None)
    _climb_targets(rec, rungs, toks, peaks, values)


def _parts_missed(rec, rungs) -> set:
    """The rungs whose prediction is made of parts one of which missed its own by more than
    the tolerance: rung 7, where Newton-Schulz's time or the rest of the step's is not within
    TOLERANCE of its predicted time (predicted.modern_split)."""
    split = modern_split(rec, rungs)
    if split is None:
        return set()
    ok = (within_times(split["ns_pred"], split["ns_meas"])
          and within_times(split["rest_pred"], split["rest_meas"]))
    return set() if ok else {AT["modern"]}


def _rung_rows(rungs, toks, pred, cells, peaks, fpt, values) -> list[list[str]]:
    """A row per rung: what it switches on, its speed against the rung before, its
    prediction and the change it allows against what the rounds show (``cells``, from
    climb.switches), its MFU against the f32 peak and against its own precision's."""
    rows, before = [], None
    for i, what, kw in ((r.index, r.what, r.run) for r in RUNGS):
        if i not in toks:
            rows.append([str(i), what, "not measured", "—", "—", "—", "—", "—", "—"])
            continue
        if before is None:
            against = "—"
        elif i in rungs and before in rungs:
            against = cell(rungs[i], rungs[before])
        else:  # the numpy reference is timed on its own: a ratio, no rounds
            against = f(toks[i] / toks[before]) + "× (timed apart)"
        kind = "bf16" if kw["backend"] == "bf16" and peaks["bf16"] else "f32"  # else widened
        fpt_i = rungs[i]["params"].get("flops_per_token", fpt) if i in rungs else fpt
        switches_ = ", ".join(f"{k}={v}" for k, v in kw.items() if k != "backend")
        bound = i in pred and i not in cells  # rungs 0 and 1: a bound, not a change
        change, shows = cells.get(i, (f"{100 * toks[i] / pred[i][0]:.0f} % of it" if bound
                                      else "—", "—"))
        rows.append([str(i), f"{what} (`{kw['backend']}`{', ' + switches_ if switches_ else ''})",
                     f(toks[i], "tokens/s"), against,
                     f"{f(pred[i][0], 'tokens/s')} ({pred[i][1]})" if i in pred else
                     "not predicted (a measurement it needs is not in the records)",
                     change, shows,
                     _pct(mfu(toks[i], fpt_i, peaks["f32"])),
                     _pct(mfu(toks[i], fpt_i, peaks[kind]))
                     + f" of {peaks['bf16_kind'] if kind == 'bf16' else kind}"])
        if i < AT["pool"]:  # the page quotes the two bounds' shares
            values[f"ch3.rung{i}_of_predicted"] = (f"{100 * toks[i] / pred[i][0]:.0f} %"
                                                   if bound else None)
            if i == AT["kernels"]:  # above its bound by more than the noise: the page says why
                values["ch3.rung1_above"] = bool(bound and toks[i] > 1.05 * pred[i][0])
        before = i
    return rows


def _climb_targets(rec, rungs, toks, peaks, values) -> None:
    """The climb's targets: the f32 rung's MFU and its ratio to PyTorch, bf16 against f32
    and against PyTorch's autocast, the modern block with Muon against GPT-2's."""
    s = rec["settings"]
    fpt = s["flops_per_token"]
    steps = {r["params"]["backend"]: r for r in records.results(rec, "step")}
    if F32_TOP in rungs:
        m = mfu(toks[F32_TOP], fpt, peaks["f32"])
        if peaks["f32"]:  # the peak, in this step's tokens per second
            values["ch3.target_f32_mfu"] = compare.against_bound(
                rungs[F32_TOP], peaks["f32"] * 1e9 / fpt, F32_MFU_TARGET).text(
                f"{_pct(m)} against {100 * F32_MFU_TARGET:.0f}%")
        else:
            values["ch3.target_f32_mfu"] = "not measured: no chapter-1 record of the peak"
        if "torch" in steps:
            v = compare.against(rungs[F32_TOP], steps["torch"], F32_TORCH_TARGET)
            values["ch3.target_f32_torch"] = v.text(f"{f(v.ratio)}× PyTorch eager f32, "
                                                    f"against {F32_TORCH_TARGET}×")
        else:
            values["ch3.target_f32_torch"] = "not measured: PyTorch is not installed here"
    values["ch3.bf16_fast_path"], values["ch3.bf16_path"] = False, s.get("bf16_path", "unknown")
    if AT["bf16"] in rungs and F32_TOP in rungs:
        v = compare.against(rungs[AT["bf16"]], rungs[F32_TOP], BF16_TARGET)
        fast = s.get("bf16_path") in ("native", "amx")
        values["ch3.bf16_ratio"] = f(v.ratio) + "×"
        values["ch3.bf16_path"] = s.get("bf16_path", "unknown")
        values["ch3.bf16_fast_path"] = fast
        values["ch3.target_bf16"] = v.text(f"{f(v.ratio)}× our f32 step, against {BF16_TARGET}×")
        if AT["modern"] in rungs:
            c = get_config(rungs[AT["modern"]]["params"].get("config", "xl-modern"))
            equiv = newton_schulz_flops(c) / c.flops_per_token()
            values["ch3.muon_equiv_tokens"] = f(equiv)
            # at equal speed, a step of n tokens with Muon takes (n + equiv) / n of one without
            values["ch3.muon_target_tokens"] = f(equiv * (1 - MODERN_MARGIN) / MODERN_MARGIN)
            v = compare.against(rungs[AT["modern"]], rungs[AT["bf16"]], 1 - MODERN_MARGIN)
            values["ch3.modern_ratio"] = _pct(v.ratio)
            values["ch3.target_modern"] = v.text(
                f"{_pct(v.ratio)} of the GPT-2 bf16 step's speed at the climb's batch, against "
                f"{100 * (1 - MODERN_MARGIN):.0f}%")
            _accumulated_values(rec, values)
        if "torch-bf16" in steps:
            v = compare.against(rungs[AT["bf16"]], steps["torch-bf16"], 1.0)
            values["ch3.target_bf16_torch"] = v.text(f"{f(v.ratio)}× PyTorch's bf16 autocast")
        else:
            values["ch3.target_bf16_torch"] = "not measured: PyTorch is not installed here"


def _accumulated_values(rec, values):
    """Rungs 6 and 7 at the optimiser step of several micro-batches: the target's measure
    where the record has it (the climb's own batch stands otherwise, said so)."""
    acc = {r["params"]["rung"]: r for r in records.results(rec, "accumulated_step")}
    if not {AT["bf16"], AT["modern"]} <= set(acc):
        values["ch3.accumulated"] = ("not measured in this record (it predates the "
                                     "accumulated steps)")
        return
    A, n = acc[7]["params"]["accumulate"], acc[7]["params"]["tokens"]
    gpt2, modern = (f(records.median(acc[i]), "tokens/s") for i in (AT["bf16"], AT["modern"]))
    v = compare.against(acc[7], acc[6], 1 - MODERN_MARGIN)
    values["ch3.target_modern"] = v.text(
        f"{_pct(v.ratio)} of the GPT-2 bf16 step's speed at {f(n)} tokens per optimiser step, "
        f"against {100 * (1 - MODERN_MARGIN):.0f}% (at the climb's batch: "
        f"{values['ch3.modern_ratio']})")
    values["ch3.modern_accumulated_toks"] = modern
    values["ch3.accumulated_tokens"] = f(n)
    values["ch3.accumulated"] = (
        f"with {A} micro-batches per optimiser step ({f(n)} tokens), timed in turn "
        f"{acc[7]['value']['n']} times each, the modern step with Muon ran at {modern} against "
        f"GPT-2's {gpt2} in bf16: {_pct(v.ratio)} of its speed")
    # GPT-2's accumulated step against the climb's rung 6 (the same trainer, one micro-batch
    # per optimiser step), typed: the ratio of the medians, and the most that sharing one
    # AdamW update among A micro-batches can give, from rung 6's profiled AdamW share
    climb6 = next(iter(records.results(rec, "rung_step", rung=AT["bf16"])), None)
    prof6 = _profile(rec, AT["bf16"])
    adamw = (prof6.get("AdamW + gradient norm", 0.0) / sum(prof6.values())) if prof6 else None
    values.update({
        "ch3.acc_micro": A, "ch3.acc_rounds": acc[AT["bf16"]]["value"]["n"],
        "ch3.acc6_over_climb6": (records.median(acc[AT["bf16"]]) / records.median(climb6)
                                 if climb6 else None),
        "ch3.acc6_adamw_share": adamw,
        "ch3.acc6_adamw_gain": 1 / (1 - adamw * (1 - 1 / A)) if adamw is not None else None})


def _bounds(rec, rec_dir, step_toks, values):
    """What the targets ask of this machine, from its own measurements: the bf16 step's
    best ratio to the f32 step if its products ran at chapter 1's bf16/f32 peak ratio and
    the rest of the f32 step (rung 5's profile) did not change (Amdahl), and the share of
    the f32 peak that PyTorch's measured f32 speed times the target would take."""
    s = rec["settings"]
    th = s["threads"]
    peaks = _peaks(rec, rec_dir, th)
    prof = {}
    for r in records.results(rec, "op_seconds", rung=F32_TOP):
        group = OP_GROUPS.get(r["params"]["op"], "Python and the rest")
        prof[group] = prof.get(group, 0.0) + records.median(r)
    values["ch3.bf16_bound"] = None  # no profile of rung 5 or no peaks: the page leaves it out
    values["ch3.bf16_products_faster"] = False
    if prof and peaks["f32"] and peaks["bf16"]:
        ratio = peaks["bf16"] / peaks["f32"]
        total, mm = sum(prof.values()), prof.get("matrix products (+ bias)", 0.0)
        at = prof.get("attention", 0.0)
        bound = total / (mm / ratio + total - mm)
        with_attention = total / ((mm + at) / ratio + total - mm - at)
        mm6 = sum(records.median(r) for r in records.results(rec, "op_seconds", rung=AT["bf16"])
                  if OP_GROUPS.get(r["params"]["op"]) == "matrix products (+ bias)")
        if mm6:  # the products' own gain from rung 5 to rung 6, in the two profiles
            values["ch3.bf16_products_faster"] = mm / mm6 > 1.0
            values["ch3.bf16_products_gain"] = f(mm / mm6) + "×"
            values["ch3.bf16_products_vs_peak"] = (
                "more than" if mm / mm6 > ratio * 1.01 else
                "less than" if mm / mm6 < ratio / 1.01 else "about")
        values["ch3.bf16_bound"] = (
            f"chapter 1's {peaks['bf16_kind']} peak is {f(ratio)}× its f32 peak here; with every product of "
            f"rung 5's step at that ratio and the rest of it ({_pct(1 - mm / total)} of the "
            f"step) unchanged, the bf16 step would be {f(bound)}× the f32 step, and with the "
            f"attention ({_pct(at / total)}) at that ratio too, {f(with_attention)}×")
    values["ch3.torch_f32_needs"] = None  # no PyTorch step: the page says so once
    if "torch" in step_toks and peaks["f32"]:
        # typed: the share of the f32 peak the target takes at the arithmetic our top f32
        # rung does a token (its tiles skip attention's masked half), and those FLOPs
        c = s["config"]
        done = s["flops_per_token"] - 6 * c["n_layer"] * s["seq_len"] * c["d_model"]
        values["ch3.torch_f32_needs"] = F32_TORCH_TARGET * mfu(step_toks["torch"], done, peaks["f32"])
        values["ch3.torch_target_mflop"] = done / 1e6
        values["ch3.torch_target_causal"] = done < s["flops_per_token"]


def _arena_values(rec, rec_dir, rungs, values):
    """What a step without the arena allocates and zeroes again: the workspace of the
    benchmark's batch (with the T x T buffers, as rungs 1 to 3 have them), and the time
    writing that many zeros takes at chapter 1's DRAM triad bandwidth, against rung 2's
    step: an estimate of the work the arena saves, not a measurement of it."""
    s = rec["settings"]
    cfg = get_config(s["config"]["name"])
    nbytes = 4 * Workspace.floats(cfg, s["batch_size"], s["seq_len"], True)
    values["ch3.bench_workspace"] = f(nbytes / 2**20, "MiB")
    facts = ch1.facts(rec_dir)
    if facts is None or 2 not in rungs:
        values["ch3.arena_zeroing"] = None  # no chapter-1 DRAM bandwidth: the page leaves it out
        return
    plateaus = facts["triad_plateaus"]
    bw = (plateaus.get(s["threads"]) or plateaus[max(plateaus)]).get("DRAM")
    seconds = nbytes / (bw * 1e9)
    values["ch3.arena_zeroing"] = (f"{f(1e3 * seconds, 'ms')}, {_pct(seconds / rungs[AT['pool']]['seconds']['median'])} "
                                   f"of rung 2's step")


def _flash_values(rec, values):
    """Where a tile of K^T, packed once per head with rows T floats apart, falls in the L1:
    a line's set is (address / line) mod sets, so rows a power-of-two stride apart share a
    few sets. The strip the score loop reads (two vectors of keys, down hd rows), the tile
    as a whole (hd rows of tile floats), and the same tile packed on its own (rows tile
    floats apart, as the backward packs it)."""
    s, caches = rec["settings"], rec["machine"].get("caches") or {}
    # 64-byte lines: every x86 core's, and the records keep no line size
    l1, ways, line = caches.get("L1d_bytes"), caches.get("L1d_ways"), 64
    cfg = s["config"]
    T, hd = s["seq_len"], cfg["d_model"] // cfg["n_head"]
    tile = s.get("flash_tile") or layers.flash_tile(hd, caches)
    vec = {"avx512": 64, "avx2": 32}.get(rec["machine"]["isa"]["isa"], 16)  # bytes
    values.update({"ch3.head_dim": str(hd), "ch3.flash_tile": str(tile),
                   "ch3.kt_stride": f(4 * T / 1024, "KiB"),
                   "ch3.kv_tiles": f(2 * 4 * hd * tile / 1024, "KiB"),
                   "ch3.l1_line": f"{line}-byte"})
    if not (l1 and ways):
        for k in ("l1_size", "l1_ways", "l1_sets", "kt_strip_sets", "kt_strip_lines", "kt_strip_held",
                  "kt_tile_sets", "kt_tile_lines", "kt_tile_held", "kt_packed_sets"):
            values[f"ch3.{k}"] = "n/a (the L1's ways are not known here)"
        return
    sets = l1 // (ways * line)

    def sets_touched(stride_bytes, width_lines):  # rows of width_lines lines, stride apart
        starts = sets // math.gcd(sets, max(1, stride_bytes // line))
        return min(sets, starts * width_lines)

    strip, row = max(1, 2 * vec // line), max(1, 4 * tile // line)
    tile_sets = sets_touched(4 * T, row)
    values.update({"ch3.l1_size": f(l1 / 1024, "KiB"), "ch3.l1_ways": str(ways),
                   "ch3.l1_sets": str(sets),
                   "ch3.kt_strip_sets": str(sets_touched(4 * T, strip)),
                   "ch3.kt_strip_lines": str(hd * strip),
                   "ch3.kt_strip_held": str(min(hd * strip, sets_touched(4 * T, strip) * ways)),
                   "ch3.kt_tile_sets": str(tile_sets), "ch3.kt_tile_lines": str(hd * row),
                   "ch3.kt_tile_held": str(min(hd * row, tile_sets * ways)),
                   "ch3.kt_packed_sets": str(sets_touched(4 * tile, row))})


def _ridge_values(rec, rec_dir, values):
    """A LayerNorm's intensity, about 8 operations for the 8 bytes a float costs it (read
    and written once), against chapter 1's ridges."""
    facts = ch1.facts(rec_dir)
    values["ch3.layernorm_ridges"] = (ch1.ridge_position(facts, 8 / 8, rec["settings"]["threads"])
                                      if facts else None)


def _climb_figure(toks, s, pred=None, peers=None):
    """Each rung's speed as a bar, its prediction as a mark on the bar's row, PyTorch's f32
    and bf16 steps (timed in the same rounds) as vertical lines; a log axis labelled at
    plain numbers only (no minor labels)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    pred, peers = pred or {}, peers or {}
    built = [(r.index, r.what) for r in RUNGS if r.index in toks]
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(built) + 1.6))
    ys = np.arange(len(built))[::-1]
    ax.barh(ys, [toks[i] for i, _ in built], color=["tab:grey"] + ["tab:blue"] * (len(built) - 1))
    ax.set_yticks(ys, [f"{i}  {what}" for i, what in built], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("training speed (tokens/s, log scale)")
    for y, (i, _) in zip(ys, built):  # the label right of the bar and of its prediction's mark
        at = max(toks[i], pred[i][0] if i in pred and pred[i][0] < toks[i] * 1.3 else 0)
        ax.text(at * 1.08, y, f(toks[i]), va="center", fontsize=8)
    marked = [(y, pred[i][0]) for y, (i, _) in zip(ys, built) if i in pred]
    if marked:
        ax.scatter([x for _, x in marked], [y for y, _ in marked], marker="D", s=22,
                   color="black", zorder=3, label="predicted")
    names = {"torch": ("PyTorch eager, f32", "tab:orange"),
             "torch-bf16": ("PyTorch eager, bf16 autocast", "tab:red")}
    for backend, (label, colour) in names.items():
        if backend in peers:
            ax.axvline(peers[backend], color=colour, linestyle="--", linewidth=1,
                       label=f"{label} ({f(peers[backend])})")
    everything = list(toks.values()) + [x for _, x in marked] + list(peers.values())
    ax.set_xlim(min(everything) / 1.5, max(everything) * 3)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f(x)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_title(f"the {s['config']['name']} step, rung by rung, {s['threads']} threads",
                 fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    if marked or peers:
        ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    figures.save(fig, "ch3_climb")


def _explain_values(rec, rec_dir, rungs, step_toks, values) -> None:
    """Typed facts the page's sentences need to say why a figure is what it is: the profile
    of rung 3 by part, the causal half the tiles skip against the MFU's count, the bf16
    prediction's source and the products' own gain, rung 7's prediction split into
    Newton-Schulz and the rest, and the PyTorch peer as it ran."""
    s = rec["settings"]
    cfg, fpt, th = s["config"], s["flops_per_token"], s["threads"]
    n_tok = s["batch_size"] * s["seq_len"]
    profs = {i: _profile(rec, i) for i in (AT["arena"], F32_TOP, AT["bf16"], AT["modern"])}
    values.update(modern_vs_gpt2(profs[AT["bf16"]], profs[AT["modern"]]))
    p3 = profs[AT["arena"]]
    if p3:
        total = sum(p3.values())
        mm, at = p3.get("matrix products (+ bias)", 0.0), p3.get("attention", 0.0)
        values.update({"ch3.p3_matmul": mm / total, "ch3.p3_attention": at / total,
                       "ch3.p3_rest": 1 - (mm + at) / total,
                       "ch3.p3_attention_larger": at > total - mm - at})
        values.update(products_rate(rec, rec_dir, mm))
    # the MFU counts the whole T x T square (the convention); from rung 4 the tiles skip the
    # masked half of attention's 12 L T d per token
    skipped = 6 * cfg["n_layer"] * s["seq_len"] * cfg["d_model"] / fpt
    values["ch3.causal_skipped"] = skipped
    peak = _peak(rec_dir, "f32", th)
    if F32_TOP in rungs and peak:
        m = mfu(records.median(rungs[F32_TOP]), fpt, peak)
        values["ch3.top_mfu_computed"] = m * (1 - skipped)
    values["ch3.top_mfu_known"] = F32_TOP in rungs and bool(peak)
    # bf16: where the prediction's ratio came from, and what the products gained
    gemm = bf16_gemm(rec, rec_dir)
    peaks = _peaks(rec, rec_dir, th)
    values["ch3.bf16_pred_from_gemm"] = gemm is not None
    values["ch3.bf16_pred_shape"] = gemm["shape"] if gemm else None
    values["ch3.bf16_pred_ratio"] = gemm["ratio"] if gemm else (
        peaks["bf16"] / peaks["f32"] if peaks["bf16"] and peaks["f32"] else None)
    mm5 = profs[F32_TOP].get("matrix products (+ bias)")
    mm6 = profs[AT["bf16"]].get("matrix products (+ bias)")
    values["ch3.bf16_products_gain_x"] = mm5 / mm6 if mm5 and mm6 else None
    # rung 7: its two parts, Newton-Schulz and the rest of the step, each against its own
    split = modern_split(rec, rungs)
    values["ch3.rung7_split"] = split is not None
    if split:
        ms = {k: 1e3 * v for k, v in split.items()}
        values.update({
            "ch3.ns_pred_ms": ms["ns_pred"], "ch3.ns_meas_ms": ms["ns_meas"],
            "ch3.ns_as_predicted": within_times(ms["ns_pred"], ms["ns_meas"]),
            "ch3.rest_pred_ms": ms["rest_pred"], "ch3.rest_meas_ms": ms["rest_meas"],
            "ch3.rest_as_predicted": within_times(ms["rest_pred"], ms["rest_meas"]),
            "ch3.rung7_rest_ms": ms["rest_meas"] - ms["rest_pred"],
            "ch3.rung7_other_ms": ms["other7"], "ch3.rung6_other_ms": ms["other6"]})
    # the PyTorch peer as it ran (what the record holds of it)
    peer = s.get("torch_config") or {}
    values.update({"ch3.torch_version": s.get("torch") or None,
                   "ch3.torch_threads": peer.get("threads", th if s.get("torch") else None),
                   "ch3.torch_capability": peer.get("cpu_capability"),
                   "ch3.torch_onednn": peer.get("mkldnn"),
                   "ch3.torch_onednn_bf16": peer.get("mkldnn_bf16"),
                   "ch3.torch_amx": peer.get("amx_tile"),
                   "ch3.torch_config_known": bool(peer),
                   # typed: whether this CPU has AMX tiles at all (the record's ISA)
                   "ch3.cpu_amx": any("amx" in x for x in
                                      rec["machine"].get("isa", {}).get("extensions", []))})
    steps = {r["params"]["backend"]: r for r in records.results(rec, "step")}
    values["ch3.torch_bf16_beats_kernels"] = None
    if "torch-bf16" in steps and AT["arena"] in rungs:
        v = compare.against(steps["torch-bf16"], rungs[AT["arena"]], 1.0)
        values["ch3.torch_bf16_beats_kernels"] = v.met
        values["ch3.torch_bf16_vs_kernels"] = v.ratio
    if "torch" in steps and AT["arena"] in rungs:
        v = compare.against(rungs[AT["arena"]], steps["torch"], 1.0)
        values["ch3.kernels_torch_verdict"] = v.text(f"{f(v.ratio)}×")
    else:
        values["ch3.kernels_torch_verdict"] = None


def _ops_table(rec, values, rungs=None):
    prof: dict = {}
    for r in records.results(rec, "op_seconds"):
        prof.setdefault(r["params"]["rung"], {})[r["params"]["op"]] = records.median(r)
    if not prof:
        return
    groups = {}
    for rung, ops in prof.items():
        g: dict = {}
        for op, sec in ops.items():
            name = OP_GROUPS.get(op, "Python and the rest")
            g[name] = g.get(name, 0.0) + sec
        groups[rung] = g
    order = sorted(groups[min(groups)], key=lambda k: -groups[min(groups)][k])
    order += [k for k in groups[max(groups)] if k not in order]
    m = AT["modern"]  # the modern block has no biases, and SwiGLU and RMSNorm in their places
    shown = {"matrix products (+ bias)": f"matrix products (+ bias; none at rung {m})",
             "GELU (+ bias)": f"GELU (+ bias); SwiGLU at rung {m}",
             "LayerNorm": f"LayerNorm; RMSNorm at rung {m}"} if m in groups else {}
    rows = []
    for name in order:
        row = [shown.get(name, name)]
        for rung in sorted(groups):
            sec, total = groups[rung].get(name, 0.0), sum(groups[rung].values())
            row += [f(1e3 * sec, "ms"), f"{100 * sec / total:.1f}%"]
        rows.append(row)
    # each column is one profiled step: its sum beside its rung's median step in the climb,
    # so that a reader sees how far one step strays from the rounds' median
    rungs = rungs or {}
    sums = {rung: sum(groups[rung].values()) for rung in groups}
    rows.append(["the profiled step (the column's sum)"]
                + [c for rung in sorted(groups) for c in (f(1e3 * sums[rung], "ms"), "100%")])
    medians = {rung: rungs[rung]["seconds"]["median"] for rung in groups
               if rung in rungs and "seconds" in rungs[rung]}
    off = [abs(sums[r] / m - 1) for r, m in medians.items() if m]
    if medians:
        rows.append(["the rung's median step in the climb"]
                    + [c for rung in sorted(groups) for c in
                       ((f(1e3 * medians[rung], "ms"), "—") if rung in medians else ("—", "—"))])
    header = ["op (forward + backward)"]
    for rung in sorted(groups):
        header += [f"rung {rung}: time per step", "share"]
    figures.write_table("ch3_ops", rows, header,
                        "One profiled step after a warm-up, on the trainers of the climb: "
                        + "; ".join(f"rung {i} ({rung_label(i)})" for i in sorted(groups))
                        + (f". Each column is a single step, and its sum is up to "
                           f"{100 * max(off):.1f} % off its rung's median step in the climb (the "
                           f"last two rows): a part's difference between two columns is not "
                           f"a measured gain, and its shares are one step's, not exact"
                           if off else "")
                        + f". {figures.machine_line(rec)}.")
    values["ch3.ops_off_max"] = max(off) if off else None
    top = groups[max(groups)]
    values["ch3.muon_share"] = f"{100 * top.get(MUON_GROUP, 0.0) / sum(top.values()):.0f}%"
    for prefix, rung in (("", min(groups)), ("top_", max(groups))):
        g = groups[rung]
        total = sum(g.values())
        mm, at = g.get("matrix products (+ bias)", 0.0), g.get("attention", 0.0)
        values[f"ch3.{prefix}matmul_share"] = f"{100 * mm / total:.0f}%"
        values[f"ch3.{prefix}attention_share"] = f"{100 * at / total:.0f}%"
        values[f"ch3.{prefix}rest_share"] = f"{100 * (total - mm - at) / total:.0f}%"


def _fork_join_table(rec, values):
    found = records.results(rec, "fork_join")
    if not found:
        return
    rows = [[r["params"]["what"], str(r["params"]["threads"]),
             f"{f(r['value']['median'], 'us')} ({f(r['value']['min'])}–{f(r['value']['max'])})"]
            for r in found]
    bars = {r["params"]["kind"]: r for r in records.results(rec, "barrier")}
    for kind, name in (("pool", "pool"), ("openmp", "OpenMP")):
        if kind in bars:
            r = bars[kind]
            rows.append([f"a barrier inside one region, {name}", str(r["params"]["threads"]),
                         f"{f(r['value']['median'], 'us')} ({f(r['value']['min'])}–"
                         f"{f(r['value']['max'])})"])
    figures.write_table(
        "ch3_fork_join", rows, ["fork and join of an empty region", "threads",
                                "time (median, min–max of 5 samples)"],
        f"Each sample is the mean of a few thousand fork-joins in a row (fewer for the slow "
        f"ones); the pool's default waiting is {f(1e-3 * rec['settings'].get('spin_ns', 50000))}"
        f" us of spinning, then sleep. {figures.machine_line(rec)}.")
    keys = {("pool", "pool"): "pool", ("OpenMP", "openmp"): "openmp",
            ("a thread created per call", "create"): "create",
            ("pool, sleeping at once", "pool"): "sleep", ("pool, spinning forever", "pool"): "forever",
            ("pool, one thread more than cores", "pool"): "over_pool",
            ("OpenMP, one thread more than cores", "openmp"): "over_openmp",
            ("pool, one more, spinning forever", "pool"): "over_forever"}
    for r in found:
        key = keys.get((r["params"]["what"], r["params"]["kind"]))
        if key:
            values[f"ch3.fj_{key}"] = f(records.median(r), "us")
    for kind, r in bars.items():
        values[f"ch3.barrier_{kind}"] = f(records.median(r), "us")
    by = {keys.get((r["params"]["what"], r["params"]["kind"])): r for r in found}
    if "pool" in by and "forever" in by:
        pool, forever = by["pool"]["value"], by["forever"]["value"]
        values["ch3.fj_pool_min"] = f(pool["min"], "us")
        values["ch3.fj_forever_vs_pool"] = _faster(pool["median"], forever["median"])
        values["ch3.fj_pool_min_vs_forever"] = _faster(forever["median"], pool["min"])
        values["ch3.fj_forever_faster"] = forever["median"] * 1.1 < pool["median"]
        values["ch3.fj_forever_slower"] = forever["median"] > pool["median"] * 1.1
    # with one thread more than cores: the bounded pool against libgomp (a ratio of the
    # medians, typed: 7.7 is 7.7 times as slow)
    values["ch3.fj_over_pool_vs_openmp"] = (
        records.median(by["over_pool"]) / records.median(by["over_openmp"])
        if "over_pool" in by and "over_openmp" in by else None)
    if "pool" in by and "openmp" in by:  # what the pool is kept for, where it holds
        values["ch3.fj_pool_faster"] = (records.median(by["pool"])
                                        < records.median(by["openmp"]))
        values["ch3.barrier_pool_faster"] = ("pool" in bars and "openmp" in bars and
                                             records.median(bars["pool"])
                                             < records.median(bars["openmp"]))


def _faster(base: float, x: float, close: float = 1.1) -> str:
    """Time ``x`` against time ``base`` as words before "the ...": "2.2 times faster than",
    "as fast as" (within ``close`` of each other), "1.5 times slower than"."""
    if x * close < base:
        return f"{f(base / x)} times faster than"
    if x > base * close:
        return f"{f(x / base)} times slower than"
    return "about as fast as"


def _long_attention_values(rec, values):
    found = {r["params"]["attention"]: r for r in records.results(rec, "long_attention")}
    if len(found) < 2:
        return
    m, t = found["matrices"], found["tiles"]
    values["ch3.long_T"] = str(t["params"]["T"])
    values["ch3.long_tiles_ms"] = f(1e3 * t["seconds"]["median"], "ms")
    values["ch3.long_matrices_ms"] = f(1e3 * m["seconds"]["median"], "ms")
    values["ch3.long_tiles_vs"] = compare.versus(t, m)
    values["ch3.long_extra_tiles"] = f(t["params"]["extra_bytes"] / 2**20, "MiB")
    values["ch3.long_extra_matrices"] = f(m["params"]["extra_bytes"] / 2**20, "MiB")
    values["ch3.long_extra_ratio"] = (
        f"{100 * t['params']['extra_bytes'] / m['params']['extra_bytes']:.2f}%")


# the typed facts the page's sentences test, each None until a record gives it
FACTS = ("fused_best_op", "fused_best_gain", "fused_worst_op", "fused_worst_gain",
         "fused_best_shown", "fused_worst_shown", "fused_any_below", "fused_closest_op", "fused_closest",
         "fused_farthest_op", "fused_farthest", "fused_right", "fused_left", "fused_all_left", "fused_any_above", "fused_above",
         "fused_above_many", "fused_above_level", "fused_above_of", "fused_above_mib",
         "fused_above_inner", "fused_inner_last_mib", "fused_outer_first_mib",
         "fused_inner_reported_mib", "p3_matmul", "p3_attention", "p3_rest", "p3_products_gops",
         "p3_products_of_bound", "p3_attention_larger", "causal_skipped", "top_mfu_computed",
         "top_mfu_known", "bf16_pred_from_gemm", "bf16_pred_shape", "bf16_pred_ratio",
         "bf16_products_gain_x", "rung7_split", "ns_pred_ms", "ns_meas_ms", "ns_as_predicted",
         "rest_pred_ms", "rest_meas_ms", "rest_as_predicted", "rung7_rest_ms",
         "rung7_other_ms", "rung6_other_ms", "torch_version", "torch_threads",
         "torch_capability", "torch_onednn", "torch_onednn_bf16", "torch_amx",
         "torch_config_known", "cpu_amx", "torch_bf16_beats_kernels", "torch_bf16_vs_kernels",
         "kernels_torch_verdict", "fj_forever_slower", "climb_beyond_other",
         *(f"rung{i}_{k}" for i in range(2, 8) for k in ("pred", "meas", "spread", "shows")),
         *(f"climb_any_{k}" for k in ("as", "parts", "missed", "small", "beyond", "unseen",
                                      "against")))


# the page's values of each record: where the record is missing (or predates the climb), each
# is None and the page's section says so once at its head (the hook wants every key it names)
STEP_KEYS = (
    "acc6_adamw_gain", "acc6_adamw_share", "acc6_over_climb6", "acc_micro", "acc_rounds",
    "accumulated", "arena_zeroing", "attention_share", "barrier_openmp", "barrier_pool",
    "bench_batch", "bench_workspace", "bf16_bound", "bf16_path", "bf16_products_gain",
    "bf16_products_vs_peak", "bf16_ratio", "climb_against", "climb_as", "climb_beyond",
    "climb_missed", "climb_parts", "climb_small", "climb_top", "climb_top_toks", "climb_unseen",
    "climb_vs_numpy", "elementwise_sizes", "fj_create", "fj_forever", "fj_forever_vs_pool",
    "fj_openmp", "fj_over_forever", "fj_over_openmp", "fj_over_pool", "fj_over_pool_vs_openmp", "fj_pool", "fj_pool_min",
    "fj_pool_min_vs_forever", "fj_sleep", "flash_tile", "head_dim", "kernels_mfu",
    "kernels_toks", "kernels_vs_numpy", "kt_packed_sets", "kt_stride", "kt_strip_held",
    "kt_strip_lines", "kt_strip_sets", "kt_tile_held", "kt_tile_lines", "kt_tile_sets",
    "kv_tiles", "l1_line", "l1_sets", "l1_size", "l1_ways", "long_T", "long_extra_matrices",
    "long_extra_ratio", "long_extra_tiles", "long_matrices_ms", "long_tiles_ms",
    "long_tiles_vs", "matmul_share", "matrices_toks", "modern_ratio", "muon_equiv_tokens",
    "muon_share", "muon_target_tokens", "numpy_toks", "ops_off_max", "products_intensity", "ref_cpu",
    "ref_mfu", "ref_peak", "ref_toks",
    "regions_per_step", "rest_share", "rung2_vs_1", "rung3_over_1", "rung3_vs_2", "rung5_vs_4", "rung6_vs_5",
    "rung7_toks", "rung7_vs_6", "scores_block", "scores_step", "spin_us", "target_bf16",
    "target_bf16_torch", "target_f32_mfu", "target_f32_torch", "target_modern", "threads",
    "tiles_rounds", "tiles_toks", "tiles_vs_matrices", "top_attention_share",
    "top_matmul_share", "top_rest_share",
)


def report(rec_dir) -> dict:
    values: dict = target_values()
    values.update({f"ch3.{k}": None for k in FACTS})
    values.update({"ch3.layernorm_ridges": None, "ch3.kernels_vs_torch": None,
                   "ch3.torch_f32_needs": None, "ch3.rung0_of_predicted": None, "ch3.torch_target_mflop": None,
                   "ch3.torch_target_causal": None,
                   "ch3.rung1_of_predicted": None, "ch3.products_intensity": None,
                   "ch3.rung1_above": None, "ch3.bound_n": bound_n(rec_dir),
                   "ch3.bf16_products_gain": None, "ch3.bf16_products_vs_peak": None})
    _configs_table(values)
    rec = records.load(RECORD_STEP, rec_dir) if records.exists(RECORD_STEP, rec_dir) else None
    if rec is not None and not records.results(rec, "rung_step"):
        # a record made before the climb (a captured machine's, say): nothing here reads it
        values["ch3.record_predates"] = records.not_measured(rec, "the record predates the climb")
        values["ch3.step_predates"] = True
        rec = None
    values["ch3.step_measured"] = rec is not None
    values.setdefault("ch3.step_predates", False)
    values["ch3.run_measured"] = records.exists(RECORD_RUN, rec_dir)
    if rec is not None:
        # the typed facts a part of the record may lack: None unless that part sets them
        values.update({f"ch3.{k}": None for k in (
            "acc6_adamw_gain", "acc6_adamw_share", "acc6_over_climb6", "acc_micro", "acc_rounds",
            "fj_over_pool_vs_openmp", "ops_off_max", "rung3_over_1")})
        rungs = {r["params"]["rung"]: r for r in records.results(rec, "rung_step")}
        toks = _step_table(rec, rec_dir, rungs, values)
        _rungs_table(rec, rec_dir, rungs, toks, values)
        _ops_table(rec, values, rungs)
        _explain_values(rec, rec_dir, rungs, toks, values)
        _bounds(rec, rec_dir, toks, values)
        fused_table(rec, rec_dir, rungs, values)
        _arena_values(rec, rec_dir, rungs, values)
        _flash_values(rec, values)
        _ridge_values(rec, rec_dir, values)
        _fork_join_table(rec, values)
        roofline(rec, rec_dir, values)
        _long_attention_values(rec, values)
        if 3 in rungs and 4 in rungs:  # the section on tiles quotes its rung
            arena, tiles = rungs[AT["arena"]], rungs[AT["tiles"]]
            values["ch3.matrices_toks"] = f(records.median(arena), "tokens/s")
            values["ch3.tiles_toks"] = f(records.median(tiles), "tokens/s")
            values["ch3.tiles_vs_matrices"] = compare.versus(tiles, arena)
            values["ch3.tiles_rounds"] = str(tiles["seconds"]["n"])
    if records.exists(RECORD_RUN, rec_dir):
        run_figure_and_values(records.load(RECORD_RUN, rec_dir), values)
    else:
        values.update({f"ch3.{k}": None for k in RUN_KEYS})
    if rec is None:
        values.update({f"ch3.{k}": None for k in STEP_KEYS})
    return values
