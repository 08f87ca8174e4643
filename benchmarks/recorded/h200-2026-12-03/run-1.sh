#!/usr/bin/env bash
# First device call of 2026-12-03 (one H200): `pytest -m gpu` over the array-level packages (ops, kernels,
# fusion, with the 32 every-pair CUDA shards), -v so every verdict is in the log even if the call is cut;
# then the out-of-core rows of the flowgpu store.
# Wheels in .whl/: ../shared/gpu/fetch-wheels.sh's less rmm, librmm, nvtx and h5py (those go in run-2's
# .whl2/: the 64 MiB carry), plus filelock, jinja2, markupsafe, hypothesis, sortedcontainers, attrs,
# pytest-timeout, cryptography, cffi, pycparser, xarray, h5netcdf, tifffile, dask-jobqueue.
#   bash benchmarks/recorded/h200-2026-12-03/run-1.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c "import dask, distributed, dask_cuda, cupy, numpy, numba, zarr, xarray; print(*(f'{m.__name__} {m.__version__}' for m in (dask, distributed, dask_cuda, cupy, numpy, numba, zarr, xarray)), sep=', ')"; } > "$out/env.log" 2>&1
timeout ${T1:-420} python3 -m pytest -m gpu -n 14 -v -p no:cacheprovider -o console_output_style=classic \
  --durations=25 tests/ops tests/kernels tests/fusion > "$out/gpu-1.log" 2>&1; echo "EXIT $?" >> "$out/gpu-1.log"
timeout ${T1B:-130} python3 -m benchmarks.out_of_core.run --size full --stores flowgpu --workloads chain,transpose \
  > "$out/out_of_core.log" 2>&1; echo "EXIT $?" >> "$out/out_of_core.log"
grep -E " PASSED| FAILED| ERROR| SKIPPED" "$out/gpu-1.log" | awk '{print $2}' | sort | uniq -c
grep -E "FAILED|ERROR" "$out/gpu-1.log" | head -30
tail -5 "$out/gpu-1.log"; tail -15 "$out/out_of_core.log"
