"""Every notebook runs from top to bottom in quick mode, writing only into a temp folder.

Each notebooks/NN_name.py (jupytext percent format) is executed in a Jupyter kernel with
SMALLEM_QUICK=1 (tiny sizes, seconds) and SMALLEM_RECORDS / SMALLEM_FIGURES pointing into
tmp_path, so the committed records are never overwritten. MPLBACKEND is left unset: with Agg
forced, the figures would vanish from the executed notebook.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.py"))


def snapshot(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def test_kernel_is_this_python():
    """The notebooks must run with the venv's packages: the python3 kernel is this python."""
    pytest.importorskip("ipykernel")
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    exe = spec.argv[0]
    # jupyter_client runs 'python'/'python3' in a kernel spec as the client's own interpreter
    if exe not in ("python", f"python{sys.version_info[0]}",
                   f"python{sys.version_info[0]}.{sys.version_info[1]}"):
        assert Path(exe).resolve() == Path(sys.executable).resolve(), (
            f"the python3 kernel ({spec.resource_dir}) runs {exe}, not {sys.executable}: "
            f"run `{sys.executable} -m ipykernel install --sys-prefix`")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_conventions(path):
    """No TeX in Markdown cells (the site loads no math script for notebook pages), and plain
    tqdm (tqdm.auto stores a widget that the static site cannot show)."""
    import jupytext

    nb = jupytext.read(path)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            for marker in ("$", "\\(", "\\["):
                assert marker not in cell.source, (
                    f"{path.name}, cell {i}: math ({marker!r}) in a Markdown cell is not rendered "
                    f"on the site; write it in words or put it in the chapter")
        if cell.cell_type == "code":
            for bad in ("tqdm.auto", "tqdm.notebook", "ipywidgets"):
                assert bad not in cell.source, f"{path.name}, cell {i}: use plain tqdm, not {bad}"


# Each notebook runs in a process of its own, two at a time (the machines have two cores and a
# notebook's kernel is mostly one Python thread): what one writes the other never reads, each
# with its own records and figures folders.
RUN_ONE = r"""
import json, sys
import jupytext
from nbclient import NotebookClient
path, out = sys.argv[1], sys.argv[2]
nb = jupytext.read(path)
NotebookClient(nb, kernel_name="python3", timeout=600,
               resources={"metadata": {"path": sys.argv[3]}}).execute()
errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
          if o.get("output_type") == "error"]
outputs = sum(len(c.get("outputs", [])) for c in nb.cells if c.cell_type == "code")
json.dump({"errors": errors, "outputs": outputs}, open(out, "w"))
"""


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """{notebook stem: (CompletedProcess, its summary or None)}, every notebook executed in
    quick mode (SMALLEM_QUICK=1) into a temp folder, and whether the committed records were
    left as they were."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    pytest.importorskip("jupytext")
    pytest.importorskip("nbclient")
    committed = ROOT / "figures" / "records"
    before = snapshot(committed)

    def run(path):
        tmp = tmp_path_factory.mktemp(path.stem)
        env = {**os.environ, "SMALLEM_QUICK": "1", "SMALLEM_RECORDS": str(tmp / "records"),
               "SMALLEM_FIGURES": str(tmp / "figures")}
        env.pop("MPLBACKEND", None)
        out = tmp / "summary.json"
        r = subprocess.run([sys.executable, "-c", RUN_ONE, str(path), str(out), str(tmp)],
                           env=env, capture_output=True, text=True, timeout=900)
        import json
        return path.stem, (r, json.loads(out.read_text()) if out.is_file() else None)

    with ThreadPoolExecutor(2) as ex:
        results = dict(ex.map(run, NOTEBOOKS))
    return results, snapshot(committed) == before


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, executed):
    results, records_kept = executed
    r, summary = results[path.stem]
    assert r.returncode == 0 and summary is not None, (r.stdout[-2000:] + r.stderr[-4000:])
    assert not summary["errors"], summary["errors"]
    assert records_kept, "a notebook changed the committed records"
    assert summary["outputs"] > 0, f"{path.name} ran but showed nothing"


def test_the_host_is_compared_with_the_records_machine(tmp_path):
    """A notebook that measures live says when the host running it is not the machine of the
    records it reads: one function compares the fingerprints, and every such notebook calls it."""
    import json

    from smallem.book import records
    from smallem.cpu import machine_info

    here = machine_info.fingerprint()
    assert records.host_differences(dict(here), here) == []
    other = json.loads(json.dumps(here))
    other["model"] = (here.get("model") or 0) + 1
    other["caches"]["L3_bytes"] = 2 * (here["caches"].get("L3_bytes") or 2**20)
    diff = records.host_differences(other, here)
    assert any(d.startswith("model ") for d in diff) and any(d.startswith("L3 ") for d in diff)
    (tmp_path / "recs").mkdir()
    (tmp_path / "recs" / "x.json").write_text(json.dumps(
        {"schema": records.SCHEMA, "name": "x", "machine": other, "results": []}))
    same, text = records.host_check("x", tmp_path / "recs")
    assert not same and "not the machine of the records" in text and "this host's" in text
    assert records.host_check("missing", tmp_path / "recs")[0]      # measured here: the host
    assert records.live_note(1.2, 3.9, False) and not records.live_note(3.8, 3.9, True)
    for path in NOTEBOOKS:
        if path.stem != "07_machines":                             # 07 measures nothing
            assert "records.host_check(" in path.read_text(), path.name
