"""Copies between device chunks and host buffers, on their own CUDA streams, as raw bytes plus
``(shape, dtype, order)``. :class:`CupyTransfer` enqueues device-to-host copies on one stream and
uploads on one stream per calling thread, so both directions overlap compute; the worker's event loop
never waits for PCIe (tasks order their streams after the uploads). Tests use ``tests/memory/fakes.py``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowgpu.backend import import_cupy, is_cupy
from flowgpu.transfer.pinned import HostBuffer

__all__ = ["ArrayMeta", "PendingCopy", "CupyTransfer", "sync_current_stream"]


@dataclass(frozen=True)
class ArrayMeta:
    """What is needed to rebuild a chunk from its raw bytes."""

    shape: tuple
    dtype: np.dtype
    order: str  # "C" or "F"

    @classmethod
    def of(cls, value: Any) -> "ArrayMeta":
        """The layout of a NumPy or CuPy array (non-contiguous ones are copied in C order)."""
        order = "F" if (value.flags.f_contiguous and not value.flags.c_contiguous) else "C"
        return cls(tuple(value.shape), np.dtype(value.dtype), order)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def host_array(self, buf: HostBuffer) -> np.ndarray:
        return buf.array(self.shape, self.dtype, self.order)


class PendingCopy:
    """A device-to-host copy in flight; holds the device chunk until it is done."""

    __slots__ = ("device_value", "_done_event", "_start_event", "_t0", "seconds")

    def __init__(self, device_value: Any, done_event: Any = None, start_event: Any = None):
        self.device_value = device_value
        self._done_event = done_event
        self._start_event = start_event
        self._t0 = time.perf_counter()
        self.seconds: float | None = None

    def done(self) -> bool:
        """True once the copy has finished (the device chunk is then released)."""
        if self._done_event is None or self._done_event.done:
            self._finish()
            return True
        return False

    def wait(self) -> None:
        if self._done_event is not None:
            self._done_event.synchronize()
        self._finish()

    def _finish(self) -> None:
        if self.seconds is None:
            if self._start_event is not None and self._done_event is not None:
                cp = import_cupy()
                self.seconds = float(cp.cuda.get_elapsed_time(self._start_event, self._done_event)) / 1e3
            else:
                self.seconds = time.perf_counter() - self._t0
        self.device_value = None


def sync_current_stream() -> None:
    """Wait for the work this thread queued on its current CUDA stream (a no-op without CuPy)."""
    cp = import_cupy(strict=False)
    if cp is not None:
        cp.cuda.get_current_stream().synchronize()


class CupyTransfer:
    """Device <-> pinned host copies through CuPy, on two non-blocking streams of one device."""

    def __init__(self) -> None:
        cp = import_cupy()
        self._cp = cp
        self.device_id = cp.cuda.runtime.getDevice()
        self._local = threading.local()
        self._d2h = cp.cuda.Stream(non_blocking=True)
        self._up_lock = threading.Lock()
        self._last_up: dict[int, Any] = {}  # H2D stream -> event of its latest upload

    def _h2d_stream(self):
        # one per calling thread: the prefetcher and the event loop copy concurrently
        s = getattr(self._local, "h2d", None)
        if s is None:
            s = self._local.h2d = self._cp.cuda.Stream(non_blocking=True)
        return s

    def _copy(self, stream: Any, dst: int, src: int, nbytes: int, kind: int) -> tuple[Any, Any]:
        """Enqueue a copy of ``nbytes`` from address ``src`` to ``dst`` on ``stream`` between two
        CUDA events: ``(start, done)``."""
        start, done = self._cp.cuda.Event(disable_timing=False), self._cp.cuda.Event(disable_timing=False)
        start.record(stream)
        if nbytes:
            self._cp.cuda.runtime.memcpyAsync(dst, src, nbytes, kind, stream.ptr)
        done.record(stream)
        return start, done

    @staticmethod
    def is_device(value: Any) -> bool:
        return is_cupy(value) and hasattr(value, "data") and hasattr(value, "nbytes")

    @staticmethod
    def meta(value: Any) -> ArrayMeta:
        return ArrayMeta.of(value)

    def to_host_async(self, value: Any, buf: HostBuffer, meta: ArrayMeta) -> PendingCopy:
        """Enqueue a copy of device ``value`` into ``buf``; returns at once."""
        cp = self._cp
        with cp.cuda.Device(self.device_id):
            src = value
            if not (value.flags.c_contiguous or value.flags.f_contiguous):
                with self._d2h:
                    src = cp.ascontiguousarray(value)
            start, done = self._copy(self._d2h, buf.ptr, src.data.ptr, meta.nbytes, cp.cuda.runtime.memcpyDeviceToHost)
        return PendingCopy(src, done, start)

    def to_device_async(self, host: np.ndarray, meta: ArrayMeta, pinned: bool) -> tuple[Any, PendingCopy]:
        """Enqueue a copy of pinned ``host`` (untouched until the copy is done) to a new device
        array; the calling thread's stream, and any that calls :meth:`order_current_stream`, is
        ordered after it. Pageable memory is copied synchronously (it would be anyway)."""
        if not pinned:
            out, seconds = self.to_device(host, meta, pinned)
            done = PendingCopy(None)
            done.seconds = seconds
            return out, done
        cp = self._cp
        stream = self._h2d_stream()
        with cp.cuda.Device(self.device_id):
            with stream:
                out = cp.empty(meta.shape, dtype=meta.dtype, order=meta.order)
                start, done = self._copy(stream, out.data.ptr, host.ctypes.data, meta.nbytes,
                                         cp.cuda.runtime.memcpyHostToDevice)
            with self._up_lock:
                self._last_up[stream.ptr] = done
            cp.cuda.get_current_stream().wait_event(done)
        return out, PendingCopy(out, done, start)

    def uploads_so_far(self) -> tuple:
        """The latest upload event of each upload stream: waiting for them covers every upload enqueued so far."""
        with self._up_lock:
            return tuple(self._last_up.values())

    def order_current_stream(self, events: tuple | None = None) -> None:
        """Make the calling thread's current stream wait (on the device, not the host) for
        ``events`` (default: every upload enqueued so far)."""
        if events is None:
            events = self.uploads_so_far()
        if events:
            with self._cp.cuda.Device(self.device_id):
                stream = self._cp.cuda.get_current_stream()
                for ev in events:
                    stream.wait_event(ev)

    def to_device(self, host: np.ndarray, meta: ArrayMeta, pinned: bool) -> tuple[Any, float]:
        """Copy ``host`` (laid out as ``meta``) to a new device array and wait: ``(array, seconds)``."""
        cp = self._cp
        stream = self._h2d_stream()
        if not pinned:
            host = np.ascontiguousarray(host) if meta.order == "C" else np.asfortranarray(host)
        with cp.cuda.Device(self.device_id), stream:
            out = cp.empty(meta.shape, dtype=meta.dtype, order=meta.order)
            start, done = self._copy(stream, out.data.ptr, host.ctypes.data, meta.nbytes,
                                     cp.cuda.runtime.memcpyHostToDevice)
            done.synchronize()
        return out, float(cp.cuda.get_elapsed_time(start, done)) / 1e3
