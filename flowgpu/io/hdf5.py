"""HDF5 datasets (h5py, optional, imported when used; NetCDF-4 is HDF5 too): chunked reads.

Only the path and the dataset's name travel in the graph (an open h5py handle neither pickles nor
survives a fork). ``chunks="auto"`` is whole multiples of the dataset's own chunks. On a GPU
session blocks go through pinned staging: a contiguous dataset's rows as one byte range, any other
block decoded by HDF5 straight into the staging buffers.
"""

from __future__ import annotations

import difflib
import importlib
import os
import posixpath
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.arrays.chunks import resolve_chunks
from flowgpu.arrays.creation import from_reader
from flowgpu.backend import import_cupy
from flowgpu.errors import ConfigError, SourceError
from flowgpu.io.paths import resolve
from flowgpu.transfer.staging import file_rows_to_device, rows_to_device

__all__ = ["from_hdf5", "Hdf5Reader", "block_slices", "take", "import_h5py", "is_hdf5", "open_format"]

_SHOWN = 20  # datasets named in a message


def import_format(module: str, what: str) -> Any:
    """The optional reader ``module`` (``h5py``, ``tifffile``), or a ConfigError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"reading {what} files needs {module}, which is not installed: pip install "
                          f"'flowgpu[formats]' (or pip install {module})") from None


def import_h5py() -> Any:
    return import_format("h5py", "HDF5")


def is_hdf5(path: str) -> bool:
    """Whether the file at ``path`` carries HDF5's signature."""
    return bool(import_h5py().is_hdf5(path))


def _listing(names: list[str]) -> str:
    if not names:
        return "no datasets at all"
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


def open_format(path: str, what: str, opener: Any, folder: str, signature: tuple[Any, str] | None = None) -> Any:
    """``opener(path)``, or a SourceError saying why not: ``path`` is missing, a folder (``folder``: the
    fix), lacks the signature ``(check, what it is not)`` of a ``what`` file, or does not open."""
    if not os.path.exists(path):
        raise SourceError(f"{what} file {path!r} does not exist", "path")
    if os.path.isdir(path):
        raise SourceError(f"{path!r} is a folder{folder}", "path")
    if signature is not None and not signature[0](path):
        raise SourceError(f"{path!r} is not {signature[1]}", "path")
    try:
        return opener(path)
    except Exception as e:  # noqa: BLE001 - readers raise several types for a damaged file
        raise SourceError(f"{path!r} is not a readable {what} file: {e}", "path") from None


def _open_file(path: str) -> Any:
    h5py = import_h5py()
    not_hdf5 = "an HDF5 file (it lacks HDF5's signature); give an HDF5 (.h5, .hdf5) or NetCDF-4 (.nc) file"
    return open_format(path, "HDF5", lambda p: h5py.File(p, "r"),
                       ", not an HDF5 file (for a Zarr store use source: zarr)", (h5py.is_hdf5, not_hdf5))


def _find(f: Any, path: str, dataset: str | None) -> Any:
    """The dataset ``dataset`` names in the open file ``f`` (the only one, when None)."""
    h5py = import_h5py()
    names: list[str] = []  # the absolute name of every dataset in the file, in HDF5's order
    f.visititems(lambda name, obj: names.append(obj.name) if isinstance(obj, h5py.Dataset) else None)
    if dataset is None:
        if len(names) == 1:
            return f[names[0]]
        raise SourceError(f"{path!r} holds {len(names)} datasets, so name one as its dataset (its path in the "
                          f"file, e.g. {names[0]!r}); it holds {_listing(names)}", "dataset")
    key = "/" + dataset.strip().strip("/")
    try:
        obj = f.get(key)
    except (KeyError, OSError, ValueError):  # a broken link on the way
        obj = None
    if isinstance(obj, h5py.Dataset):
        return obj
    if isinstance(obj, h5py.Group):
        inside = [n for n in names if n.startswith(key.rstrip("/") + "/")]
        raise SourceError(f"{dataset!r} in {path!r} is a group, not a dataset; name one of the datasets in it: "
                          f"{_listing(inside)}", "dataset")
    close = difflib.get_close_matches(key, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise SourceError(f"{path!r} has no dataset {dataset!r}; it holds {_listing(names)}{hint}", "dataset")


# what HDF5's dimension scales and NetCDF-4 keep in a dataset's attributes: structure, not the user's attributes
_INTERNAL = {"DIMENSION_LIST", "REFERENCE_LIST", "CLASS", "NAME", "_FillValue", "_nc3_strict"}


def labels(path: str, dataset: str | None = None) -> dict:
    """A dataset's ``{"dimension_names", "attributes"}`` (its dimension scales' names; each when any)."""
    with _open_file(path) as f:
        d = _find(f, path, dataset)
        attrs = {k: _plain(v) for k, v in d.attrs.items() if k not in _INTERNAL and not k.startswith("_Netcdf4")}
        names = [posixpath.basename(dim[0].name) if len(dim) else (dim.label or None) for dim in d.dims]
    out: dict = {"attributes": attrs} if attrs else {}
    if any(names):
        out["dimension_names"] = tuple(names)
    return out


def _plain(value: Any) -> Any:
    """An attribute's value as JSON holds it (Zarr's attributes): NumPy scalars and arrays, bytes as text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):  # NetCDF's attributes are 1-D: one value is a scalar, as xarray reads it
        out = [_plain(v) for v in value.tolist()] if value.dtype.kind in "OSU" else value.tolist()
        return out[0] if value.ndim == 1 and value.size == 1 else out
    return value.item() if isinstance(value, np.generic) else value


def _numeric(dset: Any, path: str) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and (native byte order) dtype a dataset is read as; refuse what is not a numeric array."""
    dtype = dset.dtype
    if dset.shape is None:
        raise SourceError(f"dataset {dset.name!r} in {path!r} is empty (no dataspace); name a dataset that holds "
                          "an array", "dataset")
    if dtype.kind not in "biufc" or dtype.fields is not None or dtype.subdtype is not None:
        raise SourceError(f"dataset {dset.name!r} in {path!r} holds {dtype} values, not numbers; flowgpu reads "
                          "datasets of booleans, integers, floats or complex numbers", "dataset")
    return tuple(int(n) for n in dset.shape), dtype.newbyteorder("=")


def block_slices(key: Any, shape: tuple[int, ...]) -> tuple[tuple[slice, ...], tuple | None]:
    """What ``from_array``'s getter asks a reader for (a block's slices, fused with the steps' own
    indexing: integers, negative ones, steps, Ellipsis, integer lists) as ``(read, rest)``: one
    ``slice(start, stop)`` per axis to read, then the index that takes the answer from that block
    (None when it is the block; see :func:`take`)."""
    key = key if isinstance(key, tuple) else (key,)
    if any(k is Ellipsis for k in key):
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - len(key) + 1) + key[at + 1:]
    read, rest = [], []
    for k, n in zip(key + (slice(None),) * (len(shape) - len(key)), shape):
        if isinstance(k, slice):
            picked = range(*k.indices(n))
            lo = min(picked[0], picked[-1]) if picked else 0
            read.append(slice(lo, max(picked[0], picked[-1]) + 1 if picked else 0))
            rest.append(slice(None) if picked.step == 1 or not picked else slice(picked[0] - lo, None, picked.step))
            continue
        at = np.asarray(k)
        if at.dtype == bool:
            at = np.flatnonzero(at)
        elif ((at < -n) | (at >= n)).any():
            raise IndexError(f"index {k} is out of bounds for an axis of {n}")
        at = at.astype(np.intp) % max(n, 1)
        lo = int(at.min()) if at.size else 0
        read.append(slice(lo, int(at.max()) + 1 if at.size else 0))
        rest.append(int(at) - lo if at.ndim == 0 else at - lo)
    return tuple(read), (tuple(rest) if any(not isinstance(r, slice) or r != slice(None) for r in rest) else None)


def take(block: Any, rest: tuple | None) -> Any:
    """The part ``rest`` (from :func:`block_slices`) of a block read: an array still, where NumPy gives a scalar."""
    return block if rest is None else block[rest + (Ellipsis,)]


def _contiguous_offset(dset: Any) -> int | None:
    """Where a contiguous, unfiltered, native-order dataset's bytes start in its file, or None."""
    h5py = import_h5py()
    if dset.chunks is not None or dset.external or dset.is_virtual or not dset.dtype.isnative:
        return None
    if dset.id.get_create_plist().get_layout() != h5py.h5d.CONTIGUOUS:
        return None
    return dset.id.get_offset()  # None until the data is written (HDF5 reads the fill value then)


class Hdf5Reader:
    """Reads blocks of one dataset in the task that needs them (``device``: as CuPy blocks)."""

    def __init__(self, path: str, dataset: str, shape: tuple[int, ...], dtype: Any, device: bool = False):
        self.path, self.dataset, self.device = path, dataset, device
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.ndim = len(self.shape)

    def _open(self) -> tuple[Any, Any]:
        f = import_h5py().File(self.path, "r")
        try:
            dset = f[self.dataset]
            shape, dtype = tuple(dset.shape or ()), dset.dtype.newbyteorder("=")
        except (KeyError, OSError) as e:
            f.close()
            raise OSError(f"{self.path}: dataset {self.dataset!r} cannot be read ({e}); the file changed after the "
                          "run was planned: run again") from None
        if shape != self.shape or dtype != self.dtype:
            f.close()
            raise OSError(f"{self.path}: dataset {self.dataset!r} is now {shape} {dtype}, but the run was planned for "
                          f"{self.shape} {self.dtype}; the file changed after the run was planned: run again")
        return f, dset

    def __getitem__(self, key: Any) -> Any:
        key, rest = block_slices(key, self.shape)
        return take(self._read(key), rest)

    def _read(self, key: tuple[slice, ...]) -> Any:
        shape = tuple(k.stop - k.start for k in key)
        f, dset = self._open()
        with f:
            if self.ndim == 0:  # a scalar dataset
                value = np.asarray(dset[()], dtype=self.dtype)
                return import_cupy().asarray(value) if self.device else value
            if not self.device:
                out = np.empty(shape, self.dtype)
                if out.size:
                    dset.read_direct(out, source_sel=key)
                return out
            whole_rows = all(k.start == 0 and k.stop == n for k, n in zip(key[1:], self.shape[1:]))
            offset = _contiguous_offset(dset) if whole_rows else None
            if offset is not None:  # one byte range, as a .npy file's rows
                row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
                return file_rows_to_device(self.path, offset + key[0].start * row_bytes, shape, self.dtype)

            def fill(out: np.ndarray, a: int, b: int) -> None:  # h5py serialises its calls: safe on any thread
                dset.read_direct(out, source_sel=(slice(key[0].start + a, key[0].start + b),) + key[1:])

            return rows_to_device(shape, self.dtype, fill)


def from_hdf5(path: str, dataset: str | None = None, chunks: Any = "auto") -> da.Array:
    """A dataset of an HDF5 (or NetCDF-4) file as a chunked array on the session's device.

    ``dataset``: its path in the file, e.g. ``"/group/temp"`` (may be left out when the file holds
    one). ``chunks``: ``"auto"`` (whole multiples of the dataset's chunks), one length per axis, or
    a byte size such as ``"256MiB"``.
    """
    path = resolve(path)
    with _open_file(path) as f:
        dset = _find(f, path, dataset)
        shape, dtype = _numeric(dset, path)
        name, stored = dset.name, dset.chunks
    chunks = resolve_chunks(chunks, shape, dtype, previous=stored)
    token = da.core.tokenize(path, name, os.path.getmtime(path), chunks, str(dtype))
    return from_reader(Hdf5Reader(path, name, shape, dtype), chunks, "hdf5", token)
