"""The kernels under AddressSanitizer and UBSan, in `make test`.

One child pytest, started in the background as soon as the session's tests are collected
(conftest.py), so that it runs beside the rest on the second core, runs the kernel tests (``SUBSET``: every rung, op and ISA path this CPU
runs, the awkward shapes and the property tests) against kernels built with
``SMALLEM_SANITIZE=address,undefined`` (their own cache entries, at -O1), with the
sanitizers' runtime preloaded into Python. Any out-of-bounds access or undefined behaviour
aborts it with the sanitizer's report, which this test quotes. tests/sanitize_plugin.py
records which C functions were entered; every function a kernel header declares must be,
at every level, except the few listed in ``REACHED_FROM_C`` with the reason.

Where the compiler has no sanitizer runtime (clang without it, macOS), this skips, visibly.
A write out of bounds in a numpy buffer is caught (ASan's red zones surround every malloc);
one inside a buffer the kernels carve themselves (the model's arena, the GEMM's packing
space) is not: that is what the bounds in the kernels' own tests are for.
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from smallem.plumbing import build
from smallem.cpu import isa

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

SUBSET = ["tests/test_gemm.py", "tests/test_model.py", "tests/test_decode.py",
          "tests/test_pool.py", "tests/test_machine.py", "tests/test_properties.py",
          "tests/test_gguf_kernels.py", "tests/test_scan.py", "tests/test_forward_ids.py"]
# What the subset leaves out: the tests that time a kernel (a sanitized kernel's speed means
# nothing), PyTorch, the browser, the GPU, and the book's quick runs (they measure; the
# kernels they call are the ones the rest enters, as the second test below checks).
MARKS = "not slow and not torch and not browser and not gpu and not no_emulation"
# and, on a CPU without AVX-512, its SIMDe emulation (not a path the CPU runs; the emulation
# is checked by the main run)
LEAVE_OUT = ["test_quick_run_makes_table_and_figures", "test_bf16_check_for_a_second_machine",
             "simde"]
TIMEOUT = 900  # seconds; under a minute on two Zen 4 cores, with the kernels built

# Declared in pool.h, entered only from C: the `_pool` variants call them through the table
# pool_api() returns (kernels_c/pool_shim.h), so they run whenever a `_pool` module does.
REACHED_FROM_C = {"pool": {"pool_parallel", "pool_barrier", "pool_thread_num",
                           "pool_num_threads", "pool_single_start", "pool_loop_start",
                           "pool_loop_next", "pool_loop_end"}}
# pool.c has no ISA-dependent code, and a process loads it once, at the selected level
ONE_LEVEL = {"pool"}


def runtime() -> list[str] | str:
    """The sanitizer runtime libraries to preload, or why there are none."""
    cc = build.compiler()
    found = []
    for lib in ("libasan.so", "libubsan.so"):
        r = subprocess.run([cc, f"-print-file-name={lib}"], capture_output=True, text=True)
        path = r.stdout.strip()
        if r.returncode or not os.path.isabs(path) or not os.path.exists(path):
            return f"{cc} has no {lib} (GCC's sanitizer runtime; Debian: libasan8, libubsan1)"
        found.append(path)
    return found


PREBUILD = """
from concurrent.futures import ThreadPoolExecutor
from smallem.cpu import isa
from smallem.plumbing import build
levels = [lvl for lvl in isa.LEVELS if isa.supported(lvl)]
names = build.kernel_names() + [v + build.POOL_SUFFIX for v in build.POOL_VARIANTS]
with ThreadPoolExecutor(2) as ex:
    list(ex.map(lambda job: build.compile_module(*job), [(n, l) for l in levels for n in names]))
"""


def _prebuild(env_kinds: str) -> None:
    """Every kernel and pool variant at every runnable level, two at a time, before the
    child starts (the compiler must not run with the sanitizer runtime preloaded), in a
    process of its own: SMALLEM_SANITIZE set in this one would reach the builds of the tests
    running beside it."""
    r = subprocess.run([sys.executable, "-c", PREBUILD], cwd=ROOT, capture_output=True,
                       text=True, env=dict(os.environ, SMALLEM_SANITIZE=env_kinds),
                       timeout=TIMEOUT)
    if r.returncode:
        raise RuntimeError(f"the sanitized kernels did not build:\n{r.stderr[-4000:]}")


def _declared(name: str) -> set[str]:
    _, lib = build.load(name)
    return {n for n in dir(lib) if callable(getattr(lib, n))}


class Run:
    """The sanitizer run, started in the background by conftest.py as soon as the session's
    tests are collected (it is one child process on one core; the rest of the session uses the
    other), and waited for by the tests below. ``result``: (CompletedProcess, call log path,
    the sanitizers' reports) or, where there is no run, the reason as a string."""

    def __init__(self):
        self.result, self.child = None, None
        self.thread = threading.Thread(target=self._go, daemon=True)
        self.thread.start()

    def _go(self):
        try:
            self.result = self._run()
        except BaseException as e:  # noqa: BLE001 - said by the test that waits
            self.result = e

    def _run(self):
        libs = runtime()
        if isinstance(libs, str):
            return f"no sanitizer run: {libs}"
        kinds = "address,undefined"
        _prebuild(kinds)
        tmp = Path(tempfile.mkdtemp(prefix="smallem-sanitize-"))
        log = tmp / "calls.json"
        # the reports go to files: the child's pytest captures stderr, and a process the
        # sanitizer ends never hands its capture back
        reports = tmp / "report"
        env = dict(os.environ, SMALLEM_SANITIZE=kinds, LD_PRELOAD=" ".join(libs),
                   ASAN_OPTIONS=f"detect_leaks=0:abort_on_error=0:exitcode=99:log_path={reports}",
                   UBSAN_OPTIONS=f"print_stacktrace=1:halt_on_error=1:exitcode=98:log_path={reports}",
                   SMALLEM_CALL_LOG=str(log),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
        cmd = [sys.executable, "-m", "pytest", "-v", "-x", "-p", "sanitize_plugin",
               "-p", "no:cacheprovider", "-m", MARKS,
               "-k", " and ".join(f"not {t}" for t in LEAVE_OUT), *SUBSET]
        self.child = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
        try:
            out, err = self.child.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.child.kill()
            out, err = self.child.communicate()
            err += f"\n(stopped after {TIMEOUT} s)"
        r = subprocess.CompletedProcess(cmd, self.child.returncode, out, err)
        # one file per process that had something to say (a test's own child processes too)
        said = "\n".join(p.read_text(errors="replace") for p in sorted(tmp.glob("report.*")))
        return r, log, said

    def wait(self):
        self.thread.join()
        return self.result

    def stop(self):
        if self.child is not None and self.child.poll() is None:
            self.child.kill()


RUN: dict = {}


def start() -> None:
    """Begin the sanitizer run (once a session; not inside the sanitizer run itself)."""
    if "run" not in RUN and not os.environ.get("SMALLEM_SANITIZE"):
        RUN["run"] = Run()


@pytest.fixture(scope="module")
def sanitized_run():
    if os.environ.get("SMALLEM_SANITIZE"):
        pytest.skip("already running under the sanitizers")
    start()
    result = RUN["run"].wait()
    if isinstance(result, str):
        pytest.skip(result)
    if isinstance(result, BaseException):
        raise result
    return result


def test_kernel_tests_pass_under_asan_and_ubsan(sanitized_run):
    r, _, said = sanitized_run
    running = [line for line in r.stdout.splitlines() if "::" in line][-1:]
    assert r.returncode == 0 and not said, (
        f"the kernel tests under ASan/UBSan ended with status {r.returncode}, in "
        f"{running or 'no test'}:\n{said[:8000] or (r.stdout + r.stderr)[-4000:]}")


def test_every_kernel_function_is_entered_under_the_sanitizers(sanitized_run):
    r, log, _ = sanitized_run
    assert log.is_file(), f"the sanitizer run wrote no call log:\n{(r.stdout + r.stderr)[-3000:]}"
    entered = {tuple(e) for e in json.load(open(log))}
    levels = [lvl for lvl in isa.LEVELS if isa.supported(lvl)]
    missing = []
    for name in build.kernel_names():
        want = _declared(name) - REACHED_FROM_C.get(name, set())
        for lvl in ([isa.selected()] if name in ONE_LEVEL else levels):
            # the pool variant is the same source: a function entered there counts
            missing += [f"{name}[{lvl}].{fn}" for fn in sorted(want)
                        if (name, lvl, fn) not in entered
                        and (name + build.POOL_SUFFIX, lvl, fn) not in entered]
    for v in build.POOL_VARIANTS:  # the pool variants (and so pool_api's table) ran too
        for lvl in levels:
            if not any(e[:2] == (v + build.POOL_SUFFIX, lvl) for e in entered):
                missing.append(f"{v}{build.POOL_SUFFIX}[{lvl}]")
    assert not missing, f"not entered under the sanitizers: {missing}"


def test_a_write_past_the_end_is_caught(tmp_path):
    """The machinery itself: a kernel writing one float past a numpy array, built and loaded
    exactly as the real ones are, must die with ASan's report (not pass, not segfault)."""
    libs = runtime()
    if isinstance(libs, str):
        pytest.skip(f"no sanitizer run: {libs}")
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    for h in build.KERNELS_DIR.glob("*.h"):
        (kdir / h.name).write_text(h.read_text())
    (kdir / "overrun.h").write_text("void fill(float *x, int n);\n")
    (kdir / "overrun.c").write_text('#include "overrun.h"\n'
                                    "void fill(float *x, int n) { for (int i = 0; i <= n; i++) x[i] = 1; }\n")
    code = ("import numpy as np; from smallem.plumbing import build; ffi, lib = build.load('overrun'); "
            "x = np.zeros(1000, np.float32); lib.fill(ffi.from_buffer('float[]', x), x.size); "
            "print('not caught')")
    env = dict(os.environ, SMALLEM_SANITIZE="address,undefined", SMALLEM_KERNELS=str(kdir),
               SMALLEM_CACHE=str(tmp_path / "cache"), ASAN_OPTIONS="detect_leaks=0")
    subprocess.run([sys.executable, "-c", "from smallem.plumbing import build; build.compile_module('overrun', 'generic')"],
                   env=dict(env, SMALLEM_ISA="generic"), check=True, timeout=120)
    r = subprocess.run([sys.executable, "-c", code], env=dict(env, LD_PRELOAD=" ".join(libs),
                       SMALLEM_ISA="generic"), capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "heap-buffer-overflow" in r.stderr and "overrun.c" in r.stderr, \
        (r.returncode, r.stdout[-500:], r.stderr[-3000:])
