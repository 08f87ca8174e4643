"""``map_blocks`` with a user function named by import path (resolved by
:func:`flowgpu.registry.import_object`). The function gets one block of each input, NumPy or CuPy:
``flowgpu.backend.array_module(block)`` gives the module to work on either.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import cloudpickle
import dask.array as da
import numpy as np
from dask.base import tokenize

from flowgpu.errors import ArgumentError, OpError, RunError, did_you_mean
from flowgpu.ops._common import Array, DType, defop, dtype_arg, meta_like, same_backend
from flowgpu.registry import import_object, pickled_by_value

__all__ = ["map_blocks"]


class _Checked:
    """The user function, checking that each block it returns has the dtype and ndim the step declared
    (dask never calls it to find them out: validate and plan run no user code)."""

    def __init__(self, func: Callable, path: str, dtype: np.dtype, ndim: int):
        self.func, self.path, self.dtype, self.ndim = func, path, dtype, ndim
        self.__name__ = getattr(func, "__name__", "map_blocks")
        # dask passes block_info / block_id to a function whose signature asks for them; a builtin
        # without one (TypeError, ValueError): dask passes neither, as to the function itself
        with contextlib.suppress(TypeError, ValueError):
            self.__signature__ = inspect.signature(func)

    def __call__(self, *blocks: Any, **kwargs: Any) -> Any:
        try:
            out = self.func(*blocks, **kwargs)
        except Exception as e:
            e.add_note(f"in map_blocks function {self.path!r}")  # the run's summary names the step from it
            raise
        dtype, ndim = getattr(out, "dtype", None), getattr(out, "ndim", None)
        if dtype != self.dtype or ndim != self.ndim:
            raise RunError(f"map_blocks function {self.path!r} returned a block of dtype {dtype} with {ndim} "
                           f"dimension(s); the step declares dtype {self.dtype} (args.dtype; default: its "
                           f"input's) and {self.ndim} dimension(s) (drop_axis/new_axis); declare what it returns")
        return out

    def __dask_tokenize__(self) -> Any:
        return ("flowgpu-map-blocks", self.path, str(self.dtype), self.ndim, tokenize(self.func))

    def __reduce__(self) -> tuple:
        code = pickled_by_value(self.func)  # a module of the user's own travels with the task
        if code is None:
            return (_Checked, (self.func, self.path, self.dtype, self.ndim))
        source = getattr(getattr(self.func, "__code__", None), "co_filename", None)
        return (_unpickled, (code, self.path, self.dtype, self.ndim, source))


def _unpickled(code: bytes, path: str, dtype: np.dtype, ndim: int, source: str | None = None) -> _Checked:
    func = cloudpickle.loads(code)
    if source and hasattr(func, "__code__"):  # cloudpickle drops it; a failure says where it raised
        func.__code__ = func.__code__.replace(co_filename=source)
    return _Checked(func, path, dtype, ndim)


def _axes(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def _check_call(func: Callable, function: str, blocks: int, kwargs: dict) -> None:
    """Refuse ``kwargs`` (or a number of blocks) that ``func``'s signature does not take, before anything
    runs (validate checks it from the source, without importing); a signature that cannot be read passes."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*range(blocks), **kwargs)
    except TypeError as e:
        names = [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        hint = did_you_mean(next((k for k in kwargs if k not in sig.parameters), ""), names)
        raise ArgumentError(f"{function} ({', '.join(sig.parameters)}) called with {blocks} block(s) and kwargs "
                            f"{sorted(kwargs)}: {e}" + (f"; {hint}" if hint else ""),
                            "kwargs" if kwargs else None) from None


@defop("map_blocks", kind="user")
def map_blocks(*arrays: Array, function: str, dtype: DType | None = None,
               drop_axis: int | list[int] | None = None, new_axis: int | list[int] | None = None,
               chunks: list | tuple | None = None, kwargs: dict | None = None) -> Array:
    """Apply a user function, given by import path, to every block of the inputs.

    Blocks with the same index are passed together, ``function(block_a, block_b, **kwargs)``.
    ``function`` (``"package.module:function"``) must be importable on the workers too. ``dtype``: that
    of the blocks it returns (default: the inputs' result type); the function is never called to find
    it out, and a block of another dtype fails the run. ``drop_axis``/``new_axis``/``chunks`` as in
    ``dask.array.map_blocks``.

    Returns
    -------
    dask.array.Array
    """
    if not arrays:
        raise OpError("op 'map_blocks': give at least one input array")
    func: Callable = import_object(function, what="function")
    if not callable(func):
        raise OpError(f"op 'map_blocks': {function!r} is a {type(func).__name__}, not a function")
    _check_call(func, function, len(arrays), kwargs or {})
    arrays = tuple(same_backend(*arrays))
    dt = dtype_arg("map_blocks", dtype)
    dt = np.result_type(*(a.dtype for a in arrays)) if dt is None else dt
    drop, new = _axes(drop_axis), _axes(new_axis)
    ndim = max(a.ndim for a in arrays) - len(drop) + len(new)
    options: dict[str, Any] = {"meta": meta_like(arrays[0], dt, ndim), "dtype": dt}
    if chunks is not None:
        options["chunks"] = tuple(tuple(c) if isinstance(c, list) else c for c in chunks)
    try:
        return da.map_blocks(_Checked(func, function, dt, ndim), *arrays, drop_axis=drop, new_axis=new or None,
                             **options, **(kwargs or {}))
    except (ValueError, TypeError) as e:
        raise OpError(f"op 'map_blocks': applying {function!r}: {e}") from None
