#!/usr/bin/env bash
# Fifth call, on the warm machine of run-3/4: the out-of-core test with the fused reference, and the
# standing-cluster GPU test again, its failure now quoting cluster.log.
#   bash benchmarks/recorded/h200-2026-12-02-d/run-5.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
[ -d /tmp/site/dask ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout ${T5:-250} python3 -m pytest -m gpu -n 2 -v -p no:benchmark -p no:cacheprovider -o console_output_style=classic \
  "tests/faults/test_standing.py::test_start_status_run_stop_leaves_no_process[gpu]" \
  tests/benchmarks/test_multi_gpu.py::test_out_of_core_on_the_gpus > "$out/gpu-5.log" 2>&1; echo "EXIT $?" >> "$out/gpu-5.log"
grep -E "PASSED|FAILED|ERROR" "$out/gpu-5.log" | head; grep -E "^E " "$out/gpu-5.log" | head -40; tail -2 "$out/gpu-5.log"
