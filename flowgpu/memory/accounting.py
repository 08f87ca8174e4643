"""Bytes moved and time spent between the tiers of a worker's data store.

Every move between tiers is recorded under an *activity* name:

======================  ===========================================================
``device_to_host``      a device chunk evicted into a (pinned) host buffer
``host_to_device``      a spilled chunk brought back to the device
``host_to_disk``        a host chunk written to the worker's spill directory
``disk_to_host``        a chunk read back from disk into host memory
``disk_to_device``      a spilled device chunk read from disk straight back to the device
``prefetch``            any of the moves above done ahead of time by the prefetcher
======================  ===========================================================

The counters are exposed three ways: :meth:`Accounting.snapshot` (what
``client.run(flowgpu.memory.stats)`` returns), ``cumulative_metrics`` in the
``{(activity, unit): value}`` shape that distributed's Prometheus collector exports as
``dask_worker_spill_bytes{activity=...}`` / ``spill_count`` / ``spill_time_seconds``,
and the worker metric installed by :class:`flowgpu.memory.plugin.MemoryPlugin`.

The store feeds it as one more subscriber of its events (:meth:`Accounting.record` takes
:class:`~flowgpu.memory.events.Moved` and :class:`~flowgpu.memory.events.Noted`).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager

from flowgpu.memory.events import Moved, Noted

__all__ = ["Accounting", "ACTIVITIES"]

ACTIVITIES = (
    "device_to_host",
    "host_to_device",
    "host_to_disk",
    "disk_to_host",
    "disk_to_device",
)


class Accounting:
    """Thread-safe counters of bytes, moves and seconds per activity, plus notable events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[str, int] = defaultdict(int)
        self._count: dict[str, int] = defaultdict(int)
        self._seconds: dict[str, float] = defaultdict(float)
        self.events: dict[str, int] = defaultdict(int)  # e.g. disk_failures, pageable_fallbacks
        self.errors: list[str] = []  # first few distinct error messages, for the run summary

    def record(self, event: Moved | Noted) -> None:
        """Count a store event: a finished move, or a noted fallback or failure."""
        if isinstance(event, Moved):
            self.add(event.activity, event.nbytes, event.seconds)
        else:
            self.note(event.name, event.message)

    def add(self, activity: str, nbytes: int, seconds: float) -> None:
        """Record one move of ``nbytes`` that took ``seconds``."""
        with self._lock:
            self._bytes[activity] += int(nbytes)
            self._count[activity] += 1
            self._seconds[activity] += float(seconds)

    @contextmanager
    def timed(self, activity: str, nbytes: int):
        """Context manager recording one move of ``nbytes`` under ``activity``."""
        start = time.perf_counter()
        yield
        self.add(activity, nbytes, time.perf_counter() - start)

    def note(self, event: str, message: str | None = None) -> None:
        """Count an event (a fallback, a failure); keep its message if it is new."""
        with self._lock:
            self.events[event] += 1
            if message and message not in self.errors and len(self.errors) < 20:
                self.errors.append(message)

    def cumulative_metrics(self) -> dict[tuple[str, str], float]:
        """``{(activity, unit): value}`` with units ``bytes``, ``count`` and ``seconds``."""
        with self._lock:
            out: dict[tuple[str, str], float] = {}
            for a in self._count:
                out[(a, "bytes")] = self._bytes[a]
                out[(a, "count")] = self._count[a]
                out[(a, "seconds")] = self._seconds[a]
            return out

    def snapshot(self) -> dict:
        """Plain-dict copy: ``{"moves": {activity: {bytes, count, seconds, gbps}}, "events": ..., "errors": ...}``."""
        with self._lock:
            moves = {}
            for a in sorted(self._count):
                b, s = self._bytes[a], self._seconds[a]
                moves[a] = {
                    "bytes": b,
                    "count": self._count[a],
                    "seconds": s,
                    "gbps": (b / s / 1e9) if s > 0 else None,
                }
            return {"moves": moves, "events": dict(self.events), "errors": list(self.errors)}

    def reset(self) -> None:
        with self._lock:
            self._bytes.clear()
            self._count.clear()
            self._seconds.clear()
            self.events.clear()
            self.errors.clear()
