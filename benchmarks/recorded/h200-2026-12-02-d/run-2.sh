#!/usr/bin/env bash
# Second device call (a fresh machine: the wheels of run-1 less rmm, with
# cryptography for TLS; bokeh does not fit beside them, so the dashboard tests go to run-3): `pytest -m gpu` over every other package, and the CUDA
# every-pair compile test of tests/fusion/test_edges.py that run-1's time cut.
#   bash benchmarks/recorded/h200-2026-12-02-d/run-2.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout ${T2:-555} python3 -m pytest -m gpu -n 14 -v -p no:benchmark -p no:cacheprovider -o console_output_style=classic \
  --durations=25 tests/fusion/test_edges.py::test_cuda_kernels_compile_and_match_numpy_for_every_pair --deselect tests/runtime/test_gpu_session.py::test_rmm_pool_session \
  tests/transfer tests/memory tests/io tests/arrays tests/pipeline tests/runtime tests/faults \
  tests/benchmarks tests/deploy tests/test_cli.py tests/test_config.py tests/test_layers.py tests/test_notebooks.py \
  tests/test_query_planning.py tests/test_registry.py > "$out/gpu-2.log" 2>&1; echo "EXIT $?" >> "$out/gpu-2.log"
grep -E " PASSED| FAILED| ERROR| SKIPPED" "$out/gpu-2.log" | awk '{print $2}' | sort | uniq -c
grep -E "FAILED|ERROR" "$out/gpu-2.log" | head -30
tail -5 "$out/gpu-2.log"
