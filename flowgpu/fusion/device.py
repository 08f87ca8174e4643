"""Host operands of device chunks moved to the device, so NumPy-written xarray code runs on CuPy.

:func:`move_host_operands` wraps in :class:`OnDevice` just the tasks where a float, complex or bool
NumPy array (or a task computed only from such) meets another chunk (xarray's ``weighted``,
``rolling``, ``where``); integer arrays (indices, random states) never move.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import numpy as np
from dask._task_spec import (Alias, DataNode, GraphNode, List, NestedContainer, Task, TaskRef, Tuple,
                             _execute_subgraph)

from flowgpu.backend import import_cupy, is_cupy

__all__ = ["move_host_operands", "OnDevice"]

_HOST_KINDS = "fcb"  # the dtypes of operands (weights, fill values, masks), never of indices or states
HOST, OTHER, NEUTRAL = "host", "other", "neutral"


def _is_device(x: Any) -> bool:
    return is_cupy(x)


def _to_device(x: np.ndarray) -> Any:
    return import_cupy().asarray(x)


def _moved(x: Any) -> Any:
    if type(x) is np.ndarray:
        return _to_device(x)
    if type(x) is list:
        return [_moved(v) for v in x]
    return x


def _any_device(values: Any) -> bool:
    return any(_is_device(v) or (type(v) is list and _any_device(v)) for v in values)


@dataclass(frozen=True)
class OnDevice:
    """``func`` with its NumPy array operands copied to the device when another operand is on it."""

    func: Any

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _any_device(args) or _any_device(kwargs.values()):
            args = tuple(_moved(a) for a in args)
            kwargs = {k: _moved(v) for k, v in kwargs.items()}
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"OnDevice({getattr(self.func, '__name__', self.func)!r})"


def _moves_to_device(func: Any) -> bool:
    """Whether ``func`` returns its input on the device (``flowgpu.to_device``'s blocks, ``cupy.asarray``)."""
    func = getattr(func, "func", func)  # a functools.partial
    if getattr(func, "moves_to_device", False):
        return True
    return getattr(func, "__name__", None) in ("asarray", "array") and (
        getattr(func, "__module__", None) or "").startswith("cupy")


def _literal(value: Any) -> str:
    if type(value) is np.ndarray:
        return HOST if value.dtype.kind in _HOST_KINDS else NEUTRAL
    if isinstance(value, (list, tuple)):
        return _combine([_literal(v) for v in value])
    return NEUTRAL


def _combine(kinds: list[str]) -> str:
    if OTHER in kinds:
        return OTHER if HOST not in kinds else "mixed"
    return HOST if HOST in kinds else NEUTRAL


class _Pass:
    """One walk of a graph: ``kind[key]`` says what each computed key holds (host, other, neutral)."""

    def __init__(self, kinds: dict):
        self.kinds = kinds

    def arg(self, a: Any) -> tuple[Any, str]:
        if isinstance(a, TaskRef):
            return a, self.kinds.get(a.key, OTHER)
        if isinstance(a, GraphNode):
            return self.node(a)
        return a, _literal(a)

    def node(self, node: GraphNode) -> tuple[GraphNode, str]:
        if isinstance(node, DataNode):
            return node, _literal(node.value)
        if isinstance(node, Alias):
            return node, self.kinds.get(node.target, OTHER)
        if not isinstance(node, Task):
            return node, OTHER
        if node.func is _execute_subgraph:
            return self.subgraph(node)
        done = [self.arg(a) for a in node.args]
        done_kw = {k: self.arg(v) for k, v in node.kwargs.items()}
        args, kwargs = [a for a, _ in done], {k: a for k, (a, _) in done_kw.items()}
        arg_kinds = [kind for _, kind in (*done, *done_kw.values())]
        if _moves_to_device(node.func):  # whatever it reads, its result is on the device
            arg_kinds = [OTHER]
        mixed = "mixed" in arg_kinds or (HOST in arg_kinds and OTHER in arg_kinds)
        if mixed and (not isinstance(node, NestedContainer) or isinstance(node, (List, Tuple))):
            return self.rebuilt(node, OnDevice(node.func), args, kwargs), OTHER
        if mixed:  # a dict or set of arrays: left as it is (the task reading it gets its items as they are)
            return node, OTHER
        if all(a is b for a, b in zip(args, node.args)) and all(kwargs[k] is v for k, v in node.kwargs.items()):
            new = node
        else:
            new = self.rebuilt(node, node.func, args, kwargs)
        if OTHER in arg_kinds:
            return new, OTHER
        # computed from host arrays only (or from nothing: a source, whose chunks are the session's)
        pure = isinstance(node, NestedContainer) and not node.dependencies  # a container of literals
        return new, HOST if HOST in arg_kinds else (NEUTRAL if pure else OTHER)

    @staticmethod
    def rebuilt(node: Task, func: Any, args: list, kwargs: dict) -> Task:
        if isinstance(node, NestedContainer):  # a list/tuple/dict built from its items: a plain task now
            kwargs = {**kwargs, "constructor": node.constructor}
            return Task(node.key, func if func is not node.func else type(node).to_container, *args, **kwargs)
        return Task(node.key, func, *args, **kwargs)

    def subgraph(self, node: Task) -> tuple[Task, str]:
        inner, outkey, inkeys, *deps = node.args
        dep_kinds = [self.arg(d)[1] for d in deps]
        if HOST not in dep_kinds and "mixed" not in dep_kinds and not _has_host_literal(inner.values()):
            return node, OTHER  # nothing of the host reaches it
        kinds = collections.ChainMap({}, self.kinds)  # the subgraph's own keys over the graph's (no copy)
        kinds.update(zip(inkeys, dep_kinds))
        new_inner = _walk(dict(inner), kinds)
        if all(new_inner[k] is inner[k] for k in inner):
            return node, kinds.get(outkey, OTHER)
        return Task(node.key, _execute_subgraph, new_inner, outkey, inkeys, *deps), kinds.get(outkey, OTHER)


def _walk(dsk: dict, kinds: Any) -> dict:
    """Each node of ``dsk`` after its dependencies in it (a depth-first walk: no sort of the whole graph)."""
    p = _Pass(kinds)
    out = dict(dsk)
    done: set = set()
    for root in dsk:
        stack = [(root, False)]
        while stack:
            key, ready = stack.pop()
            if key in done:
                continue
            node = dsk[key]
            if not ready:
                stack.append((key, True))
                stack.extend((d, False) for d in getattr(node, "dependencies", ()) if d in dsk and d not in done)
                continue
            done.add(key)
            if isinstance(node, GraphNode):
                out[key], kinds[key] = p.node(node)
            else:
                kinds[key] = _literal(node)
    return out


def _has_host_literal(values: Any) -> bool:
    """Whether a float, complex or bool NumPy array lies anywhere in ``values`` (spares the walk)."""
    stack = list(values)
    while stack:
        v = stack.pop()
        t = type(v)
        if t is np.ndarray:
            if v.dtype.kind in _HOST_KINDS:
                return True
        elif t is DataNode:
            stack.append(v.value)
        elif isinstance(v, Task):
            stack.extend(v.args)
            stack.extend(v.kwargs.values())
        elif t is list or t is tuple:
            stack.extend(v)
        elif t is dict:
            stack.extend(v.values())
    return False


def move_host_operands(dsk: dict) -> dict:
    """``dsk`` (a low-level graph of task-spec nodes) with every task that mixes host NumPy operands
    and other chunks wrapped in :class:`OnDevice`; the same dict when none does."""
    if not _has_host_literal(dsk.values()):
        return dsk
    return _walk(dsk, {})
