"""Imports the built-in op modules, which register their ops with :mod:`flowgpu.ops.registry`.

The registry imports this module the first time an op is looked up, so ``import flowgpu`` stays
light. Each module registers a family:

* :mod:`flowgpu.ops.elementwise`: arithmetic and math (fusable, with expression templates);
* :mod:`flowgpu.ops.reductions`: sum, mean, min, max, std, var, prod;
* :mod:`flowgpu.ops.shape`: transpose, slice, reshape, rechunk, concatenate, stack, squeeze;
* :mod:`flowgpu.ops.linalg`: matmul, dot;
* :mod:`flowgpu.ops.fft`: fft, ifft, rfft, irfft, fft2, ifft2, fftn, ifftn;
* :mod:`flowgpu.ops.stencil`: gaussian_filter, uniform_filter, median_filter (map_overlap);
* :mod:`flowgpu.ops.user`: map_blocks with a user function given by import path;
* :mod:`flowgpu.ops.expression`: the ``expr`` op (kernels/fusion layer), when present.
"""

from __future__ import annotations

import importlib

_MODULES = (
    "flowgpu.ops.elementwise",
    "flowgpu.ops.reductions",
    "flowgpu.ops.shape",
    "flowgpu.ops.linalg",
    "flowgpu.ops.fft",
    "flowgpu.ops.stencil",
    "flowgpu.ops.user",
)

for _name in _MODULES:
    try:
        importlib.import_module(_name)
    except ModuleNotFoundError as _e:  # a family not written yet; any other missing import is a real error
        if _e.name != _name:
            raise

try:
    importlib.import_module("flowgpu.ops.expression")
except ModuleNotFoundError as _e:
    if _e.name != "flowgpu.ops.expression":
        raise
