"""The in-memory tiers a worker's store stacks: task key -> chunk, with ``put``/``pop``/``keys`` and a
running ``nbytes``. They only hold and count; the store's policy says which key goes where, and
:class:`Placement`, its one index of which tier holds each key, is checked against them in one place.
Copies between the device and host tiers are not waited for where they start: :class:`CopiesInFlight`
accounts for those done (:meth:`~CopiesInFlight.reap`, after each change of the store).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from flowgpu.memory.events import CopyEnqueued, Events, Moved
from flowgpu.transfer.pinned import HostBuffer, PinnedPool
from flowgpu.transfer.streams import ArrayMeta, PendingCopy

__all__ = ["LRUTier", "HostEntry", "HostTier", "Load", "Placement", "CopiesInFlight"]


class LRUTier(OrderedDict):
    """Values, least recently used first; ``nbytes`` sums theirs unless ``counted`` is False."""

    def __init__(self, name: str, counted: bool = True):
        super().__init__()
        self.name = name
        self._sizeof: Callable[[Any], int] = (lambda v: int(v.nbytes)) if counted else (lambda v: 0)
        self.nbytes = 0

    def put(self, key: Any, value: Any) -> None:
        """Hold ``value`` under ``key`` as the most recently used."""
        if key in self:
            raise KeyError(f"{key!r} is already in the {self.name} tier")
        self[key] = value
        self.nbytes += self._sizeof(value)

    def use(self, key: Any) -> Any:
        """The value under ``key``, now the most recently used."""
        self.move_to_end(key)
        return self[key]

    def peek(self, key: Any) -> Any:
        """The value under ``key``, leaving the order alone."""
        return self[key]

    def pop(self, key: Any) -> Any:
        value = super().pop(key)
        self.nbytes -= self._sizeof(value)
        return value

    def oldest(self, exclude: Any = None) -> Any:
        """The least recently used key other than ``exclude`` (``exclude`` when alone; None: empty)."""
        return next((k for k in self if k != exclude), exclude if self else None)

    def counted(self) -> int:
        """``nbytes`` recomputed from the values (for :meth:`FlowgpuStore.check`)."""
        return sum(self._sizeof(v) for v in self.values())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {len(self)} keys, {self.nbytes} B>"


@dataclass(eq=False, slots=True)
class HostEntry:
    """A chunk in host memory: a NumPy chunk (``origin="host"``) or a spilled device chunk in a
    pool buffer (``origin="device"``), with the copies still reading or writing that buffer."""

    value: np.ndarray
    origin: str
    meta: ArrayMeta | None = None
    buf: HostBuffer | None = None
    pending: PendingCopy | None = None  # a device-to-host copy writing into buf
    up: PendingCopy | None = field(default=None, init=False)  # a host-to-device copy reading from buf
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        self.nbytes = int(self.value.nbytes)

    def busy(self) -> bool:
        """True while a copy still reads or writes the buffer."""
        return (self.pending is not None and not self.pending.done()) or (self.up is not None and not self.up.done())


class HostTier(LRUTier):
    """Host-memory chunks (:class:`HostEntry`), least recently used first, plus clean copies.

    A *clean copy* is the host entry of a chunk back on the device and unchanged since: evicting it
    again copies nothing. They count in ``nbytes`` but not in ``len``/``keys`` (their keys are on
    the device). Buffers go back to ``pool`` (:meth:`release`) once no copy uses them.
    """

    def __init__(self, pool: PinnedPool):
        super().__init__("host")
        self.pool = pool
        self._clean: OrderedDict[Any, HostEntry] = OrderedDict()
        self.orphans: list[HostEntry] = []  # released while a copy still used their buffer

    # -- clean copies -------------------------------------------------------------------------
    def keep_clean(self, key: Any, entry: HostEntry) -> None:
        self._clean[key] = entry
        self.nbytes += entry.nbytes

    def pop_clean(self, key: Any) -> HostEntry | None:
        entry = self._clean.pop(key, None)
        if entry is not None:
            self.nbytes -= entry.nbytes
        return entry

    def oldest_clean(self, exclude: Any = None) -> Any:
        """The key of the oldest clean copy other than ``exclude``, or None."""
        return next((k for k in self._clean if k != exclude), None)

    @property
    def clean_count(self) -> int:
        return len(self._clean)

    def clean_keys(self) -> list:
        return list(self._clean)

    def counted(self) -> int:
        return super().counted() + sum(e.nbytes for e in self._clean.values())

    # -- buffers ------------------------------------------------------------------------------
    def release(self, entry: HostEntry) -> None:
        """Give an entry's buffer back to the pool, now or once :meth:`reap` finds its copies done."""
        if entry.buf is None:
            return
        if entry.busy():
            self.orphans.append(entry)
            return
        self.pool.give(entry.buf)
        entry.buf = None

    def reap(self) -> None:
        """Give back the buffers of released entries whose copies have finished."""
        orphans, self.orphans = self.orphans, []
        for entry in orphans:
            self.release(entry)  # still busy: an orphan again


class Load:
    """A key being brought up a tier outside the store's lock (held in the ``"loading"`` tier);
    readers of the key wait for ``done``."""

    __slots__ = ("done", "dropped")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.dropped = False  # deleted (or overwritten) meanwhile: what the load brings is discarded


class Placement(dict):
    """``key -> tier name``, each key in exactly one tier; reads need no lock, changes take the store's.
    A tier that takes or gives up a key by itself (a disk file) is followed with plain item changes."""

    def __init__(self, tiers: dict[str, Any]):  # name -> tier (flowgpu.memory.tiers)
        super().__init__()
        self.tiers = tiers

    def put(self, key: Any, tier: str, value: Any) -> None:
        """``tier`` holds ``value`` under ``key`` from now on (``key`` must be nowhere yet)."""
        if key in self:
            raise KeyError(f"{key!r} is in the {self[key]} tier already")
        self.tiers[tier].put(key, value)
        self[key] = tier

    def take(self, key: Any) -> Any:
        """Take ``key`` out of its tier; returns what that tier held."""
        return self.tiers[self.pop(key)].pop(key)

    def check(self) -> None:
        """Raise AssertionError unless each tier holds exactly the keys placed in it and each
        in-memory tier's bytes add up."""
        for name, tier in self.tiers.items():
            placed = {k for k, t in self.items() if t == name}
            held = set(tier.keys())
            assert held == placed, f"the {name} tier holds {held - placed or 'no'} keys placed elsewhere " \
                                   f"and lacks {placed - held or 'none'} placed in it"
            if isinstance(tier, LRUTier):
                assert tier.nbytes == tier.counted(), f"the {name} tier counts {tier.nbytes} B of {tier.counted()}"


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
