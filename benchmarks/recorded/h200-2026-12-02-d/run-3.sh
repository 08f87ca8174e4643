#!/usr/bin/env bash
# Third device call, after the four simplification branches were merged: the suite's columns, then
# `pytest -m gpu` over what run-1/run-2 could not run (the dashboard needs bokeh, the rmm pool test
# rmm, the out-of-core bit-identity fix) and the GPU tests of the code the merges changed.
# Wheels: ../shared/gpu/fetch-wheels.sh's (nvtx and rmm left out for the 64 MiB carry: dask-cuda runs without nvtx; the rmm pool test is deselected) + the formats extra
# + dask-jobqueue, in .whl/.   bash benchmarks/recorded/h200-2026-12-02-d/run-3.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 170 python3 -m benchmarks.suite.run --only chain_sum --only transpose_sum --repeats 5 > "$out/suite.log" 2>&1; echo "EXIT $?" >> "$out/suite.log"
timeout ${T3:-350} python3 -m pytest -m gpu -n 14 -v -p no:benchmark -p no:cacheprovider -o console_output_style=classic \
  --durations=15 tests/diagnostics tests/faults/test_standing.py tests/runtime/test_gpu_session.py --deselect tests/runtime/test_gpu_session.py::test_rmm_pool_session \
  tests/benchmarks/test_multi_gpu.py::test_out_of_core_on_the_gpus tests/pipeline/test_gpu.py \
  tests/fusion/test_kernel.py tests/fusion/test_graph_reduce.py tests/fusion/test_dtype_rules.py tests/fusion/test_api.py \
  tests/fusion/test_device.py tests/fusion/test_tiled.py tests/kernels tests/io tests/ops/test_gpu.py \
  > "$out/gpu-3.log" 2>&1; echo "EXIT $?" >> "$out/gpu-3.log"
grep -E " PASSED| FAILED| ERROR| SKIPPED" "$out/gpu-3.log" | awk '{print $2}' | sort | uniq -c
grep -E "FAILED|ERROR" "$out/gpu-3.log" | head -30
tail -4 "$out/gpu-3.log"; tail -25 "$out/suite.log"
