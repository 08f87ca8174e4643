"""Moving chunks between the host (NumPy) and the device (CuPy), lazily, block by block."""

from __future__ import annotations

import dask.array as da
import numpy as np

from flowgpu.backend import current_backend, empty_meta, is_cupy
from flowgpu.transfer.staging import host_to_device

__all__ = ["to_device", "to_cupy", "to_host", "to_numpy"]


def _to_cupy_block(block):
    """One host block on the device, through pinned staging buffers when it is large enough."""
    return host_to_device(block)


_to_cupy_block.moves_to_device = True  # its result is on the device (flowgpu.fusion.device)


def _to_numpy_block(block):
    return block.get() if is_cupy(block) else np.asarray(block)


def to_device(x: da.Array) -> da.Array:
    """Chunks onto the session's compute device: CuPy on GPU sessions; unchanged on CPU sessions."""
    return to_cupy(x) if current_backend() == "cupy" else x


def to_cupy(x: da.Array) -> da.Array:
    """Chunks as CuPy arrays (lazy), whatever the session's backend."""
    if is_cupy(x._meta):
        return x
    return x.map_blocks(_to_cupy_block, dtype=x.dtype, meta=empty_meta(True, x.dtype, x.ndim))


def to_host(x: da.Array) -> da.Array:
    """Chunks as NumPy arrays in host memory (lazy)."""
    if not is_cupy(x._meta):
        return x
    return x.map_blocks(_to_numpy_block, dtype=x.dtype, meta=empty_meta(False, x.dtype, x.ndim))


def to_numpy(x: da.Array) -> np.ndarray:
    """Compute ``x`` and gather it into one NumPy array on this host."""
    return _to_numpy_block(to_host(x).compute())
