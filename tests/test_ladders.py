"""The four ladders (chapter 2's product, the GPU's, chapter 3's climb, chapter 4's decoders):
one type, every rung addressed by name, and every rung one hop from its kernel's section, its
page's section, its notebook's cell and its test. The one-hop table is data in the ladders;
this walks it, so a renamed heading, marker, cell or test fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from smallem import ladder
from smallem.plumbing import cuda
from smallem.generating import decode
from smallem.product import gemm
from smallem.training import layers, train
from smallem.book.ch3 import measuring as ch3m

ROOT = Path(__file__).resolve().parent.parent
LADDERS = {"gemm": gemm.LADDER, "gpu": cuda.GPU_LADDER, "climb": train.RUNGS,
           "decode": decode.RUNGS, "scan": layers.SCAN_LADDER}


def _text(path: str) -> str:
    file = ROOT / path
    assert file.is_file(), f"{path}: no such file"
    return file.read_text()


@pytest.mark.parametrize("name", list(LADDERS))
def test_every_ladder_is_one_type_numbered_and_named(name):
    lad = LADDERS[name]
    assert isinstance(lad, ladder.Ladder)
    assert all(isinstance(r, ladder.Rung) for r in lad)
    assert [r.index for r in lad] == list(range(len(lad)))
    for r in lad:
        assert lad[r.name] is r and lad.number(r.name) == r.index and r.name in lad
    with pytest.raises(KeyError, match="no rung 'nothing'"):
        lad["nothing"]


@pytest.mark.parametrize("name", list(LADDERS))
def test_every_rung_is_one_hop_from_its_kernel_page_notebook_and_test(name):
    for r in LADDERS[name]:
        w = r.where
        assert w.page and w.notebook and w.test, f"{name} {r.name}: a place is missing"
        if w.kernel:  # a section a --8<-- marker opens
            path, marker = w.kernel.split(":", 1)
            assert f"[start:{marker}]" in _text(path), f"{name} {r.name}: no [start:{marker}] in {path}"
        for place in (w.page, w.notebook):
            path, what = place.split(":", 1)
            assert what in _text(path), f"{name} {r.name}: {what!r} not in {path}"
        path, test = w.test.split("::", 1)
        func, _, param = test.partition("[")
        assert re.search(rf"^def {re.escape(func)}\(", _text(path), re.M), \
            f"{name} {r.name}: no test {func} in {path}"
        if param:  # a test parametrized by the rung's name: the id is its name
            assert param.rstrip("]") == r.name


def test_the_ladder_type_refuses_a_broken_ladder():
    a, b = ladder.Rung(0, "a", "first"), ladder.Rung(1, "b", "second")
    with pytest.raises(ValueError, match="numbered"):
        ladder.Ladder("x", [b, a])
    with pytest.raises(ValueError, match="share a name"):
        ladder.Ladder("x", [a, ladder.Rung(1, "a", "again")])
    lad = ladder.Ladder("x", [a, b])
    assert lad["b"] is b and lad[0] is a and list(lad) == [a, b] and lad.names() == ["a", "b"]
    assert "a" in lad and 1 in lad and b in lad  # a name, a place, a rung
    assert "c" not in lad and 2 not in lad and -1 not in lad and True not in lad


def test_rungs_are_reached_by_name_in_the_library():
    # each ladder's callable or settings, by name: what the book calls them with
    assert gemm.LADDER["threads"].threaded and not gemm.LADDER["packed"].threaded
    assert train.rung_settings("modern")["optimizer"] == "muon"
    assert ch3m.RUNGS is train.RUNGS  # the chapter reads the library's climb, not its own
    assert ch3m.F32_TOP == ch3m.RUNGS["fused"].index
    assert decode.rung_label("int8").startswith("int8 weights")
    assert cuda.RUNGS[cuda.FINAL_F32] is cuda.GPU_LADDER[cuda.FINAL_F32]
