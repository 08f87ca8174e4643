"""A batch of many small items on one warm cluster, against the same work as one hand-made Dask graph
and against separate ``flowgpu run`` calls.

The batch is ``pipelines/quickstart_batch.yaml`` (the quickstart, one item per seed) at ``--n``,
run with ``pipeline.run(..., foreach={"seed": "0:ITEMS"}, cache=False)`` on a Session that is
already up. The hand-made graph builds the same arrays with flowgpu's creation functions and
dask.array, and computes them (Zarr writes and sums) in one ``dask.compute`` on the same cluster.
Separate runs are ``python -m flowgpu run`` processes, each starting its own cluster; ``--separate
K`` of them are timed and the mean is multiplied by ITEMS (64 processes would take ~10 minutes).

    python -m benchmarks.batch.many_items --cpu --items 64 --n 500
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dask
import dask.array as da
import numpy as np

import flowgpu as fg
from benchmarks import harness
from flowgpu import pipeline

SPEC = Path(__file__).resolve().parents[2] / "pipelines" / "quickstart_batch.yaml"


def by_hand(items: int, n: int, rows: int, out: str, client) -> list[float]:
    """The batch's work as one dask graph: per seed, standardise, write to Zarr, two sums."""
    writes, sums = [], []
    for seed in range(items):
        x = fg.normal((n, n), dtype="float32", seed=seed, loc=3.0, scale=2.0, chunks=(rows, -1))
        z = (x - x.mean(axis=0, keepdims=True)) / x.std(axis=0, keepdims=True)
        writes.append(da.to_zarr(fg.to_host(z), os.path.join(out, f"hand-{seed}.zarr"), overwrite=True, compute=False))
        sums += [(z * z).sum(), x.mean()]
    results = dask.compute(*writes, *sums, scheduler=client)
    return [float(v) for v in results[len(writes):]]


def batch(items: int, n: int, rows: int, out: str, session) -> list[float]:
    result = pipeline.run(str(SPEC), session=session, progress=False, cache=False,
                          overrides={"params.n": n, "params.rows_per_chunk": rows, "params.out": out},
                          foreach={"seed": f"0:{items}"})
    assert result.ok, result.summary
    return [float(v) for r in result.items for v in (r.outputs["sum_sq"], r.outputs["mean"])]


def separate(k: int, n: int, rows: int, out: str, cpu: bool) -> float:
    """Mean wall time of one ``flowgpu run`` process (its own cluster) over ``k`` seeds."""
    times = []
    for seed in range(k):
        cmd = [sys.executable, "-m", "flowgpu", "run", str(SPEC), "-q", "--no-cache", "--standalone",
               "--set", f"params.n={n}", "--set", f"params.rows_per_chunk={rows}", "--set", f"params.out={out}",
               "--set", f"params.seed={seed}", *(["--backend", "cpu"] if cpu else [])]
        start = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
    return float(np.mean(times))


def parser():
    p = harness.parser(__spec__.name, __doc__, cpu="a CPU cluster (the 2-core CI machine's figures)", repeats=3)
    p.add_argument("--items", type=int, default=64)
    p.add_argument("--n", type=int, default=500, help="rows and columns of each item's matrix")
    p.add_argument("--rows", type=int, default=250, help="rows per chunk")
    p.add_argument("--separate", type=int, default=4, metavar="K", help="separate flowgpu run processes to time")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)
    with tempfile.TemporaryDirectory(prefix="flowgpu-bench-batch-") as out:
        opts = {"backend": "cpu"} if args.cpu else {}
        with fg.Session(dashboard_address=None, **opts) as s:
            want = by_hand(args.items, args.n, args.rows, out, s.client)
            got = batch(args.items, args.n, args.rows, out, s)
            same = np.allclose(got, want, rtol=1e-5)
            t_hand = harness.timed(lambda: by_hand(args.items, args.n, args.rows, out, s.client), args.repeats)
            t_batch = harness.timed(lambda: batch(args.items, args.n, args.rows, out, s), args.repeats)
            workers = f"{s.n_workers} {s.backend} worker(s)"
        one = separate(args.separate, args.n, args.rows, out, args.cpu) if args.separate else float("nan")
    runs = one * args.items
    report.line(f"{args.items} items of quickstart at n={args.n} on {workers}; results agree with the hand-made "
                f"graph: {'yes' if same else 'NO'}; separate runs: mean of {args.separate} x {args.items}")
    report.finish(("what", "seconds", "batch vs this"), [
        (f"flowgpu batch, {args.items} items, warm cluster", round(t_batch.median, 3), 1.0),
        (f"one hand-made Dask graph of the {args.items} items", round(t_hand.median, 3),
         round(t_batch.median / t_hand.median, 2)),
        (f"{args.items} separate `flowgpu run` (extrapolated)", round(runs, 1), round(t_batch.median / runs, 4)),
    ])
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
