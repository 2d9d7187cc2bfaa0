"""Shared test fixtures.

- ``level``: parametrizes a test over every ISA level this CPU can run; levels
  it cannot run appear as visible skips, never as silent passes. One more
  parameter, ``avx512-simde``, runs the AVX-512 code on a CPU without it
  through SIMDe (``SMALLEM_EMULATE=avx512``), so its results are checked here
  too; a test that times something skips it with ``no_emulation``.
- ``rng``: a seeded numpy Generator.
- ``records_tmp``: an empty records folder (SMALLEM_RECORDS) so tests never
  overwrite the committed records.
- ``captured_machine``: each machine of tests/machines/ injected in turn (tests/captured.py).
- ``built_site``: the site, built once a session from the committed records
  (tests/site_build.py); its ``.returncode``, ``.log`` and ``.dir``.
"""

import os
from pathlib import Path

import numpy as np
import pytest

from smallem.cpu import isa

import captured


EMULATED = "avx512-simde"


@pytest.fixture(params=[*isa.LEVELS, EMULATED])
def level(request, monkeypatch):
    lvl = request.param
    if lvl == EMULATED:
        if isa.supported("avx512", isa.cpu_flags()):
            pytest.skip("this CPU runs AVX-512 itself: the avx512 parameter tests the real thing")
        if request.node.get_closest_marker("no_emulation"):
            pytest.skip("this test times its kernel: emulated AVX-512 has no meaningful speed")
        reason = isa.emulation_unavailable()
        if reason:
            pytest.skip(f"AVX-512 through SIMDe: {reason}")
        monkeypatch.setenv(isa.EMULATE_ENV, "avx512")
        monkeypatch.setenv("SMALLEM_ISA", "avx512")
        return "avx512"
    if not isa.supported(lvl):
        pytest.skip(f"ISA {lvl} cannot run on this CPU ({isa.cpu_flags() and 'flags lack it' or 'not x86'}); "
                    f"it is compile-checked by test_build.py"
                    f"{' and run through SIMDe as avx512-simde' if lvl == 'avx512' and not isa.emulation_unavailable() else ''}")
    monkeypatch.setenv("SMALLEM_ISA", lvl)
    return lvl


@pytest.fixture
def amx_emulated(monkeypatch):
    """On a CPU with AVX-512 but without AMX (a Zen 4 or 5), whose avx512 level runs natively
    and so never on tiles: the avx512 build through SIMDe with emulate.h's tiles, for one
    test. Skips where the CPU has AMX (the level fixture runs the real tiles), where it has
    no AVX-512 (the level fixture's avx512-simde runs them) and where SIMDe is missing."""
    if not isa.supported("avx512"):
        pytest.skip("no AVX-512 here: the level fixture's avx512-simde runs the tiles")
    if {"amx_int8", "amx_bf16"} & set(isa.extensions("avx512")):
        pytest.skip("this CPU has AMX: the level fixture runs the real tiles")
    if isa.emulation_unavailable():
        pytest.skip(f"AVX-512 through SIMDe: {isa.emulation_unavailable()}")
    monkeypatch.setenv(isa.EMULATE_ENV, "avx512")
    monkeypatch.setenv("SMALLEM_ISA", "avx512")
    monkeypatch.setattr(isa, "emulating", lambda level="avx512": level == "avx512")
    return "avx512"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def records_tmp(tmp_path, monkeypatch):
    folder = tmp_path / "records"
    monkeypatch.setenv("SMALLEM_RECORDS", str(folder))
    monkeypatch.setenv("SMALLEM_FIGURES", str(tmp_path / "figures"))
    return folder


def _figures_current(book, figures, records) -> bool:
    """Whether figures/ was made (``smallem figures``, as ``make test`` runs first) from the
    records folder the site reads, after the last change to any of those records or to the
    package's code: its manifest names that folder and those records, and is newer than all."""
    import json
    manifest = figures.tables_dir() / book.MANIFEST
    if not manifest.is_file():
        return False
    rec_dir = records.records_dir()
    made = json.loads(manifest.read_text())
    read = {k: str(v) for k, v in book.records_read(rec_dir).items()}
    if made.get("folder") != str(rec_dir.resolve()) or made.get("records") != read:
        return False
    code = Path(book.__file__).resolve().parent.parent
    newest = max(p.stat().st_mtime for p in [*code.rglob("*.py"), *map(Path, read.values())])
    return manifest.stat().st_mtime > newest


@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    """The book's site, built once a session with ``mkdocs build --strict`` (tests/site_build.py),
    after ``smallem figures`` has made the tables and values from the records."""
    import shutil

    import site_build
    from smallem import book
    from smallem.book import figures, records

    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("SMALLEM_FIGURES", raising=False)  # the pages include the repository's figures/
        if not _figures_current(book, figures, records):
            book.report_all()
    tmp = tmp_path_factory.mktemp("site")
    docs, stand_ins = site_build.docs_dir_for_tests(tmp)
    # The notebooks run during the build read the records, and measure (and save) any that is
    # missing: give them a copy, so the committed folder is never written by a test.
    rec = tmp / "records"
    if records.records_dir().is_dir():
        shutil.copytree(records.records_dir(), rec)
    return site_build.build(tmp / "site", docs_dir=docs, stand_ins=stand_ins,
                            env={"SMALLEM_RECORDS": str(rec)})


def pytest_report_header(config):
    return (f"smallem: CPU ISA levels runnable here: {', '.join(l for l in isa.LEVELS if isa.supported(l))}; "
            f"SMALLEM_ISA={os.environ.get('SMALLEM_ISA', '(unset)')}")


@pytest.fixture(params=captured.NAMES)
def captured_machine(request, monkeypatch):
    """Each machine of tests/machines/ in turn, injected (tests/captured.py): the library sees
    its caches, identity, cores and GEMM feeds, so a machine-dependent decision is tested as
    that machine would make it."""
    return captured.inject(captured.load(request.param), monkeypatch)


def pytest_collection_finish(session):
    """The sanitizer run (tests/test_sanitize.py) starts as soon as it is known to be wanted:
    a child process of about two minutes on one core, beside the rest of the session."""
    for item in session.items:
        if "sanitized_run" in getattr(item, "fixturenames", ()) and hasattr(item.module, "start"):
            item.module.start()
            break


def pytest_sessionfinish(session):
    """A session that ends early (-x, Ctrl-C) leaves no sanitizer run behind."""
    import sys
    mod = sys.modules.get("test_sanitize")
    if mod is not None and "run" in getattr(mod, "RUN", {}):
        mod.RUN["run"].stop()
