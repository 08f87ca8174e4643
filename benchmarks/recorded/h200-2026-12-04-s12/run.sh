#!/usr/bin/env bash
# The one device call of session 12 (one H200, 11 minutes of device time left for the issue): every
# `pytest -m gpu` test in one go (-v: each verdict is in the log even if the call is cut), then the
# YAML-cost probe, and the suite's chain_sum / transpose_sum columns in what is left of BUDGET seconds.
# Wheels: .whl/ as in ../h200-2026-12-03/run-1.sh; h5py is the image's. rmm and librmm stay behind (the
# carry holds 64 MiB with the tree), so the one test of a Session's rmm pool is deselected.
#   bash benchmarks/recorded/h200-2026-12-04-s12/run.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi -L; git log -1 --format=%h 2>/dev/null; python3 -c "import dask, distributed, dask_cuda, cupy, numpy, numba, zarr, xarray; print(*(f'{m.__name__} {m.__version__}' for m in (dask, distributed, dask_cuda, cupy, numpy, numba, zarr, xarray)), sep=', ')"; } > "$out/env.log" 2>&1
begun=$(date +%s)
timeout ${T1:-380} python3 -m pytest -m gpu -n 15 -v -p no:cacheprovider -o console_output_style=classic \
  --durations=20 --deselect tests/runtime/test_gpu_session.py::test_rmm_pool_session tests > "$out/gpu.log" 2>&1; echo "EXIT $?" >> "$out/gpu.log"
timeout 60 python3 -m benchmarks.probes.yaml_cost --repeats 15 > "$out/yaml_cost.log" 2>&1; echo "EXIT $?" >> "$out/yaml_cost.log"
left=$(( ${BUDGET:-470} - ($(date +%s) - begun) ))  # the suite only in what the call has left
if [ "$left" -ge 80 ]; then
  timeout "$left" python3 -m benchmarks.suite.run --only chain_sum --only transpose_sum --repeats 5 > "$out/suite.log" 2>&1
  echo "EXIT $?" >> "$out/suite.log"
else
  echo "not run: ${left}s left" > "$out/suite.log"
fi
grep -E " PASSED| FAILED| ERROR| SKIPPED" "$out/gpu.log" | awk '{print $2}' | sort | uniq -c
grep -E "^(FAILED|ERROR)|\] (FAILED|ERROR)" "$out/gpu.log" | head -30
tail -4 "$out/gpu.log"; tail -30 "$out/yaml_cost.log" | grep -E "YAML/Python|check"; tail -22 "$out/suite.log"
