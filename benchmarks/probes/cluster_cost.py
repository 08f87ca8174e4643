"""Plain dask.array graphs on a flowgpu Session against dask-cuda's ``LocalCUDACluster``, and why.

Issue 16, item 4: the same plain dask.array code (no flowgpu call in it) at 20000² float64 chunks
with an RMM pool, on one GPU: ``(x + x.T).sum()`` 40000², ``x.sum()`` 40000², ``(a @ b).sum()``
20000², a 5-point stencil (``map_overlap``) 40000², and the fixed cost of one trivial
``x[:10].sum().compute()``. Each cluster variant starts, persists its data, times every workload
(median of ``--repeats`` after one warm-up) and closes before the next starts:

* ``dask-cuda``: ``LocalCUDACluster(n_workers=1, rmm_pool_size=...)``, distributed's defaults;
* ``flowgpu``: ``Session(backend="gpu", gpus=[0], rmm_pool_size=...)``, flowgpu's defaults;
* ``flowgpu, 1 thread`` / ``flowgpu, dask's store`` / ``flowgpu, no fusion`` / ``flowgpu,
  distributed's batching``: one default changed at a time, to find what a difference comes from;
* ``in-process``: ``LocalCluster(processes=False)`` with the CuPy backend, the worker in the
  client's process (no serialization of results, no TCP).

Every result is checked against the first variant's (float64: within 1e-9 relative).

    python -m benchmarks.probes.cluster_cost --repeats 5            # on the H200
    python -m benchmarks.probes.cluster_cost --size small --only flowgpu --only dask-cuda
"""

from __future__ import annotations

import contextlib
import sys
import time

import dask
import dask.array as da
import numpy as np

from distributed import get_task_stream, wait

import flowgpu as fg
from benchmarks import harness

VARIANTS = ("dask-cuda", "flowgpu", "flowgpu, 1 thread", "flowgpu, dask's store", "flowgpu, no fusion",
            "flowgpu, distributed's batching", "in-process")


def stencil(block):
    """A 5-point Laplacian of one block with its halo (depth 1), the halo cut off again."""
    c = block[1:-1, 1:-1]
    return (4 * c - block[:-2, 1:-1] - block[2:, 1:-1] - block[1:-1, :-2] - block[1:-1, 2:])


def workloads(n: int, m: int, chunk: int) -> dict:
    """name -> (make inputs, graph of the inputs): plain dask.array code, nothing of flowgpu's."""
    def rand(shape, seed):
        return da.random.default_rng(seed).random(shape, chunks=chunk)

    return {
        "transpose_sum": (lambda: [rand((n, n), 1)], lambda x: (x + x.T).sum()),
        "sum": (lambda: [rand((n, n), 2)], lambda x: x.sum()),
        "matmul": (lambda: [rand((m, m), 3), rand((m, m), 4)], lambda a, b: (a @ b).sum()),
        "stencil": (lambda: [rand((n, n), 5)],
                    lambda x: x.map_overlap(lambda b: np.pad(stencil(b), 1), depth=1, boundary="none").sum()),
        "trivial": (lambda: [rand((n, n), 6)], lambda x: x[:10].sum()),
    }


def profile(stream: list[dict]) -> str:
    """Tasks, worker compute time and the span from the first start to the last end, from a task stream."""
    compute = [s for t in stream for s in t.get("startstops", ()) if s["action"] == "compute"]
    moves = [s for t in stream for s in t.get("startstops", ()) if s["action"] == "transfer"]
    if not compute:
        return "no tasks"
    busy = sum(s["stop"] - s["start"] for s in compute)
    span = max(s["stop"] for s in compute) - min(s["start"] for s in compute)
    return (f"{len(stream)} tasks, compute {busy * 1e3:.1f} ms in all, first start to last end {span * 1e3:.1f} ms, "
            f"{len(moves)} transfers")


@contextlib.contextmanager
def cluster(variant: str, pool: str):
    """A client for ``variant``, as the current and default scheduler while the block runs."""
    from distributed import Client, LocalCluster

    if variant == "dask-cuda":
        from dask_cuda import LocalCUDACluster

        with dask.config.set({"array.backend": "cupy"}), \
                LocalCUDACluster(n_workers=1, rmm_pool_size=pool, rmm_allocator_external_lib_list=["cupy"],
                                 dashboard_address=None) as cl, Client(cl, set_as_default=False) as c:
            yield c
        return
    if variant == "in-process":
        import cupy
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator

        rmm.reinitialize(pool_allocator=True, initial_pool_size=pool)
        cupy.cuda.set_allocator(rmm_cupy_allocator)
        with dask.config.set({"array.backend": "cupy"}), \
                LocalCluster(n_workers=1, threads_per_worker=4, processes=False, dashboard_address=None) as cl, \
                Client(cl, set_as_default=False) as c:
            yield c
        cupy.cuda.set_allocator(None)
        return
    settings, kwargs = {}, {}
    if variant == "flowgpu, 1 thread":
        kwargs["threads_per_worker"] = 1
    elif variant == "flowgpu, dask's store":
        settings["flowgpu.spill.store"] = "dask"
    elif variant == "flowgpu, no fusion":
        settings["flowgpu.fuse-ufuncs"] = False
    elif variant == "flowgpu, distributed's batching":
        kwargs["batch_interval"] = None
    with dask.config.set(settings), fg.Session(backend="gpu", gpus=[0], rmm_pool_size=pool,
                                               dashboard_address=None, **kwargs) as s:
        yield s.client


def parser():
    p = harness.parser(__spec__.name, __doc__, size="small: 8000² (matmul 4000²), 4000² chunks", repeats=5)
    p.add_argument("--only", action="append", choices=VARIANTS, help="run only this variant (repeatable)")
    p.add_argument("--pool", default="60GB", help="RMM pool per worker (default 60GB)")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)
    n, m, chunk = (8000, 4000, 4000) if args.size == "small" else (40000, 20000, 20000)
    work = workloads(n, m, chunk)
    times: dict[str, dict[str, float]] = {}
    reference: dict[str, float] = {}
    for variant in args.only or VARIANTS:
        report.line(f"== {variant}")
        times[variant] = {}
        t0 = time.perf_counter()
        try:
            with cluster(variant, args.pool) as client:
                report.line(f"   started in {time.perf_counter() - t0:.1f} s")
                with client.as_current(), dask.config.set(scheduler=client):
                    for name, (make, graph) in work.items():
                        inputs = client.persist(make())
                        wait(inputs)
                        t = harness.timed(lambda: float(graph(*inputs).compute()), args.repeats)
                        value = float(t.value)
                        ref = reference.setdefault(name, value)
                        ok = abs(value - ref) <= 1e-9 * max(1.0, abs(ref))
                        times[variant][name] = t.median * 1e3
                        with get_task_stream(client) as ts:  # one more run: where its time went
                            w0 = time.perf_counter()
                            graph(*inputs).compute()
                            wall = time.perf_counter() - w0
                        report.line(f"   {name}: one run {wall * 1e3:.1f} ms: {profile(ts.data)}")
                        report.line(f"   {name}: {t.median * 1e3:.1f} ms (runs {', '.join(f'{s * 1e3:.1f}' for s in t.times)})"
                                    f"{'' if ok else f'  MISMATCH {value!r} vs {ref!r}'}")
                        inputs = None  # free the data before the next workload
        except Exception as e:  # one variant that cannot start does not hide the others
            report.line(f"   failed: {type(e).__name__}: {e}")
    names = list(work)
    base = times.get("dask-cuda", {})
    rows = []
    for variant, row in times.items():
        cells = []
        for name in names:
            ms = row.get(name)
            ratio = f" ({ms / base[name]:.2f}x)" if ms is not None and base.get(name) else ""
            cells.append("—" if ms is None else f"{ms:.1f}{ratio}")
        rows.append((variant, *cells))
    report.finish(("cluster", *[f"{name} ms" for name in names]), rows,
                  title=f"plain dask.array, float64, chunks {chunk}², medians of {args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
