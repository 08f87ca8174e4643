"""The ``expr`` op: an arithmetic expression over named inputs, compiled into one kernel per chunk.

In a pipeline::

    energy:
      op: expr
      inputs: [x, y]
      args: {expression: "sqrt(x**2 + y**2) * 0.5"}

The step's inputs are passed by name (the op's inputs are ``("**",)``), so the expression uses the
names of the steps or sources it reads. Numbers may be written in the text or passed as further
arguments. The language is that of :mod:`flowgpu.fusion.language` (no attribute access, no indexing,
no unknown names); see :func:`flowgpu.fusion.fused_elementwise` for dtypes and broadcasting (over
complex inputs, which no kernel takes, the expression runs as dask's own operations).
"""

from __future__ import annotations

from typing import Any

import dask.array as da

from flowgpu.errors import OpError
from flowgpu.fusion import fused_elementwise
from flowgpu.ops.registry import register

__all__ = ["expr"]


def expr(expression: str, **arrays: Any) -> da.Array:
    """Evaluate an elementwise expression over named arrays, fused into one kernel per chunk.

    Parameters
    ----------
    expression : str
        e.g. ``"(x * 2 + 1) ** 2 - x"``; names refer to the keyword arguments.
    **arrays : dask arrays (or NumPy/CuPy arrays, or numbers) named as in ``expression``.

    Returns
    -------
    dask.array.Array
        The elementwise result, with NumPy's dtype for the unfused expression.

    Examples
    --------
    >>> import numpy as np, dask.array as da
    >>> from flowgpu.ops.expression import expr
    >>> expr("x * k + 1", x=da.from_array(np.array([1.0, 2.0])), k=3).compute()
    array([4., 7.])
    """
    if not isinstance(expression, str):
        raise OpError(f"expr: 'expression' must be a string such as 'x * 2 + 1', not {expression!r}")
    return fused_elementwise(expression, arrays)


register("expr", expr, kind="elementwise", inputs=("**",))
