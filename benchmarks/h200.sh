#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md, in one run on one H200 (about 12 minutes: the lent H200 allows 10
# per command, so DEVELOPERS.md runs it there in two halves: `bash benchmarks/h200.sh OUT 1` and `... 2`).
# Run from the repository root on a machine whose Python has CuPy, dask-cuda and the rest of flowgpu's
# dependencies, or on the lent H200 with the wheels of ../shared/gpu/fetch-wheels.sh in .whl/:
#   bash benchmarks/h200.sh [OUTDIR] [1|2|all]
set -uo pipefail
out=${1:-${OUT:-bench-out}}
part=${2:-all}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import dask_cuda" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
if [ "$part" != 2 ]; then
  python3 -m benchmarks.run --only chain_sum --only transpose_sum --only matmul --repeats 5 --out "$out" 2>&1 | tee "$out/suite.log" | tail -30
  python3 -m benchmarks.chunk_size --total 32 --chunks 2048,4096 --threads 1,2,4 --repeats 3 --out "$out" 2>&1 | tail -12
  python3 benchmarks/profile_worker.py --gib 8 --chunk-mib 2048,1024 --repeats 10 2>&1 | tee "$out/profile_worker.log" | tail -30
  python3 benchmarks/profile_transpose.py --n 20000 2>&1 | tail -9
  python3 benchmarks/vectorize_bench.py --gib 8 --repeat 3 2>&1 | tail -8
fi
if [ "$part" != 1 ]; then
  python3 benchmarks/out_of_core.py --size full 2>&1 | tee "$out/out_of_core.log" | tail -18
fi
