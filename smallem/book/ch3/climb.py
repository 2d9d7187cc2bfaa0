"""Each switch of chapter 3's climb: the change its prediction allows, the change measured, and
whether this machine's rounds could show the first.

A rung's prediction (``predicted.predicted``) is the rung before's measured step less what the
one switch can save, each saving from a measurement of that switch alone (a fork-join, a
bandwidth, a profile, a peak). So the prediction is a *change*, and it is read as one: the
change it allows against the change the paired rounds measured. A change smaller than the
rounds' own spread (half the interquartile range of the per-round changes) cannot be seen in
that many rounds whatever it is; the page says so instead of quoting a ratio of two
near-equal numbers. Where the rounds do tell the two steps apart, the prediction is judged with
a stated tolerance (TOLERANCE): "as predicted" only where the measured change has the
predicted sign and is within that factor of it, the two changes compared as they are (not the
step times they come from, which would let almost any change of the right sign through); a
prediction made of parts (rung 7's: Newton-Schulz added, the rest of the step unchanged) is
as predicted only where each part's time is within that factor of its own too. Otherwise the
page gives both figures and what the prediction left out.
"""

from __future__ import annotations

import math

import numpy as np

from .. import compare
from .measuring import AT, RUNGS

TOLERANCE = 1.5  # "as predicted": the same sign, and within this factor of the prediction

# the table's cell for each outcome: the prediction's verdict in the book's three words first
OUTCOMES = {
    "small": "not shown: predicted below the rounds' spread, and within the noise",
    "beyond": "not reached: predicted below the rounds' spread, yet measured",
    "as": f"reached: the predicted direction, within a factor of {TOLERANCE:g}",
    "parts": f"not reached: within a factor of {TOLERANCE:g} in total, not in its parts",
    "missed": f"not reached: the predicted direction, outside a factor of {TOLERANCE:g}",
    "unseen": "not shown: within the noise",
    "against": "not reached: measured against the predicted direction",
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
    if small and d.sign == 0:
        return "small"
    if small and not ((d.sign > 0) == (pred_pct > 0) and abs(d.pct) <= TOLERANCE * abs(pred_pct)):
        return "beyond"  # the other way, or further than the switch's saving explains
    if d.sign == 0:
        return "unseen"
    if (d.sign > 0) != (pred_pct > 0):
        return "against"
    return "as" if within(pred_pct, d.pct) else "missed"


def within(pred_pct: float, meas_pct: float, factor: float = TOLERANCE) -> bool:
    """A measured change of ``meas_pct`` % as predicted by ``pred_pct`` %: the same sign and
    within ``factor`` of it, the changes themselves compared (+8.3 % against a predicted
    +12.7 % is a factor of 1.53: outside 1.5)."""
    if pred_pct == 0 or (pred_pct > 0) != (meas_pct > 0):
        return False
    return within_times(abs(pred_pct), abs(meas_pct), factor)


def within_times(a: float, b: float, factor: float = TOLERANCE) -> bool:
    """Two positive times (or sizes) within ``factor`` of each other."""
    return a > 0 and b > 0 and max(a, b) <= factor * min(a, b)


def cell(r: dict, base: dict) -> str:
    """r against base for a table cell: the change and the rounds r was ahead in, the test
    left to the table's caption (CELL_TEST)."""
    d = compare.difference(r, base)
    told = f"{abs(d.pct):.1f} % {'faster' if d.pct > 0 else 'slower'}"
    if d.rounds is None:
        return told
    if d.sign == 0 or (d.sign > 0) != (d.pct > 0):
        told = f"within the noise ({told})"
    return f"{told}, ahead in {d.ahead} of {d.rounds}"


CELL_TEST = ("\"Within the noise\": the two-sided signed-rank test on the per-round log ratios "
             "does not pass at 5 %; \"ahead in\": the rounds the first was the faster in. The "
             "change is the ratio of the two steps' medians, each over its own rounds, while "
             "\"ahead in\" pairs them round by round: a step can be slower at the median and "
             "still ahead in most rounds.")


def _pct(x: float) -> str:
    return f"{x:+.1f} %" if abs(x) >= 0.1 else f"{x:+.2g} %"


def switches(rungs: dict, toks: dict, pred: dict, parts_missed=frozenset()) -> tuple[dict, dict]:
    """For each rung from the pool on: {rung: (predicted change, outcome words)} for the
    table, and the page's values: each rung's predicted change, spread and outcome as facts,
    and the rungs of each outcome as a list. A rung in ``parts_missed`` (a prediction made of
    parts, one of which missed its own) is not as predicted even where its total is."""
    cells, values = {}, {}
    groups = {k: [] for k in OUTCOMES}
    values["ch3.climb_beyond_other"] = False
    for r in RUNGS[AT["pool"]:]:
        i, before = r.index, r.index - 1
        # typed, for the page to format: the predicted and measured changes and the rounds'
        # spread as signed fractions (0.016 is +1.6 %), the outcome as an OUTCOMES key
        values.update({f"ch3.rung{i}_pred": None, f"ch3.rung{i}_meas": None,
                       f"ch3.rung{i}_spread": None, f"ch3.rung{i}_shows": None})
        if i not in pred or before not in toks or i not in rungs or before not in rungs:
            continue
        pred_pct = 100 * (pred[i][0] / toks[before] - 1)
        d = compare.difference(rungs[i], rungs[before])
        sp = spread(rungs[i], rungs[before])
        kind = outcome(pred_pct, d, sp)
        if kind == "as" and i in parts_missed:
            kind = "parts"
        groups[kind].append(f"{r.what} (rung {i})")
        if kind == "beyond" and (d.pct < 0) != (pred_pct < 0):
            values["ch3.climb_beyond_other"] = True  # one of them moved the other way
        said = OUTCOMES[kind]
        if kind == "beyond":  # which way the step moved, past what the switch could explain
            said += (" the other way (slower)" if (d.pct < 0) != (pred_pct < 0)
                     else " beyond it")
        cells[i] = (_pct(pred_pct), said)
        values.update({f"ch3.rung{i}_pred": pred_pct / 100, f"ch3.rung{i}_meas": d.pct / 100,
                       f"ch3.rung{i}_spread": sp / 100, f"ch3.rung{i}_shows": kind})
    for k, names in groups.items():
        values[f"ch3.climb_{k}"] = compare.listing(names, "none")
        values[f"ch3.climb_any_{k}"] = bool(names)
    return cells, values


def outcome_note() -> str:
    return ("The prediction is reached where the rounds tell the two steps apart and the "
            "change they show is one it allows, not reached where they show one it does not, "
            "not shown where they do not tell the steps apart. "
            "Predicted change: the rung's prediction over the rung before's measured step. "
            "A change is too small for the rounds to show where it is under half the "
            "interquartile range of the per-round changes. A measured change is as predicted "
            f"where it has the predicted sign and is within a factor of {TOLERANCE:g} of the "
            "predicted change (the two changes compared, not the step times); rung 7's "
            "prediction, Newton-Schulz added to a step otherwise unchanged, also needs each "
            "of the two parts' times within that factor of its own.")

