"""Per-chunk functions written for PyTorch or JAX, fed through DLPack without a copy.

``dlpack_map(fn, x, framework="torch")`` hands each chunk to ``fn`` as a tensor on the same memory
(CUDA for CuPy chunks) and turns the result back into the chunk's array type; DLPack's stream
argument orders the work. ``framework="array"`` uses the chunk's own NumPy/CuPy. JAX preallocates
most of the GPU: importing it here sets ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless set.

>>> import numpy as np, flowgpu
>>> flowgpu.dlpack_map(lambda a: a * 2, np.arange(4.0), framework="array")
array([0., 2., 4., 6.])
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

from flowgpu.backend import empty_meta, import_cupy, is_cupy
from flowgpu.errors import KernelError
from flowgpu.kernels import _numba as nb

__all__ = ["dlpack_map", "DLPackFunction", "FRAMEWORKS", "to_framework", "from_framework"]

FRAMEWORKS = ("torch", "jax", "array")
_INSTALL = {"torch": "pip install torch", "jax": "pip install 'jax[cuda12]' (or plain jax for CPU)"}


def _framework(name: str):
    """The framework's module (checked by DLPackFunction), imported on first use; None for "array"."""
    if name == "array":
        return None
    if name == "jax" and "jax" not in sys.modules:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise KernelError(f"dlpack_map framework={name!r} needs {name}, which is not installed "
                          f"here ({e}); {_INSTALL[name]}") from None


def to_framework(chunk: Any, framework: str) -> Any:
    """A NumPy or CuPy chunk as a ``framework`` tensor on the same memory (no copy)."""
    if nb.is_scalar(chunk):
        return chunk
    mod = _framework(framework)
    if framework == "torch":
        return mod.from_dlpack(chunk)
    if framework == "jax":
        import jax.dlpack

        return jax.dlpack.from_dlpack(chunk)
    xp = import_cupy() if is_cupy(chunk) else np
    return xp.from_dlpack(chunk)


def from_framework(result: Any, cupy: bool) -> Any:
    """A framework tensor as a CuPy (``cupy=True``) or NumPy array, copied only from the other device."""
    detach = getattr(result, "detach", None)
    if callable(detach):  # torch tensors that require grad cannot be exported
        result = detach()
    if cupy:
        cp = import_cupy()
        if is_cupy(result):
            return result
        try:
            return cp.from_dlpack(result)
        except Exception:  # a host tensor: copy it over
            return cp.asarray(_to_host(result))
    if isinstance(result, np.ndarray):
        return result
    try:
        return np.from_dlpack(result)
    except Exception:  # a device tensor, or something without DLPack
        return _to_host(result)


def _to_host(result: Any) -> np.ndarray:
    for attr in ("cpu", "get"):
        f = getattr(result, attr, None)
        if callable(f):
            result = f()
            break
    try:
        return np.from_dlpack(result)
    except Exception:
        return np.asarray(result)


class DLPackFunction(nb.Named):
    """``fn`` applied chunk by chunk through DLPack; made by :func:`dlpack_map`."""

    def __init__(self, fn: Callable, framework: str = "torch", *, dtype: Any = None,
                 name: str | None = None, **map_blocks_kwargs: Any):
        if not callable(fn):
            raise KernelError(f"dlpack_map needs a function, got {fn!r}")
        if framework not in FRAMEWORKS:
            raise KernelError(f"dlpack_map framework={framework!r}: choose one of "
                              f"{', '.join(FRAMEWORKS)}")
        self.fn = fn
        self.framework = framework
        self.dtype = np.dtype(dtype) if dtype is not None else None
        self.map_blocks_kwargs = map_blocks_kwargs
        self._stand_for(fn, name or getattr(fn, "__name__", "dlpack_fn"))
        self.__signature__ = nb.describe(fn)

    def __repr__(self) -> str:
        return f"<flowgpu.dlpack_map {self.__name__} via {self.framework}>"

    def apply(self, *chunks: Any, **kwargs: Any) -> Any:
        """Run ``fn`` on in-memory chunks (NumPy or CuPy) and return the chunk type back."""
        cupy = any(is_cupy(c) for c in chunks)
        if cupy:
            cp = import_cupy()
            chunks = tuple(cp.asarray(c) if isinstance(c, np.ndarray) else c for c in chunks)
        result = self.fn(*(to_framework(c, self.framework) for c in chunks), **kwargs)
        if isinstance(result, (tuple, list)):
            raise KernelError(f"{self.__name__}: dlpack_map functions return one tensor per chunk, "
                              f"got a {type(result).__name__}")
        out = from_framework(result, cupy)
        if self.dtype is not None and out.dtype != self.dtype:
            out = out.astype(self.dtype)
        return out

    def _meta(self, dargs: list, kwargs: dict):
        """The output's meta: from ``dtype=``, or by running ``fn`` on a one-element sample."""
        cupy = nb.any_cupy(dargs)
        arrays = [a for a in dargs if isinstance(a, da.Array)]
        ndim = max(a.ndim for a in arrays)
        if self.dtype is not None:
            return empty_meta(cupy, self.dtype, ndim)
        xp = import_cupy() if cupy else np
        sample = [xp.ones((1,) * a.ndim, dtype=a.dtype) if isinstance(a, da.Array) else a
                  for a in dargs]
        try:
            dtype = self.apply(*sample, **kwargs).dtype
        except Exception:
            dtype = arrays[0].dtype
        return empty_meta(cupy, dtype, ndim)

    def __call__(self, *arrays: Any, **kwargs: Any) -> Any:
        """Apply to dask arrays (lazy) or NumPy/CuPy arrays (at once); ``kwargs`` go to ``fn``."""
        if not arrays:
            raise KernelError(f"{self.__name__}: give at least one array")
        if not any(isinstance(a, da.Array) for a in arrays):
            return self.apply(*arrays, **kwargs)
        dargs = nb.as_dask_args(arrays)
        options = dict(self.map_blocks_kwargs)
        meta = options.pop("meta", None)
        if meta is None:
            meta = self._meta(dargs, kwargs)
        name = f"{self.__name__}-{tokenize(self._key, self.framework, *dargs, kwargs)}"
        return da.map_blocks(functools.partial(self.apply, **kwargs), *dargs, meta=meta,
                             dtype=meta.dtype, name=name, **options)


def dlpack_map(fn: Callable | None = None, *arrays: Any, framework: str = "torch", dtype: Any = None,
               name: str | None = None, **map_blocks_kwargs: Any) -> Any:
    """Apply a PyTorch / JAX function to each chunk, passing chunks through DLPack (no copy).

    ``fn`` takes one tensor per input array (scalars pass as they are) and returns one; leave it
    out for a decorator. ``framework``: ``"torch"``, ``"jax"`` or ``"array"`` (the chunk's own
    library). ``dtype``: the output's (default: ``fn`` run on a one-element sample).
    ``map_blocks_kwargs`` go to :func:`dask.array.map_blocks` (``chunks=``, ``drop_axis=``, ``meta=``...).
    With arrays, the result (lazy for dask inputs); without, a :class:`DLPackFunction`.
    """
    make = functools.partial(DLPackFunction, framework=framework, dtype=dtype, name=name, **map_blocks_kwargs)
    if fn is None:
        return make
    return make(fn)(*arrays) if arrays else make(fn)
