"""Compressed Zarr straight to the GPU: flowgpu's device path side by side with dask-cuda's ``da.from_zarr``.

GPU (one H200, one run): 32 GiB of float32, a smooth field plus noise on a grid of whole numbers
(compresses about 2-4x, never zeros), generated on the device, is

* written as a Zarr 3 store with zstd and with lz4, 1 GiB shards of 4 MiB chunks (what
  ``flowgpu convert`` writes on an H200): flowgpu encodes on the device (nvCOMP) and writes through
  pinned buffers; dask-cuda copies each chunk to the host and lets zarr encode it
  (``da.to_zarr`` of ``x.map_blocks(cupy.asnumpy)`` into the same layout);
* read back by ``((x*2+1)**2 - x).sum()``: flowgpu's ``from_zarr`` (compressed bytes to the device,
  nvCOMP decodes) against ``da.from_zarr(...).map_blocks(cupy.asarray)`` on a dask-cuda cluster;
  the effective rate is uncompressed bytes / seconds, set against the pinned host-to-device
  bandwidth measured in the same run; the file is in the page cache (it was just written), and
  with ``--cold`` the page cache is dropped before each read pass where the machine lets us;
* every result compared with the same pass over the array held in device memory (bit-identical).

Run::

    python -m benchmarks.out_of_core.zarr_device                 # 32 GiB, both codecs
    python -m benchmarks.out_of_core.zarr_device --size small    # 4 GiB, a quick check
    python -m benchmarks.out_of_core.zarr_device --codecs lz4 --dir /scratch
    python -m benchmarks.out_of_core.zarr_device --reader kvikio   # kvikio's file reader instead

The markdown table comes last in the output.
"""

from __future__ import annotations

import os
import shutil
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
from flowgpu.io.zarrwrite import create

GiB = 1 << 30
SIZES = {"full": (65536, 131072), "small": (8192, 131072)}  # float32: 32 GiB, 4 GiB
SHARD_ROWS, CHUNK_ROWS = 2048, 8  # 1 GiB shards of 4 MiB chunks (rows of 512 KiB)


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


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _dask_cuda_write(x: da.Array, path: str, codec: str) -> None:
    cp = import_cupy()
    arr = create(path, x.shape, x.dtype, codec=codec, chunks=(CHUNK_ROWS, x.shape[1]), shards=(SHARD_ROWS, x.shape[1]))
    da.to_zarr(x.map_blocks(cp.asnumpy, dtype=x.dtype, meta=np.empty((0, 0), x.dtype)), arr)


def _dask_cuda_read(path: str) -> da.Array:
    cp = import_cupy()
    arr = zarr.open_array(path, mode="r")
    x = da.from_zarr(arr, chunks=arr.shards or arr.chunks)  # a task per shard, as flowgpu reads it
    return x.map_blocks(cp.asarray, dtype=x.dtype, meta=cp.empty((0, 0), x.dtype))


def _session(store: str):
    with dask.config.set({"flowgpu.spill.store": store}):
        return fg.Session(backend="gpu", dashboard_address=None)


def run(size: str, codecs: list[str], folder: str, cold: bool) -> list[dict]:
    shape = SIZES[size]
    nbytes = int(np.prod(shape)) * 4
    rows = []
    bw = pinned_h2d_gbps()
    rows.append(dict(workload="pinned host->device copy (1 GiB)", store="-", gbps=bw))
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}):
        want = float(chain(field(shape)).compute())  # the pass over the array in device memory
    import_cupy().get_default_memory_pool().free_all_blocks()  # this process's pool: not the workers' room
    for codec in codecs:
        ours, theirs = os.path.join(folder, f"{codec}.zarr"), os.path.join(folder, f"{codec}-dask.zarr")
        with _session("flowgpu") as s:
            _, t = _timed(lambda: fg.to_zarr(field(shape), ours, overwrite=True, codec=codec,  # noqa: B023
                                             chunks=(CHUNK_ROWS, shape[1]), shards=(SHARD_ROWS, shape[1])))
            stored = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ours) for f in fs)
            rows.append(dict(workload=f"write {nbytes / GiB:.0f} GiB, {codec}", store="flowgpu", seconds=t,
                             gbps=nbytes / t / 1e9, ratio=nbytes / stored))
            state = _drop_caches() if cold else "page cache"
            got, t = _timed(lambda: float(chain(fg.from_zarr(ours)).compute()))  # noqa: B023
            rows.append(dict(workload=f"chain+sum over {codec} store ({state})", store="flowgpu", seconds=t,
                             gbps=nbytes / t / 1e9, identical="yes" if got == want else f"no ({got!r} vs {want!r})"))
            print(rows[-2], rows[-1], s.memory_summary(), flush=True)
        with _session("dask-cuda"):
            _, t = _timed(lambda: _dask_cuda_write(field(shape), theirs, codec))  # noqa: B023
            rows.append(dict(workload=f"write {nbytes / GiB:.0f} GiB, {codec}", store="dask-cuda", seconds=t,
                             gbps=nbytes / t / 1e9))
            shutil.rmtree(theirs, ignore_errors=True)
            state = _drop_caches() if cold else "page cache"
            got, t = _timed(lambda: float(chain(_dask_cuda_read(ours)).compute()))  # noqa: B023
            rows.append(dict(workload=f"chain+sum over {codec} store ({state})", store="dask-cuda", seconds=t,
                             gbps=nbytes / t / 1e9, identical="yes" if got == want else f"no ({got!r} vs {want!r})"))
            print(rows[-2], rows[-1], flush=True)
        shutil.rmtree(ours, ignore_errors=True)
    base = {r["workload"]: r["seconds"] for r in rows if r["store"] == "dask-cuda"}
    for r in rows:
        if r["store"] == "flowgpu" and r["workload"] in base:
            r["speedup"] = base[r["workload"]] / r["seconds"]
        if r["store"] != "-" and r.get("gbps"):
            r["of_pinned"] = r["gbps"] / bw
    return rows


def table(rows: list[dict]) -> str:
    head = "| workload | store | seconds | GB/s (uncompressed) | vs pinned H2D | speed-up vs dask-cuda | ratio | bit-identical |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        def f(k, fmt):
            v = r.get(k)
            return fmt.format(v) if isinstance(v, (int, float)) else (v or "")

        lines.append(f"| {r['workload']} | {r['store']} | {f('seconds', '{:.2f}')} | {f('gbps', '{:.1f}')} | "
                     f"{f('of_pinned', '{:.0%}')} | {f('speedup', '{:.1f}x')} | {f('ratio', '{:.2f}x')} | "
                     f"{r.get('identical', '')} |")
    return "\n".join(lines)


def parser():
    p = harness.parser(__spec__.name, __doc__, size="small: 4 GiB instead of 32 GiB")
    p.add_argument("--codecs", default="zstd,lz4", help="comma-separated, of zstd, lz4")
    p.add_argument("--dir", default=None, help="where the stores go (default: a temp dir; about 20 GB at full size)")
    p.add_argument("--cold", action="store_true", help="drop the page cache before each read pass (needs root)")
    p.add_argument("--reader", choices=("staging", "kvikio"), default="staging",
                   help="how flowgpu reads the chunk files (flowgpu.zarr.reader)")
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    report = harness.Report(a, argv)
    d = a.dir or tempfile.mkdtemp(prefix="flowgpu-zarr-bench-")
    try:
        with dask.config.set({"flowgpu.zarr.reader": a.reader}):
            rows = run(a.size, a.codecs.split(","), d, a.cold)
    finally:
        if a.dir is None:
            shutil.rmtree(d, ignore_errors=True)
    report.finish(text=table(rows), title=f"zarr straight to the GPU, size {a.size}, reader {a.reader}", results=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
