"""Linear algebra ops: matrix products over chunked arrays (CuPy chunks use cuBLAS through CuPy)."""

from __future__ import annotations

import dask.array as da

from flowgpu.errors import OpError
from flowgpu.ops._common import Array, defop, same_backend

__all__ = ["matmul", "tensordot"]


@defop("matmul")
def matmul(a: Array, b: Array) -> Array:
    """Matrix product a @ b, broadcasting over leading (stacked) axes as numpy.matmul does.

    dask rechunks the contracted axes when their chunks do not match.

    Returns
    -------
    dask.array.Array
        Each output chunk sums products of chunk pairs along the contracted axis, whose chunks bound
        the memory one task needs.
    """
    a, b = same_backend(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise OpError("op 'matmul': inputs must have at least one dimension; use 'multiply' for a number")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if ka != kb:
        raise OpError(f"op 'matmul': shapes {a.shape} and {b.shape} do not line up: a's last axis ({ka}) must "
                      f"equal b's {'second-to-last' if b.ndim > 1 else 'only'} axis ({kb})")
    return da.matmul(a, b)


@defop("tensordot")
def tensordot(a: Array, b: Array, *, axes: int | list = 2) -> Array:
    """Sum of products over the given axes of a and b (numpy.tensordot).

    ``axes``: N contracts the last N axes of ``a`` with the first N of ``b``; ``[[1], [0]]`` names the
    axes to contract in each.

    Returns
    -------
    dask.array.Array
    """
    a, b = same_backend(a, b)
    try:
        return da.tensordot(a, b, axes=axes if isinstance(axes, int) else tuple(axes))
    except (ValueError, IndexError) as e:
        raise OpError(f"op 'tensordot': axes={axes!r} do not fit shapes {a.shape} and {b.shape}: {e}") from None
