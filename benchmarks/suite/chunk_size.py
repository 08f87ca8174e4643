"""Throughput against chunk size: the measurement behind ``flowgpu.chunks.*-target`` in flowgpu.yaml.

For each chunk size, the fused ``((x * 2 + 1) ** 2 - x).sum()`` (flowgpu.fuse) runs over the same
total amount of float32 data held in (device) memory, and we report time, GB/s and tasks. Small
chunks lose to per-task overhead (about a millisecond per task in the distributed scheduler); very
large chunks hold more memory per thread and leave fewer chunks to overlap. The suggested target
is the smallest chunk that reaches 90% of the best throughput.

    python -m benchmarks.chunk_size                 # GPU: a flowgpu Session on this machine's GPU
    python -m benchmarks.chunk_size --cpu           # CPU: dask's threaded scheduler
    python -m benchmarks.chunk_size --cpu --distributed   # CPU: a local distributed cluster
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import dask
import numpy as np

MiB = 1 << 20

DEFAULTS = {
    "gpu": {"total": 16 << 30, "chunks": [64, 128, 256, 512, 1024, 2048, 4096]},
    "cpu": {"total": 1 << 30, "chunks": [1, 4, 16, 32, 64, 128, 256]},
}


def chain_sum(x):
    return ((x * 2 + 1) ** 2 - x).sum()


def measure(x, fused, repeats: int) -> list[float]:
    float(fused(x).compute())  # warm-up: compiles the kernel
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        float(fused(x).compute())
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chunk_size", description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--distributed", action="store_true", help="on CPU, use a local distributed cluster")
    p.add_argument("--total", type=float, default=None, help="GiB of data (default 16 on GPU, 1 on CPU)")
    p.add_argument("--chunks", type=str, default=None, help="comma-separated chunk sizes in MiB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=str, default=None,
                   help="GPU: comma-separated threads per worker to sweep too (default: the Session's default)")
    p.add_argument("--out", default="benchmarks/results")
    args = p.parse_args(argv)

    import flowgpu as fg

    mode = "cpu" if args.cpu else "gpu"
    total = int(args.total * (1 << 30)) if args.total else DEFAULTS[mode]["total"]
    sizes = [float(s) for s in args.chunks.split(",")] if args.chunks else DEFAULTS[mode]["chunks"]
    cols = 1 << 14
    rows_total = total // 4 // cols
    shape = (rows_total, cols)
    fused = fg.fuse(chain_sum)
    thread_counts = [int(t) for t in args.threads.split(",")] if args.threads and not args.cpu else [None]
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
                        from distributed import wait

                        wait(x)
                    times = measure(x, fused, args.repeats)
                    t = statistics.median(times)
                    row = {"chunk_MiB": mib, "threads": session.threads_per_worker if session else None,
                           "chunks": x.npartitions, "time_s": t, "GBps": total / t / 1e9, "times": times}
                    rows_out.append(row)
                    print(f"threads {row['threads']}  chunk {mib:8.1f} MiB  {x.npartitions:6d} chunks  "
                          f"{t * 1e3:9.2f} ms  {row['GBps']:8.1f} GB/s", flush=True)
                    del x
        finally:
            if session is not None:
                session.close()
    best = max(r["GBps"] for r in rows_out)
    good = [r for r in rows_out if r["GBps"] >= 0.9 * best]
    suggest = min(good, key=lambda r: r["chunk_MiB"])["chunk_MiB"] if good else None
    key = "gpu-target" if not args.cpu else "cpu-target"
    lines = [f"# chunk size against throughput ({mode}{', distributed' if args.distributed else ''}, "
             f"{total / (1 << 30):g} GiB float32, fused chain + sum)", "",
             "| chunk (MiB) | threads | chunks | time (ms) | GB/s | of best |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['chunk_MiB']:g} | {r['threads'] or '-'} | {r['chunks']} | {r['time_s'] * 1e3:.2f} | {r['GBps']:.1f} | "
              f"{r['GBps'] / best:.0%} |" for r in rows_out]
    lines += ["", f"Smallest chunk within 90% of the best: {suggest:g} MiB -> flowgpu.chunks.{key}: {suggest:g}MiB"]
    table = "\n".join(lines)
    os.makedirs(args.out, exist_ok=True)
    name = f"chunk_size-{mode}{'-distributed' if args.distributed else ''}"
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump({"mode": mode, "distributed": args.distributed, "total_bytes": total, "rows": rows_out,
                   "suggested_MiB": suggest}, f, indent=1)
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(table + "\n")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
