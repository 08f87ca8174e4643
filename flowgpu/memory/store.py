"""``FlowgpuStore``: a Dask worker's ``data`` mapping with tiers device -> pinned host -> disk.

A worker keeps every task result in its ``data`` mapping; this one keeps them where they
fit:

* **device** (CuPy chunks): least recently used first out once their bytes pass
  ``device_memory_limit``, copied asynchronously into pinned host buffers from a
  :class:`~flowgpu.memory.pinned.PinnedPool`, never pickled;
* **host** (spilled device chunks and NumPy chunks): least recently used first out once
  their bytes pass ``memory_limit``, written to disk as raw bytes behind a ``.npy`` header;
* **disk**: files in ``<worker local directory>/flowgpu-spill``.

Reading a key brings it back: a spilled device chunk returns to the device (host-to-device
copy from its pinned buffer), a NumPy chunk returns to host memory. Other values (tuples,
scalars, object arrays) stay where they are.

Without a GPU the same store runs with tiers host -> disk on NumPy chunks, which is how
its logic is tested in CI. Failures never lose data: a full or read-only spill directory
keeps chunks in memory and is reported in :meth:`FlowgpuStore.stats`; pinned memory
running out falls back to pageable buffers.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import MutableMapping
from typing import Any, Iterator

import numpy as np

from flowgpu.backend import is_cupy
from flowgpu.memory.accounting import Accounting
from flowgpu.memory.disk import DiskFull, DiskTier, can_store
from flowgpu.memory.pinned import HostBuffer, PinnedPool
from flowgpu.memory.transfer import ArrayMeta, PendingCopy

__all__ = ["FlowgpuStore"]


def _meta_of(value: np.ndarray) -> ArrayMeta:
    order = "F" if (value.flags.f_contiguous and not value.flags.c_contiguous) else "C"
    return ArrayMeta(tuple(value.shape), value.dtype, order)


class _HostEntry:
    """A chunk in host memory: a NumPy chunk (``origin="host"``) or a spilled device chunk."""

    __slots__ = ("value", "buf", "meta", "origin", "pending", "up", "nbytes")

    def __init__(self, value: np.ndarray, origin: str, meta: ArrayMeta | None = None,
                 buf: HostBuffer | None = None, pending: PendingCopy | None = None):
        self.value = value
        self.origin = origin
        self.meta = meta
        self.buf = buf
        self.pending = pending  # a device-to-host copy writing into buf
        self.up = None  # a host-to-device copy reading from buf
        self.nbytes = int(value.nbytes)

    def busy(self) -> bool:
        """True while a copy still reads or writes the buffer."""
        return (self.pending is not None and not self.pending.done()) or (self.up is not None and not self.up.done())


class FlowgpuStore(MutableMapping):
    """A worker's task results in tiers device -> pinned host -> disk.

    Pass it to a cluster as ``data=(FlowgpuStore, {...})``; distributed fills in
    ``worker_local_directory``.

    Parameters
    ----------
    worker_local_directory : the worker's scratch directory; spill files go to
        ``<it>/flowgpu-spill``.
    device_memory_limit : bytes of device chunks kept before the least recently used are
        moved to host; None for no limit (device chunks never spill).
    memory_limit : bytes of host chunks kept before the least recently used are written to
        disk; None for no limit (nothing goes to disk); ``"auto"`` for ``host_fraction`` of
        the worker's memory limit, set by :class:`~flowgpu.memory.plugin.MemoryPlugin`.
    host_fraction : see ``memory_limit="auto"``.
    pinned_pool_size : most bytes of pinned host memory for spilled device chunks; more
        spills fall back to pageable memory. None: as much as ``memory_limit``.
    max_pending_bytes : most bytes of device-to-host copies in flight (their device memory
        is freed when they finish); None: a quarter of ``device_memory_limit``.
    spare_bytes : bytes of pinned buffers kept allocated ahead (in a background thread) once
        chunks start to spill, so that a spill seldom waits for an allocation; None: as many as
        ``max_pending_bytes``; 0: none.
    transfer : device copier (default: CuPy, created on the first device chunk).
    pinned_allocator : allocator for the pool (tests pass a fake one).
    """

    def __init__(
        self,
        worker_local_directory: str | None = None,
        *,
        device_memory_limit: int | None = None,
        memory_limit: int | str | None = None,
        host_fraction: float = 0.6,
        pinned_pool_size: int | None = None,
        max_pending_bytes: int | None = None,
        spare_bytes: int | None = None,
        transfer: Any = None,
        pinned_allocator: Any = None,
    ):
        directory = worker_local_directory or os.path.join(os.getcwd(), "dask-scratch-space")
        self.directory = os.path.join(directory, "flowgpu-spill")
        self.device_memory_limit = int(device_memory_limit) if device_memory_limit else None
        self.adopt_worker_limit = memory_limit == "auto"
        self.host_fraction = host_fraction
        self.memory_limit = int(memory_limit) if memory_limit and not self.adopt_worker_limit else None
        self._pool_follows_limit = pinned_pool_size is None
        if pinned_pool_size is None:
            pinned_pool_size = self.memory_limit
        self.pool = PinnedPool(int(pinned_pool_size) if pinned_pool_size else None, allocator=pinned_allocator)
        if max_pending_bytes is None and self.device_memory_limit:
            max_pending_bytes = max(self.device_memory_limit // 4, 1)
        self.max_pending_bytes = max_pending_bytes
        self.spare_bytes = int(max_pending_bytes or 0) if spare_bytes is None else int(spare_bytes)
        self._transfer = transfer
        self.metrics = Accounting()
        self.pool.on_fallback = lambda msg: self.metrics.note("pageable_fallbacks", msg)
        self._lock = threading.RLock()
        self._device: OrderedDict[Any, Any] = OrderedDict()
        self._host: OrderedDict[Any, _HostEntry] = OrderedDict()
        self._disk = DiskTier(self.directory)
        self._disk_info: dict[Any, tuple[str, ArrayMeta]] = {}  # key -> (origin, layout)
        self._other: dict[Any, Any] = {}
        self._loading: dict[Any, threading.Event] = {}
        self._dropped_while_loading: set = set()
        # chunks read back from disk whose file still holds their value: evicting them again
        # takes no write (key -> (file record, origin, layout))
        self._kept: dict[Any, tuple] = {}
        self._pending: list[_HostEntry] = []  # device-to-host copies in flight, oldest first
        # host copies of chunks that are back on the device and unchanged since (chunks are
        # immutable): evicting such a chunk again drops its device copy and copies nothing
        self._clean: OrderedDict[Any, _HostEntry] = OrderedDict()
        self._uploads: list[tuple[PendingCopy, int]] = []  # host-to-device copies in flight
        self._orphans: list[_HostEntry] = []  # deleted while their copy was in flight
        self.device_bytes = 0
        self.host_bytes = 0
        self.pending_bytes = 0
        self.prefetched = 0
        self.prefetch_hits = 0

    def set_memory_limit(self, nbytes: int | None) -> None:
        """Change the host tier's limit (and the pinned pool's, when it follows it)."""
        with self._lock:
            self.memory_limit = int(nbytes) if nbytes else None
            if self._pool_follows_limit:
                self.pool.capacity = self.memory_limit
            self._fit_host()

    # -- the device copier ------------------------------------------------------------------
    @property
    def transfer(self):
        if self._transfer is None:
            from flowgpu.memory.transfer import CupyTransfer

            self._transfer = CupyTransfer()
        return self._transfer

    def _is_device(self, value: Any) -> bool:
        if self._transfer is not None:
            return self._transfer.is_device(value)
        return is_cupy(value) and hasattr(value, "nbytes") and hasattr(value, "data")

    # -- MutableMapping ---------------------------------------------------------------------
    def __setitem__(self, key: Any, value: Any) -> None:
        with self._lock:
            if self._has(key):
                self._drop(key)
            if self._is_device(value):
                self._device[key] = value
                self.device_bytes += int(value.nbytes)
                self._fit_device(keep=key)
            elif can_store(value):
                self._host[key] = _HostEntry(value, "host")
                self.host_bytes += int(value.nbytes)
                self._fit_host()
            else:
                self._other[key] = value
            self._reap()

    def __getitem__(self, key: Any) -> Any:
        return self._fetch(key, prefetch=False)

    def __delitem__(self, key: Any) -> None:
        with self._lock:
            if not self._has(key):
                raise KeyError(key)
            self._drop(key)
            self._reap()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return self._has(key)

    def __len__(self) -> int:
        with self._lock:
            return (len(self._device) + len(self._host) + len(self._disk) + len(self._other)
                    + len(self._loading) - len(self._dropped_while_loading))

    def __iter__(self) -> Iterator[Any]:
        with self._lock:
            keys = [*self._device, *self._host, *self._disk.keys(), *self._other,
                    *(k for k in self._loading if k not in self._dropped_while_loading)]
        return iter(keys)

    def _has(self, key: Any) -> bool:
        if key in self._device or key in self._host or key in self._disk or key in self._other:
            return True
        return key in self._loading and key not in self._dropped_while_loading

    def _drop(self, key: Any) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            self._disk.discard(kept[0])
        if key in self._device:
            self.device_bytes -= int(self._device.pop(key).nbytes)
            clean = self._clean.pop(key, None)
            if clean is not None:
                self.host_bytes -= clean.nbytes
                self._release(clean)
        elif key in self._host:
            entry = self._host.pop(key)
            self.host_bytes -= entry.nbytes
            self._release(entry)
        elif key in self._disk:
            self._disk.remove(key)
            del self._disk_info[key]
        elif key in self._other:
            del self._other[key]
        else:
            self._dropped_while_loading.add(key)

    def _release(self, entry: _HostEntry) -> None:
        """Give a host entry's pinned buffer back, once no copy is writing into it."""
        if entry.buf is None:
            return
        if entry.busy():
            self._orphans.append(entry)
            return
        self.pool.give(entry.buf)
        entry.buf = None

    # -- moving down ------------------------------------------------------------------------
    def _fit_device(self, keep: Any = None) -> None:
        """Move device chunks to host until under the limit: first those with a clean host copy
        (no copy needed), least recently used first, never ``keep`` (the chunk just stored or
        brought up) unless nothing else is left."""
        limit = self.device_memory_limit
        if limit is None:
            return
        while self.device_bytes > limit and self._device:
            key = next((k for k in self._clean if k != keep), None)
            if key is not None:
                value = self._device.pop(key)
                self._host[key] = self._clean.pop(key)  # already counted in host_bytes
                self.metrics.note("clean_device_evictions")
            else:
                key = next((k for k in self._device if k != keep), keep)
                value = self._device.pop(key)
                clean = self._clean.pop(key, None)
                if clean is not None:
                    self._host[key] = clean
                else:
                    self._device_to_host(key, value)
            self.device_bytes -= int(value.nbytes)
        self._fit_host()

    def _device_to_host(self, key: Any, value: Any) -> None:
        t = self.transfer
        meta = t.meta(value)
        if self.memory_limit is not None:  # make room first, so the pool has a buffer to reuse
            while self._clean and self.host_bytes + meta.nbytes > self.memory_limit:
                self._drop_clean_one()
            while self._host and self.host_bytes + meta.nbytes > self.memory_limit:
                if self._evict_host_one() < 0:
                    break
        buf = self.pool.take(meta.nbytes)
        if buf.pinned and self.spare_bytes:
            # the next spills find their buffers allocated already (in the background)
            self.pool.keep_spare(meta.nbytes, max(1, -(-self.spare_bytes // buf.size)))
        pending = t.to_host_async(value, buf, meta)
        entry = _HostEntry(meta.host_array(buf), "device", meta, buf, pending)
        self._host[key] = entry
        self.host_bytes += entry.nbytes
        self._pending.append(entry)
        self.pending_bytes += entry.nbytes
        if self.max_pending_bytes is not None:
            while self.pending_bytes > self.max_pending_bytes and self._pending:
                self._pending[0].pending.wait()
                self._reap()

    def _drop_clean_one(self) -> None:
        """Free the host copy of the least recently used chunk that is also on the device."""
        key, entry = self._clean.popitem(last=False)
        self.host_bytes -= entry.nbytes
        if entry.up is not None:
            entry.up.wait()  # its upload still reads the buffer: let it finish so the pool gets it back now
        self._release(entry)
        self.metrics.note("clean_copies_dropped")

    def _reap(self) -> None:
        """Account for copies that have finished; release device memory and buffers they held."""
        while self._pending and self._pending[0].pending.done():
            entry = self._pending.pop(0)
            self.pending_bytes -= entry.nbytes
            self.metrics.add("device_to_host", entry.nbytes, entry.pending.seconds or 0.0)
            entry.pending = None
        while self._uploads and self._uploads[0][0].done():
            up, nbytes = self._uploads.pop(0)
            self.metrics.add("host_to_device", nbytes, up.seconds or 0.0)
        if self._orphans:
            keep = []
            for entry in self._orphans:
                if entry.busy():
                    keep.append(entry)
                else:
                    self.pool.give(entry.buf)
                    entry.buf = None
            self._orphans = keep

    def _fit_host(self) -> None:
        limit = self.memory_limit
        if limit is None:
            return
        while self.host_bytes > limit and self._clean:
            self._drop_clean_one()
        while self.host_bytes > limit and self._host:
            if self._evict_host_one() < 0:
                self.metrics.note("host_over_limit")
                break

    def _evict_host_one(self) -> int:
        """Write the least recently used host chunk to disk; its bytes, or -1 when it cannot."""
        if self._disk.disabled_reason is not None:
            return -1
        key, entry = next(iter(self._host.items()))
        kept = self._kept.pop(key, None)
        if kept is not None:  # its file is still good: no write
            rec, origin, meta = kept
            self._disk.attach(key, rec)
            del self._host[key]
            self.host_bytes -= entry.nbytes
            self._disk_info[key] = (origin, meta)
            self._release(entry)
            self.metrics.note("clean_evictions")
            return entry.nbytes
        if entry.pending is not None:
            entry.pending.wait()
            self._reap()
        start = time.perf_counter()
        try:
            self._disk.write(key, entry.value)
        except DiskFull as e:
            msg = (f"{e}; keeping spilled chunks in memory from now on "
                   "(free space there or set flowgpu.local-directory to another disk)")
            self._disk.disable(msg)
            self.metrics.note("disk_failures", msg)
            warnings.warn(f"flowgpu: {msg}", RuntimeWarning, stacklevel=2)
            return -1
        self.metrics.add("host_to_disk", entry.nbytes, time.perf_counter() - start)
        del self._host[key]
        self.host_bytes -= entry.nbytes
        self._disk_info[key] = (entry.origin, entry.meta or _meta_of(entry.value))
        self._release(entry)
        return entry.nbytes

    # -- moving up --------------------------------------------------------------------------
    def _fetch(self, key: Any, prefetch: bool) -> Any:
        while True:
            with self._lock:
                waiter = self._loading.get(key)
                if waiter is None:
                    if key in self._device:
                        self._device.move_to_end(key)
                        return self._device[key]
                    if key in self._other:
                        return self._other[key]
                    if key in self._host:
                        entry = self._host[key]
                        if entry.origin == "host":
                            self._host.move_to_end(key)
                            return entry.value
                        if entry.pending is not None and not entry.pending.done():
                            return self._reclaim(key, entry)
                        source = "host"
                        self._host.pop(key)
                        self.host_bytes -= entry.nbytes
                    elif key in self._disk:
                        source, entry = "disk", None
                    else:
                        raise KeyError(key)
                    done = self._loading[key] = threading.Event()
                    break
            waiter.wait()
            if prefetch:
                return None
        try:
            value, into, up = self._bring_up(key, source, entry, prefetch)
        except BaseException:
            with self._lock:
                if source == "host":
                    self._host[key] = entry
                    self.host_bytes += entry.nbytes
                del self._loading[key]
                self._dropped_while_loading.discard(key)
                done.set()
            raise
        with self._lock:
            del self._loading[key]
            if source == "disk":
                origin, meta = self._disk_info.pop(key)
                rec = self._disk.detach(key)
                if key in self._dropped_while_loading:
                    self._disk.discard(rec)
                else:
                    self._kept[key] = (rec, origin, meta)
            elif key in self._dropped_while_loading or into != "device":
                self._release(entry)
            if key in self._dropped_while_loading:
                self._dropped_while_loading.discard(key)
            elif into == "device":
                self._device[key] = value
                self.device_bytes += int(value.nbytes)
                if source == "host":  # its pinned copy stays valid: evicting it again copies nothing
                    if entry.up is not None and entry.up is not up and not entry.up.done():
                        entry.up.wait()  # an earlier upload of the same buffer, perhaps on another stream
                    entry.up = up
                    self._clean[key] = entry
                    self.host_bytes += entry.nbytes
                self._fit_device(keep=key)
            else:
                self._host[key] = _HostEntry(value, "host")
                self.host_bytes += int(value.nbytes)
                self._fit_host()
            if prefetch:
                self.prefetched += 1
            self._reap()
            done.set()
        return value

    def _reclaim(self, key: Any, entry: _HostEntry) -> Any:
        """Read back a chunk whose copy to host is still in flight: its device copy is still here."""
        value = entry.pending.device_value
        del self._host[key]
        self._clean[key] = entry  # once its copy finishes the host copy is valid: keep it
        self._device[key] = value
        self.device_bytes += int(value.nbytes)
        self.metrics.note("reclaimed_in_flight")
        self._fit_device(keep=key)
        return value

    def _bring_up(self, key: Any, source: str, entry: _HostEntry | None, prefetch: bool):
        """Copy a chunk up one or two tiers, outside the lock; returns (value, tier)."""
        if source == "host":  # a spilled device chunk in a host buffer
            t = self.transfer
            upload = getattr(t, "to_device_async", None)
            if upload is not None:
                # enqueued, not waited for: the event loop thread that asks for a task's inputs
                # goes on at once, and the task's stream is ordered after the copy (MemoryPlugin)
                value, up = upload(entry.value, entry.meta, entry.buf.pinned)
                with self._lock:
                    self._uploads.append((up, entry.nbytes))
                return value, "device", up
            value, seconds = t.to_device(entry.value, entry.meta, entry.buf.pinned)
            self.metrics.add("host_to_device", entry.nbytes, seconds)
            return value, "device", None
        origin, meta = self._disk_info[key]
        start = time.perf_counter()
        if origin == "host":
            value = self._disk.read(key)
            self.metrics.add("disk_to_host", value.nbytes, time.perf_counter() - start)
            return value, "host", None
        buf = self.pool.take(meta.nbytes, transient=True)
        try:
            host = self._disk.read(key, out=buf.view)
            read_s = time.perf_counter() - start
            value, seconds = self.transfer.to_device(host, meta, buf.pinned)
        finally:
            self.pool.give(buf)
        self.metrics.add("disk_to_host", meta.nbytes, read_s)
        self.metrics.add("host_to_device", meta.nbytes, seconds)
        return value, "device", None

    def prefetch(self, key: Any) -> bool:
        """Bring ``key`` up to its fast tier ahead of use if there is room; True if it moved."""
        with self._lock:
            if key in self._device or key in self._other or key in self._loading or not self._has(key):
                return False
            if key in self._host:
                origin, nbytes = self._host[key].origin, self._host[key].nbytes
                if origin == "host":
                    return False
            else:
                origin, meta = self._disk_info[key]
                nbytes = meta.nbytes
            if origin == "device":
                # no room taken from anything, clean copies included: a chunk dropped now may be
                # the input of a task that is about to run, and would travel twice
                limit, used = self.device_memory_limit, self.device_bytes
            else:
                limit, used = self.memory_limit, self.host_bytes
            if limit is not None and used + nbytes > limit:
                return False  # no room: prefetching would evict what is about to be used
        try:
            self._fetch(key, prefetch=True)
        except KeyError:
            return False
        return True

    # -- distributed's ManualEvictProto: its memory monitor spills host chunks through this --
    @property
    def fast(self) -> OrderedDict:
        """Host-memory chunks (what distributed's memory monitor can evict)."""
        return self._host

    def evict(self) -> int:
        """Free host memory for distributed's memory monitor: first a host copy of a chunk that is
        also on the device (nothing to write), else the least recently used host chunk to disk.
        Returns the bytes freed, or -1."""
        with self._lock:
            if self._clean:
                nbytes = next(iter(self._clean.values())).nbytes
                self._drop_clean_one()
                return nbytes
            if not self._host:
                return -1
            return self._evict_host_one()

    @property
    def spilled_total(self) -> tuple[int, int]:
        """``(bytes of chunks on disk, bytes of their files)``, as distributed reports spilling."""
        with self._lock:
            n = sum(m.nbytes for _, m in self._disk_info.values())
            return n, self._disk.nbytes

    @property
    def cumulative_metrics(self) -> dict:
        """Moves per tier in the shape distributed's Prometheus collector exports."""
        return self.metrics.cumulative_metrics()

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
                    "device": {"keys": len(self._device), "bytes": self.device_bytes,
                               "limit": self.device_memory_limit, "pending_bytes": self.pending_bytes},
                    "host": {"keys": len(self._host), "bytes": self.host_bytes, "limit": self.memory_limit,
                             "clean_copies": len(self._clean)},
                    "disk": {"keys": len(self._disk), "bytes": disk_n, "file_bytes": disk_file,
                             "directory": self.directory, "disabled": self._disk.disabled_reason},
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
            for entry in self._pending:
                entry.pending.wait()
            for up, _ in self._uploads:
                up.wait()
            self._reap()
            for key in list(self._device) + list(self._host) + self._disk.keys() + list(self._other):
                self._drop(key)
            self.pool.trim()

    def __repr__(self) -> str:
        return (f"<FlowgpuStore device={len(self._device)} keys/{self.device_bytes} B "
                f"host={len(self._host)}/{self.host_bytes} B disk={len(self._disk)}>")
