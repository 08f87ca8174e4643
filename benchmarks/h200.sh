#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md, in one run on one H200 (about 6 minutes). Run from the repository
# root on a machine whose Python has CuPy, dask-cuda and the rest of flowgpu's dependencies, or on the
# lent H200 with the wheels of ../shared/gpu/fetch-wheels.sh in .whl/ (DEVELOPERS.md):
#   bash benchmarks/h200.sh [OUTDIR]
set -uo pipefail
out=${1:-${OUT:-bench-out}}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import dask_cuda" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
python3 -m benchmarks.run --only chain_sum --only transpose_sum --only matmul --repeats 3 --out "$out" 2>&1 | tee "$out/suite.log" | tail -30
python3 -m benchmarks.chunk_size --total 8 --chunks 64,256,1024,2048 --repeats 2 --out "$out" 2>&1 | tail -12
python3 benchmarks/vectorize_bench.py --gib 8 --repeat 3 2>&1 | tail -8
python3 benchmarks/profile_fused.py --gib 8 --chunk-mib 1024 2>&1 | tail -9
python3 benchmarks/profile_tasks.py --gib 8 --chunk-mib 256 2>&1 | tail -9
python3 benchmarks/out_of_core.py --size small 2>&1 | tail -12
