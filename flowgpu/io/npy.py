"""``.npy`` files: memory-mapped chunked reads and parallel chunked writes."""

from __future__ import annotations

import errno
import os
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.arrays.chunks import resolve_chunks
from flowgpu.arrays.creation import from_reader
from flowgpu.arrays.movement import to_host
from flowgpu.io.atomic import atomic_output
from flowgpu.io.hdf5 import open_format
from flowgpu.io.paths import files_read, not_visible, refuse_misnamed, resolve
from flowgpu.transfer.staging import file_rows_to_device, host_to_device

__all__ = ["from_npy", "to_npy", "npy_writes", "NpyReader"]


class NpyReader:
    """Reads slices of a ``.npy`` file in the task that needs them; the path and the header's shape,
    dtype and offset travel in the graph (unpickling opens no file: a worker that cannot see it fails
    the task, not the unpickling, which stops the worker).

    ``device=True``: CuPy chunks, whole rows of a C-ordered file read as one byte range straight
    into pinned staging, other blocks from the memory map through the same staging buffers.
    """

    def __init__(self, path: str, device: bool = False):
        self.path = resolve(path)  # the task runs where the working directory may be another
        self.device = device
        m = self._map()
        self.shape, self.dtype, self.ndim = m.shape, m.dtype, m.ndim
        self.offset = int(m.offset)  # bytes of the .npy header
        self.fortran = bool(m.flags.f_contiguous and not m.flags.c_contiguous)
        declared = self.offset + int(m.nbytes)
        del m
        held = os.path.getsize(self.path)
        if held != declared:  # numpy maps the prefix its header declares and says nothing of the rest
            raise ValueError(f"its header declares {self.shape} {self.dtype} ({declared - self.offset:,} bytes after a "
                             f"{self.offset}-byte header), but the file holds {held:,} bytes: it is damaged, or not what "
                             "its header says; rewrite it")

    def _rows(self, key) -> tuple[int, int] | None:
        """``(start, stop)`` when ``key`` selects whole rows of a C-ordered file, else None."""
        if self.fortran or self.dtype.hasobject or self.ndim == 0:
            return None
        key = key if isinstance(key, tuple) else (key,)
        if not key or not all(isinstance(k, slice) for k in key):
            return None
        for k, n in zip(key[1:], self.shape[1:]):
            if k.indices(n) != (0, n, 1):
                return None
        start, stop, step = key[0].indices(self.shape[0])
        return (start, max(start, stop)) if step == 1 else None

    def __getitem__(self, key):
        rows = self._rows(key) if self.device else None
        if rows is not None:
            row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
            return file_rows_to_device(self.path, self.offset + rows[0] * row_bytes,
                                       (rows[1] - rows[0], *self.shape[1:]), self.dtype)
        return host_to_device(self._map()[key]) if self.device else np.array(self._map()[key])

    def _map(self) -> np.memmap:
        """The file memory-mapped: a .npy file only (np.load also opens .npz archives and pickles)."""
        try:
            return np.lib.format.open_memmap(self.path, mode="r")
        except FileNotFoundError:  # in a worker: a task error, as a Zarr store's
            raise not_visible(".npy file", self.path) from None


def from_npy(path: str, chunks: Any = "auto") -> da.Array:
    """A ``.npy`` file as a chunked array; reads chunk by chunk, never the whole file at once."""
    path = resolve(path)
    reader = open_format(path, ".npy", NpyReader, ", not a .npy file (for a Zarr store use source: zarr)")
    chunks = resolve_chunks(chunks, reader.shape, reader.dtype)
    return from_reader(reader, chunks, "npy", da.core.tokenize(reader.path, os.path.getmtime(path), chunks))


def _allocate(path: str, dtype: Any, shape: tuple[int, ...]) -> None:
    """Create the ``.npy`` file at ``path``, every block on disk: a full disk fails here, not as SIGBUS."""
    m = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    start, size = int(m.offset), int(m.offset) + int(m.nbytes)
    del m
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            if size > start:
                os.posix_fallocate(fd, start, size - start)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            zeros = bytes(1 << 20)
            for at in range(start, size, len(zeros)):
                os.pwrite(fd, zeros[: size - at], at)
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_block(block, path=None, block_info=None):
    loc = block_info[0]["array-location"]
    m = np.load(path, mmap_mode="r+")
    m[tuple(slice(a, b) for a, b in loc)] = block
    m.flush()
    del m
    return np.zeros((1,) * block.ndim, dtype=np.int8)


def npy_writes(x: da.Array, path: str) -> da.Array:
    """The lazy write of the host array ``x`` into a new ``.npy`` file at ``path``, allocated now."""
    _allocate(path, x.dtype, x.shape)
    return x.map_blocks(_write_block, path=path, dtype=np.int8, chunks=tuple((1,) * len(c) for c in x.chunks))


def to_npy(x: da.Array, path: str, overwrite: bool = False):
    """Write ``x`` (a dask array, or one in memory) to a ``.npy`` file, chunks in parallel, moved into
    place only when complete."""
    refuse_misnamed(path, (".npy",), "to_npy")
    x = x if hasattr(x, "__dask_graph__") else da.asarray(x)
    with atomic_output(path, overwrite, meta={"format": "npy"}, reads=files_read(x)) as tmp:
        npy_writes(to_host(x), tmp).compute()
    return path
