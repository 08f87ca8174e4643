"""``map_blocks`` with a user function named by import path (``"package.module:function"`` or
``"package.module.function"``), resolved by :func:`flowgpu.registry.import_object` like every
import path in flowgpu (a module beside the spec file is importable).

A user function gets one block of each input (NumPy or CuPy, whichever the chunks are) and returns a
block. To work on both, pick the module from the block::

    from flowgpu.backend import array_module

    def soft_threshold(block, t=0.1):
        xp = array_module(block)
        return xp.sign(block) * xp.maximum(xp.abs(block) - t, 0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dask.array as da

from flowgpu.errors import OpError
from flowgpu.ops._common import Array, DType, defop, dtype_arg, meta_like, same_backend
from flowgpu.registry import import_object

__all__ = ["map_blocks"]


def _axes(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


@defop("map_blocks", kind="user")
def map_blocks(*arrays: Array, function: str, dtype: DType | None = None,
               drop_axis: int | list[int] | None = None, new_axis: int | list[int] | None = None,
               chunks: list | tuple | None = None, kwargs: dict | None = None) -> Array:
    """Apply a user function, given by import path, to every block of the inputs.

    Parameters
    ----------
    *arrays : arrays
        Blocks with the same index are passed together, ``function(block_a, block_b, **kwargs)``;
        inputs should have matching chunks (dask aligns them when they broadcast).
    function : str
        ``"package.module:function"`` or ``"package.module.function"``; it must be importable on the
        workers too. Use ``flowgpu.backend.array_module(block)`` inside it to work on NumPy and CuPy.
    dtype : str, optional
        The dtype of the result; when omitted dask calls the function on an empty block to find it.
    drop_axis, new_axis : int or list of int, optional
        Axes the function removes from, or adds to, each block (as in ``dask.array.map_blocks``).
    chunks : list, optional
        The result's chunks when the function changes block shapes.
    kwargs : mapping, optional
        Keyword arguments passed to the function.

    Returns
    -------
    dask.array.Array
    """
    if not arrays:
        raise OpError("op 'map_blocks': give at least one input array")
    func: Callable = import_object(function, what="function")
    if not callable(func):
        raise OpError(f"op 'map_blocks': {function!r} is a {type(func).__name__}, not a function")
    arrays = tuple(same_backend(*arrays))
    dt = dtype_arg("map_blocks", dtype)
    drop, new = _axes(drop_axis), _axes(new_axis)
    options: dict[str, Any] = {}
    if dt is not None:
        options["meta"] = meta_like(arrays[0], dt, arrays[0].ndim - len(drop) + len(new))
        options["dtype"] = dt
    if chunks is not None:
        options["chunks"] = tuple(tuple(c) if isinstance(c, list) else c for c in chunks)
    try:
        return da.map_blocks(func, *arrays, drop_axis=drop, new_axis=new or None, **options, **(kwargs or {}))
    except (ValueError, TypeError) as e:
        raise OpError(f"op 'map_blocks': applying {function!r}: {e}") from None
