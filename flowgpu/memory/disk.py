"""The disk tier: arrays as raw bytes behind a ``.npy`` header, a new file per write, no pickle. A
failed write removes its file and raises :class:`DiskFull` (the store keeps the chunk in memory).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowgpu.transfer.streams import ArrayMeta

__all__ = ["DiskTier", "DiskFile", "DiskFull", "can_store"]


class DiskFull(OSError):
    """A chunk could not be written to the spill directory (the original error is chained)."""


def can_store(value: Any) -> bool:
    """True for arrays the disk tier writes without pickle (any dtype but ``object``)."""
    return isinstance(value, np.ndarray) and not value.dtype.hasobject


def _write_file(path: str, array: np.ndarray) -> None:
    """Write ``array`` as ``.npy``, its data in one ``write`` of its own memory (``np.save`` took 1.5x
    as long per spilled chunk on CI); separate so tests can make it fail like a full disk."""
    fmt = np.lib.format
    header = fmt.header_data_from_array_1_0(array)
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        array = np.ascontiguousarray(array)  # the header says C order for these
    with open(path, "wb") as f:
        try:
            fmt.write_array_header_1_0(f, header)
        except ValueError:  # a header too long for format 1.0
            f.seek(0)
            f.truncate()
            fmt.write_array_header_2_0(f, header)
        if array.size:
            f.write(memoryview(array.reshape(-1, order="A")).cast("B"))


@dataclass(slots=True, eq=False)
class DiskFile:
    """One chunk on disk: its file, the file's size, and what it was (``origin``, layout)."""

    path: str
    size: int
    origin: str  # "host" (a NumPy chunk) or "device" (a spilled device chunk)
    meta: ArrayMeta

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.remove(self.path)


class DiskTier:
    """Chunks on local disk in ``directory`` (made on first write), by task key; the store's lock
    guards every change.

    It also remembers *kept* files, of chunks read back and unchanged since (chunks are immutable),
    so evicting them again takes no write (:meth:`reattach`); they are not in :attr:`nbytes`.
    """

    name = "disk"

    def __init__(self, directory: str):
        self.directory = directory
        self._files: dict[Any, DiskFile] = {}
        self._kept: dict[Any, DiskFile] = {}
        self._written = itertools.count()
        self.nbytes = 0  # bytes of the files
        self.data_bytes = 0  # bytes of the arrays in them
        self.disabled_reason: str | None = None

    def _path(self, key: Any) -> str:
        digest = hashlib.sha1(repr(key).encode(), usedforsecurity=False).hexdigest()
        # a new name per write: a file still being read for an older value is never overwritten
        return os.path.join(self.directory, f"{digest}-{next(self._written)}.npy")

    def __contains__(self, key: Any) -> bool:
        return key in self._files

    def __len__(self) -> int:
        return len(self._files)

    def keys(self) -> list:
        return list(self._files)

    def kept_keys(self) -> list:
        return list(self._kept)

    def put(self, key: Any, array: np.ndarray, origin: str = "host", meta: ArrayMeta | None = None) -> int:
        """Write ``array`` under ``key``; returns bytes written. Raises :class:`DiskFull`."""
        if self.disabled_reason is not None:
            raise DiskFull(self.disabled_reason)
        path = self._path(key)
        try:
            os.makedirs(self.directory, exist_ok=True)
            _write_file(path, array)
            size = os.path.getsize(path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.remove(path)
            raise DiskFull(f"could not write to the spill directory {self.directory!r}: {e}") from e
        self.attach(key, DiskFile(path, size, origin, meta or ArrayMeta.of(array)))
        return size

    @staticmethod
    def read(rec: DiskFile, out: np.ndarray | None = None) -> np.ndarray:
        """Read the array in ``rec``'s file; into ``out`` (a flat uint8 buffer) when given."""
        with open(rec.path, "rb") as f:
            fmt = np.lib.format
            read = fmt.read_array_header_1_0 if fmt.read_magic(f) == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read(f)
            n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            order = "F" if fortran else "C"
            if out is None:
                arr = np.empty(shape, dtype=dtype, order=order)
                target = arr.reshape(-1, order="A").view(np.uint8) if n else None
            else:
                target = out[:n]
                arr = np.ndarray(shape, dtype=dtype, buffer=target, order=order)
            if n:
                got = f.readinto(memoryview(target))
                if got != n:
                    raise OSError(f"spill file {rec.path!r} is truncated: {got} of {n} bytes")
        return arr

    def info(self, key: Any) -> DiskFile:
        return self._files[key]

    def detach(self, key: Any) -> DiskFile:
        """Forget ``key`` but keep its file; the record."""
        rec = self._files.pop(key)
        self.nbytes -= rec.size
        self.data_bytes -= rec.meta.nbytes
        return rec

    def attach(self, key: Any, rec: DiskFile) -> None:
        """Hold ``rec`` under ``key``: the chunk is on disk (again, without a write)."""
        self._files[key] = rec
        self.nbytes += rec.size
        self.data_bytes += rec.meta.nbytes

    def pop(self, key: Any) -> None:
        """Remove ``key`` and its file."""
        self.detach(key).discard()

    # -- files of chunks read back, still good -----------------------------------------------
    def keep(self, key: Any, rec: DiskFile) -> None:
        """Remember the file of ``key``, now read back into memory, for :meth:`reattach`."""
        self._kept[key] = rec

    def reattach(self, key: Any) -> DiskFile | None:
        """Hold ``key`` again through its kept file, if it has one (no write); the record or None."""
        rec = self._kept.pop(key, None)
        if rec is not None:
            self.attach(key, rec)
        return rec

    def forget(self, key: Any) -> None:
        """``key``'s value is gone or changed: remove its kept file, if any."""
        rec = self._kept.pop(key, None)
        if rec is not None:
            rec.discard()

    def disable(self, reason: str) -> None:
        """Stop writing (after a failure); reads and removals still work."""
        self.disabled_reason = reason
