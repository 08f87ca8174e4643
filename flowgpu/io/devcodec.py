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

__all__ = ["MAX_CHUNK_BYTES", "ALIGN", "layout", "run_offsets", "gather", "DevicePlan", "Fallback", "Frame", "plan_codec", "frame_for", "device_for",
           "CupyDevice", "KvikioDevice", "HostDevice",
           "read_exact", "DEVICES"]

MAX_U64 = 2**64 - 1
READ_SLICE = 16 << 20  # staging slice of a shard read: four shards read at once spread over all reader threads
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


def _key_encoder(meta: Any) -> Any:
    """zarr's chunk key encoding of ``meta``, on its own: a task's plan then pickles no codecs (each
    unpickled numcodecs codec warns that it is not in the Zarr 3 spec, on every worker)."""
    from zarr.core.chunk_key_encodings import V2ChunkKeyEncoding

    if getattr(meta, "zarr_format", 3) == 2:
        return V2ChunkKeyEncoding(separator=meta.dimension_separator or ".").encode_chunk_key
    return meta.chunk_key_encoding.encode_chunk_key


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
                  encode=_key_encoder(meta))
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


def layout(sizes: Any, head: int = 0, room: int = 0, align: int = ALIGN) -> tuple[np.ndarray, int]:
    """Where payloads of ``sizes`` bytes go in a shard: ``(starts, end)``. Each payload has
    ``head`` bytes of framing before it (LZ4's size) and ``room`` more to grow it in (a zstd
    header given its size); what a reader hands nvCOMP (``start - room``) is at a multiple of
    ``align``. The gaps are legal in a Zarr 3 shard: its index gives each chunk's offset.

    >>> starts, end = layout([10, 300, 5], head=4)
    >>> starts.tolist(), end
    ([256, 512, 1024], 1029)
    """
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
    if not sizes.size:
        return np.zeros(0, np.int64), 0
    slots = -(-(room + sizes + head) // align) * align  # each slot starts aligned, the next one after it
    base = -(-head // align) * align + np.concatenate(([0], np.cumsum(slots[:-1])))
    starts = base + room
    return starts, int(starts[-1] + sizes[-1])


def run_offsets(block: tuple, chunk: tuple, coords: Any, lo: tuple, itemsize: int) -> np.ndarray | None:
    """Byte offsets into a C-ordered ``block`` (its first element at ``lo``) of the chunks at
    ``coords`` (rows of chunk-grid coordinates), when each chunk is one contiguous run of the
    block's bytes (unit axes, then one axis cut, then whole trailing axes) inside the block;
    else None (then chunks are decoded aside and copied in).

    >>> run_offsets((4, 6), (2, 6), [[0, 0], [1, 0]], (0, 0), 4).tolist()
    [0, 48]
    >>> run_offsets((4, 6), (2, 3), [[0, 0]], (0, 0), 4) is None
    True
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


_GATHER = r"""
extern "C" __global__ void flowgpu_gather(const unsigned long long* src, const long long* dst_at,
                                          const long long* n, unsigned char* dst) {
    const unsigned char* s = (const unsigned char*)src[blockIdx.x];
    unsigned char* d = dst + dst_at[blockIdx.x];
    const long long len = n[blockIdx.x];
    for (long long i = threadIdx.x; i < len; i += blockDim.x) d[i] = s[i];
}
"""
_kernels: dict = {}


def gather(src_ptrs: Any, dst: Any, dst_at: Any, sizes: Any) -> None:
    """Copy ``sizes[i]`` bytes from device address ``src_ptrs[i]`` to ``dst[dst_at[i]:]`` (a
    uint8 CuPy array), every chunk in one kernel launch on the current stream: a shard holds
    thousands of chunks, and one ``memcpyAsync`` each costs more than its bytes."""
    cp = import_cupy()
    n = len(sizes)
    if not n:
        return
    if "gather" not in _kernels:
        _kernels["gather"] = cp.RawKernel(_GATHER, "flowgpu_gather")
    args = (cp.asarray(np.asarray(src_ptrs, np.uint64)), cp.asarray(np.asarray(dst_at, np.int64)),
            cp.asarray(np.asarray(sizes, np.int64)), dst)
    _kernels["gather"]((n,), (256,), args)


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
    same framing, same batches, the same offset tables; only the memory is the host's.

    A batch is one buffer and an offset table (NumPy ``int64`` arrays), never a list of views: a
    1 GiB shard of 64 KiB chunks is 16384 chunks, and a Python object per chunk would cost more
    than the device's decode."""

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

    def place(self, buf: Any, starts: np.ndarray, sizes: np.ndarray, out: Any, out_at: np.ndarray) -> None:
        """Copy ``buf[starts[i]:starts[i] + sizes[i]]`` to ``out[out_at[i]:]`` (1-d uint8 arrays)."""
        for a, n, o in zip(starts.tolist(), sizes.tolist(), out_at.tolist()):
            out[o:o + n] = buf[a:a + n]

    def decode_into(self, algorithm: str, buf: Any, starts: np.ndarray, sizes: np.ndarray, out: Any,
                    out_at: np.ndarray, nbytes: int) -> Any:
        """Decode each payload ``buf[starts[i]:starts[i] + sizes[i]]`` into ``out[out_at[i]:]``
        (``nbytes`` each, 1-d uint8 arrays), as one batch; returns what must stay alive until
        :meth:`sync` (the device works asynchronously)."""
        if (np.asarray(out_at) % 16).any():  # what nvCOMP needs, checked here too so that CPU tests see it
            raise ValueError("decoded chunks go to 16-byte aligned offsets")
        payloads = [buf[a:a + n] for a, n in zip(starts.tolist(), sizes.tolist())]
        self.decode(algorithm, payloads, [nbytes] * len(payloads), [out[o:o + nbytes] for o in out_at.tolist()])
        return None

    def pack(self, algorithm: str | None, flat: Any, offsets: np.ndarray, nbytes: int, level: int | None,
             head: int = 0, room: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Encode the chunks ``flat[o:o + nbytes]`` (``flat``: 1-d uint8) as one batch and lay the
        payloads out as a shard (:func:`layout`, gaps zeroed) in one host buffer, copied from the
        device at once. Returns ``(host, starts, sizes)``."""
        if (np.asarray(offsets) % 16).any():  # what nvCOMP needs, checked here too so that CPU tests see it
            raise ValueError("chunks to encode start at 16-byte aligned offsets")
        arrays = [flat[o:o + nbytes] for o in offsets.tolist()]
        views = self.encode(algorithm, arrays, level) if algorithm else arrays
        sizes = np.array([int(v.size) for v in views], np.int64)
        starts, end = layout(sizes, head, room)
        image = np.zeros(end, np.uint8)
        for at, v in zip(starts.tolist(), views):
            image[at:at + v.size] = v
        return image, starts, sizes

    def decode(self, algorithm: str, payloads: list, sizes: list[int], outs: list) -> None:
        """Each payload decoded into ``outs[i]`` (1-d uint8 arrays of ``sizes[i]``)."""
        import numcodecs

        for p, n, o in zip(payloads, sizes, outs):
            raw = bytes(memoryview(p))
            try:
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
            except (RuntimeError, ValueError, OSError, zlib.error, EOFError) as e:
                raise OSError(f"a {algorithm} chunk does not decode ({e}): the store is damaged") from None
            a = np.frombuffer(b, np.uint8)
            if a.size != n:
                raise OSError(f"a {algorithm} chunk decoded to {a.size} bytes, not {n}: the store is damaged")
            np.copyto(o, a)

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
    decodes and encodes with nvCOMP on the calling thread's current stream: one batch per call,
    its chunks carved from one buffer by an offset table (``nvcomp.as_arrays(buffer, offsets,
    sizes)``), decodes with a configuration built from the known chunk size (no stream sync
    inside nvCOMP, so reads, decodes and compute of other tasks overlap)."""

    name = "nvcomp"

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def xp(self):  # noqa: D102
        return import_cupy()

    def read(self, path: str, offset: int, nbytes: int):
        return file_rows_to_device(path, offset, (nbytes,), np.uint8, slice_bytes=READ_SLICE)

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
        return nvcomp, codecs[key], stream.ptr

    def _config(self, codec: Any, n: int, nbytes: int):
        """nvCOMP's decompression configuration for ``n`` chunks of ``nbytes``, kept per codec."""
        configs = getattr(self._local, "configs", None)
        if configs is None:
            configs = self._local.configs = {}
        key = (id(codec), n, nbytes)
        if key not in configs:
            if len(configs) > 64:
                configs.clear()
            try:
                configs[key] = codec.decompression_config(codec.compression_config([int(nbytes)] * n))
            except Exception:  # noqa: BLE001 - a codec nvCOMP only decodes (gzip): it parses sizes itself
                configs[key] = None
        return configs[key]

    def place(self, buf: Any, starts: np.ndarray, sizes: np.ndarray, out: Any, out_at: np.ndarray) -> None:
        gather(buf.data.ptr + starts.astype(np.uint64), out, out_at, sizes)

    def decode_into(self, algorithm: str, buf: Any, starts: np.ndarray, sizes: np.ndarray, out: Any,
                    out_at: np.ndarray, nbytes: int) -> Any:
        cp = import_cupy()
        if ((buf.data.ptr + starts) % 16).any():  # a store not written by flowgpu: payloads gathered aligned
            at, end = layout(sizes)
            aligned = cp.empty(max(end, 1), cp.uint8)
            self.place(buf, starts, sizes, aligned, at)
            buf, starts = aligned, at
        if ((out.data.ptr + out_at) % 16).any():
            raise ValueError("nvCOMP writes decoded chunks at 16-byte aligned addresses")
        nvcomp, codec, stream = self._codec(algorithm)
        n = len(starts)
        srcs = nvcomp.as_arrays(buf, starts.tolist(), sizes.tolist(), cuda_stream=stream)
        outs = nvcomp.as_arrays(out, out_at.tolist(), [int(nbytes)] * n, cuda_stream=stream)
        config = self._config(codec, n, nbytes)
        if config is None:
            codec.decode(srcs, out=outs)
        else:
            codec.decode(srcs, out=outs, decompression_config=config)
        return buf, srcs, outs

    def pack(self, algorithm: str | None, flat: Any, offsets: np.ndarray, nbytes: int, level: int | None,
             head: int = 0, room: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cp = import_cupy()
        n = len(offsets)
        if not algorithm:
            src, at, sizes = flat, offsets, np.full(n, nbytes, np.int64)
        else:
            nvcomp, codec, stream = self._codec(algorithm)
            bound = nbytes + nbytes // 8 + 4096  # above LZ4's and zstd's own worst cases
            try:  # nvCOMP's worst case for one chunk, if it asks for more
                bound = max(bound, int(codec.get_max_comp_buffer_size(
                    nvcomp.as_array(flat[int(offsets[0]):int(offsets[0]) + nbytes], cuda_stream=stream))))
            except (TypeError, ValueError, RuntimeError):
                pass
            cap = -(-bound // ALIGN) * ALIGN
            src = cp.empty(n * cap, cp.uint8)
            at = np.arange(n, dtype=np.int64) * cap
            batch = codec.encode(nvcomp.as_arrays(flat, offsets.tolist(), [int(nbytes)] * n, cuda_stream=stream),
                                 out=nvcomp.as_arrays(src, at.tolist(), [cap] * n, cuda_stream=stream))
            sizes = np.asarray(batch.buffer_sizes, np.int64)  # waits for the encode
            if len(sizes) != n or (sizes <= 0).any() or (sizes > cap).any():
                raise RuntimeError(f"nvCOMP {algorithm} returned {len(sizes)} chunk sizes out of range for {n} "
                                   f"chunks of {nbytes} bytes (capacity {cap})")
        starts, end = layout(sizes, head, room)
        image = cp.zeros(end, cp.uint8)
        dst = starts
        if algorithm == "Zstd" and room and n:  # frames that carry their content size go ``room`` earlier, at
            fhd = cp.asnumpy(src[cp.asarray(at + 4)]).astype(np.int64)  # the aligned offset (nothing to add)
            dst = np.where(((fhd >> 6) == 0) & ((fhd & 0x20) == 0), starts, starts - room)
        gather(src.data.ptr + at.astype(np.uint64), image, dst, sizes)
        return self.to_host(image), starts, sizes

    def encode(self, algorithm: str, arrays: list, level: int | None = None) -> list:
        """Each array encoded (a batch of one buffer each; for tests and small writes)."""
        flat = import_cupy().concatenate([a.reshape(-1).view(np.uint8) for a in arrays])
        nbytes = arrays[0].size * arrays[0].itemsize
        host, starts, sizes = self.pack(algorithm, flat, np.arange(len(arrays), dtype=np.int64) * nbytes, nbytes, level)
        return [host[a:a + n] for a, n in zip(starts.tolist(), sizes.tolist())]

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
