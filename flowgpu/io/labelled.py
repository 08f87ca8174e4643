"""Labelled arrays: xarray datasets in (``source: xarray``) and out (``sink: xarray``).

A variable (Zarr, or NetCDF/HDF5 through h5netcdf) is opened by xarray as a ``DataArray`` over a
dask array, so dims, coordinates and attributes travel beside the data the ops see. The sink writes
a Dataset (Zarr 3 or NetCDF4) into flowgpu's staging path. xarray is imported only when used.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Literal

import dask.array as da
import numpy as np

from flowgpu.arrays.labels import bare, is_labelled
from flowgpu.arrays.movement import to_device, to_host
from flowgpu.errors import ConfigError

__all__ = ["StoredChunksWarning", "open_xarray", "check_variable", "is_labelled", "bare", "infer_engine",
           "open_dataset", "as_dataset", "write_dataset"]

_noted: set[tuple[str, str, str]] = set()


class StoredChunksWarning(UserWarning):
    """Chunks that split a variable's stored chunks: such a stored chunk is read and decoded once for
    each chunk it falls in."""


# the file endings read through h5netcdf (NetCDF4 is HDF5); everything else that is a folder is Zarr
_HDF5_SUFFIXES = (".nc", ".nc4", ".netcdf", ".h5", ".hdf5", ".hdf", ".he5", ".cdf")


def import_xarray():
    """xarray, or a ConfigError saying how to install it."""
    try:
        import xarray
    except ImportError:  # pragma: no cover - xarray is in the test extra
        raise ConfigError("source/sink 'xarray' needs xarray: pip install 'flowgpu[xarray]'") from None
    return xarray


def infer_engine(path: str, engine: str | None = None) -> str:
    """``zarr`` for a folder or a ``.zarr`` path, ``h5netcdf`` for NetCDF/HDF5 endings."""
    if engine is not None:
        return engine
    if path.rstrip("/").lower().endswith(_HDF5_SUFFIXES):
        return "h5netcdf"
    if os.path.isdir(path) or path.rstrip("/").lower().endswith(".zarr"):
        return "zarr"
    raise ConfigError(f"cannot tell the format of {path!r} from its name; give engine: zarr or h5netcdf")


def _chunks(chunks: Any) -> Any:
    if isinstance(chunks, list):
        return tuple(tuple(c) if isinstance(c, list) else c for c in chunks)
    return chunks


def open_dataset(path: str, engine: str | None = None, chunks: Any = "auto"):
    """The lazy ``xarray.Dataset`` at ``path`` (dask arrays chunked by ``chunks``)."""
    xr = import_xarray()
    engine = infer_engine(path, engine)
    if not os.path.exists(path):
        raise ConfigError(f"{path!r} does not exist")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a store without consolidated metadata
            if engine == "zarr":
                return xr.open_zarr(path, chunks=_chunks(chunks))
            return xr.open_dataset(path, engine=engine, chunks=_chunks(chunks))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{path!r} is not a dataset xarray can open with engine {engine!r}: {e}") from None


def _variable(ds: Any, path: str, variable: str) -> Any:
    if variable not in ds.variables:
        there = ", ".join(sorted(map(str, ds.data_vars))) or "none"
        raise ConfigError(f"{path!r} has no variable {variable!r}; its variables: {there} (coordinates: "
                          f"{', '.join(sorted(map(str, ds.coords))) or 'none'})")
    return ds[variable]


def check_variable(path: str, variable: str, engine: str | None = None) -> None:
    """Refuse a ``variable`` the dataset at ``path`` lacks, naming the ones it has."""
    try:
        ds = open_dataset(path, engine, chunks=None)
    except ConfigError:  # also for a path that is not there (open_dataset checks)
        return
    try:
        _variable(ds, path, variable)
    finally:
        ds.close()


def open_xarray(path: str, variable: str, engine: str | None = None, chunks: Any = "auto"):
    """``variable`` of the dataset at ``path`` as an ``xarray.DataArray`` with chunks on the session's
    device. ``chunks``: ``auto``, a byte size, one length for every dim, or a list (one per dim)."""
    chunks = given = "auto" if chunks is None else chunks
    if isinstance(chunks, list):  # per dim of the variable: xarray takes a mapping by dim name
        ds = open_dataset(path, engine, chunks=None)
        try:
            dims = tuple(map(str, _variable(ds, path, variable).dims))
        finally:
            ds.close()
        if len(chunks) != len(dims):
            raise ConfigError(f"chunks {chunks!r} has {len(chunks)} entries, but {variable!r} has {len(dims)} dims "
                              f"({', '.join(dims)}); give one per dim")
        chunks = dict(zip(dims, _chunks(chunks)))
    with warnings.catch_warnings():  # xarray's, one per dim and variable of the dataset: said once below
        warnings.filterwarnings("ignore", message="The specified chunks separate the stored chunks")
        ds = open_dataset(path, engine, chunks)
    x = _variable(ds, path, variable)
    _note_splits(x, path, given)
    if not isinstance(x.data, da.Array):  # an index coordinate is loaded eagerly by xarray
        x = x.chunk()
    return x.copy(data=to_device(x.data))


def _note_splits(x: Any, path: str, given: Any) -> None:
    """Say once a process (a run opens its inputs again) where the chunks of ``x`` split its stored ones."""
    stored = x.encoding.get("preferred_chunks") or {}
    split = {}
    for dim, chunks in zip(x.dims, x.chunks or ()):
        cuts = [int(at) for at in np.cumsum(chunks[:-1]) if stored.get(dim) and at % stored[dim]]
        if cuts:
            split[dim] = cuts[0]
    if split and (path, x.name, repr(given)) not in _noted:
        _noted.add((path, x.name, repr(given)))
        where = " and ".join(f"{dim!r} (at index {at})" for dim, at in split.items())
        sizes = ", ".join(f"{d}: {n}" for d, n in stored.items())
        warnings.warn_explicit(f"variable {x.name!r}: chunks {given} split its stored chunks along {where}, so "
                               "each of those is read and decoded once for every chunk it falls in; give chunks "
                               f"that are whole multiples of the stored ones ({sizes}), or leave chunks out",
                               StoredChunksWarning, path, 0)


def as_dataset(x: Any, variable: str | None, path: str | None):
    """``x`` (labelled or bare) as a one-variable ``xarray.Dataset``, host chunks, no source encoding."""
    xr = import_xarray()
    stem = os.path.splitext(os.path.basename(path.rstrip("/")))[0] if path else "data"
    name = variable or (x.name if is_labelled(x) else None) or stem
    if not is_labelled(x):
        x = xr.DataArray(x, dims=[f"dim_{i}" for i in range(x.ndim)], name=name)
    x = x.copy(data=to_host(x.data) if isinstance(x.data, da.Array) else x.data)
    return x.to_dataset(name=str(name)).drop_encoding()


def write_dataset(ds: Any, path: str, format: Literal["zarr", "netcdf"]):  # noqa: A002
    """Start writing ``ds`` to ``path``: metadata now, the data when the returned delayed is computed."""
    if format == "zarr":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zarr: consolidated metadata is not yet in the Zarr 3 spec
            return ds.to_zarr(path, mode="w-", compute=False, consolidated=True, zarr_format=3)
    return ds.to_netcdf(path, engine="h5netcdf", compute=False)
