#!/usr/bin/env bash
# Fourth call, on run-3's warm machine (its /tmp/site, plus cryptography carried alone): the three tests
# run-3 failed, one at a time: two ran out of device memory beside 13 other workers, the standing cluster's
# TLS needs cryptography.   bash benchmarks/recorded/h200-2026-12-02-d/run-4.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
[ -d /tmp/site/dask ] || { echo "cold machine: run-3's /tmp/site is gone"; exit 3; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -m gpu -v -p no:benchmark -p no:cacheprovider -o console_output_style=classic \
  "tests/faults/test_standing.py::test_start_status_run_stop_leaves_no_process[gpu]" \
  "tests/io/test_zarr_gpu.py::test_device_writes_are_read_back_by_zarr_on_the_cpu" \
  tests/benchmarks/test_multi_gpu.py::test_out_of_core_on_the_gpus > "$out/gpu-4.log" 2>&1; echo "EXIT $?" >> "$out/gpu-4.log"
grep -E "PASSED|FAILED|ERROR" "$out/gpu-4.log" | head -20; tail -3 "$out/gpu-4.log"
