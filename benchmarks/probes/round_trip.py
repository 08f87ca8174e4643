"""Round trip of one trivial task: what a ``compute()`` costs before any work, per cluster kind.

The median of ``--repeats`` ``client.submit(int, 1).result()`` (after one warm-up) on: a flowgpu
CPU Session (its store, and dask's), a plain ``LocalCluster`` (distributed's batching, then
flowgpu's 1 ms), and an in-process ``LocalCluster(processes=False)`` with 1 ms batching. CPU only.

    python -m benchmarks.probes.round_trip
"""

from __future__ import annotations

import sys

import dask
from distributed import Client, LocalCluster

import flowgpu as fg
from benchmarks import harness
from flowgpu.runtime import latency


def round_trip_ms(client, n: int = 60) -> float:
    return harness.timed(lambda: client.submit(int, 1, pure=False).result(), n).median * 1e3


def parser():
    return harness.parser(__spec__.name, __doc__, size="small: 5 round trips per cluster, a smoke run", repeats=60)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)
    n = 5 if args.size == "small" else args.repeats
    rows = []
    with fg.Session(backend="cpu", n_workers=1, threads_per_worker=1, dashboard_address=None) as s:
        rows.append(("flowgpu Session (CPU), flowgpu store", round_trip_ms(s.client, n)))
    with dask.config.set({"flowgpu.spill.store": "dask"}):
        with fg.Session(backend="cpu", n_workers=1, threads_per_worker=1, dashboard_address=None) as s:
            rows.append(("flowgpu Session (CPU), dask's store", round_trip_ms(s.client, n)))
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as cl, Client(cl) as c:
        rows.append(("LocalCluster, worker process, distributed's batching", round_trip_ms(c, n)))
        latency.tune(c, 0.001, cluster=True)
        rows.append(("LocalCluster, worker process, 1 ms batching", round_trip_ms(c, n)))
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None, processes=False) as cl, \
            Client(cl) as c:
        latency.tune(c, 0.001, cluster=True)
        rows.append(("LocalCluster(processes=False), 1 ms batching", round_trip_ms(c, n)))
    report.finish(("cluster", "one trivial task, median ms"), [(name, round(ms, 1)) for name, ms in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
