"""The out-of-core workloads and their data: the graphs, the ``.npy`` inputs of each store, the
pinned host-to-device rate they are measured against. Shared by :mod:`benchmarks.out_of_core.run`
and :mod:`benchmarks.probes.out_of_core`."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np

import flowgpu as fg
from flowgpu.backend import import_cupy
from flowgpu.io.npy import NpyReader
from flowgpu.transfer.pinned import PinnedPool

GiB = 1 << 30


def chain(a):
    return ((a * 2 + 1) ** 2 - a).sum()


def transpose_sum(a):
    return (a + a.T).sum()


def pinned_h2d_gbps(nbytes: int = GiB, reps: int = 5) -> float:
    """Median host-to-device bandwidth of one pinned copy of ``nbytes``."""
    cp = import_cupy()
    pool = PinnedPool()
    buf = pool.take(nbytes)
    buf.view[:] = 7
    dev = cp.empty(nbytes, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, buf.ptr, nbytes, cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    del dev
    pool.give(buf)
    pool.trim()
    return nbytes / float(np.median(times)) / 1e9


def dask_from_npy(path: str, chunks) -> da.Array:
    """What a dask-cuda user gets without flowgpu's staging: each chunk read into pageable host
    memory (a memory map, one copy; only the path in the graph) and moved with ``cupy.asarray``."""
    cp = import_cupy()
    r = NpyReader(path)
    x = da.from_array(r, chunks=chunks, asarray=False, meta=np.empty((0,) * r.ndim, r.dtype),
                      name=f"dask-npy-{dask.base.tokenize(path, chunks)}")
    return x.map_blocks(cp.asarray, dtype=r.dtype, meta=cp.empty((0,) * r.ndim, r.dtype))


def npy_array(store: str, path: str, chunks) -> da.Array:
    """flowgpu: ``fg.from_npy``, read into pinned staging buffers (``os.preadv``) and on to the
    device; dask-cuda: :func:`dask_from_npy`."""
    return fg.from_npy(path, chunks=chunks) if store == "flowgpu" else dask_from_npy(path, chunks)
