"""dask's reduction tree over fused partials, run in one aggregate task.

When a full reduction's chunk stage is fused, each partial is one value, and each level of dask's
combine tree (fan-in 4) costs a scheduler round trip for a few bytes. The aggregate task here
takes every partial and runs dask's own combine tasks inside it, nested as the tree nests them, so
the result is dask's to the last bit (a flat combine rounds otherwise). Only for dask's own tree
shape over at most :data:`MAX_FANIN` chunks; anything else stays.
"""

from __future__ import annotations

import math
from typing import Any

from dask.highlevelgraph import MaterializedLayer

__all__ = ["flatten_tree", "MAX_FANIN"]

MAX_FANIN = 1024  # partials one aggregate takes at most (flowgpu.fuse's flat combine takes as many)


def flatten_tree(layers: dict, deps: dict, root: str, keep: set[str]) -> bool:
    """Replace the tree above the chunk-stage layer ``root`` (of a full reduction) by one aggregate
    task holding the tree's tasks, in ``layers``/``deps``; whether it did."""
    chain, name = [], root
    while True:
        users = [k for k, ds in deps.items() if name in ds]
        if len(users) != 1 or name in keep and name != root:
            return False
        name = users[0]
        layer = layers[name]
        if type(layer) is not MaterializedLayer or deps[name] != {chain[-1] if chain else root}:
            return False
        chain.append(name)
        if len(layer) == 1:
            break
    if len(chain) < 2:
        return False  # already one aggregate over the partials
    stage = layers[root]
    if math.prod(stage.dims[i] for i in stage.output_indices) > MAX_FANIN or stage.output_blocks is not None:
        return False
    below = {key: task for name in chain[:-1] for key, task in layers[name].mapping.items()}
    top = layers[chain[-1]]
    ((key, task),) = top.mapping.items()
    try:
        nested = _nested_task(task, below)
    except ValueError:  # a task in the tree that is not ``(func, [keys...])``
        return False
    layers[chain[-1]] = MaterializedLayer({key: nested}, annotations=top.annotations)
    deps[chain[-1]] = {root}
    for name in chain[:-1]:
        del layers[name], deps[name]
    return True


def _nested_task(task: Any, below: dict) -> Any:
    """``task`` (``(func, [keys...])``, as dask's tree writes each) with every key of ``below``
    replaced by its own task, nested the same way."""
    if not (isinstance(task, tuple) and len(task) == 2 and callable(task[0]) and isinstance(task[1], list)):
        raise ValueError("not a (func, [keys...]) task")

    def inline(arg: Any) -> Any:
        if isinstance(arg, list):
            return [inline(a) for a in arg]
        if isinstance(arg, tuple) and arg in below:
            return _nested_task(below[arg], below)
        return arg

    return task[0], inline(task[1])

