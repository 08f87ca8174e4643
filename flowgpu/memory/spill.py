"""The host tier's limit: first clean copies are dropped (nothing to write), then the least recently
used host chunks go to disk (or back to a file kept from an earlier read). A full or read-only disk
turns writing off for good, warned once. Called under the store's lock.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from flowgpu.memory.copies import CopiesInFlight
from flowgpu.memory.disk import DiskFull, DiskTier
from flowgpu.memory.events import CleanCopyDropped, Events, Moved, Noted
from flowgpu.memory.placement import Placement
from flowgpu.memory.tiers import HostEntry, HostTier

__all__ = ["HostSpill"]


class HostSpill:
    """Keeps ``host`` under ``limit`` bytes (None: no limit) by moving chunks to ``disk``."""

    def __init__(self, host: HostTier, disk: DiskTier, placed: Placement, copies: CopiesInFlight, events: Events,
                 limit: int | None = None):
        self.host, self.disk, self.placed, self.copies, self.events = host, disk, placed, copies, events
        self.limit = limit

    def fit(self, incoming: int = 0) -> None:
        """Free host memory until its chunks, plus ``incoming`` bytes about to arrive, fit the limit."""
        limit = self.limit
        if limit is None:
            return
        host = self.host
        while host.nbytes + incoming > limit and host.clean_count:
            self.drop_clean_one()
        while host.nbytes + incoming > limit and len(host):
            if self.write_one() < 0:
                if self.disk.disabled_reason is not None:  # cannot spill: fail the task now, never pause for ever
                    raise DiskFull(f"host memory is full and {self.disk.disabled_reason}")
                if not incoming:
                    self.events.emit(Noted, "host_over_limit")
                break

    def evict(self) -> int:
        """Free one chunk's host memory: a clean copy, else the least recently used chunk to disk.
        Returns the bytes freed, or -1."""
        if self.host.clean_count:
            return self.drop_clean_one()
        return self.write_one() if len(self.host) else -1

    def drop_clean_one(self) -> int:
        """Free the host copy of the least recently used chunk that is also on the device."""
        start = time.time()
        key = self.host.oldest_clean()
        entry = self.host.pop_clean(key)
        if entry.up is not None:
            entry.up.wait()  # its upload still reads the buffer: let it finish so the pool gets it back now
        self.host.release(entry)
        self.events.emit(Noted, "clean_copies_dropped")
        self.events.emit(CleanCopyDropped, key, entry.nbytes, start, time.time())
        return entry.nbytes

    def write_one(self) -> int:
        """Move the least recently used host chunk to disk; its bytes, or -1 when it cannot."""
        if self.disk.disabled_reason is not None:
            return -1
        key = self.host.oldest()
        entry = self.host.peek(key)
        if self.disk.reattach(key) is not None:  # its file is still good: no write
            self.events.emit(Noted, "clean_evictions")
            return self._on_disk(key, entry)
        if entry.pending is not None:
            entry.pending.wait()
            self.copies.reap()
            self.host.reap()
        start = time.perf_counter()
        try:
            self.disk.put(key, entry.value, entry.origin, entry.meta)
        except DiskFull as e:
            msg = (f"{e}; free space there or set flowgpu.local-directory (cluster.local_directory) to "
                   "another disk")
            self.disk.disable(msg)
            self.events.emit(Noted, "disk_failures", msg)
            warnings.warn(f"flowgpu: {msg}", RuntimeWarning, stacklevel=3)
            return -1
        self.events.emit(Moved, "host_to_disk", key, entry.nbytes, time.perf_counter() - start)
        return self._on_disk(key, entry)

    def _on_disk(self, key: Any, entry: HostEntry) -> int:
        """``key`` has its file (the disk tier holds it): its host entry goes."""
        self.host.pop(key)
        self.placed[key] = self.disk.name
        self.host.release(entry)
        return entry.nbytes
