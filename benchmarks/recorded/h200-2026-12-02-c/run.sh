#!/usr/bin/env bash
# The one device call of the fourth session of 2026-12-02 (one H200, at most 600 s): the suite's
# plain / API / YAML columns, the compute-cost probe with its profiles, flowgpu's out-of-core pass,
# then as much of `pytest -m gpu` as the rest of the call allows (-v: each test's verdict as it ends).
# From the repository root, with the wheels of ../shared/gpu/fetch-wheels.sh in .whl/:
#   bash benchmarks/recorded/h200-2026-12-02-c/run.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-h200-out}}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ nvidia-smi -L; python3 -c "import dask, distributed, dask_cuda, cupy, numpy, numba, zarr; print(*(f'{m.__name__} {m.__version__}' for m in (dask, distributed, dask_cuda, cupy, numpy, numba, zarr)), sep=', ')"; } > "$out/env.log" 2>&1
timeout 170 python3 -m benchmarks.suite.run --only chain_sum --only transpose_sum --repeats 5 > "$out/suite.log" 2>&1; echo "EXIT $?" >> "$out/suite.log"
timeout 60 python3 -m benchmarks.probes.compute_cost --gib 8 --repeats 10 --profile 25 > "$out/compute-cost.log" 2>&1; echo "EXIT $?" >> "$out/compute-cost.log"
timeout 70 python3 -m benchmarks.out_of_core.run --size full --stores flowgpu --workloads chain,transpose > "$out/out-of-core.log" 2>&1; echo "EXIT $?" >> "$out/out-of-core.log"
timeout 235 python3 -m pytest -m gpu -n 12 -v -p no:benchmark -p no:cacheprovider -o console_output_style=classic \
  tests/transfer tests/memory tests/io tests/arrays tests/pipeline tests/runtime tests/faults tests/kernels \
  tests/fusion/test_device.py tests/fusion/test_kernel_cache.py tests/fusion/test_edges.py tests/fusion/test_tiled.py \
  tests/fusion/test_api.py > "$out/gpu.log" 2>&1; echo "EXIT $?" >> "$out/gpu.log"
grep -E "PASSED|FAILED|ERROR" "$out/gpu.log" | awk '{print $2}' | sort | uniq -c
grep -E "FAILED|ERROR" "$out/gpu.log" | head -20
tail -3 "$out/suite.log" "$out/out-of-core.log"
