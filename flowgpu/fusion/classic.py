"""flowgpu's fusion rewrites dask's classic graphs (``HighLevelGraph`` layers): the one check that they are in use.

dask 2026.8 builds arrays as expressions instead when ``array.query-planning`` is true (it says the
default will flip to true). On those, a Session's fusion would silently do nothing, and pipelines
fail on ops and sources dask-expr does not implement yet (``std``, ``from_zarr``). Until the fusion
works on expression graphs, a Session and a pipeline run call :func:`require_classic_graphs` first
and refuse with one message that names the setting.
"""

from __future__ import annotations

import warnings

import dask
import dask.array as da

from flowgpu.errors import QueryPlanningError

__all__ = ["require_classic_graphs"]

KEY = "array.query-planning"


def require_classic_graphs() -> None:
    """Raise :class:`QueryPlanningError` when dask's array query planning is on.

    On when ``array.query-planning`` is true in dask.config now (``DASK_ARRAY__QUERY_PLANNING=True``,
    a dask YAML file, ``dask.config.set``), or when ``dask.array`` was imported with it on (dask reads
    it once, at that import: processes this one starts would read it again).
    """
    with warnings.catch_warnings():  # dask warns when the setting changed after dask.array's import
        warnings.simplefilter("ignore", RuntimeWarning)
        on = dask.config.get(KEY, None) is True or da.array_expr_enabled()
    if on:
        raise QueryPlanningError(
            f"dask's {KEY} is on (DASK_ARRAY__QUERY_PLANNING=True or dask.config '{KEY}'), and flowgpu's fusion "
            "works on dask's classic graphs only: set it to False (export DASK_ARRAY__QUERY_PLANNING=False, or "
            f"dask.config.set({{'{KEY}': False}}) before dask.array is first imported)")
