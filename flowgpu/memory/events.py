"""What a worker's store does, as typed events a profiler (or the store's own accounting) subscribes to.

Every :class:`~flowgpu.memory.store.FlowgpuStore` has an :class:`Events` hub, ``store.events``::

    def record(event):
        if isinstance(event, FetchEnded):
            print(event.key, event.tier, event.end - event.start)

    unsubscribe = store.subscribe(record)                      # every kind of event
    store.subscribe(spills.append, SpillStarted, SpillEnded)   # only these kinds

Callbacks run synchronously in the thread that caused the event (a worker thread, the event loop,
the prefetcher, the pool's background allocator), often while the store holds its lock: keep them
short and never call back into the store. An exception in a callback is logged and ignored: a
profiler never breaks a worker. Times named ``time``, ``start`` and ``end`` are wall-clock seconds
(``time.time()``, as in distributed's task stream); ``seconds`` is a duration. An event is built
only when something subscribes to its kind, so an unobserved store pays a dictionary lookup.

================================  ==============================================================
:class:`FetchStarted`             ``store[key]`` or a prefetch began; ``tier`` is where the key was
:class:`FetchEnded`               ... and returned (or failed); ``start``/``end``
:class:`SpillStarted`             a device chunk starts its way to host memory
:class:`SpillEnded`               ... its copy is enqueued (room made, buffer taken, waits included)
:class:`CopyEnqueued`             an asynchronous copy was queued; ``copy`` is its
                                  :class:`~flowgpu.transfer.streams.PendingCopy` (CUDA events)
:class:`Moved`                    a move between tiers finished: ``activity`` (see
                                  :mod:`flowgpu.memory.accounting`), bytes, seconds
:class:`PinnedAllocated`          the pinned pool allocated a buffer (``background`` for spares)
:class:`CleanCopyDropped`         the host copy of a chunk that is also on the device was freed
:class:`Noted`                    something worth counting: a fallback, a failure (``name``, message)
================================  ==============================================================

:class:`PinnedAllocated` and :class:`Noted` are defined by the pinned pool's module
(:mod:`flowgpu.transfer.pinned`), the layer below, which emits them into the hub it is given.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

from flowgpu.transfer.pinned import Noted, PinnedAllocated  # what the store's pinned pool emits

__all__ = ["Events", "Event", "FetchStarted", "FetchEnded", "SpillStarted", "SpillEnded", "CopyEnqueued", "Moved",
           "PinnedAllocated", "CleanCopyDropped", "Noted", "thread_name"]

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


def thread_name() -> str:
    """The calling thread's name, as events record it."""
    return threading.current_thread().name
