"""Throughput against chunk size: the measurement behind ``flowgpu.chunks.*-target`` in flowgpu.yaml.

For each chunk size, the fused ``((x * 2 + 1) ** 2 - x).sum()`` (flowgpu.fuse) runs over the same
total amount of float32 data held in (device) memory, and we report time, GB/s and tasks. Small
chunks lose to per-task overhead (about a millisecond per task in the distributed scheduler); very
large chunks hold more memory per thread and leave fewer chunks to overlap. The suggested target
is the smallest chunk that reaches 90% of the best throughput.

    python -m benchmarks.suite.chunk_size                 # GPU: a flowgpu Session on this machine's GPU
    python -m benchmarks.suite.chunk_size --cpu           # CPU: dask's threaded scheduler
    python -m benchmarks.suite.chunk_size --cpu --distributed   # CPU: a local distributed cluster
    python -m benchmarks.suite.chunk_size --cpu --size small    # CPU: 64 MiB, 2 and 8 MiB chunks
"""

from __future__ import annotations

import contextlib
import os
import sys

import dask
import numpy as np
from distributed import wait

import flowgpu as fg
from benchmarks import harness
from benchmarks.suite.workloads import chain_sum

MiB = 1 << 20

DEFAULTS = {  # (mode, size): total bytes, chunk sizes in MiB
    ("gpu", "full"): {"total": 16 << 30, "chunks": [64, 128, 256, 512, 1024, 2048, 4096]},
    ("gpu", "small"): {"total": 1 << 30, "chunks": [64, 256]},
    ("cpu", "full"): {"total": 1 << 30, "chunks": [1, 4, 16, 32, 64, 128, 256]},
    ("cpu", "small"): {"total": 64 << 20, "chunks": [2, 8]},
}


def parser():
    p = harness.parser(__spec__.name, __doc__, cpu="dask's threaded scheduler on NumPy instead of a GPU Session",
                       size="small: a quick smoke run (1 GiB on GPU, 64 MiB on CPU)", repeats=3)
    p.add_argument("--distributed", action="store_true", help="on CPU, use a local distributed cluster")
    p.add_argument("--total", type=float, default=None, help="GiB of data (default 16 on GPU, 1 on CPU)")
    p.add_argument("--chunks", type=str, default=None, help="comma-separated chunk sizes in MiB")
    p.add_argument("--threads", type=str, default=None,
                   help="GPU: comma-separated threads per worker to sweep too (default: the Session's default)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)

    mode = "cpu" if args.cpu else "gpu"
    defaults = DEFAULTS[mode, args.size]
    total = int(args.total * (1 << 30)) if args.total else defaults["total"]
    sizes = [float(s) for s in args.chunks.split(",")] if args.chunks else defaults["chunks"]
    cols = 1 << 14
    rows_total = total // 4 // cols
    shape = (rows_total, cols)
    fused = fg.fuse(chain_sum)
    thread_counts = harness.ints(args.threads) if args.threads and not args.cpu else [None]
    rows_out = []
    seed = int(np.random.SeedSequence().entropy % (2**31))
    for threads in thread_counts:
        session = None
        if not args.cpu:
            session = fg.Session(backend="gpu", gpus=[0], dashboard_address=None, threads_per_worker=threads)
        elif args.distributed:
            session = fg.Session(backend="cpu", n_workers=1, threads_per_worker=os.cpu_count(),
                                 dashboard_address=None)
        try:
            with dask.config.set(scheduler="threads") if session is None else contextlib.nullcontext():
                for mib in sizes:
                    rows = max(1, int(mib * MiB) // (cols * 4))
                    x = fg.random(shape, dtype="float32", seed=seed, chunks=(rows, cols))
                    x = x.persist()
                    if session is not None:
                        wait(x)
                    timing = harness.timed(lambda: float(fused(x).compute()), args.repeats)  # noqa: B023
                    t = timing.median
                    row = {"chunk_MiB": mib, "threads": session.threads_per_worker if session else None,
                           "chunks": x.npartitions, "time_s": t, "GBps": total / t / 1e9, "times": timing.times}
                    rows_out.append(row)
                    report.line(f"threads {row['threads']}  chunk {mib:8.1f} MiB  {x.npartitions:6d} chunks  "
                                f"{t * 1e3:9.2f} ms  {row['GBps']:8.1f} GB/s")
                    del x
        finally:
            if session is not None:
                session.close()
    best = max(r["GBps"] for r in rows_out)
    good = [r for r in rows_out if r["GBps"] >= 0.9 * best]
    suggest = min(good, key=lambda r: r["chunk_MiB"])["chunk_MiB"] if good else None
    key = "gpu-target" if not args.cpu else "cpu-target"
    title = (f"chunk size against throughput ({mode}{', distributed' if args.distributed else ''}, "
             f"{total / (1 << 30):g} GiB float32, fused chain + sum); smallest chunk within 90% of the best: "
             f"{suggest:g} MiB -> flowgpu.chunks.{key}: {suggest:g}MiB")
    rows = [(f"{r['chunk_MiB']:g}", r["threads"] or "-", r["chunks"], round(r["time_s"] * 1e3, 2),
             round(r["GBps"], 1), f"{r['GBps'] / best:.0%}") for r in rows_out]
    report.finish(("chunk (MiB)", "threads", "chunks", "time (ms)", "GB/s", "of best"), rows, title=title,
                  mode=mode, distributed=args.distributed, total_bytes=total, sweep=rows_out, suggested_MiB=suggest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
