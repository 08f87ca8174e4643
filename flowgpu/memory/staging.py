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

__all__ = ["to_device_staged", "plan_slices", "staging_pool", "STAGING_BYTES"]

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
    cp = import_cupy()
    if not isinstance(block, np.ndarray):
        block = np.asarray(block)
    if block.dtype.hasobject:
        raise TypeError(f"cannot copy an object array ({block.dtype}) to the device")
    out = cp.empty(block.shape, dtype=block.dtype)
    if block.size == 0:
        return out
    src = block.reshape(1) if block.ndim == 0 else block
    slices = plan_slices(src.shape, src.dtype.itemsize, budget)
    row_bytes = (src.nbytes // src.shape[0]) if src.shape[0] else 0
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
            staged = buf.array((b - a, *src.shape[1:]), src.dtype)
            np.copyto(staged, src[a:b], casting="no")
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
