"""What one ``compute()`` costs on a Session beyond the kernels, for plain dask code and ``fg.fuse``.

Issue 28, items 3 and 4. On one Session (GPU by default, ``--cpu`` for NumPy workers), over a
persisted float32 array of ``--gib`` GiB, for ``((x * 2 + 1) ** 2 - x).sum()`` written as plain
dask.array code and through ``fg.fuse``, the median of ``--repeats`` of:

* ``build``: making the lazy graph on the client (dask's per-op metadata, the reduction's layers);
* ``optimize``: ``dask.optimize`` of the built graph (the Session's rewrite, then dask's own), here
  on the client: a ``compute()`` runs it on the scheduler;
* ``compute``: ``.compute()`` of the built graph (optimise, schedule, run, gather), and
  ``build + compute`` as a user's line of code pays it;
* a trivial ``x[:10].sum().compute()`` and a ``client.submit(int, 1).result()`` round trip,
  the floor of any compute on that cluster;
* with ``--profile N``: the top N functions of a cProfile of the trivial compute on the client, and
  of building the plain dask graph (what plain code pays that ``fg.fuse`` does not).

Every value is checked against a float64 NumPy reference.

    python -m benchmarks.probes.compute_cost --gib 8 --repeats 10          # on the H200
    python -m benchmarks.probes.compute_cost --cpu --gib 0.25 --repeats 5
"""

from __future__ import annotations

import statistics
import sys
import time

import dask
import numpy as np

import flowgpu as fg
from benchmarks import harness


def _log(text: str) -> None:
    print(text, file=sys.stderr)


def _median(fn, repeats: int, sync=None) -> float:
    fn()  # warm-up: kernels compiled, caches filled
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def parser():
    p = harness.parser(__spec__.name, __doc__, cpu="a CPU Session (NumPy workers) instead of a GPU one", repeats=10)
    p.add_argument("--gib", type=float, default=8.0, help="the array's size in GiB (default 8)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also print the top N functions of cProfiles of the trivial compute and the plain graph build")
    return p


def probe(args) -> None:
    n = int(args.gib * (1 << 30)) // 4
    cols = 1 << 14 if n >= (1 << 24) else 1 << 10
    shape = (n // cols, cols)
    with fg.Session(backend="cpu" if args.cpu else "gpu", dashboard_address=None) as s:
        x = fg.random(shape, dtype="float32", seed=7).persist()
        _log(f"{shape} float32 in {x.numblocks} chunks of {x.chunksize}, on a {s.facts.backend} Session; "
                    f"medians of {args.repeats}")
        # the float64 reference, chunk by chunk on the workers (no host copy of the whole array)
        want = float(x.astype("float64").map_blocks(lambda b: (b * 2 + 1) ** 2 - b).sum().compute())

        def plain(v):
            return ((v * 2 + 1) ** 2 - v).sum()

        fused = fg.fuse(plain)
        rows = []
        for name, make in (("plain dask", lambda: plain(x)), ("fg.fuse", lambda: fused(x))):
            got = float(make().compute())
            if abs(got - want) > 1e-4 * abs(want):
                raise SystemExit(f"{name}: {got} differs from the float64 reference {want}")
            built = make()
            rows.append((name, _median(make, args.repeats), _median(lambda: dask.optimize(built), args.repeats),
                         _median(lambda: built.compute(), args.repeats),
                         _median(lambda: make().compute(), args.repeats)))
        small = x[:10]
        trivial = _median(lambda: small.sum().compute(), args.repeats)
        trip = _median(lambda: s.client.submit(int, 1, pure=False).result(), args.repeats)
        print("| graph | build (ms) | optimize (ms) | compute of the built graph (ms) | build + compute (ms) |")
        print("|---|---|---|---|---|")
        for name, build, opt, comp, both in rows:
            print(f"| {name} | {build:.2f} | {opt:.2f} | {comp:.2f} | {both:.2f} |")
        print(f"\ntrivial x[:10].sum().compute(): {trivial:.2f} ms; client.submit(int, 1).result(): {trip:.2f} ms")
        if args.profile:
            for what, fn in (("trivial computes (client side)", lambda: small.sum().compute()),
                             ("plain dask graph builds", lambda: plain(x))):
                print(f"\ncProfile of {args.repeats} {what}:\n{harness.profiled(fn, args.repeats, args.profile)}")


def main(argv=None) -> int:
    return harness.captured_main(parser, probe, argv)


if __name__ == "__main__":
    sys.exit(main())
