"""Own GPU cluster vs a joined dask cuda worker: chunks of every intermediate (built on the client) and bits."""
import os, subprocess, sys, time, hashlib
import numpy as np, zarr, dask
import flowgpu as fg
from flowgpu.ops import get

def h(a):
    a = a.get() if hasattr(a, "get") else a
    return hashlib.md5(np.ascontiguousarray(a).tobytes()).hexdigest()[:10]

def cases(tag):
    out = {}
    st = fg.from_zarr("/tmp/wd2/stack.zarr")
    sm = get("gaussian_filter")(st, sigma=[0, 2.0, 2.0])
    fm = get("mean")(sm, axis=[1, 2])
    out["stack"] = (st.chunks, h(st.compute()))
    out["smooth"] = (sm.chunks, h(sm.compute()))
    out["frame_mean"] = (fm.chunks, h(fm.compute()), float((fm.compute().get() if hasattr(fm.compute(), "get") else fm.compute())[0]))
    x = fg.normal((120, 120), dtype="float32", seed=0, loc=3.0, scale=2.0, chunks=(40, -1))
    mu = get("mean")(x, axis=0, keepdims=True); sd = get("std")(x, axis=0, keepdims=True)
    z = (x - mu) / sd
    out["x"] = (x.chunks, h(x.compute())); out["mu"] = (mu.chunks, h(mu.compute())); out["sd"] = (sd.chunks, h(sd.compute()))
    out["z"] = (z.chunks, h(z.compute()))
    for k, v in out.items():
        print(tag, k, v, flush=True)
    return out

def main():
    os.makedirs("/tmp/wd2", exist_ok=True)
    rng = np.random.default_rng(2)
    s = rng.random((3, 48, 40), dtype=np.float32)
    z = zarr.create_array("/tmp/wd2/stack.zarr", shape=s.shape, chunks=(1, 48, 40), dtype="float32", overwrite=True); z[:] = s
    res = {}
    with fg.Session(backend="gpu", threads_per_worker=1, dashboard_address=None) as ses:
        print("own budget", ses.worker_budget, dask.config.get("flowgpu.worker"), flush=True)
        res["own"] = cases("own")
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", "/tmp/wd2/s.json",
                              "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"], stderr=subprocess.DEVNULL)
    while not os.path.exists("/tmp/wd2/s.json"): time.sleep(0.2)
    for tag, env in (("joined", {}), ("joined-ptds1", {"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": "1"})):
        w = subprocess.Popen([sys.executable, "-m", "dask", "cuda", "worker", "--scheduler-file", "/tmp/wd2/s.json", "--nthreads", "1"],
                             stderr=subprocess.DEVNULL, env=dict(os.environ, **env))
        try:
            with fg.Session("/tmp/wd2/s.json") as ses:
                print(tag, "budget", ses.worker_budget, dask.config.get("flowgpu.worker"),
                      ses.client.run(lambda: {k: v for k, v in os.environ.items() if k.startswith(("CUPY", "RAPIDS", "DASK_"))}), flush=True)
                res[tag] = cases(tag)
        finally:
            w.terminate(); w.wait(); time.sleep(2)
    sched.terminate()
    for k in res["own"]:
        print("SAME" if len({str(r[k]) for r in res.values()}) == 1 else "DIFF", k, flush=True)

if __name__ == "__main__":
    main()
