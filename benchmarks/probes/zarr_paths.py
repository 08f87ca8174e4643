"""Two open questions of the compressed-Zarr benchmark, on one H200.

1. Where a device write's time goes: one 1 GiB unit (the benchmark's shard, 64 KiB chunks) through
   ``zarrwrite``'s phases on one thread, each timed: chunk table, nvCOMP encode with the gather
   and the copy to pinned memory, framing, the file write.
2. Why the dask-cuda passes of ``benchmarks.out_of_core.zarr_device`` come out wrong: the same
   ``chain`` over the same data on Sessions with each data store, fusion on and off, from device
   memory and from ``da.from_zarr(...).map_blocks(cupy.asarray)``, against the in-process result.

    python -m benchmarks.probes.zarr_paths
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import dask
import dask.array as da
import numpy as np
import zarr

import flowgpu as fg
from benchmarks import harness
from benchmarks.out_of_core.data import chain
from benchmarks.out_of_core.zarr_device import SHARD_ROWS, _field_block, field
from flowgpu.backend import import_cupy
from flowgpu.io import zarrwrite
from flowgpu.io.devcodec import plan_codec
from flowgpu.io.devices import device_for
from flowgpu.io.zarrwrite import create, inner_chunks


def write_phases(folder: str, codec: str) -> None:
    cp = import_cupy()
    shape = (SHARD_ROWS, 131072)
    block = _field_block({None: {"array-location": [(0, shape[0]), (0, shape[1])]}})
    chunks = inner_chunks(shape, 4)
    arr = create(os.path.join(folder, f"{codec}.zarr"), shape, np.float32, codec=codec, chunks=chunks, shards=shape)
    plan = plan_codec(arr)
    dev = device_for("nvcomp")
    room = zarrwrite.ZSTD_ROOM if plan.frame.algorithm == "Zstd" else 0
    for rep in range(3):
        cp.cuda.get_current_stream().synchronize()
        t = [time.perf_counter()]
        flat, offsets, coords = zarrwrite._chunks_of(block, plan, (0, 0), cp)
        t.append(time.perf_counter())
        host, starts, sizes = dev.pack(plan.frame.algorithm, flat, offsets, 4 * int(np.prod(chunks)), None,
                                       plan.frame.head, room)
        t.append(time.perf_counter())
        at, n = zarrwrite._frames(plan, host, starts, sizes, 4 * int(np.prod(chunks)))
        t.append(time.perf_counter())
        zarrwrite._write_unit(block, plan=plan, device="nvcomp", block_info={0: {"array-location": [(0, shape[0]),
                                                                                                (0, shape[1])]}})
        t.append(time.perf_counter())
        d = np.diff(t) * 1e3
        print(f"write {codec} rep {rep}: chunk table {d[0]:.1f} ms, pack (encode+gather+to host) {d[1]:.1f} ms, "
              f"frames {d[2]:.1f} ms, whole _write_unit {d[3]:.1f} ms; {len(offsets)} chunks, "
              f"{int(sizes.sum()) / 1e6:.0f} MB", flush=True)
    got = zarr.open_array(os.path.join(folder, f"{codec}.zarr"))[:64]
    print(f"  zarr reads it back: {np.array_equal(got, cp.asnumpy(block[:64]))}", flush=True)


def wrong_sums(folder: str) -> None:
    cp = import_cupy()
    shape = (8192, 131072)
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads"}):
        want = float(chain(field(shape)).compute())
    path = os.path.join(folder, "s.zarr")
    with dask.config.set({"flowgpu.spill.store": "flowgpu"}):
        with fg.Session(backend="gpu", dashboard_address=None):
            fg.to_zarr(field(shape), path, codec="lz4", chunks=inner_chunks((SHARD_ROWS, shape[1]), 4),
                       shards=(SHARD_ROWS, shape[1]))
    print(f"in process: {want!r}", flush=True)
    for store in ("dask-cuda", "flowgpu", "dask"):
        for fuse in (True, False):
            try:
                with dask.config.set({"flowgpu.spill.store": store}):
                    with fg.Session(backend="gpu", dashboard_address=None, fuse=fuse) as s:
                        env = s.client.run(lambda: os.environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"))
                        dev = [float(chain(field(shape)).compute()) for _ in range(2)]
                        a = zarr.open_array(path, mode="r")
                        x = da.from_zarr(a, chunks=a.shards).map_blocks(cp.asarray, dtype=a.dtype,
                                                                        meta=cp.empty((0, 0), a.dtype))
                        z = [float(chain(x).compute()) for _ in range(2)]
                        ok = ["ok" if v == want else f"WRONG {v!r}" for v in dev + z]
                        print(f"store {store}, fuse {fuse}, PTDS {set(env.values())}: device {ok[:2]}, "
                              f"from_zarr {ok[2:]}", flush=True)
            except Exception as e:  # noqa: BLE001 - a probe: say it and go on
                print(f"store {store}, fuse {fuse}: {type(e).__name__}: {e}", flush=True)


def main(argv=None) -> int:
    p = harness.parser(__spec__.name, __doc__)
    p.add_argument("--part", choices=("write", "sums", "both"), default="both")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        if a.part in ("write", "both"):
            for codec in ("zstd", "lz4"):
                write_phases(d, codec)
        if a.part in ("sums", "both"):
            wrong_sums(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
