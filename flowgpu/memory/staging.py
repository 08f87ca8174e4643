"""Host-resident chunks to the device through pinned staging buffers.

Copying a pageable NumPy array to the device runs at a fraction of PCIe speed (6 GB/s on an
H200 against 55 GB/s from pinned memory). :func:`to_device_staged` instead copies the block
in slices into two pinned buffers taken from a pool, alternating: while slice *i* travels
to the device asynchronously, slice *i+1* is copied (by NumPy, without the GIL) into the
other buffer. A memory-mapped ``.npy`` slice given directly is read from the page cache
straight into pinned memory: one host copy, never a whole chunk of pageable memory.

The copies run on the calling thread's current CUDA stream (its per-thread default stream
when ``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1``), so several worker threads stage at once.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from flowgpu.backend import import_cupy
from flowgpu.memory.pinned import PinnedPool

__all__ = ["to_device_staged", "file_rows_to_device", "plan_slices", "staging_pool", "STAGING_BYTES"]

STAGING_BYTES = 64 << 20  # per staging buffer; two per calling thread

_pool: PinnedPool | None = None
_pool_lock = threading.Lock()


def staging_pool() -> PinnedPool:
    """The process-wide pool staging buffers come from (at most 64 staging pairs)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = PinnedPool(capacity=128 * STAGING_BYTES)
        return _pool


def plan_slices(shape: tuple, itemsize: int, budget: int = STAGING_BYTES) -> list[tuple[int, int]]:
    """Row ranges ``[(start, stop), ...]`` along axis 0, each at most ``budget`` bytes (one row at least).

    Examples
    --------
    >>> plan_slices((10, 4), 8, budget=96)
    [(0, 3), (3, 6), (6, 9), (9, 10)]
    """
    if len(shape) == 0:
        return [(0, 1)]
    rows = shape[0]
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * itemsize
    step = max(1, budget // max(row_bytes, 1))
    return [(r, min(r + step, rows)) for r in range(0, rows, step)] or [(0, 0)]


def to_device_staged(block: Any, *, budget: int = STAGING_BYTES, pool: PinnedPool | None = None):
    """Copy a host array (NumPy, a memory-mapped slice, anything ``np.asarray`` takes) to a
    C-ordered CuPy array through two alternating pinned staging buffers.

    Parameters
    ----------
    block : the host data; read once.
    budget : bytes per staging slice (at least one row along axis 0).
    pool : where the staging buffers come from (default: :func:`staging_pool`).

    Returns
    -------
    cupy.ndarray with the block's shape and dtype; complete on the caller's current stream.
    """
    if not isinstance(block, np.ndarray):
        block = np.asarray(block)
    if block.dtype.hasobject:
        raise TypeError(f"cannot copy an object array ({block.dtype}) to the device")
    src = block.reshape(1) if block.ndim == 0 else block

    def fill(staged: np.ndarray, a: int, b: int) -> None:
        np.copyto(staged, src[a:b], casting="no")

    return _staged(block.shape, block.dtype, src.shape, fill, budget, pool)


def file_rows_to_device(path: str, offset: int, shape: tuple, dtype: Any, *, budget: int = STAGING_BYTES,
                        pool: PinnedPool | None = None):
    """Read ``shape`` (C order) from ``path`` at byte ``offset`` straight into pinned staging
    buffers with ``os.preadv`` (no memory map: no page faults, no pageable copy) and on to the
    device, reading slice *i+1* while slice *i* travels.

    Returns a C-ordered CuPy array, complete on the caller's current stream.
    """
    import os

    dtype = np.dtype(dtype)
    flat = (1,) if len(shape) == 0 else tuple(shape)
    row_bytes = int(np.prod(flat[1:], dtype=np.int64)) * dtype.itemsize
    fd = os.open(path, os.O_RDONLY)
    try:
        def fill(staged: np.ndarray, a: int, b: int) -> None:
            want = (b - a) * row_bytes
            view = memoryview(staged.reshape(-1).view(np.uint8))
            got = 0
            while got < want:
                n = os.preadv(fd, [view[got:want]], offset + a * row_bytes + got)
                if n <= 0:
                    raise OSError(f"{path}: file ended {want - got} bytes early at offset {offset + a * row_bytes + got}")
                got += n

        return _staged(tuple(shape), dtype, flat, fill, budget, pool)
    finally:
        os.close(fd)


def _staged(shape: tuple, dtype: np.dtype, flat: tuple, fill, budget: int, pool: PinnedPool | None):
    """The double-buffered loop: ``fill(staged, a, b)`` writes rows [a, b) of ``flat`` into a pinned slice."""
    cp = import_cupy()
    out = cp.empty(shape, dtype=dtype)
    if out.size == 0:
        return out
    slices = plan_slices(flat, dtype.itemsize, budget)
    row_bytes = int(np.prod(flat[1:], dtype=np.int64)) * dtype.itemsize
    largest = max(b - a for a, b in slices) * row_bytes
    pool = pool or staging_pool()
    stream = cp.cuda.get_current_stream()
    bufs = [pool.take(largest), pool.take(largest)] if len(slices) > 1 else [pool.take(largest)]
    events = [None] * len(bufs)
    try:
        for i, (a, b) in enumerate(slices):
            j = i % len(bufs)
            buf = bufs[j]
            if events[j] is not None:
                events[j].synchronize()  # the copy that last read this buffer is done
            n = (b - a) * row_bytes
            fill(buf.array((b - a, *flat[1:]), dtype), a, b)
            dst = out.data.ptr + a * row_bytes
            if buf.pinned:
                cp.cuda.runtime.memcpyAsync(dst, buf.ptr, n, cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
            else:  # pageable fallback: the copy is synchronous with respect to the host
                cp.cuda.runtime.memcpy(dst, buf.ptr, n, cp.cuda.runtime.memcpyHostToDevice)
            ev = cp.cuda.Event(disable_timing=True)
            ev.record(stream)
            events[j] = ev
        for ev in events:
            if ev is not None:
                ev.synchronize()
    finally:
        for buf in bufs:
            pool.give(buf)
    return out
