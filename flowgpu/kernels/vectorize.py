"""``@flowgpu.vectorize``: a scalar Python function as a ufunc over chunked arrays, on GPU and CPU.

numba compiles it once per process and signature (numba-cuda for CuPy chunks, handed over without
a copy). The signature is NumPy's choice of loop: the first, in order, every input casts to safely
(Python scalars weak: ``f(float32_array, 2.0)`` picks float32). Register it as a pipeline op by
stacking ``@flowgpu.op("name")`` on top.

>>> import numpy as np, flowgpu
>>> @flowgpu.vectorize(["float32(float32, float32)", "float64(float64, float64)"])
... def mul_add(a, b):
...     return a * b + 1
>>> mul_add(np.float32([1, 2]), np.float32([3, 4]))
array([4., 9.], dtype=float32)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.backend import import_cupy
from flowgpu.errors import KernelError
from flowgpu.kernels import _numba as nb

__all__ = ["vectorize", "Vectorized"]


class Vectorized(nb.NumbaUfunc):
    """A ufunc-like callable made by :func:`vectorize` (``signatures`` None: compiled per input dtypes)."""

    KIND = "vectorize"

    def __init__(self, pyfunc: Callable, signatures: Sequence[Any] | None = None, *,
                 name: str | None = None):
        if not callable(pyfunc):
            raise KernelError(f"vectorize needs a Python function, got {pyfunc!r}")
        super().__init__(pyfunc, name, "vectorized")
        self.__signature__ = nb.describe(pyfunc)
        if self.__signature__ is None:
            raise KernelError(f"vectorize: cannot read the parameters of {pyfunc!r}")
        self.nin = len(self.__signature__.parameters)
        self.signatures = None
        if signatures:
            self.signatures = self.parse_signatures(signatures, None, f"{self.__name__}() takes")

    def __repr__(self) -> str:
        sigs = "lazy" if self.signatures is None else "; ".join(str(s) for s in self.signatures)
        return f"<flowgpu.vectorize {self.__name__} [{sigs}]>"

    def resolve(self, *args: Any) -> nb.Signature:
        """The signature a call with ``args`` runs (compiling nothing but type inference)."""
        if len(args) != self.nin:
            raise KernelError(f"{self.__name__}() takes {self.nin} inputs, got {len(args)}")
        if self.signatures is not None:
            return nb.select_signature(self.signatures, args, self.__name__)
        ins = nb.concrete_dtypes(args)
        out = nb.infer_return_dtype(self.pyfunc, ins, self.__name__, self._key)
        return nb.Signature(ins, (out,), None)

    def __call__(self, *args: Any) -> Any:
        sig = self.resolve(*args)
        if any(isinstance(a, da.Array) for a in args):
            return nb.map_broadcast(functools.partial(self.apply, sig), args, sig.outputs[0], name=self.__name__,
                                    who=f"{self.__name__}()", token=(self._key, str(sig)))
        if all(nb.is_scalar(a) for a in args):
            return self.apply(sig, *args)[()]
        return self.apply(sig, *args)

    def numba_args(self, sig: nb.Signature) -> tuple:
        from numba.np.numpy_support import from_dtype

        return ([from_dtype(sig.outputs[0])(*(from_dtype(d) for d in sig.inputs))],)  # what numba.vectorize takes

    def _apply_cuda(self, sig: nb.Signature, chunks: Sequence[Any]):
        cp = import_cupy()
        shape = np.broadcast_shapes(*(np.shape(c) for c in chunks))
        out = cp.empty(shape, dtype=sig.outputs[0])
        if out.size == 0:
            return out
        # numba-cuda launches over flat contiguous arrays; broadcasting it would do through the host
        args = [nb.dense(c, shape, d, cp).reshape(-1) for c, d in zip(chunks, sig.inputs)]
        ufunc = self.compiled("cuda", sig)
        ufunc(*(nb.numba_view(a) for a in args), out=nb.numba_view(out.reshape(-1)),
              stream=nb.numba_stream())
        return out


def vectorize(signatures: Sequence[Any] | str | Callable | None = None, *,
              name: str | None = None) -> Any:
    """Decorator: make a scalar Python function a ufunc over chunked (dask) arrays, GPU or CPU.

    ``signatures`` (``["float32(float32, float32)", ...]``) are tried in order like a ufunc's loops;
    without them it compiles per call's dtypes (return dtype inferred by numba). ``name`` names graph
    keys and messages. Lazy for dask arrays, computed at once for NumPy or CuPy arrays.
    """
    if callable(signatures) and hasattr(signatures, "__code__"):  # bare @vectorize
        return Vectorized(signatures, None, name=name)
    return lambda pyfunc: Vectorized(pyfunc, signatures, name=name)
