"""flowgpu: out-of-core dataflow on chunked CuPy (or NumPy) arrays, scheduled by Dask.

The public API is imported on first use, so ``import flowgpu`` is instant and never imports CuPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Session": "flowgpu.runtime.session",
    "current_session": "flowgpu.runtime.session",
    "random": "flowgpu.arrays.creation",
    "normal": "flowgpu.arrays.creation",
    "zeros": "flowgpu.arrays.creation",
    "ones": "flowgpu.arrays.creation",
    "full": "flowgpu.arrays.creation",
    "arange": "flowgpu.arrays.creation",
    "from_array": "flowgpu.arrays.creation",
    "to_device": "flowgpu.arrays.movement",
    "to_host": "flowgpu.arrays.movement",
    "to_numpy": "flowgpu.arrays.movement",
    "from_npy": "flowgpu.io.npy",
    "to_npy": "flowgpu.io.npy",
    "from_hdf5": "flowgpu.io.hdf5",
    "from_tiff": "flowgpu.io.tiff",
    "from_zarr": "flowgpu.io.zarr",
    "to_zarr": "flowgpu.io.zarr",
    "op": "flowgpu.ops.registry",
    "fuse": "flowgpu.fusion",
    "optimize": "flowgpu.fusion",
    "vectorize": "flowgpu.kernels",
    "guvectorize": "flowgpu.kernels",
    "kernel": "flowgpu.kernels",
    "dlpack_map": "flowgpu.kernels",
    "has_gpu": "flowgpu.backend",
    "gpu_count": "flowgpu.backend",
    "FlowgpuError": "flowgpu.errors",
    "SpecError": "flowgpu.errors",
    "Pipeline": "flowgpu.pipeline.builder",
}

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
