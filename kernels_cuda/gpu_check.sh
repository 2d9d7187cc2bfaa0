#!/usr/bin/env bash
# The whole GPU check in one command, for a machine with a CUDA GPU (e.g. a lent H200):
#   kernels_cuda/gpu_check.sh OUTDIR [--quick]
# 1. installs the wheels carried in .whl/ if any (no network needed: e.g. cffi, which the
#    CPU kernels need, or CuPy); if CuPy is still missing, `pip install .[gpu]`;
# 2. runs the GPU tests (every kernel on awkward shapes against numpy, on the device);
# 3. runs `python -m smallem gpu-check --out OUTDIR --only chN` for chapters 1 to 4, each
#    under its own time limit, so one that fails or hangs costs only its own record:
#    ch1.gpu.json ... ch4.gpu.json, and gpu_tables.md from whichever exist;
# 4. if time is left and this host's CPU has AVX512_BF16: the GEMM tests at the avx512 level
#    on real hardware, then `smallem gemm-bf16` (record ch2.bf16.json, chapter 2 on the host).
# Everything printed also goes to OUTDIR/gpu_check.log: seven files at most come back.
# Budget: 9 minutes in all (BUDGET seconds); each step has its own limit and a step that
# cannot fit in what is left is skipped, with a line saying so.
# --quick: tiny sizes, no GPU tests, no host step: with PYTHONPATH=tests/fake_cupy it runs
# end to end on this machine without a GPU (tests/test_gpu_check.py does that).
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
from smallem.plumbing import cuda
reason = cuda.why_unavailable()
if reason:
    raise SystemExit(f"gpu_check: no usable GPU: {reason}")
print("gpu_check:", cuda.device_info())
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
grep -m1 "model name" /proc/cpuinfo; echo "cores: $(nproc)"

QUICK=0
for a in "$@"; do [ "$a" = "--quick" ] && QUICK=1; done
# --quick on the fake CuPy runs the kernels on the CPU emulator: slow, so 4 times the limits
SCALE=$(( QUICK ? 4 : 1 ))
BUDGET=${BUDGET:-$(( 540 * SCALE ))}
T0=$SECONDS
left() { echo $(( BUDGET - (SECONDS - T0) )); }
# run LIMIT NAME CMD...: CMD under min(LIMIT, time left), or skipped if under 20 s are left
step() {
    local limit=$(( $1 * SCALE )) name=$2; shift 2
    local l; l=$(left)
    [ "$l" -lt "$limit" ] && limit=$l
    if [ "$limit" -lt 20 ]; then echo "gpu_check: $name skipped: ${l} s of the budget left"; return 3; fi
    echo "gpu_check: $name (at most ${limit} s)"
    timeout "$limit" "$@"
    local rc=$?
    [ $rc -eq 124 ] && echo "gpu_check: $name stopped at its time limit"
    return $rc
}

status=0
if [ $QUICK -eq 0 ]; then
    step 120 "GPU tests" "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda.py \
        $(ls tests/test_cuda_train.py tests/test_cuda_decode.py 2>/dev/null)
    [ $? -eq 0 ] || { echo "gpu_check: tests FAILED (measuring anyway)"; status=1; }
fi
for ch in ch1:60 ch2:150 ch3:150 ch4:120; do
    step "${ch#*:}" "${ch%%:*} on the GPU" "$PY" -m smallem gpu-check --out "$OUT" --only "${ch%%:*}" "$@"
    [ $? -eq 0 ] || { echo "gpu_check: ${ch%%:*} FAILED"; status=1; }
done
if [ $QUICK -eq 1 ]; then
    echo "gpu_check: --quick: no host step"
elif ! grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null; then
    echo "gpu_check: this host's CPU has no AVX512_BF16: no bf16 check"
elif ! "$PY" -c "from smallem.plumbing import build; build.load('gemm')"; then
    echo "gpu_check: this host's CPU has AVX512_BF16, but no cffi or C compiler: no bf16 check"
else
    echo "gpu_check: this host's CPU has AVX512_BF16: AVX-512 GEMM tests, then the bf16 check"
    step 90 "AVX-512 GEMM tests" "$PY" -m pytest -q -p no:cacheprovider tests/test_gemm.py -k "avx512 and not simde"
    [ $? -eq 0 ] || { echo "gpu_check: AVX-512 GEMM tests FAILED or skipped"; status=1; }
    SMALLEM_RECORDS="$OUT" step 120 "bf16 check on the host" "$PY" -m smallem gemm-bf16
    [ $? -eq 0 ] || { echo "gpu_check: bf16 check FAILED or skipped"; status=1; }
fi
date -u +"gpu_check: ended %FT%TZ"
ls -l "$OUT"
exit $status
