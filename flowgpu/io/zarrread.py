"""Reading Zarr chunks straight to the device: compressed bytes up, decoded there.

A :class:`DeviceReader` is what ``dask.array.from_array`` slices; a block is a whole number of
*units* (the array's chunk or shard files; a missing file is the fill value). Each unit is read in
one range through pinned staging (a shard: its index first, then its chunks from an aligned
offset), checksums (``crc32c``) are checked on the host before the device sees the bytes, and all
chunks of a block decode as one nvCOMP batch, into the block where each is a contiguous run of it.
A file's chunks are NumPy arrays, never a Python object each (a 1 GiB shard holds 16384).
:func:`read_plan` lists what a block reads without reading it (what the tests check).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import NamedTuple

import google_crc32c
import numpy as np
import zarr

from flowgpu.io import nvcompc
from flowgpu.io.devcodec import ALIGN, MAX_U64, DevicePlan, run_offsets
from flowgpu.io.devices import device_for
from flowgpu.io.paths import require_store
from flowgpu.io.storage import COUNTERS
from flowgpu.io.zarrwrite import numcodecs_quiet
from flowgpu.transfer.staging import read_at

__all__ = ["DeviceReader", "ChunkRead", "Chunks", "UnitRead", "read_plan", "shard_index", "check_crc32c"]


class ChunkRead(NamedTuple):
    """One chunk to decode, as :class:`Chunks` yields it: where its payload lies in its read range."""

    coords: tuple  # chunk coordinates in the array's chunk grid
    start: int  # payload offset into the unit's range (framing already skipped)
    stop: int


class Chunks:
    """The chunks of one read: ``coords`` (n, ndim), payload ``starts`` and ``stops`` (n,) into
    the read's range, as ``int64`` arrays; iterating yields :class:`ChunkRead` tuples."""

    __slots__ = ("coords", "starts", "stops")

    def __init__(self, coords: np.ndarray, starts: np.ndarray, stops: np.ndarray):
        self.coords, self.starts, self.stops = coords, starts, stops

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> ChunkRead:
        return ChunkRead(tuple(self.coords[i].tolist()), int(self.starts[i]), int(self.stops[i]))

    def __iter__(self):
        return map(self.__getitem__, range(len(self)))

    def take(self, idx: np.ndarray, shift: int = 0) -> "Chunks":
        """The chunks at ``idx``, their ranges moved by ``-shift``."""
        return Chunks(self.coords[idx], self.starts[idx] - shift, self.stops[idx] - shift)


@dataclass(frozen=True, eq=False)
class UnitRead:
    """One file of a block: the byte range read, the chunks in it, the chunks missing."""

    path: str
    offset: int
    nbytes: int
    chunks: Chunks
    missing: tuple[tuple, ...]  # chunk coordinates that are the fill value


def shard_index(plan: DevicePlan, path: str, size: int) -> np.ndarray:
    """A shard's ``(offset, nbytes)`` per inner chunk, read from its file and checked."""
    n = plan.index_bytes()
    at = size - n if plan.index_at_end else 0
    if at < 0:
        raise OSError(f"{path}: {size} bytes, too short for its shard index of {n}")
    raw = read_at(path, bytearray(n), at)
    body, crc = bytes(raw[:-4]), int(np.frombuffer(bytes(raw[-4:]), "<u4")[0])
    if google_crc32c.value(body) != crc:
        raise OSError(f"{path}: shard index checksum mismatch (the file is damaged)")
    return np.frombuffer(body, "<u8").reshape(*plan.chunks_per_unit, 2)


def check_crc32c(path: str, buf: np.ndarray, ch: Chunks, plan: DevicePlan) -> None:
    """Check the ``crc32c`` ending each chunk of ``ch`` in ``buf`` (of ``path``); OSError if one fails."""
    if not len(ch):
        return
    ends = ch.stops + plan.frame.tail - 4  # where each chunk's checksum starts
    stored = buf[ends[:, None] + np.arange(4)].reshape(-1).view("<u4")
    computed = np.fromiter((google_crc32c.value(buf[a:b]) for a, b in
                            zip((ch.starts - plan.frame.head).tolist(), ends.tolist())), np.uint32, len(ch))
    bad = np.flatnonzero(stored != computed)
    if len(bad):
        first = tuple(int(c) for c in ch.coords[bad[0]])
        raise OSError(f"{path}: {len(bad)} of the {len(ch)} chunks read do not match their crc32c checksum (the "
                      f"first is chunk {first}, counting in chunks of {plan.chunk}); the store is damaged: restore "
                      "it, or rewrite it from its source")


def _inner(plan: DevicePlan, unit: tuple) -> np.ndarray:
    """The chunk coordinates of ``unit`` (rows, C order), cut at the array's end."""
    axes = [np.arange(u * p, min((u + 1) * p, g), dtype=np.int64)
            for u, p, g in zip(unit, plan.chunks_per_unit, (-(-s // c) for s, c in zip(plan.shape, plan.chunk)))]
    return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, len(axes))


def _tuples(rows: np.ndarray) -> tuple:
    return tuple(tuple(r) for r in rows.tolist())


def _unit_read(plan: DevicePlan, unit: tuple) -> UnitRead:
    path = plan.path(unit)
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        size = None
    inner = _inner(plan, unit)
    nd = inner.shape[1]
    none = Chunks(np.zeros((0, nd), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    if size is None:
        return UnitRead(path, 0, 0, none, _tuples(inner))
    head, tail = plan.frame.head, plan.frame.tail
    if not plan.sharded:  # the read starts at the payload (a device buffer is aligned): no copy for nvCOMP
        # (but for a checksummed LZ4 chunk, whose check needs its size header)
        if size <= head + tail and plan.frame.algorithm:
            raise OSError(f"{path}: {size} bytes, too short for a {plan.frame.algorithm} chunk (the store is damaged)")
        skip = 0 if plan.frame.checksum else head  # a checksum covers the head (LZ4's size): read it too
        return UnitRead(path, skip, size - skip, Chunks(inner[:1], np.array([head - skip], np.int64),
                                                        np.array([size - skip - tail], np.int64)), ())
    index = shard_index(plan, path, size)
    local = inner - np.array([u * p for u, p in zip(unit, plan.chunks_per_unit)], np.int64)
    entries = index[tuple(local.T)]
    have = entries[:, 0] != MAX_U64
    missing = _tuples(inner[~have])
    if not have.any():
        return UnitRead(path, 0, 0, none, missing)
    off, n = (entries[have, k].astype(np.int64) for k in (0, 1))
    if (n < head + tail + (1 if plan.frame.algorithm else 0)).any() or int((off + n).max()) > size:
        raise OSError(f"{path}: its shard index points outside the file or at chunks too short for "
                      f"{plan.frame.algorithm or 'raw'} data (the store is damaged)")
    lo = int(off.min()) // ALIGN * ALIGN  # the payloads flowgpu aligned stay aligned
    hi = int((off + n).max())
    return UnitRead(path, lo, hi - lo, Chunks(inner[have], off - lo + head, off - lo + n - tail), missing)


def read_plan(plan: DevicePlan, key: tuple) -> list[UnitRead] | None:
    """The files and byte ranges block ``key`` reads; None when it is not whole units (zarr reads it)."""
    units = []
    for k, n, u in zip(key, plan.shape, plan.unit):
        start, stop, step = k.indices(n)
        if step != 1 or start % u or (stop % u and stop != n) or stop <= start:
            return None
        units.append(np.arange(start // u, -(-stop // u)))
    grid = np.stack(np.meshgrid(*units, indexing="ij"), axis=-1).reshape(-1, len(units))
    return [_unit_read(plan, tuple(unit)) for unit in grid.tolist()]


def _in_place(plan: DevicePlan, lo: tuple, hi: tuple, coords: np.ndarray) -> np.ndarray | None:
    """Byte offsets of each chunk in block ``[lo, hi)`` when each is a contiguous, 16-byte aligned run."""
    shape = tuple(b - a for a, b in zip(lo, hi))
    at = run_offsets(shape, plan.chunk, coords, lo, plan.dtype.itemsize)
    if at is None or (plan.frame.algorithm and (at % 16).any()):
        return None
    return at


def _groups(r: UnitRead, limit: int | None, head: int = 0, tail: int = 0) -> list[tuple]:
    """``r`` as reads ``(path, offset, nbytes, chunks)`` of at most about ``limit`` bytes, cut between
    chunks in file order, from aligned offsets, with a checksummed chunk's ``head`` and ``tail``."""
    ch = r.chunks
    if not limit or r.nbytes <= limit or len(ch) < 2:
        return [(r.path, r.offset, r.nbytes, ch)]
    order = np.argsort(ch.starts, kind="stable")
    starts, stops = ch.starts[order].tolist(), ch.stops[order].tolist()
    cuts, first = [0], starts[0]
    for i in range(1, len(starts)):
        if stops[i] - first > limit:
            cuts.append(i)
            first = starts[i]
    out = []
    for a, b in zip(cuts, cuts[1:] + [len(starts)]):
        idx = order[a:b]
        at = (r.offset + int(ch.starts[idx].min()) - head) // ALIGN * ALIGN
        end = r.offset + int(ch.stops[idx].max()) + tail
        out.append((r.path, at, end - at, ch.take(idx, at - r.offset)))
    return out


def _raise_damaged(path: str, ch: Chunks, pending, plan: DevicePlan) -> None:
    """Raise an OSError naming the chunks of one batch that did not decode to their size."""
    bad, statuses, got = pending.damaged()
    algorithm, chunk_bytes = plan.frame.algorithm, pending.nbytes
    if not len(bad):
        return
    first = tuple(int(c) for c in ch.coords[bad[0]])
    why = nvcompc.STATUS.get(int(statuses[0]), f"status {int(statuses[0])}")
    raise OSError(f"{path}: {len(bad)} of the {len(ch)} {algorithm} chunks read did not decode (the first is "
                  f"chunk {first}, counting in chunks of {plan.chunk}: {why}, {int(got[0])} of {chunk_bytes} "
                  f"bytes); the store is damaged: restore it, or rewrite it from its source")


class DeviceReader:
    """Blocks of a Zarr array decoded on the device (``nvcomp`` or ``fake``); with ``group`` (bytes),
    a unit is read in parts of about that much, each decoded while the next is read."""

    def __init__(self, plan: DevicePlan, device: str = "nvcomp", zarr_path: str | None = None,
                 component: str | None = None, group: int | None = None):
        self.plan, self.device = plan, device
        self.zarr_path, self.component, self.group = zarr_path, component, group
        self.path = plan.root  # what the array reads, as flowgpu's other readers say it
        self.shape, self.dtype, self.ndim = plan.shape, plan.dtype, len(plan.shape)

    def __getitem__(self, key):
        require_store(self.plan.root)  # a file that is not there is the fill value; a store that is not there is an error
        key = key if isinstance(key, tuple) else (key,)
        key = key + (slice(None),) * (self.ndim - len(key))
        reads = read_plan(self.plan, key) if all(isinstance(k, slice) for k in key) else None
        if reads is not None:
            return self._decode(key, reads)
        COUNTERS.fallback("a block that is not whole chunks")
        with numcodecs_quiet():
            arr = zarr.open_array(self.zarr_path, path=self.component or "", mode="r")
        return device_for(self.device).xp.asarray(arr[key])

    def _decode(self, key: tuple, reads: list[UnitRead]):
        plan, dev = self.plan, device_for(self.device)
        xp = dev.xp
        lo = tuple(k.indices(n)[0] for k, n in zip(key, plan.shape))
        hi = tuple(k.indices(n)[1] for k, n in zip(key, plan.shape))
        shape = tuple(b - a for a, b in zip(lo, hi))
        framing = (plan.frame.head, plan.frame.tail) if plan.frame.checksum else (0, 0)
        groups = [g for r in reads if r.nbytes for g in _groups(r, self.group, *framing)]
        coords = np.concatenate([g[3].coords for g in groups]) if groups else np.zeros((0, len(shape)), np.int64)
        chunk_bytes = int(np.prod(plan.chunk, dtype=np.int64)) * plan.dtype.itemsize
        missing = any(r.missing for r in reads)
        algorithm = plan.frame.algorithm
        if not algorithm:
            for g in groups:
                if (g[3].stops - g[3].starts != chunk_bytes).any():
                    raise OSError(f"{g[0]}: a chunk holds other than the {chunk_bytes} bytes of a {plan.chunk} "
                                  f"{plan.dtype} chunk (the store is damaged)")
            if len(groups) == 1 and len(coords) == 1 and not missing and shape == plan.chunk and \
                    not plan.frame.checksum:
                path, offset, nbytes, ch = groups[0]  # one uncompressed chunk: the bytes read are the block
                buf = dev.read(path, offset + int(ch.starts[0]), chunk_bytes)
                for activity in ("read", "moved", "decode"):
                    COUNTERS.add(activity, chunk_bytes)
                return buf.view(plan.dtype).reshape(plan.chunk)
        at = _in_place(plan, lo, hi, coords)
        if at is not None:
            out = xp.full(shape, plan.fill_value, plan.dtype) if missing else xp.empty(shape, plan.dtype)
            target = out.reshape(-1).view(np.uint8)
        else:
            stride = -(-chunk_bytes // 16) * 16  # nvCOMP writes each decoded chunk at a 16-byte aligned address
            out, target = None, xp.empty(max(len(coords) * stride, 1), np.uint8)
            at = np.arange(len(coords), dtype=np.int64) * stride
        keep, pending, done, compressed, reading, decoding = [], [], 0, 0, 0.0, 0.0
        for path, offset, nbytes, ch in groups:
            t0 = time.perf_counter()
            if plan.frame.checksum:  # checked on the host, before the device (and nvCOMP) sees the bytes
                host = dev.read_host(path, offset, nbytes)
                check_crc32c(path, host, ch, plan)
                buf = dev.upload(host)
                keep.append(host)
            else:
                buf = dev.read(path, offset, nbytes)
            t1 = time.perf_counter()
            sizes, where = ch.stops - ch.starts, at[done:done + len(ch)]
            if algorithm:  # enqueued: the next group's file read overlaps it on the device
                pending.append((path, ch, dev.decode_into(algorithm, buf, ch.starts, sizes, target, where,
                                                          chunk_bytes)))
            else:
                dev.place(buf, ch.starts, sizes, target, where)
            keep.append(buf)  # the bytes read live until the device is done with them
            done += len(ch)
            compressed += nbytes
            reading, decoding = reading + t1 - t0, decoding + time.perf_counter() - t1
        t2 = time.perf_counter()
        if groups:
            try:
                dev.sync()
            except Exception as e:  # noqa: BLE001 - CuPy's CUDA errors have no common root to name
                if not algorithm or "CUDA" not in type(e).__name__:
                    raise
                raise OSError(f"{groups[0][0]}: the GPU faulted decoding its {algorithm} chunks ({e}). nvCOMP's "
                              f"decoder can fault on a damaged chunk, and this worker's GPU can do no more work "
                              f"until it restarts; to find the chunk, read the store with zarr-python "
                              f"(flowgpu.zarr.device: cpu)") from None
        del keep
        for path, ch, p in pending:
            _raise_damaged(path, ch, p, plan)
        decoding += time.perf_counter() - t2
        COUNTERS.add("read", compressed, reading, count=len(reads))
        COUNTERS.add("moved", compressed, 0.0, count=len(reads))
        COUNTERS.add("decode", chunk_bytes * done, decoding, count=done)
        if out is not None:
            return out  # decoded in place: each chunk was a whole run of the block
        out = xp.full(shape, plan.fill_value, plan.dtype) if missing else xp.empty(shape, plan.dtype)
        for i, c in enumerate(coords.tolist()):
            chunk = target[at[i]:at[i] + chunk_bytes].view(plan.dtype).reshape(plan.chunk)
            a = [ci * n for ci, n in zip(c, plan.chunk)]
            b = [min(ai + n, s) for ai, n, s in zip(a, plan.chunk, hi)]
            dst = tuple(slice(ai - l, bi - l) for ai, bi, l in zip(a, b, lo))
            out[dst] = chunk[tuple(slice(0, bi - ai) for ai, bi in zip(a, b))]
        return out
