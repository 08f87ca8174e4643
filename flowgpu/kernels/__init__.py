"""User kernels run chunk by chunk: ``vectorize`` (a scalar function as a ufunc, numba),
``guvectorize`` (a gufunc over core dimensions), ``kernel`` (raw CUDA, optional CPU version) and
``dlpack_map`` (a PyTorch / JAX function). Importing it imports neither CuPy, numba, torch nor jax.
"""

from __future__ import annotations

from flowgpu.kernels.dlpack import DLPackFunction, dlpack_map
from flowgpu.kernels.guvectorize import CoreRechunkWarning, GUVectorized, guvectorize
from flowgpu.kernels.raw import Kernel, kernel
from flowgpu.kernels.vectorize import Vectorized, vectorize

__all__ = ["CoreRechunkWarning", "DLPackFunction", "GUVectorized", "Kernel", "Vectorized", "dlpack_map",
           "guvectorize", "kernel", "vectorize"]
