"""Imports the built-in op modules, which register their ops with :mod:`flowgpu.ops.registry`.

:mod:`flowgpu.ops` imports this module, so every built-in op is registered once the package is
imported. Each module registers a family:

* :mod:`flowgpu.ops.elementwise`: arithmetic and math (fusable, with expression templates), and
  the parts of complex numbers (real, imag, conj, angle);
* :mod:`flowgpu.ops.reductions`: sum, mean, min, max, std, var, prod;
* :mod:`flowgpu.ops.shape`: transpose, slice, reshape, rechunk, concatenate, stack, squeeze;
* :mod:`flowgpu.ops.linalg`: matmul, dot;
* :mod:`flowgpu.ops.fft`: fft, ifft, rfft, irfft, fft2, ifft2, fftn, ifftn;
* :mod:`flowgpu.ops.stencil`: gaussian_filter, uniform_filter, median_filter (map_overlap);
* :mod:`flowgpu.ops.user`: map_blocks with a user function given by import path;
* :mod:`flowgpu.ops.expression`: the ``expr`` op (over the fusion compiler);
* :mod:`flowgpu.ops.grouping`: groupby_reduce, groupby_anomaly, resample_reduce (labelled inputs, by xarray).
"""

from __future__ import annotations

from flowgpu.ops import elementwise, expression, fft, grouping, linalg, reductions, shape, stencil, user  # noqa: F401

__all__: list[str] = []
