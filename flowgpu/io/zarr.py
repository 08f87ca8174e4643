"""Zarr stores: chunked reads onto the device and atomic chunked writes."""

from __future__ import annotations

import os
from typing import Any

import dask.array as da

from flowgpu.arrays.chunks import resolve_chunks
from flowgpu.arrays.movement import to_device, to_host
from flowgpu.errors import ConfigError
from flowgpu.io.atomic import atomic_output

__all__ = ["from_zarr", "to_zarr"]


def from_zarr(path: str, component: str | None = None, chunks: Any = None) -> da.Array:
    """A Zarr array as a chunked array on the session's device; chunks default to the store's."""
    if "://" not in path and not os.path.exists(path):
        raise ConfigError(f"zarr store {path!r} does not exist")
    try:
        x = da.from_zarr(path, component=component, inline_array=True)  # reads spread over the workers (as npy's)
    except Exception as e:  # zarr raises several types for a bad store
        raise ConfigError(f"could not open zarr store {path!r}{' component ' + component if component else ''}: {e}") from None
    if chunks is not None:
        x = x.rechunk(resolve_chunks(chunks, x.shape, x.dtype))
    return to_device(x)


def _regular(x: da.Array) -> da.Array:
    """Zarr needs regular chunks: every chunk but the last of an axis the same size."""
    ok = all(len(set(c[:-1])) <= 1 and (len(c) < 2 or c[-1] <= c[0]) for c in x.chunks)
    return x if ok else x.rechunk(tuple(max(c) if c else 0 for c in x.chunks))


def to_zarr(x: da.Array, path: str, overwrite: bool = False, **kwargs) -> str:
    """Write ``x`` to a new Zarr store at ``path``; it appears there only when complete."""
    x = _regular(to_host(x))
    with atomic_output(path, overwrite, meta={"format": "zarr"}) as tmp:
        da.to_zarr(x, tmp, **kwargs)
    return path
