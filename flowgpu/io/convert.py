"""``flowgpu convert``: a ``.npy`` file, Zarr array, HDF5 dataset or TIFF stack as a GPU-friendly Zarr 3
store: zstd (or lz4) chunks small enough for nvCOMP's batches (64 KiB, at most 16 MiB), in shards of
about what one task reads (the workers' chunk size, at most 1 GiB), cut from whole rows first.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import dask
import numpy as np
from dask.base import get_scheduler
from distributed import Client

from flowgpu.arrays.chunks import target_chunk_bytes
from flowgpu.errors import ConfigError, FlowgpuError
from flowgpu.io.atomic import atomic_output, check_writable, output_error, protected_paths, replaces_protected
from flowgpu.io.devcodec import MAX_CHUNK_BYTES
from flowgpu.io.hdf5 import from_hdf5, is_hdf5
from flowgpu.io.hdf5 import labels as hdf5_labels
from flowgpu.io.npy import from_npy
from flowgpu.io.paths import is_glob, refuse_misnamed
from flowgpu.io.tiff import from_tiff, is_tiff, tiff_files
from flowgpu.io.zarr import from_zarr, open_zarr_array, store_zarr
from flowgpu.io.zarrwrite import CODECS, INNER_BYTES, inner_chunks

__all__ = ["check", "convert", "choose_layout", "CHUNK_BYTES", "MAX_CHUNK_BYTES", "MAX_SHARD_BYTES"]

CHUNK_BYTES = INNER_BYTES
MAX_SHARD_BYTES = 1 << 30


def choose_layout(shape: tuple, dtype: Any, chunk_bytes: int | None = None,
                  shard_bytes: int | None = None) -> tuple[tuple, tuple | None]:
    """``(chunks, shards)`` for an array; shards None when one shard would hold one chunk.

    >>> choose_layout((4096, 4096), "float32", chunk_bytes=4 << 20, shard_bytes=32 << 20)
    ((256, 4096), (2048, 4096))
    """
    itemsize = np.dtype(dtype).itemsize
    shard_bytes = int(shard_bytes or min(MAX_SHARD_BYTES, target_chunk_bytes()))
    chunk_bytes = min(int(chunk_bytes or CHUNK_BYTES), MAX_CHUNK_BYTES)
    if not shape or 0 in shape:
        return tuple(max(1, n) for n in shape), None
    chunks = inner_chunks(shape, itemsize, chunk_bytes, divides=False)  # the largest block of whole rows first
    target = inner_chunks(shape, itemsize, max(shard_bytes, chunk_bytes), divides=False)
    shards = tuple(max(c, (t // c) * c) if t < n else -(-n // c) * c for c, t, n in zip(chunks, target, shape))
    return chunks, (None if shards == chunks else shards)


SOURCES = ("a .npy file, a Zarr store, an HDF5 file (with --component DATASET) or a TIFF stack (a multi-page file "
           "or a quoted glob of pages)")


def _kind(src: str) -> str:
    """What ``src`` holds, from its first bytes: ``npy``, ``zarr`` (a folder), ``tiff`` or ``hdf5``."""
    if is_glob(src):
        return "tiff"
    if not os.path.exists(src):
        raise ConfigError(f"{src!r} does not exist; give {SOURCES}")
    if os.path.isdir(src):
        return "zarr"
    with open(src, "rb") as fh:
        head = fh.read(6)
    if head == b"\x93NUMPY":
        return "npy"
    if is_tiff(src):
        return "tiff"
    if is_hdf5(src):
        return "hdf5"
    raise ConfigError(f"{src!r} is none of {SOURCES}")


def _open(src: str, component: str | None):
    kind = _kind(src)
    if kind == "zarr":
        return from_zarr(src, component=component)
    if kind == "hdf5":
        return from_hdf5(src, dataset=component, chunks="auto")
    if component is not None:
        raise ConfigError(f"{src!r} is a {'.npy file' if kind == 'npy' else 'TIFF stack'}: it has no component "
                          f"{component!r}")
    return from_npy(src, chunks="auto") if kind == "npy" else from_tiff(src, chunks="auto")


def _labels(src: str, component: str | None) -> dict:
    """The dimension names and attributes of the array at ``src`` (Zarr 2 or 3, or HDF5), to keep."""
    kind = _kind(src)
    if kind == "hdf5":
        return hdf5_labels(src, component)
    if kind != "zarr":
        return {}
    a = open_zarr_array(src, component)
    attrs = {k: v for k, v in a.attrs.items() if k != "_FillValue"}  # xarray's encoding, not an attribute
    names = attrs.pop("_ARRAY_DIMENSIONS", None) if a.metadata.zarr_format == 2 else a.metadata.dimension_names
    out = {"attributes": attrs} if attrs else {}
    if names is not None and any(n is not None for n in names):
        out["dimension_names"] = tuple(names)
    return out


def check(src: str, dst: str, *, codec: str = "zstd", chunk_bytes: int | None = None, overwrite: bool = False) -> None:
    """Refuse what :func:`convert` would refuse, touching nothing (before a cluster starts)."""
    if codec not in CODECS:
        raise ConfigError(f"codec {codec!r}: choose one of {', '.join(CODECS)}")
    _kind(src)
    read = tiff_files(os.path.abspath(src)) if is_glob(src) else [src]  # a glob's pages are its sources
    if any(os.path.realpath(f) == os.path.realpath(dst) for f in read):
        raise ConfigError(f"{dst!r} is the source itself; write the converted store to another path")
    refuse_misnamed(dst, writer="convert", error=ConfigError, prefix="DST ")
    hit = replaces_protected(dst, protected_paths({f: f"its source {f!r}" for f in read}))  # what run never replaces
    if hit is not None:
        raise ConfigError(f"DST {dst!r} {hit}, which convert must not replace; write the converted store to a path "
                          "of its own, e.g. a new name such as 'out.zarr' (--overwrite never replaces the source, "
                          "the working directory or a folder that holds them)")
    if chunk_bytes is not None and chunk_bytes > MAX_CHUNK_BYTES:
        raise ConfigError(f"chunk size {chunk_bytes} bytes is more than nvCOMP decodes in one chunk "
                          f"({MAX_CHUNK_BYTES >> 20} MiB); give --chunk-bytes 16MiB or less")
    check_writable(dst, overwrite)


def convert(src: str, dst: str, *, codec: str = "zstd", level: int | None = None, chunk_bytes: int | None = None,
            shard_bytes: int | None = None, component: str | None = None, overwrite: bool = False,
            checksum: bool | None = None) -> dict:
    """Write the array at ``src`` (``component``: in a Zarr group, or an HDF5 dataset's path) to a new
    Zarr 3 store ``dst``, atomically, keeping dimension names and attributes. Returns ``{"path",
    "shape", "dtype", "chunks", "shards", "codec", "bytes", "stored_bytes"}``.
    """
    check(src, dst, codec=codec, chunk_bytes=chunk_bytes, overwrite=overwrite)
    x = _open(src, component)
    chunks, shards = choose_layout(x.shape, x.dtype, chunk_bytes, shard_bytes)
    with atomic_output(dst, overwrite, meta={"format": "zarr"}) as tmp:
        try:
            _compute(store_zarr(x, tmp, codec=codec, level=level, chunks=chunks, shards=shards,
                                checksum=checksum, labels=_labels(src, component)))
        except OSError as e:
            if isinstance(e, FlowgpuError):
                raise
            raise output_error(dst, e) from None
        stored = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp) for f in fs)
    return {"path": dst, "shape": list(x.shape), "dtype": str(x.dtype), "chunks": list(chunks),
            "shards": list(shards) if shards else None, "codec": codec, "bytes": int(x.nbytes),
            "stored_bytes": int(stored)}


def _compute(target: Any, settle: float = 60.0) -> None:
    """``dask.compute(target)``. On a distributed client, a compute that is interrupted or fails has its tasks
    cancelled and waits (``settle`` seconds at most) until no worker still runs one: the staging folder goes
    after the last write into it (a write after it went made it again, with no owner record to clean it by)."""
    client = getattr(get_scheduler(), "__self__", None)
    if not isinstance(client, Client):
        dask.compute(target)
        return
    future = client.compute(target)
    try:
        future.result()
    except BaseException:
        with contextlib.suppress(Exception):  # a cluster already gone: nothing runs, and the error is the one to say
            client.cancel([future], force=True)
            deadline = time.monotonic() + settle
            while time.monotonic() < deadline and any(client.run(_running).values()):
                time.sleep(0.05)
        raise


def _running(dask_worker: Any) -> int:
    """How many tasks ``dask_worker`` still runs, cancelled ones included (a thread cannot be stopped)."""
    return sum(ts.state in ("executing", "long-running", "cancelled", "resumed")
               for ts in dask_worker.state.tasks.values())
