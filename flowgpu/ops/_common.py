"""Helpers shared by the built-in op modules: registering with argument checks, turning inputs into
dask arrays on one backend, and normalising axis arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.arrays.movement import to_cupy
from flowgpu.backend import empty_meta, is_cupy
from flowgpu.errors import OpError
from flowgpu.ops.registry import register
from flowgpu.ops.signature import Array, checked

DType = str | type | np.dtype
Dim = int | str  # an axis by number, or by dimension name (labelled inputs: flowgpu.ops.labels)
Axis = Dim | list[Dim] | tuple[Dim, ...] | None


def defop(name: str, doc: str | None = None, **options: Any) -> Callable[[Callable], Callable]:
    """Register a built-in op under ``name``, wrapped so bad arguments raise :class:`OpError`. With
    ``doc``, the function (one a factory made) takes the op's name and that docstring."""

    def deco(func: Callable) -> Callable:
        if doc is not None:
            func.__name__ = func.__qualname__ = name
            func.__doc__ = doc
        wrapped = checked(name, func)
        register(name, wrapped, **options)
        return wrapped

    return deco


def as_dask(x: Any) -> da.Array:
    """A dask array for ``x``: dask arrays pass through, a CuPy array becomes one chunk."""
    if isinstance(x, da.Array):
        return x
    if is_cupy(x):
        return da.from_array(x, chunks=x.shape, asarray=False)
    return da.from_array(np.asarray(x), chunks="auto")


def same_backend(*xs: Any) -> list[Any]:
    """Inputs on one backend: when any holds CuPy chunks, the others move to the GPU (scalars stay)."""
    xs = [as_dask(x) if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.generic) else x
          for x in xs]
    if any(isinstance(x, da.Array) and is_cupy(x._meta) for x in xs):
        xs = [to_cupy(x) if isinstance(x, da.Array) else x for x in xs]  # through pinned staging
    return xs


def meta_like(x: da.Array, dtype: Any = None, ndim: int | None = None):
    """An empty array of ``x``'s chunk type, for dask's ``meta=``."""
    return empty_meta(is_cupy(x._meta), x.dtype if dtype is None else dtype, x.ndim if ndim is None else ndim)


def axis_arg(op_name: str, axis: Any, ndim: int) -> int | tuple[int, ...] | None:
    """``axis`` as dask takes it (lists become tuples), checked against ``ndim``."""
    if axis is None:
        return None
    items = [axis] if isinstance(axis, (int, np.integer, str)) else list(axis)
    for a in items:
        if isinstance(a, str):
            raise OpError(f"op {op_name!r}: axis {a!r} names a dimension, but the array has no dimension names "
                          "(only a labelled input, e.g. from source: xarray, has them); give a number")
        if not -ndim <= int(a) < ndim:
            raise OpError(f"op {op_name!r}: axis {a} is out of range for an array of {ndim} dimension(s); "
                          f"use 0..{ndim - 1} or negative numbers counting from the end")
    if isinstance(axis, (int, np.integer)):
        return int(axis)
    return tuple(int(a) for a in items)


def dtype_arg(op_name: str, dtype: Any) -> np.dtype | None:
    """``dtype`` as a NumPy dtype, or an OpError naming the bad value."""
    if dtype is None:
        return None
    try:
        return np.dtype(dtype)
    except TypeError:
        raise OpError(f"op {op_name!r}: dtype {dtype!r} is not a dtype; use a name such as 'float32', "
                      "'float64', 'int64' or 'complex64'") from None

