"""Asynchronous copies between the device and host tiers not yet finished: nobody waits for them where
they start; :meth:`CopiesInFlight.reap` (after each change of the store) accounts for those done.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from flowgpu.memory.events import CopyEnqueued, Events, Moved
from flowgpu.memory.tiers import HostEntry
from flowgpu.transfer.streams import PendingCopy

__all__ = ["CopiesInFlight"]


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
