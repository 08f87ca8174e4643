"""The ``expr`` op: an arithmetic expression over named inputs, compiled into one kernel per chunk
(``args: {expression: "sqrt(x**2 + y**2)"}``). The step's inputs are passed by name (inputs
``("**",)``); the language is :mod:`flowgpu.fusion.language`'s, dtypes and broadcasting those of
:func:`flowgpu.fusion.fused_elementwise`.
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

    >>> import numpy as np, dask.array as da
    >>> from flowgpu.ops.expression import expr
    >>> expr("x * k + 1", x=da.from_array(np.array([1.0, 2.0])), k=3).compute()
    array([4., 7.])
    """
    if not isinstance(expression, str):
        raise OpError(f"expr: 'expression' must be a string such as 'x * 2 + 1', not {expression!r}")
    return fused_elementwise(expression, arrays)


register("expr", expr, kind="elementwise", inputs=("**",))
