"""What a worker's store does, as typed events: ``store.subscribe(callback, *kinds)`` (all kinds by
default) returns a function that unsubscribes.

Callbacks run in the thread that caused the event, often under the store's lock: keep them short and
never call back into the store; an exception in one is logged and ignored. ``time``, ``start`` and
``end`` are ``time.time()`` seconds, ``seconds`` a duration. An event is built only when something
listens to its kind. :class:`PinnedAllocated` and :class:`Noted` come from :mod:`flowgpu.transfer.pinned`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from flowgpu.transfer.pinned import Noted, PinnedAllocated  # what the store's pinned pool emits

__all__ = ["Events", "Event", "FetchStarted", "FetchEnded", "SpillStarted", "SpillEnded", "CopyEnqueued", "Moved",
           "PinnedAllocated", "CleanCopyDropped", "Noted"]

logger = logging.getLogger("flowgpu.memory")


@dataclass(frozen=True, slots=True)
class FetchStarted:
    key: Any
    tier: str  # device, host, disk, other, loading (another thread is bringing it up)
    prefetch: bool
    thread: str
    time: float


@dataclass(frozen=True, slots=True)
class FetchEnded:
    key: Any
    tier: str  # where the key was when the fetch began
    prefetch: bool
    thread: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class SpillStarted:
    key: Any
    nbytes: int
    thread: str
    time: float


@dataclass(frozen=True, slots=True)
class SpillEnded:
    """A spill's copy is enqueued (room made and buffer taken: waits included)."""

    key: Any
    nbytes: int
    thread: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class CopyEnqueued:
    activity: str  # device_to_host or host_to_device
    key: Any
    nbytes: int
    time: float
    copy: Any  # the PendingCopy; its CUDA events say when the copy ran on the device


@dataclass(frozen=True, slots=True)
class Moved:
    activity: str
    key: Any
    nbytes: int
    seconds: float


@dataclass(frozen=True, slots=True)
class CleanCopyDropped:
    """The host copy of a chunk also on the device was freed."""

    key: Any
    nbytes: int
    start: float
    end: float


Event = (FetchStarted | FetchEnded | SpillStarted | SpillEnded | CopyEnqueued | Moved | PinnedAllocated
         | CleanCopyDropped | Noted)
KINDS = Event.__args__


class Events:
    """Subscribers per kind of event; :meth:`emit` builds an event only when someone listens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[type, tuple[Callable, ...]] = {}

    def subscribe(self, callback: Callable[[Event], Any], *kinds: type) -> Callable[[], None]:
        """Call ``callback(event)`` for each event of ``kinds`` (default: all); returns a function
        that unsubscribes it."""
        kinds = kinds or KINDS
        unknown = [k for k in kinds if k not in KINDS]
        if unknown:
            raise TypeError(f"not store events: {unknown}; subscribe to kinds from flowgpu.memory.events")
        with self._lock:
            for k in kinds:
                self._subs[k] = (*self._subs.get(k, ()), callback)
        return lambda: self.unsubscribe(callback)

    def unsubscribe(self, callback: Callable[[Event], Any]) -> None:
        """Stop calling ``callback`` (for every kind it was subscribed to)."""
        with self._lock:
            self._subs = {k: tuple(c for c in cs if c is not callback) for k, cs in self._subs.items()}

    def wants(self, kind: type) -> bool:
        """True when something listens to ``kind`` (to skip measuring what nobody reads)."""
        return bool(self._subs.get(kind))

    def emit(self, kind: type, *fields: Any) -> None:
        """Build ``kind(*fields)`` and hand it to its subscribers, if there are any."""
        subs = self._subs.get(kind)
        if not subs:
            return
        event = kind(*fields)
        for callback in subs:
            try:
                callback(event)
            except Exception:
                logger.exception("flowgpu: a memory event subscriber failed on %r", event)
