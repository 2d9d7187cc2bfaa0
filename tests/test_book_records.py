"""The committed book is one machine's whole book.

`figures/records/` is what the site in the repository was built from. Every CPU record there
comes from one machine (the lent GPU's records, made on its host, and chapter 2's bf16 record
from a second CPU are the declared exceptions), and each record holds the rows of every peer
its chapter compares against (``PEER_ROWS`` in the chapter's module): a book made without
PyTorch or llama.cpp is not the book, even if every page renders.
"""

from __future__ import annotations

import pytest

from smallem import book
from smallem.book import capture, records
from smallem.book.ch2 import BF16_RECORD

REC_DIR = records.ROOT / "figures" / "records"
# records a chapter keeps from another machine on purpose (besides those made on a GPU's host)
MADE_ELSEWHERE = {BF16_RECORD}


def _peer_cases():
    for module in book.modules():
        for record, peers in getattr(module, "PEER_ROWS", {}).items():
            for peer, (result, params) in peers.items():
                yield pytest.param(record, peer, result, params, id=f"{record}-{peer}")


def has_peer(rec: dict, result: str, params: dict) -> bool:
    return bool(records.results(rec, result, **params))


@pytest.mark.parametrize("record,peer,result,params", list(_peer_cases()))
def test_each_committed_record_has_its_peers(record, peer, result, params):
    assert records.exists(record, REC_DIR), f"figures/records has no {record}"
    rec = records.load(record, REC_DIR)
    why = (rec["settings"].get("missing") or {})
    assert has_peer(rec, result, params), (
        f"figures/records/{record}.json (commit {rec.get('commit')}) has no {peer} rows"
        f"{' (' + '; '.join(f'{k}: {v}' for k, v in why.items()) + ')' if why else ''}: "
        f"remake the book with its peers (`make book`)")


def test_the_check_can_fail():
    rec = {"results": [{"name": "step", "params": {"backend": "numpy"}, "value": {}}]}
    assert not has_peer(rec, "step", {"backend": "torch"})
    assert has_peer(rec, "step", {"backend": "numpy"})


def cpu_records(rec_dir) -> dict:
    """{record file: its machine's fingerprint} for the records measured on the book's CPU
    (not on a GPU's host, not kept from elsewhere on purpose)."""
    out = {}
    for f in sorted(rec_dir.glob("*.json")):
        rec = records.load(f.stem, rec_dir)
        m = rec.get("machine", {})
        if m.get("gpu") or f.stem in MADE_ELSEWHERE:
            continue
        out[f.name] = tuple(m.get(k) for k in capture.KEYS) + (
            m.get("caches", {}).get("L3_bytes"),)
    return out


def test_the_committed_records_come_from_one_machine():
    found = cpu_records(REC_DIR)
    assert "ch1.machine.json" in found
    machines = {}
    for name, fp in found.items():
        machines.setdefault(fp, []).append(name)
    assert len(machines) == 1, "figures/records mixes machines: " + "; ".join(
        f"{fp[0]} ({', '.join(n)})" for fp, n in machines.items())


def test_mixed_records_are_caught(tmp_path):
    import shutil

    from captured import MACHINES

    for src in (REC_DIR / "ch1.machine.json",
                next(d for d in sorted(MACHINES.glob("*/records/ch2.gemm.json"))
                     if records.load("ch2.gemm", d.parent)["machine"]["cpu"]
                     != records.load("ch1.machine", REC_DIR)["machine"]["cpu"]
                     or records.load("ch2.gemm", d.parent)["machine"]["caches"]["L3_bytes"]
                     != records.load("ch1.machine", REC_DIR)["machine"]["caches"]["L3_bytes"])):
        shutil.copy(src, tmp_path / src.name)
    assert len(set(cpu_records(tmp_path).values())) == 2
