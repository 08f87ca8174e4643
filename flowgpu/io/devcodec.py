"""Which Zarr chunks the device can decode, and the codecs that do it (nvCOMP, or NumPy stand-ins).

:func:`plan_codec` reads a Zarr array's codec pipeline and returns a :class:`DevicePlan` (how to
find each chunk's bytes, how its codec frames nvCOMP's raw stream, what the decoded chunk is) or a
:class:`Fallback` saying why the chunks go through zarr-python on the CPU. Decoding on the device is
nvCOMP's ``RAW`` bitstreams, which are the compressors' own formats; what zarr stores around them:

==================================  =========  ==============================================
zarr codec                          nvCOMP     framing of one chunk's bytes
==================================  =========  ==============================================
``zstd`` (v3; v2 ``zstd``)          Zstd       a standard zstd frame, as it is
``gzip`` (v3; v2 ``gzip``)          Gzip       a gzip member, as it is
``numcodecs.zlib`` (v2 ``zlib``)    Deflate    2-byte zlib header, raw deflate, 4-byte adler32
``numcodecs.lz4`` (v2 ``lz4``)      LZ4        4-byte little-endian size, one LZ4 block
none (only ``bytes``)               -          the chunk's bytes, C order
==================================  =========  ==============================================

Blosc (its own blocks, headers and shuffle), filters, ``transpose``, big-endian ``bytes`` and
checksummed chunks fall back, each with its reason. Sharded arrays are planned too (index at the
end or the start, ``bytes`` + ``crc32c`` index codecs): one read per shard, its inner chunks one
decode batch.

:func:`device_for` gives the object that moves bytes and decodes: :class:`CupyDevice` (nvCOMP on
CuPy arrays) or :class:`HostDevice`, a NumPy implementation of the same interface that decodes the
same raw streams with numcodecs/zlib, so the whole device path runs (and is tested) on a CPU.
Nothing here imports CuPy or nvCOMP until a device decodes.
"""

from __future__ import annotations

import gzip
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowgpu.backend import file_rows_to_device, import_cupy

__all__ = ["MAX_CHUNK_BYTES", "ALIGN", "layout", "DevicePlan", "Fallback", "Frame", "plan_codec", "frame_for", "device_for",
           "CupyDevice", "KvikioDevice", "HostDevice",
           "read_exact", "DEVICES"]

MAX_U64 = 2**64 - 1
MAX_CHUNK_BYTES = 16 << 20  # the largest chunk nvCOMP's batched zstd and LZ4 take (and decode well: one block each)
ALIGN = 256  # where flowgpu's shards start each payload nvCOMP reads (it needs 16; 256 is a whole cache sector run)


@dataclass(frozen=True)
class Frame:
    """How zarr's bytes of one chunk wrap the raw stream nvCOMP reads: ``head`` bytes before it,
    ``tail`` after it, ``algorithm`` nvCOMP's name (None: not compressed)."""

    algorithm: str | None
    head: int = 0
    tail: int = 0


@dataclass(frozen=True)
class Fallback:
    """The chunks go through zarr-python on the CPU, because of ``reason``."""

    reason: str


@dataclass(frozen=True)
class DevicePlan:
    """What a reader needs to fetch and decode chunks itself.

    ``chunk`` is the shape one decode yields (the inner chunk of a shard); ``unit`` the shape one
    file holds (the shard, or ``chunk``); ``keys`` maps chunk coordinates of ``unit``s to a path
    relative to ``root`` (zarr's own chunk key encoding, through ``encode``)."""

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
    """``bytes`` then at most one compressor."""
    names = [_named(c) for c in codecs]
    if not names or names[0][0] != "bytes":
        kinds = ", ".join(n for n, _ in names) or "none"
        return Fallback(f"{what} codecs ({kinds}) do not start with 'bytes' (transpose or an array filter)")
    endian = names[0][1].get("endian", "little")
    if dtype.itemsize > 1 and endian not in (None, "little"):
        return Fallback(f"{what} chunks are big-endian")
    rest = names[1:]
    if not rest:
        return Frame(None)
    if len(rest) > 1:
        return Fallback(f"{what} chunks pass {len(rest)} byte codecs ({', '.join(n for n, _ in rest)}); "
                        "the device decodes one compressor")
    return frame_for(*rest[0])


def _local_root(arr: Any) -> str | Fallback:
    store = arr.store_path.store
    root = getattr(store, "root", None)
    if root is None or type(store).__name__ != "LocalStore":
        return Fallback(f"a {type(store).__name__} is read through zarr (the device path reads local files)")
    return os.path.join(str(root), *[p for p in arr.store_path.path.split("/") if p])


def _fill(meta: Any, dtype: np.dtype) -> Any:
    fill = getattr(meta, "fill_value", None)
    return np.zeros((), dtype)[()] if fill is None else np.asarray(fill, dtype=dtype)[()]


def _sized(plan: DevicePlan) -> DevicePlan | Fallback:
    n = int(np.prod(plan.chunk, dtype=np.int64)) * plan.dtype.itemsize
    if plan.frame.algorithm and n > MAX_CHUNK_BYTES:
        return Fallback(f"chunks of {n / 2**20:.0f} MiB are more than nvCOMP decodes at once "
                        f"({MAX_CHUNK_BYTES >> 20} MiB); `flowgpu convert` rewrites the store in chunks it decodes")
    return plan


def plan_codec(arr: Any) -> DevicePlan | Fallback:
    """How to read ``arr`` (a ``zarr.Array``) on the device, or why not.

    Examples
    --------
    >>> import zarr
    >>> a = zarr.create_array({}, shape=(4,), chunks=(2,), dtype="f4", compressors=zarr.codecs.BloscCodec())
    >>> plan_codec(a).reason
    'a MemoryStore is read through zarr (the device path reads local files)'
    """
    meta = arr.metadata
    dtype = np.dtype(arr.dtype)
    if dtype.hasobject or dtype.kind in "USV" or not dtype.isnative and dtype.itemsize > 1:
        return Fallback(f"dtype {dtype} is decoded by zarr")
    root = _local_root(arr)
    if isinstance(root, Fallback):
        return root
    common = dict(root=root, shape=tuple(arr.shape), dtype=dtype, fill_value=_fill(meta, dtype),
                  encode=meta.encode_chunk_key)
    if getattr(meta, "zarr_format", 3) == 2:
        if meta.filters:
            return Fallback(f"filters {[f.codec_id for f in meta.filters]} are applied by zarr")
        if meta.order != "C":
            return Fallback("chunks in Fortran order are decoded by zarr")
        frame = Frame(None) if meta.compressor is None else frame_for(meta.compressor.codec_id,
                                                                      meta.compressor.get_config())
        if isinstance(frame, Fallback):
            return frame
        return _sized(DevicePlan(chunk=tuple(arr.chunks), unit=tuple(arr.chunks), frame=frame, **common))
    codecs = tuple(meta.codecs)
    if len(codecs) == 1 and _named(codecs[0])[0] == "sharding_indexed":
        shard = codecs[0]
        index = [_named(c)[0] for c in shard.index_codecs]
        if index != ["bytes", "crc32c"]:
            return Fallback(f"shard index codecs {index} (the device path reads bytes + crc32c)")
        frame = _pipeline(tuple(shard.codecs), dtype, "inner")
        if isinstance(frame, Fallback):
            return frame
        at_end = str(getattr(shard.index_location, "value", shard.index_location)) == "end"
        return _sized(DevicePlan(chunk=tuple(shard.chunk_shape), unit=tuple(meta.chunk_grid.chunk_shape),
                                 frame=frame, sharded=True, index_at_end=at_end, **common))
    frame = _pipeline(codecs, dtype, "array")
    if isinstance(frame, Fallback):
        return frame
    return _sized(DevicePlan(chunk=tuple(meta.chunk_grid.chunk_shape), unit=tuple(meta.chunk_grid.chunk_shape),
                             frame=frame, **common))


def layout(sizes: list[int], head: int = 0, room: int = 0, align: int = ALIGN) -> tuple[list[int], int]:
    """Where payloads of ``sizes`` bytes go in a shard: ``(starts, end)``. Each payload has
    ``head`` bytes of framing before it (LZ4's size) and ``room`` more to grow it in (a zstd
    header given its size); what a reader hands nvCOMP (``start - room``) is at a multiple of
    ``align``. The gaps are legal in a Zarr 3 shard: its index gives each chunk's offset.

    >>> layout([10, 300, 5], head=4)
    ([256, 512, 1024], 1029)
    """
    starts, end = [], 0
    for n in sizes:
        at = -(-(end + head) // align) * align + room
        starts.append(at)
        end = at + int(n)
    return starts, end


def read_exact(fd: int, into: Any, offset: int, path: str) -> None:
    """Fill the writable buffer ``into`` from ``fd`` at ``offset`` (``os.preadv``, no pageable copy)."""
    view = memoryview(into).cast("B")
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise OSError(f"{path}: file ended {len(view) - got} bytes early at offset {offset + got}")
        got += n


class HostDevice:
    """The device interface on NumPy arrays: nvCOMP's raw streams decoded by numcodecs and zlib.

    A stand-in for :class:`CupyDevice` that runs everywhere (tests, CPU machines): same reads,
    same framing, same batches; only the memory is the host's."""

    name = "fake"
    xp = np

    def read(self, path: str, offset: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        fd = os.open(path, os.O_RDONLY)
        try:
            read_exact(fd, out, offset, path)
        finally:
            os.close(fd)
        return out

    def payloads(self, buf: Any, spans: list[tuple[int, int]]) -> list:
        """Views of ``buf`` nvCOMP may read, one per ``(start, stop)``: in place where aligned, the
        others copied into one new buffer (one allocation, one copy each)."""
        return [buf[a:b] for a, b in spans]

    def pack(self, algorithm: str | None, arrays: list, level: int | None, head: int = 0,
             room: int = 0) -> tuple[np.ndarray, list[int], list[int]]:
        """Encode ``arrays`` (1-d uint8 chunks) as one batch and lay the payloads out as a shard
        (:func:`layout`, gaps zeroed) in one host buffer, copied from the device at once.
        Returns ``(host, starts, sizes)``."""
        keep, views = self._encoded(algorithm, arrays, level) if algorithm else (None, arrays)
        sizes = [int(v.size) for v in views]
        starts, end = layout(sizes, head, room)
        image = self.xp.zeros(end, np.uint8)
        for at, v in zip(starts, views):
            self._place(image, at, v)
        host = self.to_host(image)  # complete (synchronous) before nvCOMP's batch may go
        del keep, views
        return host, starts, sizes

    def _encoded(self, algorithm: str, arrays: list, level: int | None) -> tuple[Any, list]:
        return None, self.encode(algorithm, arrays, level)

    def _place(self, image: Any, at: int, v: Any) -> None:
        image[at:at + v.size] = v

    def decode(self, algorithm: str, payloads: list, sizes: list[int], outs: list | None = None) -> list:
        """Each payload decoded: into ``outs`` (1-d uint8 arrays of ``sizes``) when given, else new arrays."""
        import numcodecs

        out = []
        for i, (p, n) in enumerate(zip(payloads, sizes)):
            raw = bytes(memoryview(p))
            if algorithm == "Zstd":
                b = numcodecs.Zstd().decode(raw)
            elif algorithm == "LZ4":
                b = numcodecs.LZ4().decode(struct.pack("<I", n) + raw)
            elif algorithm == "Deflate":
                b = zlib.decompress(raw, -15)
            elif algorithm == "Gzip":
                b = gzip.decompress(raw)
            else:
                raise ValueError(f"no decoder for {algorithm}")
            a = np.frombuffer(b, np.uint8)
            if a.size != n:
                raise ValueError(f"{algorithm} chunk decoded to {a.size} bytes, not {n}")
            if outs is not None:
                np.copyto(outs[i], a)
                a = outs[i]
            out.append(a)
        return out

    def encode(self, algorithm: str, arrays: list, level: int | None = None) -> list:
        import numcodecs

        if algorithm == "Zstd":
            codec = numcodecs.Zstd(level=level or 0)
            return [np.frombuffer(codec.encode(np.ascontiguousarray(a)), np.uint8) for a in arrays]
        if algorithm == "LZ4":
            return [np.frombuffer(numcodecs.LZ4().encode(np.ascontiguousarray(a)), np.uint8)[4:] for a in arrays]
        raise ValueError(f"no encoder for {algorithm}")

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(a)

    def sync(self) -> None:
        pass


class CupyDevice(HostDevice):
    """CuPy arrays, reads through pinned staging buffers (flowgpu's ``file_rows_to_device`` hook),
    decodes and encodes with nvCOMP on the calling thread's current stream."""

    name = "nvcomp"

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def xp(self):  # noqa: D102
        return import_cupy()

    def read(self, path: str, offset: int, nbytes: int):
        return file_rows_to_device(path, offset, (nbytes,), np.uint8)

    def _codec(self, algorithm: str):
        cp = import_cupy()
        from nvidia import nvcomp

        stream = cp.cuda.get_current_stream()
        key = (algorithm, cp.cuda.Device().id, stream.ptr)
        codecs = getattr(self._local, "codecs", None)
        if codecs is None:
            codecs = self._local.codecs = {}
        if key not in codecs:
            codecs[key] = nvcomp.Codec(algorithm=algorithm, bitstream_kind=nvcomp.BitstreamKind.RAW,
                                       device_id=key[1], cuda_stream=stream.ptr)
        return nvcomp, codecs[key]

    def payloads(self, buf: Any, spans: list[tuple[int, int]]) -> list:
        cp = import_cupy()
        odd = [i for i, (a, _) in enumerate(spans) if (buf.data.ptr + a) % 16]  # nvCOMP's strictest alignment
        out = [buf[a:b] for a, b in spans]
        if odd:  # a store not written by flowgpu: its misaligned payloads gathered into one buffer
            starts, end = layout([spans[i][1] - spans[i][0] for i in odd])
            into = cp.empty(end, cp.uint8)
            for i, at in zip(odd, starts):
                self._place(into, at, out[i])
                out[i] = into[at:at + out[i].size]
        return out

    def _place(self, image: Any, at: int, v: Any) -> None:
        cp = import_cupy()
        cp.cuda.runtime.memcpyAsync(image.data.ptr + at, v.data.ptr, int(v.size), cp.cuda.runtime.memcpyDeviceToDevice,
                                    cp.cuda.get_current_stream().ptr)

    def _encoded(self, algorithm: str, arrays: list, level: int | None) -> tuple[Any, list]:
        """nvCOMP's batch (kept alive by the caller) and a CuPy view of each payload in it: no copy."""
        cp = import_cupy()
        nvcomp, codec = self._codec(algorithm)
        batch = codec.encode(nvcomp.as_arrays([a.reshape(-1).view(cp.uint8) for a in arrays]))
        return batch, [cp.asarray(batch[i]).view(cp.uint8).reshape(-1) for i in range(len(arrays))]

    def decode(self, algorithm: str, payloads: list, sizes: list[int], outs: list | None = None) -> list:
        cp = import_cupy()
        nvcomp, codec = self._codec(algorithm)
        outs = [cp.empty(n, cp.uint8) for n in sizes] if outs is None else outs
        srcs = nvcomp.as_arrays(payloads)  # a BatchArray (nvCOMP 6): keeps the payloads alive
        try:
            codec.decode(srcs, out=nvcomp.as_arrays(outs))  # straight into arrays CuPy owns
        except TypeError:  # an nvCOMP whose batch decode takes no out=: copy out of its batch
            for o, g in zip(outs, codec.decode(srcs)):
                o[:] = cp.asarray(g).view(cp.uint8).reshape(-1)
        return outs

    def encode(self, algorithm: str, arrays: list, level: int | None = None) -> list:
        batch, views = self._encoded(algorithm, arrays, level)
        return [v.copy() for v in views]

    def to_host(self, a: Any) -> np.ndarray:
        """A device array in pinned host memory (CuPy's pinned pool keeps the buffers for reuse)."""
        import cupyx

        out = cupyx.empty_pinned(a.shape, a.dtype)
        a.get(out=out)
        return out

    def sync(self) -> None:
        import_cupy().cuda.get_current_stream().synchronize()


class KvikioDevice(CupyDevice):
    """:class:`CupyDevice` reading files with kvikio (``flowgpu.zarr.reader: kvikio``): its own
    thread pool, GPUDirect Storage where the filesystem has it, else its own bounce buffers."""

    name = "nvcomp-kvikio"

    def read(self, path: str, offset: int, nbytes: int):
        import kvikio

        out = import_cupy().empty(nbytes, np.uint8)
        with kvikio.CuFile(path, "r") as f:
            got = f.pread(out, nbytes, file_offset=offset).get()
        if got != nbytes:
            raise OSError(f"{path}: file ended {nbytes - got} bytes early at offset {offset + got}")
        return out


DEVICES = {"nvcomp": CupyDevice, "nvcomp-kvikio": KvikioDevice, "fake": HostDevice}
_made: dict[str, HostDevice] = {}


def device_for(name: str) -> HostDevice:
    """The process's device object of kind ``name`` (``nvcomp``, ``nvcomp-kvikio`` or ``fake``)."""
    if name not in _made:
        _made[name] = DEVICES[name]()
    return _made[name]
