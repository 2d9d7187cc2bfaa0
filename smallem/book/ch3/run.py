"""Chapter 3's real run read for the page: each run's loss curve, how long it took, and the
held-out losses compared at the same training time."""

from __future__ import annotations

import numpy as np

from smallem.training.train import LN2
from .. import compare, figures, records

f = figures.fmt
# the values the real run gives the page (None each without its record)
RUN_KEYS = (
    "bf16_final_bpb", "bf16_steps", "bf16_tokens_per_s", "corpus_files", "corpus_mb",
    "corpus_sha", "modern_final_bpb", "modern_steps", "modern_tokens_per_s", "run_budget",
    "run_common_s", "run_long", "run_seconds", "run_short", "run_steps_s", "run_winner",
    "s_final_bpb", "s_steps", "s_tokens_per_s", "size_measured", "size_rows", "size_fastest",
    "size_run_rung", "size_run_vs_fastest", "size_run_gap", "size_run_slower",
)


def same_time_losses(runs: dict) -> tuple[float, dict]:
    """(the training time every run reached, {run: its held-out loss at its last evaluation no
    later than that}): the runs' budgets fix their steps in advance, so they end a few
    seconds apart, and the longest would otherwise win by its extra time."""
    at_eval = {}
    for name, run in runs.items():
        c = run["curve"]
        at_eval[name] = [(c["seconds"][c["step"].index(st)], v)
                         for st, v in zip(c["val_step"], c["val_bpb"])]
    common = min(pts[-1][0] for pts in at_eval.values() if pts)
    edge = common * (1 + 1e-9)
    return common, {name: [v for t, v in pts if t <= edge][-1]
                    for name, pts in at_eval.items() if pts and pts[0][0] <= edge}


def run_times(runs: dict, minutes: float) -> dict:
    """How long each run trained (its steps' seconds, evaluations not counted) against the
    budget, and why they differ: each run's step count is the budget over the median of a
    few steps of a throwaway copy, so that median is the budget over the count (to the
    count's rounding down), and the run trains for the count times its own mean step."""
    took, probe, own = {}, {}, {}
    for name, run in runs.items():
        c = run["curve"]
        if not c["seconds"]:
            continue
        took[name] = c["seconds"][-1]
        probe[name] = 60 * minutes / run["total_steps"]
        own[name] = took[name] / len(c["seconds"])
    budget = 60 * minutes
    return {
        "ch3.run_seconds": compare.listing([f"{f(t, 's')} ({n})" for n, t in took.items()],
                                           "not recorded"),
        "ch3.run_steps_s": compare.listing(
            [f"{f(own[n], 's')} against {f(probe[n], 's')} ({n})" for n in took],
            "not recorded"),
        # typed: a run ended more than a tenth before (or after) the budget
        "ch3.run_short": any(t < 0.9 * budget for t in took.values()),
        "ch3.run_long": any(t > 1.1 * budget for t in took.values()),
    }


def size_values(rec, runs) -> dict:
    """The climb's f32 rungs timed in turn at the real run's size (typed): each rung's number,
    what it adds and its tokens/s; the fastest rung; the f32 run's own rung, and its rate
    against the fastest's as prose (None each where the record predates this timing)."""
    from smallem.training.train import RUNGS

    found = {r["params"]["rung"]: r for r in records.results(rec, "run_size_step")}
    run_rung = next((r.index for r in RUNGS if r.run.get("backend") == runs["f32"].get("backend")
                     and r.run.get("pool", False) == runs["f32"].get("pool", False)), None)
    if not found or run_rung not in found:
        return {"ch3.size_measured": False, "ch3.size_rows": None, "ch3.size_fastest": None,
                "ch3.size_run_rung": None, "ch3.size_run_vs_fastest": None, "ch3.size_run_gap": None,
                "ch3.size_run_slower": None}
    fastest = max(found, key=lambda i: records.median(found[i]))
    return {"ch3.size_measured": True,
            "ch3.size_rows": [[i, RUNGS[i].what, records.median(found[i])] for i in sorted(found)],
            "ch3.size_fastest": fastest, "ch3.size_run_rung": run_rung,
            "ch3.size_run_vs_fastest": (compare.versus(found[run_rung], found[fastest])
                                        if fastest != run_rung else None),
            # typed: the rounds' test shows the run's rung slower than the fastest
            "ch3.size_run_slower": (fastest != run_rung
                                    and compare.difference(found[run_rung], found[fastest]).sign < 0),
            # the f32 run's own rate (its tokens over its training time) against its rung's
            # timed median at this size, as a signed fraction
            "ch3.size_run_gap": (_run_rate(runs["f32"]) / records.median(found[run_rung]) - 1
                                 if _run_rate(runs["f32"]) else None)}


def _run_rate(run: dict) -> float | None:
    """A run's tokens over its training time (evaluations not counted)."""
    c = run.get("curve") or {}
    return (len(c["step"]) * run["batch_size"] * run["seq_len"] / c["seconds"][-1]
            if c.get("seconds") else None)


def run_figure_and_values(rec, values):
    s = rec["settings"]
    runs = s["runs"]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    f32 = runs["f32"]["curve"]
    ax.plot(f32["step"], np.array(f32["loss"]) / LN2, lw=0.8, color="tab:blue",
            label="training batch")
    ax.plot(f32["val_step"], f32["val_bpb"], "o-", color="tab:red", label="held-out files")
    ax.set_xlabel("step")
    ax.set_title(f"f32: config {runs['f32']['config']['name']}, {runs['f32']['batch_size']} x "
                 f"{runs['f32']['seq_len']} tokens per step", fontsize=9)
    colours = {"f32": "tab:red", "bf16": "tab:green", "modern": "tab:purple"}
    for name, run in runs.items():
        c = run["curve"]
        at = [c["seconds"][c["step"].index(st)] for st in c["val_step"]]
        what = {"f32": "GPT-2, f32", "bf16": "GPT-2, bf16",
                "modern": f"modern block + {run.get('optimizer', 'adamw')}, bf16"}.get(name, name)
        bx.plot(at, c["val_bpb"], "o-", color=colours.get(name, "tab:purple"),
                label=f"{what}, held-out")
    bx.set_xlabel("training time (s, evaluations not counted)")
    bx.set_title(f"the same training time ({f(s['minutes'], 'min')}) for each run", fontsize=9)
    for a in (ax, bx):
        a.set_ylabel("loss (bits per byte)")
        a.set_ylim(0, 8.5)
        a.legend(fontsize=8)
        a.grid(alpha=0.3)
    figures.save(fig, "ch3_loss")
    final = {name: records.median(records.results(rec, "final_val_bpb", run=name)[0])
             for name in runs}
    for name, prefix in (("f32", "s"), ("bf16", "bf16"), ("modern", "modern")):
        if name not in runs:
            continue
        values[f"ch3.{prefix}_final_bpb"] = f"{final[name]:.2f} bits per byte"
        values[f"ch3.{prefix}_steps"] = str(runs[name]["total_steps"])
        # the run's tokens over its training time (evaluations not counted), the figure a
        # reader gets from its steps, batch and time; the record's per-step median beside it
        # would differ by the steps that ran slow
        run, c = runs[name], runs[name]["curve"]
        values[f"ch3.{prefix}_tokens_per_s"] = (
            f(len(c["step"]) * run["batch_size"] * run["seq_len"] / c["seconds"][-1], "tokens/s")
            if c["seconds"] else f(records.median(records.results(
                rec, "train_tokens_per_s", run=name)[0]), "tokens/s"))
    values.update(size_values(rec, runs))
    values["ch3.run_budget"] = f(s["minutes"], "min")
    values.update(run_times(runs, s["minutes"]))
    common, same = same_time_losses(runs)
    values["ch3.run_common_s"] = f(common, "s")
    best = min(same, key=same.get)
    values["ch3.run_winner"] = (f"{best} ({same[best]:.2f} against "
                                + ", ".join(f"{same[k]:.2f} for {k}" for k in same if k != best)
                                + " bits per byte)")
    values["ch3.corpus_sha"] = s["corpus"]["sha256"][:12]
    values["ch3.corpus_files"] = str(s["corpus"]["files"])
    values["ch3.corpus_mb"] = f((s["corpus"]["train_bytes"] + s["corpus"]["val_bytes"]) / 1e6,
                                "MB")
    sample = runs["f32"].get("sample", "")
    path = figures.tables_dir() / "ch3_sample.md"
    # control bytes and broken UTF-8 of an untrained model would break the page: show them as ·
    clean = "".join(ch if ch.isprintable() or ch in "\n\t" else "·" for ch in sample)
    figures.write(path, "```text\n" + clean.replace("```", "'''") + "\n```\n")
