"""Chapter 1: the probes, STREAM kernels and naive product against numpy, and the
record-to-table logic on synthetic records."""

import math
import re
import shutil
import subprocess

import numpy as np
import pytest

from pathlib import Path

import captured as captured_machines
from smallem import checks
from smallem.plumbing import build
from smallem.cpu import isa, machine, machine_info
from smallem.book import ch1, figures, records

MACHINES = Path(__file__).parent / "machines"


@pytest.mark.no_emulation
def test_clock_is_plausible(level):
    clock = machine.measure_clock(repeats=1)
    assert 0.2e9 < clock["median"] < 8e9, clock


@pytest.mark.no_emulation
def test_two_clocks_agree(level):
    # A chain of adds and a chain of multiplies (3 cycles each) must give the same clock.
    # On Golden Cove and later, a chain of `x += 1` ran at several adds per cycle: this fails
    # for that method. Interleaved rounds, each clock's best: the least disturbed by neighbours.
    adds, muls = [], []
    for _ in range(4):
        adds.append(machine.measure_clock(repeats=1, chain="add")["max"])
        muls.append(machine.measure_clock(repeats=1, chain="mul")["max"])
    assert max(muls) == pytest.approx(max(adds), rel=ch1.CLOCK_AGREEMENT), (adds, muls)


def test_clock_probes_compute_their_chains(level):
    _, lib = build.load("probes", level)
    assert lib.probe_add_chain(10) == 640
    assert lib.probe_mul_chain(1) == 3**64 % 2**64 & 0xFFFF


@pytest.mark.parametrize("threads", [1, 2])
def test_fma_probe_matches_numpy_model(level, threads):
    # acc = acc * 0.999 + 0.001, from 1 + k, `iters` times, summed over accumulators and lanes.
    ffi, lib = build.load("probes")
    sink = ffi.new("float *")
    iters = 7
    ops = lib.probe_fma_f32(iters, threads, sink)
    nacc, lanes = {"avx512": (16, 16)}.get(level, (12, 8))
    assert ops == iters * nacc * lanes * 2 * threads
    acc = 1.0 + np.arange(nacc, dtype=np.float64)
    for _ in range(iters):
        acc = acc * np.float64(np.float32(0.999)) + np.float64(np.float32(0.001))
    expected = threads * lanes * acc.sum()
    assert sink[0] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("kind", ["f32", "bf16", "int8"])
def test_peak_probes_count_operations(level, kind, monkeypatch):
    monkeypatch.setenv("SMALLEM_QUICK", "1")
    r = machine.measure_peak(kind, 1, repeats=1)
    _, gop = machine.peak_probe(kind, 1, chains=r.get("chains"))
    assert ("chains" in r) == (kind in machine.DOT_KINDS)
    # the rate is the probe's own count of operations over the sample's seconds
    assert r["value"]["median"] * r["seconds"]["median"] == pytest.approx(gop, rel=1e-9)
    # and a count a core could do: more than 0.1 Gop/s, and no more than 256 operations a
    # cycle (int8 VNNI's two 512-bit pipes: 2 x 64 multiply-adds) at 6 GHz
    assert 0.1 < r["value"]["median"] < 256 * 6.0, r["value"]


def test_peak_probe_rejects_bad_arguments():
    with pytest.raises(ValueError, match="kind"):
        machine.measure_peak("f64", 1)
    with pytest.raises(ValueError, match="threads"):
        machine.measure_peak("f32", 0)
    with pytest.raises(TypeError, match="threads"):
        machine.measure_peak("f32", 1.5)


@pytest.mark.parametrize("kernel", list(machine.STREAM_KERNELS))
@pytest.mark.parametrize("n", [1, 7, 1009, 65537])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_stream_kernels_match_numpy(level, rng, kernel, n, threads):
    a = np.zeros(n)
    b = rng.standard_normal(n)
    c = rng.standard_normal(n)
    got = machine.stream_kernel(kernel, a, b, c, scalar=3.0, reps=2, threads=threads)
    if kernel == "read":  # the sum of both passes, in float64 against the float64 sum
        assert not a.any(), "the read kernel stored into a"
        err = abs(got - 2 * b.astype(np.float64).sum())
        assert err <= 1e-12 * 2 * np.abs(b).sum() + 1e-300, (got, 2 * b.sum())
        return
    assert got is None
    expected = {"copy": b, "scale": 3.0 * b, "add": b + c, "triad": b + 3.0 * c}[kernel]
    checks.assert_close(a, expected, k=2, name=kernel)


@pytest.mark.parametrize("threads", [1, 2])
def test_stream_arrays_are_first_touched_then_run(level, threads):
    s = machine.Stream(3 * 1024 + 40, threads)  # not a whole number of lines per thread
    assert s.a.ctypes.data % 64 == 0 and s.b.ctypes.data % 64 == s.c.ctypes.data % 64 == 0
    assert np.isfinite(s.b).all() and np.isfinite(s.c).all()
    n = s.a.size
    assert s.b.size == 2 * n  # the read kernel's one array spends the whole working set
    b, c = s.b[:n].copy(), s.c.copy()
    s.run("triad", n, 1, threads)
    checks.assert_close(s.a, b + 3.0 * c, k=2, name="triad over the whole arrays")
    total = s.run("read", 2 * n, 3, threads)
    assert abs(total - 3 * s.b.sum()) <= 1e-12 * 3 * np.abs(s.b).sum()


def test_stream_kernel_rejects_bad_input():
    a, b = np.zeros(8), np.zeros(8)
    with pytest.raises(TypeError, match="b: expected dtype float64"):
        machine.stream_kernel("copy", a, b.astype(np.float32))
    with pytest.raises(ValueError, match="b: expected shape"):
        machine.stream_kernel("copy", a, np.zeros(9))
    with pytest.raises(ValueError, match="not C-contiguous"):
        machine.stream_kernel("copy", np.zeros(16)[::2], b)
    with pytest.raises(ValueError, match="read-only"):
        ro = np.zeros(8)
        ro.flags.writeable = False
        machine.stream_kernel("copy", ro, b)
    with pytest.raises(TypeError, match="b: expected dtype float64"):
        machine.stream_kernel("read", a, b.astype(np.float32))
    with pytest.raises(ValueError, match="third array"):
        machine.stream_kernel("triad", a, b)
    with pytest.raises(ValueError, match="kernel"):
        machine.stream_kernel("memset", a, b)
    with pytest.raises(ValueError, match="reps"):
        machine.stream_kernel("copy", a, b, reps=0)


@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (3, 5, 7), (17, 1, 13), (31, 29, 37)])
def test_naive_gemm_matches_numpy_with_padding(level, rng, m, n, k):
    # leading dimensions wider than the matrices: the kernel must honour lda/ldb/ldc
    ffi, lib = build.load("gemm")
    A = rng.standard_normal((m, k + 3), dtype=np.float32)
    B = rng.standard_normal((k, n + 5), dtype=np.float32)
    C = np.full((m, n + 2), np.nan, dtype=np.float32)
    f = lambda x: ffi.from_buffer("float[]", x)
    lib.gemm_naive(m, n, k, f(A), k + 3, f(B), n + 5, f(C), n + 2, 1)
    checks.assert_close(C[:, :n], A[:, :k] @ B[:, :n], k=k)
    assert np.isnan(C[:, n:]).all(), "wrote outside the n columns"


def _fake_record(bw_by_size, threads=(1, 2)):
    caches = {"L1d_bytes": 32 * 1024, "L2_bytes": 512 * 1024, "L3_bytes": 32 * 1024**2,
              "L1d_instances": 2, "L2_instances": 2, "L3_instances": 1}
    rec = records.Record("ch1.machine", settings={"threads": list(threads)},
                         machine={"caches": caches, "cpu": "test"})
    for th in threads:
        for size, bw in bw_by_size(th):
            rec.add("stream", "GB/s", {"median": bw, "min": bw, "max": bw}, kernel="triad",
                    threads=th, bytes=size)
    return rec.data, caches


def test_plateaus_pick_each_level():
    def stairs(th):
        out = []
        for p in range(14, 31):
            size = 2**p
            per_thread = size / th
            bw = 100 if per_thread <= 32768 else 60 if per_thread <= 2**19 else 30 if size <= 2**25 else 10
            out.append((size, bw * th if per_thread <= 2**19 else bw))
        return out

    data, caches = _fake_record(stairs)
    one = ch1.plateaus(records.results(data, "stream", threads=1), caches, 1)
    assert one == {"L1": 100, "L2": 60, "L3": 30, "DRAM": 10}
    assert ch1.staircase_distinct(one)
    flat = dict(one, L3=58)
    assert not ch1.staircase_distinct(flat)
    assert not ch1.staircase_distinct(dict(one, DRAM=math.nan))


def test_theoretical_peak_infers_unknown_cores(monkeypatch):
    monkeypatch.setattr(machine, "fma_units", lambda: (0, 0, "unknown"))
    t = machine.theoretical_peak(3e9, 4, "avx2", measured_per_core=3e9 * 8 * 2 * 2 * 0.97)
    assert t["pipes"] == 2 and "inferred" in t["source"]
    assert t["gops_all"] == pytest.approx(4 * 32 * 3)


def test_zen4_avx512_peak_counts_half_width_pipes(monkeypatch):
    monkeypatch.setattr(machine, "fma_units", lambda: (2, 256, "Zen 4"))
    assert machine.theoretical_peak(5e9, 8, "avx512", 0)["gops_all"] == pytest.approx(1280)


def test_quick_run_makes_table_and_figures(records_tmp, monkeypatch):
    monkeypatch.setenv("SMALLEM_QUICK", "1")
    rec = ch1.run(quick=True, progress=False)
    rec.save()
    values = ch1.report(records_tmp)
    table = (figures.tables_dir() / "ch1_machine.md").read_text()
    assert "f32 FMA peak, measured" in table and figures.fmt(1314, "Gop/s") in table
    for name in ("ch1_staircase", "ch1_roofline"):
        assert (figures.figures_dir() / f"{name}.svg").stat().st_size > 1000
    assert values["ch1.cores"] == str(max(rec.data["settings"]["threads"]))
    assert values["ch1.scaling_floor"] == f"{100 * ch1.SCALING_FLOOR:.0f} %"
    # every value is typed (a number, a bool, a name or a list of names, None where unknown)
    # or words for the page, never an empty string
    assert all(v is None or isinstance(v, (bool, int, float)) or isinstance(v, str) and v
               or isinstance(v, list) and all(isinstance(x, str) and x for x in v)
               for v in values.values())
    assert isinstance(values["ch1.hw.fmas_per_cycle"], int)
    assert isinstance(values["ch1.clock_f32_ratio"], float)
    lines = ch1.summary_lines(rec.data)  # what `smallem machine` prints of it
    assert "numpy's copy" in lines[-1] and "staircase" in lines[-1]


def test_load_or_measure_measures_only_when_asked_or_missing(records_tmp, monkeypatch):
    monkeypatch.delenv("SMALLEM_QUICK", raising=False)
    monkeypatch.delenv("SMALLEM_REMEASURE", raising=False)
    calls = []

    def run(quick, progress):
        calls.append(quick)
        rec = records.Record("t.fake", machine={"cpu": "test"})
        rec.add("x", "s", {"median": len(calls), "min": 0, "max": 0})
        return rec

    assert records.value(records.load_or_measure("t.fake", run), "x") == 1  # missing: measured
    assert records.value(records.load_or_measure("t.fake", run), "x") == 1  # present: read
    monkeypatch.setenv("SMALLEM_REMEASURE", "1")
    assert records.value(records.load_or_measure("t.fake", run), "x") == 2
    monkeypatch.setenv("SMALLEM_QUICK", "1")
    records.load_or_measure("t.fake", run)
    assert calls == [False, False, True]


def test_record_names_its_commit_in_a_copy_without_git(monkeypatch, tmp_path):
    # A lent GPU machine measures a copy of the tree whose .git may be missing or stale.
    monkeypatch.delenv("SMALLEM_COMMIT", raising=False)
    assert records.git_commit()[1] in (True, False, None)
    monkeypatch.setattr(records, "ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert records.git_commit() == ("unknown", None)
    monkeypatch.setenv("SMALLEM_COMMIT", "0123456789ab")
    assert records.git_commit() == ("0123456789ab", None)
    assert records.Record("t.commit", machine={"cpu": "test"}).data["commit"] == "0123456789ab"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_record_dirty_means_code_not_records(monkeypatch, tmp_path):
    # make book writes ch1's record, then measures ch2: that record must not make ch2's tree dirty.
    monkeypatch.delenv("SMALLEM_COMMIT", raising=False)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false",
           "-C", str(tmp_path)]
    (tmp_path / "figures" / "records").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "figures" / "records" / "a.json").write_text("{}\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "t"], check=True)
    monkeypatch.setattr(records, "ROOT", tmp_path)
    assert records.git_commit()[1] is False
    (tmp_path / "figures" / "records" / "a.json").write_text('{"new": 1}\n')
    assert records.git_commit()[1] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert records.git_commit()[1] is True


def test_measure_interleaved_takes_samples_in_turn(monkeypatch):
    from smallem.cpu import timing
    calls = []
    sleeps = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: sleeps.append(s))
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    out = timing.measure_interleaved(fns, repeats=3, warmup=1, pause=0.5)
    assert set(out) == {"a", "b"}
    assert all(len(t.seconds) == 3 and t.median >= 0 for t in out.values())
    # a pause, then one warm-up each; per round one sample of a, one of b, each after a
    # pause and an untimed call that wakes the threads the pause put to sleep; the order
    # alternates from round to round
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] + ["b", "b", "a", "a"] + ["a", "a", "b", "b"]
    assert sleeps == [0.5] * 8
    calls.clear()
    out = timing.measure_interleaved(fns, repeats=4, warmup=0)
    assert calls == ["a", "b", "b", "a"] * 2 and len(out["b"].seconds) == 4


def test_a_setup_puts_back_what_each_timed_call_changes(monkeypatch):
    """Chapter 4's cases (reset the cache, then decode) in the shared harness: the setup runs
    untimed before every call of its contender, warm-up included, and stands in for the
    wake-up call; its time is not in the sample."""
    fns, calls = _clocked_calls(monkeypatch, {"decode": 1.0, "reset": 5.0, "peer": 2.0})
    out = timing_module().measure_interleaved(
        {"decode": fns["decode"], "peer": fns["peer"]}, setup={"decode": fns["reset"]},
        repeats=2, warmup=1, pause=0.1)
    assert calls == (["reset", "decode", "peer"]                      # warm-ups
                     + ["reset", "decode", "peer", "peer"]            # round 1, forwards
                     + ["peer", "reset", "decode"])  # round 2, backwards: a 2 s sample wakes itself
    assert out["decode"].seconds == [1.0, 1.0] and out["peer"].seconds == [2.0, 2.0]


def timing_module():
    from smallem.cpu import timing
    return timing


def _clocked_calls(monkeypatch, cost: dict):
    """Contenders whose calls take ``cost[k]`` seconds on a fake clock (no sleeping), and the
    log of the calls made."""
    from smallem.cpu import timing
    now, calls = [0.0], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(timing.time, "sleep", lambda s: None)

    def fn(k):
        def call():
            calls.append(k)
            now[0] += cost[k]
        return call

    return {k: fn(k) for k in cost}, calls


def test_a_peer_far_behind_is_timed_once(monkeypatch):
    from smallem.cpu import timing
    fns, calls = _clocked_calls(monkeypatch, {"ours": 1.0, "slow": 10.0, "close": 3.0})
    far = {"slow": "ours", "close": "ours"}
    out = timing.measure_interleaved(fns, repeats=7, warmup=1, far=far, far_factor=4.0)
    # 10 s against 1 s: decided after its first round; 3 s is not far enough behind
    assert len(out["slow"].seconds) == 1 and out["slow"].seconds == [10.0]
    assert len(out["ours"].seconds) == len(out["close"].seconds) == 7
    assert calls.count("slow") == 2  # the warm-up and its one sample
    # without `far`, every round times every contender
    out = timing.measure_interleaved(fns, repeats=7, warmup=1)
    assert all(len(t.seconds) == 7 for t in out.values())


def test_a_long_sample_needs_no_wake_up_call(monkeypatch):
    from smallem.cpu import timing
    fns, calls = _clocked_calls(monkeypatch, {"long": 2 * timing.WAKE_SKIP,
                                              "short": timing.WAKE_SKIP / 10})
    timing.measure_interleaved(fns, repeats=3, warmup=1, pause=0.5)
    # the long one: a warm-up, then one timed call a round, an untimed one before the first
    # sample only; the short one: an untimed call after every pause
    assert calls.count("long") == 1 + 1 + 3 and calls.count("short") == 1 + 2 * 3


def test_measure_interleaved_stops_early_only_after_enough_rounds(monkeypatch):
    from smallem.cpu import timing
    clock = iter(range(10_000))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: float(next(clock)))
    out = timing.measure_interleaved({"a": lambda: None}, repeats=20, max_time=0.5)
    # past max_time from the first round, yet the two-sided test needs 6 rounds to decide
    from smallem.book import compare
    assert len(out["a"].seconds) == timing.MIN_ROUNDS == compare.fewest_rounds(two_sided=True) == 6


def _fake_peaks(rates):
    """A measure_peak stand-in that answers from ``rates[(kind, threads)]``, a list per key
    consumed in order, and logs every call."""
    calls = []

    def measure_one(kind, threads):
        calls.append((kind, threads))
        queue = rates[kind, threads]
        v = queue.pop(0) if len(queue) > 1 else queue[0]
        return {"value": {"median": v, "min": v, "max": v, "n": 1}, "seconds": {}}
    return measure_one, calls


def test_peaks_that_scale_are_measured_once(monkeypatch):
    monkeypatch.setattr(machine, "settle", lambda s=0: None)
    fake, calls = _fake_peaks({(k, t): [100.0 * t] for k in ch1.PEAK_KINDS for t in (1, 2)})
    peaks, warnings = ch1.measure_peaks([1, 2], fake)
    assert warnings == [] and len(calls) == 6
    assert calls[:3] == [(k, 1) for k in ch1.PEAK_KINDS]  # one thread first


def test_peaks_that_do_not_scale_are_remeasured_then_flagged(monkeypatch):
    monkeypatch.setattr(machine, "settle", lambda s=0: None)
    rates = {(k, t): [100.0 * t] for k in ch1.PEAK_KINDS for t in (1, 2)}
    rates["f32", 2] = [102.0, 190.0]  # a neighbour took a core, then left
    rates["int8", 2] = [100.0]         # a neighbour that stays
    fake, calls = _fake_peaks(rates)
    peaks, warnings = ch1.measure_peaks([1, 2], fake, retries=2)
    assert peaks["f32", 2]["value"]["median"] == 190.0
    assert calls.count(("f32", 2)) == 2 and calls.count(("int8", 2)) == 3
    assert len(warnings) == 1 and warnings[0].startswith("int8 peak") and "1.00x" in warnings[0]


def test_warnings_reach_the_record_not_the_machine_line(records_tmp, capsys):
    rec = records.Record("t.warn")
    rec.warn("f32 peak: cores did not scale")
    assert "cores did not scale" in capsys.readouterr().err
    assert rec.data["warnings"] == ["f32 peak: cores did not scale"]
    # a sentence of every page names the machine: a doubt about one probe is the table's
    assert "warning" not in figures.machine_line(rec.data)


def test_the_table_marks_a_disturbed_probe_and_nothing_else():
    """The Emerald Rapids capture's one-thread int8 and AMX probes ran below a core's share of
    all cores' rate (its record warns): their one-core cells carry a mark and the note says
    why; the f32 row, which scaled, carries none."""
    import json
    from smallem.book.ch1 import reading
    emr = json.loads((MACHINES / "intel-xeon-emr-2c/records/ch1.machine.json").read_text())
    table = reading.table_markdown(emr)
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "†" in rows["int8 dot peak (vpdpbusd)"] and "†" not in rows["f32 FMA peak, measured"]
    assert "† One thread reached less than" in table
    assert reading.disturbed(reading.summary(emr)) == ["int8", "amx_bf16", "amx_int8"]
    # a probe's one-core cell raised to a core's share is no longer marked
    for r in records.results(emr, "peak"):
        if r["params"]["threads"] == 1:
            r["value"]["median"] *= 4
    assert "†" not in reading.table_markdown(emr)


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_dot_probes_compute_what_they_count(level, kind):
    ffi, lib = build.load("probes", level)
    if not machine.native(kind, level):
        pytest.skip(f"the {kind} fallback: its operations are counted, not checked here")
    iters, threads = 5, 2
    counts = machine.dot_chain_counts(level)
    assert counts and len(set(counts)) == len(counts) and min(counts) >= 8
    for chains in counts:
        if kind == "bf16":  # acc += 1.0 * 0.0: each of 16 lanes of each chain keeps 1 + k
            sink = ffi.new("float *")
            ops = lib.probe_dot_bf16(iters, threads, chains, sink)
            assert sink[0] == threads * 16 * sum(1 + k for k in range(chains))
            assert ops == iters * chains * 64 * threads
        else:  # acc += 1*1 four times a lane: each lane of chain k ends at k + 4 iters
            sink = ffi.new("int32_t *")
            ops = lib.probe_dot_int8(iters, threads, chains, sink)
            assert sink[0] == threads * 16 * sum(k + 4 * iters for k in range(chains))
            assert ops == iters * chains * 128 * threads
    fn = lib.probe_dot_bf16 if kind == "bf16" else lib.probe_dot_int8
    assert fn(iters, threads, 7, ffi.new("float *" if kind == "bf16" else "int32_t *")) == -1
    with pytest.raises(ValueError, match="chains"):
        machine.peak_probe(kind, 1, iters=5, level=level, chains=7)
    assert machine.fastest_dot_chains(kind, level=level) in counts


@pytest.mark.parametrize("kind", ["amx_bf16", "amx_int8"])
def test_amx_probes_compute_what_they_count(level, kind):
    ffi, lib = build.load("probes", level)
    if not machine.native(kind, level):
        with pytest.raises(ValueError, match="AMX"):
            machine.peak_probe(kind, 1, iters=1, level=level)
        pytest.skip(f"no {kind} tiles in this build or on this CPU")
    iters, threads = 3, 2
    if kind == "amx_bf16":  # each tile element gains 32 x 1.0 x 2^-10 per instruction
        sink = ffi.new("float *")
        ops = lib.probe_amx_bf16(iters, threads, sink)
        assert sink[0] == threads * 8 * iters / 32
        assert ops == iters * 4 * 16 * 16 * 32 * 2 * threads
    else:  # each int32 element gains 64 x 1 x 1 per instruction
        sink = ffi.new("int32_t *")
        ops = lib.probe_amx_int8(iters, threads, sink)
        assert sink[0] == threads * 8 * 64 * iters
        assert ops == iters * 4 * 16 * 16 * 64 * 2 * threads


# ---------------------------------------------------------------- machines met so far

def captured(name: str) -> tuple[dict, dict]:
    """(parse_cpuinfo's reading, caches_from's) of a machine in tests/machines/."""
    m = captured_machines.load(name)
    return m.ident, m.caches


@pytest.mark.parametrize("name, core, pipes, bits, caches", [
    ("intel-xeon-emr-2c", "Intel Xeon with AVX-512", 2, 512,
     {"L1d_bytes": 48 * 1024, "L2_bytes": 2 * 1024**2, "L3_bytes": 300 * 1024**2,
      "L1d_ways": 12, "L2_instances": 2, "L3_instances": 1}),
    ("amd-zen4-2c", "AMD Zen 4", 2, 256,
     {"L1d_bytes": 32 * 1024, "L2_bytes": 1024**2, "L3_bytes": 32 * 1024**2,
      "L1d_ways": 8, "L2_instances": 2, "L3_instances": 1}),
    ("amd-zen3-2c", "AMD Zen 3", 2, 256,
     {"L1d_bytes": 32 * 1024, "L2_bytes": 512 * 1024, "L3_bytes": 32 * 1024**2,
      "L1d_ways": 8, "L2_instances": 2, "L3_instances": 1}),
    ("amd-zen5-2c", "AMD Zen 5 (desktop, server)", 2, 512,
     {"L1d_bytes": 48 * 1024, "L2_bytes": 1024**2, "L3_bytes": 32 * 1024**2,
      "L1d_ways": 12, "L2_instances": 2, "L3_instances": 1}),
])
def test_machine_detection_on_captured_machines(name, core, pipes, bits, caches):
    ident, found = captured(name)
    assert machine.core_name(ident).startswith(core)
    assert machine.fma_units(ident)[:2] == (pipes, bits)
    assert {k: found[k] for k in caches} == caches


def test_fma_table_covers_the_cores_we_know():
    def ident(vendor, family, model, *flags):
        return {"vendor": vendor, "family": family, "model": model, "model_name": "",
                "flags": frozenset(("fma", "avx2") + flags)}

    amd, intel = "AuthenticAMD", "GenuineIntel"
    assert machine.fma_units(ident(amd, 0x19, 0x21))[:2] == (2, 256)               # Zen 3
    assert machine.fma_units(ident(amd, 0x19, 0x61, "avx512f"))[:2] == (2, 256)    # Zen 4
    assert machine.fma_units(ident(amd, 0x1A, 0x44, "avx512f"))[:2] == (2, 512)    # Granite Ridge
    assert machine.fma_units(ident(amd, 0x1A, 0x24, "avx512f"))[:2] == (2, 256)    # Strix Point
    assert machine.fma_units(ident(intel, 6, 0x8F, "avx512f"))[:2] == (2, 512)     # SPR
    assert machine.fma_units(ident(intel, 6, 0x97))[:2] == (2, 256)                # Alder Lake
    assert machine.fma_units(ident(intel, 6, 0x7E, "avx512f"))[:2] == (2, 256)     # Ice Lake
    assert machine.fma_units(ident("HygonGenuine", 0x18, 0, "avx512f")) == (0, 0, "unknown")


def test_staircase_reaches_past_a_huge_l3():
    _, caches = captured("intel-xeon-emr-2c")
    sizes = ch1.stream_sizes(False, caches, memory=24 * 1024**3)
    assert sizes[-1] >= 4 * caches["L3_bytes"] and sizes[0] == 4 * 1024
    small = ch1.stream_sizes(False, caches, memory=2 * 1024**3)  # arrays in a quarter of it
    assert 1.5 * small[-1] <= 2 * 1024**3 / 4
    assert ch1.stream_sizes(True, caches)[-1] == 64 * 1024**2


def test_plateau_not_reached_is_nan_and_named():
    def stairs(th):
        return [(2**p, 100 if p <= 15 else 60 if p <= 19 else 30) for p in range(14, 25)]

    data, caches = _fake_record(stairs)  # the largest working set, 16 MiB, is half the L3
    found = ch1.plateaus(records.results(data, "stream", threads=1), caches, 1)
    assert math.isnan(found["DRAM"]) and found["L3"] == 30
    assert ch1.staircase_close(found) == ["DRAM"]


def test_smt_siblings_count_as_one_core(tmp_path):
    """Peaks and private caches count physical cores: two logical CPUs of one core (SMT
    siblings) are one core; a topology that cannot be read counts every CPU."""
    from smallem.cpu import machine_info

    for cpu, core in ((0, 0), (1, 0), (2, 1), (3, 1)):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text("0\n")
        (d / "core_id").write_text(f"{core}\n")
    assert machine_info.physical_cores([0, 1, 2, 3], tmp_path) == 2
    assert machine_info.physical_cores([0, 2], tmp_path) == 2
    assert machine_info.physical_cores([0, 1], tmp_path) == 1
    assert machine_info.physical_cores([0, 7], tmp_path) == 2  # cpu7 unreadable: all count
    # 4 threads on 2 SMT cores scale to 2x at most: not "another program"
    peak = lambda v: {"value": {"median": v}}  # noqa: E731
    peaks = {("f32", 1): peak(100.0), ("f32", 4): peak(190.0)}
    assert ch1.poorly_scaled(peaks, 4, ("f32",), physical=2) == []
    assert ch1.poorly_scaled(peaks, 4, ("f32",)) == ["f32"]
    caches = {"L1d_bytes": 48 << 10, "L2_bytes": 2 << 20, "L3_bytes": 32 << 20,
              "L1d_instances": 2, "L2_instances": 2, "L3_instances": 1}
    assert ch1.level_sizes(caches, 4) == {"L1": 96 << 10, "L2": 4 << 20, "L3": 32 << 20}


def test_every_row_of_the_core_table_has_each_fact_and_a_citation():
    """The one table of core facts: every row has every field, of its type or None (not
    known from its source), and cites an anchor that bibliography.md has."""
    anchors = set(re.findall(r'<span id="([^"]+)"></span>',
                             (Path(__file__).parent.parent / "bibliography.md").read_text()))
    types = {"vendor": str, "cite": str, "pipes": int, "pipe_bits": int, "how": str,
             "loads_per_cycle": int, "load_bits": int, "l2_inclusive": bool,
             "l3_inclusive": bool}
    assert set(types) == set(machine.CORE_FIELDS)
    for name, row in machine.CORE_FACTS.items():
        assert set(row) == set(types), name
        for key, kind in types.items():
            assert row[key] is None or isinstance(row[key], kind), (name, key)
        assert row["cite"] in anchors, (name, row["cite"])
        assert row["vendor"] and row["pipes"] and row["pipe_bits"], name
        assert machine.FMA_PIPES[name] == (row["pipes"], row["pipe_bits"], row["how"])


def test_core_facts_key_on_isa_features_where_the_model_is_masked():
    """A Xeon whose model number a hypervisor masks as a client core's (167) is a Xeon by its
    AMX and AVX512_BF16; the FMA cross-check still looks it up by the model number."""
    ident = {"vendor": "GenuineIntel", "family": 6, "model": 167, "model_name": "",
             "flags": frozenset({"fma", "avx2", "avx512f", "avx512_bf16", "amx_tile"})}
    assert machine.core_facts(ident)["core"].startswith("Intel Xeon")
    assert machine.core_name(ident, by_model=True).startswith("Intel client")
    assert machine.core_facts({**ident, "vendor": "HygonGenuine"}) is None


@pytest.mark.parametrize("name", captured_machines.NAMES)
def test_measured_fmas_a_cycle_times_lanes_is_the_measured_lanes(name):
    """ch1.hw.fmas_per_cycle (measured) times the lanes of one instruction is chapter 1's
    measured f32 lanes a cycle, on every captured machine; the table's facts are typed."""
    rec = captured_machines.load(name).record("ch1.machine")
    th = ch1.summary(rec)["theory"]
    hw = ch1.reading.hw_values(rec, th)
    assert isinstance(hw["ch1.hw.fmas_per_cycle"], int) and isinstance(hw["ch1.hw.lanes"], int)
    assert hw["ch1.hw.fmas_per_cycle"] * hw["ch1.hw.lanes"] == th["lanes"]
    assert hw["ch1.hw.lanes"] * 32 == hw["ch1.hw.vector_bits"]
    if hw["ch1.hw.core"] is not None:
        row = machine.CORE_FACTS[hw["ch1.hw.core"]]
        assert hw["ch1.hw.cite"] == row["cite"] and hw["ch1.hw.pipes"] == row["pipes"]
        # the table's pipes carry at least what was measured
        assert row["pipes"] * row["pipe_bits"] >= th["lanes"] * 32


def test_dot_and_tile_rates_a_cycle_take_the_better_per_core_rate():
    # a disturbed one-thread probe (the EMR capture's int8 and AMX runs) must not halve the
    # rate a cycle: the page takes the f32 peak's rule, the better of one thread's rate and
    # all cores' over the cores, and says which
    rec = records.load(ch1.RECORD, MACHINES / "intel-xeon-emr-2c" / "records")
    sm = ch1.summary(rec)
    values = ch1.reading._dot_values(rec, sm)
    ghz, cores = sm["theory"]["clock_ghz"], sm["theory"]["cores"]
    for kind, key, ops in (("amx_int8", "tiles.int8", 1), ("amx_bf16", "tiles.bf16", 1),
                           ("int8", "dot.int8", ch1.reading.DOT_OPS["int8"]),
                           ("bf16", "dot.bf16", ch1.reading.DOT_OPS["bf16"])):
        one, every = sm["peak"][kind, 1], sm["peak"][kind, sm["cores"]] / cores
        assert values[f"ch1.{key}_per_cycle"] == pytest.approx(max(one, every) / ops / ghz)
        assert values[f"ch1.{key}_from_all"] == (every > one)
    assert values["ch1.tiles.int8_from_all"] and not values["ch1.dot.bf16_from_all"]


def test_a_kept_choice_is_measured_once_and_again_only_when_forgotten(tmp_path, monkeypatch):
    """machine.kept: the first call measures and keeps, later calls (any process) read it; a
    different key, a damaged file or forget_kept() measures again."""
    from smallem.cpu import machine
    from smallem.plumbing import build
    monkeypatch.setattr(build, "cache_dir", lambda: tmp_path)
    calls = []

    def measure_it(v=7):
        calls.append(v)
        return v

    assert machine.kept("t", [1], measure_it) == 7
    assert machine.kept("t", [1], lambda: measure_it(8)) == 7 and calls == [7]
    assert machine.kept("t", [2], lambda: measure_it(9)) == 9 and calls == [7, 9]
    for p in tmp_path.glob("kept_t_*.json"):
        p.write_text("{ not json")
    assert machine.kept("t", [1], lambda: measure_it(10)) == 10
    assert machine.forget_kept() == 2 and not list(tmp_path.glob("kept_*"))
    assert machine.kept("t", [1], lambda: measure_it(11)) == 11
    # a measurement that asks for another kept choice does not wait on itself
    assert machine.kept("u", [1], lambda: machine.kept("v", [1], lambda: measure_it(12))) == 12


def test_processes_started_together_keep_one_choice(tmp_path):
    """Several processes asking for the same kept choice at once: one measures, the others
    wait for it and read its value (each would otherwise time its own, contended)."""
    import subprocess
    import sys

    code = (
        "import sys, time, os\n"
        "from smallem.plumbing import build\n"
        f"build.cache_dir = lambda: __import__('pathlib').Path({str(tmp_path)!r})\n"
        "from smallem.cpu import machine\n"
        "def m():\n"
        "    time.sleep(0.3)\n"
        "    return os.getpid()\n"
        "print(machine.kept('race', [1], m))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    got = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(got) == 1, got
