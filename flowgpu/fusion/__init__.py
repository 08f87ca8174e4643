"""Expression fusion: chains of elementwise operations compiled into ONE kernel per chunk.

* :mod:`flowgpu.fusion.language` parses the safe expression language (``"(x * 2 + 1) ** 2 - x"``);
* :mod:`flowgpu.fusion.codegen` (with :mod:`~flowgpu.fusion.codegen_cuda` and
  :mod:`~flowgpu.fusion.codegen_cpu`) turns an expression into CUDA C or Python for numba;
* :mod:`flowgpu.fusion.compiled` builds and caches the kernels, :mod:`flowgpu.fusion.chunk` runs
  them on one chunk and :mod:`flowgpu.fusion.tiled` reduces transposed 2-D chunks in tiles;
* :mod:`flowgpu.fusion.kernel_cache` keeps numba's compiled kernels on disk (``flowgpu.cache.kernels``),
  so a kernel is compiled once per machine, not in every process (``kernel_cache.stats()`` counts);
* :mod:`flowgpu.fusion.kernel` applies an expression to dask arrays (:func:`fused_elementwise`),
  optionally fused into a reduction;
* :mod:`flowgpu.fusion.api` is the Python API, ``flowgpu.fuse``;
* :mod:`flowgpu.fusion.graph` rewrites chains of NumPy ufuncs in a dask graph into fused kernels
  (``flowgpu.optimize``, :func:`fusing`, and a Session's hook), and with
  :mod:`~flowgpu.fusion.graph_reduce` the chunk stage of dask's reductions they feed.

Importing this package never imports CuPy or numba; they are imported when a kernel is built.
"""

from __future__ import annotations

from flowgpu.fusion.api import Fused, fuse
from flowgpu.fusion.compiled import REDUCTIONS
from flowgpu.fusion.graph import fusing, optimize
from flowgpu.fusion.kernel import fused_elementwise
from flowgpu.fusion.language import FUNCTIONS, Expr, parse

__all__ = ["Expr", "FUNCTIONS", "Fused", "REDUCTIONS", "fuse", "fused_elementwise", "fusing", "optimize", "parse"]
