"""Columns the suite's workloads share: dask.array code run as a user writes it, on other setups.

* ``PLAIN``: the dask column's own code, unchanged, on the flowgpu Session's data: what a user of
  plain dask.array gets from a Session (its graph optimisation fuses the chain and the reduction);
* ``CHOSEN``: the dask column again on the same cluster, with the chunks flowgpu chose instead of
  dask's own (smaller) defaults: how much is chunk choice alone.
"""

from __future__ import annotations

import dask.array as da

import flowgpu as fg
from benchmarks.harness import Workload
from benchmarks.suite.context import Context

__all__ = ["PLAIN", "CHOSEN", "chunks_chosen_column"]

PLAIN = "plain dask on a Session"
CHOSEN = "dask, flowgpu's chunks"


def chunks_chosen_column(ctx: Context, w: Workload, xf: da.Array, graph, check, dask_col: str) -> None:
    """The dask column again, with the chunks flowgpu chose (dask's own defaults are smaller)."""
    if ctx.cpu:
        xc = xf
    else:
        try:
            with ctx.on_dask():
                xc = ctx._persist(ctx.dask_client, fg.random(xf.shape, dtype=xf.dtype, seed=w.inputs["seed"],
                                                             chunks=xf.chunks))
        except Exception as e:
            w.skip(CHOSEN, f"{type(e).__name__}: {e}")
            return
    with ctx.on_dask():
        w.column(CHOSEN, lambda: float(graph(xc).compute()), check, repeats=ctx.repeats,
                 note=f"{dask_col} with chunks {xf.chunksize}")
    del xc
    ctx.free()
