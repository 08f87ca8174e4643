"""Stand-ins for pinned memory and CuPy, so the staging pipeline's logic is tested on machines without a GPU."""

from __future__ import annotations

import numpy as np

from flowgpu.transfer import staging
from flowgpu.transfer.pinned import HostBuffer, PinnedPool


def fake_pinned(size: int) -> HostBuffer:
    view = np.empty(size, dtype=np.uint8)
    return HostBuffer(size, view, view.ctypes.data, True, view)


def failing_pinned(size: int) -> HostBuffer:
    raise MemoryError("cudaErrorMemoryAllocation: out of memory (fake)")


class _LazyStream:
    """A stream whose copies run only when an event recorded after them is waited for, the latest
    a real copy engine could run them: code that refills a buffer too early gets wrong bytes."""

    def __init__(self, lock):
        self.ptr = id(self)
        self._lock = lock
        self.queue: list[tuple[int, int, int]] = []
        self.ran = 0

    def run_until(self, mark: int) -> None:
        import ctypes

        with self._lock:
            while self.ran < mark:
                dst, src, n = self.queue[self.ran]
                ctypes.memmove(dst, src, n)
                self.ran += 1


class _LazyEvent:
    def __init__(self, disable_timing: bool = False):
        self.stream = None
        self.mark = 0

    def record(self, stream) -> None:
        self.stream, self.mark = stream, len(stream.queue)

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.run_until(self.mark)


class _DeviceBlock:
    """Plays a CuPy array: host memory with ``.data.ptr``."""

    def __init__(self, shape, dtype):
        self.a = np.empty(shape, dtype=dtype)
        self.size = self.a.size
        self.data = type("_Ptr", (), {"ptr": self.a.ctypes.data})()


class LazyCopyCupy:
    """Just enough of CuPy for ``flowgpu.transfer.staging``: ``empty``, one current stream, events,
    and ``memcpyAsync`` copies that run as late as CUDA allows (see ``_LazyStream``)."""

    def __init__(self):
        import threading
        import types

        lock = threading.Lock()
        self.stream = _LazyStream(lock)
        streams = {self.stream.ptr: self.stream}

        def memcpy_async(dst, src, n, kind, stream_ptr):
            s = streams[stream_ptr]
            with lock:
                s.queue.append((dst, src, n))

        def memcpy(dst, src, n, kind):
            import ctypes

            self.stream.run_until(len(self.stream.queue))
            ctypes.memmove(dst, src, n)

        runtime = types.SimpleNamespace(memcpyAsync=memcpy_async, memcpy=memcpy, memcpyHostToDevice=1)
        self.cuda = types.SimpleNamespace(get_current_stream=lambda: self.stream, Event=_LazyEvent, runtime=runtime)

    @staticmethod
    def empty(shape, dtype=np.float64):
        return _DeviceBlock(shape, dtype)

    def asarray(self, a):
        """A synchronous copy, as ``cupy.asarray`` of host memory is."""
        a = np.asarray(a)
        out = _DeviceBlock(a.shape, a.dtype)
        self.plain_copies = getattr(self, "plain_copies", 0) + 1
        np.copyto(out.a, a)
        return out


def fake_staging(monkeypatch) -> LazyCopyCupy:
    """Make ``flowgpu.transfer.staging`` copy with a :class:`LazyCopyCupy` from a process-wide pool of
    fake pinned buffers (what ``flowgpu.to_device`` and ``flowgpu.from_npy`` stage through)."""
    cp = LazyCopyCupy()
    monkeypatch.setattr(staging, "import_cupy", lambda: cp)
    monkeypatch.setattr(staging, "_pool", PinnedPool(capacity=128 * staging.STAGING_BYTES, allocator=fake_pinned))
    return cp
