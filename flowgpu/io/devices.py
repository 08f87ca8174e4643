"""The objects that move a Zarr store's bytes and decode them: on the device, or NumPy stand-ins.

:func:`device_for` gives :class:`CupyDevice` (nvCOMP on CuPy arrays), :class:`KvikioDevice` (reading
with kvikio) or :class:`HostDevice`, the same interface in NumPy (numcodecs/zlib), so the whole device
path runs and is tested on a CPU. Every call takes a batch as one buffer and an offset table.
"""

from __future__ import annotations

import functools
import gzip
import struct
import threading
import zlib
from typing import Any

import numpy as np

from flowgpu.backend import import_cupy
from flowgpu.io import nvcompc
from flowgpu.io.devcodec import ALIGN, layout
from flowgpu.transfer.staging import file_rows_to_device, read_at

__all__ = ["gather", "HostDevice", "CupyDevice", "KvikioDevice", "DEVICES", "device_for"]

READ_SLICE = 16 << 20  # staging slice of a shard read: four shards read at once spread over all reader threads


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
    """Copy ``sizes[i]`` bytes from device address ``src_ptrs[i]`` to ``dst[dst_at[i]:]``, all in one
    kernel launch on the current stream (one ``memcpyAsync`` per chunk costs more than its bytes)."""
    cp = import_cupy()
    n = len(sizes)
    if not n:
        return
    if "gather" not in _kernels:
        _kernels["gather"] = cp.RawKernel(_GATHER, "flowgpu_gather")
    args = (cp.asarray(np.asarray(src_ptrs, np.uint64)), cp.asarray(np.asarray(dst_at, np.int64)),
            cp.asarray(np.asarray(sizes, np.int64)), dst)
    _kernels["gather"]((n,), (256,), args)


class HostDevice:
    """The device interface on NumPy arrays (tests, CPU machines): nvCOMP's raw streams decoded by
    numcodecs and zlib, with the same reads, framing, batches and offset tables."""

    name = "fake"
    xp = np

    def read(self, path: str, offset: int, nbytes: int) -> np.ndarray:
        return self.read_host(path, offset, nbytes)

    def read_host(self, path: str, offset: int, nbytes: int, out: np.ndarray | None = None) -> np.ndarray:
        """``nbytes`` of ``path`` at ``offset`` in host memory (``out``, or a new array)."""
        return read_at(path, np.empty(nbytes, np.uint8) if out is None else out, offset)

    def upload(self, host: np.ndarray) -> Any:
        """The host bytes ``host`` on the device (keep ``host`` alive until :meth:`sync`)."""
        return host

    def place(self, buf: Any, starts: np.ndarray, sizes: np.ndarray, out: Any, out_at: np.ndarray) -> None:
        """Copy ``buf[starts[i]:starts[i] + sizes[i]]`` to ``out[out_at[i]:]`` (1-d uint8 arrays)."""
        for a, n, o in zip(starts.tolist(), sizes.tolist(), out_at.tolist()):
            out[o:o + n] = buf[a:a + n]

    def decode_into(self, algorithm: str, buf: Any, starts: np.ndarray, sizes: np.ndarray, out: Any,
                    out_at: np.ndarray, nbytes: int) -> Any:
        """Decode each payload ``buf[starts[i]:starts[i] + sizes[i]]`` into ``out[out_at[i]:]`` (``nbytes``
        each) as one batch; a :class:`~flowgpu.io.nvcompc.Pending`, to keep until :meth:`sync`."""
        if (np.asarray(out_at) % 16).any():  # what nvCOMP needs, checked here too so that CPU tests see it
            raise ValueError("decoded chunks go to 16-byte aligned offsets")
        payloads = [buf[a:a + n] for a, n in zip(starts.tolist(), sizes.tolist())]
        statuses, decoded = self.decode(algorithm, payloads, nbytes, [out[o:o + nbytes] for o in out_at.tolist()])
        return nvcompc.Pending(algorithm, nbytes, statuses, decoded, ())

    def pack(self, algorithm: str | None, flat: Any, offsets: np.ndarray, nbytes: int, level: int | None,
             head: int = 0, room: int = 0, tail: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Encode the chunks ``flat[o:o + nbytes]`` as one batch, laid out as a shard (:func:`layout`)
        in one host buffer: ``(host, starts, sizes)``."""
        if (np.asarray(offsets) % 16).any():  # what nvCOMP needs, checked here too so that CPU tests see it
            raise ValueError("chunks to encode start at 16-byte aligned offsets")
        arrays = [flat[o:o + nbytes] for o in offsets.tolist()]
        views = self.encode(algorithm, arrays, level) if algorithm else arrays
        sizes = np.array([int(v.size) for v in views], np.int64)
        starts, end = layout(sizes, head, room, tail=tail)
        image = np.zeros(end, np.uint8)
        for at, v in zip(starts.tolist(), views):
            image[at:at + v.size] = v
        return image, starts, sizes

    def decode(self, algorithm: str, payloads: list, nbytes: int, outs: list) -> tuple[np.ndarray, np.ndarray]:
        """Each payload decoded into ``outs[i]``; nvCOMP's per-chunk ``(statuses, decoded sizes)``
        (12, "cannot decompress", where the decoder refuses a payload)."""
        import numcodecs

        statuses = np.zeros(len(payloads), np.int32)
        decoded = np.zeros(len(payloads), np.uint64)
        decoders = {"Zstd": numcodecs.Zstd().decode, "Deflate": lambda raw: zlib.decompress(raw, -15),
                    "LZ4": lambda raw: numcodecs.LZ4().decode(struct.pack("<I", nbytes) + raw), "Gzip": gzip.decompress}
        for i, (p, o) in enumerate(zip(payloads, outs)):
            try:
                b = decoders[algorithm](bytes(memoryview(p)))
            except (KeyError, RuntimeError, ValueError, OSError, zlib.error, EOFError):  # KeyError: no decoder
                statuses[i] = 12
                continue
            a = np.frombuffer(b, np.uint8)
            decoded[i] = a.size
            o[:min(a.size, nbytes)] = a[:nbytes]
        return statuses, decoded

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
    """CuPy arrays on the thread's current stream, read through pinned staging; decodes through
    nvCOMP's C API (:mod:`flowgpu.io.nvcompc`: no stream sync inside), encodes with its Python API."""

    name = "nvcomp"

    def __init__(self) -> None:
        self._local = threading.local()

    @property
    def xp(self):  # noqa: D102
        return import_cupy()

    def read(self, path: str, offset: int, nbytes: int):
        return file_rows_to_device(path, offset, (nbytes,), np.uint8, budget=READ_SLICE)

    def read_host(self, path: str, offset: int, nbytes: int, out: np.ndarray | None = None) -> np.ndarray:
        import cupyx

        return super().read_host(path, offset, nbytes, cupyx.empty_pinned(nbytes, np.uint8) if out is None else out)

    def upload(self, host: np.ndarray) -> Any:
        """Copied on the current stream, from pinned memory: asynchronous (``host`` lives until :meth:`sync`)."""
        out = import_cupy().empty(host.shape, host.dtype)
        out.set(host, stream=import_cupy().cuda.get_current_stream())
        return out

    def _codec(self, algorithm: str):
        cp = import_cupy()
        from nvidia import nvcomp

        stream = cp.cuda.get_current_stream()
        key = (algorithm, cp.cuda.Device().id, stream.ptr)
        codecs = vars(self._local).setdefault("codecs", {})
        if key not in codecs:
            codecs[key] = nvcomp.Codec(algorithm=algorithm, bitstream_kind=nvcomp.BitstreamKind.RAW,
                                       device_id=key[1], cuda_stream=stream.ptr)
        return nvcomp, codecs[key], stream.ptr

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
        return nvcompc.decode(algorithm, buf, starts, sizes, out, out_at, nbytes)

    def pack(self, algorithm: str | None, flat: Any, offsets: np.ndarray, nbytes: int, level: int | None,
             head: int = 0, room: int = 0, tail: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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
        starts, end = layout(sizes, head, room, tail=tail)
        image = cp.zeros(end, cp.uint8)
        dst = starts
        if algorithm == "Zstd" and room and n:  # frames that carry their content size go ``room`` earlier, at
            fhd = cp.asnumpy(src[cp.asarray(at + 4)]).astype(np.int64)  # the aligned offset (nothing to add)
            dst = np.where(((fhd >> 6) == 0) & ((fhd & 0x20) == 0), starts, starts - room)
        gather(src.data.ptr + at.astype(np.uint64), image, dst, sizes)
        return self.to_host(image), starts, sizes

    def to_host(self, a: Any) -> np.ndarray:
        """A device array in pinned host memory (CuPy's pinned pool keeps the buffers for reuse)."""
        import cupyx

        out = cupyx.empty_pinned(a.shape, a.dtype)
        a.get(out=out)
        return out

    def sync(self) -> None:
        import_cupy().cuda.get_current_stream().synchronize()


class KvikioDevice(CupyDevice):
    """:class:`CupyDevice` reading files with kvikio (``flowgpu.zarr.reader: kvikio``; GPUDirect Storage)."""

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


@functools.cache
def device_for(name: str) -> HostDevice:
    """The process's device object of kind ``name`` (``nvcomp``, ``nvcomp-kvikio`` or ``fake``)."""
    return DEVICES[name]()
