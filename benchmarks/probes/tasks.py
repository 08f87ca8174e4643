"""What one distributed task costs on a flowgpu Session, and what scheduler settings change it.

A fused chain + sum over persisted data and 200 trivial tasks, with dask's default root-task
queuing, without it, and with 4 threads per worker. GPU only (a default Session).

    python -m benchmarks.probes.tasks --gib 8 --chunk-mib 256
"""

from __future__ import annotations

import sys

from distributed import wait

import flowgpu as fg
from benchmarks import harness


def _measure(s, x, chain, label, rows, repeats):
    n = x.npartitions
    rows.append((f"{label}: fused chain + sum, {n} chunks",
                 harness.median_ms(lambda: float(chain(x).compute()), repeats)))
    rows.append((f"{label}: 200 trivial tasks", harness.median_ms(
        lambda: s.client.gather(s.client.map(lambda i: i, range(200), pure=False)), repeats)))


def parser():
    p = harness.parser(__spec__.name, __doc__, repeats=5)
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--chunk-mib", type=int, default=256)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)
    cols = 1 << 14
    shape = (int(args.gib * (1 << 30)) // 4 // cols, cols)
    chunks = (args.chunk_mib * (1 << 20) // 4 // cols, cols)
    chain = fg.fuse(lambda v: ((v * 2 + 1) ** 2 - v).sum())
    rows: list[tuple[str, float]] = []
    for threads in (1, 4):
        with fg.Session(threads_per_worker=threads, dashboard_address=None) as s:
            x = s.client.persist(fg.random(shape, dtype="float32", seed=1, chunks=chunks))
            wait(x)
            _measure(s, x, chain, f"{threads} thread(s), default queuing", rows, args.repeats)
            if threads == 1:
                s.client.run_on_scheduler(lambda dask_scheduler: setattr(dask_scheduler, "WORKER_SATURATION",
                                                                         float("inf")))
                _measure(s, x, chain, "1 thread, worker-saturation inf", rows, args.repeats)
            del x
    report.finish((f"what ({args.gib:g} GiB, {args.chunk_mib} MiB chunks)", "median ms"),
                  [(n, round(v, 2)) for n, v in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
