"""Own GPU cluster vs a joined dask cuda worker: the same spec's plan, graph layers and bits."""
import os, subprocess, sys, time, json
import numpy as np, zarr, dask
import flowgpu as fg
from flowgpu import pipeline

SPEC = {"name": "repro", "inputs": {"x": {"source": "zarr", "path": "data/raw.zarr"}},
        "steps": {"fm": {"op": "mean", "inputs": ["x"], "args": {"axis": [1, 2]}}},
        "outputs": {"fm": {"from": "fm"}}}

def show(tag, s):
    r = pipeline.run(SPEC, session=s, progress=False, cache=False)
    plan = r.plan
    layers = sorted({k.split("-")[0] if isinstance(k, str) else str(k[0]).rsplit("-", 1)[0] for k in dict(plan.outputs["fm"].__dask_graph__())})
    print(tag, "fused roots:", plan.fusion.roots and list(plan.fusion.roots), "plan.fused", plan.fused, "value", r.outputs["fm"][0],
          "threads", s.threads_per_worker, "budget", s.worker_budget, "chunks", plan.outputs["fm"].chunks, "layers", layers[:6], flush=True)
    x = fg.from_zarr("data/raw.zarr")
    m = x.mean(axis=(1, 2)).compute(); m = m.get() if hasattr(m, "get") else m
    print(tag, "python api", float(m[0]), "chunks", x.chunks[0][:2], flush=True)

def main():
    os.makedirs("/tmp/fd/data", exist_ok=True); os.chdir("/tmp/fd")
    rng = np.random.default_rng(5)
    x = (rng.random((8, 256, 256), dtype=np.float32) * 100).astype(np.float32)
    z = zarr.create_array("data/raw.zarr", shape=x.shape, chunks=(1, 256, 256), dtype="float32", overwrite=True); z[:] = x
    print("numpy", x[0].astype(np.float64).mean())
    with fg.Session(backend="gpu", dashboard_address=None) as s:
        show("own", s)
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", "/tmp/fd/s.json",
                              "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"], stderr=subprocess.DEVNULL)
    while not os.path.exists("/tmp/fd/s.json"): time.sleep(0.2)
    w = subprocess.Popen([sys.executable, "-m", "dask", "cuda", "worker", "--scheduler-file", "/tmp/fd/s.json"], stderr=subprocess.DEVNULL)
    try:
        with fg.Session("/tmp/fd/s.json") as s:
            show("joined", s)
    finally:
        w.terminate(); sched.terminate()

if __name__ == "__main__":
    main()
