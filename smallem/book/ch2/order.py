"""Chapter 2's loop order read from its record: what the model weighed, what it chose, and
what the other order did on the same machine, timed in turn."""

from __future__ import annotations

from smallem.product import gemm
from .. import compare, figures, records


MODEL_KEYS = ("ch2.order", "ch2.order_other", "ch2.order_need", "ch2.order_have", "ch2.order_need_share",
              "ch2.order_headroom", "ch2.order_bytes_per_op", "ch2.order_forced",
              "ch2.order_model")
RULE_KEYS = ("ch2.order_timed_n", "ch2.order_timed_rounds", "ch2.order_timed_ahead")
TIMED_KEYS = ("ch2.order_n", "ch2.order_chosen_gops", "ch2.order_other_gops",
              "ch2.order_other_vs")


def order_values(rec: dict, facts: dict | None = None) -> dict:
    """The page's numbers on the order of the tiles ("order" results and the settings); "not
    measured at <commit>" for what a record made before the order's model lacks."""
    f = figures.fmt
    s = rec["settings"]
    if not {"order", "order_why", "feeds"} <= set(s):
        return dict.fromkeys(MODEL_KEYS + TIMED_KEYS, records.not_measured(
            rec, "the record predates the loop-order model")) | dict.fromkeys(RULE_KEYS) | {
                "ch2.has_order_timed": False, "ch2.order_overruled": False,
                "ch2.order_other_faster": False, "ch2.order_other_slower": False,
                "ch2.has_order_model": False, "ch2.has_order_timing": False,
                "ch2.order_l3_ch1": None, "ch2.order_have_low": False,
                "ch2.order_same_with_ch1": None}
    why, chosen = s["order_why"], s["order"]
    other = next(o for o in gemm.ORDERS if o != chosen)
    found = {r["params"]["order"]: r for r in records.results(rec, "order")}
    values = {
        "ch2.order": chosen, "ch2.order_other": other,
        "ch2.order_need": f(why["need_gbs"], "GB/s"),
        "ch2.order_have": f(why["have_gbs"], "GB/s"),
        "ch2.order_headroom": f"{100 * why['headroom']:.0f} %",
        "ch2.order_bytes_per_op": f(why["bytes_per_op"], "byte"),
        # typed: the row order's need over what each core got from the L3
        "ch2.order_need_share": why["need_gbs"] / why["have_gbs"] if why["have_gbs"] else None,
        "ch2.order_forced": "set" if (s.get("env") or {}).get(gemm.ORDER_ENV) else "not set",
        # the model's choice, before the timing (gemm.order_rule) kept or overruled it; a
        # record from before the timing took the model's
        "ch2.order_model": s.get("order_model") or chosen,
    }
    values.update(_rule_values(s.get("order_timed"), chosen, values["ch2.order_model"]))
    # chapter 1's own L3 triad on all cores, a core's share: the model's reading far below it
    # was a disturbed one, and the order rests on it
    l3 = facts["triad_plateaus"][facts["cores"]]["L3"] / facts["cores"] if facts else None
    values["ch2.order_l3_ch1"] = l3 if l3 == l3 else None
    values["ch2.order_have_low"] = bool(l3 == l3 and l3 and why["have_gbs"] < 0.5 * l3)
    # the model's choice with chapter 1's figure in place of its own reading: the same order?
    fits = lambda have: why["need_gbs"] <= why["headroom"] * have  # noqa: E731
    values["ch2.order_same_with_ch1"] = bool(l3 == l3 and l3 and
                                             fits(l3) == fits(why["have_gbs"]))
    if set(found) != set(gemm.ORDERS):
        values.update(dict.fromkeys(TIMED_KEYS, records.not_measured(
            rec, "the record did not time both orders")))
        return values | {"ch2.order_other_faster": False, "ch2.order_other_slower": False,
                          "ch2.has_order_model": True, "ch2.has_order_timing": False}
    values.update({
        "ch2.order_n": str(found[chosen]["params"]["n"]),
        "ch2.order_chosen_gops": f(records.median(found[chosen]), "Gop/s"),
        "ch2.order_other_gops": f(records.median(found[other]), "Gop/s"),
        "ch2.order_other_vs": compare.versus(found[other], found[chosen]),
        # typed: the signed-rank test's call on the other order (neither: within the noise)
        "ch2.order_other_faster": compare.difference(found[other], found[chosen]).sign > 0,
        "ch2.order_other_slower": compare.difference(found[other], found[chosen]).sign < 0,
        "ch2.has_order_model": True, "ch2.has_order_timing": True,
    })
    return values


def _rule_values(timed: dict | None, chosen: str, model: str) -> dict:
    """The timing of the two orders that gemm.order_rule weighed (once per machine, kept):
    its size and rounds, and in how many the order taken was the faster (typed; None and
    False where the record has no timing: an older record, a forced order, an emulated
    level)."""
    if not timed or chosen not in timed or len(timed) < 2:
        return dict.fromkeys(RULE_KEYS) | {"ch2.has_order_timed": False,
                                           "ch2.order_overruled": False}
    other = next(o for o in gemm.ORDERS if o != chosen)
    a, b = timed[chosen], timed[other]
    return {"ch2.has_order_timed": True, "ch2.order_overruled": chosen != model,
            "ch2.order_timed_n": timed.get("n"), "ch2.order_timed_rounds": len(a),
            "ch2.order_timed_ahead": sum(x < y for x, y in zip(a, b))}
