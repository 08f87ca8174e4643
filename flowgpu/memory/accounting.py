"""Bytes, moves and seconds per activity (``device_to_host``, ``host_to_device``, ``host_to_disk``,
``disk_to_host``) of a worker's store, which feeds :meth:`Accounting.record` its events.
``cumulative_metrics`` has the shape distributed's Prometheus collector exports
(``dask_worker_spill_bytes{activity=...}``).
"""

from __future__ import annotations

import threading
from collections import defaultdict

from flowgpu.memory.events import Moved, Noted

__all__ = ["Accounting", "rates"]


def rates(moves: dict[str, dict]) -> dict[str, dict]:
    """Each activity's counters with its speed added: ``gbps`` (None when no time was measured)."""
    return {a: {**m, "gbps": m["bytes"] / m["seconds"] / 1e9 if m["seconds"] > 0 else None} for a, m in moves.items()}


class Accounting:
    """Thread-safe counters of bytes, moves and seconds per activity, plus notable events."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._moves: dict[str, dict] = defaultdict(lambda: {"bytes": 0, "count": 0, "seconds": 0.0})
        self.events: dict[str, int] = defaultdict(int)  # e.g. disk_failures, pageable_fallbacks
        self.errors: list[str] = []  # first few distinct error messages, for the run summary

    def record(self, event: Moved | Noted) -> None:
        """Count a store event: a finished move, or a noted fallback or failure (keeping its message if new)."""
        with self._lock:
            if isinstance(event, Moved):
                m = self._moves[event.activity]
                m["bytes"] += int(event.nbytes)
                m["count"] += 1
                m["seconds"] += float(event.seconds)
                return
            self.events[event.name] += 1
            if event.message and event.message not in self.errors and len(self.errors) < 20:
                self.errors.append(event.message)

    def cumulative_metrics(self) -> dict[tuple[str, str], float]:
        """``{(activity, unit): value}`` with units ``bytes``, ``count`` and ``seconds``."""
        with self._lock:
            return {(a, unit): v for a, m in self._moves.items() for unit, v in m.items()}

    def snapshot(self) -> dict:
        """``{"moves": {activity: {bytes, count, seconds, gbps}}, "events": ..., "errors": ...}``."""
        with self._lock:
            return {"moves": rates(dict(sorted(self._moves.items()))), "events": dict(self.events),
                    "errors": list(self.errors)}
