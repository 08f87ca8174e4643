"""What one distributed task costs on a flowgpu Session, and what scheduler settings change it.

``python benchmarks/profile_tasks.py [--gib 8] [--chunk-mib 256]``: a fused chain + sum over persisted
data and 200 trivial tasks, with dask's default root-task queuing, without it, and with 4 threads
per worker. Prints one markdown table.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_fused import _median_ms  # noqa: E402  (run as a script, beside it)


def _measure(s, x, chain, label, rows):
    n = x.npartitions
    rows.append((f"{label}: fused chain + sum, {n} chunks", _median_ms(lambda: float(chain(x).compute()))))
    rows.append((f"{label}: 200 trivial tasks", _median_ms(
        lambda: s.client.gather(s.client.map(lambda i: i, range(200), pure=False)))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--chunk-mib", type=int, default=256)
    args = p.parse_args()

    from distributed import wait

    import flowgpu as fg

    cols = 1 << 14
    shape = (int(args.gib * (1 << 30)) // 4 // cols, cols)
    chunks = (args.chunk_mib * (1 << 20) // 4 // cols, cols)
    chain = fg.fuse(lambda v: ((v * 2 + 1) ** 2 - v).sum())
    rows: list[tuple[str, float]] = []
    for threads in (1, 4):
        with fg.Session(threads_per_worker=threads, dashboard_address=None) as s:
            x = s.client.persist(fg.random(shape, dtype="float32", seed=1, chunks=chunks))
            wait(x)
            _measure(s, x, chain, f"{threads} thread(s), default queuing", rows)
            if threads == 1:
                s.client.run_on_scheduler(lambda dask_scheduler: setattr(dask_scheduler, "WORKER_SATURATION",
                                                                         float("inf")))
                _measure(s, x, chain, "1 thread, worker-saturation inf", rows)
            del x
    print(f"\n| what ({args.gib:g} GiB, {args.chunk_mib} MiB chunks) | median ms |\n|---|---|")
    for name, ms in rows:
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
