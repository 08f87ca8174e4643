"""Writing Zarr stores from device chunks: encoded on the device, written through pinned buffers.

zarr-python creates the array (:func:`create`); each task encodes its unit's chunks (a shard, or
one chunk) as one batch, lays the payloads out as the unit's file on the device (each at a 256-byte
offset, so readers never copy to align), copies it to pinned memory at once, frames each chunk as
zarr's codec expects (LZ4's size header, zstd's content size, an optional ``crc32c``) and writes
the file, with a shard's index, in pieces on parallel threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import struct
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import wait
from typing import Any

import dask.array as da
import google_crc32c
import numpy as np
import zarr

from flowgpu import config
from flowgpu.errors import ConfigError
from flowgpu.io import faults
from flowgpu.io.devcodec import MAX_U64, DevicePlan, Fallback, plan_codec, run_offsets
from flowgpu.io.devices import device_for
from flowgpu.io.storage import COUNTERS
from flowgpu.transfer.pinned import shared_executor

__all__ = ["CODECS", "check_layout", "create", "device_writes", "compressors", "inner_chunks", "numcodecs_quiet",
           "quiet_loads", "QuietTarget"]

CODECS = ("zstd", "lz4", "none")
INNER_BYTES = 64 << 10  # nvCOMP's batched decoders want many small chunks: a 1 GiB shard on an H200 decodes at
# 41 GB/s (zstd) and 53 (lz4) in 64 KiB chunks, 17 and 22 in 1 MiB ones (benchmarks/probes/nvcomp_batch.py)
WRITE_PIECE = 16 << 20  # a unit's file is written in pieces of this many bytes, on up to WRITERS threads
WRITERS = 16  # copies into the page cache scale with threads (one moves 1.3-3 GB/s on the H200 machine)

logger = logging.getLogger("flowgpu.io")


def inner_chunks(unit: tuple, itemsize: int, target: int = INNER_BYTES, divides: bool = True) -> tuple:
    """Chunks of about ``target`` bytes at most, whole trailing axes first, split on one axis; with
    ``divides`` each axis divides ``unit``'s (the chunks tile a shard).

    >>> inner_chunks((2048, 131072), 4), inner_chunks((1000, 500), 4, 400_000, divides=False)
    ((1, 16384), (200, 500))
    """
    out = list(unit)
    for axis in range(len(unit)):
        below = int(np.prod(unit[axis + 1:], dtype=np.int64)) * itemsize
        if below <= target or axis == len(unit) - 1:
            most = min(unit[axis], max(1, target // max(below, 1)))
            out[axis] = max(d for d in range(1, most + 1) if unit[axis] % d == 0) if divides else max(1, most)
            break
        out[axis] = 1
    return tuple(max(1, n) for n in out)


def checksummed(checksum: bool | None) -> bool:
    """Whether chunks end in zarr's ``crc32c``: ``checksum``, or ``flowgpu.zarr.checksum`` when None."""
    return bool(config.get("zarr.checksum")) if checksum is None else bool(checksum)


@contextlib.contextmanager
def numcodecs_quiet() -> Iterator[None]:
    """zarr's notice that numcodecs codecs (flowgpu's lz4) are not in the Zarr 3 spec left out: zarr gives
    it whenever it parses such a codec, also unpickling a sharded array in each worker."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Numcodecs codecs are not in the Zarr version 3")
        yield


def quiet_loads(pickled: bytes) -> Any:
    """``pickle.loads`` of a zarr array (or what holds one) with :func:`numcodecs_quiet`."""
    with numcodecs_quiet():
        return pickle.loads(pickled)


class QuietTarget:
    """``arr`` as dask's store writes it: unpickled in each worker without zarr's numcodecs notice."""

    def __init__(self, arr: zarr.Array):
        self.arr, self.shape, self.dtype = arr, arr.shape, arr.dtype

    def __setitem__(self, key: Any, value: Any) -> None:
        self.arr[key] = value

    def __reduce__(self) -> tuple:
        return _quiet_target, (pickle.dumps(self.arr),)


def _quiet_target(arr: bytes) -> QuietTarget:
    return QuietTarget(quiet_loads(arr))


def compressors(codec: str, level: int | None = None, checksum: bool | None = None) -> list:
    """zarr's byte codecs for ``codec`` (``zstd``, ``lz4`` or ``none``), then, with ``checksum``
    (default ``flowgpu.zarr.checksum``), ``crc32c``: a damaged chunk is then an error on read."""
    if level is not None and (codec != "zstd" or isinstance(level, bool) or not isinstance(level, (int, np.integer))
                              or not -131072 <= level <= 22):
        raise ConfigError(f"zarr level {level!r} " + ("is for codec zstd only; leave it out for codec "
                                                      f"{codec!r}" if codec != "zstd" else
                                                      "is not a zstd level: give a whole number from -131072 (fastest) "
                                                      "to 22 (smallest), 3 being zstd's default"))
    if codec == "zstd":
        out = [zarr.codecs.ZstdCodec(level=0 if level is None else int(level))]
    elif codec == "lz4":
        with numcodecs_quiet():
            out = [zarr.codecs.numcodecs.LZ4()]
    elif codec == "none":
        out = []
    else:
        raise ConfigError(f"zarr codec {codec!r} is not one flowgpu writes; choose one of {', '.join(CODECS)}")
    return out + [zarr.codecs.Crc32cCodec()] if checksummed(checksum) else out


def check_layout(shape: tuple, chunks: Any, shards: Any) -> None:
    """Refuse ``chunks`` / ``shards`` that do not fit ``shape`` (a ConfigError naming which)."""
    for what, v in (("chunks", chunks), ("shards", shards)):
        if v is not None and (len(v) != len(shape) or any(int(n) < 1 for n in v)):
            raise ConfigError(f"zarr {what} {list(v)}: give one length >= 1 per axis of the {len(shape)}-d array "
                              f"{list(shape)}")
    if shards and chunks and any(int(s) % int(c) for s, c in zip(shards, chunks)):
        raise ConfigError(f"zarr shards {list(shards)} are not whole multiples of chunks {list(chunks)}; "
                          "make each shard length a multiple of the chunk length")


def create(path: str, shape: tuple, dtype: Any, *, codec: str = "zstd", level: int | None = None,
           chunks: tuple, shards: tuple | None = None, component: str | None = None,
           checksum: bool | None = None, dimension_names: tuple | None = None,
           attributes: dict | None = None) -> zarr.Array:
    """A new Zarr 3 array at ``path`` (``component`` inside a group there), its metadata written by
    zarr, with ``dimension_names`` and ``attributes`` when given."""
    check_layout(shape, chunks, shards)
    store = path if component is None else os.path.join(path, *component.split("/"))
    if component is not None:
        zarr.open_group(path, mode="a")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return zarr.create_array(store, shape=tuple(shape), dtype=np.dtype(dtype), chunks=tuple(chunks),
                                 shards=tuple(shards) if shards else None,
                                 compressors=compressors(codec, level, checksum) or None,
                                 fill_value=0, zarr_format=3, overwrite=False, dimension_names=dimension_names,
                                 attributes=attributes)


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _write_at(fd: int, view: memoryview, at: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], at + done)


def _pwrite(fd: int, parts: list) -> int:
    """Write ``parts`` one after another from the file's start, in pieces on up to ``WRITERS`` threads
    (``os.pwrite`` lets the GIL go); the bytes written."""
    jobs, at = [], 0
    for p in parts:
        view = memoryview(p).cast("B")
        jobs += [(view[a:a + WRITE_PIECE], at + a) for a in range(0, len(view), WRITE_PIECE)]
        at += len(view)
    if len(jobs) > 1:
        futures = [shared_executor("flowgpu-zarr", WRITERS).submit(_write_at, fd, v, a) for v, a in jobs]
        wait(futures)  # every piece done before one's error is raised and the file closed
        for f in futures:
            f.result()
    elif jobs:
        _write_at(fd, *jobs[0])
    return at


def _chunks_of(block: Any, plan: DevicePlan, lo: tuple, xp: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """``(flat uint8 buffer, offset of each chunk, chunk coordinates)``: the block itself when each
    chunk is a contiguous run of it, else the chunks copied out (edges padded with the fill value)."""
    shape = tuple(block.shape)
    per = [-(-s // c) for s, c in zip(shape, plan.chunk)]
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=np.int64) for n in per], indexing="ij"), -1).reshape(-1, len(per))
    coords = grid + np.array([l // c for l, c in zip(lo, plan.chunk)], np.int64)
    at = run_offsets(shape, plan.chunk, grid, (0,) * len(shape), plan.dtype.itemsize)
    if at is not None and not (at % 16).any():  # nvCOMP reads each chunk from a 16-byte aligned address
        return xp.ascontiguousarray(block).reshape(-1).view(np.uint8), at, coords
    nbytes = int(np.prod(plan.chunk, dtype=np.int64)) * plan.dtype.itemsize
    stride = -(-nbytes // 16) * 16
    flat = xp.zeros(len(grid) * stride, np.uint8)
    for i, idx in enumerate(grid.tolist()):
        a = [j * c for j, c in zip(idx, plan.chunk)]
        b = [min(ai + c, s) for ai, c, s in zip(a, plan.chunk, shape)]
        part = block[tuple(slice(ai, bi) for ai, bi in zip(a, b))]
        if part.shape != plan.chunk:
            full = xp.full(plan.chunk, plan.fill_value, plan.dtype)
            full[tuple(slice(0, bi - ai) for ai, bi in zip(a, b))] = part
            part = full
        flat[i * stride:i * stride + nbytes] = xp.ascontiguousarray(part).reshape(-1).view(np.uint8)
    return flat, np.arange(len(grid), dtype=np.int64) * stride, coords


ZSTD_ROOM = 8  # the content size a zstd header may lack (written in front of the payload, see _frames)
_DICT_BYTES = np.array([0, 1, 2, 4], np.int64)


def _frames(plan: DevicePlan, host: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
            nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Frame the payloads in ``host`` in place as zarr's codec stores them; their ``(offsets, sizes)``.

    LZ4 gets numcodecs' 4-byte size in front; a zstd frame gets its content size (its header grows
    into the room :func:`layout` left) or, having one, moves down: either way it starts aligned."""
    if plan.frame.algorithm == "LZ4":
        host[(starts - 4)[:, None] + np.arange(4)] = np.frombuffer(struct.pack("<I", nbytes), np.uint8)
        return starts - 4, sizes + 4
    if plan.frame.algorithm != "Zstd":
        return starts, sizes
    magic = np.frombuffer(ZSTD_MAGIC, np.uint8)
    # frames the device already put at the aligned offset (they had their size): the gaps are zeros, no false match
    placed = (host[(starts - ZSTD_ROOM)[:, None] + np.arange(4)] == magic).all(axis=1)
    rest = ~placed
    if (host[starts[rest][:, None] + np.arange(4)] != magic).any():
        raise RuntimeError("the device's zstd encoder wrote a chunk that is not a zstd frame")
    fhd = host[starts + 4].astype(np.int64)
    sizeless = rest & ((fhd >> 6) == 0) & ((fhd & 0x20) == 0)
    size_bytes = np.frombuffer(int(nbytes).to_bytes(8, "little"), np.uint8)
    dict_bytes = _DICT_BYTES[fhd & 3]
    for d in np.unique(dict_bytes[sizeless]).tolist():  # nvCOMP: no dictionary, one pass
        these = sizeless & (dict_bytes == d)
        at = starts[these]
        keep = 6 + d  # magic, descriptor, window descriptor, dictionary id
        kept = host[at[:, None] + np.arange(5, keep)]  # window descriptor and dictionary id, read first
        base = at - ZSTD_ROOM
        host[base[:, None] + np.arange(4)] = magic
        host[base + 4] = (fhd[these] | 0xC0).astype(np.uint8)
        host[(base + 5)[:, None] + np.arange(keep - 5)] = kept
        host[(base + keep)[:, None] + np.arange(8)] = size_bytes
    moved = rest & ~sizeless
    for at, n in zip(starts[moved].tolist(), sizes[moved].tolist()):  # a size already: move it down
        host[at - ZSTD_ROOM:at - ZSTD_ROOM + n] = host[at:at + n].copy()
    return starts - ZSTD_ROOM, sizes + np.where(sizeless, ZSTD_ROOM, 0)


def _checksums(host: np.ndarray, at: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Append to each framed chunk ``host[at:at + n]`` its little-endian ``crc32c``; the new sizes."""
    crcs = np.fromiter((google_crc32c.value(host[a:a + k]) for a, k in zip(at.tolist(), n.tolist())), "<u4", len(at))
    host[(at + n)[:, None] + np.arange(4)] = crcs.view(np.uint8).reshape(-1, 4)
    return n + 4


def _write_unit(block: Any, plan: DevicePlan = None, device: str = "nvcomp", level: int | None = None,
                block_info: Any = None):
    """Encode one unit's chunks as a batch, laid out in one host buffer, and write it with its index."""
    dev = device_for(device)
    lo = tuple(a for a, _ in block_info[0]["array-location"])
    unit = tuple(l // u for l, u in zip(lo, plan.unit))
    t0 = time.perf_counter()
    flat, offsets, coords = _chunks_of(block, plan, lo, dev.xp)
    nbytes = int(np.prod(plan.chunk, dtype=np.int64)) * plan.dtype.itemsize
    room = ZSTD_ROOM if plan.frame.algorithm == "Zstd" else 0
    tail = 4 if plan.frame.checksum else 0
    host, starts, sizes = dev.pack(plan.frame.algorithm, flat, offsets, nbytes, level, plan.frame.head, room, tail)
    at, n = _frames(plan, host, starts, sizes, nbytes)
    if plan.frame.checksum:
        n = _checksums(host, at, n)
    t1 = time.perf_counter()
    COUNTERS.add("encode", nbytes * len(offsets), t1 - t0, count=len(offsets))
    faults.point("zarr:unit-writing")
    path = plan.path(unit)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if not plan.sharded:
            written = _pwrite(fd, [host[int(at[0]):int(at[0] + n[0])]])
        else:
            index = np.full((*plan.chunks_per_unit, 2), MAX_U64, "<u8")
            local = coords - np.array([u * p for u, p in zip(unit, plan.chunks_per_unit)], np.int64)
            index[tuple(local.T)] = np.stack([at, n], axis=-1).astype("<u8")
            body = index.tobytes()
            end = int((at + n).max()) if len(at) else 0
            written = _pwrite(fd, [host[:end], body, np.array([google_crc32c.value(body)], "<u4").tobytes()])
    finally:
        os.close(fd)
    COUNTERS.add("write", written, time.perf_counter() - t1)
    faults.point("zarr:unit-written")
    return np.zeros((1,) * block.ndim, np.int8)


def device_writes(x: da.Array, arr: zarr.Array, device: str, level: int | None = None) -> da.Array | None:
    """A lazy array whose tasks write ``x``'s units into ``arr`` from the device; None: zarr writes it."""
    plan = plan_codec(arr)
    if isinstance(plan, Fallback) or plan.frame.algorithm not in (None, "Zstd", "LZ4"):
        logger.warning("zarr %s: encoded by zarr on the CPU: %s", arr.store_path,
                       plan.reason if isinstance(plan, Fallback) else f"no device encoder for {plan.frame.algorithm}")
        return None
    x = x.rechunk(plan.unit)
    return x.map_blocks(_write_unit, plan=plan, device=device, level=level, dtype=np.int8,
                        chunks=tuple((1,) * len(c) for c in x.chunks), meta=np.empty((0,) * x.ndim, np.int8))
