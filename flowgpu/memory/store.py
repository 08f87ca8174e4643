"""``FlowgpuStore``: a Dask worker's ``data`` mapping with tiers device -> pinned host -> disk.

Past its tier's limit the least recently used chunk moves down (device chunks by asynchronous copy
into pinned buffers, host chunks to ``.npy`` files; never pickled); reading a key brings it back up.
Other values (tuples, scalars, object arrays) stay put. Without a GPU it runs host -> disk on NumPy
chunks (how CI tests its logic). Failures lose no data: a full disk keeps chunks in memory, pinned
memory running out falls back to pageable buffers.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import MutableMapping
from typing import Any, Callable, Iterator

from flowgpu.memory.accounting import Accounting
from flowgpu.memory.disk import DiskFile, DiskFull, DiskTier, can_store
from flowgpu.memory.events import (CleanCopyDropped, Events, FetchEnded, FetchStarted, Moved, Noted, SpillEnded,
                                   SpillStarted)
from flowgpu.memory.tiers import CopiesInFlight, HostEntry, HostTier, Load, LRUTier, Placement
from flowgpu.transfer.pinned import PinnedPool
from flowgpu.transfer.streams import CupyTransfer, PendingCopy

__all__ = ["FlowgpuStore"]

DEVICE, HOST, DISK, OTHER, LOADING = "device", "host", "disk", "other", "loading"


class FlowgpuStore(MutableMapping):
    """A worker's task results in tiers; a cluster takes ``data=(FlowgpuStore, {...})``.

    Parameters
    ----------
    worker_local_directory : spill files go to ``<it>/flowgpu-spill`` (distributed passes it).
    device_memory_limit, memory_limit : bytes of device / host chunks kept before the least recently
        used move down; None: no limit; ``memory_limit="auto"``: ``host_fraction`` of the worker's.
    pinned_pool_size : most pinned bytes for spilled device chunks, then pageable (None: ``memory_limit``).
    max_pending_bytes : most bytes of device-to-host copies in flight (None: device limit / 4).
    spare_bytes : pinned buffers kept allocated ahead, in a thread (None: ``max_pending_bytes``).
    transfer, pinned_allocator : the device copier (CuPy's by default) and the pool's allocator.
    """

    def __init__(self, worker_local_directory: str | None = None, *, device_memory_limit: int | None = None,
                 memory_limit: int | str | None = None, host_fraction: float = 0.6, pinned_pool_size: int | None = None,
                 max_pending_bytes: int | None = None, spare_bytes: int | None = None, transfer: Any = None,
                 pinned_allocator: Any = None):
        directory = worker_local_directory or os.path.join(os.getcwd(), "dask-scratch-space")
        self.directory = os.path.join(directory, "flowgpu-spill")
        self.device_memory_limit = int(device_memory_limit) if device_memory_limit else None
        self.adopt_worker_limit = memory_limit == "auto"
        self.host_fraction = host_fraction
        self.memory_limit = int(memory_limit) if memory_limit and not self.adopt_worker_limit else None
        self._pool_follows_limit = pinned_pool_size is None
        if pinned_pool_size is None:
            pinned_pool_size = self.memory_limit
        self.events = Events()
        self.metrics = Accounting()
        self.events.subscribe(self.metrics.record, Moved, Noted)
        self.pool = PinnedPool(int(pinned_pool_size) if pinned_pool_size else None, allocator=pinned_allocator,
                               events=self.events)
        if max_pending_bytes is None and self.device_memory_limit:
            max_pending_bytes = max(self.device_memory_limit // 4, 1)
        self.max_pending_bytes = max_pending_bytes
        self.spare_bytes = int(max_pending_bytes or 0) if spare_bytes is None else int(spare_bytes)
        self._transfer = transfer
        self._lock = threading.RLock()
        self.device = LRUTier(DEVICE)
        self.host = HostTier(self.pool)
        self.disk = DiskTier(self.directory)
        self._other = LRUTier(OTHER, counted=False)
        self._loading = LRUTier(LOADING, counted=False)  # Load objects of keys on their way up
        self._placed = Placement({DEVICE: self.device, HOST: self.host, DISK: self.disk, OTHER: self._other,
                                  LOADING: self._loading})
        self.copies = CopiesInFlight(self.events)
        self.prefetched = 0

    def set_memory_limit(self, nbytes: int | None) -> None:
        """Change the host tier's limit (and the pinned pool's, when it follows it)."""
        with self._lock:
            self.memory_limit = int(nbytes) if nbytes else None
            if self._pool_follows_limit:
                self.pool.capacity = self.memory_limit
            self._fit_host()

    def subscribe(self, callback: Callable[[Any], Any], *kinds: type) -> Callable[[], None]:
        """Call ``callback(event)`` for the store's events (see :mod:`flowgpu.memory.events`);
        returns a function that unsubscribes it."""
        return self.events.subscribe(callback, *kinds)

    # -- the device copier ------------------------------------------------------------------
    @property
    def transfer(self):
        """The device copier (CuPy's, made on first use, unless one was given)."""
        if self._transfer is None:
            self._transfer = CupyTransfer()
        return self._transfer

    def _is_device(self, value: Any) -> bool:
        return (self._transfer or CupyTransfer).is_device(value)  # CuPy's test is static: no copier made for it

    # -- where each key lives --------------------------------------------------------------
    def _drop(self, key: Any) -> None:
        """Forget ``key`` wherever it lives and free what it holds."""
        tier = self._placed.get(key)
        value = self._placed.take(key)
        self.disk.forget(key)  # a file kept from an earlier read no longer holds its value
        if tier == LOADING:
            value.dropped = True  # the loader discards what it brings
        elif tier == HOST:
            self.host.release(value)
        elif tier == DEVICE:
            clean = self.host.pop_clean(key)
            if clean is not None:
                self.host.release(clean)

    def tier_of(self, key: Any) -> str | None:
        """``"device"``, ``"host"``, ``"disk"``, ``"other"``, ``"loading"``, or None (absent)."""
        return self._placed.get(key)

    def check(self) -> None:
        """Raise AssertionError unless the index, the tiers' bytes, clean copies, kept files and copies
        in flight agree (for tests: a pass over all keys)."""
        with self._lock:
            self._placed.check()
            assert set(self.host.clean_keys()) <= set(self.device), "a clean copy of a chunk not on the device"
            in_memory = set(self.device) | set(self.host) | set(self._loading)
            assert set(self.disk.kept_keys()) <= in_memory, "a kept file of a chunk not in memory"
            assert self.copies.down_bytes == sum(e.nbytes for _, e in self.copies.down)

    # -- MutableMapping ---------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        with self._lock:
            if key in self._placed:
                self._drop(key)
            if self._is_device(value):
                self._placed.put(key, DEVICE, value)
                self._fit_device(keep=key)
            elif can_store(value):
                self._placed.put(key, HOST, HostEntry(value, "host"))
                self._fit_host()
            else:
                self._placed.put(key, OTHER, value)
            self._reap()

    def __getitem__(self, key: Any) -> Any:
        return self._fetch(key, prefetch=False)

    def __delitem__(self, key: Any) -> None:
        with self._lock:
            if key not in self._placed:
                raise KeyError(key)
            self._drop(key)
            self._reap()

    def __contains__(self, key: object) -> bool:
        return key in self._placed

    def __len__(self) -> int:
        return len(self._placed)

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            return iter(list(self._placed))

    # -- moving down ------------------------------------------------------------------------
    def _fit_device(self, keep: Any = None) -> None:
        """Move device chunks to host until under the limit, first those with a clean host copy,
        ``keep`` (just stored or brought up) only when nothing else is left."""
        limit = self.device_memory_limit
        if limit is None:
            return
        while self.device.nbytes > limit and len(self.device):
            key = self.host.oldest_clean(exclude=keep)
            if key is not None:
                self.events.emit(Noted, "clean_device_evictions")
            else:
                key = self.device.oldest(exclude=keep)
            value = self._placed.take(key)
            clean = self.host.pop_clean(key)
            if clean is not None:
                self._placed.put(key, HOST, clean)
            else:
                self._device_to_host(key, value)
        self._fit_host()

    def _device_to_host(self, key: Any, value: Any) -> None:
        t = self.transfer
        meta = t.meta(value)
        thread, start = threading.current_thread().name, time.time()
        self.events.emit(SpillStarted, key, meta.nbytes, thread, start)
        self._fit_host(incoming=meta.nbytes)  # make room first, so the pool has a buffer to reuse
        buf = self.pool.take(meta.nbytes)
        if buf.pinned and self.spare_bytes:
            # the next spills find their buffers allocated already (in the background)
            self.pool.keep_spare(meta.nbytes, max(1, -(-self.spare_bytes // buf.size)))
        entry = HostEntry(meta.host_array(buf), "device", meta, buf, t.to_host_async(value, buf, meta))
        self._placed.put(key, HOST, entry)
        self.copies.spilling(key, entry)
        self.copies.bound_spills(self.max_pending_bytes)
        self.events.emit(SpillEnded, key, meta.nbytes, thread, start, time.time())

    def _fit_host(self, incoming: int = 0) -> None:
        """Free host memory until its chunks, plus ``incoming`` bytes about to arrive, fit the limit: first
        clean copies (nothing to write), then the least recently used host chunks to disk (or back to a
        file kept from an earlier read). A full or read-only disk turns writing off for good, warned once."""
        limit, host = self.memory_limit, self.host
        if limit is None:
            return
        while host.nbytes + incoming > limit and host.clean_count:
            self._drop_clean_one()
        while host.nbytes + incoming > limit and len(host):
            if self._write_one() < 0:
                if self.disk.disabled_reason is not None:  # cannot spill: fail the task now, never pause for ever
                    raise DiskFull(f"host memory is full and {self.disk.disabled_reason}")
                if not incoming:
                    self.events.emit(Noted, "host_over_limit")
                break

    def _drop_clean_one(self) -> int:
        """Free the host copy of the least recently used chunk that is also on the device; its bytes."""
        start = time.time()
        key = self.host.oldest_clean()
        entry = self.host.pop_clean(key)
        if entry.up is not None:
            entry.up.wait()  # its upload still reads the buffer: let it finish so the pool gets it back now
        self.host.release(entry)
        self.events.emit(Noted, "clean_copies_dropped")
        self.events.emit(CleanCopyDropped, key, entry.nbytes, start, time.time())
        return entry.nbytes

    def _write_one(self) -> int:
        """Move the least recently used host chunk to disk; its bytes, or -1 when it cannot."""
        if self.disk.disabled_reason is not None:
            return -1
        key = self.host.oldest()
        entry = self.host.peek(key)
        if self.disk.reattach(key) is not None:  # its file is still good: no write
            self.events.emit(Noted, "clean_evictions")
        else:
            if entry.pending is not None:
                entry.pending.wait()
                self._reap()
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
        self.host.pop(key)  # the disk tier holds it now
        self._placed[key] = DISK
        self.host.release(entry)
        return entry.nbytes

    def _reap(self) -> None:
        """Account for copies that have finished; release the buffers they held."""
        self.copies.reap()
        self.host.reap()

    # -- moving up --------------------------------------------------------------------------
    def _fetch(self, key: Any, prefetch: bool) -> Any:
        ev = self.events
        if not (ev.wants(FetchStarted) or ev.wants(FetchEnded)):
            return self._get(key, prefetch)
        tier, start = self._placed.get(key) or "absent", time.time()
        thread = threading.current_thread().name
        ev.emit(FetchStarted, key, tier, prefetch, thread, start)
        try:
            return self._get(key, prefetch)
        finally:
            ev.emit(FetchEnded, key, tier, prefetch, thread, start, time.time())

    def _get(self, key: Any, prefetch: bool) -> Any:
        while True:
            with self._lock:
                tier = self._placed.get(key)
                if tier is None:
                    raise KeyError(key)
                if tier == DEVICE:
                    return self.device.use(key)
                if tier == OTHER:
                    return self._other.peek(key)
                if tier == LOADING:
                    waiter = self._loading.peek(key).done
                else:
                    if tier == HOST:
                        entry = self.host.peek(key)
                        if entry.origin == "host":
                            return self.host.use(key).value
                        if entry.pending is not None and not entry.pending.done():
                            return self._reclaim(key, entry)
                        source: HostEntry | DiskFile = self._placed.take(key)
                    else:
                        source = self.disk.detach(key)  # the file stays: the load reads it
                        del self._placed[key]
                    load = Load()
                    self._placed.put(key, LOADING, load)
                    break
            waiter.wait()
            if prefetch:
                return None
        try:
            value, into, up = self._copy_up(key, source)
        except BaseException:
            with self._lock:
                if load.dropped:
                    self._discard(source)
                else:
                    self._placed.take(key)
                    if isinstance(source, DiskFile):
                        self.disk.attach(key, source)
                        self._placed[key] = DISK
                    else:
                        self._placed.put(key, HOST, source)
                load.done.set()
            raise
        with self._lock:
            self._arrived(key, load, source, value, into, up)
            if prefetch:
                self.prefetched += 1
            self._reap()
            load.done.set()
        return value

    def _copy_up(self, key: Any, source: HostEntry | DiskFile) -> tuple[Any, str, PendingCopy | None]:
        """Copy a chunk up from ``source`` (a host entry, or a disk file: NumPy chunks to host, device
        ones through a transient pinned buffer) outside the lock (taken to note an upload).
        Returns ``(value, "device" | "host", upload or None)``."""
        emit = self.events.emit
        if isinstance(source, HostEntry):
            upload = getattr(self.transfer, "to_device_async", None)
            if upload is not None:
                # not waited for: the task's stream is ordered after the copy (MemoryPlugin)
                value, up = upload(source.value, source.meta, source.buf.pinned)
                with self._lock:
                    self.copies.uploading(key, up, source.nbytes)
                return value, "device", up
            value, seconds = self.transfer.to_device(source.value, source.meta, source.buf.pinned)
            emit(Moved, "host_to_device", key, source.nbytes, seconds)
            return value, "device", None
        meta, start = source.meta, time.perf_counter()
        if source.origin == "host":
            value = DiskTier.read(source)
            emit(Moved, "disk_to_host", key, value.nbytes, time.perf_counter() - start)
            return value, "host", None
        buf = self.pool.take(meta.nbytes, transient=True)
        try:
            host = DiskTier.read(source, out=buf.view)
            read_s = time.perf_counter() - start
            value, seconds = self.transfer.to_device(host, meta, buf.pinned)
        finally:
            self.pool.give(buf)
        emit(Moved, "disk_to_host", key, meta.nbytes, read_s)
        emit(Moved, "host_to_device", key, meta.nbytes, seconds)
        return value, "device", None

    def _discard(self, source: HostEntry | DiskFile) -> None:
        if isinstance(source, DiskFile):
            source.discard()
        else:
            self.host.release(source)

    def _arrived(self, key: Any, load: Load, source: HostEntry | DiskFile, value: Any, into: str,
                 up: PendingCopy | None) -> None:
        """A load has brought ``key`` up to ``into``: place it, keep what stays valid of its source."""
        if isinstance(source, HostEntry) and up is not None:
            if source.up is not None and source.up is not up and not source.up.done():
                source.up.wait()  # an earlier upload of the same buffer, perhaps on another stream
            source.up = up  # the buffer is read until the upload is done
        if load.dropped:
            self._discard(source)
            return
        self._placed.take(key)
        if isinstance(source, DiskFile):
            self.disk.keep(key, source)  # unchanged chunks are evicted again without a write
        elif into != DEVICE:
            self.host.release(source)
        if into == DEVICE:
            self._placed.put(key, DEVICE, value)
            if isinstance(source, HostEntry):  # its pinned copy stays valid: evicting it again copies nothing
                self.host.keep_clean(key, source)
            self._fit_device(keep=key)
        else:
            self._placed.put(key, HOST, HostEntry(value, "host"))
            self._fit_host()

    def _reclaim(self, key: Any, entry: HostEntry) -> Any:
        """Read back a chunk whose copy to host is still in flight: its device copy is still here."""
        value = entry.pending.device_value
        self._placed.take(key)
        self.host.keep_clean(key, entry)  # once its copy finishes the host copy is valid: keep it
        self._placed.put(key, DEVICE, value)
        self.events.emit(Noted, "reclaimed_in_flight")
        self._fit_device(keep=key)
        return value

    def prefetch(self, key: Any) -> bool:
        """Bring ``key`` up to its fast tier ahead of use if there is room; True if it moved."""
        with self._lock:
            tier = self._placed.get(key)
            if tier == HOST:
                entry = self.host.peek(key)
                origin, nbytes = entry.origin, entry.nbytes
                if origin == "host":
                    return False
            elif tier == DISK:
                rec = self.disk.info(key)
                origin, nbytes = rec.origin, rec.meta.nbytes
            else:  # absent, in memory already, or on its way
                return False
            if origin == "device":
                # no room taken from anything, clean copies included: a chunk dropped now may be
                # the input of a task that is about to run, and would travel twice
                limit, used = self.device_memory_limit, self.device.nbytes
            else:
                limit, used = self.memory_limit, self.host.nbytes
            if limit is not None and used + nbytes > limit:
                return False  # no room: prefetching would evict what is about to be used
        try:
            self._fetch(key, prefetch=True)
        except KeyError:
            return False
        return True

    # -- distributed's ManualEvictProto: its memory monitor spills host chunks through this --
    @property
    def fast(self) -> HostTier:
        """Host-memory chunks (what distributed's memory monitor can evict)."""
        return self.host

    def evict(self) -> int:
        """Free host memory for distributed's memory monitor: first a host copy of a chunk that is
        also on the device (nothing to write), else the least recently used host chunk to disk.
        Returns the bytes freed, or -1."""
        with self._lock:
            if self.host.clean_count:
                return self._drop_clean_one()
            return self._write_one() if len(self.host) else -1

    @property
    def spilled_total(self) -> tuple[int, int]:
        """``(bytes of chunks on disk, bytes of their files)``, as distributed reports spilling."""
        with self._lock:
            return self.disk.data_bytes, self.disk.nbytes

    cumulative_metrics = property(lambda self: self.metrics.cumulative_metrics(),
                                  doc="Moves per tier in the shape distributed's Prometheus collector exports.")

    def set_address(self, addr: str) -> None:  # dask-cuda's LoggedWorker calls this
        self.address = addr

    # -- reporting --------------------------------------------------------------------------
    def stats(self) -> dict:
        """Keys and bytes per tier, moves per activity, pinned pool, failures."""
        with self._lock:
            self._reap()
            disk_n, disk_file = self.spilled_total
            out = {
                "store": "flowgpu",
                "tiers": {
                    "device": {"keys": len(self.device), "bytes": self.device.nbytes,
                               "limit": self.device_memory_limit, "pending_bytes": self.copies.down_bytes},
                    "host": {"keys": len(self.host), "bytes": self.host.nbytes, "limit": self.memory_limit,
                             "clean_copies": self.host.clean_count},
                    "disk": {"keys": len(self.disk), "bytes": disk_n, "file_bytes": disk_file,
                             "directory": self.directory, "disabled": self.disk.disabled_reason},
                    "other": {"keys": len(self._other)},
                },
                "pinned_pool": self.pool.stats(),
                "prefetched": self.prefetched,
            }
        out.update(self.metrics.snapshot())
        return out

    def close(self) -> None:
        """Wait for copies in flight, drop everything and free the pinned pool."""
        with self._lock:
            self.copies.wait_all()
            self._reap()
            for key in [k for k, t in self._placed.items() if t != LOADING]:
                self._drop(key)
            self.pool.trim()

    def __repr__(self) -> str:
        return (f"<FlowgpuStore device={len(self.device)} keys/{self.device.nbytes} B "
                f"host={len(self.host)}/{self.host.nbytes} B disk={len(self.disk)}>")
