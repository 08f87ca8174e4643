"""Reductions (sum, mean, prod, min, max, std, var, their NaN-skipping ``nan*`` forms, any, all, argmin,
argmax) and the running scans cumsum and cumprod, as dask's with the chunks' own module.

Each is dask's own, its tree of ``split_every`` included, so a spec's step gives the bits the same
code in Python gives (a Session runs a full reduction's tree in one task). Those that fusion folds
into a chain of elementwise steps (sum, mean, min, max, prod) carry ``reduction=<name>`` in ``Op.meta``.
"""

from __future__ import annotations

from typing import Any

import dask.array as da

from flowgpu.ops._common import Array, Axis, DType, axis_arg, defop, dtype_arg, same_backend

__all__ = ["sum", "mean", "min", "max", "std", "var", "prod", "nansum", "nanmean", "nanprod", "nanmin", "nanmax",
           "nanstd", "nanvar", "any", "all", "argmin", "argmax", "cumsum", "cumprod"]

_DOC = """{summary}

``axis``: the axes to reduce, by number or a labelled input's dimension name (``time``); None: all
(a 0-d result). ``keepdims`` keeps them with length 1, so the result broadcasts against ``x``.{extra}

Returns
-------
dask.array.Array
    As ``numpy.{np_name}`` would give on the whole array.
"""

_DTYPE_DOC = """
``dtype``: the accumulator and result dtype (``float64`` sums float32 data in double precision);
None follows NumPy."""

_DDOF_DOC = """
``ddof``: the divisor is ``N - ddof`` (1 for the sample estimate)."""


def _prepare(name: str, x: Any, axis: Any) -> tuple[da.Array, Any]:
    """``x`` in the session's backend, and the axes."""
    (x,) = same_backend(x)
    return x, axis_arg(name, axis, x.ndim)


def _with_dtype(name: str, dask_func, summary: str) -> Any:
    def func(x: Array, *, axis: Axis = None, keepdims: bool = False, dtype: DType | None = None) -> Array:
        x, ax = _prepare(name, x, axis)
        return dask_func(x, axis=ax, keepdims=keepdims, dtype=dtype_arg(name, dtype))

    return defop(name, _DOC.format(summary=summary, np_name=name, extra=_DTYPE_DOC), kind="reduction",
                 reduction=name)(func)


def _plain(name: str, dask_func, summary: str) -> Any:
    def func(x: Array, *, axis: Axis = None, keepdims: bool = False) -> Array:
        x, ax = _prepare(name, x, axis)
        return dask_func(x, axis=ax, keepdims=keepdims)

    return defop(name, _DOC.format(summary=summary, np_name=name, extra=""), kind="reduction", reduction=name)(func)


def _moment(name: str, dask_func, summary: str) -> Any:
    def func(x: Array, *, axis: Axis = None, keepdims: bool = False, ddof: int = 0,
             dtype: DType | None = None) -> Array:
        x, ax = _prepare(name, x, axis)
        return dask_func(x, axis=ax, keepdims=keepdims, ddof=ddof, dtype=dtype_arg(name, dtype))

    return defop(name, _DOC.format(summary=summary, np_name=name, extra=_DDOF_DOC + _DTYPE_DOC), kind="reduction")(func)


sum = _with_dtype("sum", da.sum, "Sum of the elements over the given axes.")  # noqa: A001
mean = _with_dtype("mean", da.mean, "Arithmetic mean over the given axes.")
prod = _with_dtype("prod", da.prod, "Product of the elements over the given axes.")
min = _plain("min", da.min, "Smallest element over the given axes.")  # noqa: A001
max = _plain("max", da.max, "Largest element over the given axes.")  # noqa: A001
std = _moment("std", da.std, "Standard deviation over the given axes.")
var = _moment("var", da.var, "Variance over the given axes.")
nansum = _with_dtype("nansum", da.nansum, "Sum over the given axes, NaNs counted as zero.")
nanmean = _with_dtype("nanmean", da.nanmean, "Mean over the given axes, NaNs left out.")
nanprod = _with_dtype("nanprod", da.nanprod, "Product over the given axes, NaNs counted as one.")
nanmin = _plain("nanmin", da.nanmin, "Smallest element over the given axes, NaNs left out.")
nanmax = _plain("nanmax", da.nanmax, "Largest element over the given axes, NaNs left out.")
nanstd = _moment("nanstd", da.nanstd, "Standard deviation over the given axes, NaNs left out.")
nanvar = _moment("nanvar", da.nanvar, "Variance over the given axes, NaNs left out.")
any = _plain("any", da.any, "Whether any element over the given axes is true (not zero).")  # noqa: A001
all = _plain("all", da.all, "Whether every element over the given axes is true (not zero).")  # noqa: A001

_ARG_DOC = """{summary}

``axis`` by number or a labelled input's dimension name; None searches the flattened array (giving
the flat index).

Returns
-------
dask.array.Array
    int64 indices, as ``numpy.{np_name}`` gives.
"""


def _arg(name: str, dask_func, summary: str) -> Any:
    def func(x: Array, *, axis: int | str | None = None, keepdims: bool = False) -> Array:
        (x,) = same_backend(x)
        return dask_func(x, axis=axis_arg(name, axis, x.ndim), keepdims=keepdims)

    return defop(name, _ARG_DOC.format(summary=summary, np_name=name), kind="reduction")(func)


argmin = _arg("argmin", da.argmin, "Index of the smallest element along an axis (the first, on ties).")
argmax = _arg("argmax", da.argmax, "Index of the largest element along an axis (the first, on ties).")

_SCAN_DOC = """{summary}

``axis`` by number or a labelled input's dimension name; None runs along the flattened array (a 1-D
result). ``dtype``: the accumulator and result dtype; None follows NumPy (small integers as int64).

Returns
-------
dask.array.Array
    As ``numpy.{np_name}`` gives.
"""


def _scan(name: str, dask_func, summary: str) -> Any:
    def func(x: Array, *, axis: int | str | None = None, dtype: DType | None = None) -> Array:
        (x,) = same_backend(x)
        return dask_func(x, axis=axis_arg(name, axis, x.ndim), dtype=dtype_arg(name, dtype))

    return defop(name, _SCAN_DOC.format(summary=summary, np_name=name), kind="array")(func)


cumsum = _scan("cumsum", da.cumsum, "Running sum along an axis.")
cumprod = _scan("cumprod", da.cumprod, "Running product along an axis.")
