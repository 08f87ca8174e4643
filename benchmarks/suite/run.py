"""Run the side-by-side benchmark suite: ``python -m benchmarks.run [--cpu] [--size small|full]``.

Writes ``results-<mode>-<size>.json`` and ``.md`` under ``--out`` and prints the markdown table last.
GPU mode starts a dask-cuda cluster and a flowgpu Session on this machine's GPU(s); ``--cpu`` runs
the same workloads, scaled down, on NumPy with dask's threaded scheduler.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks import harness
from benchmarks.workloads import WORKLOADS, Context


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="NumPy / numba / dask threaded instead of the GPU")
    p.add_argument("--size", choices=("small", "full"), default="full", help="small: a quick smoke run")
    p.add_argument("--only", action="append", choices=sorted(WORKLOADS), help="run only this workload (repeatable)")
    p.add_argument("--out", default="benchmarks/results", help="directory for the JSON and markdown results")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per column after one warm-up (median)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    ctx = Context(cpu=args.cpu, repeats=args.repeats, size=args.size)
    t0 = time.perf_counter()
    workloads = []
    try:
        ctx.start()
        rate = ctx.measure_copy_rate()
        print(f"copy rate (read + write): {rate / 1e9:.1f} GB/s", flush=True)
        for name in args.only or list(WORKLOADS):
            print(f"== {name}", flush=True)
            try:
                workloads += WORKLOADS[name](ctx)
            except Exception as e:  # a workload whose data could not even be made
                w = harness.Workload(name, work=0.0)
                w.skip("all", f"{type(e).__name__}: {e}")
                workloads.append(w)
            ctx.free()
    finally:
        ctx.close()
    mode = "cpu" if args.cpu else "gpu"
    columns = harness.COLUMNS_CPU if args.cpu else harness.COLUMNS_GPU
    table = harness.write(args.out, f"results-{mode}-{args.size}", workloads, columns,
                          {"command": " ".join(["python -m benchmarks.run"] + (argv if argv is not None else sys.argv[1:])),
                           "copy_rate_Bps": ctx.copy_rate, "wall_s": time.perf_counter() - t0})
    print(f"\nwall time {time.perf_counter() - t0:.0f} s; copy rate {ctx.copy_rate / 1e9:.1f} GB/s\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
