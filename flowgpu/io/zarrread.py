"""Reading Zarr chunks straight to the device: compressed bytes up, decoded there.

A :class:`DeviceReader` is what ``dask.array.from_array`` slices, one block per task (only the plan
travels in the graph). A block is a whole number of *units*: the files of the array (its chunks, or
its shards). For each unit the task

1. finds the file through zarr's chunk key encoding (``c/0/1`` for Zarr 3, ``0.1`` for v2); a
   file that is not there is the fill value;
2. reads the compressed bytes it needs with ``os.preadv`` into pinned staging buffers and copies
   them to the device (one read, in pipelined slices, per file: a shard's index is read first,
   on the host, then every inner chunk it holds in one range from an aligned offset; a chunk
   file from its payload on). Payloads nvCOMP cannot read in place (not 16-byte aligned: stores
   flowgpu did not write) are gathered into one aligned device buffer;
3. decodes every chunk of the block as one batch (nvCOMP), and places the decoded chunks (edge
   chunks cut to the array) into the block.

:func:`read_plan` lists what step 1 and 2 read, for a block, without reading the data: which
files, which byte ranges, which chunks are missing (what the tests check).
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from typing import NamedTuple

import google_crc32c
import numpy as np
import zarr

from flowgpu.io.devcodec import ALIGN, MAX_U64, DevicePlan, device_for, read_exact
from flowgpu.io.storage import COUNTERS

__all__ = ["DeviceReader", "ChunkRead", "UnitRead", "read_plan", "shard_index"]


class ChunkRead(NamedTuple):
    """One chunk to decode: where its payload lies in its unit's read range, and where it goes
    (a tuple: thousands are made per shard)."""

    coords: tuple  # chunk coordinates in the array's chunk grid
    start: int  # payload offset into the unit's range (framing already skipped)
    stop: int


@dataclass(frozen=True)
class UnitRead:
    """One file of a block: the byte range read, the chunks in it, the chunks missing."""

    path: str
    offset: int
    nbytes: int
    chunks: tuple[ChunkRead, ...]
    missing: tuple[tuple, ...]  # chunk coordinates that are the fill value


def shard_index(plan: DevicePlan, path: str, size: int) -> np.ndarray:
    """A shard's ``(offset, nbytes)`` per inner chunk, read from its file and checked (crc32c)."""
    n = plan.index_bytes()
    at = size - n if plan.index_at_end else 0
    if at < 0:
        raise OSError(f"{path}: {size} bytes, too short for its shard index of {n}")
    raw = bytearray(n)
    fd = os.open(path, os.O_RDONLY)
    try:
        read_exact(fd, raw, at, path)
    finally:
        os.close(fd)
    body, crc = bytes(raw[:-4]), int(np.frombuffer(bytes(raw[-4:]), "<u4")[0])
    if google_crc32c.value(body) != crc:
        raise OSError(f"{path}: shard index checksum mismatch (the file is damaged)")
    return np.frombuffer(body, "<u8").reshape(*plan.chunks_per_unit, 2)


def _grid(plan: DevicePlan) -> tuple:
    return tuple(-(-s // c) for s, c in zip(plan.shape, plan.chunk))


def _unit_read(plan: DevicePlan, unit: tuple) -> UnitRead | None:
    path = plan.path(unit)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        size = None
    per = plan.chunks_per_unit
    grid = _grid(plan)
    inner = [c for c in itertools.product(*(range(u * p, min((u + 1) * p, g)) for u, p, g in zip(unit, per, grid)))]
    if size is None:
        return UnitRead(path, 0, 0, (), tuple(inner))
    head, tail = plan.frame.head, plan.frame.tail
    if not plan.sharded:  # the read starts at the payload (a device buffer is aligned): no copy for nvCOMP
        if size <= head + tail and plan.frame.algorithm:
            raise OSError(f"{path}: {size} bytes, too short for a {plan.frame.algorithm} chunk (the store is damaged)")
        return UnitRead(path, head, size - head, (ChunkRead(inner[0], 0, size - head - tail),), ())
    index = shard_index(plan, path, size)
    first = np.array([u * p for u, p in zip(unit, per)])
    local = np.array(inner, dtype=np.int64).reshape(len(inner), len(per)) - first  # one row per inner chunk
    entries = index[tuple(local.T)]
    have = entries[:, 0] != MAX_U64
    off, n = (np.where(have, entries[:, k], 0).astype(np.int64) for k in (0, 1))
    missing = tuple(c for c, h in zip(inner, have.tolist()) if not h)
    if not have.any():
        return UnitRead(path, 0, 0, (), missing)
    lo = int(off[have].min()) // ALIGN * ALIGN  # the payloads flowgpu aligned stay aligned
    hi = int((off + n)[have].max())
    starts, stops = (off - lo + head).tolist(), (off - lo + n - tail).tolist()
    chunks = tuple(ChunkRead(c, a, b) for c, a, b, h in zip(inner, starts, stops, have.tolist()) if h)
    return UnitRead(path, lo, hi - lo, chunks, missing)


def read_plan(plan: DevicePlan, key: tuple) -> list[UnitRead] | None:
    """The files and byte ranges a block ``key`` (a tuple of slices) reads; None when the block is
    not a whole number of units (then it is read through zarr)."""
    units = []
    for k, n, u in zip(key, plan.shape, plan.unit):
        start, stop, step = k.indices(n)
        if step != 1 or start % u or (stop % u and stop != n) or stop <= start:
            return None
        units.append(range(start // u, -(-stop // u)))
    return [r for r in (_unit_read(plan, unit) for unit in itertools.product(*units)) if r is not None]


def _slots(plan: DevicePlan, xp, lo: tuple, hi: tuple, coords: list, chunk_bytes: int) -> tuple:
    """``(block, slots)``: when every chunk is a whole run of the block's rows in C order (chunks
    spanning the trailing axes, none cut by the array's end), the block and, per chunk, the bytes
    of it the chunk decodes into; else ``(None, None)``. Saves a copy and a block of memory."""
    shape = tuple(b - a for a, b in zip(lo, hi))
    if plan.chunk[1:] != shape[1:] or chunk_bytes % 16:  # nvCOMP's outputs start 16-byte aligned
        return None, None
    rows = plan.chunk[0]
    if any((c[0] + 1) * rows > hi[0] for c in coords):  # the last chunk runs past the array's end
        return None, None
    block = xp.empty(shape, plan.dtype)
    flat = block.reshape(-1).view(np.uint8)
    row_bytes = chunk_bytes // rows
    return block, [flat[(c[0] * rows - lo[0]) * row_bytes:(c[0] * rows - lo[0]) * row_bytes + chunk_bytes]
                   for c in coords]


def _groups(r: UnitRead, limit: int | None) -> list[tuple]:
    """``r`` as reads of about ``limit`` bytes at most, ``(path, offset, nbytes, chunks)`` with the
    chunks' ranges relative to each: cut between chunks in file order, each from an aligned offset
    and up to its last payload's end. One read of it all when ``limit`` is None or not exceeded."""
    if not limit or r.nbytes <= limit or len(r.chunks) < 2:
        return [(r.path, r.offset, r.nbytes, r.chunks)]
    parts, part = [], []
    for c in sorted(r.chunks, key=lambda c: c.start):
        if part and c.stop - part[0].start > limit:
            parts.append(part)
            part = []
        part.append(c)
    out = []
    for part in parts + [part]:
        a = (r.offset + part[0].start) // ALIGN * ALIGN
        b = r.offset + max(c.stop for c in part)
        out.append((r.path, a, b - a, tuple(c._replace(start=r.offset + c.start - a, stop=r.offset + c.stop - a)
                                             for c in part)))
    return out


class DeviceReader:
    """Blocks of a Zarr array decoded on the device (``device``: ``nvcomp`` or ``fake``). With
    ``group`` (bytes), a unit is read in parts of about that much, each decoded as soon as it is on
    the device while the next is read (``flowgpu.zarr.read-group``); else in one read and one decode."""

    def __init__(self, plan: DevicePlan, device: str = "nvcomp", zarr_path: str | None = None,
                 component: str | None = None, group: int | None = None):
        self.plan, self.device = plan, device
        self.zarr_path, self.component, self.group = zarr_path, component, group
        self.shape, self.dtype, self.ndim = plan.shape, plan.dtype, len(plan.shape)

    def __reduce__(self):
        return (DeviceReader, (self.plan, self.device, self.zarr_path, self.component, self.group))

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        key = key + (slice(None),) * (self.ndim - len(key))
        reads = read_plan(self.plan, key) if all(isinstance(k, slice) for k in key) else None
        if reads is None:
            return self._through_zarr(key)
        return self._decode(key, reads)

    def _through_zarr(self, key):
        dev = device_for(self.device)
        COUNTERS.fallback("a block that is not whole chunks")
        block = zarr.open_array(self.zarr_path, path=self.component or "", mode="r")[key]
        return dev.xp.asarray(block)

    def _decode(self, key: tuple, reads: list[UnitRead]):
        plan, dev = self.plan, device_for(self.device)
        xp = dev.xp
        lo = tuple(k.indices(n)[0] for k, n in zip(key, plan.shape))
        hi = tuple(k.indices(n)[1] for k, n in zip(key, plan.shape))
        shape = tuple(b - a for a, b in zip(lo, hi))
        groups = [g for r in reads if r.nbytes for g in _groups(r, self.group)]
        coords = [c.coords for g in groups for c in g[3]]
        chunk_bytes = int(np.prod(plan.chunk, dtype=np.int64)) * plan.dtype.itemsize
        missing = any(r.missing for r in reads)
        out, slots = None, None
        if plan.frame.algorithm and len(coords) > 1 and not missing:
            out, slots = _slots(plan, xp, lo, hi, coords, chunk_bytes)
        decoded, keep, compressed, reading, decoding = [], [], 0, 0.0, 0.0
        for path, offset, nbytes, chunks in groups:
            t0 = time.perf_counter()
            buf = dev.read(path, offset, nbytes)
            t1 = time.perf_counter()
            part = dev.payloads(buf, [(c.start, c.stop) for c in chunks])
            if plan.frame.algorithm:  # enqueued: the next group's file read overlaps it on the device
                into = None if slots is None else slots[len(decoded):len(decoded) + len(part)]
                keep.append(part)  # the compressed bytes live until the decodes are done
                part = dev.decode(plan.frame.algorithm, part, [chunk_bytes] * len(part), into)
            decoded += part
            compressed += nbytes
            reading, decoding = reading + t1 - t0, decoding + time.perf_counter() - t1
        t2 = time.perf_counter()
        if plan.frame.algorithm and decoded:
            dev.sync()
        del keep
        decoding += time.perf_counter() - t2
        COUNTERS.add("read", compressed, reading, count=len(reads))
        COUNTERS.add("moved", compressed, 0.0, count=len(reads))
        COUNTERS.add("decode", chunk_bytes * len(decoded), decoding, count=len(decoded))
        if out is not None:
            return out  # decoded in place: each chunk was a whole run of the block's rows
        if len(decoded) == 1 and not missing and shape == plan.chunk:
            return decoded[0].view(plan.dtype).reshape(plan.chunk)
        out = xp.full(shape, plan.fill_value, plan.dtype) if missing else xp.empty(shape, plan.dtype)
        for c, raw in zip(coords, decoded):
            if raw.size != chunk_bytes:
                raise OSError(f"{plan.root}: chunk {c} holds {raw.size} bytes, not the {chunk_bytes} of a "
                              f"{plan.chunk} {plan.dtype} chunk (the store is damaged)")
            chunk = raw.view(plan.dtype).reshape(plan.chunk)
            a = [ci * n for ci, n in zip(c, plan.chunk)]
            b = [min(ai + n, s) for ai, n, s in zip(a, plan.chunk, hi)]
            dst = tuple(slice(ai - l, bi - l) for ai, bi, l in zip(a, b, lo))
            out[dst] = chunk[tuple(slice(0, bi - ai) for ai, bi in zip(a, b))]
        return out
