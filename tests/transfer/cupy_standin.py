"""A stand-in ``cupy`` module for a subprocess without a GPU: put it in ``sys.modules["cupy"]`` before
importing flowgpu, and ``flowgpu.to_device`` runs its real staging code on host memory.

Its arrays are NumPy arrays that say they are CuPy's (their type's module is ``cupy``) and carry
``.data.ptr``; device copies are ``memmove`` at once; pinning (``hostRegister``) is recorded and
does nothing. ``plain_copies`` counts ``asarray`` calls: the copies that bypass pinned staging.
Anything else is NumPy's. It imports nothing of flowgpu.
"""

from __future__ import annotations

import ctypes
import types

import numpy as np

plain_copies = 0
registered: list[int] = []


class ndarray(np.ndarray):  # noqa: N801 - cupy's name
    @property
    def data(self):  # cupy's MemoryPointer: only .ptr is read
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def get(self) -> np.ndarray:
        return np.array(self.view(np.ndarray))


ndarray.__module__ = "cupy"


def empty(shape, dtype=np.float64, order="C") -> ndarray:
    return np.empty(shape, dtype=dtype, order=order).view(ndarray)


def asarray(a) -> ndarray:
    global plain_copies
    plain_copies += 1
    return np.array(a).view(ndarray)


class _Stream:
    ptr = 1

    def synchronize(self) -> None:
        pass


class _Event:
    def __init__(self, disable_timing: bool = False):
        pass

    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Device:
    def __init__(self, ordinal: int = 0):
        pass

    @property
    def pci_bus_id(self):
        raise RuntimeError("no device (stand-in)")


def _memcpy(dst, src, n, kind, stream=None):
    ctypes.memmove(dst, src, n)


runtime = types.SimpleNamespace(
    memcpyAsync=_memcpy, memcpy=_memcpy, memcpyHostToDevice=1, memcpyDeviceToHost=2,
    hostRegister=lambda ptr, size, flags: registered.append(size), hostUnregister=lambda ptr: None,
)
cuda = types.SimpleNamespace(get_current_stream=lambda: _Stream(), Event=_Event, Device=_Device, runtime=runtime)


def __getattr__(name: str):
    return getattr(np, name)
