"""Writing Zarr stores from device chunks: encoded on the device, written through pinned buffers.

zarr-python creates the array (its metadata, codecs, shard layout: :func:`create`); each task then
encodes the chunks of its unit (a shard, or one chunk) as one batch on the device, copies the
compressed bytes into pinned host memory and writes them to the unit's file, with the framing
zarr's codec expects (numcodecs' LZ4 size header) and, for a shard, its index and checksum. The
store is written inside an atomic output's staging directory, so a failed write leaves nothing.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import warnings
from typing import Any

import dask.array as da
import google_crc32c
import numpy as np
import zarr

from flowgpu.errors import ConfigError
from flowgpu.io import faults
from flowgpu.io.devcodec import MAX_U64, DevicePlan, Fallback, device_for, plan_codec, zstd_with_size
from flowgpu.io.storage import COUNTERS

__all__ = ["CODECS", "create", "device_writes", "compressors", "inner_chunks"]

CODECS = ("zstd", "lz4", "none")
INNER_BYTES = 4 << 20

logger = logging.getLogger("flowgpu.io")


def inner_chunks(unit: tuple, itemsize: int, target: int = INNER_BYTES) -> tuple:
    """Chunks of about ``target`` bytes that tile ``unit`` exactly (whole trailing axes first), for a
    shard of ``unit``: each axis of the result divides the unit's.

    >>> inner_chunks((2048, 131072), 4)
    (8, 131072)
    >>> inner_chunks((1000, 3000), 8)
    (125, 3000)
    """
    out = list(unit)
    for axis in range(len(unit)):
        below = int(np.prod(unit[axis + 1:], dtype=np.int64)) * itemsize
        if below <= target or axis == len(unit) - 1:
            most = max(1, target // max(below, 1))
            out[axis] = max(d for d in range(1, min(unit[axis], most) + 1) if unit[axis] % d == 0)
            return tuple(out)
        out[axis] = 1
    return tuple(out)


def compressors(codec: str, level: int | None = None) -> Any:
    """zarr's compressor for ``codec`` (``zstd``, ``lz4`` or ``none``)."""
    if codec == "zstd":
        return zarr.codecs.ZstdCodec(level=0 if level is None else int(level))
    if codec == "lz4":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numcodecs codecs are not in the Zarr 3 spec; zarr says so
            return zarr.codecs.numcodecs.LZ4()
    if codec == "none":
        return None
    raise ConfigError(f"zarr codec {codec!r} is not one flowgpu writes; choose one of {', '.join(CODECS)}")


def create(path: str, shape: tuple, dtype: Any, *, codec: str = "zstd", level: int | None = None,
           chunks: tuple, shards: tuple | None = None, component: str | None = None) -> zarr.Array:
    """A new Zarr 3 array at ``path`` (``component`` inside a group there), its metadata written by zarr."""
    for what, v in (("chunks", chunks), ("shards", shards)):
        if v is not None and (len(v) != len(shape) or any(int(n) < 1 for n in v)):
            raise ConfigError(f"zarr {what} {list(v)}: give one length >= 1 per axis of the {len(shape)}-d array "
                              f"{list(shape)}")
    if shards and any(int(s) % int(c) for s, c in zip(shards, chunks)):
        raise ConfigError(f"zarr shards {list(shards)} are not whole multiples of chunks {list(chunks)}; "
                          "make each shard length a multiple of the chunk length")
    store = path if component is None else os.path.join(path, *component.split("/"))
    if component is not None:
        zarr.open_group(path, mode="a")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return zarr.create_array(store, shape=tuple(shape), dtype=np.dtype(dtype), chunks=tuple(chunks),
                                 shards=tuple(shards) if shards else None, compressors=compressors(codec, level),
                                 fill_value=0, zarr_format=3, overwrite=False)


def _pwrite(fd: int, parts: list, path: str) -> int:
    at = 0
    for p in parts:
        view = memoryview(p).cast("B")
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], at + done)
        at += len(view)
    return at


def _chunks_of(block: Any, plan: DevicePlan, lo: tuple, xp: Any) -> tuple[list, list]:
    """The chunks of a unit (edges padded with the fill value) and their coordinates in the grid."""
    shape = block.shape
    per = [-(-s // c) for s, c in zip(shape, plan.chunk)]
    out, coords = [], []
    for idx in np.ndindex(*per):
        a = [i * c for i, c in zip(idx, plan.chunk)]
        b = [min(ai + c, s) for ai, c, s in zip(a, plan.chunk, shape)]
        part = block[tuple(slice(ai, bi) for ai, bi in zip(a, b))]
        if part.shape != plan.chunk:
            full = xp.full(plan.chunk, plan.fill_value, plan.dtype)
            full[tuple(slice(0, bi - ai) for ai, bi in zip(a, b))] = part
            part = full
        out.append(xp.ascontiguousarray(part).reshape(-1).view(np.uint8))
        coords.append(tuple((l + ai) // c for l, ai, c in zip(lo, a, plan.chunk)))
    return out, coords


def _framed(plan: DevicePlan, payload: Any, nbytes: int) -> list:
    """The parts zarr's codec stores for one encoded chunk (written with one ``pwritev``, no copy)."""
    if plan.frame.algorithm == "LZ4":
        return [struct.pack("<I", nbytes), payload]
    if plan.frame.algorithm == "Zstd":
        raw = memoryview(payload).cast("B")
        header, n = zstd_with_size(bytes(raw[:32]), nbytes)
        if n:
            return [header, raw[n:]]
    return [payload]


def _write_unit(block: Any, plan: DevicePlan = None, device: str = "nvcomp", level: int | None = None,
                block_info: Any = None):
    dev = device_for(device)
    lo = tuple(a for a, _ in block_info[0]["array-location"])
    unit = tuple(l // u for l, u in zip(lo, plan.unit))
    t0 = time.perf_counter()
    raws, coords = _chunks_of(block, plan, lo, dev.xp)
    nbytes = raws[0].size if raws else 0
    enc = dev.encode(plan.frame.algorithm, raws, level) if plan.frame.algorithm else raws
    host = [dev.to_host(e) for e in enc]
    t1 = time.perf_counter()
    COUNTERS.add("encode", nbytes * len(raws), t1 - t0, count=len(raws))
    path = plan.path(unit)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if not plan.sharded:
            written = _pwrite(fd, _framed(plan, host[0], nbytes), path)
        else:
            index = np.full((*plan.chunks_per_unit, 2), MAX_U64, "<u8")
            parts, at = [], 0
            for c, h in zip(coords, host):
                framed = _framed(plan, h, nbytes)
                size = sum(memoryview(p).nbytes for p in framed)
                index[tuple(ci - ui * p for ci, ui, p in zip(c, unit, plan.chunks_per_unit))] = (at, size)
                parts += framed
                at += size
            body = index.tobytes()
            parts += [body, np.array([google_crc32c.value(body)], "<u4").tobytes()]
            written = _pwrite(fd, parts, path)
    finally:
        os.close(fd)
    COUNTERS.add("write", written, time.perf_counter() - t1)
    faults.point("zarr:unit-written")
    return np.zeros((1,) * block.ndim, np.int8)


def device_writes(x: da.Array, arr: zarr.Array, device: str, level: int | None = None) -> da.Array | None:
    """A lazy array whose tasks write ``x``'s units into ``arr`` from the device; None when the
    array's codecs are not written on the device (then zarr writes it)."""
    plan = plan_codec(arr)
    if isinstance(plan, Fallback) or plan.frame.algorithm not in (None, "Zstd", "LZ4"):
        logger.warning("zarr %s: encoded by zarr on the CPU: %s", arr.store_path,
                       plan.reason if isinstance(plan, Fallback) else f"no device encoder for {plan.frame.algorithm}")
        return None
    x = x.rechunk(plan.unit)
    return x.map_blocks(_write_unit, plan=plan, device=device, level=level, dtype=np.int8,
                        chunks=tuple((1,) * len(c) for c in x.chunks), meta=np.empty((0,) * x.ndim, np.int8))
