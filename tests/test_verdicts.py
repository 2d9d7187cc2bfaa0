"""A verdict is one of three words, and the rounds behind it say so.

Every chapter's targets are read from the book's committed records and from each captured
machine's (tests/machines/), as the pages and the commands word them. A target is "reached"
only where the one-sided signed-rank test of its rounds passes at compare.SIGN_LEVEL, "not
reached" only where the reverse one-sided test passes, and "not shown" where neither does
(or the figure is one with no noise, said so). The footnote's p must say the word, and its
count of rounds must allow it: k of n rounds at or above the target can pass the test only if
the most favourable ranks (the n - k below it the smallest) would. The sentence holds the word and the ratio;
the rounds and the test are its footnote (between compare.NOTE's marks), never inside it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import captured
from smallem import book
from smallem.book import ch2, compare, records

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = re.compile(r"at or above [0-9.]+(?: \(the parity margin\))? in (\d+) of (\d+) rounds")
EXACT = "exact: a deterministic figure"
WORD = re.compile(r"(?:^|[:;] )(reached|not reached|not shown) \(")
OLD_WORDS = re.compile(r"(?:^|[:;] )(met|missed|not decided) \(")


def problems(text: str) -> list[str]:
    """What is wrong with a target's text: a word its rounds do not support, an old word,
    or the statistics in the sentence instead of its footnote."""
    if OLD_WORDS.search(text):
        return [f"a verdict word other than reached / not reached / not shown: {text!r}"]
    found = WORD.search(text)
    if not found:
        return []
    notes = " ".join(compare.NOTE.findall(text))
    if ROUNDS.search(compare.NOTE.sub("", text)):
        return [f"statistics inside the sentence, not in its footnote: {text!r}"]
    if EXACT in notes:
        return []
    rounds = ROUNDS.search(notes)
    if not rounds:
        return [] if found.group(1) == "not shown" else [
            f"called {found.group(1)} without the rounds that decide it: {text!r}"]
    k, n = map(int, rounds.groups())
    word = found.group(1)
    can = {"reached": best_p(k, n) < compare.SIGN_LEVEL,
           "not reached": best_p(n - k, n) < compare.SIGN_LEVEL, "not shown": True}
    if not can[word]:
        return [f"called {word} on {k} of {n} rounds, which cannot say so: {text!r}"]
    p = P.search(notes)
    passed = p and (p.group(1) == "<" or float(p.group(2)) < compare.SIGN_LEVEL)
    if word != "not shown" and not passed:
        return [f"called {word} without a passing test in its footnote: {text!r}"]
    if word == "not shown" and p and "neither" not in notes:
        return [f"called not shown beside a passing test: {text!r}"]
    return []


P = re.compile(r"p (<|=) ([0-9.]+)")


def best_p(k: int, n: int) -> float:
    """The smallest one-sided signed-rank p that k of n rounds on the side tested can give:
    the n - k others the closest to the target."""
    return compare.signed_rank_above([-float(i) for i in range(1, n - k + 1)]
                                     + [float(i) for i in range(n - k + 1, n + 1)])


def _folders():
    yield "book", ROOT / "figures" / "records"
    for name in captured.NAMES:
        yield name, captured.MACHINES / name / "records"


FOLDERS = dict(_folders())


@pytest.mark.parametrize("name", list(FOLDERS))
def test_every_verdict_is_backed_by_its_rounds(name, records_tmp):
    folder = FOLDERS[name]
    values = book.report_all(folder, only=["ch3", "ch4", "mpi", "others"])
    texts = [v for v in values.values() if isinstance(v, str)]
    targets = records_tmp.parent / "figures" / "tables" / "ch4_targets.md"
    if targets.is_file():
        texts += targets.read_text().splitlines()
    if records.exists("ch2.gemm", folder):
        texts += ch2.targets(records.load("ch2.gemm", folder), rec_dir=folder)
    assert any(WORD.search(t) for t in texts) or name != "book", \
        "the book's records gave no target at all"
    bad = [p for t in texts for p in problems(t)]
    assert not bad, "\n".join(bad)


def test_the_check_fails_where_a_word_is_not_its_rounds():
    n = compare.note
    # what chapter 4 printed on Zen 3 before the one-sided test: 0.853 times, 2 of 7 ahead
    assert problems("met within the noise (0.853 times, target 1, ahead in 2 of 7 rounds)") == []
    assert problems("met (1.2 times, target 1: at or above 0.95 in 7 of 7 rounds, p = 0.008)")
    assert problems("reached (1.2 times)" + n("at or above 0.95 in 6 of 7 rounds; p = 0.062"))
    assert problems("reached (1.2 times)" + n("at or above 0.95 in 4 of 7 rounds; p = 0.01"))
    assert not problems("reached (1.2 times)" + n("at or above 0.95 in 6 of 7 rounds; p = 0.016"))
    assert problems("not reached (0.9 times)" + n("at or above 0.95 in 4 of 7 rounds"))
    assert problems("reached (1.2 times: at or above 0.95 in 7 of 7 rounds)")
    assert not problems("reached (1.2 times, target 1)" + n(
        "at or above 0.95 (the parity margin) in 7 of 7 rounds; one-sided sign test p = 0.008"))
    assert not problems("not reached (0.86 times)" + n(
        "at or above 0.95 in 0 of 7 rounds; below it in 7, p = 0.008"))
    assert not problems("not shown (0.96 times)" + n("at or above 0.95 in 4 of 7 rounds"))


def _result(rates):
    med = sorted(rates)[len(rates) // 2]
    return {"value": {"median": med}, "seconds": {"median": 1 / med,
                                                  "samples": [1 / r for r in rates]}}


def test_a_peer_ahead_in_some_rounds_is_not_matched():
    ours = _result([100.0] * 5 + [80.0] * 2)  # at parity in 5 rounds of 7, far behind in 2
    theirs = _result([100.0] * 7)
    v = compare.against(ours, theirs, 1.0)
    assert not v.met and v.ahead == 5 and v.rounds == 7 and v.word == "not shown"
    assert "neither" in v.text() and v.text().startswith("not shown (")
    few = compare.against(ours, _result([100.0] * 6), 1.0).text()
    assert few.startswith("not shown (") and "no rounds kept" in few
    four = compare.judge([1.0] * 4, 1.0, 1.0).text()
    assert four.startswith("not shown (") and "4 rounds cannot pass" in four
    assert compare.against(_result([100.0] * 7), theirs, 1.0).word == "reached"
    assert compare.against(_result([80.0] * 7), theirs, 1.0).word == "not reached"


def test_a_peer_timed_once_is_compared_with_every_round():
    # a peer far behind keeps one sample (timing.FAR): each of our rounds is judged against it
    theirs = _result([10.0])
    assert compare.against(_result([100.0] * 7), theirs, 1.0).met
    v = compare.against(_result([100.0] * 6 + [0.5]), theirs, 1.0)
    assert not v.met and v.ahead == 6 and v.rounds == 7  # a round far below it still counts
    # ... where one just below it, the closest round to the target, does not undo six far above
    assert compare.against(_result([100.0] * 6 + [9.0]), theirs, 1.0).met
    assert not compare.against(_result([100.0] * 7), theirs, 12.0).met


def test_the_signed_rank_test_counts_every_choice_of_signs():
    """compare.signed_rank_above against the definition: every one of the 2^n sign choices."""
    import itertools
    import random

    rng = random.Random(5)
    for n in range(1, 10):
        for _ in range(5):
            d = [rng.choice([-1, 1]) * rng.choice([0.5, 1.0, 2.0, 3.0, rng.random()])
                 for _ in range(n)]
            mags = sorted(abs(x) for x in d)
            rank = {m: sum(i + 1 for i, y in enumerate(mags) if y == m) / mags.count(m)
                    for m in mags}
            w = sum(rank[abs(x)] for x in d if x > 0)
            sums = [sum(rank[abs(x)] for x, s in zip(d, signs) if s)
                    for signs in itertools.product([0, 1], repeat=n)]
            want = sum(t >= w - 1e-9 for t in sums) / 2 ** n
            assert compare.signed_rank_above(d) == pytest.approx(want), d
    assert compare.signed_rank_above([1.0] * 5) == pytest.approx(1 / 32)
    assert compare.signed_rank_above([0.0, 0.0]) == 1.0
