"""Zarr stores: chunked reads onto the device and atomic chunked writes.

On a GPU session chunks are decoded and encoded on the device (:mod:`flowgpu.io.zarrread`,
:mod:`flowgpu.io.zarrwrite`), codecs nvCOMP lacks through zarr-python on the CPU (the reason goes
in the run summary). ``flowgpu.zarr.device``: ``auto``, ``cpu``, or ``fake`` (NumPy stand-ins, tests).
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import os
import pickle
from typing import Any

import dask.array as da
import dask.config
import numpy as np
import zarr
from dask.utils import parse_bytes

from flowgpu.arrays.chunks import resolve_chunks
from flowgpu.arrays.movement import to_device, to_host
from flowgpu.backend import current_backend, empty_meta
from flowgpu.errors import ConfigError
from flowgpu.io.atomic import atomic_output
from flowgpu.io.devcodec import MAX_CHUNK_BYTES, DevicePlan, Fallback, plan_codec
from flowgpu.io.paths import files_read, is_url, named_kind, refuse_misnamed, require_store, resolve
from flowgpu.io.storage import COUNTERS
from flowgpu.io.zarrread import DeviceReader
from flowgpu.io.zarrwrite import (QuietTarget, checksummed, compressors, create, device_writes, inner_chunks,
                                  numcodecs_quiet, quiet_loads)

__all__ = ["from_zarr", "to_zarr", "device_path", "open_zarr_array", "store_zarr"]

logger = logging.getLogger("flowgpu.io")


def device_path() -> str | None:
    """Which device decodes Zarr chunks here: ``nvcomp``, ``nvcomp-kvikio``, ``fake`` or None (the CPU)."""
    mode = dask.config.get("flowgpu.zarr.device", "auto")
    if mode == "fake":
        return "fake"
    if mode != "auto" or current_backend() != "cupy":
        return None
    if dask.config.get("flowgpu.zarr.reader", "staging") != "kvikio":
        return "nvcomp"
    if importlib.util.find_spec("kvikio") is None:
        logger.warning("flowgpu.zarr.reader is kvikio, but kvikio is not installed: reading through flowgpu's staging")
        return "nvcomp"
    return "nvcomp-kvikio"


def open_zarr_array(path: str, component: str | None = None) -> zarr.Array:
    """The ``zarr.Array`` at ``path`` (``component`` in a group), or a ConfigError saying why not."""
    path = resolve(path)
    if not is_url(path) and not os.path.exists(path):
        raise ConfigError(f"zarr store {path!r} does not exist")
    if not is_url(path) and os.path.isfile(path):
        kind = named_kind(path)
        raise ConfigError(f"{path!r} is a file, not a Zarr store (a folder)" + (
            f"; named as {kind}: read it with that kind's source (flowgpu sources lists them)" if kind else ""))
    try:
        with numcodecs_quiet():
            arr = zarr.open_array(path, path=component or "", mode="r")
    except Exception as e:  # zarr raises several types for a bad store
        where = f"zarr store {path!r}{' component ' + component if component else ''}"
        arrays = _arrays_in_group(path, component)
        if arrays is not None:  # a group: say which arrays it holds
            listed = ", ".join(arrays[:20]) + (f" and {len(arrays) - 20} more" if len(arrays) > 20 else "")
            raise ConfigError(f"{where} is a group, not an array; its arrays: {listed or 'none'}; "
                              "give the one to read as component") from None
        raise ConfigError(f"could not open {where}: {e}") from None
    return arr


def _arrays_in_group(path: str, component: str | None) -> list[str] | None:
    """The arrays in the group at ``path``/``component``, sorted, or None when it is no group."""
    try:
        group = zarr.open_group(path, path=component or "", mode="r")
        return sorted(name for name, _ in group.arrays()) + sorted(
            f"{g}/{name}" for g, sub in group.groups() for name, _ in sub.arrays())
    except Exception:  # noqa: BLE001 - not a group either: the caller's message stands
        return None


def _nvcomp_missing() -> str | None:
    try:
        found = importlib.util.find_spec("nvidia.nvcomp") is not None
    except ImportError:  # no nvidia namespace at all
        found = False
    return None if found else "nvCOMP is not installed (pip install nvidia-nvcomp-cu13)"


def _note_fallback(block: Any, reason: str = "") -> Any:
    COUNTERS.fallback(reason)
    return block


class ZarrBlocks:
    """What ``dask.array.from_array`` slices for zarr-python's reads: each checks the store is there."""

    def __init__(self, arr: zarr.Array, folder: str):
        self.arr, self.folder = arr, folder
        self.shape, self.dtype, self.ndim = tuple(arr.shape), arr.dtype, arr.ndim
        self.path = folder  # what the array reads, as flowgpu's other readers say it

    def __getitem__(self, key: Any) -> Any:
        require_store(self.folder)
        try:
            return self.arr[key]
        except Exception as e:  # noqa: BLE001 - zarr raises many types for bytes that do not decode
            raise self._damaged(key, e) from e

    def _damaged(self, key: Any, error: Exception) -> OSError:
        """The error for a block that did not decode, naming the first of its files that does not."""
        unit = tuple(self.arr.shards or self.arr.chunks)
        what = "shard" if self.arr.shards else "chunk"
        key = key if isinstance(key, tuple) else (key,)
        spans = [k.indices(n)[:2] if isinstance(k, slice) else (int(k), int(k) + 1) for k, n in zip(key, self.shape)]
        grids = [range(lo // u, max(hi - 1, lo) // u + 1) for (lo, hi), u in zip(spans, unit)]
        for coords in itertools.product(*grids):
            try:
                self.arr[tuple(slice(c * u, min((c + 1) * u, n)) for c, u, n in zip(coords, unit, self.shape))]
            except Exception as e:  # noqa: BLE001 - this one is damaged
                path = os.path.join(self.folder, *self.arr.metadata.encode_chunk_key(coords).split("/"))
                return OSError(f"{path}: the {what} at grid position {coords} (in {what}s of {unit}) did not decode "
                               f"({type(e).__name__}: {e}); the store is damaged: restore it, or rewrite it from its "
                               "source")
        return OSError(f"{self.folder}: the block {tuple(slice(*s) for s in spans)} did not decode "
                       f"({type(error).__name__}: {error}); the store is damaged: restore it, or rewrite it from its source")

    def __dask_tokenize__(self) -> Any:
        return ("flowgpu-zarr", self.folder, _mtime(self.folder), self.shape, str(self.dtype), self.arr.chunks)

    def __reduce__(self) -> tuple:  # a sharded array parses its codecs again when unpickled, in each worker
        return _unpickled, (pickle.dumps(self.arr), self.folder)


def _unpickled(arr: bytes, folder: str) -> ZarrBlocks:
    return ZarrBlocks(quiet_loads(arr), folder)


def from_zarr(path: str, component: str | None = None, chunks: Any = None) -> da.Array:
    """A Zarr array as a chunked array on the session's device; chunks default to the store's (shards)."""
    path = resolve(path)
    arr = open_zarr_array(path, component)
    device = device_path()
    plan = plan_codec(arr) if device else None
    missing = _nvcomp_missing() if isinstance(plan, DevicePlan) and plan.frame.algorithm and device != "fake" else None
    if missing:
        plan = Fallback(missing)
    if isinstance(plan, DevicePlan):
        group = dask.config.get("flowgpu.zarr.read-group", None)
        reader = DeviceReader(plan, device, path, component,
                              parse_bytes(group) if isinstance(group, str) else group)
        token = da.core.tokenize(plan.root, _mtime(plan.root), plan.shape, str(plan.dtype), plan.chunk, plan.unit, plan.frame)
        meta = empty_meta(device != "fake", plan.dtype, len(plan.shape))
        x = da.from_array(reader, chunks=plan.unit, asarray=False, meta=meta, name=f"from-zarr-device-{token}",
                          inline_array=True)
    else:
        blocks = ZarrBlocks(arr, os.path.join(path, *component.split("/")) if component and not is_url(path) else path)
        # reads spread over the workers (as npy's), each inlined where its chunk is used, as dask's from_zarr
        x = da.from_array(blocks, chunks=arr.chunks, name=f"from-zarr-{da.core.tokenize(blocks)}", inline_array=True,
                          asarray=False, meta=np.empty((0,) * arr.ndim, arr.dtype))
        if isinstance(plan, Fallback):
            logger.warning("zarr %s: decoded on the CPU: %s", path, plan.reason)
            x = x.map_blocks(_note_fallback, reason=plan.reason, dtype=x.dtype, meta=x._meta)
    if chunks is not None:
        x = x.rechunk(resolve_chunks(chunks, x.shape, x.dtype))
    return x if isinstance(plan, DevicePlan) else to_device(x)


def _mtime(root: str) -> float:
    try:
        return os.path.getmtime(os.path.join(root, "zarr.json") if os.path.isdir(root) else root)
    except OSError:
        return 0.0


def _regular(x: da.Array) -> da.Array:
    """Zarr needs regular chunks: every chunk but the last of an axis the same size."""
    ok = all(len(set(c[:-1])) <= 1 and (len(c) < 2 or c[-1] <= c[0]) for c in x.chunks)
    return x if ok else x.rechunk(tuple(max(c) if c else 0 for c in x.chunks))


def store_zarr(x: da.Array, tmp: str, *, component: str | None = None, codec: str | None = None,
               level: int | None = None, chunks: Any = None, shards: Any = None, checksum: bool | None = None,
               labels: dict | None = None) -> Any:
    """The lazy write of ``x`` into a new store at ``tmp`` (inside an atomic output's staging).

    With no ``codec``/``chunks``/``shards`` on the CPU: ``dask.array.to_zarr`` (zstd). Otherwise zarr
    creates the array (default: zstd, ``x``'s chunks, or on the device, when too large for nvCOMP,
    shards of them in ~64 KiB chunks). ``labels``: ``dimension_names`` and ``attributes``."""
    device = device_path()
    if device not in (None, "fake") and codec != "none" and _nvcomp_missing():
        device = None
    if codec is None and level is None and chunks is None and shards is None and device is None and not labels:
        extra = {"compressors": compressors("zstd", checksum=True)} if checksummed(checksum) else {}  # zarr's layout
        return da.to_zarr(_regular(to_host(x)), tmp, component=component, compute=False, **extra)
    chunk_shape = tuple(chunks) if chunks is not None else tuple(max(c) if c else 1 for c in _regular(x).chunks)
    if chunks is None and shards is None and device and codec != "none" and \
            int(np.prod(chunk_shape, dtype=np.int64)) * x.dtype.itemsize > MAX_CHUNK_BYTES:
        chunk_shape, shards = inner_chunks(chunk_shape, x.dtype.itemsize), chunk_shape  # nvCOMP-sized, in shards
    arr = create(tmp, x.shape, x.dtype, codec=codec or "zstd", level=level, chunks=chunk_shape,
                 shards=tuple(shards) if shards else None, component=component, checksum=checksum, **(labels or {}))
    if device is not None:
        done = device_writes(x if device == "fake" else to_device(x), arr, device, level)
        if done is not None:
            return done
    unit = tuple(shards) if shards else chunk_shape
    return to_host(x).rechunk(unit).store(QuietTarget(arr), lock=False, compute=False)  # whole units per task


def to_zarr(x: da.Array, path: str, overwrite: bool = False, component: str | None = None, codec: str | None = None,
            level: int | None = None, chunks: Any = None, shards: Any = None, checksum: bool | None = None) -> str:
    """Write ``x`` (a dask array, or one in memory) to a new Zarr store at ``path``; it appears there
    only when complete.

    ``codec`` (``zstd``, ``lz4``, ``none``), ``chunks`` and ``shards`` choose the store's layout
    (see :func:`store_zarr`); on a GPU session the chunks are encoded on the device. With
    ``checksum`` (default ``flowgpu.zarr.checksum``) each chunk ends in zarr's ``crc32c``, checked on
    every read."""
    refuse_misnamed(path, writer="to_zarr")
    x = x if hasattr(x, "__dask_graph__") else da.asarray(x)  # one in memory: chunked as dask chooses
    with atomic_output(path, overwrite, meta={"format": "zarr"}, reads=files_read(x)) as tmp:
        target = store_zarr(x, tmp, component=component, codec=codec, level=level, chunks=chunks, shards=shards,
                            checksum=checksum)
        dask.compute(target)
    return path
