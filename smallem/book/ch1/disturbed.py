"""Chapter 1's peak probes whose run was disturbed: one thread below a core's share of all
cores' rate (its cell marked †), or all cores below the cores times one thread (‡), after
the measurement's own retries; the table marks them and its note says why."""

from __future__ import annotations

from .measuring import ONE_THREAD_FLOOR, SCALING_FLOOR


PEAK_NAMES = {"f32": "f32 FMA", "bf16": "bf16 dot", "int8": "int8 dot",
              "amx_bf16": "AMX bf16 tile", "amx_int8": "AMX int8 tile"}


def disturbed(sm: dict) -> list[str]:
    """The probes whose one-thread rate fell below ONE_THREAD_FLOOR of all cores' rate per
    physical core (after the second try that measuring gives them): their one-core cell is
    not a core's rate, and the chapter's per-core rate for them is all cores' over the cores."""
    peak, cores, scale = sm["peak"], sm["cores"], sm["theory"]["cores"]
    if scale <= 1:
        return []
    return [k for k in PEAK_NAMES if (k, 1) in peak and (k, cores) in peak
            and peak[k, 1] < ONE_THREAD_FLOOR * peak[k, cores] / scale]


def unscaled_peaks(sm: dict) -> list[str]:
    """The probes whose all-core rate stayed below SCALING_FLOOR of the cores times one
    thread's, after measuring's retries: another program held a core during that run."""
    peak, cores, scale = sm["peak"], sm["cores"], sm["theory"]["cores"]
    return [k for k in PEAK_NAMES if (k, 1) in peak and (k, cores) in peak and scale > 1
            and peak[k, cores] < SCALING_FLOOR * scale * peak[k, 1]]


def disturbed_note(sm: dict) -> str:
    """The table's note on its marked cells (empty where none is marked), from a record's
    summary (:func:`smallem.book.ch1.reading.summary`)."""
    low, unscaled = disturbed(sm), unscaled_peaks(sm)
    out = ""
    if unscaled:
        out += (f"‡ All cores gave less than {100 * SCALING_FLOOR:.0f} % of the cores times "
                f"one thread's rate, measured again: another program held a core. ")
    if not low:
        return out
    return out + (f"† One thread reached less than {100 * ONE_THREAD_FLOOR:.0f} % of all cores' rate "
            f"per core, measured twice: something else ran on its core, so this cell is not "
            f"a core's rate; the chapter's per-core rate for it is all cores' over the cores. ")
