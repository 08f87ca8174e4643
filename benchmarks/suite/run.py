"""The side-by-side suite: each workload on raw CuPy, hand-fused CuPy, dask-cuda and flowgpu.

GPU mode starts a dask-cuda cluster and a flowgpu Session on this machine's GPU(s); ``--cpu`` runs
the same workloads, scaled down, on NumPy, numba and dask's threaded scheduler. Every column is
checked against a float64 reference; the markdown table comes last.

    python -m benchmarks.suite.run --only chain_sum --only transpose_sum --repeats 5   # GPU
    python -m benchmarks.suite.run --cpu --size small --repeats 1                      # CPU smoke run
    python -m benchmarks.suite.run --cold --only chain_sum     # the first compute in fresh processes
    python -m benchmarks.suite.run --gpus 0,1 --only chain_sum --only transpose_sum --chain-gib 64 --tsum 56000
                                             # and the same on GPUs 0 and 1: flowgpu, dask-cuda, TCP, UCX

``--gpus`` adds the several-GPU columns (benchmarks/suite/multi.py) beside the one-GPU ones, which
run on the first GPU listed; ``--gpus 0`` runs those columns' code on one GPU.
"""

from __future__ import annotations

import sys
import time

from benchmarks import harness
from benchmarks.suite import cold
from benchmarks.suite.context import Context
from benchmarks.suite.workloads import WORKLOADS


def parser():
    p = harness.parser(__spec__.name, __doc__, cpu="NumPy / numba / dask threaded instead of the GPU",
                       size="small: a quick smoke run", repeats=3)
    p.add_argument("--only", action="append", choices=sorted(set(WORKLOADS) | set(cold.COLD)),
                   help=f"run only this workload (repeatable); {', '.join(sorted(set(cold.COLD) - set(WORKLOADS)))} "
                        "with --cold only")
    p.add_argument("--cold", action="store_true",
                   help="instead, time the first compute in fresh processes, unfused and fused, with empty "
                        f"and warm kernel caches ({', '.join(cold.COLD)}; benchmarks/suite/cold.py)")
    p.add_argument("--gpus", type=harness.ints, default=None, metavar="0,1",
                   help="GPU mode: add columns on these GPUs together (flowgpu and dask-cuda, TCP and UCX)")
    p.add_argument("--chain-gib", type=lambda t: [float(v) for v in t.split(",")], default=None, metavar="8,32",
                   help="chain_sum sizes in GiB instead of the size's own")
    p.add_argument("--tsum", type=int, default=None, metavar="N", help="transpose_sum on N x N instead of the size's")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    report = harness.Report(args, argv)
    if args.cold:
        return cold.run(args, report)
    if set(args.only or ()) - set(WORKLOADS):
        p.error(f"--only {', '.join(sorted(set(args.only) - set(WORKLOADS)))}: only with --cold")
    ctx = Context(cpu=args.cpu, repeats=args.repeats, size=args.size, gpus=args.gpus)
    ctx.sizes = {**ctx.sizes, **({"chain": args.chain_gib} if args.chain_gib else {}),
                 **({"tsum": args.tsum} if args.tsum else {})}
    workloads = []
    try:
        ctx.start()
        rate = ctx.measure_copy_rate()
        report.line(f"copy rate (read + write): {rate / 1e9:.1f} GB/s")
        for name in args.only or list(WORKLOADS):
            report.line(f"== {name}")
            try:
                workloads += WORKLOADS[name](ctx)
            except Exception as e:  # a workload whose data could not even be made
                w = harness.Workload(name, work=0.0)
                w.skip("all", f"{type(e).__name__}: {e}")
                workloads.append(w)
            ctx.free()
    finally:
        ctx.close()
    columns = harness.COLUMNS_CPU if args.cpu else harness.COLUMNS_GPU + tuple(ctx.multi.labels if ctx.multi else ())
    report.line(f"\nwall time {time.perf_counter() - report.t0:.0f} s; copy rate {ctx.copy_rate / 1e9:.1f} GB/s")
    report.finish(text=harness.markdown(workloads, columns), title=f"{'cpu' if args.cpu else 'gpu'}, size {args.size}",
                  copy_rate_Bps=ctx.copy_rate, workloads=harness.workloads_json(workloads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
