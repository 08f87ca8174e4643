"""Which setting changes the bits of a GPU mean over a Zarr input: threads, the store, fusion."""
import os, sys, json
import numpy as np, zarr, dask
import flowgpu as fg

def main():
    os.makedirs("/tmp/diag", exist_ok=True); os.chdir("/tmp/diag")
    rng = np.random.default_rng(1)
    x = (rng.random((8, 256, 256), dtype=np.float32) * 100).astype(np.float32)
    if not os.path.exists("raw.zarr"):
        z = zarr.create_array("raw.zarr", shape=x.shape, chunks=(1, 256, 256), dtype="float32"); z[:] = x
    out = {}
    for store in ("flowgpu", "dask"):
        for threads in (1, 4):
            for fuse in (True, False):
                with dask.config.set({"flowgpu.spill.store": store}):
                    with fg.Session(backend="gpu", threads_per_worker=threads, dashboard_address=None, fuse=fuse) as s:
                        a = fg.from_zarr("raw.zarr")
                        m = a.mean(axis=(1, 2)).compute()
                        m = m.get() if hasattr(m, "get") else m
                        b = fg.from_array(x, chunks=(1, 256, 256)).mean(axis=(1, 2)).compute()
                        b = b.get() if hasattr(b, "get") else b
                        ptds = s.client.run(lambda: os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"))
                key = f"store={store} threads={threads} fuse={fuse} ptds={sorted(set(ptds.values()))}"
                out[key] = (m.tobytes().hex()[:32], b.tobytes().hex()[:32], float(m[0]))
                print(key, out[key], flush=True)
    print("distinct zarr results:", len({v[0] for v in out.values()}), "distinct array results:", len({v[1] for v in out.values()}))

if __name__ == "__main__":
    main()
