"""Fused elementwise kernels over dask arrays: :func:`fused_elementwise`, one :class:`FusedChunk`
per chunk, optionally fused into a reduction; dtypes, reduction order and warnings are NumPy's.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Mapping
from typing import Any

import dask
import dask.array as da
import dask.core as dask_core
import numpy as np
from dask.array.utils import validate_axis
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from flowgpu.backend import empty_meta, import_cupy, is_cupy
from flowgpu.errors import KernelError
from flowgpu.fusion.chunk import KERNEL_DTYPES, FusedChunk
from flowgpu.fusion.codegen import Unfusable
from flowgpu.fusion.codegen_cpu import to_python
from flowgpu.fusion.compiled import REDUCTIONS, reduction_dtypes
from flowgpu.fusion.graph_tree import MAX_FANIN
from flowgpu.fusion.language import Expr, is_scalar, parse

__all__ = ["fused_elementwise", "combine_all"]

def _split_inputs(expr: Expr, inputs: Mapping[str, Any]) -> tuple[dict[str, da.Array], tuple]:
    arrays: dict[str, da.Array] = {}
    scalars = []
    for name in expr.names:
        value = inputs[name]
        if is_scalar(value) or (isinstance(value, np.ndarray) and value.ndim == 0):
            scalars.append((name, value[()] if isinstance(value, np.ndarray) else value))
            continue
        if not isinstance(value, da.Array):
            if not hasattr(value, "dtype") or not hasattr(value, "shape"):
                raise KernelError(f"input {name!r} of {expr.text!r} is a {type(value).__name__}; "
                                  "give a dask/NumPy/CuPy array or a number")
            value = da.asarray(value)
        arrays[name] = value
    if not arrays:
        raise KernelError(f"expression {expr.text!r} has no array input; give at least one array")
    return arrays, tuple(scalars)


def fused_elementwise(expression: str, inputs: Mapping[str, Any], *, dtype: Any = None,
                      reduction: str | None = None, axis: Any = None, keepdims: bool = False) -> da.Array:
    """Apply ``expression`` (e.g. ``"(x * 2 + 1) ** 2 - x"``) to dask arrays, one fused kernel per chunk.

    ``inputs`` maps names to dask/NumPy/CuPy arrays (broadcast as in NumPy) or numbers (compiled in);
    ``dtype`` casts the values; ``reduction`` (one of :data:`REDUCTIONS`) reduces them over ``axis``
    in the same kernel. Returns a lazy dask array (CuPy chunks for CuPy inputs); over dtypes no kernel
    takes (complex, datetime) it is dask's own operations, unfused.
    """
    if not isinstance(inputs, Mapping):
        raise KernelError(f"inputs must be a mapping of name -> array, not {type(inputs).__name__}")
    expr = parse(expression, names=list(inputs))
    arrays, scalars = _split_inputs(expr, inputs)
    names = tuple(arrays)
    if reduction is not None and reduction not in REDUCTIONS:
        raise KernelError(f"reduction={reduction!r} is not one of {', '.join(REDUCTIONS)}")
    if any(a.dtype not in KERNEL_DTYPES for a in arrays.values()):  # complex, datetime, ...: no kernel takes them
        return _unfused(expr, arrays, scalars, dtype, reduction, axis, keepdims)
    types = {**{n: a.dtype for n, a in arrays.items()}, **dict(scalars)}
    natural = expr.result_dtype(types)
    out_dtype = np.dtype(dtype) if dtype is not None else natural
    with contextlib.suppress(Unfusable):  # each chunk is computed by its array library (FusedChunk)
        to_python(expr, types, names, out_dtype=out_dtype)  # refuse complex, strings, ... here
    ndim = max(a.ndim for a in arrays.values())
    arrs = list(arrays.values())
    shape = np.broadcast_shapes(*(a.shape for a in arrs))  # NumPy's message for shapes that do not broadcast
    if reduction is None:
        return _blockwise(FusedChunk(expr.text, names, scalars, out_dtype, cast=out_dtype != natural), arrs, ndim,
                          out_dtype, "fused-")
    axis = tuple(range(ndim)) if axis is None else axis if isinstance(axis, (tuple, list)) else (axis,)
    axes = tuple(sorted({validate_axis(a, ndim) for a in axis}))
    count = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    if count == 0 and reduction in ("min", "max"):  # over no values: dask's own (NumPy raises, so does dask)
        values = _blockwise(FusedChunk(expr.text, names, scalars, out_dtype), arrs, ndim, out_dtype, "fused-")
        return getattr(da, reduction)(values, axis=axes, keepdims=keepdims)
    acc, result = reduction_dtypes(reduction, out_dtype)
    red = FusedChunk(expr.text, names, scalars, out_dtype, reduction=reduction, axes=axes)
    part = _blockwise(red, arrs, ndim, acc, f"fused-{reduction}-", adjust={ndim - 1 - i: 1 for i in axes})
    if len(axes) == ndim and part.npartitions <= MAX_FANIN:
        return _combine_all_graph(part, reduction, result, count, keepdims)
    combine = "sum" if reduction == "mean" else reduction
    # dask's own tree (its split_every): a flatter one rounds otherwise, and the Session runs it in one task
    if combine in ("min", "max"):  # dask's own min/max mistake the empty partials of zero-size chunks
        fn = functools.partial(_extreme, combine)
        total = da.reduction(part, fn, fn, combine=fn, axis=axes, keepdims=keepdims, dtype=part.dtype,
                             meta=part._meta)
    else:
        total = getattr(da, combine)(part, axis=axes, keepdims=keepdims)
    if reduction == "mean":
        total = total / count
    return total.astype(result) if total.dtype != result else total


def _extreme(which: str, x: Any, axis: Any = None, keepdims: bool = False, **kwargs: Any) -> Any:
    """``x.min`` or ``x.max`` (NumPy's or CuPy's), as dask's reduction calls its chunk functions."""
    return getattr(x, which)(axis=axis, keepdims=keepdims)


def _unfused(expr: Expr, arrays: dict, scalars: tuple, dtype: Any, reduction: str | None, axis: Any,
             keepdims: bool) -> da.Array:
    """``expr`` as dask's own operations on the arrays (NumPy's ufuncs dispatch to dask.array)."""
    value = expr.evaluate({**arrays, **dict(scalars)}, np)
    value = value.astype(dtype) if dtype is not None else value
    if reduction is None:
        return value
    return getattr(da, reduction)(value, axis=axis, keepdims=keepdims)


def combine_all(reduction: str, result: Any, count: int, shape: tuple, grid: tuple, split: tuple, *parts: Any) -> Any:
    """Combine every chunk's partial of a full reduction into the final value, in one task, nested as
    dask's tree nests them (``split`` blocks a group per axis, level by level): a flat combine of the
    partials rounds otherwise."""
    xp = import_cupy() if is_cupy(parts[0]) else np
    combine = getattr(xp, "sum" if reduction == "mean" else reduction)
    values = xp.stack([p.reshape(()) for p in parts]).reshape(grid)  # the partials as their blocks lie
    depth = max([1] + [math.ceil(math.log(n, k)) for n, k in zip(grid, split)])  # as dask's _tree_reduce
    for _ in range(depth - 1):
        starts = [range(0, n, k) for n, k in zip(values.shape, split)]
        level = xp.empty(tuple(len(r) for r in starts), dtype=values.dtype)
        for at in itertools.product(*starts):  # each group's partials, concatenated (C order) and combined
            group = values[tuple(slice(i, i + k) for i, k in zip(at, split))]
            level[tuple(i // k for i, k in zip(at, split))] = combine(xp.ascontiguousarray(group))
        values = level
    value = combine(values)
    if reduction == "mean":
        value = value / count
    return xp.asarray(value).astype(result).reshape(shape)


def _combine_all_graph(part: da.Array, reduction: str, result: np.dtype, count: int,
                       keepdims: bool) -> da.Array:
    """The full reduction as ONE task over all partials (cheaper to build and run than ``da.sum``'s tree)."""
    shape = (1,) * part.ndim if keepdims else ()
    name = f"{part.name.split('-', 1)[0]}-{reduction}-all-" + tokenize(part.name, keepdims)
    keys = list(dask_core.flatten(part.__dask_keys__()))
    every = dask.config.get("split_every", 4)  # what dask's own tree over these partials would take
    split = tuple(every.get(i, 2) for i in range(part.ndim)) if isinstance(every, dict) else \
        (max(int(every ** (1 / max(part.ndim, 1))), 2),) * part.ndim  # a 0-d array: no axis to split
    dsk = {(name,) + (0,) * len(shape): (combine_all, reduction, result, count, shape, part.numblocks, split, *keys)}
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=[part])
    meta = empty_meta(is_cupy(part._meta), result, len(shape))
    return da.Array(graph, name, chunks=tuple((1,) for _ in shape), meta=meta)


def _blockwise(fn: FusedChunk, arrs: list[da.Array], ndim: int, dtype: np.dtype, prefix: str,
               adjust: dict | None = None) -> da.Array:
    """One task per (broadcast) chunk, as ``dask.array`` lays out elementwise ops."""
    out_ind = tuple(range(ndim))[::-1]
    args = []
    for a in arrs:
        args += [a, tuple(range(a.ndim))[::-1]]
    meta = empty_meta(any(is_cupy(a._meta) for a in arrs), dtype, ndim)
    return da.blockwise(fn, out_ind, *args, name=prefix + tokenize(fn, *arrs), dtype=dtype, meta=meta,
                        align_arrays=True, adjust_chunks=adjust)
