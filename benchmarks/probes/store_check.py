"""Do plain dask.array results on a GPU Session come out right with each data store and thread count?

For ``flowgpu.spill.store`` flowgpu / dask, 1 / 4 threads, with and without an RMM pool: persist a
random 40000² float64 array (20000² chunks), then compare ``x[:10].sum()``, ``(x + x.T).sum()`` and
``(x @ x).sum()`` (on 8000²) computed on the cluster with the same sums of the gathered array in
NumPy (float64, 1e-9 relative). Prints the worker's CUDA stream environment too.

    python -m benchmarks.probes.store_check
"""

from __future__ import annotations

import os
import subprocess
import sys

import dask
import dask.array as da
from distributed import wait

import flowgpu as fg
from benchmarks import harness


def used_mib() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"], capture_output=True,
                         text=True)
    return out.stdout.strip()


def check(store: str, threads: int, pool: str | None) -> None:
    with dask.config.set({"flowgpu.spill.store": store}), \
            fg.Session(backend="gpu", gpus=[0], threads_per_worker=threads, rmm_pool_size=pool,
                       dashboard_address=None) as s:
        env = s.client.run(lambda: os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"))
        with s.client.as_current(), dask.config.set(scheduler=s.client):
            x = s.client.persist(da.random.default_rng(7).random((40000, 40000), chunks=20000))
            wait(x)
            host = x.compute().get()
            y = s.client.persist(da.random.default_rng(8).random((8000, 8000), chunks=4000))
            wait(y)
            yh = y.compute().get()
            got = {"x[:10].sum": [float(x[:10].sum().compute()) for _ in range(3)],
                   "(x+x.T).sum": [float((x + x.T).sum().compute()) for _ in range(3)],
                   "(y@y).sum": [float((y @ y).sum().compute()) for _ in range(3)]}
            want = {"x[:10].sum": host[:10].sum(), "(x+x.T).sum": 2 * host.sum(), "(y@y).sum": (yh @ yh).sum()}
        bad = {k: v for k, v in got.items() if any(abs(g - want[k]) > 1e-9 * abs(want[k]) for g in v)}
        print(f"store={store} threads={threads} pool={pool} worker env={list(env.values())} gpu used before close "
              f"{used_mib()}: {'OK' if not bad else 'WRONG ' + repr({k: (v, want[k]) for k, v in bad.items()})}",
              flush=True)


def main(argv=None) -> int:
    harness.parser(__spec__.name, __doc__).parse_args(argv)
    print(f"gpu used at start {used_mib()}", flush=True)
    for store in ("dask", "flowgpu"):
        for threads in (4, 1):
            for pool in (None, "60GB"):
                try:
                    check(store, threads, pool)
                except Exception as e:
                    print(f"store={store} threads={threads} pool={pool}: {type(e).__name__}: {e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
