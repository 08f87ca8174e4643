"""What this process read from and wrote to storage on the device path, for the run summary.

The Zarr device reader and writer add to :data:`COUNTERS`; a worker's ``flowgpu.memory.stats``
reports them as moves ``storage_{read,moved,decode,encode,write}`` (``{bytes, count, seconds}``)
and chunks decoded on the CPU instead as events ``storage_fallback: REASON``.
"""

from __future__ import annotations

import threading
from collections import defaultdict

__all__ = ["COUNTERS", "Counters", "FALLBACK", "PREFIX"]

PREFIX = "storage_"
FALLBACK = "storage_fallback: "


class Counters:
    """Thread-safe ``{activity: [bytes, count, seconds]}`` plus fallback counts per reason."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._moves: dict[str, list] = defaultdict(lambda: [0, 0, 0.0])
        self._fallbacks: dict[str, int] = defaultdict(int)

    def add(self, activity: str, nbytes: int, seconds: float = 0.0, count: int = 1) -> None:
        with self._lock:
            m = self._moves[PREFIX + activity]
            m[0] += int(nbytes)
            m[1] += count
            m[2] += float(seconds)

    def fallback(self, reason: str, chunks: int = 1) -> None:
        with self._lock:
            self._fallbacks[FALLBACK + reason] += chunks

    def moves(self) -> dict[str, dict]:
        with self._lock:
            return {a: {"bytes": b, "count": n, "seconds": s} for a, (b, n, s) in self._moves.items()}

    def events(self) -> dict[str, int]:
        with self._lock:
            return dict(self._fallbacks)

    def reset(self) -> None:
        with self._lock:
            self._moves.clear()
            self._fallbacks.clear()


COUNTERS = Counters()
