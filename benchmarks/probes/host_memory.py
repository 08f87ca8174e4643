"""What host memory costs on this machine: pinned allocation, pinning, copies both ways, file reads.

``python -m benchmarks.probes.host_memory [--gib 1] [--file-gib 8]`` prints one line per measurement
(GPU only):

- ``cudaHostAlloc`` of ``--gib``, one at a time and from 4 threads at once; ``cudaFreeHost``;
- pageable memory (transparent huge pages asked for with ``madvise``) touched, then registered with
  ``cudaHostRegister``, timed separately;
- pinned host-to-device alone, and host-to-device with device-to-host at the same time;
- host-to-device copies while another thread allocates pinned memory (does allocation stall copies?);
- ``os.preadv`` from the page cache into pinned memory with 1, 2, 4, 8, 16 threads.

These numbers decide how the store grows its pinned pool and how ``from_npy`` reads.
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

GiB = 1 << 30


def _cp():
    return import_cupy()


def host_alloc(nbytes: int):
    cp = _cp()
    t = time.perf_counter()
    mem = cp.cuda.alloc_pinned_memory(nbytes)
    return mem, time.perf_counter() - t


def register(nbytes: int, huge: bool):
    cp = _cp()
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge and hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, dtype=np.uint8)
    t0 = time.perf_counter()
    a[::4096] = 1  # fault every page in
    t1 = time.perf_counter()
    ptr = a.ctypes.data
    cp.cuda.runtime.hostRegister(ptr, nbytes, 0)
    t2 = time.perf_counter()
    cp.cuda.runtime.hostUnregister(ptr)
    t3 = time.perf_counter()
    del a
    m.close()
    return t1 - t0, t2 - t1, t3 - t2


def copy_gbps(dst, src, nbytes, kind, stream, reps=5):
    cp = _cp()
    times = []
    for _ in range(reps):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record(stream)
        cp.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
        b.record(stream)
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b) / 1e3)
    return nbytes / float(np.median(times)) / 1e9


def parser():
    p = harness.parser(__spec__.name, __doc__)
    p.add_argument("--gib", type=float, default=1.0, help="size of each pinned allocation and copy")
    p.add_argument("--file-gib", type=float, default=8.0, help="size of the file read from the page cache")
    p.add_argument("--dir", default=None, help="where the file goes (default: a temp dir)")
    return p


def main(argv=None) -> int:
    return harness.captured_main(parser, _probe, argv)


def _probe(a) -> None:
    cp = _cp()
    n = int(a.gib * GiB)
    for p in ("enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{p}") as f:
                print(f"THP {p}: {f.read().strip()}")
        except OSError as e:
            print(f"THP {p}: {e}")
    cp.cuda.Device(0).synchronize()
    cp.cuda.alloc_pinned_memory(1 << 20)  # context and pinned allocator warm

    ts = []
    mems = []
    for _ in range(3):
        m, t = host_alloc(n)
        mems.append(m)
        ts.append(t)
    print(f"cudaHostAlloc {a.gib} GiB, one at a time: {', '.join(f'{t:.3f}' for t in ts)} s")
    t = time.perf_counter()
    mems.clear()
    print(f"cudaFreeHost 3 x {a.gib} GiB: {time.perf_counter() - t:.3f} s")

    out = [None] * 4

    def alloc(i):
        out[i] = host_alloc(n)

    t = time.perf_counter()
    th = [threading.Thread(target=alloc, args=(i,)) for i in range(4)]
    [x.start() for x in th]
    [x.join() for x in th]
    print(f"cudaHostAlloc 4 x {a.gib} GiB from 4 threads: {time.perf_counter() - t:.3f} s wall "
          f"(each {', '.join(f'{o[1]:.3f}' for o in out)})")
    out = [None] * 4

    for huge in (False, True):
        r = [register(n, huge) for _ in range(2)]
        print(f"mmap{' +MADV_HUGEPAGE' if huge else ''} {a.gib} GiB: touch {r[-1][0]:.3f} s, "
              f"cudaHostRegister {r[-1][1]:.3f} s, unregister {r[-1][2]:.3f} s")

    regs = []
    for _ in range(3):
        t = time.perf_counter()
        regs.append(registered_pinned_allocator(n))
        regs[-1] = (regs[-1], time.perf_counter() - t)
    print(f"flowgpu registered_pinned_allocator {a.gib} GiB, one at a time: "
          f"{', '.join(f'{r[1]:.3f}' for r in regs)} s")
    regs.clear()

    # copies
    h1, _ = host_alloc(n)
    h2, _ = host_alloc(n)
    d1 = cp.empty(n, dtype=cp.uint8)
    d2 = cp.empty(n, dtype=cp.uint8)
    s1 = cp.cuda.Stream(non_blocking=True)
    s2 = cp.cuda.Stream(non_blocking=True)
    H2D, D2H = cp.cuda.runtime.memcpyHostToDevice, cp.cuda.runtime.memcpyDeviceToHost
    print(f"pinned H2D alone: {copy_gbps(d1.data.ptr, h1.ptr, n, H2D, s1):.1f} GB/s; "
          f"D2H alone: {copy_gbps(h2.ptr, d2.data.ptr, n, D2H, s2):.1f} GB/s")
    res = {}

    def run_copy(name, dst, src, kind, s):
        res[name] = copy_gbps(dst, src, n, kind, s, reps=8)

    th = [threading.Thread(target=run_copy, args=("h2d", d1.data.ptr, h1.ptr, H2D, s1)),
          threading.Thread(target=run_copy, args=("d2h", h2.ptr, d2.data.ptr, D2H, s2))]
    [x.start() for x in th]
    [x.join() for x in th]
    print(f"H2D and D2H at once: {res['h2d']:.1f} / {res['d2h']:.1f} GB/s")

    # does a pinned allocation in another thread stall copies on this one?
    stop = threading.Event()
    allocs = []

    def allocator():
        while not stop.is_set() and len(allocs) < 4:
            allocs.append(host_alloc(n))

    def registering():
        while not stop.is_set() and len(allocs) < 4:
            t = time.perf_counter()
            b = registered_pinned_allocator(n)
            allocs.append((b, time.perf_counter() - t))

    reps = 40
    t = time.perf_counter()
    for _ in range(reps):
        cp.cuda.runtime.memcpyAsync(d1.data.ptr, h1.ptr, n, H2D, s1.ptr)
    s1.synchronize()
    base = time.perf_counter() - t
    for name, target in (("cudaHostAlloc", allocator), ("registered", registering)):
        stop.clear()
        th = threading.Thread(target=target)
        th.start()
        t = time.perf_counter()
        for _ in range(reps):
            cp.cuda.runtime.memcpyAsync(d1.data.ptr, h1.ptr, n, H2D, s1.ptr)
            s1.synchronize()
        during = time.perf_counter() - t
        stop.set()
        th.join()
        print(f"{reps} H2D copies of {a.gib} GiB: {reps * n / base / 1e9:.1f} GB/s alone, "
              f"{reps * n / during / 1e9:.1f} GB/s while another thread allocated {len(allocs)} x {a.gib} GiB "
              f"pinned by {name} (each {', '.join(f'{x[1]:.3f}' for x in allocs)} s)")
        allocs.clear()
    del h2

    # page-cache reads into pinned memory
    fn = int(a.file_gib * GiB)
    d = a.dir or tempfile.gettempdir()
    path = os.path.join(d, "probe_host_memory.bin")
    block = np.random.default_rng(0).integers(0, 255, 64 << 20, dtype=np.uint8)
    t = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(fn // block.nbytes):
            f.write(block.data)
    print(f"wrote {a.file_gib} GiB in {time.perf_counter() - t:.1f} s")
    big, _ = host_alloc(fn)
    view = np.frombuffer((ctypes.c_uint8 * fn).from_address(big.ptr), dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        for threads in (1, 2, 4, 8, 16):
            piece = 16 << 20
            nxt = [0]
            lock = threading.Lock()

            def reader():
                mv = memoryview(view)
                while True:
                    with lock:
                        off = nxt[0]
                        nxt[0] += piece
                    if off >= fn:
                        return
                    os.preadv(fd, [mv[off:off + piece]], off)

            t = time.perf_counter()
            th = [threading.Thread(target=reader) for _ in range(threads)]
            [x.start() for x in th]
            [x.join() for x in th]
            dt = time.perf_counter() - t
            print(f"preadv page cache -> pinned, {threads} threads, 16 MiB pieces: {fn / dt / 1e9:.1f} GB/s")
    finally:
        os.close(fd)
        os.remove(path)


if __name__ == "__main__":
    sys.exit(main())
