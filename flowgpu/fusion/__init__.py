"""Expression fusion: chains of elementwise operations compiled into ONE kernel per chunk.

``language`` parses expressions, ``codegen*`` writes CUDA C or Python for numba, ``compiled`` and
``kernel_cache`` build and keep the kernels, ``chunk`` runs one on a chunk, ``kernel`` and ``api``
(``flowgpu.fuse``) apply them to dask arrays, and ``graph`` (with ``graph_reduce``/``graph_tree``)
rewrites ufunc chains of any dask graph. Importing it imports neither CuPy nor numba.
"""

from __future__ import annotations

from flowgpu.fusion.api import Fused, fuse
from flowgpu.fusion.compiled import REDUCTIONS
from flowgpu.fusion.graph import fusing, optimize
from flowgpu.fusion.kernel import fused_elementwise
from flowgpu.fusion.language import FUNCTIONS, Expr, parse

__all__ = ["Expr", "FUNCTIONS", "Fused", "REDUCTIONS", "fuse", "fused_elementwise", "fusing", "optimize", "parse"]
