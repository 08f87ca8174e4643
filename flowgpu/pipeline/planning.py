"""``flowgpu plan``: what a compiled pipeline will do, before anything runs.

For every input and step in order: shape, dtype, chunk shape, the tasks it adds to the graph, its
size in bytes, and which steps are fused. The peak-memory estimate per worker is the largest
working set of one task (its input chunks plus its output chunk) times the tasks a worker runs at
once; it is an estimate from metadata, not a measurement.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from flowgpu import config
from flowgpu.backend import current_backend
from flowgpu.pipeline.compiler import Plan
from flowgpu.runtime.options import GPU_THREADS

__all__ = ["describe", "graph_size"]


def _keys(x: da.Array) -> set:
    return set(x.__dask_graph__().keys())


def _chunk_bytes(x: da.Array) -> int:
    if any(np.isnan(c) for c in x.chunksize):
        return 0
    return int(np.prod(x.chunksize, dtype=np.int64)) * x.dtype.itemsize


def graph_size(arrays: list[Any]) -> int:
    """Number of tasks in the one graph computing all of ``arrays``."""
    keys: set = set()
    for x in arrays:
        if hasattr(x, "__dask_graph__"):
            keys |= set(x.__dask_graph__().keys())
    return len(keys)


def _threads(plan: Plan) -> int:
    t = plan.spec.cluster.threads_per_worker or config.get("threads-per-worker")
    return int(t) if t else (GPU_THREADS if current_backend() == "cupy" else 1)


def describe(plan: Plan, prefix: str = "") -> dict[str, Any]:
    """Rows (one per input/step, in order) and totals of a compiled pipeline."""
    rows: list[dict[str, Any]] = []
    key_cache: dict[str, set] = {}

    def keys_of(name: str) -> set:
        if name not in key_cache:
            x = plan.arrays.get(name)
            parts = x.values() if isinstance(x, dict) else [x]  # a uses step: all its outputs
            key_cache[name] = set().union(*(_keys(p) for p in parts if isinstance(p, da.Array)))
        return key_cache[name]

    peak = 0
    for name in plan.order:
        node = plan.nodes[name]
        if node.kind == "uses":
            child = describe(plan.children[name], prefix=f"{prefix}{name}/")
            rows.append({"name": prefix + name, "kind": "uses", "what": node.what, "shape": None, "dtype": None,
                         "chunks": None, "tasks": 0, "bytes": 0, "fused": None})
            rows.extend(child["steps"])
            peak = max(peak, child["peak_task_bytes"])
            continue
        x = node.array
        row = {"name": prefix + name, "kind": node.kind, "what": node.what, "shape": None, "dtype": None,
               "chunks": None, "tasks": 0, "bytes": 0, "fused": node.fused,
               "fused_into": node.fused_into if node.fused_into not in (None, name) else None}
        if isinstance(x, da.Array) and node.what == "bound":
            row.update(shape=list(x.shape), dtype=str(x.dtype), chunks=list(x.chunksize), bytes=int(x.nbytes))
        elif isinstance(x, da.Array):
            before: set = set()
            for d in node.deps:
                before |= keys_of(d)
            row.update(shape=list(x.shape), dtype=str(x.dtype), chunks=list(x.chunksize),
                       tasks=len(keys_of(name) - before),
                       bytes=int(x.nbytes) if not any(np.isnan(s) for s in x.shape) else None)
            working = _chunk_bytes(x) + sum(_chunk_bytes(plan.arrays[d]) for d in node.deps
                                            if isinstance(plan.arrays.get(d), da.Array))
            peak = max(peak, working)
        rows.append(row)
    outputs = {}
    for out_name, x in plan.outputs.items():
        o = plan.spec.outputs[out_name]
        outputs[out_name] = {"from": o.from_, "sink": o.sink, "path": o.path, "shape": list(x.shape),
                             "dtype": str(x.dtype), "bytes": int(x.nbytes)}
    threads = _threads(plan)
    return {
        "name": plan.spec.name,
        "file": plan.file,
        "params": plan.params,
        "steps": rows,
        "outputs": outputs,
        "tasks": graph_size(list(plan.outputs.values())),
        "fused": plan.fused,
        "peak_task_bytes": peak,
        "threads_per_worker": threads,
        "peak_worker_bytes": peak * threads,
    }
