#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md, in one run on one H200 (about 12 minutes: the lent H200 allows 10
# per command, so DEVELOPERS.md runs it there in parts: `bash benchmarks/h200.sh OUT 1`, `... 2`, `... 3`).
# Run from the repository root on a machine whose Python has CuPy, dask-cuda and the rest of flowgpu's
# dependencies, or on the lent H200 with the wheels of ../shared/gpu/fetch-wheels.sh in .whl/:
#   bash benchmarks/h200.sh [OUTDIR] [1|2|3|5|all|4]  (3: batches, about 4 minutes; 5: the first compute in
#   fresh processes, empty and warm kernel caches, a few minutes; 4: dashboard_record)
# Each step prints its table last (the tail below) and writes OUTDIR/<name>.json and OUTDIR/<name>.log.
set -uo pipefail
out=${1:-${OUT:-bench-out}}
part=${2:-all}
mkdir -p "$out"
if [ -d .whl ] && ! python3 -c "import dask_cuda" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
step() {  # step NAME LINES MODULE ARGS...: run python3 -m MODULE, keep its log and JSON, show its table
  local name=$1 lines=$2 module=$3
  shift 3
  python3 -m "$module" "$@" --json "$out/$name.json" 2>&1 | tee "$out/$name.log" | tail -"$lines"
}
if [ "$part" = all ] || [ "$part" = 1 ]; then
  step suite 30 benchmarks.suite.run --only chain_sum --only transpose_sum --only matmul --repeats 5
  step chunk_size 12 benchmarks.suite.chunk_size --total 32 --chunks 2048,4096 --threads 1,2,4 --repeats 3
  step profile_worker 30 benchmarks.probes.worker --gib 8 --chunk-mib 2048,1024 --repeats 10
  step profile_transpose 9 benchmarks.probes.transpose --n 20000
  step vectorize 8 benchmarks.suite.vectorize --gib 8 --repeats 3
fi
if [ "$part" = all ] || [ "$part" = 2 ]; then
  step out_of_core 18 benchmarks.out_of_core.run --size full
fi
if [ "$part" = all ] || [ "$part" = 3 ]; then
  step batch_gpu_items 8 benchmarks.batch.gpu_items --items 16 --gib 2 --repeats 3
  step batch_many_items 8 benchmarks.batch.many_items --items 64 --n 500 --separate 2 --repeats 3
  step batch_rerun 8 benchmarks.batch.rerun --n 2000 --repeats 3
fi
if [ "$part" = all ] || [ "$part" = 5 ]; then
  step suite_cold 12 benchmarks.suite.run --cold --size small
fi
if [ "$part" = 4 ]; then  # not in all: the flowgpu page during an out-of-core pass, recorded for dashboard_replay
  step dashboard_record 3 benchmarks.probes.dashboard_record --out "$out/dashboard-h200" --gib 32 --device-limit 8GB --passes 3
fi
