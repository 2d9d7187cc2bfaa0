"""The timing harness every chapter uses: warm up, repeat, keep every sample.

The machines this book is measured on are shared and noisy, so we report the
median of repeated runs and keep min and max beside it. A sample is one call
of ``fn``; when one call is too short to time reliably the harness groups
calls until a sample lasts at least ``min_sample`` seconds.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field


def quick_mode() -> bool:
    """``SMALLEM_QUICK=1``: every measurement on tiny sizes, in seconds (tests, notebooks)."""
    return os.environ.get("SMALLEM_QUICK") == "1"


@dataclass
class Timing:
    seconds: list[float] = field(default_factory=list)  # per call

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def max(self) -> float:
        return max(self.seconds)

    def stats(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "n": len(self.seconds)}

    def rate(self, work: float) -> dict:
        """``work`` per second: the median rate is work / median time; min comes from max time."""
        return {"median": work / self.median, "min": work / self.max, "max": work / self.min,
                "n": len(self.seconds)}


def measure(fn, *, repeats: int = 5, warmup: int = 1, min_sample: float = 0.0,
            max_time: float | None = None) -> Timing:
    """Time ``fn()``: ``warmup`` untimed calls, then ``repeats`` samples.

    ``max_time`` stops early (after at least 3 samples, or 1 if the first is
    already over budget) so a slow rung cannot hold the whole run hostage.
    """
    for _ in range(warmup):
        fn()
    calls = _calls_per_sample(fn, min_sample)
    out = Timing()
    start = time.perf_counter()
    for i in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.seconds.append((time.perf_counter() - t0) / calls)
        spent = time.perf_counter() - start
        if max_time is not None and spent > max_time and (i >= 2 or spent > 3 * max_time / repeats):
            break
    return out


def _calls_per_sample(fn, min_sample: float) -> int:
    """How many calls of ``fn`` make one sample last at least ``min_sample`` seconds."""
    calls = 1
    while min_sample > 0:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - t0 >= min_sample or calls >= 1 << 20:
            break
        calls *= 2
    return calls


MIN_ROUNDS = 6  # the fewest rounds in which the two-sided test at 5 % (faster or slower) can decide: 6 of 6 give 2/64


FAR = 4.0  # a peer this many times slower than what it is judged against is timed once
WAKE_SKIP = 0.1  # seconds: a sample at least this long needs no untimed call after the pause


def measure_interleaved(fns: dict, *, repeats: int = 9, warmup: int = 1,
                        min_sample: float = 0.0, pause: float = 0.0,
                        max_time: float | None = None, min_rounds: int = MIN_ROUNDS,
                        far: dict | None = None, far_factor: float = FAR,
                        setup: dict | None = None) -> dict:
    """Time several functions in turn: each round takes one sample of each.

    On a shared machine the speed drifts by tens of percent over seconds. Timing all
    of A's samples and then all of B's compares A's minute with B's; taking them in
    turn puts both under the same drift, so their ratio means something even when
    each median moves. Before each sample ``pause`` seconds pass: thread pools spin for
    a while after a call (OpenBLAS's for up to ~0.1 s), and one library's spinning
    threads must not take the cores of the next.
    After a pause the first call is not timed: it wakes threads that went to sleep during
    the pause (on a virtual machine, a halted virtual CPU: up to milliseconds), a cost no
    caller that calls in a loop pays; where the contender's last sample lasted WAKE_SKIP or
    more, those milliseconds are inside its noise and the untimed call is skipped. Each function is warmed up and its calls per sample
    counted after a pause too, not while the previous one's threads still spin.
    The order alternates: forwards in even rounds, backwards in odd ones, so that no
    contender always runs right after the same other one (its spinning threads, the cache
    state it leaves) or always first after the pause.
    Returns a :class:`Timing` per key. ``max_time`` stops after a round, once ``min_rounds``
    rounds are done (6: the fewest in which the two-sided test at 5 % can call a side
    faster or slower; a one-sided target test needs 5).
    ``far`` ({peer: the key it is judged against}) sizes a peer's rounds by need: a peer
    whose first sample took more than ``far_factor`` times its reference's is timed no more,
    and keeps that one sample (each round of the reference is then compared with it; its
    noise, tens of percent, cannot move a ratio that large across a target below it).
    ``setup`` ({key: a function}) is called untimed before each call of that key's function,
    warm-up included: for a call that changes what it works on (a decoder's cache), the
    setup puts it back. Such a key takes one call a sample, and its setup, which runs on the
    same threads just before the sample, stands in for the untimed wake-up call.
    """
    setup = setup or {}
    calls = {}
    for k, fn in fns.items():
        if pause > 0:
            time.sleep(pause)
        for _ in range(warmup):
            if k in setup:
                setup[k]()
            fn()
        calls[k] = 1 if k in setup else _calls_per_sample(fn, min_sample)
    out = {k: Timing() for k in fns}
    start = time.perf_counter()
    keys = list(fns)
    for i in range(repeats):
        if i == 1 and far:  # after the first round: drop the peers that far behind
            keys = [k for k in keys if not (k in far and far[k] in out and out[k].seconds[0]
                                            > far_factor * out[far[k]].seconds[0])]
        for k in (keys if i % 2 == 0 else keys[::-1]):
            fn = fns[k]
            if pause > 0:
                time.sleep(pause)
                # waking the threads costs at most milliseconds: inside a sample this long
                # it is noise, and the untimed call would double the round's time
                if k not in setup and (not out[k].seconds
                                       or out[k].seconds[-1] * calls[k] < WAKE_SKIP):
                    fn()
            if k in setup:
                setup[k]()
            t0 = time.perf_counter()
            for _ in range(calls[k]):
                fn()
            out[k].seconds.append((time.perf_counter() - t0) / calls[k])
        if max_time is not None and time.perf_counter() - start > max_time and i + 1 >= min_rounds:
            break
    return out
