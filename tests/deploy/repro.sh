#!/usr/bin/env bash
# The reproductions of issue 25 on this machine (GPU or CPU), printed for a closing note: a spec whose
# Zarr input is a relative path, run (a) on its own cluster, (b) against `flowgpu cluster start`
# started from /, (c) against `dask scheduler` + `dask worker` (`dask cuda worker` on a GPU host)
# started in another folder with another HOME and TMPDIR; each line prints the run's values beside
# NumPy's. Usage: bash tests/deploy/repro.sh OUT_DIR   (flowgpu importable: installed, or on PYTHONPATH)
set -uo pipefail
out=${1:?usage: repro.sh OUT_DIR}
mkdir -p "$out"
py=${PYTHON:-python3}
work=$(mktemp -d)
else_dir=$(mktemp -d)
mkdir -p "$else_dir/home" "$else_dir/tmp"
export DASK_FLOWGPU__CLUSTER__DIRECTORY=$work/.cluster DASK_FLOWGPU__DASHBOARD_ADDRESS=127.0.0.1:0
cd "$work" || exit 1
$py - <<'PY' > "$out/numpy.json"
import json, numpy as np, zarr
rng = np.random.default_rng()
x = (rng.random((8, 256, 256), dtype=np.float32) * 100).astype(np.float32)
z = zarr.create_array("data/raw.zarr", shape=x.shape, chunks=(1, 256, 256), dtype="float32")  # zstd: decoded on a GPU
z[:] = x
print(json.dumps({"frame_means": x.astype(np.float64).mean(axis=(1, 2)).tolist(), "max": float(x.max())}))
PY
cat > spec.yaml <<'YAML'
name: repro
inputs:
  x: {source: zarr, path: data/raw.zarr}
steps:
  frame_means: {op: mean, inputs: [x], args: {axis: [1, 2]}}
  top: {op: max, inputs: [x]}
outputs:
  frame_means: {from: frame_means}
  max: {from: top}
  copy: {from: x, sink: zarr, path: out/copy.zarr}
YAML
values() {  # the summary's values and whether the written copy equals the input, as one JSON line
  $py - "$1" <<'PY'
import json, sys, numpy as np, zarr
s = json.load(open(sys.argv[1]))
same = bool(np.array_equal(zarr.open_array("out/copy.zarr", mode="r")[:], zarr.open_array("data/raw.zarr", mode="r")[:]))
print(json.dumps({"status": s["status"], "frame_means": s["outputs"]["frame_means"]["value"],
                  "max": s["outputs"]["max"]["value"], "copy_equal": same, "workers": s["session"]["workers"]}))
PY
}
run() {  # NAME ARGS...
  local name=$1; shift
  rm -rf out .flowgpu
  $py -m flowgpu run spec.yaml --summary "$out/$name.json" "$@" > "$out/$name.stdout" 2> "$out/$name.stderr"
  echo "$name exit $?: $(values "$out/$name.json")"
}
echo "numpy: $(cat "$out/numpy.json")"
run own --standalone
if (cd / && $py -m flowgpu cluster start > "$out/standing-start.log" 2>&1); then run standing
else echo "standing: flowgpu cluster start failed:"; tail -n 5 "$out/standing-start.log"; fi
(cd / && $py -m flowgpu cluster stop > /dev/null 2>&1)
( cd "$else_dir" && HOME=$else_dir/home TMPDIR=$else_dir/tmp $py -m distributed.cli.dask_scheduler \
    --scheduler-file "$else_dir/s.json" --host 127.0.0.1 --port 0 --dashboard-address :0 > "$out/sched.log" 2>&1 & )
for _ in $(seq 100); do [ -f "$else_dir/s.json" ] && break; sleep 0.2; done
if $py -c "import cupy; cupy.cuda.runtime.getDeviceCount()" 2>/dev/null; then worker=(-m dask cuda worker); else worker=(-m distributed.cli.dask_worker); fi
( cd "$else_dir" && HOME=$else_dir/home TMPDIR=$else_dir/tmp $py "${worker[@]}" --scheduler-file "$else_dir/s.json" \
    > "$out/worker.log" 2>&1 & )
sleep 15
run joined --scheduler "$else_dir/s.json"
pkill -f "$else_dir/s.json" || true
