"""Kernels: fused elementwise chains (one kernel per chunk) and user kernel decorators.

* :mod:`flowgpu.kernels.expr` parses the safe expression language used by ``expr`` steps;
* :mod:`flowgpu.kernels.fusion` compiles an expression into one CuPy/numba kernel per chunk,
  optionally fused into a reduction;
* :mod:`flowgpu.kernels.fuse` is the Python API (``flowgpu.fuse``);
* :mod:`flowgpu.kernels.optimize` rewrites chains of NumPy ufuncs in a dask graph into fused kernels.

Submodules are imported on first use, so importing this package is cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "parse": "flowgpu.kernels.expr",
    "Expr": "flowgpu.kernels.expr",
    "fused_elementwise": "flowgpu.kernels.fusion",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'flowgpu.kernels' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
