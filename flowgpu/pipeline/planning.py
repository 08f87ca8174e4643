"""``flowgpu plan``: what a compiled pipeline will do, before anything runs.

Per input and step: shape, dtype, chunks, tasks, bytes, fusion. The peak memory per worker is an
estimate from metadata: the largest task's working set times the threads, plus the chunks waiting
for their dependents, or all of an array a step reads both chunk by chunk and through a reduction
(:func:`held_whole`). :func:`check_memory` refuses a plan that cannot fit the session's workers.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import dask.array as da
import dask.config
import numpy as np
from dask.highlevelgraph import HighLevelGraph
from dask.utils import format_bytes

from flowgpu import config
from flowgpu.backend import current_backend
from flowgpu.errors import SpecError
from flowgpu.pipeline.compiler import Plan
from flowgpu.runtime.options import GPU_THREADS

__all__ = ["describe", "graph_size", "footprints", "check_memory", "held_whole"]


def _chunk_bytes(x: da.Array) -> int:
    if any(np.isnan(c) for c in x.chunksize):
        return 0
    return int(np.prod(x.chunksize, dtype=np.int64)) * x.dtype.itemsize


def _layers(arrays: list[Any]) -> dict[Any, Any]:
    """The layers of the one graph computing all of ``arrays``, by name."""
    layers: dict[Any, Any] = {}
    for x in arrays:
        graph = x.__dask_graph__() if hasattr(x, "__dask_graph__") else None
        if isinstance(graph, HighLevelGraph):
            layers.update(graph.layers)
        elif graph is not None:
            layers[id(graph)] = graph
    return layers


def graph_size(arrays: list[Any]) -> int:
    """Number of tasks in the one graph computing all of ``arrays``: the sum of its layers' lengths,
    which needs no task built (collecting the keys took seconds on 100k chunks)."""
    return sum(len(layer) for layer in _layers(arrays).values())


def _threads(plan: Plan) -> int:
    t = plan.spec.cluster.threads_per_worker or config.get("threads-per-worker")
    return int(t) if t else (GPU_THREADS if current_backend() == "cupy" else 1)


def footprints(plan: Plan, prefix: str = "") -> list[tuple[str, str, int, int, int]]:
    """Per input/step: ``(name, kind, bytes one task holds, chunk bytes, array bytes)``, a task holding
    its output chunk and one chunk of each input."""
    out = []
    for name in plan.order:
        node = plan.nodes[name]
        if node.kind == "uses":
            out.extend((prefix + name, "steps", f[2], f[3], f[4]) for f in footprints(plan.children[name]))
            continue
        x = node.array
        if not isinstance(x, da.Array):
            continue
        working = _chunk_bytes(x)
        if node.what != "bound":
            working += sum(_chunk_bytes(plan.arrays[d]) for d in node.deps if isinstance(plan.arrays.get(d), da.Array))
        size = 0 if any(np.isnan(s) for s in x.shape) else int(x.nbytes)
        out.append((prefix + name, "inputs" if node.kind == "input" else "steps", working, _chunk_bytes(x), size))
    return out


# Sources whose blocks a CPU worker makes with flowgpu's compiled kernels (loaded by the first task).
_KERNEL_SOURCES = {"random", "normal"}


def _refuse(plan: Plan, where: tuple[str, str], message: str, hint: str) -> SpecError:
    return plan.spec.error(message, (where[0], where[1].split("/")[0]), hint=hint)


def check_memory(plan: Plan, workers: dict[str, dict], threads: int, budget: int | None) -> None:
    """Refuse (a SpecError) ``plan`` when one task, ``threads`` at a time, cannot fit a worker's ``budget``
    bytes, or its largest array cannot fit the workers' memory and spill directories."""
    feet = footprints(plan)
    if not workers or budget is None or not feet:
        return
    kernels = any(n.kind == "input" and n.what in _KERNEL_SOURCES for n in plan.nodes.values())
    if kernels:
        budget = max(budget - max(int(w.get("kernels") or 0) for w in workers.values()), 0)
    process = max(int(w.get("rss") or 0) + (int(w.get("kernels") or 0) if kernels else 0) for w in workers.values())
    name, section, working, chunk, _ = max(feet, key=lambda f: f[2])
    if working * threads > budget:
        raise _refuse(plan, (section, name),
                      f"one task of {name!r} holds about {format_bytes(working)} (chunks of {format_bytes(chunk)}, "
                      f"its output and its inputs' chunks), {threads} at a time per worker, but a worker can hold "
                      f"{format_bytes(budget)} (its memory limit up to where distributed pauses it, less the "
                      f"{format_bytes(process)} the worker process itself uses)",
                      "use smaller chunks (chunks: auto sizes them for the workers), fewer threads_per_worker, "
                      "or a larger cluster.memory_limit")
    disks = {w.get("spill_disk") or w.get("local_directory") or "?": int(w["spill_free"])
             for w in workers.values() if w.get("spill_free") is not None}
    host = sum(int(w.get("memory_limit") or 0) for w in workers.values() if w.get("gpus"))  # GPU workers spill there
    room = budget * len(workers) + host + sum(disks.values())
    name, section, _, _, size = max(feet, key=lambda f: f[4])
    if size > room:
        also = f", {format_bytes(host)} of host memory" if host else ""
        raise _refuse(plan, (section, name),
                      f"{name!r} is {format_bytes(size)}, more than the cluster can hold: {len(workers)} worker(s) "
                      f"of {format_bytes(budget)}{also} and {format_bytes(sum(disks.values()))} free in their spill "
                      "directories", "make it smaller, join a larger cluster (--scheduler), or give the workers "
                      "more memory (cluster.memory_limit) or a local_directory with more free space")


def _waiting(threads: int) -> int:
    """Chunks a worker may hold waiting for their dependents: as many as the root tasks the scheduler
    sends it at once (``worker-saturation``)."""
    saturation = dask.config.get("distributed.scheduler.worker-saturation", default=1.1)
    try:
        saturation = float(saturation)
    except (TypeError, ValueError):
        saturation = 2.0
    return math.ceil((saturation if math.isfinite(saturation) else 2.0) * threads)


def _partitions(x: Any) -> int:
    return int(x.npartitions) if isinstance(x, da.Array) else 0


def held_whole(plan: Plan) -> tuple[str, int] | None:
    """The largest array that a step reads both chunk by chunk and through a reduction of all of it
    (``x - x.mean(axis=0)``): every chunk waits for the reduction. ``(name, bytes)`` or None."""
    ancestors: dict[str, set[str]] = {}
    for name in plan.order:
        node = plan.nodes[name]
        ancestors[name] = set().union(*({d} | ancestors.get(d, set()) for d in node.deps)) if node.deps else set()
    found: tuple[str, int] | None = None
    for name in plan.order:
        deps = [d for d in plan.nodes[name].deps if d in ancestors]
        for held in deps:
            x = plan.arrays.get(held)
            if not isinstance(x, da.Array) or _partitions(x) < 2 or any(np.isnan(s) for s in x.shape):
                continue
            reduced = any(held in ancestors[other] and _partitions(plan.arrays.get(other)) < _partitions(x)
                          for other in deps if other != held)
            if reduced and (found is None or int(x.nbytes) > found[1]):
                found = (held, int(x.nbytes))
    return found


def _workers(plan: Plan) -> int:
    n = plan.spec.cluster.n_workers or config.get("n-workers")
    return int(n) if n else 1  # unknown before a cluster starts: as if one worker held it all


def describe(plan: Plan, prefix: str = "") -> dict[str, Any]:
    """Rows (one per input/step, in order) and totals of a compiled pipeline."""
    rows: list[dict[str, Any]] = []

    @functools.cache
    def layers_of(name: str) -> dict[Any, Any]:
        x = plan.arrays.get(name)
        parts = x.values() if isinstance(x, dict) else [x]  # a uses step: all its outputs
        return _layers([p for p in parts if isinstance(p, da.Array)])

    for name in plan.order:
        node, x = plan.nodes[name], plan.nodes[name].array
        row = {"name": prefix + name, "kind": node.kind, "what": node.what, "shape": None, "dtype": None,
               "chunks": None, "tasks": 0, "bytes": 0, "fused": node.fused}
        if node.kind != "uses":
            row["fused_into"] = prefix + node.fused_into if node.fused_into not in (None, name) else None
        row["deps"] = [prefix + d for d in node.deps]
        rows.append(row)
        if node.kind == "uses":
            rows.extend(describe(plan.children[name], prefix=f"{prefix}{name}/")["steps"])
        elif isinstance(x, da.Array) and node.what == "bound":
            row.update(shape=list(x.shape), dtype=str(x.dtype), chunks=list(x.chunksize), bytes=int(x.nbytes))
        elif isinstance(x, da.Array):
            before = set().union(*(layers_of(d).keys() for d in node.deps))  # its inputs' layers: its tasks are the rest
            row.update(shape=list(x.shape), dtype=str(x.dtype), chunks=list(x.chunksize),
                       tasks=sum(len(layer) for n, layer in layers_of(name).items() if n not in before),
                       bytes=int(x.nbytes) if not any(np.isnan(s) for s in x.shape) else None)
    outputs = {}
    for out_name, x in plan.outputs.items():
        o = plan.spec.outputs[out_name]
        outputs[out_name] = {"from": o.from_, "sink": o.sink, "path": o.path, "shape": list(x.shape),
                             "dtype": str(x.dtype), "bytes": int(x.nbytes)}
    threads, feet = _threads(plan), footprints(plan)
    peak = max((f[2] for f in feet), default=0)  # the largest task's working set, in included specs too
    per_task = peak * threads + _waiting(threads) * max((f[3] for f in feet), default=0)
    held = held_whole(plan)
    if held is not None:  # every chunk of it waits for the reduction, besides what the running tasks hold
        per_task = max(per_task, math.ceil(held[1] / _workers(plan)) + peak * threads)
    return {"name": plan.spec.name, "file": plan.file, "params": plan.params, "steps": rows, "outputs": outputs,
            "tasks": graph_size(list(plan.outputs.values())), "fused": plan.fused, "peak_task_bytes": peak,
            "threads_per_worker": threads, "peak_worker_bytes": per_task,
            "held_whole": {"name": prefix + held[0], "bytes": held[1]} if held is not None else None}
