"""What runs on one chunk: :class:`FusedChunk`, the picklable task function of a fused kernel.

It carries the expression's text, never a compiled kernel (those are cached per process in
``compiled``), so tasks pickle small. A kernel its compiler refuses is computed unfused (one warning
per expression); a rewritten chain carries dask's own functions (:class:`Chain`) for chunks no
kernel takes (complex, datetime, object, ...).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from flowgpu.backend import import_cupy, is_cupy
from flowgpu.errors import KernelError
from flowgpu.fusion import tiled
from flowgpu.fusion.codegen import C_TYPES, Unfusable
from flowgpu.fusion.compiled import cuda_combine, elementwise_kernel, identity, reduce_kernel, reduction_dtypes
from flowgpu.fusion.language import Expr, Name, parse

__all__ = ["FusedChunk", "Chain", "reduce_chunk", "kernel_blocks"]

_ROW = 1 << 16  # elements per row when a flat GPU chunk is reduced as (rows, _ROW)
_ACCUMULATING = frozenset({"sum", "prod", "nansum", "nanprod"})  # NumPy's functions that take dtype=
KERNEL_DTYPES = frozenset(np.dtype(name) for name in C_TYPES)  # what the code generators take
_warned: set[str] = set()  # expressions whose kernel did not compile (warned once each)


class Chain:
    """dask's own functions of a rewritten chain: ``chain(*blocks)`` calls them in dask's order.

    ``args`` are ``("block", i)``, ``("value", scalar)`` or ``("call", inner Chain)``.
    """

    def __init__(self, func: Any, args: tuple):
        self.func, self.args = func, args

    def __call__(self, *blocks: Any) -> Any:
        return self.func(*[blocks[a] if kind == "block" else a(*blocks) if kind == "call" else a
                           for kind, a in self.args])


def kernel_blocks(blocks: tuple) -> bool:
    """Whether a kernel takes these chunks: plain NumPy or CuPy arrays of the dtypes the code
    generators know (numba has no float16)."""
    return all((_cupy_ndarray(b) or (type(b) is np.ndarray and b.dtype != np.float16)) and b.dtype in KERNEL_DTYPES
               for b in blocks)


def _cupy_ndarray(b: Any) -> bool:
    """A plain ``cupy.ndarray`` (not a cupyx sparse matrix, whose module also starts with "cupy")."""
    return type(b).__name__ == "ndarray" and type(b).__module__.split(".")[0] == "cupy"


class FusedChunk:
    """Picklable per-chunk function; compiled kernels live in the module cache, never in the task."""

    def __init__(self, text: str, arrays: tuple[str, ...], scalars: tuple, out_dtype: np.dtype,
                 reduction: str | None = None, axes: tuple[int, ...] = (), fallback: Chain | None = None,
                 cast: bool = False, quiet: bool = False):
        self.quiet = quiet  # raise no floating-point warnings (a second pass over values already checked)
        self.fallback = fallback  # dask's own functions, for chunks no kernel takes
        self.cast = cast  # out_dtype is not the expression's own (a dtype= was given)
        self.text = text
        self.arrays = arrays
        self.scalars = scalars
        self.out_dtype = np.dtype(out_dtype) if out_dtype is not None else None  # None: NumPy's, per chunk
        self.reduction = reduction
        self.axes = axes

    def __dask_tokenize__(self):
        return ("flowgpu-fused", self.text, self.arrays, repr(self.scalars), str(self.out_dtype),
                self.reduction, self.axes)

    def __repr__(self) -> str:
        tail = f", reduction={self.reduction!r}" if self.reduction else ""
        return f"fused({self.text!r}{tail})"

    def env(self, blocks: tuple) -> dict[str, Any]:
        return {**dict(zip(self.arrays, blocks)), **dict(self.scalars)}

    def __call__(self, *blocks: Any) -> Any:
        backend = "cupy" if any(is_cupy(b) for b in blocks) else "numpy"
        xp = import_cupy() if backend == "cupy" else np
        given = blocks
        if self.fallback is not None and not kernel_blocks(blocks):
            return self.fallback(*blocks)  # complex, datetime, object, masked, ...: dask's own functions
        blocks = tuple(xp.asarray(b) for b in blocks) if backend == "cupy" else blocks
        dtypes = tuple(b.dtype for b in blocks)
        try:
            expr = parse(self.text)
            out_dtype = self.out_dtype
            if out_dtype is None:
                out_dtype = expr.result_dtype({**dict(zip(self.arrays, dtypes)), **dict(self.scalars)})
            shape = np.broadcast_shapes(*(b.shape for b in blocks))
            if self.reduction is not None and any(shape[a] == 0 for a in self.axes):
                acc, _ = reduction_dtypes(self.reduction, out_dtype)  # a zero-size chunk: the identity
                return xp.full(tuple(1 if i in self.axes else s for i, s in enumerate(shape)),
                               identity(self.reduction, acc), dtype=acc)
            if backend == "cupy":  # CuPy's kernels raise no floating-point warnings, fused or not
                return self.run(expr, blocks, dtypes, out_dtype, backend)
            value, flagged = _flags_raised(lambda: self.run(expr, blocks, dtypes, out_dtype, backend), self.quiet)
        except Unfusable:  # NumPy semantics no kernel has (e.g. it raises on some values): the array library's
            return self.unfused(expr, blocks, backend, out_dtype)
        except KernelError:
            if self.fallback is not None:  # a chain no kernel takes: as dask built it
                return self.fallback(*given)
            raise
        except Exception as e:  # a compiler that refuses the code: stay correct, unfused
            if self.text not in _warned:
                _warned.add(self.text)
                warnings.warn(f"flowgpu could not compile a fused kernel for {self.text!r} "
                              f"({type(e).__name__}: {e}); computing it unfused, which is correct but slower",
                              RuntimeWarning, stacklevel=2)
            if self.fallback is not None:
                return self.fallback(*given)
            return self.unfused(expr, blocks, backend, out_dtype)
        if flagged:  # NumPy says which warnings its own operations give (or raises, as its errstate says)
            self.replay(expr, blocks, out_dtype)
        return value

    def run(self, expr: Expr, blocks: tuple, dtypes: tuple, out_dtype: np.dtype, backend: str) -> Any:
        """The fused kernel on the chunk."""
        if self.reduction is None:
            kern = elementwise_kernel(expr, self.arrays, dtypes, self.scalars, out_dtype, backend)
            if backend == "cupy" and any(b.ndim == 0 for b in blocks):
                # CuPy hands 0-d arrays to kernels as (weakly typed) scalars, which typed kernel
                # parameters refuse: pass them as 1-element arrays and restore the shape after.
                shape = np.broadcast_shapes(*(b.shape for b in blocks))
                return kern(*(b.reshape(1) if b.ndim == 0 else b for b in blocks)).reshape(shape)
            return kern(*blocks)
        return reduce_chunk(expr, self.arrays, blocks, self.scalars, out_dtype, self.reduction, self.axes, backend)

    def replay(self, expr: Expr, blocks: tuple, out_dtype: np.dtype) -> None:
        """The operations unfused with NumPy, as dask's tasks run them, for their warnings only: NumPy
        warns (or raises, or calls) for each operation as the caller's ``np.errstate`` says."""
        value = np.asarray(expr.evaluate(self.env(blocks), np))
        value = np.broadcast_to(value, np.broadcast_shapes(value.shape, *(b.shape for b in blocks)))
        if self.reduction is None:
            value.astype(out_dtype, copy=False)
            return
        op = "sum" if self.reduction == "mean" else self.reduction
        if op in _ACCUMULATING:
            getattr(np, op)(value, axis=self.axes, dtype=out_dtype)
        elif op in ("nanmin", "nanmax"):  # dask's chunk functions (NumPy's warn "All-NaN slice")
            (np.fmin if op == "nanmin" else np.fmax).reduce(value.astype(out_dtype), axis=self.axes)
        else:
            getattr(np, op)(value.astype(out_dtype), axis=self.axes)

    def unfused(self, expr: Expr, blocks: tuple, backend: str, out_dtype: np.dtype) -> Any:
        xp = import_cupy() if backend == "cupy" else np
        value = xp.asarray(expr.evaluate(self.env(blocks), xp)).astype(out_dtype, copy=False)
        shape = np.broadcast_shapes(*(b.shape for b in blocks))
        if self.reduction is None:
            return xp.broadcast_to(value, shape).copy() if value.shape != shape else value
        acc, _ = reduction_dtypes(self.reduction, out_dtype)
        op = "sum" if self.reduction == "mean" else self.reduction
        kw = {"dtype": acc} if op in _ACCUMULATING else {}
        return getattr(xp, op)(xp.broadcast_to(value, shape), axis=self.axes, keepdims=True, **kw).astype(
            acc, copy=False)


_FLAGS = {"divide by zero": "divide", "overflow": "over", "underflow": "under", "invalid value": "invalid"}


def _flags_raised(run: Any, quiet: bool = False) -> tuple[Any, bool]:
    """``(run(), whether it raised a floating-point flag the caller's np.errstate does not ignore)``.

    The kernel's flags are not NumPy's warnings (a vectorised NaN comparison raises "invalid"), so a
    flag only says that NumPy should be asked (``FusedChunk.replay``).
    """
    care = {k for k, v in np.geterr().items() if v != "ignore"}
    if quiet or not care:
        with np.errstate(all="ignore"):
            return run(), False
    seen: list[str] = []
    modes = {k: ("call" if k in care else "ignore") for k in ("divide", "over", "under", "invalid")}
    with np.errstate(call=lambda kind, flag: seen.append(kind), **modes):
        value = run()
    return value, any(_FLAGS.get(kind) in care for kind in seen)


def reduce_chunk(expr: Expr, arrays: tuple[str, ...], blocks: tuple, scalars: tuple, val_dtype: np.dtype,
                 reduction: str, axes: tuple[int, ...], backend: str) -> Any:
    """Reduce ``expr`` over ``axes`` of one chunk in one fused kernel; returns the partial (keepdims)."""
    acc, _ = reduction_dtypes(reduction, val_dtype)
    dtypes = tuple(b.dtype for b in blocks)
    shape = np.broadcast_shapes(*(b.shape for b in blocks))
    ndim = len(shape)
    full = set(axes) == set(range(ndim))
    out_shape = tuple(1 if i in axes else s for i, s in enumerate(shape))
    combine = "sum" if reduction == "mean" else reduction  # NumPy's / CuPy's function of the partials
    n = int(np.prod(shape, dtype=np.int64))
    if backend == "numpy":
        if isinstance(expr.root, Name) and blocks[0].dtype == val_dtype:  # no operation: NumPy's own reduce of
            kw = {"dtype": acc} if combine in _ACCUMULATING else {}   # the chunk as it lies (its strided order)
            return getattr(np, combine)(blocks[0], axis=axes, keepdims=True, **kw).astype(acc, copy=False)
        same = all(b.shape == shape for b in blocks)
        # NumPy reduces the values (a new array, laid out as the inputs are) in memory order: C order,
        # or F order where every input is F-ordered (a transposed block), which a transpose makes C
        order = "C" if all(b.flags.c_contiguous for b in blocks) else \
            "F" if all(b.flags.f_contiguous for b in blocks) else None
        if full and same and order:
            kern = reduce_kernel(expr, arrays, dtypes, scalars, val_dtype, reduction, backend, 1)
            flat = [b.reshape(-1) if order == "C" else b.T.reshape(-1) for b in blocks]
            return np.full(out_shape, kern(*flat), dtype=acc)
        if full and same and ndim == 2:  # strided 2-D chunks (e.g. column blocks of a row-major array)
            rows = all(b.strides[1] == b.itemsize for b in blocks)
            kern = reduce_kernel(expr, arrays, dtypes, scalars, val_dtype, reduction, backend, "rows" if rows else 2)
            return np.full(out_shape, kern(*blocks), dtype=acc)
        ew = elementwise_kernel(expr, arrays, dtypes, scalars, val_dtype, "numpy")
        kw = {"dtype": acc} if combine in _ACCUMULATING else {}
        return getattr(np, combine)(ew(*blocks), axis=axes, keepdims=True, **kw).astype(acc, copy=False)
    cp = import_cupy()
    if full and tiled.applies(blocks, shape):  # some inputs transposed: read them in tiles
        combine_c, ident = cuda_combine(reduction, acc)
        part = tiled.tiled_reduce(expr, arrays, blocks, scalars, val_dtype, reduction, acc, combine_c, ident)
        if part is not None:
            return part.reshape(out_shape).astype(acc, copy=False)
    kern = reduce_kernel(expr, arrays, dtypes, scalars, val_dtype, reduction, backend)
    if any(b.shape != shape for b in blocks):
        blocks = tuple(cp.broadcast_arrays(*blocks))
    if full and n >= 2 * _ROW and all(b.flags.c_contiguous for b in blocks):
        # a single-output ReductionKernel would run on few blocks: reduce rows of _ROW, then the rows
        rows = n // _ROW
        flat = [b.reshape(-1) for b in blocks]
        part = kern(*[f[: rows * _ROW].reshape(rows, _ROW) for f in flat], axis=1)
        if rows * _ROW < n:
            tail = kern(*[f[rows * _ROW:] for f in flat])
            part = cp.concatenate([part, tail.reshape(1)])
        return getattr(cp, combine)(part).reshape(out_shape).astype(acc, copy=False)
    if full and ndim >= 2:
        part = kern(*blocks, axis=tuple(range(1, ndim)))
        return getattr(cp, combine)(part).reshape(out_shape).astype(acc, copy=False)
    return kern(*blocks, axis=tuple(axes), keepdims=True)
