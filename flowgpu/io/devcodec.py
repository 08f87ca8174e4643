"""Which Zarr chunks the device can decode: a :class:`DevicePlan`, or a :class:`Fallback` (why not).

nvCOMP decodes ``RAW`` bitstreams, the compressors' own formats; zarr frames them (:data:`_FRAMES`):
zstd and gzip as they are, zlib with a 2-byte header and a 4-byte adler32, numcodecs' lz4 after a
4-byte size; a trailing ``crc32c`` codec adds 4 bytes, checked on the host before nvCOMP sees the
chunk. Blosc, filters, ``transpose``, big-endian ``bytes`` and zstd's own checksums fall back.
Sharded arrays (``bytes`` + ``crc32c`` index) are read one shard per read, one decode batch each.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np


__all__ = ["MAX_CHUNK_BYTES", "ALIGN", "layout", "run_offsets", "DevicePlan", "Fallback", "Frame", "plan_codec", "frame_for"]

MAX_U64 = 2**64 - 1
MAX_CHUNK_BYTES = 16 << 20  # the largest chunk nvCOMP's batched zstd and LZ4 take (and decode well: one block each)
ALIGN = 256  # where flowgpu's shards start each payload nvCOMP reads (it needs 16; 256 is a whole cache sector run)


@dataclass(frozen=True)
class Frame:
    """How one chunk's bytes wrap nvCOMP's ``algorithm`` stream (None: raw): ``head`` bytes before it,
    ``tail`` after it, of which the last 4 are a CRC-32C of the rest with ``checksum``."""

    algorithm: str | None
    head: int = 0
    tail: int = 0
    checksum: bool = False


@dataclass(frozen=True)
class Fallback:
    """The chunks go through zarr-python on the CPU, because of ``reason``."""

    reason: str


@dataclass(frozen=True)
class DevicePlan:
    """What a reader needs to fetch and decode chunks itself: ``chunk`` is the shape one decode
    yields, ``unit`` the shape one file holds (a shard, or ``chunk``)."""

    root: str  # folder of the array (store root joined with the array's path)
    shape: tuple
    dtype: np.dtype
    chunk: tuple
    unit: tuple
    frame: Frame
    fill_value: Any
    sharded: bool = False
    index_at_end: bool = True
    encode: Any = None  # metadata.encode_chunk_key

    @property
    def chunks_per_unit(self) -> tuple:
        return tuple(u // c for u, c in zip(self.unit, self.chunk))

    def path(self, coords: tuple) -> str:
        return os.path.join(self.root, *self.encode(tuple(int(c) for c in coords)).split("/"))

    def index_bytes(self) -> int:
        return int(np.prod(self.chunks_per_unit, dtype=np.int64)) * 16 + 4


_FRAMES = {"zstd": Frame("Zstd"), "gzip": Frame("Gzip"), "zlib": Frame("Deflate", 2, 4), "lz4": Frame("LZ4", 4, 0)}


def frame_for(name: str, config: dict | None = None) -> Frame | Fallback:
    """The framing of compressor ``name`` (v3 name, ``numcodecs.*`` or a v2 codec id)."""
    config = config or {}
    base = name.removeprefix("numcodecs.")
    if base == "blosc":
        return Fallback("blosc chunks (blocks with their own headers and shuffle) have no nvCOMP decoder")
    if base == "zstd" and config.get("checksum"):
        return Fallback("zstd chunks with checksums are verified by zarr on the CPU")
    if base == "lz4" and config.get("acceleration", 1) is None:
        return Fallback("lz4 without a size header")
    frame = _FRAMES.get(base)
    return frame if frame is not None else Fallback(f"codec {name!r} has no nvCOMP decoder")


def _named(codec: Any) -> tuple[str, dict]:
    d = codec.to_dict() if hasattr(codec, "to_dict") else {"name": type(codec).__name__.lower()}
    return str(d.get("name")), dict(d.get("configuration") or {})


def _pipeline(codecs: tuple, dtype: np.dtype, what: str) -> Frame | Fallback:
    """``bytes``, then at most one compressor, then at most a ``crc32c``."""
    names = [_named(c) for c in codecs]
    if not names or names[0][0] != "bytes":
        kinds = ", ".join(n for n, _ in names) or "none"
        return Fallback(f"{what} codecs ({kinds}) do not start with 'bytes' (transpose or an array filter)")
    endian = names[0][1].get("endian", "little")
    if dtype.itemsize > 1 and endian not in (None, "little"):
        return Fallback(f"{what} chunks are big-endian")
    rest = names[1:]
    checksum = bool(rest) and rest[-1][0] == "crc32c"
    if checksum:
        rest = rest[:-1]
    if len(rest) > 1:
        return Fallback(f"{what} chunks pass {len(rest)} byte codecs ({', '.join(n for n, _ in rest)}); "
                        "the device decodes one compressor")
    frame = frame_for(*rest[0]) if rest else Frame(None)
    if checksum and isinstance(frame, Frame):
        return Frame(frame.algorithm, frame.head, frame.tail + 4, checksum=True)
    return frame


def _local_root(arr: Any) -> str | Fallback:
    store = arr.store_path.store
    root = getattr(store, "root", None)
    if root is None or type(store).__name__ != "LocalStore":
        return Fallback(f"a {type(store).__name__} is read through zarr (the device path reads local files)")
    return os.path.join(str(root), *[p for p in arr.store_path.path.split("/") if p])


def _sized(frame: Frame | Fallback, **plan: Any) -> DevicePlan | Fallback:
    """The plan of chunks framed by ``frame``, unless they fall back (or nvCOMP cannot take them at once)."""
    if isinstance(frame, Fallback):
        return frame
    plan = DevicePlan(frame=frame, **plan)
    n = int(np.prod(plan.chunk, dtype=np.int64)) * plan.dtype.itemsize
    if plan.frame.algorithm and n > MAX_CHUNK_BYTES:
        return Fallback(f"chunks of {n / 2**20:.0f} MiB are more than nvCOMP decodes at once "
                        f"({MAX_CHUNK_BYTES >> 20} MiB); `flowgpu convert` rewrites the store in chunks it decodes")
    return plan


def _key_encoder(meta: Any) -> Any:
    """zarr's chunk key encoding alone: a plan pickles no codecs (each warns when unpickled)."""
    from zarr.core.chunk_key_encodings import V2ChunkKeyEncoding

    if getattr(meta, "zarr_format", 3) == 2:
        return V2ChunkKeyEncoding(separator=meta.dimension_separator or ".").encode_chunk_key
    return meta.chunk_key_encoding.encode_chunk_key


def plan_codec(arr: Any) -> DevicePlan | Fallback:
    """How to read ``arr`` (a ``zarr.Array``) on the device, or why not."""
    meta = arr.metadata
    dtype = np.dtype(arr.dtype)
    if dtype.hasobject or dtype.kind in "USV" or not dtype.isnative and dtype.itemsize > 1:
        return Fallback(f"dtype {dtype} is decoded by zarr")
    root = _local_root(arr)
    if isinstance(root, Fallback):
        return root
    fill = getattr(meta, "fill_value", None)
    common = dict(root=root, shape=tuple(arr.shape), dtype=dtype, encode=_key_encoder(meta),
                  fill_value=np.zeros((), dtype)[()] if fill is None else np.asarray(fill, dtype=dtype)[()])
    if getattr(meta, "zarr_format", 3) == 2:
        if meta.filters:
            return Fallback(f"filters {[f.codec_id for f in meta.filters]} are applied by zarr")
        if meta.order != "C":
            return Fallback("chunks in Fortran order are decoded by zarr")
        frame = Frame(None) if meta.compressor is None else frame_for(meta.compressor.codec_id,
                                                                      meta.compressor.get_config())
        return _sized(frame, chunk=tuple(arr.chunks), unit=tuple(arr.chunks), **common)
    codecs = tuple(meta.codecs)
    if len(codecs) == 1 and _named(codecs[0])[0] == "sharding_indexed":
        shard = codecs[0]
        index = [_named(c)[0] for c in shard.index_codecs]
        if index != ["bytes", "crc32c"]:
            return Fallback(f"shard index codecs {index} (the device path reads bytes + crc32c)")
        at_end = str(getattr(shard.index_location, "value", shard.index_location)) == "end"
        return _sized(_pipeline(tuple(shard.codecs), dtype, "inner"), chunk=tuple(shard.chunk_shape),
                      unit=tuple(meta.chunk_grid.chunk_shape), sharded=True, index_at_end=at_end, **common)
    return _sized(_pipeline(codecs, dtype, "array"), chunk=tuple(meta.chunk_grid.chunk_shape),
                  unit=tuple(meta.chunk_grid.chunk_shape), **common)


def layout(sizes: Any, head: int = 0, room: int = 0, align: int = ALIGN, tail: int = 0) -> tuple[np.ndarray, int]:
    """Where payloads of ``sizes`` bytes go in a shard: ``(starts, end)``, each ``start - room`` at a
    multiple of ``align``, with ``head`` bytes of framing before it (LZ4's size), ``room`` to grow
    (a zstd header given its size) and ``tail`` after it (a ``crc32c``). A shard's index allows gaps.

    >>> starts, end = layout([10, 300, 5], head=4)
    >>> starts.tolist(), end
    ([256, 512, 1024], 1029)
    """
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if not sizes.size:
        return np.zeros(0, np.int64), 0
    slots = -(-(room + sizes + tail + head) // align) * align  # each slot starts aligned, the next one after it
    base = -(-head // align) * align + np.concatenate(([0], np.cumsum(slots[:-1])))
    starts = base + room
    return starts, int(starts[-1] + sizes[-1] + tail)


def run_offsets(block: tuple, chunk: tuple, coords: Any, lo: tuple, itemsize: int) -> np.ndarray | None:
    """Byte offsets into a C-ordered ``block`` (starting at ``lo``) of the chunks at ``coords`` when each
    is one contiguous run inside it (unit axes, one axis cut, whole trailing axes); else None.

    >>> run_offsets((4, 6), (2, 6), [[0, 0], [1, 0]], (0, 0), 4).tolist()
    [0, 48]
    """
    nd = len(chunk)
    cut = next((i for i, c in enumerate(chunk) if c > 1), nd - 1)
    if any(chunk[j] != block[j] for j in range(cut + 1, nd)):
        return None
    coords = np.asarray(coords, dtype=np.int64).reshape(-1, nd)
    if not len(coords):
        return np.zeros(0, np.int64)
    first = coords * np.asarray(chunk, np.int64) - np.asarray(lo, np.int64)
    if (first < 0).any() or (first + np.asarray(chunk, np.int64) > np.asarray(block, np.int64)).any():
        return None  # a chunk runs past the block (the array's end cuts it)
    return np.ravel_multi_index(tuple(first.T), block).astype(np.int64) * itemsize
