"""Asynchronous copies between the device and host tiers not yet finished: nobody waits for them where
they start; :meth:`CopiesInFlight.reap` (after each change of the store) accounts for those done.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

from flowgpu.memory.disk import DiskFile, DiskTier
from flowgpu.memory.events import CopyEnqueued, Events, Moved
from flowgpu.memory.tiers import HostEntry
from flowgpu.transfer.pinned import PinnedPool
from flowgpu.transfer.streams import PendingCopy

__all__ = ["CopiesInFlight", "copy_up"]


class CopiesInFlight:
    """Copies in flight, oldest first: spills (``down``, with their bytes) and uploads (``up``)."""

    def __init__(self, events: Events):
        self.events = events
        self.down: deque[tuple[Any, HostEntry]] = deque()
        self.up: deque[tuple[Any, PendingCopy, int]] = deque()
        self.down_bytes = 0

    def spilling(self, key: Any, entry: HostEntry) -> None:
        """``entry``'s buffer is being written by ``entry.pending``."""
        self.down.append((key, entry))
        self.down_bytes += entry.nbytes
        self.events.emit(CopyEnqueued, "device_to_host", key, entry.nbytes, time.time(), entry.pending)

    def uploading(self, key: Any, copy: PendingCopy, nbytes: int) -> None:
        self.up.append((key, copy, nbytes))
        self.events.emit(CopyEnqueued, "host_to_device", key, nbytes, time.time(), copy)

    def reap(self) -> None:
        """Account for the copies that have finished (each queue up to its first unfinished one)."""
        down, up = self.down, self.up
        while down and down[0][1].pending.done():
            key, entry = down.popleft()
            self.down_bytes -= entry.nbytes
            self.events.emit(Moved, "device_to_host", key, entry.nbytes, entry.pending.seconds or 0.0)
            entry.pending = None
        while up and up[0][1].done():
            key, copy, nbytes = up.popleft()
            self.events.emit(Moved, "host_to_device", key, nbytes, copy.seconds or 0.0)

    def bound_spills(self, max_bytes: int | None) -> None:
        """Wait for the oldest spills until at most ``max_bytes`` are in flight (their device
        memory is freed when they finish)."""
        if max_bytes is None:
            return
        while self.down_bytes > max_bytes and self.down:
            self.down[0][1].pending.wait()
            self.reap()

    def wait_all(self) -> None:
        for _, entry in self.down:
            entry.pending.wait()
        for _, copy, _ in self.up:
            copy.wait()
        self.reap()


def copy_up(key: Any, source: HostEntry | DiskFile, transfer: Callable[[], Any], pool: PinnedPool,
            copies: CopiesInFlight, lock: Any) -> tuple[Any, str, PendingCopy | None]:
    """Copy a chunk up from ``source`` (a host entry, or a disk file: NumPy chunks to host, device
    ones through a transient pinned buffer) outside the store's lock (taken to note an upload).
    ``transfer()`` gives the device copier. Returns ``(value, "device" | "host", upload or None)``.
    """
    emit = copies.events.emit
    if isinstance(source, HostEntry):
        t = transfer()
        upload = getattr(t, "to_device_async", None)
        if upload is not None:
            # not waited for: the task's stream is ordered after the copy (MemoryPlugin)
            value, up = upload(source.value, source.meta, source.buf.pinned)
            with lock:
                copies.uploading(key, up, source.nbytes)
            return value, "device", up
        value, seconds = t.to_device(source.value, source.meta, source.buf.pinned)
        emit(Moved, "host_to_device", key, source.nbytes, seconds)
        return value, "device", None
    meta, start = source.meta, time.perf_counter()
    if source.origin == "host":
        value = DiskTier.read(source)
        emit(Moved, "disk_to_host", key, value.nbytes, time.perf_counter() - start)
        return value, "host", None
    buf = pool.take(meta.nbytes, transient=True)
    try:
        host = DiskTier.read(source, out=buf.view)
        read_s = time.perf_counter() - start
        value, seconds = transfer().to_device(host, meta, buf.pinned)
    finally:
        pool.give(buf)
    emit(Moved, "disk_to_host", key, meta.nbytes, read_s)
    emit(Moved, "host_to_device", key, meta.nbytes, seconds)
    return value, "device", None
