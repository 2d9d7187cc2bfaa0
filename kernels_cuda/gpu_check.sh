#!/usr/bin/env bash
# The whole GPU check in one command, for a machine with a CUDA GPU (e.g. a lent H200):
#   kernels_cuda/gpu_check.sh OUTDIR [--quick]
# 1. installs the wheels carried in .whl/ if any (no network needed: e.g. cffi, which the
#    CPU kernels need, or CuPy); if CuPy is still missing, `pip install .[gpu]`;
# 2. runs tests/test_cuda.py (correctness of every kernel on awkward shapes, validation);
# 3. runs `python -m smallem gpu-check --out OUTDIR`: chapters 1 and 2 measured, records
#    ch1.gpu.json and ch2.gpu.json plus gpu_tables.md written to OUTDIR.
# 4. if this host's CPU has AVX512_BF16 (the book's own machine may not): the GEMM tests at
#    the avx512 level on real hardware, then `smallem gemm-bf16` (record ch2.bf16.json).
# Everything printed also goes to OUTDIR/gpu_check.log: five files at most come back.
# Budget: about 1 minute of tests, 2 to 3 of measurements, 1 to 2 for step 4; each step has
# its own time limit, 9 minutes in all.
# Records say which commit they measured. A copy of the tree whose .git is missing or stale
# names it with SMALLEM_COMMIT=<the commit it was copied from> (smallem.book.records.git_commit).
# Copy the records into figures/records/ and run `smallem figures` to update the book.
set -uo pipefail
OUT=${1:?usage: kernels_cuda/gpu_check.sh OUTDIR [--quick]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
cd "$ROOT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
date -u +"gpu_check: started %FT%TZ"

if ls .whl/*.whl >/dev/null 2>&1; then
    echo "gpu_check: installing the wheels carried in .whl/: $(cd .whl && ls *.whl | tr '\n' ' ')"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/smallem-site .whl/*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/smallem-site"
fi
if ! "$PY" -c "import cupy" 2>/dev/null; then
    echo "gpu_check: CuPy missing, installing the gpu extra"
    "$PY" -m pip install -q ".[gpu]" || exit 1
fi
# cffi's API mode compiles against Python.h; a Python without its headers can take a copy
# of the same minor version's carried in .whl/include/pythonX.Y.
if ! "$PY" -c "import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))"; then
    inc=$(ls -d "$ROOT"/.whl/include/python"$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" 2>/dev/null)
    if [ -n "$inc" ]; then
        echo "gpu_check: this Python has no Python.h: using $inc"
        export CPATH="$inc${CPATH:+:$CPATH}"
    else
        echo "gpu_check: this Python has no Python.h: the C kernels will not build"
    fi
fi
"$PY" -c "import pytest" 2>/dev/null || "$PY" -m pip install -q pytest
"$PY" - <<'EOF' || exit 1
from smallem import cuda
reason = cuda.why_unavailable()
if reason:
    raise SystemExit(f"gpu_check: no usable GPU: {reason}")
print("gpu_check:", cuda.device_info())
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
grep -m1 "model name" /proc/cpuinfo; echo "cores: $(nproc)"

status=0
timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py
[ $? -eq 0 ] || { echo "gpu_check: tests FAILED (measuring anyway)"; status=1; }
timeout 240 "$PY" -m smallem gpu-check --out "$OUT" "$@"
[ $? -eq 0 ] || { echo "gpu_check: measurements FAILED"; status=1; }
if ! grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null; then
    echo "gpu_check: this host's CPU has no AVX512_BF16: no bf16 check"
elif ! "$PY" -c "import cffi; from smallem import build; build.compiler()"; then
    echo "gpu_check: this host's CPU has AVX512_BF16, but no cffi or C compiler: no bf16 check"
else
    echo "gpu_check: this host's CPU has AVX512_BF16: AVX-512 GEMM tests, then the bf16 check"
    timeout 120 "$PY" -m pytest -q -p no:cacheprovider tests/test_gemm.py -k "avx512 and not simde"
    [ $? -eq 0 ] || { echo "gpu_check: AVX-512 GEMM tests FAILED"; status=1; }
    SMALLEM_RECORDS="$OUT" timeout 150 "$PY" -m smallem gemm-bf16
    [ $? -eq 0 ] || { echo "gpu_check: bf16 check FAILED"; status=1; }
fi
date -u +"gpu_check: ended %FT%TZ"
ls -l "$OUT"
exit $status
