"""Compressed Zarr straight to the GPU: flowgpu's device path side by side with dask-cuda's ``da.from_zarr``.

GPU (one H200, one run): 32 GiB of float32, a smooth field plus noise on a grid of whole numbers
(compresses about 2-4x, never zeros), generated on the device, is

* written as a Zarr 3 store with zstd and with lz4, 1 GiB shards of 64 KiB chunks (what
  ``flowgpu convert`` writes on an H200; ``--chunk-mib`` picks another inner chunk): flowgpu
  encodes on the device (nvCOMP) and writes through pinned buffers; dask-cuda copies each shard
  to the host and lets zarr encode it (``da.to_zarr`` of ``x.map_blocks(cupy.asnumpy)``, its dask
  chunks whole shards so that its write is safe; its store is read back and checked);
* read back by ``((x*2+1)**2 - x).sum()``: flowgpu's ``from_zarr`` (compressed bytes to the device,
  nvCOMP decodes) against ``da.from_zarr(...).map_blocks(cupy.asarray)`` on a dask-cuda cluster,
  both over flowgpu's store; the effective rate is uncompressed bytes / seconds, set against the
  pinned host-to-device bandwidth measured in the same run; the file is in the page cache (it was
  just written), and with ``--cold`` the page cache is dropped before each read pass where the
  machine lets us;
* every result compared with the same pass over the array held in device memory (bit-identical),
  and the first and last shard of flowgpu's store read by zarr-python on the CPU and compared with
  the data (is the store right for other readers, not only for flowgpu's).

Each measurement is one warm-up pass (kernels compiled, nvCOMP codecs made, pinned staging
buffers allocated) and then ``--repeats`` timed passes (dask-cuda: ``--dask-repeats``); the table
gives the median, stderr each pass with the storage counters of flowgpu's passes (bytes read,
compressed bytes moved, seconds of reading, decoding or encoding summed over the tasks), so a run
shows where the time goes.

Run::

    python -m benchmarks.out_of_core.zarr_device                 # 32 GiB, both codecs
    python -m benchmarks.out_of_core.zarr_device --size small    # 4 GiB, a quick check
    python -m benchmarks.out_of_core.zarr_device --codecs lz4 --dir /scratch
    python -m benchmarks.out_of_core.zarr_device --chunk-mib 1   # 1 MiB inner chunks
    python -m benchmarks.out_of_core.zarr_device --dask-chunk-mib 4   # dask-cuda also on a store of 4 MiB chunks
    python -m benchmarks.out_of_core.zarr_device --read-group-mib 128   # decode overlapped with reads
    python -m benchmarks.out_of_core.zarr_device --reader kvikio   # kvikio's file reader instead

The markdown table comes last in the output.
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import dask
import dask.array as da
import numpy as np
import zarr

import flowgpu as fg
import flowgpu.config  # noqa: F401 - flowgpu's defaults before setting one of them
from benchmarks import harness
from benchmarks.out_of_core.data import chain, pinned_h2d_gbps
from flowgpu.backend import import_cupy
from flowgpu.io.zarrwrite import create, inner_chunks

GiB = 1 << 30
SIZES = {"full": (65536, 131072), "small": (8192, 131072)}  # float32: 32 GiB, 4 GiB
SHARD_ROWS = 2048  # 1 GiB shards (rows of 512 KiB)


def _field_block(block_info=None, seed: int = 0):
    cp = import_cupy()
    (r0, r1), (c0, c1) = block_info[None]["array-location"]
    rng = cp.random.default_rng(seed + r0)
    i = cp.arange(r0, r1, dtype=cp.float32)[:, None]
    j = cp.arange(c0, c1, dtype=cp.float32)[None, :]
    smooth = cp.sin(i * 3e-4) * cp.cos(j * 7e-5) * 1000
    return cp.rint(smooth + rng.standard_normal((r1 - r0, c1 - c0), dtype=cp.float32) * 4).astype(cp.float32)


def field(shape: tuple) -> da.Array:
    """The benchmark's data, on the device, in 1 GiB row blocks (the stores' shards)."""
    cp = import_cupy()
    return da.map_blocks(_field_block, chunks=((SHARD_ROWS,) * (shape[0] // SHARD_ROWS), (shape[1],)),
                         dtype=np.float32, meta=cp.empty((0, 0), cp.float32))


def _drop_caches() -> str:
    try:
        subprocess.run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "cold (page cache dropped)"
    except OSError as e:
        return f"page cache (could not drop it: {e.strerror})"


def _storage(session) -> dict:
    """flowgpu's storage counters summed over the workers: ``{activity: {bytes, count, seconds}}``."""
    st = session.memory_summary() if session is not None else None
    return {k.removeprefix("storage_"): v for k, v in ((st or {}).get("moves") or {}).items()
            if k.startswith("storage_")}


def _delta(after: dict, before: dict) -> dict:
    out = {}
    for k, v in after.items():
        b = before.get(k, {})
        d = {f: v.get(f, 0) - b.get(f, 0) for f in ("bytes", "count", "seconds")}
        if d["bytes"] or d["count"]:
            out[k] = d
    return out


def _counters_text(d: dict) -> str:
    return "; ".join(f"{k} {v['bytes'] / 1e9:.2f} GB in {v['count']} ({v['seconds']:.3f} s summed)"
                     for k, v in sorted(d.items())) or "no storage counters"


def _passes(what: str, fn, repeats: int, session=None, before_each=None, after_each=None) -> tuple[list, list, list]:
    """One untimed warm-up call of ``fn(i)`` (i = -1), then ``repeats`` timed ones; each pass to stderr.
    Returns ``(results, seconds, storage counters)`` of the timed passes."""
    if before_each:
        before_each()
    fn(-1)
    if after_each:
        after_each(-1)
    results, times, counters = [], [], []
    for i in range(repeats):
        state = before_each() if before_each else None
        c0 = _storage(session)
        t0 = time.perf_counter()
        results.append(fn(i))
        times.append(time.perf_counter() - t0)
        counters.append(_delta(_storage(session), c0))
        if after_each:
            after_each(i)
        print(f"  {what}: pass {i + 1}/{repeats}: {times[-1]:.3f} s{f' ({state})' if state else ''}; "
              f"{_counters_text(counters[-1])}", file=sys.stderr, flush=True)
    return results, times, counters


def _row(workload: str, store: str, nbytes: int, times: list, counters: list | None = None, **extra) -> dict:
    t = statistics.median(times)
    row = dict(workload=workload, store=store, seconds=t, passes=[round(s, 4) for s in times],
               gbps=nbytes / t / 1e9, **extra)
    if counters:  # those of the pass nearest the median
        row["storage"] = counters[min(range(len(times)), key=lambda i: abs(times[i] - t))]
    return row


def _identical(results: list, want: float) -> str:
    bad = [r for r in results if r != want]
    return "yes" if not bad else f"no ({len(bad)} of {len(results)} passes; {bad[0]!r} vs {want!r})"


def _dask_cuda_write(x: da.Array, path: str, codec: str, chunks: tuple) -> None:
    """dask-cuda's write: whole shards per dask chunk (a dask chunk that splits a shard makes two
    tasks write one shard file, and one of them wins: the store is wrong)."""
    cp = import_cupy()
    shards = (SHARD_ROWS, x.shape[1])
    arr = create(path, x.shape, x.dtype, codec=codec, chunks=chunks, shards=shards)
    host = x.rechunk(shards).map_blocks(cp.asnumpy, dtype=x.dtype, meta=np.empty((0, 0), x.dtype))
    with dask.config.set({"array.chunk-size": f"{int(np.prod(shards)) * x.dtype.itemsize}B"}):
        da.to_zarr(host, arr)


def _dask_cuda_read(path: str) -> da.Array:
    cp = import_cupy()
    arr = zarr.open_array(path, mode="r")
    x = da.from_zarr(arr, chunks=arr.shards or arr.chunks)  # a task per shard, as flowgpu reads it
    return x.map_blocks(cp.asarray, dtype=x.dtype, meta=cp.empty((0, 0), x.dtype))


def _zarr_reads_it_right(path: str, shape: tuple) -> str:
    """zarr-python on the CPU reads the first and the last shard of ``path`` as the data."""
    arr = zarr.open_array(path, mode="r")
    bad = []
    for r0 in (0, shape[0] - SHARD_ROWS):
        want = import_cupy().asnumpy(_field_block({None: {"array-location": [(r0, r0 + SHARD_ROWS), (0, shape[1])]}}))
        got = arr[r0:r0 + SHARD_ROWS]
        if not np.array_equal(got, want):
            i = tuple(int(v) for v in np.argwhere(got != want)[0])
            bad.append(f"rows {r0}+: first difference at {(i[0] + r0, i[1])}: {got[i]!r} vs {want[i]!r}")
    return "yes" if not bad else "no (" + "; ".join(bad) + ")"


def _session(store: str):
    with dask.config.set({"flowgpu.spill.store": store}):
        return fg.Session(backend="gpu", dashboard_address=None)


def _size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def run(size: str, codecs: list[str], folder: str, cold: bool, repeats: int = 3, chunk_mib: float = 1 / 16,
        dask_repeats: int = 1, read_group_mib: float | None = None, dask_chunk_mib: float | None = None,
        skip_dask: bool = False) -> list[dict]:
    shape = SIZES[size]
    nbytes = int(np.prod(shape)) * 4
    chunks = inner_chunks((SHARD_ROWS, shape[1]), 4, int(chunk_mib * (1 << 20)))
    theirs_chunks = inner_chunks((SHARD_ROWS, shape[1]), 4, int(dask_chunk_mib * (1 << 20))) if dask_chunk_mib else chunks
    layout = f"{SHARD_ROWS * shape[1] * 4 / GiB:.0f} GiB shards of {chunk_mib:g} MiB chunks {list(chunks)}" + \
        (f", shards read in groups of {read_group_mib:g} MiB" if read_group_mib else "")
    group = int(read_group_mib * (1 << 20)) if read_group_mib else None
    print(f"layout: {layout}", file=sys.stderr, flush=True)
    rows = [dict(workload="pinned host->device copy (1 GiB)", store="-", gbps=pinned_h2d_gbps())]
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}):
        want = float(chain(field(shape)).compute())  # the pass over the array in device memory
    import_cupy().get_default_memory_pool().free_all_blocks()  # this process's pool: not the workers' room
    state = _drop_caches if cold else (lambda: "page cache")
    label = "cold" if cold else "page cache"
    for codec in codecs:
        ours = os.path.join(folder, f"{codec}.zarr")
        paths = {i: os.path.join(folder, f"{codec}-{i + 1}.zarr") for i in range(-1, max(repeats, dask_repeats))}

        def drop(i, paths=paths):
            shutil.rmtree(paths[i], ignore_errors=True)

        with _session("flowgpu") as s:
            _, t, c = _passes(f"flowgpu write {codec}", lambda i: fg.to_zarr(  # noqa: B023
                field(shape), paths[i], codec=codec, chunks=chunks, shards=(SHARD_ROWS, shape[1])),  # noqa: B023
                repeats, s, after_each=lambda i: os.rename(paths[i], ours) if i == repeats - 1 else drop(i))  # noqa: B023
            rows.append(_row(f"write {nbytes / GiB:.0f} GiB, {codec}", "flowgpu", nbytes, t, c,
                             ratio=nbytes / _size(ours), zarr_reads_it=_zarr_reads_it_right(ours, shape)))
            def ours_pass(i, ours=ours):
                with dask.config.set({"flowgpu.zarr.read-group": group}):  # the reader takes it into the graph
                    x = fg.from_zarr(ours)
                return float(chain(x).compute())

            got, t, c = _passes(f"flowgpu chain+sum {codec}", ours_pass, repeats, s, before_each=state)
            rows.append(_row(f"chain+sum over {codec} store ({label})", "flowgpu", nbytes,
                             t, c, identical=_identical(got, want)))
        theirs = os.path.join(folder, f"{codec}-dask.zarr")
        if skip_dask:
            shutil.rmtree(ours, ignore_errors=True)
            continue
        with _session("dask-cuda"):
            _, t, _ = _passes(f"dask-cuda write {codec}", lambda i: _dask_cuda_write(  # noqa: B023
                field(shape), paths[i], codec, theirs_chunks), dask_repeats,  # noqa: B023
                after_each=lambda i: os.rename(paths[i], theirs) if i == dask_repeats - 1 else drop(i))  # noqa: B023
            check = float(chain(_dask_cuda_read(theirs)).compute())
            rows.append(_row(f"write {nbytes / GiB:.0f} GiB, {codec}", "dask-cuda", nbytes, t,
                             identical=f"read back: {_identical([check], want)}"))
            if dask_chunk_mib:  # dask-cuda on the store it wrote, in the chunks zarr-python on a CPU reads best
                got, t, _ = _passes(f"dask-cuda chain+sum {codec}, {dask_chunk_mib:g} MiB chunks",
                                    lambda i: float(chain(_dask_cuda_read(theirs)).compute()),  # noqa: B023
                                    dask_repeats, before_each=state)
                rows.append(_row(f"chain+sum over dask-cuda's {codec} store of {dask_chunk_mib:g} MiB chunks ({label})",
                                 "dask-cuda", nbytes, t, identical=_identical(got, want)))
            shutil.rmtree(theirs, ignore_errors=True)
            got, t, _ = _passes(f"dask-cuda chain+sum {codec}",
                                lambda i: float(chain(_dask_cuda_read(ours)).compute()), dask_repeats,  # noqa: B023
                                before_each=state)
            rows.append(_row(f"chain+sum over {codec} store ({label})", "dask-cuda",
                             nbytes, t, identical=_identical(got, want)))
        shutil.rmtree(ours, ignore_errors=True)
    base = {r["workload"]: r["seconds"] for r in rows if r["store"] == "dask-cuda"}
    bw = rows[0]["gbps"]
    for r in rows:
        if r["store"] == "flowgpu" and r["workload"] in base:
            r["speedup"] = base[r["workload"]] / r["seconds"]
        if r["store"] != "-" and r.get("gbps"):
            r["of_pinned"] = r["gbps"] / bw
    return rows


def table(rows: list[dict]) -> str:
    head = ("| workload | store | seconds (median) | passes | GB/s (uncompressed) | vs pinned H2D | "
            "speed-up vs dask-cuda | ratio | bit-identical | zarr-python reads the store |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = functools.partial(harness.cell, r)
        passes = " ".join(f"{p:.3f}" for p in r.get("passes", []))
        lines.append(f"| {r['workload']} | {r['store']} | {f('seconds', '{:.3f}')} | {passes} | {f('gbps', '{:.1f}')} | "
                     f"{f('of_pinned', '{:.0%}')} | {f('speedup', '{:.1f}x')} | {f('ratio', '{:.2f}x')} | "
                     f"{r.get('identical', '')} | {r.get('zarr_reads_it', '')} |")
    storage = [f"- {r['workload']}, {r['store']} (median pass): {_counters_text(r['storage'])}"
               for r in rows if r.get("storage")]
    return "\n".join(lines + ([""] + storage if storage else []))


def parser():
    p = harness.parser(__spec__.name, __doc__, size="small: 4 GiB instead of 32 GiB", repeats=3)
    p.add_argument("--codecs", default="zstd,lz4", help="comma-separated, of zstd, lz4")
    p.add_argument("--dir", default=None, help="where the stores go (default: a temp dir; about 40 GB at full size)")
    p.add_argument("--cold", action="store_true", help="drop the page cache before each read pass (needs root)")
    p.add_argument("--dask-repeats", type=int, default=1,
                   help="timed dask-cuda passes after its warm-up (default 1: its 32 GiB write takes minutes)")
    p.add_argument("--chunk-mib", type=float, default=1 / 16,
                   help="inner chunk size in MiB (default 1/16: 64 KiB, pieces of a 512 KiB row; at most 16)")
    p.add_argument("--dask-chunk-mib", type=float, default=None,
                   help="dask-cuda writes its store in chunks of this many MiB and also reads that one "
                        "(default: the same layout as flowgpu's, and only flowgpu's store is read)")
    p.add_argument("--read-group-mib", type=float, default=None,
                   help="read each shard in parts of this many MiB, each decoded while the next is read "
                        "(flowgpu.zarr.read-group; default: one read per shard)")
    p.add_argument("--skip-dask", action="store_true",
                   help="flowgpu's passes only (dask-cuda's 32 GiB passes over a store of 64 KiB chunks take minutes)")
    p.add_argument("--reader", choices=("staging", "kvikio"), default="staging",
                   help="how flowgpu reads the chunk files (flowgpu.zarr.reader)")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    if not 0 < a.chunk_mib <= 16 or min(a.repeats, a.dask_repeats) < 1:
        parser().error("--chunk-mib must be in (0, 16], --repeats and --dask-repeats at least 1")
    report = harness.Report(a, argv)
    d = a.dir or tempfile.mkdtemp(prefix="flowgpu-zarr-bench-")
    try:
        with dask.config.set({"flowgpu.zarr.reader": a.reader}):
            rows = run(a.size, a.codecs.split(","), d, a.cold, a.repeats, a.chunk_mib, a.dask_repeats, a.read_group_mib,
                       a.dask_chunk_mib, a.skip_dask)
    finally:
        if a.dir is None:
            shutil.rmtree(d, ignore_errors=True)
    report.finish(text=table(rows), title=f"zarr straight to the GPU, size {a.size}, reader {a.reader}, "
                  f"{a.repeats} timed passes after a warm-up (median)", results=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
