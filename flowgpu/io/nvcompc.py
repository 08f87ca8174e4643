"""nvCOMP's batched C decoders through ctypes: the Python API never reads back which chunks decoded.

:func:`decode` enqueues one batch (``nvcompBatched<Algorithm>DecompressAsync``) and returns a
:class:`Pending`; after the stream syncs, :meth:`Pending.damaged` reads the per-chunk statuses.
nvCOMP does not bound itself against damaged input (``benchmarks/probes/nvcomp_status.py``: a long
LZ4 literal run writes past the output, a bad zstd header faults, and the CUDA context is lost),
so each payload is first walked on the device (:data:`_WALKS`; :func:`lz4_walk`, :func:`zstd_walk`
on the host); one that fails is marked damaged and replaced by a valid one-byte stream (:data:`_SAFE`:
nvCOMP's zstd ignores the size it is given, so an empty payload is not safe either).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

from flowgpu.backend import import_cupy

__all__ = ["ALGORITHMS", "STATUS", "Pending", "decode", "damaged", "lz4_walk", "zstd_walk", "check_source"]

ALGORITHMS = ("Zstd", "LZ4", "Deflate", "Gzip")

STATUS = {  # nvcompStatus_t (nvcomp/shared_types.h)
    0: "decoded", 10: "invalid value", 11: "not supported", 12: "cannot decompress", 13: "bad checksum",
    14: "cannot verify checksums", 15: "output buffer too small", 16: "wrong header length",
    17: "misaligned", 18: "chunk too large", 20: "wrong input length", 1000: "CUDA error",
    10000: "nvCOMP internal error",
}


_WALKS = {  # per algorithm, __device__ int flowgpu_walk(payload, its length, the chunk's size): 1 if damaged
    "LZ4": r"""
__device__ int flowgpu_walk(const unsigned char* s, const long long len, const long long cap) {
    long long pos = 0, out = 0;
    int bad = 0;
    while (pos < len && !bad) {
        const unsigned int token = s[pos++];
        long long lit = token >> 4;
        if (lit == 15) {
            unsigned int b = 255;
            while (b == 255 && pos < len) { b = s[pos++]; lit += b; }
            if (b == 255) { bad = 1; break; }
        }
        pos += lit; out += lit;
        if (pos > len || out > cap) { bad = 1; break; }
        if (pos == len) break;
        if (pos + 2 > len) { bad = 1; break; }
        const long long off = (long long)s[pos] | ((long long)s[pos + 1] << 8);
        pos += 2;
        if (off == 0 || off > out) { bad = 1; break; }
        long long ml = token & 15;
        if (ml == 15) {
            unsigned int b = 255;
            while (b == 255 && pos < len) { b = s[pos++]; ml += b; }
            if (b == 255) { bad = 1; break; }
        }
        out += ml + 4;
        if (out > cap) bad = 1;
    }
    return bad || out != cap;
}
""",
    "Zstd": r"""
__device__ int flowgpu_walk(const unsigned char* s, const long long len, const long long cap) {
    const int dict_bytes[4] = {0, 1, 2, 4}, fcs_bytes[4] = {0, 2, 4, 8};
    long long pos = 0, lo = 0, hi = 0, sized = 0;
    int bad = len < 9, frames = 0, unsized = 0;
    while (!bad && pos < len) {
        if (pos + 8 > len) { bad = 1; break; }
        const unsigned int magic = s[pos] | (s[pos + 1] << 8) | (s[pos + 2] << 16) | ((unsigned int)s[pos + 3] << 24);
        if ((magic & 0xFFFFFFF0u) == 0x184D2A50u) {  /* a skippable frame */
            const long long skip = s[pos + 4] | (s[pos + 5] << 8) | (s[pos + 6] << 16) | ((long long)s[pos + 7] << 24);
            pos += 8 + skip;
            if (pos > len) bad = 1;
            continue;
        }
        const unsigned int fhd = s[pos + 4];
        const int fcs_flag = fhd >> 6, single = (fhd >> 5) & 1, checksum = (fhd >> 2) & 1;
        const int fcs_n = fcs_flag ? fcs_bytes[fcs_flag] : single;
        pos += 5 + !single + dict_bytes[fhd & 3];
        if (magic != 0xFD2FB528u || ((fhd >> 3) & 1) || pos + fcs_n > len) { bad = 1; break; }
        frames++;
        if (fcs_n) {
            unsigned long long fcs = 0;
            for (int k = 0; k < fcs_n; k++) fcs |= (unsigned long long)s[pos + k] << (8 * k);
            if (fcs_n == 2) fcs += 256;
            if (fcs > (unsigned long long)cap) { bad = 1; break; }
            sized += (long long)fcs;
        } else {
            unsized = 1;
        }
        pos += fcs_n;
        int last = 0;
        while (!bad && !last) {
            if (pos + 3 > len) { bad = 1; break; }
            const unsigned int bh = s[pos] | (s[pos + 1] << 8) | (s[pos + 2] << 16);
            pos += 3;
            last = bh & 1;
            const int type = (bh >> 1) & 3;
            const long long size = bh >> 3;
            if (type == 3 || size > 131072) { bad = 1; break; }
            if (type == 1) { pos += 1; lo += size; hi += size; }
            else { pos += size; if (type == 0) lo += size; hi += type == 0 ? size : 131072; }
            if (pos > len || lo > cap) bad = 1;
        }
        pos += 4 * checksum;
        if (pos > len) bad = 1;
    }
    return bad || !frames || hi < cap || sized > cap || (!unsized && sized != cap);
}
""",
}
_CHECK = r"""
extern "C" __global__ void flowgpu_check(unsigned long long* src, unsigned long long* n, const long long cap,
                                         int* status, const int count, const unsigned long long safe,
                                         const unsigned long long safe_n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    if (flowgpu_walk((const unsigned char*)src[i], (long long)n[i], cap)) {
        status[i] = 12;  /* cannot decompress; nvCOMP gets a valid stream in its place */
        n[i] = safe_n;
        src[i] = safe;
    } else {
        status[i] = 0;
    }
}
"""


def check_source(algorithm: str) -> str:
    """The CUDA source of ``algorithm``'s walk kernel: plain C but for ``__global__``, ``__device__``
    and the thread index (the tests compile it with a C compiler)."""
    return _WALKS[algorithm] + _CHECK


_kernels: dict = {}


def _lz4_length(s: memoryview, pos: int, n: int, length: int) -> tuple[int, int] | None:
    """An LZ4 length (15 continued by bytes until one below 255): ``(length, pos)``, None if cut short."""
    if length != 15:
        return length, pos
    b = 255
    while b == 255 and pos < n:
        b = s[pos]
        pos += 1
        length += b
    return None if b == 255 else (length, pos)


def lz4_walk(payload: bytes | np.ndarray, nbytes: int) -> bool:
    """Whether an LZ4 block decodes to exactly ``nbytes`` with every copy in bounds (the device's walk)."""
    s = memoryview(np.ascontiguousarray(np.frombuffer(payload, np.uint8) if isinstance(payload, bytes)
                                        else payload, np.uint8)).cast("B")
    n, pos, out = len(s), 0, 0
    while pos < n:
        token = s[pos]
        got = _lz4_length(s, pos + 1, n, token >> 4)
        if got is None:
            return False
        lit, pos = got
        pos, out = pos + lit, out + lit
        if pos > n or out > nbytes:
            return False
        if pos == n:
            break
        if pos + 2 > n:
            return False
        off = s[pos] | (s[pos + 1] << 8)
        if off == 0 or off > out:
            return False
        got = _lz4_length(s, pos + 2, n, token & 15)
        if got is None:
            return False
        ml, pos = got
        out += ml + 4
        if out > nbytes:
            return False
    return out == nbytes


def zstd_walk(payload: bytes | np.ndarray, nbytes: int) -> bool:
    """Whether a zstd payload's frames fit it and ``nbytes`` (magic, no reserved bit, content sizes,
    blocks of a known type of at most 128 KiB inside the payload): the device's walk, on the host."""
    s = payload if isinstance(payload, bytes) else bytes(np.frombuffer(payload, np.uint8))
    n, pos, lo, hi, sized, frames, unsized = len(s), 0, 0, 0, 0, 0, False
    if n < 9:
        return False
    while pos < n:
        if pos + 8 > n:
            return False
        magic = int.from_bytes(s[pos:pos + 4], "little")
        if magic & 0xFFFFFFF0 == 0x184D2A50:  # a skippable frame
            pos += 8 + int.from_bytes(s[pos + 4:pos + 8], "little")
            if pos > n:
                return False
            continue
        fhd = s[pos + 4]
        fcs_flag, single, checksum = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1
        fcs_n = (0, 2, 4, 8)[fcs_flag] if fcs_flag else single
        pos += 5 + (not single) + (0, 1, 2, 4)[fhd & 3]
        if magic != 0xFD2FB528 or (fhd >> 3) & 1 or pos + fcs_n > n:
            return False
        frames += 1
        if fcs_n:
            fcs = int.from_bytes(s[pos:pos + fcs_n], "little") + (256 if fcs_n == 2 else 0)
            if fcs > nbytes:
                return False
            sized += fcs
        else:
            unsized = True
        pos += fcs_n
        last = 0
        while not last:
            if pos + 3 > n:
                return False
            bh = int.from_bytes(s[pos:pos + 3], "little")
            pos += 3
            last, kind, size = bh & 1, (bh >> 1) & 3, bh >> 3
            if kind == 3 or size > 131072:
                return False
            if kind == 1:
                pos, lo, hi = pos + 1, lo + size, hi + size
            else:
                pos += size
                lo, hi = lo + (size if kind == 0 else 0), hi + (size if kind == 0 else 131072)
            if pos > n or lo > nbytes:
                return False
        pos += 4 * checksum
        if pos > n:
            return False
    return bool(frames) and hi >= nbytes and sized <= nbytes and (unsized or sized == nbytes)


class _Options(ctypes.Structure):
    """Every batched decompress options struct: 64 bytes, all zeros its defaults."""

    _fields_ = [("raw", ctypes.c_ubyte * 64)]


@functools.cache
def _entries(algorithm: str) -> tuple[Any, Any]:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"nvCOMP has no batched decoder named {algorithm!r}")
    from nvidia.libnvcomp.load import load_library

    lib = load_library()
    if lib is None:
        raise OSError("libnvcomp.so.6 could not be loaded: install nvidia-libnvcomp-cu13 (the GPU extra)")
    size, ptr = ctypes.c_size_t, ctypes.c_void_p
    temp = getattr(lib, f"nvcompBatched{algorithm}DecompressGetTempSize")
    temp.argtypes = [size, size, _Options, ctypes.POINTER(size), size, ptr]
    temp.restype = ctypes.c_int
    run = getattr(lib, f"nvcompBatched{algorithm}DecompressAsync")
    run.argtypes = [ptr, ptr, ptr, ptr, size, ptr, size, ptr, _Options, ptr, ptr]
    run.restype = ctypes.c_int
    return temp, run


@functools.lru_cache(maxsize=256)
def _temp_bytes(algorithm: str, n: int, nbytes: int) -> int:
    temp, _ = _entries(algorithm)
    out = ctypes.c_size_t(0)
    rc = temp(n, nbytes, _Options(), ctypes.byref(out), n * nbytes, None)
    if rc:
        raise RuntimeError(f"nvCOMP {algorithm}: no scratch size for {n} chunks of {nbytes} bytes "
                           f"({STATUS.get(rc, rc)})")
    return int(out.value)


_SAFE = {  # a valid stream of one zero byte, for nvCOMP to decode in a damaged payload's place
    "LZ4": bytes([0x10, 0x00]),  # one literal
    "Zstd": bytes.fromhex("28b52ffd200109000000"),  # what zstd makes of b"\\0": one frame, one raw block
}


def _safe(cp, algorithm: str) -> Any:
    """:data:`_SAFE`'s stream for ``algorithm`` on the current device."""
    key = ("safe", algorithm, cp.cuda.Device().id)
    if key not in _kernels:
        _kernels[key] = cp.asarray(np.frombuffer(_SAFE[algorithm], np.uint8))
        cp.cuda.get_current_stream().synchronize()  # in place before any stream points at it
    return _kernels[key]


def damaged(statuses: np.ndarray, decoded: np.ndarray, nbytes: int) -> np.ndarray:
    """Indices of the chunks that did not decode, or decoded to other than ``nbytes`` bytes."""
    return np.flatnonzero((np.asarray(statuses) != 0) | (np.asarray(decoded) != nbytes))


class Pending:
    """One batch's per-chunk statuses and decoded sizes, and what the decoder reads until done."""

    def __init__(self, algorithm: str, nbytes: int, statuses: Any, decoded: Any, keep: tuple):
        self.algorithm, self.nbytes = algorithm, nbytes
        self.statuses, self.decoded, self.keep = statuses, decoded, keep

    def damaged(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(indices, statuses, decoded sizes)`` of the chunks that did not decode (after a sync)."""
        st, got = (a.get() if hasattr(a, "get") else a for a in (self.statuses, self.decoded))  # CuPy: copied
        bad = damaged(st, got, self.nbytes)
        return bad, st[bad], got[bad]


def decode(algorithm: str, buf: Any, starts: np.ndarray, sizes: np.ndarray, out: Any, out_at: np.ndarray,
           nbytes: int) -> Pending:
    """Enqueue the decode of ``buf[starts[i]:starts[i] + sizes[i]]`` into ``out[out_at[i]:]``
    (``nbytes`` each; 1-d uint8 CuPy arrays, offsets 16-byte aligned) on the current stream."""
    cp = import_cupy()
    stream = cp.cuda.get_current_stream().ptr
    _, run = _entries(algorithm)
    n = len(starts)
    table = np.empty((4, n), np.uint64)  # compressed addresses and sizes, output addresses and capacities
    table[0] = np.uint64(buf.data.ptr) + np.asarray(starts, np.uint64)
    table[1] = np.asarray(sizes, np.uint64)
    table[2] = np.uint64(out.data.ptr) + np.asarray(out_at, np.uint64)
    table[3] = nbytes
    dev = cp.asarray(table)  # on the current stream, which is ``stream``
    statuses, decoded = cp.empty(n, cp.int32), cp.empty(n, cp.uint64)
    need = _temp_bytes(algorithm, n, int(nbytes))
    temp = cp.empty(max(need, 1), cp.uint8)
    row = dev.strides[0]
    base = dev.data.ptr
    checked = None
    if algorithm in _WALKS and n:  # damaged payloads walked out of nvCOMP's way (it does not bound itself)
        if algorithm not in _kernels:
            _kernels[algorithm] = cp.RawKernel(check_source(algorithm), "flowgpu_check")
        checked = cp.empty(n, cp.int32)
        _kernels[algorithm](((n + 63) // 64,), (64,), (dev[0], dev[1], np.int64(nbytes), checked, np.int32(n),
                                                       np.uint64(_safe(cp, algorithm).data.ptr),
                                                       np.uint64(len(_SAFE[algorithm]))))
    rc = run(base, base + row, base + 3 * row, decoded.data.ptr, n, temp.data.ptr, need, base + 2 * row,
             _Options(), statuses.data.ptr, stream)
    if rc:
        raise RuntimeError(f"nvCOMP {algorithm} refused a batch of {n} chunks of {nbytes} bytes ({STATUS.get(rc, rc)})")
    if checked is not None:  # the walk's verdict first: nvCOMP's status for an emptied payload is its own
        statuses = cp.where(checked != 0, checked, statuses)
    return Pending(algorithm, int(nbytes), statuses, decoded, (dev, temp, buf))
