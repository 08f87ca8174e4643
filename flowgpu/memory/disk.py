"""The disk tier: arrays as raw bytes behind a ``.npy`` header, one file per key, no pickle.

Files live in ``<worker local directory>/flowgpu-spill``. A write that fails (read-only
directory, disk full, ...) removes its partial file and raises :class:`DiskFull`; the store
then keeps the chunk in memory and records why.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import numpy as np

__all__ = ["DiskTier", "DiskFull", "can_store"]


class DiskFull(OSError):
    """A chunk could not be written to the spill directory (the original error is chained)."""


def can_store(value: Any) -> bool:
    """True for arrays the disk tier writes without pickle (any dtype but ``object``)."""
    return isinstance(value, np.ndarray) and not value.dtype.hasobject


def _write_file(path: str, array: np.ndarray) -> None:
    """Write ``array`` as ``.npy``; separate so tests can make it fail like a full disk.

    The header comes from NumPy; the data goes in one ``write`` of the array's own memory (no
    copy for C- or Fortran-ordered arrays). ``np.save``'s ``tofile`` path took about 1.5x as long
    per spilled chunk on the 2-core CI machine (``benchmarks/out_of_core.py --cpu``).
    """
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


class DiskTier:
    """Chunks on local disk, addressed by task key.

    Parameters
    ----------
    directory : where the files go; created on first write.
    """

    def __init__(self, directory: str):
        self.directory = directory
        self._lock = threading.Lock()
        self._files: dict[Any, tuple[str, int]] = {}  # key -> (path, bytes on disk)
        self.nbytes = 0
        self.disabled_reason: str | None = None

    def _path(self, key: Any) -> str:
        digest = hashlib.sha1(repr(key).encode(), usedforsecurity=False).hexdigest()
        return os.path.join(self.directory, f"{digest}.npy")

    def __contains__(self, key: Any) -> bool:
        return key in self._files

    def __len__(self) -> int:
        return len(self._files)

    def keys(self):
        return list(self._files)

    def write(self, key: Any, array: np.ndarray) -> int:
        """Write ``array`` under ``key``; returns bytes written. Raises :class:`DiskFull`."""
        if self.disabled_reason is not None:
            raise DiskFull(self.disabled_reason)
        path = self._path(key)
        try:
            os.makedirs(self.directory, exist_ok=True)
            _write_file(path, array)
            size = os.path.getsize(path)
        except OSError as e:
            try:
                os.remove(path)
            except OSError:
                pass
            raise DiskFull(f"could not write to the spill directory {self.directory!r}: {e}") from e
        with self._lock:
            self._files[key] = (path, size)
            self.nbytes += size
        return size

    def header(self, key: Any) -> tuple[tuple, np.dtype, bool]:
        """``(shape, dtype, fortran_order)`` of the array stored under ``key``."""
        path, _ = self._files[key]
        with open(path, "rb") as f:
            return _read_header(f)

    def read(self, key: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Read the array under ``key``; into ``out`` (a flat uint8 buffer) when given.

        The file stays until :meth:`remove`.
        """
        path, _ = self._files[key]
        with open(path, "rb") as f:
            shape, dtype, fortran = _read_header(f)
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
                    raise OSError(f"spill file {path!r} is truncated: {got} of {n} bytes")
        return arr

    def detach(self, key: Any) -> tuple[str, int]:
        """Forget ``key`` but keep its file; returns the record for :meth:`attach` or :meth:`discard`."""
        with self._lock:
            rec = self._files.pop(key)
            self.nbytes -= rec[1]
        return rec

    def attach(self, key: Any, rec: tuple[str, int]) -> None:
        """Take back a file from :meth:`detach`: the chunk is on disk again without a write."""
        with self._lock:
            self._files[key] = rec
            self.nbytes += rec[1]

    @staticmethod
    def discard(rec: tuple[str, int]) -> None:
        try:
            os.remove(rec[0])
        except OSError:
            pass

    def remove(self, key: Any) -> None:
        with self._lock:
            path, size = self._files.pop(key)
            self.nbytes -= size
        try:
            os.remove(path)
        except OSError:
            pass

    def disable(self, reason: str) -> None:
        """Stop writing (after a failure); reads and removals still work."""
        self.disabled_reason = reason

    def clear(self) -> None:
        for key in list(self._files):
            self.remove(key)


def _read_header(f) -> tuple[tuple, np.dtype, bool]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    return shape, dtype, fortran
