"""Each switch of chapter 3's climb: the change its prediction allows, the change measured, and
whether this machine's rounds could show the first.

A rung's prediction (``reading.predicted``) is the rung before's measured step less what the
one switch can save, each saving from a measurement of that switch alone (a fork-join, a
bandwidth, a profile, a peak). So the prediction is a *change*, and it is read as one: the
change it allows against the change the paired rounds measured. A change smaller than the
rounds' own spread (half the interquartile range of the per-round changes) cannot be seen in
that many rounds whatever it is; the page says so instead of quoting a ratio of two
near-equal numbers.
"""

from __future__ import annotations

import math

import numpy as np

from .. import compare
from .measuring import AT, RUNGS

OUTCOMES = {
    "small": "predicted too small for the rounds to show, and within the noise",
    "beyond": "predicted too small for the rounds to show, yet measured",
    "as": "measured in the predicted direction",
    "unseen": "predicted, not seen: within the noise",
    "against": "measured against the prediction's direction",
}


def spread(r: dict, base: dict) -> float:
    """Half the interquartile range of the per-round changes of r over base, in per cent."""
    logs = compare.log_ratios(compare.per_round_rates(r), compare.per_round_rates(base))
    if len(logs) < 2:
        return math.nan
    q1, q3 = np.percentile(logs, [25, 75])
    return 100 * (math.exp((q3 - q1) / 2) - 1)


def outcome(pred_pct: float, d: compare.Difference, spread_pct: float) -> str:
    """One of OUTCOMES' keys for a switch predicted to change the step by ``pred_pct`` %."""
    small = not abs(pred_pct) >= spread_pct
    if small:
        return "small" if d.sign == 0 else "beyond"
    if d.sign == 0:
        return "unseen"
    return "as" if (d.sign > 0) == (pred_pct > 0) else "against"


def _pct(x: float) -> str:
    return f"{x:+.1f} %" if abs(x) >= 0.1 else f"{x:+.2g} %"


def switches(rungs: dict, toks: dict, pred: dict) -> tuple[dict, dict]:
    """For each rung from the pool on: {rung: (predicted change, outcome words)} for the
    table, and the page's values: each rung's predicted change, spread and outcome as facts,
    and the rungs of each outcome as a list."""
    cells, values = {}, {}
    groups = {k: [] for k in OUTCOMES}
    for r in RUNGS[AT["pool"]:]:
        i, before = r.index, r.index - 1
        values.update({f"ch3.rung{i}_pred_change": "n/a", f"ch3.rung{i}_spread": "n/a",
                       f"ch3.rung{i}_shows": "n/a"})
        if i not in pred or before not in toks or i not in rungs or before not in rungs:
            continue
        pred_pct = 100 * (pred[i][0] / toks[before] - 1)
        d = compare.difference(rungs[i], rungs[before])
        sp = spread(rungs[i], rungs[before])
        kind = outcome(pred_pct, d, sp)
        groups[kind].append(f"{r.what} (rung {i})")
        cells[i] = (_pct(pred_pct), OUTCOMES[kind])
        values[f"ch3.rung{i}_pred_change"] = _pct(pred_pct)
        values[f"ch3.rung{i}_spread"] = f"{sp:.1f} %"
        values[f"ch3.rung{i}_shows"] = kind  # an OUTCOMES key, for the page's conditionals
    for k, names in groups.items():
        values[f"ch3.climb_{k}"] = compare.listing(names, "none")
        values[f"ch3.climb_any_{k}"] = bool(names)
    return cells, values


def outcome_note() -> str:
    return ("Predicted change: the rung's prediction over the rung before's measured step. "
            "A change is too small for the rounds to show where it is under half the "
            "interquartile range of the per-round changes.")

