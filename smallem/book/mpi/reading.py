"""The appendix's record read into its tables, figure and values."""

from __future__ import annotations

from .. import ch1, compare, figures, records
from smallem.training.distributed import TIMEOUT
from .measuring import AVERAGE_EVERY, LINKS_GBIT, MACHINES, RECORD

f = figures.fmt
NOT_MEASURED = "not measured here (no MPI: `pip install -e '.[mpi]'`)"
KEYS = ("mpi.run_slower", "mpi.config", "mpi.batch", "mpi.ranks", "mpi.one_tps", "mpi.ranks_tps", "mpi.ratio",
        "mpi.rounds", "mpi.verdict", "mpi.outcome", "mpi.comm_ms", "mpi.comm_share", "mpi.mb_per_step", "mpi.grad_mb",
        "mpi.curve_steps", "mpi.curve_tokens", "mpi.bpb_k1", "mpi.bpb_k10", "mpi.bpb_k100",
        "mpi.model_16_10", "mpi.model_16_100", "mpi.model_eff_16_10", "mpi.comm_gbs",
        "mpi.dram_gbs", "mpi.backend", "mpi.pool", "mpi.run_tps", "mpi.run_backend",
        "mpi.size_tiles_slower")
DESIGN = ("mpi.k_mid", "mpi.k_top", "mpi.machines_top", "mpi.link_low", "mpi.link_top",
          "mpi.timeout")


def ring_seconds(nbytes: float, machines: int, gbit: float) -> float:
    """A ring all-reduce's time: each machine sends and receives 2 (N - 1) / N of the
    message, over a link of ``gbit`` Gbit/s; latency and overlap with compute ignored."""
    return 2 * (machines - 1) / machines * nbytes * 8 / (gbit * 1e9)


def model(step_seconds: float, tokens_per_step: int, grad_bytes: int, machines: int,
          gbit: float, average_every: int = 1) -> float:
    """Tokens/s of ``machines`` copies of this machine, each with the whole batch of the
    one-process step (weak scaling). Every step all-reduces the gradient (average_every 1);
    local SGD instead all-reduces the weights and Adam's two moments every K steps."""
    nbytes = grad_bytes if average_every == 1 else 3 * grad_bytes / average_every
    return machines * tokens_per_step / (step_seconds + ring_seconds(nbytes, machines, gbit))


def design_values() -> dict:
    """The appendix's settings, from the code: the schemes, machines and links it shows."""
    return {"mpi.k_mid": str(AVERAGE_EVERY[1]), "mpi.k_top": str(AVERAGE_EVERY[-1]),
            "mpi.machines_top": str(MACHINES[-1]), "mpi.link_low": f"{LINKS_GBIT[0]} Gbit/s",
            "mpi.link_top": f"{LINKS_GBIT[-1]} Gbit/s", "mpi.timeout": f"{TIMEOUT:g} s"}


def _verdict(many: dict, one: dict) -> str:
    d = compare.difference(many, one)
    if d.rounds is None:
        return "the rounds were not kept"
    if d.sign == 0:
        return "the two are within the noise of each other" + compare.note(d.note())
    return ("the ranks are faster" if d.sign > 0 else "the one process is faster") + \
        compare.note(d.note())


def _outcome(many: dict, one: dict) -> str | None:
    """The rounds' outcome as a name for the page to choose its sentences by: "faster" (the
    ranks), "slower", "noise", or None where the rounds were not kept."""
    d = compare.difference(many, one)
    if d.rounds is None:
        return None
    return "noise" if d.sign == 0 else "faster" if d.sign > 0 else "slower"


def _one(rec, name, **params):
    found = records.results(rec, name, **params)
    return found[0] if found else None


def _missing(note: str, why: str) -> dict:
    """No measurement: every value None, and why in words for the page's one sentence at its
    head (the measured sections are left out)."""
    for name in ("mpi_throughput", "mpi_model"):
        figures.write_table(name, [], ["(nothing measured)"], note)
    _curve_figure({}, note)
    return {**{k: None for k in KEYS}, **design_values(), "mpi.measured": False,
            "mpi.missing_why": why}


def _curve_figure(curves: dict, note: str = ""):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for k, pts in curves.items():
        label = "gradients all-reduced every step" if k == 1 else f"local SGD, averaged every {k}"
        ax.plot([p[0] / 1e6 for p in pts], [p[1] for p in pts], marker="o", label=label)
    if curves:
        ax.legend()
    else:
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("tokens trained (millions)")
    ax.set_ylabel("validation bits per byte")
    ax.grid(alpha=0.3)
    figures.save(fig, "mpi_loss")


def report(rec_dir=None) -> dict:
    if not records.exists(RECORD, rec_dir):
        return _missing("no record mpi.train: run `smallem bench-distributed`",
                        "`smallem bench-distributed` makes it")
    rec = records.load(RECORD, rec_dir)
    s = rec["settings"]
    if s.get("missing"):
        return _missing(f"not measured: {s['missing']}", f"when it ran, {s['missing']}")
    ranks = s["ranks"]
    one = _one(rec, "step", ranks=1)
    many = _one(rec, "step", ranks=ranks)
    comm = _one(rec, "communication")
    rounds = compare.rounds_ahead(many, one)  # fewer seconds = ahead
    step_s = one["seconds"]["median"]
    rows = []
    for r in (one, many):
        rows.append([r["params"]["case"], str(r["params"]["ranks"]), str(r["params"]["threads"]),
                     f(records.median(r), "tokens/s"),
                     f"{f(r['value']['min'])} to {f(r['value']['max'])}"])
    figures.write_table("mpi_throughput", rows,
                        ["case", "processes", "threads each", "tokens/s (median)", "range"],
                        f"Config {s['config'] if isinstance(s['config'], str) else s['config']['name']}, "
                        f"global batch {s['batch']}, {s['rounds']} rounds in turn, each the median of "
                        f"{s['steps']} steps after {s['warmup']}. {figures.machine_line(rec)}.")
    grad = comm["params"]["grad_bytes"]
    mrows = []
    for n in s["machines"]:
        for g in s["links_gbit"]:
            cells = [str(n), f"{g} Gbit/s"]
            for k in (1, 10):
                tps = model(step_s, one["params"]["tokens_per_step"], grad, n, g, k)
                eff = tps / (n * records.median(one))
                cells.append(f"{f(tps)} ({100 * eff:.0f} %)")
            mrows.append(cells)
    figures.write_table("mpi_model", mrows,
                        ["machines", "link", "all-reduce every step: tokens/s (efficiency)",
                         "local SGD, every 10: tokens/s (efficiency)"],
                        "A model, not a measurement: this machine's one-process step and "
                        "gradient size, a ring all-reduce at the link's full rate, no latency, "
                        "no overlap of sending with computing.")
    curves = {}
    for r in records.results(rec, "val_bpb"):
        curves.setdefault(r["params"]["average_every"], []).append(
            (r["params"]["tokens"], records.median(r)))
    _curve_figure({k: sorted(v) for k, v in sorted(curves.items())})
    last = {k: sorted(v)[-1] for k, v in curves.items()}
    top, low, high = MACHINES[-1], LINKS_GBIT[0], LINKS_GBIT[-1]
    m16 = {g: model(step_s, one["params"]["tokens_per_step"], grad, top, g) for g in (low, high)}
    values = {
        "mpi.config": s["config"] if isinstance(s["config"], str) else s["config"]["name"],
        "mpi.batch": str(s["batch"]), "mpi.ranks": str(ranks),
        "mpi.one_tps": f(records.median(one), "tokens/s"),
        "mpi.ranks_tps": f(records.median(many), "tokens/s"),
        "mpi.ratio": f"{f(many['value']['median'] / one['value']['median'])} times",
        "mpi.rounds": compare.rounds_text(rounds),
        "mpi.verdict": _verdict(many, one),
        "mpi.outcome": _outcome(many, one),
        "mpi.comm_ms": f(1e3 * records.median(comm), "ms"),
        "mpi.comm_share": f"{100 * comm['value']['median'] / many['seconds']['median']:.0f} %",
        # the bytes each rank sends a step over the time in collectives, against the slowest
        # level chapter 1 measured one core to stream (DRAM)
        "mpi.comm_gbs": comm["params"]["bytes_per_step"] / records.median(comm) / 1e9,
        "mpi.dram_gbs": _dram_gbs(rec_dir),
        "mpi.mb_per_step": f(comm["params"]["bytes_per_step"] / 1e6, "MB"),
        "mpi.grad_mb": f(grad / 1e6, "MB"),
        "mpi.curve_steps": str(s["curve_steps"]),
        "mpi.curve_tokens": f(max(t for t, _ in last.values()) / 1e6, "million"),
        "mpi.model_16_10": f(m16[low], "tokens/s"), "mpi.model_16_100": f(m16[high], "tokens/s"),
        "mpi.model_eff_16_10": f"{100 * m16[low] / (top * one['value']['median']):.0f} %",
    }
    values.update(_beside_chapter3(s, rec_dir))
    # typed: chapter 3's real run slower than this chapter's one-process step (None: no run)
    values["mpi.run_slower"] = (values["mpi.run_tps"] < records.median(one)
                                if values["mpi.run_tps"] is not None else None)
    for k, key in zip(AVERAGE_EVERY, ("mpi.bpb_k1", "mpi.bpb_k10", "mpi.bpb_k100")):
        values[key] = f"{last[k][1]:.3f}" if k in last else "n/a"
    assert set(values) == set(KEYS)
    return {**values, **design_values(), "mpi.measured": True, "mpi.missing_why": None}


def _beside_chapter3(s: dict, rec_dir) -> dict:
    """The path the steps took (typed: backend, pool), and chapter 3's real run of the same
    model in f32 where its record has one of the same config and batch (its backend and its
    tokens/s; None otherwise). Records made before the path was kept ran the Trainer's
    defaults of the time: the kernels backend on OpenMP's threads."""
    out = {"mpi.backend": s.get("backend") or "kernels", "mpi.pool": bool(s.get("pool")),
           "mpi.run_tps": None, "mpi.run_backend": None, "mpi.size_tiles_slower": None}
    if not records.exists("ch3.train_run", rec_dir):
        return out
    run = records.load("ch3.train_run", rec_dir)
    f32 = run["settings"].get("runs", {}).get("f32", {})
    name = s["config"] if isinstance(s["config"], str) else s["config"]["name"]
    c = f32.get("curve", {})
    if (c.get("seconds") and f32.get("config", {}).get("name") == name
            and f32.get("batch_size") == s["batch"]):  # its tokens over its training time
        tps = len(c["step"]) * f32["batch_size"] * f32["seq_len"] / c["seconds"][-1]
        out.update({"mpi.run_tps": tps, "mpi.run_backend": f32.get("backend")})
        # chapter 3's f32 rungs timed in turn at this size: the attention in tiles and the
        # fused layers (rungs 4, 5) against rung 3's matrices, where that record has them
        size = {r["params"]["rung"]: records.median(r)
                for r in records.results(run, "run_size_step")}
        if size:
            out["mpi.size_tiles_slower"] = size.get(5, 0) < size.get(3, 0)  # the run's path, rung 5's
    return out


def _dram_gbs(rec_dir) -> float | None:
    """Chapter 1's DRAM bandwidth on one core (its read-only stream where the record has it)."""
    facts = ch1.facts(rec_dir)
    if not facts:
        return None
    ext = facts[f"{ch1.read_stream(facts)}_spans"]
    return ext[1 if 1 in ext else min(ext)]["DRAM"]["bw"]
