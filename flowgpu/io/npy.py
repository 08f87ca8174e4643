"""``.npy`` files: memory-mapped chunked reads and parallel chunked writes."""

from __future__ import annotations

import os
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.arrays.chunks import resolve_chunks
from flowgpu.arrays.movement import to_device, to_host
from flowgpu.errors import ConfigError
from flowgpu.io.atomic import atomic_output

__all__ = ["from_npy", "to_npy", "NpyReader"]


class NpyReader:
    """Reads slices of a ``.npy`` file through a memory map opened in the task that reads them.

    Only the path travels in the task graph, never the data; each chunk is read with one copy.
    """

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        m = np.load(self.path, mmap_mode="r")
        self.shape, self.dtype, self.ndim = m.shape, m.dtype, m.ndim
        del m

    def __getitem__(self, key):
        m = np.load(self.path, mmap_mode="r")
        return np.array(m[key])

    def __reduce__(self):
        return (NpyReader, (self.path,))


def from_npy(path: str, chunks: Any = "auto") -> da.Array:
    """A ``.npy`` file as a chunked array; reads chunk by chunk, never the whole file at once."""
    if not os.path.exists(path):
        raise ConfigError(f"npy file {path!r} does not exist")
    try:
        reader = NpyReader(path)
    except (ValueError, OSError) as e:
        raise ConfigError(f"{path!r} is not a readable .npy file: {e}") from None
    chunks = resolve_chunks(chunks, reader.shape, reader.dtype)
    x = da.from_array(reader, chunks=chunks, asarray=False, meta=np.empty((0,) * reader.ndim, reader.dtype),
                      name=f"from-npy-{da.core.tokenize(reader.path, os.path.getmtime(path), chunks)}")
    return to_device(x)


def _write_block(block, path=None, block_info=None):
    loc = block_info[0]["array-location"]
    m = np.load(path, mmap_mode="r+")
    m[tuple(slice(a, b) for a, b in loc)] = block
    m.flush()
    del m
    return np.zeros((1,) * block.ndim, dtype=np.int8)


def to_npy(x: da.Array, path: str, overwrite: bool = False):
    """Write ``x`` to a ``.npy`` file, chunks in parallel, moved into place only when complete."""
    x = to_host(x)
    with atomic_output(path, overwrite, meta={"format": "npy"}) as tmp:
        np.lib.format.open_memmap(tmp, mode="w+", dtype=x.dtype, shape=x.shape).flush()
        done = x.map_blocks(_write_block, path=tmp, dtype=np.int8,
                            chunks=tuple((1,) * len(c) for c in x.chunks))
        done.compute()
    return path
