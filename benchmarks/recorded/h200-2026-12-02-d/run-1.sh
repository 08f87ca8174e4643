#!/usr/bin/env bash
# First device call of the fifth session of 2026-12-02 (one H200): `pytest -m gpu` over the array-level
# packages (ops, kernels, fusion), -v so every verdict is in the log even if the call is cut.
# From the repository root, with ../shared/gpu/fetch-wheels.sh's wheels (less bokeh) plus the formats extra in .whl/:
#   bash benchmarks/recorded/h200-2026-12-02-d/run-1.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi -L; git log -1 --format=%H 2>/dev/null; python3 -c "import dask, distributed, dask_cuda, cupy, numpy, numba, zarr, xarray; print(*(f'{m.__name__} {m.__version__}' for m in (dask, distributed, dask_cuda, cupy, numpy, numba, zarr, xarray)), sep=', ')"; } > "$out/env.log" 2>&1
timeout ${T1:-560} python3 -m pytest -m gpu -n 14 -v -p no:benchmark -p no:cacheprovider -o console_output_style=classic \
  --durations=25 tests/ops tests/kernels tests/fusion > "$out/gpu-1.log" 2>&1; echo "EXIT $?" >> "$out/gpu-1.log"
grep -E " PASSED| FAILED| ERROR| SKIPPED" "$out/gpu-1.log" | awk '{print $2}' | sort | uniq -c
grep -E "FAILED|ERROR" "$out/gpu-1.log" | head -30
tail -5 "$out/gpu-1.log"
