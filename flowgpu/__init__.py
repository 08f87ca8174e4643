"""flowgpu: out-of-core dataflow on chunked CuPy (or NumPy) arrays, scheduled by Dask.

The public API is imported on first use, so ``import flowgpu`` is instant and never imports CuPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# module -> the public names it defines
_MODULES = {
    "flowgpu.runtime.session": ("Session", "current_session"),
    "flowgpu.arrays.creation": ("random", "normal", "zeros", "ones", "full", "arange", "from_array"),
    "flowgpu.arrays.movement": ("to_device", "to_host", "to_numpy"),
    "flowgpu.io.npy": ("from_npy", "to_npy"),
    "flowgpu.io.hdf5": ("from_hdf5",),
    "flowgpu.io.tiff": ("from_tiff",),
    "flowgpu.io.zarr": ("from_zarr", "to_zarr"),
    "flowgpu.ops.registry": ("op",),
    "flowgpu.fusion": ("fuse", "optimize"),
    "flowgpu.kernels": ("vectorize", "guvectorize", "kernel", "dlpack_map"),
    "flowgpu.backend": ("has_gpu", "gpu_count"),
    "flowgpu.errors": ("FlowgpuError", "SpecError"),
    "flowgpu.pipeline.builder": ("Pipeline",),
}
# public name -> module that defines it
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    # PEP 562. The one place flowgpu imports its own modules inside a function (tests/test_layers.py).
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flowgpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from flowgpu.arrays.creation import arange, from_array, full, normal, ones, random, zeros
    from flowgpu.arrays.movement import to_device, to_host, to_numpy
    from flowgpu.backend import gpu_count, has_gpu
    from flowgpu.errors import FlowgpuError, SpecError
    from flowgpu.io.hdf5 import from_hdf5
    from flowgpu.io.npy import from_npy, to_npy
    from flowgpu.io.tiff import from_tiff
    from flowgpu.io.zarr import from_zarr, to_zarr
    from flowgpu.fusion import fuse, optimize
    from flowgpu.kernels import dlpack_map, guvectorize, kernel, vectorize
    from flowgpu.ops.registry import op
    from flowgpu.pipeline.builder import Pipeline
    from flowgpu.runtime.session import Session, current_session
