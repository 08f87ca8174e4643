"""A pool of page-locked ("pinned") host buffers, reused by size class (at most 12.5% wasted).

Allocating is slow: on the H200 ``cudaHostAlloc`` took 0.6 s per GiB, halving other threads' copies
meanwhile. :func:`registered_pinned_allocator` maps huge pages, faults them in from several threads,
then pins them with ``cudaHostRegister``: 0.09 s per GiB, of which 0.02 s holds the driver. Spares can
be allocated ahead in a thread (:meth:`PinnedPool.keep_spare`). A full pool, or a driver that refuses,
serves pageable memory instead (slower copies, nothing lost); the first fallback warns.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
import time
import warnings
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from flowgpu.backend import import_cupy
from flowgpu.transfer import numa

__all__ = ["HostBuffer", "PinnedPool", "size_class", "cupy_pinned_allocator", "registered_pinned_allocator",
           "shared_executor", "PinnedAllocated", "Noted"]

_MiB = 1 << 20
_COUNTS = ("allocations", "background_allocations", "reuses", "pageable_fallbacks", "alloc_failures",
           "transient_pageable")


# What a pool emits into the events hub it is given (a worker store's: flowgpu.memory.events).
@dataclass(frozen=True, slots=True)
class PinnedAllocated:
    nbytes: int
    thread: str
    background: bool
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Noted:
    name: str
    message: str | None = None


def size_class(nbytes: int) -> int:
    """The buffer size a request of ``nbytes`` is served with: powers of two up to 1 MiB, then eight
    evenly spaced sizes per power of two.

    Examples
    --------
    >>> size_class(1000), size_class(3 * 2**20), size_class(2**30)
    (4096, 3145728, 1073741824)
    """
    n = max(int(nbytes), 1)
    if n <= _MiB:
        return max(4096, 1 << (n - 1).bit_length())
    step = 1 << ((n - 1).bit_length() - 4)
    return -(-n // step) * step


@dataclass(eq=False, repr=False, slots=True, weakref_slot=True)
class HostBuffer:
    """A host buffer of ``size`` bytes at ``ptr``: ``.view`` is a flat ``uint8`` view; ``pinned``
    (page-locked) or pageable (a fallback)."""

    size: int
    view: np.ndarray
    ptr: int
    pinned: bool
    _owner: object  # keeps the allocation alive

    def array(self, shape: tuple, dtype, order: str = "C") -> np.ndarray:
        """A NumPy array of ``shape`` and ``dtype`` laid over the start of this buffer."""
        dtype = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return np.ndarray(shape, dtype=dtype, buffer=self.view[:n], order=order)

    def __repr__(self) -> str:
        return f"<HostBuffer {self.size} bytes {'pinned' if self.pinned else 'pageable'}>"


def _pageable(size: int) -> HostBuffer:
    view = np.empty(size, dtype=np.uint8)
    return HostBuffer(size, view, view.ctypes.data, False, view)


def cupy_pinned_allocator(size: int) -> HostBuffer:
    """Allocate ``size`` bytes of pinned memory through CuPy (``cudaHostAlloc``)."""
    cp = import_cupy()
    mem = cp.cuda.PinnedMemory(size)  # freed when the last reference goes
    raw = (ctypes.c_uint8 * size).from_address(int(mem.ptr))
    view = np.frombuffer(raw, dtype=np.uint8, count=size)
    return HostBuffer(size, view, int(mem.ptr), True, (mem, raw))


_HUGE = 2 * _MiB  # a transparent huge page on x86-64
_PAGE = 4096
_TOUCH_PIECE = 64 * _MiB  # pages faulted in per task of the toucher pool
_executors: dict[str, ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def shared_executor(name: str, max_threads: int) -> ThreadPoolExecutor:
    """The process-wide pool of threads called ``name``: at most ``max_threads`` and the cores."""
    with _executors_lock:
        ex = _executors.get(name)
        if ex is None:
            n = max(1, min(max_threads, os.cpu_count() or 1))
            ex = _executors[name] = ThreadPoolExecutor(max_workers=n, thread_name_prefix=name)
        return ex


def _touch(view: np.ndarray) -> None:
    """Fault every page of ``view`` in, pieces in parallel (NumPy releases the GIL)."""
    n = view.size
    if n <= _TOUCH_PIECE:
        view[::_PAGE] = 0
        return

    def piece(a: int) -> None:
        view[a:min(a + _TOUCH_PIECE, n):_PAGE] = 0

    pool = shared_executor("flowgpu-pin", 8)
    for f in [pool.submit(piece, a) for a in range(0, n, _TOUCH_PIECE)]:
        f.result()


class _Registered:
    """Owns a mapping pinned with ``cudaHostRegister``; unpins it when the last reference goes."""

    __slots__ = ("mapping", "ptr", "runtime")

    def __init__(self, mapping: mmap.mmap, ptr: int, runtime):
        self.mapping = mapping
        self.ptr = ptr
        self.runtime = runtime

    def __del__(self):
        with contextlib.suppress(Exception):  # interpreter shutdown, or the context is gone with the process
            self.runtime.hostUnregister(self.ptr)


def registered_pinned_allocator(size: int) -> HostBuffer:
    """``size`` bytes of pinned memory: an anonymous mapping on huge pages, on the GPU's NUMA node,
    faulted in from several threads, then ``cudaHostRegister``-ed; else :func:`cupy_pinned_allocator`."""
    cp = import_cupy()
    huge = size >= 16 * _MiB and hasattr(mmap, "MADV_HUGEPAGE")
    extra = _HUGE if huge else 0
    try:
        m = mmap.mmap(-1, size + extra, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return cupy_pinned_allocator(size)
    if hasattr(mmap, "MADV_DONTFORK"):
        # as cudaHostAlloc does: a forked child gets no copy-on-write share of pinned pages
        with contextlib.suppress(OSError):
            m.madvise(mmap.MADV_DONTFORK)
    whole = np.frombuffer(m, dtype=np.uint8)
    node = numa.local_node()
    if node is not None:  # on a host of several NUMA nodes: the pages on the node of this worker's GPU
        numa.prefer(int(whole.ctypes.data), len(whole), node)
    start = (-whole.ctypes.data) % _HUGE if huge else 0  # huge pages need 2 MiB alignment
    if huge:
        with contextlib.suppress(OSError):
            m.madvise(mmap.MADV_HUGEPAGE)
    view = whole[start:start + size]
    _touch(view)
    ptr = int(view.ctypes.data)
    try:
        cp.cuda.runtime.hostRegister(ptr, size, 1)  # cudaHostRegisterPortable
    except Exception:  # the mapping goes with the last view of it
        return cupy_pinned_allocator(size)
    return HostBuffer(size, view, ptr, True, _Registered(m, ptr, cp.cuda.runtime))


class PinnedPool:
    """Pinned host buffers, reused by size class, at most ``capacity`` bytes in use and cached (None:
    no limit); ``allocator``: ``size -> HostBuffer``; ``events``: a hub with ``emit(kind, *fields)``."""

    def __init__(self, capacity: int | None = None, allocator: Callable[[int], HostBuffer] | None = None,
                 events: Any = None):
        self.capacity = capacity
        self._allocator = allocator or registered_pinned_allocator
        self.events = events
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._spare: dict[int, int] = {}  # size class -> free buffers to keep ready
        self._growing: set[int] = set()  # size classes being allocated in the background
        # until the grower decides, under the lock, to stop (is_alive() would still say True after)
        self._grower_running = False
        self._free: dict[int, list[HostBuffer]] = defaultdict(list)
        self.allocated = 0  # pinned bytes held, in use or cached
        self.in_use = 0
        self.counts = Counter(dict.fromkeys(_COUNTS, 0))  # what stats() reports besides the bytes

    def _allocate(self, size: int, background: bool) -> HostBuffer:
        start = time.time()
        try:
            return self._allocator(size)
        finally:
            if self.events is not None:
                self.events.emit(PinnedAllocated, size, threading.current_thread().name, background, start,
                                 time.time())

    @property
    def cached(self) -> int:
        """Bytes of free pinned buffers waiting to be reused."""
        return self.allocated - self.in_use

    def take(self, nbytes: int, transient: bool = False) -> HostBuffer:
        """A buffer of at least ``nbytes``: cached, new pinned, or pageable; ``transient`` (a short
        read from disk, bound by the disk anyway) takes pageable memory quietly when full."""
        size = size_class(nbytes)
        with self._lock:
            while not self._free.get(size) and size in self._growing:
                self._cond.wait()  # a spare of this size is on its way: sooner than a new one
            free = self._free.get(size)
            if free:
                buf = free.pop()
                self.in_use += size
                self.counts["reuses"] += 1
                self._wake_grower_locked()
                return buf
            if self.capacity is not None and self.allocated + size > self.capacity:
                self._trim_locked(self.allocated + size - self.capacity)
            fits = self.capacity is None or self.allocated + size <= self.capacity
            if fits:
                self.allocated += size  # reserve before allocating outside the lock
                self.in_use += size
        if not fits:
            if transient:
                with self._lock:
                    self.counts["transient_pageable"] += 1
                return _pageable(size_class(nbytes))
            return self._fallback(nbytes, f"the pinned pool is full ({self.capacity} bytes)")
        try:
            buf = self._allocate(size, background=False)
        except Exception as e:  # the driver refused: cudaErrorMemoryAllocation and friends
            with self._lock:
                self.allocated -= size
                self.in_use -= size
                self.counts["alloc_failures"] += 1
                # do not ask the driver again for more than we hold now
                self.capacity = self.allocated if self.capacity is None else min(self.capacity, self.allocated)
            return self._fallback(nbytes, f"pinned allocation of {size} bytes failed ({e})")
        with self._lock:
            self.counts["allocations"] += 1
        return buf

    def _fallback(self, nbytes: int, why: str) -> HostBuffer:
        with self._lock:
            self.counts["pageable_fallbacks"] += 1
            warn = self.counts["pageable_fallbacks"] == 1
        msg = f"flowgpu: {why}; using pageable host memory instead (slower copies, no data lost)"
        if warn:
            warnings.warn(msg + "; raise flowgpu.spill.pinned-pool-size or lower the device limit",
                          RuntimeWarning, stacklevel=3)
        if self.events is not None:
            self.events.emit(Noted, "pageable_fallbacks", msg)
        return _pageable(size_class(nbytes))

    def give(self, buf: HostBuffer) -> None:
        """Return a buffer from :meth:`take` (pageable ones are simply dropped)."""
        if not buf.pinned:
            return
        with self._lock:
            self.in_use -= buf.size
            self._free[buf.size].append(buf)
            self._cond.notify_all()

    # -- spares allocated ahead, in the background -------------------------------------------
    def keep_spare(self, nbytes: int, count: int) -> None:
        """Keep ``count`` free buffers for ``nbytes`` ready, allocated in a thread within the capacity
        (0 stops it); a :meth:`take` waits for one on its way."""
        size = size_class(nbytes)
        with self._lock:
            if count <= 0:
                self._spare.pop(size, None)
                return
            self._spare[size] = int(count)
            self._wake_grower_locked()

    def _wanted_locked(self) -> int | None:
        for size, count in self._spare.items():
            if len(self._free.get(size, ())) < count and (
                    self.capacity is None or self.allocated + size <= self.capacity):
                return size
        return None

    def _wake_grower_locked(self) -> None:
        if not self._spare or self._grower_running or self._wanted_locked() is None:
            return
        self._grower_running = True
        threading.Thread(target=self._grow, name="flowgpu-pinned-spares", daemon=True).start()

    def _grow(self) -> None:
        while True:
            with self._lock:
                size = self._wanted_locked()
                if size is None:
                    self._grower_running = False
                    self._cond.notify_all()
                    return
                self.allocated += size
                self._growing.add(size)
            buf = None
            try:
                buf = self._allocate(size, background=True)
            except Exception:  # the driver refused: stop growing; take() falls back as usual
                with self._lock:
                    self.counts["alloc_failures"] += 1
                    self._spare.clear()
            with self._lock:
                self._growing.discard(size)
                if buf is None:
                    self.allocated -= size
                    self._grower_running = False
                else:
                    self._free[size].append(buf)
                    self.counts.update(("allocations", "background_allocations"))
                self._cond.notify_all()
            if buf is None:
                return

    def _trim_locked(self, nbytes: int) -> int:
        freed = 0
        for size in sorted(self._free, reverse=True):
            lst = self._free[size]
            while lst and freed < nbytes:
                lst.pop()
                freed += size
                self.allocated -= size
            if freed >= nbytes:
                break
        return freed

    def trim(self, nbytes: int | None = None) -> int:
        """Free ``nbytes`` of cached buffers, or all and every spare (waiting for one on its way); the
        bytes freed."""
        with self._lock:
            if nbytes is None:
                self._spare.clear()
                while self._grower_running:
                    self._cond.wait()
            return self._trim_locked(self.cached if nbytes is None else nbytes)

    def stats(self) -> dict:
        with self._lock:
            return {"capacity": self.capacity, "allocated": self.allocated, "in_use": self.in_use,
                    "cached": self.allocated - self.in_use, **self.counts}
