"""Chapter 4's fresh processes as the page reads them: each one's median, the slowest against
the fastest round by round, and the same decoder's median in the ladder beside them."""

from __future__ import annotations

import numpy as np

from .. import compare, figures, records
from .balance import AT, _one

f = figures.fmt
PROCESS_SPREAD = 0.95  # the slowest of the fresh processes at least this share of the fastest


def processes(rec, values) -> list[str]:
    """The fresh processes (measuring.measure_processes): each one's median, the slowest
    against the fastest round by round (the pair chosen by their medians, which leans the test
    toward "not reached"), and whether every process took the same choices."""
    rs = sorted(records.results(rec, "process_decode"), key=lambda r: r["params"]["process"])
    st = rec["settings"].get("processes")
    values["ch4.procs_missing"] = rec["settings"].get("missing", {}).get("fresh processes")
    values["ch4.procs_measured"] = bool(rs) and st is not None
    values["ch4.procs_ladder"] = None
    if not values["ch4.procs_measured"]:
        return []
    meds = [records.median(r) for r in rs]
    r4 = _one(rec, "decode", rung=AT["threads"])  # the same decoder in the ladder's rounds
    values["ch4.procs_ladder"] = records.median(r4) if r4 else None
    slow, fast = rs[int(np.argmin(meds))], rs[int(np.argmax(meds))]
    v = compare.against(slow, fast, PROCESS_SPREAD)
    pm = sorted({r["params"]["par_min_bytes"] for r in rs})
    values.update({"ch4.procs_n": len(rs), "ch4.procs_rounds": st["rounds"],
                   "ch4.procs_timed": st["timed_per_turn"], "ch4.procs_config": st["config"],
                   "ch4.procs_slowest": min(meds), "ch4.procs_fastest": max(meds),
                   "ch4.procs_ratio": v.ratio, "ch4.procs_verdict": v.text(),
                   "ch4.procs_same_choices": len(pm) == 1
                   and len({r["params"]["ahead"] for r in rs}) == 1,
                   "ch4.procs_par_min_kib": [b / 1024 for b in pm],
                   # the widest spread of one process's rounds, over its median
                   "ch4.procs_within": max((max(compare.per_round_rates(r))
                                            - min(compare.per_round_rates(r))) / records.median(r)
                                           for r in rs)})
    rows = [[r["params"]["process"] + 1, f(r["params"]["par_min_bytes"] / 1024, "KiB"),
             f(records.median(r), "tokens/s"),
             f"{f(min(compare.per_round_rates(r)))} to {f(max(compare.per_round_rates(r)))}"]
            for r in rs]
    figures.write_table("ch4_processes", rows, ["process", "thread threshold", "median",
                                                "rounds' range"],
                        f"Rung 4's decoder of the {st['config']} model in {len(rs)} fresh "
                        f"processes, {st['rounds']} rounds, the processes in turn; a round's "
                        f"sample is the median of {st['timed_per_turn']} decodes after an "
                        f"untimed one. {figures.machine_line(rec)}.")
    return [f"the slowest of {len(rs)} fresh processes against the fastest: " + v.text()]
