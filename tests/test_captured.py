"""Every machine-dependent decision, made for every machine in tests/machines/.

The suite runs on one CPU, but the decisions it checks are made on all of them: each test
here takes a captured machine's files and records (tests/captured.py) and asks the library
what it would choose there, ISA level and extensions, FMA pipes and the theoretical peak,
the GEMM's loop order and blocks, the bf16 path, the attention's tile, the memory plateaus
and which of chapter 4's models sit in which level. Where the machine's own records say what
its library chose when its book was made, the choice today must be the same, unless the
record predates the model that makes it (then the test says what it checks instead).
"""

from __future__ import annotations

import math

import pytest

import captured
from smallem import gemm, isa, layers, machine
from smallem.book import ch1, records
from smallem.book.ch4 import measuring as ch4m

NAMES = captured.NAMES


def test_every_captured_machine_is_complete():
    # the CPUs the project has met, each with its OS files and a chapter-1 record
    assert {"amd-zen3-2c", "amd-zen4-2c", "amd-zen5-2c", "intel-xeon-emr-2c",
            "intel-xeon-m167-2c", "intel-xeon-gnr-2c"} <= set(NAMES)
    for name in NAMES:
        folder = captured.MACHINES / name
        for f in ("lscpu.txt", "cpuinfo-cpu0.txt", "caches.txt", "records/ch2.gemm.json"):
            assert (folder / f).is_file(), f"{name}: {f} missing"


@pytest.mark.parametrize("name", NAMES)
def test_captured_files_agree_with_the_records(name):
    """The OS files and the fingerprint the machine's records carry describe one machine."""
    m = captured.load(name)
    fp = captured.load(name).record("ch1.machine")["machine"]
    for key in ("L1d_bytes", "L2_bytes", "L3_bytes", "L2_instances", "L3_instances"):
        assert m.caches[key] == fp["caches"][key], key
    assert m.level == fp["isa"]["isa"], "the ISA level its flags allow is the one it ran"
    assert set(fp["isa"]["extensions"]) <= set(isa.extensions(m.level, m.ident["flags"]))


@pytest.mark.parametrize("name", NAMES)
def test_isa_levels_from_the_flags(name):
    m = captured.load(name)
    flags = m.ident["flags"]
    runs = [lv for lv in isa.LEVELS if isa.supported(lv, flags)]
    assert runs[-1] == "generic" and runs[0] == m.level
    assert ("avx512" in runs) == ("avx512f" in flags)
    exts = isa.extensions("avx512", flags)
    assert ("avx512_bf16" in exts) == ("avx512_bf16" in flags)
    assert ("amx_bf16" in exts) == ("amx_bf16" in flags)


@pytest.mark.parametrize("name", NAMES)
def test_fma_pipes_and_the_peak_are_the_records(name):
    """The pipe table gives each machine the pipes and lanes its record's theoretical peak
    used, and the clock that peak implies is one such a core runs at."""
    m = captured.load(name)
    rec = m.record("ch1.machine")
    theory = rec["settings"]["theory"]
    pipes, bits, _ = machine.fma_units(m.ident)
    assert machine.core_name(m.ident) is not None
    assert (pipes, bits) == (theory["pipes"], theory["pipe_bits"])
    clock = theory["gops_per_core"] * 1e9 / theory["flops_per_cycle_per_core"]
    now = machine.theoretical_peak(clock, m.cores, m.level, 0.0, ident=m.ident)
    assert now["flops_per_cycle_per_core"] == theory["flops_per_cycle_per_core"]
    implied = records.value(rec, "peak", kind="f32", threads=1) / theory["flops_per_cycle_per_core"]
    assert 2.0 < implied < 5.5, implied


@pytest.mark.parametrize("name", NAMES)
def test_loop_order_and_blocks_are_what_the_machine_chose(name):
    m = captured.load(name)
    mr, nr = m.kernel_shape
    s = m.record("ch2.gemm")["settings"]
    assert (mr, nr) == (s["mr"], s["nr"]), "the micro-kernel model gives the shape it compiled"
    geometry = gemm.cache_geometry(m.caches)
    order, why = gemm.loop_order(mr, nr, m.feeds, geometry, threads=m.cores)
    assert why["need_gbs"] == pytest.approx(m.feeds["f32_gops_core"] * why["bytes_per_op"])
    # Zen 3 (AVX2's 6-row tile needs 2.4x the L3 bytes per FMA of AVX-512's 14 rows) and the
    # Xeons' mesh L3 cannot feed rung 5's order at HEADROOM (Granite Rapids' 27 GB/s a core
    # against the 31 its 210 Gop/s core needs); Zen 4's and Zen 5's can
    expected = {"amd-zen3-2c": "columns", "amd-zen4-2c": "rows", "amd-zen5-2c": "rows",
                "intel-xeon-emr-2c": "columns", "intel-xeon-m167-2c": "columns",
                "intel-xeon-gnr-2c": "columns"}
    assert order == expected[name], why
    if "order" in s:  # recorded with today's model: the same choice, the same blocks
        assert order == s["order"]
        rows = gemm.block_sizes(mr, nr, geometry, m.cores, rung5=True)
        cols = gemm.block_sizes(mr, nr, geometry, m.cores)
        assert rows == s["blocks_rows"] and cols == s["blocks_ladder"]
        assert s["blocks"] == (rows if order == "rows" else cols)


def test_loop_order_the_package_takes_is_the_models(captured_machine):
    """Injected, the package's GEMM takes the order and blocks the model gives the machine
    (with this CPU's micro-kernel, the one that runs)."""
    m = captured_machine
    mr, nr = gemm.kernel_shape()
    geometry = gemm.cache_geometry(m.caches)
    order = gemm.loop_order(mr, nr, m.feeds, geometry, threads=m.cores)[0]
    assert gemm.default_order() == order
    assert gemm.default_blocks() == gemm.block_sizes(mr, nr, geometry, m.cores,
                                                     rung5=order == "rows")
    assert gemm.ladder_blocks() == gemm.block_sizes(mr, nr, geometry, m.cores)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_path_is_what_the_machine_chose(name):
    m = captured.load(name)
    flags = m.ident["flags"]
    paths = ["widen"]
    if m.level == "avx512" and "avx512_bf16" in flags:
        paths.append("native")
    if m.level == "avx512" and "amx_bf16" in flags:
        paths.append("amx")  # where Linux grants the tiles, as it did on the captured Xeon
    got = gemm.choose_bf16_path(paths, m.feeds)
    assert got == m.record("ch2.gemm")["settings"]["bf16_path"]
    assert got == {"amd-zen3-2c": "widen", "amd-zen4-2c": "native", "amd-zen5-2c": "native",
                   "intel-xeon-emr-2c": "amx", "intel-xeon-m167-2c": "amx",
                   "intel-xeon-gnr-2c": "amx"}[name]


@pytest.mark.parametrize("name", NAMES)
def test_flash_tile_fits_each_l1(name):
    m = captured.load(name)
    for hd in (32, 64, 128):
        tile = layers.flash_tile(hd, m.caches)
        assert 32 <= tile <= 256 and tile % 32 == 0
        if tile > 32:  # the K and V tiles together fit the L1
            assert 2 * 4 * hd * tile <= m.caches["L1d_bytes"], (hd, tile)


@pytest.mark.parametrize("name", NAMES)
def test_plateaus_of_each_staircase(name):
    rec = captured.load(name).record("ch1.machine")
    caches = rec["machine"]["caches"]
    for th in rec["settings"]["threads"]:
        found = ch1.plateaus(records.results(rec, "stream", kernel="triad", threads=th), caches, th)
        assert not any(math.isnan(v) for v in found.values()), (th, found)
        assert found["L1"] > found["L2"] > found["L3"] > found["DRAM"], (th, found)
    one = ch1.plateaus(records.results(rec, "stream", kernel="triad", threads=1), caches, 1)
    assert ch1.staircase_distinct(one), one


@pytest.mark.parametrize("name", NAMES)
def test_chapter_4s_study_spans_every_measured_level(name):
    """The L3 study's models, chosen from where each machine's measured plateaus end: one
    whose int8 weights sit in the L2 plateau, one inside the L3 plateau, one past it (DRAM),
    as chapter 1's staircase (ch1.level_of) places them, on each machine's own record."""
    m = captured.load(name)
    facts = ch1.summary(m.record("ch1.machine"))
    ext = facts["triad_spans"][m.cores]
    ends = {lv: span["last"] for lv, span in ext.items()}
    widths = ch4m.study_sizes(m.caches, m.cores, 24 * 1024**3, quick=False, ends=ends)

    def int8_bytes(d):
        return 1.0625 * 12 * ch4m.STUDY_LAYERS * d * d

    held = [ch1.level_of(facts, int8_bytes(d), m.cores)[0] for d in widths]
    assert {"L2", "L3", "DRAM"} <= set(held), (widths, held, ends)
    # several times past the measured L3, unless the memory caps the study first
    memory = 24 * 1024**3
    capped = int8_bytes(widths[-1] + 64) > 1.0625 * memory / 4 / 13
    assert int8_bytes(widths[-1]) >= 4 * ends["L3"] or capped


@pytest.mark.parametrize("name", NAMES)
def test_a_level_is_where_the_measured_plateau_ran(name):
    """ch1.level_of places a working set in the first level whose measured stretch still
    ran at that size: the largest size of each stretch is in it, twice the DRAM stretch's
    first size is DRAM, and no level is chosen past its plateau's measured end."""
    m = captured.load(name)
    facts = ch1.summary(m.record("ch1.machine"))
    for th, ext in facts["triad_spans"].items():
        reached = [lv for lv in ch1.LEVELS if ext[lv]["bw"] == ext[lv]["bw"]]
        for lv in reached[:-1]:
            assert ch1.level_of(facts, ext[lv]["last"], th) == (lv, ext[lv]["bw"]), (th, lv)
            assert ext[lv]["first"] <= ext[lv]["last"] < ext[reached[reached.index(lv) + 1]]["first"]
        assert ch1.level_of(facts, 2 * ext["DRAM"]["first"], th)[0] == "DRAM"


@pytest.mark.parametrize("name", NAMES)
def test_decode_bounds_come_from_the_read_only_stream_where_it_was_measured(name):
    """With read-only points in chapter 1's record, its staircase is found like the triad's,
    ch1.read_stream names it, and chapter 4's bounds are its bandwidths; a record from before
    it falls back to the triad, and asking such a record for the read staircase is an error."""
    import copy

    from smallem.book.ch4 import reading as ch4r

    rec = copy.deepcopy(captured.load(name).record("ch1.machine"))
    old = ch1.summary(rec)
    if "read_spans" not in old:  # the record predates the read stream: the triad stands
        assert ch1.read_stream(old) == "triad" and ch4r.stream_name(old) == "triad"
        with pytest.raises(ValueError, match="read"):
            ch1.level_of(old, 1e6, 1, "read")
        big = 4 * old["triad_spans"][old["cores"]]["DRAM"]["first"]
        assert ch4r.bandwidth_bound(old, big, old["cores"])[1] == \
            pytest.approx(1e9 * old["triad_plateaus"][old["cores"]]["DRAM"])
        # the same record with read points: each triad point again, 1.3 times as fast
        for r in [r for r in rec["results"] if r["params"].get("kernel") == "triad"]:
            r = copy.deepcopy(r)
            r["params"]["kernel"] = "read"
            r["value"] = {k: 1.3 * v if isinstance(v, float) else v for k, v in r["value"].items()}
            rec["results"].append(r)
    facts = ch1.summary(rec)
    assert ch1.read_stream(facts) == "read" and ch4r.stream_name(facts) == "read-only stream"
    for th, ext in facts["read_spans"].items():
        big = 4 * ext["DRAM"]["first"]
        level, bw = ch1.level_of(facts, big, th, "read")
        assert level == "DRAM" and bw == ext["DRAM"]["bw"]
        assert ch4r.bandwidth_bound(facts, big, th) == ("DRAM", pytest.approx(1e9 * bw))
        assert bw != facts["triad_plateaus"][th]["DRAM"]  # not the triad's
