"""Stand-ins for the device, so the device tier's logic is tested on machines without a GPU."""

from __future__ import annotations

import numpy as np

from flowgpu.transfer.pinned import HostBuffer
from flowgpu.transfer.streams import ArrayMeta, PendingCopy
from tests.transfer.fakes import failing_pinned, fake_pinned

__all__ = ["FakeDeviceArray", "FakeTransfer", "failing_pinned", "fake_pinned"]


class FakeDeviceArray:
    """Plays a device chunk: holds a NumPy array the store must not see as host data."""

    def __init__(self, a: np.ndarray):
        self.a = a
        self.nbytes = a.nbytes
        self.shape = a.shape
        self.dtype = a.dtype


class _Event:
    def __init__(self, done: bool):
        self.done = done

    def synchronize(self):
        self.done = True


class FakeTransfer:
    """Copies like CupyTransfer, synchronously; ``hold=True`` keeps device-to-host copies in flight."""

    def __init__(self, hold: bool = False, hold_uploads: bool = False, uploads: bool = True):
        self.hold = hold
        self.hold_uploads = hold_uploads
        if not uploads:  # a copier with synchronous uploads only
            self.to_device_async = None
        self.events: list[_Event] = []
        self.h2d = 0

    @staticmethod
    def is_device(value) -> bool:
        return isinstance(value, FakeDeviceArray)

    def meta(self, value) -> ArrayMeta:
        a = value.a
        order = "F" if (a.flags.f_contiguous and not a.flags.c_contiguous) else "C"
        return ArrayMeta(tuple(a.shape), a.dtype, order)

    def to_host_async(self, value, buf: HostBuffer, meta: ArrayMeta) -> PendingCopy:
        np.copyto(meta.host_array(buf), value.a)
        ev = _Event(done=not self.hold)
        self.events.append(ev)
        return PendingCopy(value, ev)

    def to_device(self, host: np.ndarray, meta: ArrayMeta, pinned: bool):
        self.h2d += 1
        return FakeDeviceArray(np.array(host, order=meta.order)), 1e-3

    def to_device_async(self, host: np.ndarray, meta: ArrayMeta, pinned: bool):
        """Like CupyTransfer's: returns at once; ``hold_uploads=True`` keeps the copy 'in flight'."""
        value, _ = self.to_device(host, meta, pinned)
        ev = _Event(done=not self.hold_uploads)
        self.events.append(ev)
        return value, PendingCopy(value, ev)

    def finish_all(self):
        for ev in self.events:
            ev.done = True
