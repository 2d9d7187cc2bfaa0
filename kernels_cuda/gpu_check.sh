#!/usr/bin/env bash
# The whole GPU check in one command, for a machine with a CUDA GPU (e.g. a lent H200):
#   kernels_cuda/gpu_check.sh OUTDIR [--quick]
# 1. makes CuPy importable: as it is, else from wheels carried in .whl/ (no network needed),
#    else `pip install .[gpu]`;
# 2. runs tests/test_cuda.py (correctness of every kernel on awkward shapes, validation);
# 3. runs `python -m smallem gpu-check --out OUTDIR`: chapters 1 and 2 measured, records
#    ch1.gpu.json and ch2.gpu.json plus gpu_tables.md written to OUTDIR.
# 4. if this host's CPU has AVX512_BF16 (the book's own machine may not): the GEMM tests at
#    the avx512 level on real hardware, then `smallem gemm-bf16` (record ch2.bf16.json).
# Logs go to OUTDIR too. Budget: about 1 minute of tests, 3 to 4 of measurements, 1 to 2 for 4.
# Copy the records into figures/records/ and run `smallem figures` to update the book.
set -uo pipefail
OUT=${1:?usage: kernels_cuda/gpu_check.sh OUTDIR [--quick]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c "import cupy" 2>/dev/null; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        echo "gpu_check: installing the wheels carried in .whl/"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/smallem-site .whl/*.whl || exit 1
        export PYTHONPATH="$PYTHONPATH:/tmp/smallem-site"
    else
        echo "gpu_check: CuPy missing, installing the gpu extra"
        "$PY" -m pip install -q ".[gpu]" || exit 1
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
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem \
    --format=csv > "$OUT/nvidia-smi.csv" 2>&1

status=0
timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/pytest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: tests FAILED (measuring anyway)"; status=1; }
timeout 330 "$PY" -m smallem gpu-check --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu-check.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: measurements FAILED"; status=1; }
if ! grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null; then
    echo "gpu_check: this host's CPU has no AVX512_BF16: no bf16 check"
elif ! "$PY" -c "import cffi" 2>/dev/null || ! command -v "${CC:-cc}" >/dev/null; then
    echo "gpu_check: this host's CPU has AVX512_BF16, but no cffi or C compiler: no bf16 check"
else
    echo "gpu_check: this host's CPU has AVX512_BF16: AVX-512 GEMM tests, then the bf16 check"
    timeout 180 "$PY" -m pytest -q -p no:cacheprovider tests/test_gemm.py -k "avx512 and not simde" \
        2>&1 | tee "$OUT/pytest-avx512.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: AVX-512 GEMM tests FAILED"; status=1; }
    SMALLEM_RECORDS="$OUT" timeout 150 "$PY" -m smallem gemm-bf16 2>&1 | tee "$OUT/gemm-bf16.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu_check: bf16 check FAILED"; status=1; }
fi
ls -l "$OUT"
exit $status
