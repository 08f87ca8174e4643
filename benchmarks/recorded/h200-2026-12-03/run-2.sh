#!/usr/bin/env bash
# Second device call, on the machine run-1 left warm (its /tmp/site kept): h5py, rmm and librmm from
# .whl2/ added; `pytest -m gpu` over every other package (the rmm pool test too), then the suite's
# columns and the YAML-cost probe.   bash benchmarks/recorded/h200-2026-12-03/run-2.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
if ! python3 -c "import sys; sys.path.insert(0, '/tmp/site'); import dask_cuda" 2>/dev/null; then  # a fresh machine
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl2/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout ${T2:-300} python3 -m pytest -m gpu -n 14 -v -p no:cacheprovider -o console_output_style=classic \
  --durations=15 tests/transfer tests/memory tests/io tests/arrays tests/pipeline tests/runtime tests/faults \
  tests/benchmarks tests/deploy tests/diagnostics tests/test_cli.py tests/test_config.py tests/test_layers.py \
  tests/test_notebooks.py tests/test_query_planning.py tests/test_registry.py > "$out/gpu-2.log" 2>&1
echo "EXIT $?" >> "$out/gpu-2.log"
timeout 170 python3 -m benchmarks.suite.run --only chain_sum --only transpose_sum --repeats 5 > "$out/suite.log" 2>&1
echo "EXIT $?" >> "$out/suite.log"
timeout 90 python3 -m benchmarks.probes.yaml_cost --repeats 15 > "$out/yaml_cost.log" 2>&1; echo "EXIT $?" >> "$out/yaml_cost.log"
grep -E " PASSED| FAILED| ERROR| SKIPPED" "$out/gpu-2.log" | awk '{print $2}' | sort | uniq -c
grep -E "FAILED|ERROR" "$out/gpu-2.log" | head -30
tail -4 "$out/gpu-2.log"; tail -22 "$out/suite.log"; tail -40 "$out/yaml_cost.log"
