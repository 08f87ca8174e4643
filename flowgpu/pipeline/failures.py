"""A worker that died while running a step, said in the step's words instead of ``KilledWorker``.

distributed gives up on a task once ``distributed.scheduler.allowed-failures`` workers died running
it, and raises ``KilledWorker`` naming only the task's key. Each key's name is the name of one of
the plan's arrays (the compiler's layer names), so the step, its chunk size and the workers' memory
limit can be named, with the fix. A worker dies for other reasons too (a crash in native code, a
SIGKILL); the message says memory is the likely cause, not the certain one.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np
from dask.utils import format_bytes, key_split
from distributed import KilledWorker

from flowgpu.errors import RunError
from flowgpu.pipeline.compiler import Plan

__all__ = ["explain"]


def _step_of(plan: Plan, name: str, prefix: str = "") -> tuple[str, da.Array] | None:
    for step in plan.order:
        if plan.nodes[step].kind == "uses":
            found = _step_of(plan.children[step], name, f"{prefix}{step}/")
            if found:
                return found
            continue
        x = plan.arrays.get(step)
        if isinstance(x, da.Array) and (x.name == name or name in x.__dask_graph__().layers):
            return prefix + step, x
    return None


def explain(error: BaseException, plan: Plan | None, session: Any) -> RunError | None:
    """A :class:`RunError` naming the step, chunk size and memory limit for a ``KilledWorker``; None
    for any other error."""
    if not isinstance(error, KilledWorker) or plan is None:
        return None
    key = getattr(error, "task", None)
    name = key[0] if isinstance(key, tuple) else str(key)
    found = _step_of(plan, name)
    step = f"step {found[0]!r}" if found else f"task {key_split(name)!r}"
    chunk = ""
    if found and not any(np.isnan(c) for c in found[1].chunksize):
        x = found[1]
        chunk = f" (chunks of {format_bytes(int(np.prod(x.chunksize, dtype=np.int64)) * x.dtype.itemsize)})"
    limits = {w.get("memory_limit") for w in getattr(session, "workers", {}).values()} - {None}
    limit = f"limited to {format_bytes(min(limits))} each" if limits else "with no memory limit"
    return RunError(
        f"{step}{chunk} killed the worker processes that ran it ({limit}); the most likely cause is running "
        "out of memory. Use smaller chunks, fewer threads_per_worker, or a larger cluster.memory_limit "
        "(flowgpu plan shows each step's chunks and the estimated peak per worker). Nothing was written"
    )
