"""The op registry: a name maps to a callable with its signature, docstring and kind.

Built-in ops register themselves when :mod:`flowgpu.ops` is imported; user packages add theirs with
the :func:`op` decorator or through the ``flowgpu.ops`` entry-point group (each entry point names a
module to import, or a callable to register under the entry point's name).

An op is called with dask arrays (its inputs) and keyword arguments, and returns a dask array (or a
tuple of them). An elementwise op may also give ``expression``: a template over its inputs such as
``"a + b"`` or ``"sqrt(x)"``, which lets the pipeline compiler fuse chains of such ops into one
kernel per chunk.
"""

from __future__ import annotations

import difflib
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from flowgpu.errors import OpError

__all__ = ["Op", "op", "register", "get", "names", "all_ops", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "flowgpu.ops"
KINDS = ("elementwise", "reduction", "array", "io", "user")


@dataclass(frozen=True)
class Op:
    """One registered op."""

    name: str
    func: Callable[..., Any]
    kind: str = "array"
    inputs: tuple[str, ...] = ()  # names of the array parameters, in order; "*" suffix = variadic
    expression: str | None = None  # elementwise template over ``inputs``, for fusion
    gpu_only: bool = False
    doc: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def signature(self) -> inspect.Signature:
        return inspect.signature(self.func)

    @property
    def summary(self) -> str:
        return (self.doc.strip().splitlines() or [""])[0]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)


_lock = threading.RLock()
_ops: dict[str, Op] = {}
_loaded_entry_points = False


def _array_params(func: Callable) -> tuple[str, ...]:
    """Positional parameters without defaults are the op's array inputs."""
    out = []
    for p in inspect.signature(func).parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            out.append(p.name + "*")
        elif p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            out.append(p.name)
    return tuple(out)


def register(name: str, func: Callable, *, kind: str = "array", inputs: tuple[str, ...] | None = None,
             expression: str | None = None, gpu_only: bool = False, replace: bool = False, **meta: Any) -> Op:
    """Register ``func`` as op ``name``; refuses to replace an existing op unless ``replace``."""
    if kind not in KINDS:
        raise OpError(f"op {name!r}: unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not name or not name.replace("_", "").replace(".", "").isalnum():
        raise OpError(f"op name {name!r}: use letters, digits, '_' and '.'")
    entry = Op(name=name, func=func, kind=kind, inputs=inputs if inputs is not None else _array_params(func),
               expression=expression, gpu_only=gpu_only, doc=inspect.getdoc(func) or "", meta=meta)
    with _lock:
        if name in _ops and not replace and _ops[name].func is not func:
            raise OpError(f"op {name!r} is already registered (by {_ops[name].func.__module__}); "
                          "pick another name or pass replace=True")
        _ops[name] = entry
    return entry


def op(name: str | None = None, **options: Any) -> Callable[[Callable], Callable]:
    """Decorator: register a function as a pipeline op.

    Examples
    --------
    >>> import flowgpu
    >>> @flowgpu.op("double_it", kind="elementwise", expression="2 * x")
    ... def double_it(x):
    ...     '''Twice x.'''
    ...     return 2 * x
    """

    def deco(func: Callable) -> Callable:
        register(name or func.__name__, func, **options)
        return func

    return deco


def _load_builtins_and_plugins() -> None:
    global _loaded_entry_points
    import flowgpu.ops.builtin  # noqa: F401  (registers the built-in ops)

    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:  # a broken plugin must not break every pipeline
            import warnings

            warnings.warn(f"could not load flowgpu op plugin {ep.name!r} ({ep.value}): {e}", stacklevel=2)
            continue
        if callable(obj) and not inspect.ismodule(obj) and ep.name not in _ops:
            register(ep.name, obj, kind="user")


def get(name: str) -> Op:
    """The op registered as ``name``; an unknown name suggests close matches."""
    _load_builtins_and_plugins()
    with _lock:
        try:
            return _ops[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(_ops), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else "run 'flowgpu ops' to list them"
    raise OpError(f"unknown op {name!r}; {hint}")


def names() -> list[str]:
    _load_builtins_and_plugins()
    with _lock:
        return sorted(_ops)


def all_ops() -> list[Op]:
    _load_builtins_and_plugins()
    with _lock:
        return [_ops[n] for n in sorted(_ops)]
