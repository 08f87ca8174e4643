"""Where the time of a fused chain + sum goes on a GPU: kernel alone, dask alone, distributed, stores.

``python benchmarks/profile_fused.py [--gib 8] [--chunk-mib 1024]`` prints one table. Each row adds one
layer on top of the previous one, so the differences between rows say what each layer costs.
"""

from __future__ import annotations

import argparse
import statistics
import time


def _median_ms(fn, repeats=5):
    try:
        fn()
    except Exception as e:  # one broken row must not hide the others
        print(f"  error: {type(e).__name__}: {e}", flush=True)
        return float("nan")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--chunk-mib", type=int, default=1024)
    args = p.parse_args()

    import cupy as cp
    import dask
    import numpy as np

    import flowgpu as fg
    from flowgpu.kernels import fusion

    n_chunk = args.chunk_mib * (1 << 20) // 4
    n_total = int(args.gib * (1 << 30)) // 4
    cols = 1 << 14
    chunk = (n_chunk // cols, cols)
    rows = []
    x1 = cp.random.random(n_chunk, dtype=cp.float32).reshape(chunk)
    sync = cp.cuda.Device().synchronize
    hand = cp.fuse(kernel_name="chain_sum")(lambda v: cp.sum((v * 2 + 1) ** 2 - v))
    rows.append(("one chunk: cupy.fuse", _median_ms(lambda: (hand(x1), sync()))))
    call = fusion._Chunk("(x * 2 + 1) ** 2 - x", ("x",), (), np.dtype("float32"), "sum", (0, 1))
    rows.append(("one chunk: flowgpu fused reduce_chunk", _median_ms(lambda: (call(x1), sync()))))
    ew = fusion._Chunk("(x * 2 + 1) ** 2 - x", ("x",), (), np.dtype("float32"))
    rows.append(("one chunk: flowgpu fused elementwise (writes)", _median_ms(lambda: (ew(x1), sync()))))
    del x1
    chain = fg.fuse(lambda v: ((v * 2 + 1) ** 2 - v).sum())
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads", "num_workers": 1}):
        x = fg.random((n_total // cols, cols), dtype="float32", seed=1, chunks=chunk).persist()
        rows.append((f"{args.gib:g} GiB: fg.fuse on dask threads (1 thread)", _median_ms(lambda: float(chain(x).compute()))))
        del x
    for store in ("flowgpu", "dask-cuda"):
        with dask.config.set({"flowgpu.spill.store": store}):
            with fg.Session(dashboard_address=None) as s:
                x = s.client.persist(fg.random((n_total // cols, cols), dtype="float32", seed=1, chunks=chunk))
                from distributed import wait

                wait(x)
                rows.append((f"{args.gib:g} GiB: fg.fuse on a Session, store={store}",
                             _median_ms(lambda: float(chain(x).compute()))))
                del x
    print(f"\n| what ({args.chunk_mib} MiB chunks) | median ms |\n|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
