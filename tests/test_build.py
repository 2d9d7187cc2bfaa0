"""The foundation: building kernels at every ISA level, choosing the level, rebuilding on edit,
failing loudly; the argument checks and the measurement records."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from smallem import checks
from smallem.plumbing import build
from smallem.cpu import isa
from smallem.book import records

KERNELS = build.kernel_names()
UNRUNNABLE = [l for l in isa.LEVELS if not isa.supported(l)]


# ------------------------------------------------------------------ building

@pytest.mark.parametrize("level", isa.LEVELS)
@pytest.mark.parametrize("name", KERNELS)
def test_every_kernel_compiles_at_every_level(name, level):
    # A level this CPU cannot run is still compiled, with all of its extensions, so that
    # AVX-512 code is checked by the compiler on any x86 machine.
    if level != "generic" and not isa.is_x86():
        pytest.skip(f"{level} is x86 only")
    exts = isa.OPTIONAL.get(level, ()) if not isa.supported(level) else isa.extensions(level)
    path = build.compile_module(name, level, tuple(exts))
    assert path.is_file() and f"_{name}_{level}_" in path.name


@pytest.mark.parametrize("name", KERNELS)
def test_every_kernel_compiles_for_emulated_avx512(name, monkeypatch):
    # The avx512-simde runs only happen on a CPU without AVX-512. Elsewhere the SIMDe build is
    # still compiled, so an intrinsic that SIMDe lacks and emulate.h does not define fails
    # here, not on the next AVX2-only machine (as _mm512_shuffle_f32x4 once would have).
    if isa.emulation_unavailable():
        pytest.skip(f"AVX-512 through SIMDe: {isa.emulation_unavailable()}")
    monkeypatch.setattr(isa, "emulating", lambda level="avx512": level == "avx512")
    exts = isa.OPTIONAL["avx512"]
    assert "-DSM_EMULATE_AVX512" in isa.compile_flags("avx512", exts)
    path = build.compile_module(name, "avx512", exts)  # compiled, never loaded here
    assert path.is_file()


def test_build_all_levels_from_the_command_line():
    r = subprocess.run([sys.executable, "-m", "smallem", "build", "--isa", "all"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    for level in isa.LEVELS:
        assert level in r.stdout


@pytest.mark.skipif(not UNRUNNABLE, reason="this CPU runs every ISA level")
def test_unsupported_level_raises_instead_of_crashing(monkeypatch):
    level = UNRUNNABLE[0]
    with pytest.raises(isa.ISAError, match=level):
        build.load("stream", level=level)
    monkeypatch.setenv("SMALLEM_ISA", level)
    with pytest.raises(isa.ISAError, match="cannot run on this CPU"):
        build.load("stream")


def test_bogus_isa_raises(monkeypatch):
    monkeypatch.setenv("SMALLEM_ISA", "sse9")
    with pytest.raises(isa.ISAError, match="sse9"):
        isa.selected()
    with pytest.raises(isa.ISAError):
        build.load("stream")


def test_emulated_avx512_builds_the_avx512_code(monkeypatch):
    # The `level` fixture's avx512-simde parameter is only worth something if the module it
    # loads is the AVX-512 code: its 14 x 32 micro-kernel and its vdpbf16ps path.
    if isa.supported("avx512", isa.cpu_flags()):
        pytest.skip("this CPU runs AVX-512 itself; emulation is off here by design")
    if isa.emulation_unavailable():
        pytest.skip(f"AVX-512 through SIMDe: {isa.emulation_unavailable()}")
    from smallem.product import gemm

    monkeypatch.setenv(isa.EMULATE_ENV, "avx512")
    monkeypatch.setenv("SMALLEM_ISA", "avx512")
    assert isa.selected() == "avx512" and isa.describe()["emulated"]
    assert "-DSM_EMULATE_AVX512" in isa.compile_flags("avx512", isa.extensions("avx512"))
    assert gemm.kernel_shape("avx512") == (14, 32)
    assert gemm.native_bf16("avx512")
    monkeypatch.delenv(isa.EMULATE_ENV)  # and without it, the CPU's own answer again
    with pytest.raises(isa.ISAError, match="cannot run on this CPU"):
        isa.selected()


def test_emulation_never_applies_by_itself_or_to_measurements(monkeypatch, tmp_path):
    monkeypatch.setenv(isa.EMULATE_ENV, "avx512")
    isa.best.cache_clear()
    try:
        assert isa.best() == next(l for l in isa.LEVELS if isa.supported(l, isa.cpu_flags()))
    finally:
        isa.best.cache_clear()
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset(isa.REQUIRED["avx512"]))
    assert not isa.emulating()  # a CPU with AVX-512 runs the real thing
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset(isa.REQUIRED["avx2"]))
    monkeypatch.setattr(isa, "emulation_unavailable", lambda: None)
    assert isa.emulating() and not isa.emulating("avx2")
    with pytest.raises(records.RecordError, match="SIMDe"):
        records.Record("anything")
    monkeypatch.setenv(isa.EMULATE_ENV, "avx2")
    with pytest.raises(isa.ISAError, match="only level that can be emulated is avx512"):
        isa.emulating()


def test_emulation_without_simde_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(isa, "cpu_flags", lambda: frozenset(isa.REQUIRED["avx2"]))
    monkeypatch.setattr(isa, "emulation_unavailable", lambda: "the C compiler finds no SIMDe headers")
    monkeypatch.setenv(isa.EMULATE_ENV, "avx512")
    with pytest.raises(isa.ISAError, match="SIMDe headers"):
        isa.supported("avx512")


def test_forced_isa_is_the_one_built(monkeypatch):
    monkeypatch.setenv("SMALLEM_ISA", "generic")
    assert isa.selected() == "generic"
    built = []
    real = build.compile_module
    monkeypatch.setattr(build, "compile_module",
                        lambda name, level, exts=None: built.append(level) or real(name, level, exts))
    build._load.cache_clear()
    build.load("stream")
    assert built == ["generic"]


def _scratch_kernels(tmp_path, monkeypatch):
    """A private copy of kernels_c/ and an empty cache, so edits touch nothing shared."""
    kdir = tmp_path / "kernels_c"
    shutil.copytree(build.KERNELS_DIR, kdir)
    monkeypatch.setattr(build, "KERNELS_DIR", kdir)
    monkeypatch.setenv("SMALLEM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "RECHECK_SECONDS", 0.0)  # edits below follow each other at once
    return kdir


def _write_kernel(kdir, name, body, proto="int answer(void);"):
    (kdir / f"{name}.h").write_text(proto + "\n")
    (kdir / f"{name}.c").write_text(f'#include "common.h"\n#include "{name}.h"\n{body}\n')


def test_editing_a_kernel_rebuilds_it(tmp_path, monkeypatch):
    kdir = _scratch_kernels(tmp_path, monkeypatch)
    _write_kernel(kdir, "edit_me", "int answer(void) { return 1; }")
    _, lib = build.load("edit_me", "generic")
    assert lib.answer() == 1
    _write_kernel(kdir, "edit_me", "int answer(void) { return 42; }")
    _, lib = build.load("edit_me", "generic")
    assert lib.answer() == 42
    assert len(list((tmp_path / "cache").glob("_smallem_edit_me_generic_*"))) == 2


def test_editing_a_shared_header_rebuilds(tmp_path, monkeypatch):
    kdir = _scratch_kernels(tmp_path, monkeypatch)
    _write_kernel(kdir, "uses_header", "int answer(void) { return SM_TEST_VALUE; }")
    common = kdir / "common.h"
    common.write_text(common.read_text() + "\n#define SM_TEST_VALUE 7\n")
    assert build.load("uses_header", "generic")[1].answer() == 7
    common.write_text(common.read_text().replace("SM_TEST_VALUE 7", "SM_TEST_VALUE 8"))
    assert build.load("uses_header", "generic")[1].answer() == 8


def test_editing_a_file_the_kernel_includes_rebuilds(tmp_path, monkeypatch):
    # A module of several files (kernels_c/<name>.c including kernels_c/<name>/*.c, as gemm
    # does): each of them is in the cache key and in the stamp that says when to look again.
    kdir = _scratch_kernels(tmp_path, monkeypatch)
    (kdir / "parts").mkdir()
    part = kdir / "parts" / "value.c"
    part.write_text("static int value(void) { return 5; }\n")
    _write_kernel(kdir, "parts", '#include "parts/value.c"\nint answer(void) { return value(); }')
    assert build.load("parts", "generic")[1].answer() == 5
    part.write_text("static int value(void) { return 6; }\n")
    assert build.load("parts", "generic")[1].answer() == 6
    (kdir / "parts" / "more.h").write_text("#define MORE 10\n")  # a new file is found too
    part.write_text('#include "more.h"\nstatic int value(void) { return MORE; }\n')
    assert build.load("parts", "generic")[1].answer() == 10
    (kdir / "parts" / "more.h").write_text("#define MORE 11\n")  # and then watched
    assert build.load("parts", "generic")[1].answer() == 11
    assert "parts" in build.kernel_names() and "value" not in build.kernel_names()


_BUILD_GEMM = ("import sys; from smallem.plumbing import build; "
               "print(build.compile_module('gemm', 'generic'), flush=True)")


def _interrupt_a_build(cache, sig):
    """Start a child that builds the gemm kernel into ``cache``, and send ``sig`` to its whole
    process group (as Ctrl-C does) while the compiler runs. Returns the child's status.

    The child's compiler ($CC) is a wrapper that, when called on a file in the build's own
    folder, marks that it has started and waits a minute before running the real compiler:
    the signal lands inside the compile however fast this machine's compiler is."""
    import os
    import signal
    import time

    started = cache.parent / "compiler-started"
    slow_cc = cache.parent / "slow-cc"
    slow_cc.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do case "$a" in *{build.BUILDING}*) : > "{started}"; sleep 60; break;; '
        "esac; done\n"
        f'exec "{build.compiler()}" "$@"\n')
    slow_cc.chmod(0o755)
    env = dict(os.environ, SMALLEM_CACHE=str(cache), CC=str(slow_cc))
    env.pop("SMALLEM_SANITIZE", None)
    # a shell's background job inherits SIGINT ignored, and Python then never turns Ctrl-C
    # into KeyboardInterrupt: the child gets the default disposition back, as a terminal's has
    p = subprocess.Popen([sys.executable, "-c", _BUILD_GEMM], env=env, start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    try:
        while not started.exists():
            assert p.poll() is None, f"the build ended before it could be interrupted: {p.communicate()}"
            assert time.monotonic() < deadline, "the build never started"
            time.sleep(0.01)
        assert any(cache.glob(f"{build.BUILDING}*/*.c")), "the compiler ran before the wrapper C file"
        os.killpg(p.pid, sig)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    return p.returncode, err


def test_ctrl_c_in_a_kernel_build_leaves_no_broken_cache_entry(tmp_path):
    import signal

    cache = tmp_path / "cache"
    cache.mkdir()
    rc, err = _interrupt_a_build(cache, signal.SIGINT)
    assert rc != 0 and "KeyboardInterrupt" in err, err[-2000:]
    assert list(cache.iterdir()) == [], "an interrupted build left files in the cache"
    # run again: the kernel builds, loads and multiplies
    out = subprocess.run([sys.executable, "-c", _BUILD_GEMM + "; from smallem.product import gemm; "
                          "import numpy as np; a = np.ones((3, 5), np.float32); "
                          "assert (gemm.matmul(a, a, trans_b=True, level='generic') == 5).all()"],
                         env={**__import__("os").environ, "SMALLEM_CACHE": str(cache)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]


def test_a_build_killed_outright_is_swept_and_rebuilt(tmp_path, monkeypatch):
    import os
    import signal

    cache = tmp_path / "cache"
    cache.mkdir()
    rc, _ = _interrupt_a_build(cache, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    left = list(cache.iterdir())
    assert left and all(p.name.startswith(build.BUILDING) for p in left), left  # no module
    old = __import__("time").time() - build.STALE_SECONDS - 10
    for p in left:
        os.utime(p, (old, old))
    monkeypatch.setenv("SMALLEM_CACHE", str(cache))
    path = build.compile_module("stream", "generic")
    assert path.is_file() and not any(p.exists() for p in left)  # the stale folder is gone


def test_gemm_key_covers_every_file_of_the_module():
    files = {p.relative_to(build.KERNELS_DIR).as_posix() for p in build._sources("gemm")[1]}
    parts = {p.relative_to(build.KERNELS_DIR).as_posix()
             for p in (build.KERNELS_DIR / "gemm").glob("*.c")}
    assert {"gemm/driver.c", "gemm/bf16.c", "gemm/instruments.c"} <= parts <= files
    text = (build.KERNELS_DIR / "gemm.c").read_text()
    for name in sorted(parts):  # and every one of them is part of the module
        assert f'#include "{name}"' in text


def test_compile_error_names_the_file_and_quotes_the_compiler(tmp_path, monkeypatch):
    kdir = _scratch_kernels(tmp_path, monkeypatch)
    _write_kernel(kdir, "broken", "int answer(void) { return no_such_variable; }")
    with pytest.raises(build.BuildError) as e:
        build.load("broken", "generic")
    msg = str(e.value)
    assert str(kdir / "broken.c") in msg
    assert "no_such_variable" in msg and "error" in msg


def test_header_that_does_not_match_the_source_fails(tmp_path, monkeypatch):
    # cffi compiles its wrapper against the header: a wrong prototype is an error, not a crash
    kdir = _scratch_kernels(tmp_path, monkeypatch)
    (kdir / "mismatch.h").write_text("int answer(void);\n")
    (kdir / "mismatch.c").write_text('#include "common.h"\nfloat answer(int x) { return x; }\n')
    with pytest.raises(build.BuildError, match="mismatch.c"):
        build.load("mismatch", "generic")


def test_missing_kernel_and_missing_header(tmp_path, monkeypatch):
    kdir = _scratch_kernels(tmp_path, monkeypatch)
    with pytest.raises(build.BuildError, match="does not exist"):
        build.load("nothing_here", "generic")
    (kdir / "headless.c").write_text("int answer(void) { return 1; }\n")
    with pytest.raises(build.BuildError, match="no header"):
        build.load("headless", "generic")


def test_missing_compiler_is_a_clear_error(tmp_path, monkeypatch):
    kdir = _scratch_kernels(tmp_path, monkeypatch)
    _write_kernel(kdir, "needs_cc", "int answer(void) { return 3; }")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("PATH", "")
    with pytest.raises(build.BuildError, match="no C compiler found"):
        build.load("needs_cc", "generic")


# ------------------------------------------------------------------ checks

def test_tuning_flags_keep_what_the_compiler_accepts(monkeypatch, tmp_path):
    cc = build.compiler()
    src = tmp_path / "t.c"
    src.write_text("int f(void) { return 0; }\n")
    accepted = subprocess.run([cc, "-Werror", "-falign-loops=64", "-c", str(src), "-o",
                               str(tmp_path / "t.o")], capture_output=True).returncode == 0
    # the flag the GEMM's speed rests on: kept wherever the compiler takes it
    assert ("-falign-loops=64" in build.tuning_flags(cc)) == accepted
    monkeypatch.setattr(build, "TUNING_FLAGS", ["-falign-loops=64", "-fno-such-flag-smallem"])
    build.tuning_flags.cache_clear()
    try:
        flags = build.tuning_flags(cc)
    finally:
        build.tuning_flags.cache_clear()
    assert "-fno-such-flag-smallem" not in flags  # an unknown flag is dropped, not fatal


def test_compiled_kernels_carry_the_tuning_flags():
    _, cflags, _ = build._key("gemm", isa.selected(), isa.extensions(isa.selected()),
                              build.compiler())
    assert set(build.tuning_flags(build.compiler())) <= set(cflags)


def test_array_accepts_a_good_array():
    x = np.zeros((3, 4), np.float32)
    assert checks.array(x, "x", np.float32, ndim=2, shape=(3, None), writable=True) is x


@pytest.mark.parametrize("bad, kwargs, error, words", [
    (np.zeros((3, 4)), {}, TypeError, ["x", "float32", "float64"]),
    ([1.0, 2.0], {}, TypeError, ["x", "ndarray", "list"]),
    (np.zeros(12, np.float32), {"ndim": 2}, ValueError, ["x", "2 dimensions"]),
    (np.zeros((3, 5), np.float32), {"shape": (3, 4)}, ValueError, ["x", "(3, 4)", "(3, 5)"]),
    (np.zeros((4, 6), np.float32)[:, ::2], {}, ValueError, ["x", "C-contiguous"]),
    (np.zeros((4, 6), np.float32).T, {}, ValueError, ["x", "C-contiguous"]),
])
def test_array_rejects_loudly(bad, kwargs, error, words):
    with pytest.raises(error) as e:
        checks.array(bad, "x", np.float32, **kwargs)
    for w in words:
        assert w in str(e.value)


def test_array_rejects_read_only_output():
    x = np.zeros(4, np.float32)
    x.flags.writeable = False
    checks.array(x, "out", np.float32)  # reading is fine
    with pytest.raises(ValueError, match="out.*read-only"):
        checks.array(x, "out", np.float32, writable=True)


def test_positive_int():
    assert checks.positive_int(np.int64(5), "n") == 5
    for bad, error in [(0, ValueError), (-3, ValueError), (2**31, ValueError),
                       (2.0, TypeError), (True, TypeError), ("4", TypeError)]:
        with pytest.raises(error, match="n"):
            checks.positive_int(bad, "n")


def test_assert_close_passes_and_fails_loudly():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    checks.assert_close(x, x.copy())
    y = x.copy()
    y[3, 2] += 0.5
    with pytest.raises(AssertionError) as e:
        checks.assert_close(y, x, name="C")
    msg = str(e.value)
    assert "C:" in msg and "(3, 2)" in msg and "1 of 35" in msg
    with pytest.raises(AssertionError, match="shape"):
        checks.assert_close(x[:4], x)
    z = x.copy()
    z[0, 0] = np.nan
    with pytest.raises(AssertionError, match="non-finite"):
        checks.assert_close(z, x)


def test_assert_close_tolerance_scales_with_k_and_dtype():
    e = np.ones(100, np.float32)
    a = e * np.float32(1 + 2e-6)        # ~17 float32 ulps off
    with pytest.raises(AssertionError):
        checks.assert_close(a, e, k=1)   # a single product: too far
    checks.assert_close(a, e, k=4096)    # a length-4096 sum may drift that much
    with pytest.raises(AssertionError):
        checks.assert_close(a.astype(np.float64), e.astype(np.float64), k=4096)


# ------------------------------------------------------------------ records

def _record(tmp_path):
    rec = records.Record("test.roundtrip", settings={"threads": [1, 2]},
                         machine={"cpu": "test cpu", "cores": 2})
    rec.add("triad", "GB/s", {"median": 10.0, "min": 9.0, "max": 11.0, "n": 5},
            seconds={"median": 0.1, "min": 0.09, "max": 0.11, "n": 5}, size=1024, threads=1)
    rec.add("triad", "GB/s", {"median": 19.0, "min": 18.0, "max": 20.0, "n": 5},
            size=1024, threads=2)
    return rec


def test_record_round_trip(tmp_path):
    rec = _record(tmp_path)
    path = rec.save(tmp_path)
    assert path == tmp_path / "test.roundtrip.json"
    data = records.load("test.roundtrip", tmp_path)
    assert data == json.loads(json.dumps(rec.data))
    assert data["schema"] == records.SCHEMA and data["commit"] and data["date"]
    assert records.value(data, "triad", threads=2) == 19.0
    assert records.value(data, "triad", "min", threads=1) == 9.0
    assert len(records.results(data, "triad")) == 2
    with pytest.raises(records.RecordError, match="2 results"):
        records.value(data, "triad")


def test_records_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("SMALLEM_RECORDS", str(tmp_path / "elsewhere"))
    path = _record(tmp_path).save()
    assert path.parent == tmp_path / "elsewhere"
    assert records.exists("test.roundtrip")


def test_bad_records_raise_record_error(tmp_path):
    with pytest.raises(records.RecordError, match="no record"):
        records.load("absent", tmp_path)
    (tmp_path / "corrupt.json").write_text('{"schema": "smallem.record/1", "results": [')
    with pytest.raises(records.RecordError, match="not valid JSON"):
        records.load("corrupt", tmp_path)
    (tmp_path / "foreign.json").write_text('{"some": "other file"}')
    with pytest.raises(records.RecordError, match="not a smallem.record"):
        records.load("foreign", tmp_path)


def test_record_result_needs_statistics():
    rec = records.Record("test.bad", machine={})
    with pytest.raises(ValueError, match="median"):
        rec.add("x", "s", {"mean": 1.0})
