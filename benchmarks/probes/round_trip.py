"""Round trip of one trivial task: what a ``compute()`` costs before any work, per cluster kind.

``python benchmarks/round_trip.py`` prints the median of 60 ``client.submit(int, 1).result()`` on:
a flowgpu CPU Session (its store, and dask's), a plain ``LocalCluster`` (distributed's batching,
then flowgpu's 1 ms), and an in-process ``LocalCluster(processes=False)`` with 1 ms batching.
"""

from __future__ import annotations

import statistics
import time


def round_trip_ms(client, n: int = 60) -> float:
    client.submit(int, 1, pure=False).result()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        client.submit(int, 1, pure=False).result()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    import dask
    from distributed import Client, LocalCluster

    import flowgpu as fg
    from flowgpu.runtime import latency

    rows = []
    with fg.Session(backend="cpu", n_workers=1, threads_per_worker=1, dashboard_address=None) as s:
        rows.append(("flowgpu Session (CPU), flowgpu store", round_trip_ms(s.client)))
    with dask.config.set({"flowgpu.spill.store": "dask"}):
        with fg.Session(backend="cpu", n_workers=1, threads_per_worker=1, dashboard_address=None) as s:
            rows.append(("flowgpu Session (CPU), dask's store", round_trip_ms(s.client)))
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cl, Client(cl) as c:
        rows.append(("LocalCluster, worker process, distributed's batching", round_trip_ms(c)))
        latency.tune(c, 0.001, cluster=True)
        rows.append(("LocalCluster, worker process, 1 ms batching", round_trip_ms(c)))
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None, processes=False) as cl, \
            Client(cl) as c:
        latency.tune(c, 0.001, cluster=True)
        rows.append(("LocalCluster(processes=False), 1 ms batching", round_trip_ms(c)))
    print("\n| cluster | one trivial task, median ms |\n|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.1f} |")


if __name__ == "__main__":
    main()
