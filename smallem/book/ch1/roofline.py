"""Chapter 1's roofline: the measured ceilings (peaks and each level's bandwidth) with a
chapter's kernels placed on them."""

from __future__ import annotations

import math

import numpy as np

from .. import figures


def roofline_figure(points: list[tuple[str, float, float]], name: str, sm: dict,
                    stream: str = "triad"):
    """Chapter 1's roofline with ``points`` [(label, flop per byte, Gop/s)] placed on it, from
    ``sm``, chapter 1's facts (:func:`smallem.book.ch1.facts`: the summary and its record).

    The ceilings are this machine's measured ones: the f32, bf16, int8 (and AMX) peaks on
    all cores, and one bandwidth slope per level of the staircase (``stream``: the triad, or
    the read-only stream where the record has it and the kernels only read); the f32 roof of
    one core, thinner and dashed, is beside them for the kernels that run on one. Points
    whose labels start with a number (a ladder's rungs) are marked by that number, their
    labels in the legend, so that close points cannot take each other's names.
    Later chapters call this to place their kernels.
    """
    if not figures.DRAW:  # a reading for values only: no figure, and none of its layout
        return []
    import matplotlib.pyplot as plt

    rec = sm["record"]
    cores = sm["cores"]
    x = np.logspace(-2, 3, 400)
    fig, ax = plt.subplots(figsize=(9.5, 4.8))
    f32 = sm["peak"][("f32", cores)]
    colors = {"L1": "#2a9d8f", "L2": "#8ab17d", "L3": "#e9c46a", "DRAM": "#e76f51"}
    stream = stream if f"{stream}_plateaus" in sm else "triad"
    named = "read" if stream == "read" else "triad"
    for level, bw in sm[f"{stream}_plateaus"][cores].items():
        if math.isnan(bw):
            continue
        ax.plot(x, np.minimum(bw * x, f32), color=colors[level], lw=1.6,
                label=f"{level} {figures.fmt(bw, 'GB/s')} ({named})")
    roofs = []  # (Gop/s, label, colour, line style, width): the horizontal ceilings
    if cores > 1:  # one core's roof: its own peak and bandwidths
        f32_1 = sm["peak"][("f32", 1)]
        for level, bw in sm[f"{stream}_plateaus"][1].items():
            if not math.isnan(bw):
                ax.plot(x, np.minimum(bw * x, f32_1), color=colors[level], lw=0.9, ls="--",
                        label=f"{level}, 1 core {figures.fmt(bw, 'GB/s')}")
        roofs.append((f32_1, "f32, 1 core", "black", "--", 0.9))
    peak_colors = {"bf16": "#6a4c93", "int8": "#1982c4", "amx_bf16": "#8d5a97",
                   "amx_int8": "#3a86ff"}
    for kind, style in (("bf16", ":"), ("int8", (0, (6, 2, 1, 2))), ("amx_bf16", "-."),
                        ("amx_int8", (0, (1, 4)))):
        if (kind, cores) in sm["peak"]:
            roofs.append((sm["peak"][(kind, cores)], kind.replace("_", " "), peak_colors[kind],
                          style, 1.1))
    roofs.append((f32, "f32", "black", "-", 1.2))
    for value, what, color, style, width in roofs:
        ax.axhline(value, color=color, ls=style, lw=width,
                   label=f"{what} peak {figures.fmt(value, 'Gop/s')}")
    # each ceiling named on the figure at its left end, the names pushed apart where two
    # ceilings nearly coincide (the bf16 peak can sit on one core's f32 peak)
    placed = {"left": [], "right": []}
    for value, what, color, *_ in sorted(roofs):
        side = next((sd for sd in ("left", "right")
                     if not any(value < v * 1.5 and v < value * 1.5 for v in placed[sd])),
                    "left")
        placed[side].append(value)
        ax.annotate(f"{what} {figures.fmt(value, 'Gop/s')}",
                    (x[0] if side == "left" else x[-1], value),
                    xytext=(3 if side == "left" else -3, 2), textcoords="offset points",
                    fontsize=7, color=color, va="bottom",
                    ha="left" if side == "left" else "right")
    _place(ax, points)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (operations per byte)")
    ax.set_ylabel("Gop/s")
    ax.set_title(f"Roofline, {cores} cores (solid) and 1 core (dashed): {rec['machine']['cpu']}",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    # the legend beside the axes, never over a kernel's point
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    return figures.save(fig, name)


def _place(ax, points):
    """The kernels' dots: a ladder's rungs (labels that start with a number) marked by their
    number, their names in the legend; other points labelled beside their dots."""
    numbered = bool(points) and all(p[0].split(" ", 1)[0].isdigit() for p in points)
    for label, ai, gops in points:
        if numbered:  # the rung's number beside its dot, its name in the legend
            tag, rest = label.strip().split(" ", 1)
            ax.plot([ai], [gops], "o", ms=7, color="#d62828", zorder=5, label=f"{tag}: {rest}")
            ax.annotate(tag, (ai, gops), textcoords="offset points", xytext=(5, 4), fontsize=9,
                        fontweight="bold", zorder=6)
            continue
        ax.plot([ai], [gops], "o", ms=7, color="#d62828", zorder=5)
        ax.annotate(label, (ai, gops), textcoords="offset points", xytext=(-6, 8), fontsize=8,
                    ha="right", zorder=5)
