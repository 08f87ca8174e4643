#!/usr/bin/env bash
# Session 14, last device call (one H200): `pytest -m gpu` over every package but ops, kernels and fusion
# (unchanged since run-1/run-2), after the new-user fixes (HDF5/TIFF indexing, the npy reader opened on first
# read, no HTTP server with the dashboard off, convert's interrupt, lz4 warnings).
#   bash benchmarks/recorded/h200-2026-12-04-s14/run-3.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout ${T1:-330} python3 -m pytest -m gpu -n 15 -v -p no:cacheprovider -o console_output_style=classic --durations=10 \
  --ignore tests/ops --ignore tests/kernels --ignore tests/fusion \
  --deselect tests/runtime/test_gpu_session.py::test_rmm_pool_session tests > "$out/gpu-4.log" 2>&1
echo "EXIT $?" >> "$out/gpu-4.log"
grep -E " PASSED| FAILED| ERROR| SKIPPED" "$out/gpu-4.log" | awk '{print $2}' | sort | uniq -c
grep -E "^(FAILED|ERROR)|\] (FAILED|ERROR)" "$out/gpu-4.log" | head -20; tail -3 "$out/gpu-4.log"
