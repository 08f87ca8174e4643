"""The op registry: a name maps to a callable with its signature, docstring and kind.

Built-in ops register when :mod:`flowgpu.ops` is imported; user packages add theirs with :func:`op`
or the ``flowgpu.ops`` entry-point group. An op takes dask arrays (its inputs) and keyword arguments
and returns a dask array (or a tuple of them). An elementwise op's ``expression`` (``"a + b"``) only
documents its formula: a Session fuses whatever graph the ops build (:mod:`flowgpu.fusion.graph`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flowgpu.errors import OpError
from flowgpu.registry import Entry, Registry

__all__ = ["Op", "op", "register", "get", "names", "all_ops", "OPS", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "flowgpu.ops"
KINDS = ("elementwise", "reduction", "array", "io", "user")


@dataclass(frozen=True)
class Op(Entry):
    """One registered op."""

    kind: str = "array"
    inputs: tuple[str, ...] = ()  # names of the array parameters, in order; "*" suffix = variadic
    expression: str | None = None  # the elementwise formula over ``inputs`` (documentation)
    gpu_only: bool = False
    meta: dict = field(default_factory=dict)

    @functools.cached_property
    def signature(self) -> inspect.Signature:
        """``inspect.signature(func)``, kept: every run binds each step's arguments against it (0.3 of a
        1.4 ms compile on 2 cores when it was read again each time)."""
        return inspect.signature(self.func)


def _array_params(func: Callable) -> tuple[str, ...]:
    """Positional parameters without defaults are the op's array inputs."""
    out = []
    for p in inspect.signature(func).parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            out.append(p.name + "*")
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            out.append(p.name)
    return tuple(out)


def _make(name: str, func: Callable, *, kind: str = "array", inputs: tuple[str, ...] | None = None,
          expression: str | None = None, gpu_only: bool = False, **meta: Any) -> Op:
    if kind not in KINDS:
        raise OpError(f"op {name!r}: unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not name or not name.replace("_", "").replace(".", "").isalnum():
        raise OpError(f"op name {name!r}: use letters, digits, '_' and '.'")
    return Op(name=name, func=func, doc=inspect.getdoc(func) or "", kind=kind,
              inputs=inputs if inputs is not None else _array_params(func), expression=expression,
              gpu_only=gpu_only, meta=meta)


def _from_plugin(name: str, obj: Any) -> Op | None:
    """An entry point naming a module registers its ops on import; one naming a callable is an op."""
    if inspect.ismodule(obj) or not callable(obj):
        return None
    return _make(name, obj, kind="user")


OPS: Registry[Op] = Registry(ENTRY_POINT_GROUP, "op", error=OpError, from_plugin=_from_plugin)


def register(name: str, func: Callable, *, replace: bool = False, **options: Any) -> Op:
    """Register ``func`` as op ``name`` (``options``: those of :class:`Op`, the rest go to its ``meta``);
    refuses to replace an existing op unless ``replace``."""
    return OPS.add(_make(name, func, **options), replace=replace)


def op(name: str | None = None, **options: Any) -> Callable[[Callable], Callable]:
    """Decorator: register a function as a pipeline op (``@flowgpu.op("double_it", kind="elementwise")``)."""

    def deco(func: Callable) -> Callable:
        register(name or func.__name__, func, **options)
        return func

    return deco


get = OPS.get  # the op registered as ``name``; an unknown name suggests close matches
names = OPS.names
all_ops = OPS.entries
