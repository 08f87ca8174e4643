#!/usr/bin/env bash
# Session 14, first device call (one H200): every `pytest -m gpu` test in two groups (the array-level
# packages with the long every-pair CUDA shards first, then the rest; -v: each verdict is in the log even
# if a group is cut), then the out-of-core rows of the flowgpu store.
# Wheels: .whl/ as in ../h200-2026-12-03/run-1.sh (rmm, librmm and nvtx do not fit the 64 MiB carry, so
# the one test of a Session's rmm pool is deselected).
#   bash benchmarks/recorded/h200-2026-12-04-s14/run-1.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi -L; git log -1 --format=%h 2>/dev/null; python3 -c "import dask, distributed, dask_cuda, cupy, numpy, numba, zarr, xarray; print(*(f'{m.__name__} {m.__version__}' for m in (dask, distributed, dask_cuda, cupy, numpy, numba, zarr, xarray)), sep=', ')"; } > "$out/env.log" 2>&1
common=(-m gpu -n 15 -v -p no:cacheprovider -o console_output_style=classic --durations=20)
timeout ${T1:-320} python3 -m pytest "${common[@]}" tests/ops tests/kernels tests/fusion > "$out/gpu-1.log" 2>&1
echo "EXIT $?" >> "$out/gpu-1.log"
timeout ${T2:-130} python3 -m pytest "${common[@]}" --ignore tests/ops --ignore tests/kernels --ignore tests/fusion \
  --deselect tests/runtime/test_gpu_session.py::test_rmm_pool_session tests > "$out/gpu-2.log" 2>&1
echo "EXIT $?" >> "$out/gpu-2.log"
timeout ${T3:-110} python3 -m benchmarks.out_of_core.run --size full --stores flowgpu --workloads chain,transpose \
  > "$out/out_of_core.log" 2>&1; echo "EXIT $?" >> "$out/out_of_core.log"
for g in gpu-1 gpu-2; do
  echo "== $g"; grep -E " PASSED| FAILED| ERROR| SKIPPED" "$out/$g.log" | awk '{print $2}' | sort | uniq -c
  grep -E "^(FAILED|ERROR)|\] (FAILED|ERROR)" "$out/$g.log" | head -20; tail -3 "$out/$g.log"
done
tail -12 "$out/out_of_core.log"
