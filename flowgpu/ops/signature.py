"""Checking an op's arguments against its signature before any graph is built.

:func:`bind_arguments` checks a pipeline step's keyword arguments without its input arrays (so a spec
is validated before anything is created); :func:`checked` wraps an op so that a wrong argument name
or type raises :class:`~flowgpu.errors.ArgumentError` naming the op, the argument and the accepted
ones, not a bare ``TypeError`` from inside dask. Types are checked by strict pydantic adapters (no
coercion: ``"1"`` is not an int), except that lists and tuples stand for each other (YAML has only
lists); annotations pydantic cannot check are not checked.
"""

from __future__ import annotations

import collections.abc as cabc
import functools
import inspect
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any

import dask.array as da
import numpy as np
from pydantic import ConfigDict, PlainValidator, TypeAdapter, ValidationError

from flowgpu.errors import ArgumentError, did_you_mean
from flowgpu.ops.registry import Op, get

__all__ = ["Array", "bind_arguments", "checked", "describe_type", "accepted_arguments"]


def _array(value: Any) -> Any:
    if isinstance(value, da.Array) or (hasattr(value, "shape") and hasattr(value, "dtype")
                                       and not isinstance(value, numbers.Number)):
        return value
    raise ValueError("not an array")


Array = Annotated[da.Array, PlainValidator(_array)]
_STRICT = ConfigDict(strict=True, arbitrary_types_allowed=True)


@functools.lru_cache(maxsize=None)
def _adapters(func: Callable) -> dict[str, tuple[Any, TypeAdapter]]:
    """One strict TypeAdapter per annotated parameter of ``func`` (those pydantic can build)."""
    try:
        hints = typing.get_type_hints(inspect.unwrap(func), include_extras=True)
    except Exception:  # noqa: BLE001 - unresolvable annotations are simply not checked
        return {}
    out = {}
    for name, hint in hints.items():
        if name == "return" or hint is Any:
            continue
        try:
            out[name] = (hint, TypeAdapter(hint, config=_STRICT))
        except Exception:  # noqa: BLE001 - a hint pydantic cannot check is not checked
            continue
    return out


def _fits(adapter: TypeAdapter, value: Any) -> bool:
    """Whether ``value`` or an equivalent (a list as a tuple and back, a NumPy scalar as a Python one) fits."""
    other = (tuple(value) if isinstance(value, list) else list(value) if isinstance(value, tuple)
             else value.item() if isinstance(value, np.generic) else value)
    for candidate in (value, other):
        try:
            adapter.validate_python(candidate)
            return True
        except ValidationError:
            continue
    return False


def describe_type(hint: Any) -> str:
    """A short English name for an annotation, for error messages (``int, list of int or None``)."""
    if hint is None or hint is type(None):
        return "None"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        return describe_type(args[0])
    if origin in (typing.Union, types.UnionType):
        parts = list(dict.fromkeys(describe_type(a) for a in args))
        return ", ".join(parts[:-1]) + " or " + parts[-1] if len(parts) > 1 else parts[0]
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (list, tuple, cabc.Sequence):
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return f"a list of {len(args)} ({', '.join(describe_type(a) for a in args)})"
        return f"a list of {describe_type(args[0])}" if args else "a list"
    if origin in (dict, cabc.Mapping) or hint in (dict, cabc.Mapping):
        return "a mapping"
    if hint is da.Array:
        return "an array"
    if hint is float:
        return "a number"
    if isinstance(hint, type):
        return hint.__name__
    return str(hint)


def accepted_arguments(func: Callable, array_params: tuple[str, ...] = ()) -> list[str]:
    """Names of the keyword arguments ``func`` takes (its array inputs left out)."""
    inputs = {p.rstrip("*") for p in array_params}
    return [p.name for p in inspect.signature(func).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in inputs]


def _unknown(op_name: str, key: str, accepted: list[str]) -> ArgumentError:
    hint = did_you_mean(key, accepted)
    return ArgumentError(f"op {op_name!r}: unknown argument {key!r}; {hint + ' ' if hint else ''}it accepts: "
                         f"{', '.join(accepted) or 'no keyword arguments'}", key)


def _check_type(op_name: str, func: Callable, key: str, value: Any) -> None:
    hint, adapter = _adapters(func).get(key, (None, None))
    if adapter is None or _fits(adapter, value):
        return
    raise ArgumentError(f"op {op_name!r}: argument {key!r} must be {describe_type(hint)}, "
                        f"not {type(value).__name__} ({value!r:.60})", key)


def _check_keywords(op_name: str, func: Callable, params: Mapping[str, inspect.Parameter],
                    kwargs: Mapping[str, Any], inputs: tuple[str, ...] = ()) -> None:
    """Refuse a keyword argument ``func`` (its parameters: ``params``) does not take (``inputs``: its array
    parameters, left out of the names a message suggests) or whose type does not fit its annotation."""
    has_var_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    for key, value in kwargs.items():
        p = params.get(key)
        if p is not None and p.kind == p.VAR_POSITIONAL:
            raise ArgumentError(f"op {op_name!r}: {key!r} are the step's inputs; list them under inputs, "
                                "not as an argument", key)
        if p is None and not has_var_kw:
            raise _unknown(op_name, key, accepted_arguments(func, inputs))
        if p is not None and p.kind != p.VAR_KEYWORD:
            _check_type(op_name, func, key, value)


def checked(name: str, func: Callable) -> Callable:
    """``func`` wrapped so a call with wrong argument names or types raises :class:`ArgumentError`."""
    sig = inspect.signature(func)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _check_keywords(name, func, sig.parameters, kwargs)
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"op {name!r}: {e}; it takes {sig}") from None
        for key, value in bound.arguments.items():  # the positional ones (keywords are checked above)
            kind = sig.parameters[key].kind
            if key not in kwargs and kind != kind.VAR_KEYWORD:
                for v in value if kind == kind.VAR_POSITIONAL else (value,):
                    _check_type(name, func, key, v)
        return func(*args, **kwargs)

    return wrapper


def bind_arguments(op: Op | str, args: Mapping[str, Any] | None = None, *, n_inputs: int | None = None) -> dict[str, Any]:
    """Check a step's keyword arguments ``args`` (not its input arrays; an array parameter may be given
    here as a number, e.g. ``multiply`` with ``{"b": 2.0}``) and, when known, its number of inputs
    ``n_inputs`` against ``op``; returns ``args`` as a new dict, or raises :class:`ArgumentError`.

    >>> bind_arguments("clip", {"lo": 0.0, "hi": 1.0}, n_inputs=1)
    {'lo': 0.0, 'hi': 1.0}
    """
    if isinstance(op, str):
        op = get(op)
    args = dict(args or {})
    params = op.signature.parameters
    _check_keywords(op.name, op.func, params, args, op.inputs)
    missing = [p.name for p in params.values()
               if p.default is p.empty and p.kind == p.KEYWORD_ONLY and p.name not in args]
    if missing:
        raise ArgumentError(f"op {op.name!r}: missing argument {missing[0]!r}; it accepts: "
                            f"{', '.join(accepted_arguments(op.func, op.inputs)) or 'no keyword arguments'}",
                            missing[0])
    if n_inputs is None or op.inputs == ("**",):
        return args
    variadic = any(n.endswith("*") for n in op.inputs)
    fixed = [n for n in op.inputs if n in params and n not in args]  # a variadic name ends in "*"
    required = max(len([n for n in fixed if params[n].default is params[n].empty]), 1 if variadic else 0)
    if n_inputs < required or (not variadic and n_inputs > len(fixed)):
        want = ", ".join(n.rstrip("*") + ("..." if n.endswith("*") else "") for n in op.inputs)
        raise ArgumentError(f"op {op.name!r} takes {'at least ' if variadic else ''}{required} input(s) "
                            f"({want}), got {n_inputs}")
    return args
