"""Every rung of chapters 2 to 4 has the figure the hardware predicts beside its measured one:
the tables of the book's records, and chapter 2's on every captured machine, carry a predicted
figure on each rung row, and the predictions keep the order the models imply."""

from __future__ import annotations

import json

import pytest

from smallem.book import ch1, compare, figures, records
from smallem.book.ch2 import reading as ch2r
from smallem.book.ch3 import predicted as ch3p
from smallem.book.ch3 import reading as ch3r
from smallem.book.ch4 import reading as ch4r
from smallem.product.gemm import LADDER

import captured

BOOK = records.records_dir()


def _dirs():
    out = [("book", BOOK)]
    out += [(n, captured.MACHINES / n / "records") for n in captured.NAMES]
    return [(n, d) for n, d in out if records.exists("ch2.gemm", d) and ch1.facts(d)]


@pytest.mark.parametrize("name,folder", _dirs(), ids=[n for n, _ in _dirs()])
def test_every_gemm_rung_has_a_prediction(name, folder):
    rec = records.load("ch2.gemm", folder)
    pred = ch2r.predicted(rec, ch1.facts(folder))
    assert sorted(pred) == [r.index for r in LADDER]
    # one core's rungs never beat one core's peak; all cores' rung is the most allowed
    one = ch1.facts(folder)["peak"][("f32", 1)]
    assert all(pred[i][0] <= one * 1.0001 for i in range(5)), pred
    assert pred[5][0] == max(g for g, _ in pred.values())
    assert pred[0][0] < pred[1][0] <= pred[3][0]


@pytest.mark.parametrize("name,folder", _dirs(), ids=[n for n, _ in _dirs()])
def test_rung5_is_bound_by_the_feed_of_its_block_where_that_is_tighter(name, folder):
    """Rung 5's block of B (K_C x N, 4 bytes a float) is shared: every core reads all of it.
    Where it is larger than one core's L2 plateau in chapter 1, the level that holds it must
    feed 2/M_R + 4/K_C bytes an operation; on all cores at that level's measured rate, that
    is rung 5's bound where it is below all cores' peak. A bound the rung beats by more
    than the noise would be a wrong bound."""
    rec, facts = records.load("ch2.gemm", folder), ch1.facts(folder)
    s, pred = rec["settings"], ch2r.predicted(rec, facts)
    cores = facts["peak"][("f32", facts["cores"])]
    rows5 = s.get("blocks_rows")
    if not rows5:
        assert pred[5][0] == cores
        return
    stream = ch1.read_stream(facts)
    block = 4 * rows5["kc"] * min(rows5["nc"], s["n_ladder"])
    one_core = facts[f"{stream}_spans"][1]
    beyond = block > one_core["L2"]["last"]
    ext = facts[f"{stream}_spans"]
    level = "L3" if block <= one_core["L3"]["last"] else "DRAM"
    fed = ext[facts["cores"]][level]["bw"] / (2 / s["mr"] + 4 / rows5["kc"])
    if beyond and fed < cores:
        assert pred[5] == (pytest.approx(fed), f"a sliver of B per tile from {level}")
    else:
        assert pred[5] == (cores, f"{facts['cores']} cores' peak")
    measured = records.value(rec, "rung", rung=5, M=s["n_ladder"])
    assert measured <= pred[5][0] * (1 + compare.SWEEP_NOISE), (measured, pred[5])


def test_the_xeons_row_order_is_fed_from_their_l3():
    """The two Xeon captures (a 3.3 MB block of B against L2 plateaus of 1 MB a core, an L3
    read at 29-58 GB/s): rung 5's bound is the L3's feed, below the two cores' peak; the AMD
    captures' L3 feeds the row order faster than their cores compute."""
    got = {n: ch2r.predicted(records.load("ch2.gemm", d), ch1.facts(d))[5][1]
           for n, d in _dirs() if n != "book"}
    assert got["intel-xeon-gnr-2c"] == got["intel-xeon-emr-2c"] == "a sliver of B per tile from L3"
    assert got["amd-zen4-2c"] == "2 cores' peak"


def test_every_climb_rung_has_a_prediction(tmp_path, monkeypatch):
    """The book's chapter-3 record: each measured rung's row carries its prediction."""
    if not records.exists(ch3r.RECORD_STEP, BOOK):
        pytest.skip("no chapter-3 record in the book")
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path))
    rec = records.load(ch3r.RECORD_STEP, BOOK)
    toks = {r["params"]["rung"]: r["value"]["median"] for r in records.results(rec, "rung_step")}
    toks.update({0: r["value"]["median"] for r in records.results(rec, "step", backend="numpy")})
    pred = ch3p.predicted(rec, BOOK, toks)
    assert set(toks) <= set(pred), f"rungs without a prediction: {sorted(set(toks) - set(pred))}"
    # the arithmetic, redone from the record: rung 2 is rung 1's step less the regions'
    # saved fork-joins, rung 5 rung 4's less the fused kernels' saving
    s = rec["settings"]
    n = s["batch_size"] * s["seq_len"]
    fj = {r["params"]["kind"]: r["value"]["median"] for r in records.results(rec, "fork_join")
          if r["params"]["what"] in ("pool", "OpenMP")}
    saved2 = s["regions_per_step"] * (fj["openmp"] - fj["pool"]) * 1e-6
    assert pred[2][0] == pytest.approx(1 / (1 / toks[1] - saved2 / n), rel=1e-9)
    calls = s["op_calls"][str(ch3p.F32_TOP)]
    times: dict = {}
    for r in records.results(rec, "fused_op"):
        times.setdefault(r["params"]["op"], {})[r["params"]["fused"]] = r["seconds"]["median"]
    saved5 = sum(calls[ch3p.FUSED_OPS[op]] * (t[False] - t[True]) for op, t in times.items())
    assert ch3p.fused_saving(rec)[0] == pytest.approx(saved5, rel=1e-12)
    assert pred[5][0] == pytest.approx(1 / (1 / toks[4] - saved5 / n), rel=1e-9)


def test_every_decode_rung_has_its_bounds(tmp_path, monkeypatch):
    """The book's chapter-4 ladder: every rung row has a decode bound and (from rung 1) a
    prompt bound."""
    if not records.exists(ch4r.RECORD, BOOK):
        pytest.skip("no chapter-4 record in the book")
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path))
    ch4r.report(BOOK)
    table = (tmp_path / "tables" / "ch4_ladder.md").read_text().splitlines()
    rows = [line.split("|")[1:-1] for line in table if line.startswith("| ") and
            line.split("|")[1].strip().isdigit()]
    assert len(rows) == len(ch4r.decode.RUNGS)
    for cells in rows:
        assert "tokens/s" in cells[5], cells
        if int(cells[0]) > 0:
            assert "tokens/s" in cells[7], cells


def test_the_bf16_peak_is_the_amx_peak_where_the_amx_path_runs(tmp_path):
    """On an AMX machine whose bf16 products take the AMX path, chapter 3's bf16 bound and
    MFU use chapter 1's AMX peak (tdpbf16ps), not the vdpbf16ps probe's."""
    import json

    rec = json.loads((BOOK / "ch1.machine.json").read_text())
    rec["results"] = [r for r in rec["results"]
                      if not (r["name"] == "peak" and r["params"]["kind"].startswith("amx"))]
    bf16 = [r for r in rec["results"] if r["name"] == "peak" and r["params"]["kind"] == "bf16"]
    without, with_amx = tmp_path / "without", tmp_path / "with"
    without.mkdir(), with_amx.mkdir()
    (without / "ch1.machine.json").write_text(json.dumps(rec))
    for r in bf16:
        amx = json.loads(json.dumps(r))
        amx["params"]["kind"] = "amx_bf16"
        amx["value"]["median"] = 10 * r["value"]["median"]
        rec["results"].append(amx)
    (with_amx / "ch1.machine.json").write_text(json.dumps(rec))
    th = max(r["params"]["threads"] for r in bf16)
    vdp = ch3p._peak(without, "bf16", th)
    assert ch3p._peaks({"settings": {"bf16_path": "amx"}}, with_amx, th)["bf16"] == 10 * vdp
    assert ch3p._peaks({"settings": {"bf16_path": "native"}}, with_amx, th)["bf16"] == vdp
    assert ch3p._peaks({"settings": {"bf16_path": "amx"}}, without, th)["bf16"] == vdp  # none measured


def test_the_bf16_prediction_reads_chapter_2s_own_bf16_gemm():
    """Chapter 2's record of this machine holds its bf16 GEMM (its dtype results): the bf16
    rung's prediction takes the ratio of the step's path there, at the model's product shape,
    and not chapter 1's peaks, wherever that record is of the same CPU."""
    for name in ("intel-xeon-gnr-2c", "amd-zen3-2c"):
        folder = captured.MACHINES / name / "records"
        if not (records.exists(ch3r.RECORD_STEP, folder) and records.exists("ch2.gemm", folder)):
            continue
        rec, g = records.load(ch3r.RECORD_STEP, folder), records.load("ch2.gemm", folder)
        path = rec["settings"]["bf16_path"]
        want = [r["value"]["median"] for r in records.results(g, "dtype", M=8192, K=768, N=3072)
                if r["params"]["dtype"] == "f32" or r["params"].get("path") == path]
        got = ch3p.bf16_gemm(rec, folder)
        assert got["shape"] == "8192×768×3072", (name, got)
        assert got["ratio"] == pytest.approx(want[1] / want[0], rel=1e-12), name
        other = json.loads(json.dumps(rec))
        other["machine"]["cpu"] = "another CPU"
        assert ch3p.bf16_gemm(other, folder) is None  # another machine's record never counts


def test_the_references_mfu_is_its_speed_at_this_books_count():
    """The reference's MFU, on chapter 3's page and the home page alike: its final xl step's
    tokens/s at this book's FLOPs per token over its own f32 peak."""
    from smallem.book import reference as ref
    from smallem.training.model import CONFIGS
    want = ref.CH3_XL_STEP_AFTER_TOKS * CONFIGS["xl"].flops_per_token() / (ref.CH1_F32_PEAK_GOPS * 1e9)
    assert ref.CH3_XL_MFU_CPU == pytest.approx(want) and 0.5 < want < 0.52


def test_the_amx_integer_gemm_prediction_counts_what_its_kernel_does(tmp_path, monkeypatch):
    """Appendix B's prediction of the tiles' integer GEMM reads its counts from the kernel
    (kernels_c/forward/qgemm.c, qg_amx_rows): one tdpbssd a step of 32 of k (half the
    instruction's 64), and per row a conversion, a product of the scales and a multiply-add;
    on a record whose GEMM ran on the tiles (a GNR capture with the path set) the two
    predictions bracket in turn and overlapped, and a record on vpdpbusd has none."""
    import re

    from smallem.book import others
    from smallem.book.others import reading as br

    src = (records.ROOT / "kernels_c" / "forward" / "qgemm.c").read_text()
    rows = src[src.index("static void qg_amx_rows"):src.index("#undef QG_AMX_STEP")]
    step = src[src.index("#define QG_AMX_STEP"):src.index("static void qg_amx_rows")]
    assert step.count("SM_TILE_DPBSSD") == 1 and "kb = form == QG_SPLIT ? 16 : 32" in rows
    assert br.AMX_BLOCK_OPS * 64 == br.AMX_PROBE_OPS * 32
    scale = re.search(r"for \(int i = 0; i < 16; i\+\+\)\s*acc\[i\] = (_mm512_fmadd_ps\(_mm512_cvtepi32_ps.*?);",
                      rows, re.S).group(1)  # the scaling of a block's sums, row by row
    ops = re.findall(r"_mm512_(fmadd|cvtepi32|mul|add|sub)_", scale)
    assert br.AMX_BLOCK_VECTOR == 16 * len(ops) == 48, ops

    folder = tmp_path / "records"
    folder.mkdir()
    capture = captured.MACHINES / "intel-xeon-gnr-2c" / "records"
    for name in ("ch1.machine.json", "ch2.gemm.json", "others.decode.json"):
        (folder / name).write_text((capture / name).read_text())
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path / "figures"))
    (tmp_path / "figures" / "tables").mkdir(parents=True)
    assert others.report(folder)["others.amx_pred_lo"] is None  # vpdpbusd: its own prediction
    rec = json.loads((folder / "others.decode.json").read_text())
    rec["settings"].update(int8_instruction="tdpbssd (AMX tiles)", int8_path="amx")
    (folder / "others.decode.json").write_text(json.dumps(rec))
    v = others.report(folder)
    facts = ch1.facts(folder)
    th = rec["settings"]["threads"]
    tile = br.AMX_PROBE_OPS / (facts["peak"][("amx_int8", th)] * 1e9)
    vector = 48 / (facts["peak"][("f32", th)] * 1e9 / 32)
    assert v["others.amx_pred_lo"] == pytest.approx(br.AMX_BLOCK_OPS / (tile + vector) / 1e9)
    assert v["others.amx_pred_hi"] == pytest.approx(br.AMX_BLOCK_OPS / max(tile, vector) / 1e9)
    assert v["others.amx_pred_lo"] < v["others.amx_pred_hi"] and v["others.int8_predicted"] is None
