"""Which array library holds the chunks, and whether this machine has GPUs: the one place that imports
CuPy (lazily, with an install hint when it is missing) and the one place that counts GPUs.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import dask.config
import numpy as np

from flowgpu.errors import BackendError

__all__ = ["Facts", "using", "import_cupy", "is_cupy", "array_module", "empty_meta", "current_backend", "gpu_count",
           "has_gpu", "visible_gpus", "device_total_memory"]

INSTALL_HINT = "install the GPU extra that matches your CUDA: pip install 'flowgpu[cuda12]' or 'flowgpu[cuda13]'"


def import_cupy(strict: bool = True):
    """Return the cupy module, or None (``strict=False``) / a BackendError when it is missing."""
    try:
        import cupy
    except ImportError as e:
        if strict:
            raise BackendError(f"CuPy is not installed ({e}); {INSTALL_HINT}") from None
        return None
    return cupy


def is_cupy(x: Any) -> bool:
    """True when ``x`` is a CuPy array (checked without importing cupy)."""
    return type(x).__module__.startswith("cupy")


def array_module(x: Any):
    """numpy or cupy, whichever ``x`` belongs to."""
    return import_cupy() if is_cupy(x) else np


def empty_meta(cupy: bool, dtype: Any, ndim: int):
    """An empty CuPy (``cupy``) or NumPy array of ``dtype`` and ``ndim``, for dask's ``meta=``."""
    return (import_cupy() if cupy else np).empty((0,) * ndim, dtype=dtype)


@dataclass(frozen=True)
class Facts:
    """What building a graph needs to know of the workers that will run it: their chunks' array
    library, the bytes one worker may hold (None: no bound known) and the tasks it runs at once.

    A pipeline is compiled with its Session's facts (:func:`using`); plain dask code on an open
    Session reads them from dask.config, where it publishes them (``array.backend``, ``flowgpu.worker.*``).
    """

    backend: str = "numpy"  # "numpy" or "cupy"
    budget: int | None = None
    threads: int | None = None

    @classmethod
    def here(cls) -> "Facts":
        """The facts in force: a compile's (:func:`using`), else an open Session's, else NumPy, unbounded."""
        given = _FACTS.get()
        if given is not None:
            return given
        budget, threads = dask.config.get("flowgpu.worker.budget", None), dask.config.get("flowgpu.worker.threads", None)
        return cls(current_backend(), int(budget) if budget is not None else None,
                   int(threads) if threads is not None else None)


_FACTS: ContextVar[Facts | None] = ContextVar("flowgpu_facts", default=None)


@contextlib.contextmanager
def using(facts: Facts | None) -> Iterator[None]:
    """Within the block (this thread or task), arrays are built for ``facts`` (None: as before)."""
    token = _FACTS.set(facts if facts is not None else _FACTS.get())
    try:
        yield
    finally:
        _FACTS.reset(token)


def current_backend() -> str:
    """The array backend in force, ``"cupy"`` or ``"numpy"``, as :meth:`Facts.here` has it."""
    given = _FACTS.get()  # only the backend: this is asked for every array made, the worker facts are not needed
    if given is not None:
        return given.backend
    return "cupy" if dask.config.get("array.backend", "numpy") == "cupy" else "numpy"


def _parse_visible(env: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES entries as CUDA reads them: it stops at the first invalid entry."""
    out = []
    for item in env.split(","):
        item = item.strip()
        if not item:
            break
        if item.lstrip("-").isdigit():
            if int(item) < 0:
                break
        elif not item.startswith(("GPU-", "MIG-")):
            break
        out.append(item)
    return out


@functools.lru_cache(maxsize=1)
def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # not installed, or no driver
        return None
    return pynvml


def _driver_count() -> int:
    """Count devices through the CUDA driver API (which itself honours CUDA_VISIBLE_DEVICES)."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        n = ctypes.c_int(0)
        return int(n.value) if lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(n)) == 0 else 0
    return 0


def visible_gpus() -> list[int]:
    """Ordinals (0..n-1, as CUDA numbers them in this process) of the GPUs this process can use."""
    nvml = _nvml()
    try:
        physical = int(nvml.nvmlDeviceGetCount()) if nvml is not None else None
    except Exception:
        physical = None
    if physical is None:
        return list(range(_driver_count()))
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(physical))
    entries = _parse_visible(env)  # CUDA stops at the first ordinal past the devices there are
    return list(range(next((i for i, e in enumerate(entries) if e.isdigit() and int(e) >= physical), len(entries))))


def gpu_count() -> int:
    """How many GPUs this process can use (honours CUDA_VISIBLE_DEVICES)."""
    return len(visible_gpus())


def has_gpu() -> bool:
    """True when at least one GPU is visible; counts devices, never imports cupy."""
    return gpu_count() > 0


def _physical_index(ordinal: int) -> int | str:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return ordinal
    item = _parse_visible(env)[ordinal]
    return int(item) if item.isdigit() else item


def physical_devices() -> list[str]:
    """For each visible ordinal, the CUDA_VISIBLE_DEVICES entry (index or UUID) that names it."""
    return [str(_physical_index(i)) for i in visible_gpus()]


def device_total_memory(ordinal: int = 0) -> int:
    """Total memory in bytes of visible GPU ``ordinal``."""
    nvml = _nvml()
    if nvml is not None:
        idx = _physical_index(ordinal)
        by = nvml.nvmlDeviceGetHandleByIndex if isinstance(idx, int) else nvml.nvmlDeviceGetHandleByUUID
        return int(nvml.nvmlDeviceGetMemoryInfo(by(idx)).total)
    cp = import_cupy()
    with cp.cuda.Device(ordinal):
        return int(cp.cuda.runtime.memGetInfo()[1])

