import os, subprocess, sys, time, hashlib
import numpy as np, dask
import flowgpu as fg
from flowgpu.fusion.graph import array_optimize

def probe(s, tag):
    x = fg.normal((120, 120), dtype="float32", seed=0, loc=3.0, scale=2.0, chunks=(40, -1))
    mu = x.mean(axis=0, keepdims=True)
    g = array_optimize(mu.__dask_graph__(), mu.__dask_keys__())
    fns = sorted({type(getattr(t, "func", None)).__name__ for t in dict(g).values()})
    print(tag, "client array.backend", dask.config.get("array.backend"), "array_optimize", dask.config.get("array_optimize", None) is array_optimize,
          "fuse", dask.config.get("flowgpu.fuse-ufuncs"), "meta", type(x._meta).__module__, "task funcs", fns, flush=True)
    r = mu.compute(); r = r.get() if hasattr(r, "get") else r
    print(tag, "mu", hashlib.md5(r.tobytes()).hexdigest()[:10], flush=True)

def main():
    with fg.Session(backend="gpu", threads_per_worker=1, dashboard_address=None) as s:
        probe(s, "own")
    os.makedirs("/tmp/wd4", exist_ok=True)
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", "/tmp/wd4/s.json",
                              "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"], stderr=subprocess.DEVNULL)
    while not os.path.exists("/tmp/wd4/s.json"): time.sleep(0.2)
    w = subprocess.Popen([sys.executable, "-m", "dask", "cuda", "worker", "--scheduler-file", "/tmp/wd4/s.json", "--nthreads", "1"], stderr=subprocess.DEVNULL)
    try:
        with fg.Session("/tmp/wd4/s.json") as s:
            probe(s, "joined")
            print("joined workers", s.workers and {k: (v["gpus"], v["cupy"]) for k, v in s.workers.items()}, s.backend, s.array_backend, flush=True)
    finally:
        w.terminate(); w.wait(); sched.terminate()

if __name__ == "__main__":
    main()
