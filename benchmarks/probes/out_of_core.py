"""Timeline of one out-of-core pass on a GPU worker: what the store, the copy engines and the tasks did when.

``python -m benchmarks.probes.out_of_core [--gib 32] [--limit 8GB] [--chunk-rows 2048] [--npy]`` (GPU only)

Persists ``--gib`` of float32 under ``--limit`` on a flowgpu session (4 threads), then runs the chain
pass ``((x*2+1)**2 - x).sum()`` twice with the worker's store traced through its events
(``store.subscribe``, ``flowgpu.memory.events``): each ``data[key]`` (which thread, how long, from
which tier), each pinned allocation, each device-to-host spill, and every copy's start and end on
the device (CUDA events). It prints totals and a coarse timeline: per slice of the
pass, how busy the upload and spill copies were, how many tasks ran, and how long the event loop sat
in the store. With ``--npy`` it also writes the data to a ``.npy`` and times ``fg.from_npy`` passes.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import numpy as np
from distributed import get_task_stream, wait

import flowgpu as fg
from benchmarks import harness
from benchmarks.out_of_core.data import chain
from flowgpu.memory import events as ev
from flowgpu.transfer import staging


def _install(dask_worker=None):
    """Subscribe a recorder to the worker store's events (``flowgpu.memory.events``)."""
    import cupy as cp

    old = getattr(dask_worker, "_flowgpu_profile", None)
    if old is not None:
        old[1]()  # unsubscribe the previous recorder
    tr = {"fetch": [], "alloc": [], "d2h": [], "copies": [], "clean_drop": []}
    ref = cp.cuda.Event()
    ref.record()
    ref.synchronize()
    tr["ref"] = (ref, time.time())

    def record(e):
        if isinstance(e, ev.FetchEnded):
            tr["fetch"].append((e.start, e.end, str(e.key), e.tier, e.prefetch, e.thread))
        elif isinstance(e, ev.PinnedAllocated):
            tr["alloc"].append((e.start, e.end, e.nbytes, e.thread))
        elif isinstance(e, ev.SpillEnded):  # the whole spill call: room made, buffer taken, waits
            tr["d2h"].append((e.start, e.end, str(e.key), e.thread))
        elif isinstance(e, ev.CopyEnqueued):
            tr["copies"].append(("h2d" if e.activity == "host_to_device" else "d2h", e.time, e.nbytes, e.copy))
        elif isinstance(e, ev.CleanCopyDropped):
            tr["clean_drop"].append((e.start, e.end))

    kinds = (ev.FetchEnded, ev.PinnedAllocated, ev.SpillEnded, ev.CopyEnqueued, ev.CleanCopyDropped)
    dask_worker._flowgpu_profile = (tr, dask_worker.data.subscribe(record, *kinds))
    return True


def _collect(dask_worker=None):
    """The recorded events, copies turned into wall-clock device intervals; clears the record."""
    import cupy as cp

    tr = dask_worker._flowgpu_profile[0]
    ref, t_ref = tr["ref"]
    copies = []
    for kind, t_enq, nbytes, pc in tr["copies"]:
        s, e = pc._start_event, pc._done_event
        if s is None or e is None:
            continue
        e.synchronize()
        copies.append((kind, t_enq, t_ref + cp.cuda.get_elapsed_time(ref, s) / 1e3,
                       t_ref + cp.cuda.get_elapsed_time(ref, e) / 1e3, nbytes))
    out = {k: list(v) for k, v in tr.items() if k not in ("ref", "copies")}
    out["copies"] = copies
    out["stats"] = dask_worker.data.stats()
    for k in tr:
        if k != "ref":
            tr[k].clear()
    return out


def _set_staging(depth=None, budget_mib=None, dask_worker=None):
    if depth is not None:
        staging.DEPTH = depth
    if budget_mib is not None:
        staging.STAGING_BYTES = budget_mib << 20


def _union(intervals, lo, hi):
    iv = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in iv:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def report(name: str, t0: float, t1: float, tr: dict, stream: list) -> None:
    wall = t1 - t0
    tasks = [(ss["start"], ss["stop"]) for r in stream for ss in r["startstops"] if ss["action"] == "compute"]
    reads = [(ss["start"], ss["stop"]) for r in stream for ss in r["startstops"] if ss["action"] != "compute"]
    ups = [c for c in tr["copies"] if c[0] == "h2d" and c[3] > t0 and c[2] < t1]
    downs = [c for c in tr["copies"] if c[0] == "d2h" and c[3] > t0 and c[2] < t1]
    fetches = [f for f in tr["fetch"] if t0 <= f[0] <= t1]
    allocs = [a for a in tr["alloc"] if t0 <= a[0] <= t1]
    print(f"\n== {name}: {wall:.3f} s wall")
    if tasks:
        print(f"first task starts {min(a for a, _ in tasks) - t0:.3f} s in, last ends {t1 - max(b for _, b in tasks):.3f} s "
              f"before the end; {len(tasks)} tasks, compute sum {sum(b - a for a, b in tasks):.2f} s, "
              f"union {_union(tasks, t0, t1):.3f} s; non-compute startstops {len(reads)} sum {sum(b - a for a, b in reads):.3f} s")
    for label, cs in (("uploads", ups), ("spills", downs)):
        if cs:
            busy = _union([(c[2], c[3]) for c in cs], t0, t1)
            each = [c[4] / (c[3] - c[2]) / 1e9 for c in cs if c[3] > c[2]]
            lag = [c[2] - c[1] for c in cs]
            print(f"{label}: {len(cs)} copies, {sum(c[4] for c in cs) / 1e9:.1f} GB, device busy {busy:.3f} s "
                  f"({busy / wall:.0%} of wall), per copy median {np.median(each):.1f} GB/s, "
                  f"enqueue->start median {np.median(lag) * 1e3:.1f} ms max {max(lag) * 1e3:.1f} ms")
    by_thread: dict[str, list] = {}
    for f in fetches:
        by_thread.setdefault(f[5], []).append(f)
    for th, fs in by_thread.items():
        kinds: dict[str, int] = {}
        for f in fs:
            kinds[f[3]] = kinds.get(f[3], 0) + 1
        slow = sorted(fs, key=lambda f: f[0] - f[1])[:3]
        print(f"store reads on {th}: {len(fs)} ({kinds}), sum {sum(f[1] - f[0] for f in fs):.3f} s; slowest: "
              + ", ".join(f"{(f[1] - f[0]) * 1e3:.0f} ms ({f[3]})" for f in slow))
    if allocs:
        print(f"pinned allocations: {len(allocs)}, {sum(a[2] for a in allocs) / 2**30:.1f} GiB, "
              f"{sum(a[1] - a[0] for a in allocs):.3f} s, on {sorted({a[3] for a in allocs})}")
    d2hs = [d for d in tr["d2h"] if t0 <= d[0] <= t1]
    if d2hs:
        print(f"spill calls: {len(d2hs)}, sum {sum(d[1] - d[0] for d in d2hs):.3f} s (allocation and waits included)")
    n = 20
    edges = np.linspace(t0, t1, n + 1)
    print("slice  uploads  spills  tasks  loop-in-store")
    loop = [(f[0], f[1]) for f in fetches if f[5] == "MainThread"]
    for i in range(n):
        a, b = edges[i], edges[i + 1]
        u = _union([(c[2], c[3]) for c in ups], a, b) / (b - a)
        d = _union([(c[2], c[3]) for c in downs], a, b) / (b - a)
        k = sum(max(0.0, min(y, b) - max(x, a)) for x, y in tasks) / (b - a)
        lp = _union(loop, a, b) / (b - a)
        print(f"{a - t0:5.2f}  {u:6.0%}  {d:6.0%}  {k:5.1f}  {lp:6.0%}")


def parser():
    ap = harness.parser(__spec__.name, __doc__)
    ap.add_argument("--gib", type=int, default=32)
    ap.add_argument("--limit", default="8GB")
    ap.add_argument("--chunk-rows", type=int, default=2048)
    ap.add_argument("--npy", action="store_true")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--depths", default="", help="also time npy passes with these staging depths, e.g. 2,4,6")
    ap.add_argument("--budgets", default="", help="also time npy passes with these staging slice sizes in MiB, e.g. 4,16")
    ap.add_argument("--skip-persisted", action="store_true", help="only the npy passes")
    return ap


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    out = harness.Report(a, argv)
    cols = 131072
    rows = a.gib * 2**30 // (4 * cols)
    with fg.Session(backend="gpu", gpus=[0], device_memory_limit=a.limit, threads_per_worker=4,
                    dashboard_address=None) as s:
        c = s.client
        c.run(_install)
        # compile the kernels on two chunks first: the passes below time moving data
        float(chain(fg.random((2 * a.chunk_rows, cols), dtype="float32", seed=1, chunks=(a.chunk_rows, cols))).compute())
        c.run(_collect)
        x = fg.random((rows, cols), dtype="float32", seed=42, chunks=(a.chunk_rows, cols))
        t0 = time.time()
        with get_task_stream(c) as ts:
            xp = x.persist()
            wait(xp)
        t1 = time.time()
        tr = next(iter(c.run(_collect).values()))
        report("persist", t0, t1, tr, ts.data)
        nbytes = rows * cols * 4

        def traced(label, graph):
            """Compute ``graph`` with the store traced; print its report; return (result, task stream)."""
            with get_task_stream(c) as ts:
                t0 = time.time()
                out = float(graph.compute())
                t1 = time.time()
            tr = next(iter(c.run(_collect).values()))
            report(f"{label}, {nbytes / (t1 - t0) / 1e9:.1f} GB/s", t0, t1, tr, ts.data)
            return out, ts.data, tr

        r = None
        for i in range(0 if a.skip_persisted else a.passes):
            r, _, tr = traced(f"chain pass {i + 1} (persisted)", chain(xp))
            if i == a.passes - 1:
                print("store:", {k: v for k, v in tr["stats"].items() if k in ("moves", "events", "pinned_pool")})
        if a.npy:
            tmp = tempfile.mkdtemp(prefix="flowgpu-prof-")
            path = os.path.join(tmp, "x.npy")
            fg.to_npy(xp, path, overwrite=True)
            del xp
            runs: list = [(f"npy pass {i + 1}", None) for i in range(a.passes)]
            runs += [(f"npy pass, staging depth {n}", dict(depth=int(n))) for n in a.depths.split(",") if n]
            runs += [(f"npy pass, staging slices of {n} MiB", dict(depth=4, budget_mib=int(n)))
                     for n in a.budgets.split(",") if n]
            for label, change in runs:
                if change is not None:
                    c.run(_set_staging, **change)
                r2, stream, _ = traced(label, chain(fg.from_npy(path, chunks=(a.chunk_rows, cols))))
                durs = sorted(ss["stop"] - ss["start"] for rr in stream for ss in rr["startstops"]
                              if ss["action"] == "compute")
                r = r2 if r is None else r
                print(f"task durations: median {np.median(durs) * 1e3:.0f} ms, max {durs[-1] * 1e3:.0f} ms "
                      f"({len(durs)} tasks); same result as the first pass: {r2 == r}")
            shutil.rmtree(tmp, ignore_errors=True)
    out.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
