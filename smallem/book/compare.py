"""Paired comparisons: two or more kernels timed in turn, and what their rounds say.

Every ratio the book quotes (smallem against numpy, one block size against another) comes
from one :func:`compare` call, so both sides saw the same machine; the sign test on the rounds
says whether the difference is larger than the host's noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from smallem.cpu.timing import FAR, WAKE_SKIP, measure_interleaved
from . import records
from .figures import NOTE, NOTE_OPEN, fmt, note, plain  # noqa: F401  (for the readings)


def numpy_pinned(threads):
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=threads, user_api="blas")



def blas_info() -> list[dict]:
    from threadpoolctl import threadpool_info
    keep = ("user_api", "internal_api", "version", "num_threads", "architecture", "threading_layer")
    return [{k: d.get(k) for k in keep} for d in threadpool_info()]



ROUNDS = 15        # rounds of a paired comparison
MIN_SAMPLE = 0.05  # seconds: a sample groups calls until it lasts this long
PAUSE = 0.25       # seconds before each sample: the previous library's threads go to sleep


def paired(fns: dict, m, n, k, quick=False, pause=None, work=None) -> dict:
    """Time ``fns`` in turn (timing.measure_interleaved): {key: {"value", "seconds"}}.

    Every ratio the chapter quotes (smallem against numpy, one block size against
    another) comes from one such call, so both sides saw the same machine. Between two
    libraries a pause lets the previous one's spinning threads go to sleep. A call does
    the m x n x k product's 2mnk operations, unless ``work`` gives a key its own Gop.
    """
    if pause is None:
        pause = 0.0 if quick else PAUSE
    ts = measure_interleaved(fns, repeats=3 if quick else ROUNDS, warmup=1,
                             min_sample=0.005 if quick else MIN_SAMPLE, pause=pause,
                             max_time=1.0 if quick else 60.0)
    gemm_work = 2.0 * m * n * k / 1e9
    # Every sample is kept, in the order taken: sample i of each key is round i of the
    # comparison, so the record can say in how many rounds one side was ahead.
    return {key: {"value": t.rate((work or {}).get(key, gemm_work)),
                  "seconds": {**t.stats(), "samples": list(t.seconds)}}
            for key, t in ts.items()}



def rounds_ahead(ours: dict, theirs: dict) -> tuple[int, int] | None:
    """In how many rounds of a paired comparison ``ours`` took less time than ``theirs``,
    and of how many: two results of one :func:`paired` call. None for results timed alone,
    which keep no samples (the slow rungs)."""
    a, b = (r.get("seconds", {}).get("samples") for r in (ours, theirs))
    if not a or not b or len(a) != len(b):
        return None
    return sum(x < y for x, y in zip(a, b)), len(a)



def sign_test(ahead: int, n: int) -> float:
    """Two-sided sign test, the plain count that "How we measure" sets the signed-rank test
    against: how often n fair coin flips give a split at least as lopsided as ``ahead`` of
    ``n``. Rounds are paired, so the machine's drift cancels within a
    round; what is left is noise, which favours neither side."""
    worst = max(ahead, n - ahead)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(worst, n + 1)) / 2 ** n)



SIGN_LEVEL = 0.05  # what random signs give less often than once in 20: a real difference



def signed_rank_above(diffs: list[float]) -> float:
    """One-sided Wilcoxon signed-rank test, exact: how often random signs on the same
    magnitudes give a sum of positive ranks at least as large as the measured one. The
    differences are log ratios of paired rounds (less their target), so a round far above
    weighs more than one just above, where the sign test counts both as one heads; zeros are
    dropped and tied magnitudes share their mean rank. 5 rounds all positive give 1/32, as
    the sign test; 7 rounds with the one negative the smallest give 2/128, where the sign
    test needs all 7."""
    d = [x for x in diffs if x != 0 and math.isfinite(x)]
    n = len(d)
    if n == 0:
        return 1.0
    order = sorted(range(n), key=lambda i: abs(d[i]))
    rank2 = [0] * n  # twice each rank, so that shared (half) ranks stay integers
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for t in range(i, j + 1):
            rank2[order[t]] = i + j + 2  # 2 x the mean of ranks i+1 .. j+1
        i = j + 1
    w = sum(r for r, x in zip(rank2, d) if x > 0)
    ways = {0: 1}  # sums of positive ranks over every choice of signs
    for r in rank2:
        nxt = dict(ways)
        for total, count in ways.items():
            nxt[total + r] = nxt.get(total + r, 0) + count
        ways = nxt
    return sum(c for total, c in ways.items() if total >= w) / 2 ** n


def log_ratios(a: list[float], b: list[float]) -> list[float]:
    return [math.log(x / y) for x, y in zip(a, b) if x > 0 and y > 0]


TEST_NAME = "one-sided signed-rank test on the log ratios"
FEWEST = 5  # rounds: fewer cannot pass a one-sided test at SIGN_LEVEL, whatever they show


def pv(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


PARITY_MARGIN = 0.95  # a target "as fast as" a peer is judged at this share of its speed
# Two points of one sweep, each timed once, with no rounds to test: a difference larger than
# this is called more than the noise (a threshold the book states, not a test)
SWEEP_NOISE = 0.05

WORDS = ("reached", "not reached", "not shown")  # the only verdicts the book says


@dataclass(frozen=True)
class Verdict:
    """A target checked on per-round ratios (ours over theirs, or ours over a bound).

    "reached" where the one-sided sign test says the ratio is at or above ``judged_at`` at
    SIGN_LEVEL; "not reached" where the reverse test says it is below; "not shown" where
    neither passes (too close to the target, or too noisy, for this many rounds). ``ratio``
    is the ratio of the medians, which the prose quotes beside the word; the rounds decide,
    and their test is the footnote."""
    met: bool                     # reached
    ratio: float
    target: float
    judged_at: float              # the target, or PARITY_MARGIN for a parity target
    ahead: int | None = None      # rounds at or above judged_at
    rounds: int | None = None
    p: float | None = None        # the one-sided test that the ratio is at or above
    p_below: float | None = None  # the one-sided test that it is below

    @property
    def word(self) -> str:
        if self.met:
            return "reached"
        if self.p_below is not None and self.p_below < SIGN_LEVEL:
            return "not reached"
        return "not shown"

    def test(self) -> str:
        """The rounds and the test behind the word, for a footnote or a table column."""
        at = (f"at or above {self.judged_at:g}" if self.judged_at == self.target else
              f"at or above {self.judged_at:g} (the parity margin)")
        if self.rounds is None:
            return "no rounds kept to test"
        tested = f"{at} in {self.ahead} of {self.rounds} rounds"
        if self.word == "reached":
            return f"{tested}; {TEST_NAME}, {pv(self.p)}"
        if self.word == "not reached":
            return (f"{tested}; below it in {self.rounds - self.ahead}, {TEST_NAME}, "
                    f"{pv(self.p_below)}")
        if self.rounds < FEWEST:
            return (f"{tested}; {self.rounds} rounds cannot pass a one-sided test at "
                    f"{100 * SIGN_LEVEL:.0f} %")
        return (f"{tested}: neither {TEST_NAME} passes ({pv(self.p)} above, "
                f"{pv(self.p_below)} below): too close to the target, or too noisy, for "
                f"{self.rounds} rounds")

    def text(self, shown: str | None = None) -> str:
        """"reached (1.21 times, target 1)" with the test as its footnote (:func:`note`).
        ``shown``: the ratio as the page words it (a share, say), instead of "<ratio>
        times, target <target>"."""
        what = shown or f"{fmt(self.ratio)} times, target {self.target:g}"
        return f"{self.word} ({what})" + note(self.test())


def exact(ok: bool, what: str) -> str:
    """A target on a figure with no noise (validation bits per byte of fixed weights on fixed
    text): the figure itself decides, and the footnote says that no rounds were needed."""
    return (f"{'reached' if ok else 'not reached'} ({what})"
            + note("exact: a deterministic figure, no rounds"))


def judge(ratios: list[float], ratio: float, target: float) -> Verdict:
    """A :class:`Verdict` from per-round ratios against ``target`` (a parity target, 1, is
    judged at PARITY_MARGIN)."""
    at = PARITY_MARGIN if target == 1 else target
    if not ratios:
        return Verdict(False, ratio, target, at)
    ahead, n = sum(r >= at for r in ratios), len(ratios)
    diffs = [math.log(r / at) if r > 0 else -1e300 for r in ratios]  # a round at 0: far below
    p, p_below = signed_rank_above(diffs), signed_rank_above([-x for x in diffs])
    return Verdict(p < SIGN_LEVEL, ratio, target, at, ahead, n, p, p_below)


def per_round_rates(r: dict) -> list[float]:
    """Each round's rate of a result of :func:`paired` (or any result keeping its samples):
    the work per call (median rate x median seconds) over the round's seconds."""
    work = records.median(r) * r["seconds"]["median"]
    return [work / t for t in r.get("seconds", {}).get("samples") or []]


def against(ours: dict, theirs: dict, target: float, scale: float = 1.0) -> Verdict:
    """Ours against theirs (two results timed in the same rounds) at ``target`` times their
    rate; ``scale`` multiplies our side (a per-token rate on another unit, say)."""
    a, b = per_round_rates(ours), per_round_rates(theirs)
    if len(b) == 1 < len(a):  # a peer timed once, far behind (timing.FAR): every round against it
        b = b * len(a)
    ratios = [scale * x / y for x, y in zip(a, b)] if len(a) == len(b) else []
    return judge(ratios, scale * records.median(ours) / records.median(theirs), target)


def against_bound(ours: dict, bound: float, target: float) -> Verdict:
    """Ours against a fixed figure (a peak, a bandwidth, in our rate's unit) at ``target``
    times it: each round's rate over the bound."""
    return judge([x / bound for x in per_round_rates(ours)], records.median(ours) / bound,
                 target)


def rounds_text(rounds: tuple[int, int] | None) -> str:
    return "n/a (not kept)" if rounds is None else f"{rounds[0]} of {rounds[1]}"



def listing(items: list[str], empty: str) -> str:
    """"a", "a and b", "a, b and c" for prose; ``empty`` for none."""
    if len(items) < 2:
        return items[0] if items else empty
    return ", ".join(items[:-1]) + " and " + items[-1]



@dataclass(frozen=True)
class Difference:
    """Result r against result base, timed in the same rounds: ``pct`` is the ratio of the
    medians less 1, in per cent (the figure the pages print beside the two medians; the
    rounds' count and test, in the note, can lean the other way); ``sign`` +1 (faster) or -1 (slower) where the two-sided
    signed-rank test on the per-round log ratios passes at SIGN_LEVEL, else 0 (not told
    apart); ``ahead`` of ``rounds``: the rounds r was the faster in."""
    pct: float
    sign: int
    ahead: int | None = None
    rounds: int | None = None
    p: float | None = None

    def note(self) -> str:
        if self.rounds is None:
            return "timed alone: no rounds kept to test"
        return (f"faster in {self.ahead} of {self.rounds} rounds; two-sided signed-rank test "
                f"on the log ratios, {pv(self.p)}")


def difference(r: dict, base: dict) -> Difference:
    """:class:`Difference` of two results of one :func:`paired` run (or any two keeping
    their samples in the same rounds). Each round's rates come from its samples: the work
    per call is median rate x median seconds, as the two may do different work."""
    pct = 100 * (records.median(r) / records.median(base) - 1)
    a, b = per_round_rates(r), per_round_rates(base)
    if not a or len(a) != len(b):
        return Difference(pct, 0)
    logs = log_ratios(a, b)
    up, down = signed_rank_above(logs), signed_rank_above([-x for x in logs])
    p = min(1.0, 2 * min(up, down))
    sign = 0 if p >= SIGN_LEVEL else (1 if up < down else -1)
    return Difference(pct, sign, sum(x > 0 for x in logs), len(logs), p)


def amount(pct: float) -> str:
    """A difference of rates as a reader compares it: "2.1 % faster" up to twice as fast,
    "18.8× as fast" beyond; "2.1 % slower" down to half the speed, "3.2× slower" below."""
    if pct > 100:
        return f"{fmt(1 + pct / 100)}\u00d7 as fast"
    if pct <= -50:
        return f"{fmt(1 / (1 + pct / 100))}\u00d7 slower"
    return f"{abs(pct):.1f} % {'faster' if pct > 0 else 'slower'}"


def versus(r: dict, base: dict) -> str:
    """Result r against result base as prose: "2.1 % slower" where the test tells them apart,
    "within the noise (median 2.1 % slower)" where it does not; the rounds and the test in
    a footnote (:func:`note`). A gain past twice the speed reads as a factor (:func:`amount`)."""
    d = difference(r, base)
    if abs(d.pct) < 0.05:
        return "as fast"
    told = amount(d.pct)
    if d.rounds is None:
        return told
    if d.sign == 0 or (d.sign > 0) != (d.pct > 0):
        return f"within the noise (median {told})" + note(d.note())
    return told + note(d.note())


def size(kib: float) -> str:
    """A size for prose and tables: KiB below a MiB, MiB from there."""
    return fmt(kib, "KiB") if kib < 1024 else fmt(kib / 1024, "MiB")



def fewest_rounds(two_sided: bool = False) -> int:
    """The fewest rounds in which the signed-rank test can pass at SIGN_LEVEL, every round on
    one side: 5 for the one-sided test of a target (1/32), 6 for the two-sided test that
    calls a side faster or slower (5 of 5 give 2/32 = 0.0625; 6 of 6, 2/64)."""
    n = 1
    while (2 if two_sided else 1) * signed_rank_above([1.0] * n) >= SIGN_LEVEL:
        n += 1
    return n


def method_values() -> dict:
    """The numbers of the "How we measure" page, typed, from the constants above (the page
    formats them: ``{{ how.min_sample | num("ms") }}``)."""
    from smallem.cpu.timing import MIN_ROUNDS

    n = 7
    assert signed_rank_above([-1.0] + [float(i) for i in range(2, n + 1)]) < SIGN_LEVEL / 2
    assert sign_test(n - 1, n) >= SIGN_LEVEL  # the example the page gives
    assert fewest_rounds() == FEWEST
    two = fewest_rounds(two_sided=True)
    return {"how.min_sample_ms": 1000 * MIN_SAMPLE, "how.pause_ms": 1000 * PAUSE,
            "how.sign_level": SIGN_LEVEL, "how.one_in": round(1 / SIGN_LEVEL),
            "how.rank_example_n": n, "how.parity_margin": PARITY_MARGIN,
            "how.target_fewest": FEWEST, "how.two_sided_fewest": two,
            "how.two_sided_at_fewest": 2 * signed_rank_above([1.0] * FEWEST),
            "how.min_rounds": MIN_ROUNDS, "how.min_rounds_decide": MIN_ROUNDS >= two,
            "how.wake_skip_ms": 1000 * WAKE_SKIP, "how.far": FAR,
            "how.sweep_noise": SWEEP_NOISE}
