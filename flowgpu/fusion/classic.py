"""The check that dask builds classic graphs (``HighLevelGraph`` layers), the only ones fusion rewrites.

With ``array.query-planning`` on, dask builds expressions instead: fusion would silently do nothing
and ops dask-expr lacks (``std``, ``from_zarr``) would fail, so Sessions and runs refuse it first.
"""

from __future__ import annotations

import warnings

import dask
import dask.array as da

from flowgpu.errors import QueryPlanningError

__all__ = ["require_classic_graphs"]

KEY = "array.query-planning"


def require_classic_graphs() -> None:
    """Raise :class:`QueryPlanningError` when ``array.query-planning`` is true now or was when
    ``dask.array`` was imported (dask reads it once; processes started from here read it again)."""
    with warnings.catch_warnings():  # dask warns when the setting changed after dask.array's import
        warnings.simplefilter("ignore", RuntimeWarning)
        on = dask.config.get(KEY, None) is True or da.array_expr_enabled()
    if on:
        raise QueryPlanningError(
            f"dask's {KEY} is on (DASK_ARRAY__QUERY_PLANNING=True or dask.config '{KEY}'), and flowgpu's fusion "
            "works on dask's classic graphs only: set it to False (export DASK_ARRAY__QUERY_PLANNING=False, or "
            f"dask.config.set({{'{KEY}': False}}) before dask.array is first imported)")
