"""Where a distributed GPU worker spends the time of a fused chain + sum, task by task.

``python -m benchmarks.probes.worker [--gib 8] [--chunk-mib 1024,256] [--repeats 10]`` prints, for a
``flowgpu.Session`` holding persisted data (GPU only):

- the wall time of ``compute()`` and how it splits: client/scheduler time before the first task starts,
  the tasks' own compute time, the gaps between tasks on the worker, and the time after the last one;
- the same chunks reduced by a plain loop inside the worker process (no task machinery);
- the same graph with no kernel at all (a view per chunk), and with dask-cuda's store;
- the worker's statistical profile (``Client.profile``) over the repeats, top functions by own samples.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

import dask
import numpy as np
from distributed import get_task_stream, wait

import flowgpu as fg
from benchmarks import harness
from flowgpu.backend import import_cupy
from flowgpu.fusion.chunk import FusedChunk


def _flatten(profile: dict, out: dict) -> int:
    """Own-sample counts per function of a distributed profile tree."""
    children = profile.get("children", {})
    below = sum(_flatten(child, out) for child in children.values())
    desc = profile.get("description", {})
    name = f"{desc.get('filename', '?').split('site-packages/')[-1]}:{desc.get('line_number', '?')} {desc.get('name', '?')}"
    own = profile.get("count", 0) - below
    if own > 0:
        out[name] = out.get(name, 0) + own
    return profile.get("count", 0)


def _tiny(b):
    return b.ravel()[:1].reshape(1, 1)


def _in_worker(keys, repeats, dask_worker=None):
    cp = import_cupy(strict=False)
    sync = cp.cuda.Device().synchronize if cp is not None else (lambda: None)

    call = FusedChunk("((x * 2 + 1) ** 2 - x)", ("x",), (), np.dtype("float32"), "sum", (0, 1))
    blocks = [dask_worker.data[k] for k in keys if k in dask_worker.data]
    result = {}

    def loop():
        call(blocks[0])
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for b in blocks:
                call(b)
            t1 = time.perf_counter()
            sync()
            times.append(((t1 - t0) * 1e3, (time.perf_counter() - t0) * 1e3))
        result["launch_ms"] = statistics.median(t[0] for t in times)
        result["total_ms"] = statistics.median(t[1] for t in times)

    th = threading.Thread(target=loop)
    th.start()
    th.join()
    return result


def _stream_stats(client, run, repeats: int) -> dict:
    run()
    walls, before, after, comp, gaps, ntask = [], [], [], [], [], []
    for _ in range(repeats):
        with get_task_stream(client) as ts:
            t0 = time.time()
            run()
            t1 = time.time()
        spans = sorted((s["start"], s["stop"], r["key"]) for r in ts.data for s in r["startstops"]
                       if s["action"] == "compute")
        if not spans:
            continue
        walls.append((t1 - t0) * 1e3)
        before.append((spans[0][0] - t0) * 1e3)
        after.append((t1 - max(s[1] for s in spans)) * 1e3)
        comp.extend((s[1] - s[0]) * 1e3 for s in spans)
        gaps.extend((b[0] - a[1]) * 1e3 for a, b in zip(spans, spans[1:]))
        ntask.append(len(spans))
    med = statistics.median
    return {"wall": med(walls), "before_first": med(before), "after_last": med(after),
            "task_compute": med(comp), "task_compute_max": max(comp), "gap": med(gaps) if gaps else 0.0,
            "tasks": med(ntask)}


def _fmt(label, st):
    return (f"| {label} | {st['wall']:.1f} | {st['tasks']:.0f} | {st['before_first']:.2f} | {st['task_compute']:.3f} "
            f"({st['task_compute_max']:.2f}) | {st['gap']:.3f} | {st['after_last']:.2f} |")


def parser():
    p = harness.parser(__spec__.name, __doc__, repeats=10)
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--chunk-mib", default="1024,256", help="comma-separated chunk sizes in MiB")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    report = harness.Report(args, argv)
    cols = 1 << 14
    n_total = int(args.gib * (1 << 30)) // 4
    chain = fg.fuse(lambda v: ((v * 2 + 1) ** 2 - v).sum())
    lines = ["| run | wall ms | tasks | before first task ms | task compute ms median (max) | gap ms median "
             "| after last ms |", "|---|---|---|---|---|---|---|"]
    notes = []
    variants = {  # name: (config, threads per worker, scheduler's worker-saturation)
        "flowgpu": ({}, 1, None),
        "batching as distributed's": ({"flowgpu.batch-interval": None}, 1, None),
        "flowgpu, 4 threads": ({}, 4, None),
        "flowgpu, worker-saturation inf": ({}, 1, float("inf")),
        "dask-cuda store": ({"flowgpu.spill.store": "dask-cuda"}, 1, None),
    }
    for variant, (cfg, threads, saturation) in variants.items():
        with dask.config.set(cfg):
            with fg.Session(dashboard_address=None, threads_per_worker=threads) as s:
                if saturation is not None:
                    s.client.run_on_scheduler(lambda dask_scheduler, v=saturation: setattr(
                        dask_scheduler, "WORKER_SATURATION", v))
                for mib in harness.ints(args.chunk_mib):
                    chunk = (mib * (1 << 20) // 4 // cols, cols)
                    x = s.client.persist(fg.random((n_total // cols, cols), dtype="float32", seed=1, chunks=chunk))
                    wait(x)
                    tag = f"{variant}, {mib} MiB"
                    lines.append(_fmt(f"{tag}: fused chain+sum", _stream_stats(
                        s.client, lambda: float(chain(x).compute()), args.repeats)))
                    if variant == "flowgpu":
                        build = harness.timed(lambda: dask.optimize(chain(x)), args.repeats, warmup=0)  # noqa: B023
                        notes.append(f"- {tag}: building the fused graph and dask.optimize on the client: "
                                     f"{build.median * 1e3:.2f} ms")
                        lines.append(_fmt(f"{tag}: one trivial task (round trip)", _stream_stats(
                            s.client, lambda: s.client.submit(int, 1, pure=False).result(), args.repeats)))
                        tiny = x.map_blocks(_tiny, chunks=(1, 1), dtype=x.dtype)
                        lines.append(_fmt(f"{tag}: a view per chunk + sum (no kernel)", _stream_stats(
                            s.client, lambda: float(tiny.sum().compute()), args.repeats)))
                        lines.append(_fmt(f"{tag}: dask.array chain+sum (unfused)", _stream_stats(
                            s.client, lambda: float(((x * 2 + 1) ** 2 - x).sum().compute()), args.repeats)))
                        keys = [k for k in dask.core.flatten(x.__dask_keys__())]
                        r = s.client.run(_in_worker, keys, args.repeats)
                        for w, v in r.items():
                            notes.append(f"- {tag}: the {len(keys)} chunks reduced in a plain loop inside the worker "
                                         f"process: launches {v['launch_ms']:.2f} ms, with the final sync "
                                         f"{v['total_ms']:.2f} ms")
                        s.client.profile(start=time.time() + 1e6)  # no-op: warm the call
                        t0 = time.time()
                        for _ in range(args.repeats * 3):
                            float(chain(x).compute())
                        prof = s.client.profile(start=t0)
                        own: dict = {}
                        total = _flatten(prof, own)
                        top = sorted(own.items(), key=lambda kv: -kv[1])[:25]
                        notes.append(f"\nworker profile, {tag}, {args.repeats * 3} fused runs, {total} samples:\n")
                        notes.extend(f"    {n:5d} {name}" for name, n in top)
                    del x
    for n in notes:
        report.line(n)
    report.finish(text="\n".join(lines), title=f"{args.gib:g} GiB float32, one GPU worker, medians of {args.repeats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
