"""Writing Zarr stores from device chunks: encoded on the device, written through pinned buffers.

zarr-python creates the array (its metadata, codecs, shard layout: :func:`create`); each task then
encodes the chunks of its unit (a shard, or one chunk) as one batch on the device, lays the
compressed payloads out as the unit's file on the device (each payload nvCOMP will read at a
256-byte offset, so that readers never copy one to align it; the gaps are legal in a shard, its
index says where each chunk is), copies that to pinned host memory at once, frames each chunk
there as zarr's codec expects (numcodecs' LZ4 size header, zstd's content size) and writes the
file, with a shard's index and checksum, in pieces on parallel threads. The store is written
inside an atomic output's staging directory, so a failed write leaves nothing.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import dask.array as da
import google_crc32c
import numpy as np
import zarr

from flowgpu.errors import ConfigError
from flowgpu.io import faults
from flowgpu.io.devcodec import MAX_U64, DevicePlan, Fallback, device_for, plan_codec
from flowgpu.io.storage import COUNTERS

__all__ = ["CODECS", "create", "device_writes", "compressors", "inner_chunks", "zstd_with_size"]

CODECS = ("zstd", "lz4", "none")
INNER_BYTES = 4 << 20
WRITE_PIECE = 64 << 20  # a unit's file is written in pieces of this many bytes, on up to WRITERS threads
WRITERS = 8
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()

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


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def zstd_with_size(head: bytes, size: int) -> tuple[bytes, int]:
    """A zstd frame's header with its content size (RFC 8878, 3.1.1.1), for a frame that lacks it.

    ``head`` is the frame's first bytes (at least 6). Returns ``(header, n)``: write ``header``
    in place of the frame's first ``n`` bytes. A streaming encoder (nvCOMP's) may leave the size
    out; decoders that allocate from it (older numcodecs, some zarr.js codecs) then refuse the chunk.

    >>> import numcodecs, numpy as np
    >>> f = numcodecs.Zstd().encode(np.arange(1 << 20, dtype="f4"))  # 4 MiB: window, 4-byte size
    >>> stripped = f[:4] + bytes([f[4] & 0x3F]) + f[5:6] + f[10:]  # the same frame without its size
    >>> header, n = zstd_with_size(stripped[:6], 4 << 20)
    >>> header + stripped[n:] == f[:4] + bytes([0xC0]) + f[5:6] + (4 << 20).to_bytes(8, "little") + f[10:]
    True
    """
    if head[:4] != ZSTD_MAGIC or len(head) < 6:
        return b"", 0
    fhd = head[4]
    if fhd >> 6 or fhd & 0x20:  # a size field already (single-segment frames always have one)
        return b"", 0
    dict_len = (0, 1, 2, 4)[fhd & 3]
    keep = 6 + dict_len  # magic, descriptor, window descriptor, dictionary id
    if len(head) < keep:
        return b"", 0
    return (ZSTD_MAGIC + bytes([fhd | 0xC0]) + bytes(head[5:keep]) + int(size).to_bytes(8, "little"), keep)


def _writers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=min(WRITERS, os.cpu_count() or 1), thread_name_prefix="flowgpu-zarr")
        return _pool


def _write_at(fd: int, view: memoryview, at: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], at + done)


def _pwrite(fd: int, parts: list, path: str) -> int:
    """Write ``parts`` one after another from the file's start, in pieces of ``WRITE_PIECE`` bytes
    on parallel threads (``os.pwrite`` lets the GIL go; copies into the page cache scale with
    threads, one thread moves about 3 GB/s). Returns the bytes written."""
    jobs, at = [], 0
    for p in parts:
        view = memoryview(p).cast("B")
        jobs += [(view[a:a + WRITE_PIECE], at + a) for a in range(0, len(view), WRITE_PIECE)]
        at += len(view)
    if len(jobs) > 1:
        futures = [_writers().submit(_write_at, fd, v, a) for v, a in jobs]
        wait(futures)  # every piece done before one's error is raised and the file closed
        for f in futures:
            f.result()
    elif jobs:
        _write_at(fd, *jobs[0])
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


ZSTD_ROOM = 8  # the content size a zstd header may lack (written in front of the payload, see zstd_with_size)


def _frame(plan: DevicePlan, host: np.ndarray, at: int, n: int, nbytes: int) -> tuple[int, int]:
    """Frame the payload ``host[at:at + n]`` in place as zarr's codec stores it; its ``(offset, size)``.

    LZ4 gets numcodecs' 4-byte size in front; a zstd frame gets its content size (the header grows
    by 8 into the room :func:`layout` left) or, having one, moves 8 bytes down: either way the
    frame starts where the layout aligned it."""
    if plan.frame.algorithm == "LZ4":
        host[at - 4:at] = np.frombuffer(struct.pack("<I", nbytes), np.uint8)
        return at - 4, n + 4
    if plan.frame.algorithm == "Zstd":
        header, k = zstd_with_size(bytes(host[at:at + 32]), nbytes)
        if k:
            host[at - ZSTD_ROOM:at + k] = np.frombuffer(header, np.uint8)
            return at - ZSTD_ROOM, n + ZSTD_ROOM
        host[at - ZSTD_ROOM:at - ZSTD_ROOM + n] = host[at:at + n].copy()
        return at - ZSTD_ROOM, n
    return at, n


def _write_unit(block: Any, plan: DevicePlan = None, device: str = "nvcomp", level: int | None = None,
                block_info: Any = None):
    """Encode one unit's chunks as a batch, lay them out in one host buffer (each payload aligned
    for nvCOMP's reads, :func:`~flowgpu.io.devcodec.layout`), copied from the device at once, and
    write it with its index: one device-to-host copy and one ``pwritev`` per unit."""
    dev = device_for(device)
    lo = tuple(a for a, _ in block_info[0]["array-location"])
    unit = tuple(l // u for l, u in zip(lo, plan.unit))
    t0 = time.perf_counter()
    raws, coords = _chunks_of(block, plan, lo, dev.xp)
    nbytes = raws[0].size if raws else 0
    room = ZSTD_ROOM if plan.frame.algorithm == "Zstd" else 0
    host, starts, sizes = dev.pack(plan.frame.algorithm, raws, level, plan.frame.head, room)
    frames = [_frame(plan, host, at, n, nbytes) for at, n in zip(starts, sizes)]
    t1 = time.perf_counter()
    COUNTERS.add("encode", nbytes * len(raws), t1 - t0, count=len(raws))
    path = plan.path(unit)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if not plan.sharded:
            (at, n), = frames
            written = _pwrite(fd, [host[at:at + n]], path)
        else:
            index = np.full((*plan.chunks_per_unit, 2), MAX_U64, "<u8")
            for c, f in zip(coords, frames):
                index[tuple(ci - ui * p for ci, ui, p in zip(c, unit, plan.chunks_per_unit))] = f
            body = index.tobytes()
            end = max((at + n for at, n in frames), default=0)
            written = _pwrite(fd, [host[:end], body, np.array([google_crc32c.value(body)], "<u4").tobytes()], path)
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
