"""Can a cached file's pages go to the device without a host copy? Pinning a read-only file mapping.

``python -m benchmarks.probes.file_register [--file-gib 16] [--piece-mib 1024] [--threads 1,4,8] [--ceiling]``
(GPU only)

Reading a ``.npy`` into pinned staging buffers copies every byte once on the CPU (page cache ->
pinned) before the device copy reads it again: host memory traffic, not PCIe, limits that path.
CUDA can pin a read-only mapping of a file (``cudaHostRegister`` with ``cudaHostRegisterReadOnly``),
and the copy engine then reads the page cache itself. This prints, for pieces of ``--piece-mib``:

- the cost of each step on one thread: ``mmap`` (with and without ``MAP_POPULATE``),
  ``cudaHostRegister``, the device copy, ``cudaHostUnregister``, ``munmap``;
- that the bytes on the device equal the file's;
- the whole file to the device from 1, 4, 8 threads (a device buffer each, own streams), against
  the same file through pinned staging buffers (``file_rows_to_device``);
- whether registering on one thread slows pinned copies on another (does it hold the driver?);
- ``--ceiling``: what host memory itself allows: copies between host buffers from 1, 8, 16
  threads, and page-cache reads into pinned memory from 16 threads alone and while the copy
  engine reads other pinned memory at full speed.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import tempfile
import threading
import time

import numpy as np

from benchmarks import harness
from flowgpu.backend import import_cupy
from flowgpu.transfer.pinned import registered_pinned_allocator
from flowgpu.transfer.staging import file_rows_to_device

MiB, GiB = 1 << 20, 1 << 30
READ_ONLY, PORTABLE = 8, 1  # cudaHostRegisterReadOnly, cudaHostRegisterPortable

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


def _map(fd: int, offset: int, length: int, populate: bool) -> tuple[int, int, int]:
    """(mapping address, mapped length, address of ``offset``) of a read-only shared file mapping."""
    page = mmap.PAGESIZE
    start = offset - offset % page
    n = offset + length - start
    n += (-n) % page
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0x8000) if populate else 0)
    addr = _libc.mmap(None, n, mmap.PROT_READ, flags, fd, start)
    if addr in (None, MAP_FAILED):
        raise OSError(ctypes.get_errno(), "mmap failed")
    return addr, n, addr + (offset - start)


def _one(cp, fd, offset, length, dev, stream, populate=True, flags=READ_ONLY | PORTABLE) -> dict:
    t = [time.perf_counter()]
    addr, n, ptr = _map(fd, offset, length, populate)
    t.append(time.perf_counter())
    cp.cuda.runtime.hostRegister(addr, n, flags)
    t.append(time.perf_counter())
    cp.cuda.runtime.memcpyAsync(dev, ptr, length, cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
    stream.synchronize()
    t.append(time.perf_counter())
    cp.cuda.runtime.hostUnregister(addr)
    t.append(time.perf_counter())
    _libc.munmap(addr, n)
    t.append(time.perf_counter())
    return dict(zip(("mmap", "register", "copy", "unregister", "munmap"), np.diff(t)))


def parser():
    p = harness.parser(__spec__.name, __doc__)
    p.add_argument("--file-gib", type=int, default=16)
    p.add_argument("--piece-mib", type=int, default=1024, help="size of each pinned piece of the file")
    p.add_argument("--threads", default="1,4,8", help="comma-separated thread counts of the whole-file sweep")
    p.add_argument("--dir", default=None, help="where the file goes (default: a temp dir)")
    p.add_argument("--ceiling", action="store_true", help="only the host memory ceiling measurements")
    return p


def main(argv=None) -> int:
    return harness.captured_main(parser, _probe, argv)


def _probe(a) -> None:
    cp = import_cupy()
    print(f"kernel {os.uname().release}; /sys THP: "
          + open("/sys/kernel/mm/transparent_hugepage/enabled").read().strip(), flush=True)
    d = tempfile.mkdtemp(prefix="flowgpu-reg-", dir=a.dir)
    path = os.path.join(d, "x.bin")
    header = 128  # like a .npy: the data does not start on a page boundary
    total = a.file_gib * GiB
    block = np.random.default_rng(0).integers(0, 255, size=256 * MiB, dtype=np.uint8)
    t = time.perf_counter()
    with open(path, "wb") as f:
        f.write(b"h" * header)
        for i in range(total // block.size):
            block[:8] = i  # every block differs
            f.write(block.data)
    os.sync()
    print(f"wrote {a.file_gib} GiB in {time.perf_counter() - t:.1f} s; filesystem of {d}: "
          + os.popen(f"df -T {d} | tail -1").read().strip(), flush=True)
    fd = os.open(path, os.O_RDONLY)
    piece = a.piece_mib * MiB
    starts = [header + i for i in range(0, total, piece)]
    dev = cp.empty(piece, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    try:
        if a.ceiling:
            ceiling(cp, fd, total, header)
            return
        # warm the page cache and the mapping code
        _one(cp, fd, starts[0], piece, dev.data.ptr, stream)
        for populate in (True, False):
            rows = [_one(cp, fd, s, piece, dev.data.ptr, stream, populate) for s in starts[:8]]
            med = {k: float(np.median([r[k] for r in rows])) for k in rows[0]}
            all_ = sum(med.values())
            print(f"one thread, {a.piece_mib} MiB pieces, MAP_POPULATE={populate}: "
                  + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items())
                  + f"; {piece / all_ / 1e9:.1f} GB/s in all, copy alone {piece / med['copy'] / 1e9:.1f} GB/s", flush=True)
        # same bytes as the file?
        s = starts[3]
        _one(cp, fd, s, piece, dev.data.ptr, stream)
        want = file_rows_to_device(path, s, (piece,), np.uint8)
        print(f"bytes on the device equal the file's: {bool(cp.array_equal(dev, want))}", flush=True)
        del want

        def sweep(nthreads: int, how: str) -> float:
            devs = [cp.empty(piece, dtype=cp.uint8) for _ in range(nthreads)]
            todo = list(starts)
            lock = threading.Lock()

            def work(i: int) -> None:
                st = cp.cuda.Stream(non_blocking=True)
                with st:
                    while True:
                        with lock:
                            if not todo:
                                return
                            s = todo.pop()
                        n = min(piece, header + total - s)
                        if how == "register":
                            _one(cp, fd, s, n, devs[i].data.ptr, st)
                        else:
                            file_rows_to_device(path, s, (n,), np.uint8)  # complete when it returns

            return total / _threads(nthreads, work) / 1e9

        for n in harness.ints(a.threads):
            for how in ("register", "staging"):
                print(f"{a.file_gib} GiB file -> device, {n} thread(s), {how}: {sweep(n, how):.1f} GB/s", flush=True)

        # does registering on one thread slow pinned copies on another?
        buf = registered_pinned_allocator(GiB)
        d2 = cp.empty(GiB, dtype=cp.uint8)
        st2 = cp.cuda.Stream(non_blocking=True)

        def copies(k: int) -> float:
            t = time.perf_counter()
            for _ in range(k):
                cp.cuda.runtime.memcpyAsync(d2.data.ptr, buf.ptr, GiB, cp.cuda.runtime.memcpyHostToDevice, st2.ptr)
            st2.synchronize()
            return k * GiB / (time.perf_counter() - t) / 1e9

        alone = copies(20)
        stop = threading.Event()
        regs = []

        def registrar() -> None:
            i = 0
            while not stop.is_set():
                s = starts[i % len(starts)]
                addr, n, _ = _map(fd, s, piece, True)
                t = time.perf_counter()
                cp.cuda.runtime.hostRegister(addr, n, READ_ONLY | PORTABLE)
                cp.cuda.runtime.hostUnregister(addr)
                regs.append(time.perf_counter() - t)
                _libc.munmap(addr, n)
                i += 1

        th = threading.Thread(target=registrar)
        th.start()
        busy = copies(40)
        stop.set()
        th.join()
        print(f"pinned 1 GiB copies: {alone:.1f} GB/s alone, {busy:.1f} GB/s while another thread registered "
              f"{len(regs)} file pieces (register+unregister median {np.median(regs) * 1e3:.1f} ms)", flush=True)
    finally:
        os.close(fd)
        os.remove(path)
        os.rmdir(d)


def _threads(n: int, fn) -> float:
    """Run ``fn(i)`` on ``n`` threads at once; seconds until all are done."""
    ths = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    t = time.perf_counter()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return time.perf_counter() - t


def ceiling(cp, fd: int, total: int, header: int) -> None:
    """Host memory bandwidth: copies between host buffers, and page-cache reads with and without
    the copy engine reading host memory at the same time."""
    piece, rounds = 256 * MiB, 4
    src = [np.random.default_rng(i).integers(0, 255, piece, dtype=np.uint8) for i in range(16)]
    dst = [np.empty_like(x) for x in src]
    for n in (1, 8, 16):
        def copy(i: int) -> None:
            for _ in range(rounds):
                np.copyto(dst[i], src[i])

        dt = _threads(n, copy)
        print(f"host memcpy, {n} thread(s): {n * rounds * piece / dt / 1e9:.1f} GB/s copied "
              f"(read + write: {2 * n * rounds * piece / dt / 1e9:.1f} GB/s of memory traffic)", flush=True)
    src.clear()
    dst.clear()
    read_piece = 64 * MiB
    bufs = [registered_pinned_allocator(read_piece) for _ in range(16)]

    def reads(n: int) -> float:
        todo = list(range(header, header + total - read_piece + 1, read_piece))
        lock = threading.Lock()

        def reader(i: int) -> None:
            mv = memoryview(bufs[i].view)
            while True:
                with lock:
                    if not todo:
                        return
                    off = todo.pop()
                got = 0
                while got < read_piece:
                    got += os.preadv(fd, [mv[got:]], off + got)

        count = len(todo)
        return count * read_piece / _threads(n, reader) / 1e9

    reads(16)  # the file into the page cache
    alone = reads(16)
    src_buf = registered_pinned_allocator(GiB)
    dev = cp.empty(GiB, dtype=cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    stop = threading.Event()
    moved = [0, 0.0]

    def dma() -> None:
        t = time.perf_counter()
        while not stop.is_set():
            cp.cuda.runtime.memcpyAsync(dev.data.ptr, src_buf.ptr, GiB, cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
            stream.synchronize()
            moved[0] += GiB
        moved[1] = time.perf_counter() - t

    th = threading.Thread(target=dma)
    th.start()
    time.sleep(0.2)
    busy = reads(16)
    stop.set()
    th.join()
    print(f"page cache -> pinned, 16 threads: {alone:.1f} GB/s alone; {busy:.1f} GB/s while the copy engine read "
          f"pinned host memory at {moved[0] / moved[1] / 1e9:.1f} GB/s", flush=True)


if __name__ == "__main__":
    sys.exit(main())
