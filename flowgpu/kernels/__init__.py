"""User kernels: decorators that run your own scalar, gufunc, CUDA or DLPack code chunk by chunk.

* :mod:`flowgpu.kernels.vectorize`: ``@flowgpu.vectorize``, a scalar function as a ufunc (numba);
* :mod:`flowgpu.kernels.guvectorize`: ``@flowgpu.guvectorize``, a generalised ufunc over core dims;
* :mod:`flowgpu.kernels.raw`: ``flowgpu.kernel``, a raw CUDA kernel with an optional CPU version;
* :mod:`flowgpu.kernels.dlpack`: ``flowgpu.dlpack_map``, a PyTorch / JAX function on each chunk.

Expression fusion (``flowgpu.fuse``, ``flowgpu.optimize``) is the separate package
:mod:`flowgpu.fusion`. Importing this package never imports CuPy, numba, PyTorch or JAX.
"""

from __future__ import annotations

from flowgpu.kernels.dlpack import DLPackFunction, dlpack_map
from flowgpu.kernels.guvectorize import CoreRechunkWarning, GUVectorized, guvectorize
from flowgpu.kernels.raw import Kernel, kernel
from flowgpu.kernels.vectorize import Vectorized, vectorize

__all__ = ["CoreRechunkWarning", "DLPackFunction", "GUVectorized", "Kernel", "Vectorized", "dlpack_map",
           "guvectorize", "kernel", "vectorize"]
