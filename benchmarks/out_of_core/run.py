"""Out-of-core passes: flowgpu's spilling store side by side with the cluster's own.

GPU (one H200, one run, each store on a fresh one-GPU cluster under an 8 GB device limit; each
cluster first runs each graph once on two chunks, under the limit, so that one-time costs are paid
before the timed passes: kernels compiled, and for the ``.npy`` read its staging buffers allocated;
each workload then runs ``--repeats`` timed passes in a row, 3 by default, and the table gives
their median and each pass; the first pass after writing the ``.npy`` has varied most, from
1.17 to 1.55 s on the H200, later ones from 1.03 to 1.35 s):

* ``chain``: ``((x*2+1)**2 - x).sum()`` over 32 GiB of float32, persisted first;
* ``npy``: the same pass with ``x`` read from a host ``.npy`` (flowgpu: ``flowgpu.from_npy``,
  file -> pinned staging buffers -> device; dask-cuda: a memory-mapped ``.npy`` through
  ``da.from_array`` and ``cupy.asarray``, as a dask-cuda user writes it);
* ``transpose``: ``(x + x.T).sum()`` on 80000² float32 (25.6 GB), persisted first;
* pinned host-to-device bandwidth measured in the same run; every result compared with the
  same computation held in device memory (bit-identical or not).

CPU (``--cpu``): a 4 GiB elementwise pass under two workers of 600 MB, flowgpu's store
against dask's own spilling (``--size small``: 2 GiB under two workers of 600 MB).

Run::

    python -m benchmarks.out_of_core.run                  # GPU, about 4-5 minutes
    python -m benchmarks.out_of_core.run --size small     # GPU, a quarter of the data
    python -m benchmarks.out_of_core.run --cpu            # CPU, 2 workers x 600 MB
    python -m benchmarks.out_of_core.run --cpu --size small   # CPU, 2 GiB, 2 workers x 600 MB

Several GPUs (``--gpus 0,1``): each store runs again on all of them, one worker per GPU under the
same device limit each, over TCP and UCX (``--protocols``), on the same data in the same chunks;
``vs 1 GPU`` is the one-GPU time over that one, and every result must be bit-identical to the
device-memory reference. ``--gpus 0`` runs that code on one GPU::

    python -m benchmarks.out_of_core.run --gpus 0,1 --workloads chain,transpose

The markdown table comes last in the output.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import time

import dask
import dask.array as da
import numpy as np
from distributed import get_task_stream, wait

import flowgpu as fg
import flowgpu.config  # noqa: F401 - load flowgpu's defaults before setting one of them
from benchmarks import harness
from benchmarks.out_of_core.data import chain, npy_array, pinned_h2d_gbps, transpose_sum
from flowgpu.backend import import_cupy
from flowgpu.fusion import fusing
from flowgpu.memory import stats, summary
from flowgpu.transfer import staging

GiB = 1 << 30

SIZES = {  # chain shape (float32), chain chunk rows, transpose n, transpose chunk, device limit
    "full": dict(chain=(65536, 131072), rows=2048, tn=80000, tchunk=10000, limit="8GB"),
    "small": dict(chain=(16384, 131072), rows=2048, tn=40000, tchunk=10000, limit="2GB"),
}
CPU_SIZES = {  # bytes of float64, elements per chunk, memory limit of each of the two workers
    "full": dict(total=4 * GiB, chunk=4 * 2**20, limit="600MB"),
    "small": dict(total=2 * GiB, chunk=1 * 2**20, limit="600MB"),  # a worker that compiled a numba kernel holds ~300 MB
}


def _wait_released(client, timeout: float = 30.0) -> None:
    """Wait until the workers hold no keys: what a pass released is not still being freed in the next one."""
    deadline = time.monotonic() + timeout
    while any(client.run(lambda dask_worker: len(dask_worker.data)).values()) and time.monotonic() < deadline:
        time.sleep(0.05)


def _print_stream(store: str, records: list) -> None:
    """Where the pass spent its time on the worker: task compute, and inputs fetched from the store."""
    acts: dict[str, list[float]] = {}
    for r in records:
        for ss in r["startstops"]:
            acts.setdefault(ss["action"], []).append(ss["stop"] - ss["start"])
    parts = ", ".join(f"{a}: {len(v)} x median {np.median(v) * 1e3:.1f} ms, sum {sum(v):.2f} s"
                      for a, v in sorted(acts.items()))
    print(f"{store} task stream of the persisted pass: {parts}", flush=True)


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _persisted(x: da.Array) -> da.Array:
    xp = x.persist()
    wait(xp)
    return xp


def _session(store: str, **kw):
    with dask.config.set({"flowgpu.spill.store": store}):
        return fg.Session(dashboard_address=None, **kw)


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in GiB (Linux; empty elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            return {k: int(v.split()[0]) / 2**20 for k, v in (line.split(":", 1) for line in f)}
    except OSError:
        return {}


def _worker_memory(dask_worker=None) -> dict:
    data = dask_worker.data
    pool = getattr(data, "pool", None)
    out = {"pinned_pool": pool.stats() if pool is not None else None}
    try:
        out["cupy_pool_total_gib"] = import_cupy().get_default_memory_pool().total_bytes() / 2**30
    except Exception:
        pass
    out["staging_pool"] = staging._pool.stats() if staging._pool is not None else None
    out["keys"] = len(data)
    return out


def _print_host_memory(client, store: str) -> None:
    m = _meminfo()
    host = ", ".join(f"{k} {m[k]:.1f}" for k in ("MemFree", "Cached", "Dirty", "Writeback", "Mlocked",
                                                  "AnonHugePages") if k in m)
    workers = client.run(_worker_memory)
    print(f"{store} before the npy pass: host GiB: {host}; worker: {workers}", flush=True)


def _passes(fn, n: int) -> tuple[list[float], list[float]]:
    """Run ``fn`` ``n`` times, no warm-up (each cluster warmed up on a few chunks): (the seconds of
    each run, each result)."""
    t = harness.timed(fn, n, warmup=0, keep=True)
    return t.times, t.values


def _pass_row(workload: str, store: str, key: str, nbytes: int, times: list[float], results: list[float]) -> dict:
    t = float(np.median(times))
    row = dict(workload=workload, store=store, key=key, seconds=t, gbps=nbytes / t / 1e9, passes=times)
    if any(r != results[0] for r in results):
        row["identical"] = "no (the passes gave " + " / ".join(repr(r) for r in results) + ")"
    print(row, flush=True)
    return row


def setups(stores: list[str], gpus: list[int], protocols: list[str]) -> list[tuple[str, str, tuple, str]]:
    """``(store, label, gpus, protocol)`` of each cluster to run on: every store on the first GPU over
    TCP (labelled by the store alone), then on all of ``gpus`` over each protocol (``flowgpu 2 GPUs
    UCX``); the one-GPU TCP cluster only once."""
    out = []
    for store in stores:
        out.append((store, store, (gpus[0],), "tcp"))
        for protocol in protocols:
            if (len(gpus), protocol) != (1, "tcp"):
                n = len(gpus)
                out.append((store, f"{store} {n} GPU{'s' if n > 1 else ''}" + (" UCX" if protocol == "ucx" else ""),
                            tuple(gpus), protocol))
    return out


def run_gpu(size: str, workloads: list[str], stores: list[str], npy_dir: str, repeats: int = 3,
            gpu_list: list[int] = (0,), protocols: list[str] = ("tcp",)) -> list[dict]:
    p = SIZES[size]
    rows = []
    bw = pinned_h2d_gbps()
    rows.append(dict(workload="pinned host->device copy (1 GiB)", store="-", seconds=None, gbps=bw))
    print(f"pinned H2D: {bw:.1f} GB/s", flush=True)
    shape, chunks = p["chain"], (p["rows"], p["chain"][1])
    nbytes = shape[0] * shape[1] * 4
    tshape, tchunks = (p["tn"], p["tn"]), (p["tchunk"], p["tchunk"])
    results: dict[tuple[str, str], float] = {}
    npy_path = os.path.join(npy_dir, "out_of_core_x.npy")
    try:
        for store, label, gpus, protocol in setups(stores, gpu_list, protocols):
            threads = 4 if store == "flowgpu" else 1
            try:
                s = _session(store, backend="gpu", gpus=list(gpus), device_memory_limit=p["limit"],
                             threads_per_worker=threads, protocol=protocol)
            except Exception as e:  # UCX not installed, a GPU missing: the row says why
                rows.append(dict(workload=f"{len(gpus)} GPU(s), {protocol}", store=label, seconds=None,
                                 error=f"{type(e).__name__}: {e}".splitlines()[0][:300]))
                print(rows[-1], flush=True)
                continue
            with s:
                # compile the kernels first (two chunks, under the limit): the passes time moving data
                float(chain(fg.random((2 * chunks[0], shape[1]), dtype="float32", seed=1, chunks=chunks)).compute())
                float(transpose_sum(fg.random((2 * tchunks[0],) * 2, dtype="float32", seed=1, chunks=tchunks)).compute())
                if "chain" in workloads or "npy" in workloads:
                    x = fg.random(shape, dtype="float32", seed=42, chunks=chunks)
                    xp, t_persist = _timed(lambda: _persisted(x))  # noqa: B023
                    rows.append(dict(workload=f"persist {nbytes / GiB:.0f} GiB f32", store=label,
                                     seconds=t_persist, gbps=nbytes / t_persist / 1e9))
                    if "chain" in workloads:
                        with get_task_stream(s.client) as ts:
                            times, each = _passes(lambda: float(chain(xp).compute()), repeats)  # noqa: B023
                        _print_stream(label, ts.data)
                        results[("chain", label)] = each[0]
                        rows.append(_pass_row(f"chain+sum, {nbytes / GiB:.0f} GiB persisted", label, "chain", nbytes,
                                              times, each))
                    if "npy" in workloads and not os.path.exists(npy_path):
                        _, t = _timed(lambda: fg.to_npy(xp, npy_path, overwrite=True))
                        os.sync()  # written back: the timed reads below do not compete with writeback
                        print(f"wrote {npy_path} in {t:.1f} s", flush=True)
                    del x, xp
                    _wait_released(s.client)
                if "npy" in workloads:
                    # the read path's one-time costs (staging buffers for every thread, its kernels)
                    float(chain(npy_array(store, npy_path, chunks)[:max(2, threads) * chunks[0]]).compute())
                    _print_host_memory(s.client, label)
                    y = npy_array(store, npy_path, chunks)
                    times, each = _passes(lambda: float(chain(y).compute()), repeats)  # noqa: B023
                    results[("npy", label)] = each[0]
                    rows.append(_pass_row(f"chain+sum, {nbytes / GiB:.0f} GiB from host .npy", label, "npy", nbytes,
                                          times, each))
                if "transpose" in workloads:
                    z = _persisted(fg.random(tshape, dtype="float32", seed=7, chunks=tchunks))
                    times, each = _passes(lambda: float(transpose_sum(z).compute()), repeats)  # noqa: B023
                    results[("transpose", label)] = each[0]
                    rows.append(_pass_row(f"(x + x.T).sum(), {tshape[0]}² f32 persisted", label, "transpose",
                                          tshape[0] * tshape[1] * 4, times, each))
                    del z
                moves = summary(s.client.run(stats))
                if moves["moves"]:
                    print(f"{label} store moves: {moves}", flush=True)
    finally:
        if os.path.exists(npy_path):
            os.remove(npy_path)
    # the same computations held in device memory, on this process's GPU, for bit-identity. Every
    # store above runs on a flowgpu Session (only the spill store differs), which fuses: the reference
    # is fused too (a fused sum adds in NumPy's pairwise order, CuPy's own sum in another, so plain
    # CuPy differs in float32's last bits: 8232009728 against 8232010240 at 8 GiB on the H200)
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}), fusing():
        ref = {}
        if "chain" in workloads or "npy" in workloads:
            ref["chain"] = ref["npy"] = float(chain(fg.random(shape, dtype="float32", seed=42, chunks=chunks)).compute())
        if "transpose" in workloads:
            ref["transpose"] = float(transpose_sum(fg.random(tshape, dtype="float32", seed=7, chunks=tchunks)).compute())
    for row in rows:
        r = results.get((row.get("key"), row["store"]))
        if r is not None and "identical" not in row:
            row["identical"] = "yes" if r == ref[row["key"]] else f"no ({r!r} vs {ref[row['key']]!r})"
    _ratios(rows, bw)
    return rows


def run_cpu(size: str = "full") -> list[dict]:
    total, chunk, limit = (CPU_SIZES[size][k] for k in ("total", "chunk", "limit"))
    rows = []
    n = total // 8
    x = da.random.default_rng(3).standard_normal(n, chunks=chunk)  # 32 MiB chunks of float64 at full size
    want = None
    for store in ("flowgpu", "dask"):
        with _session(store, backend="cpu", n_workers=2, threads_per_worker=1, memory_limit=limit):
            xp, t_persist = _timed(lambda: _persisted(x))
            r, t = _timed(lambda: float(chain(xp).compute()))  # noqa: B023
            del xp
            rows.append(dict(workload=f"persist {total / GiB:.0f} GiB f64, 2 x {limit}", store=store,
                             seconds=t_persist, gbps=total / t_persist / 1e9))
            rows.append(dict(workload=f"chain+sum {total / GiB:.0f} GiB, 2 x {limit}", store=store,
                             seconds=t, gbps=total / t / 1e9, passes=[t]))
            want = r if want is None else want
            rows[-1]["identical"] = "yes" if r == want else f"no ({r!r} vs {want!r})"
            print(rows[-2], rows[-1], flush=True)
    _ratios(rows, None)
    return rows


def _ratios(rows: list[dict], bw: float | None) -> None:
    """Speed-up of flowgpu over the cluster's own store on the same setup (GPUs, protocol), and of
    each setup over the same store on one GPU (``vs 1 GPU``)."""
    def split(label: str) -> tuple[str, str]:
        store, _, setup = label.partition(" ")
        return store, setup

    times = {(r["workload"], *split(r["store"])): r["seconds"] for r in rows if r.get("seconds")}
    for r in rows:
        if not r.get("seconds"):
            continue
        store, setup = split(r["store"])
        base = next((times.get((r["workload"], s, setup)) for s in ("dask-cuda", "dask")
                     if (r["workload"], s, setup) in times), None)
        if store == "flowgpu" and base:
            r["speedup"] = base / r["seconds"]
        one = times.get((r["workload"], store, ""))
        if setup and one:
            r["vs_one_gpu"] = one / r["seconds"]
        if bw and r.get("gbps") and r["store"] != "-":
            r["of_pinned"] = r["gbps"] / bw


def table(rows: list[dict]) -> str:
    head = ("| workload | store | seconds (median) | GB/s | % of pinned H2D | speed-up vs default | vs 1 GPU "
            "| bit-identical | each pass (s) |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = functools.partial(harness.cell, r)
        lines.append(f"| {r['workload']} | {r['store']} | {f('seconds', '{:.2f}')} | {f('gbps', '{:.1f}')} | "
                     f"{f('of_pinned', '{:.0%}')} | {f('speedup', '{:.1f}x')} | {f('vs_one_gpu', '{:.2f}x')} | "
                     f"{r.get('identical', r.get('error', ''))} | "
                     + " / ".join(f"{t:.2f}" for t in r.get("passes", ())) + " |")
    return "\n".join(lines)


def parser():
    p = harness.parser(__spec__.name, __doc__, cpu="the CPU comparison (2 workers x 600 MB) instead of the GPU",
                       size="small: a quarter of the data (GPU), 2 GiB under 2 x 600 MB (CPU)", repeats=3)
    p.add_argument("--workloads", default="chain,npy,transpose", help="GPU: comma-separated, of chain, npy, transpose")
    p.add_argument("--stores", default="flowgpu,dask-cuda", help="GPU: comma-separated, of flowgpu, dask-cuda")
    p.add_argument("--npy-dir", default=None, help="where the temporary .npy goes (default: a temp dir)")
    p.add_argument("--gpus", type=harness.ints, default=None, metavar="0,1",
                   help="GPU: also run each store on these GPUs together (one worker each, the same device limit "
                        "per GPU); the one-GPU rows use the first")
    p.add_argument("--protocols", default=None, metavar="tcp,ucx",
                   help="GPU, with --gpus: the protocols of the several-GPU clusters (default tcp,ucx)")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    report = harness.Report(a, argv)
    if a.cpu:
        rows = run_cpu(a.size)
    else:
        d = a.npy_dir or tempfile.mkdtemp(prefix="flowgpu-bench-")
        try:
            protocols = (a.protocols or ("tcp,ucx" if a.gpus else "tcp")).split(",")
            rows = run_gpu(a.size, a.workloads.split(","), a.stores.split(","), d, a.repeats,
                           a.gpus or [0], protocols)
        finally:
            if a.npy_dir is None:
                shutil.rmtree(d, ignore_errors=True)
    report.finish(text=table(rows), title=f"out of core, {'cpu' if a.cpu else 'gpu'}, size {a.size}", results=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
