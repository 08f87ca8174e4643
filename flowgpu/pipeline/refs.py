"""References and values of a pipeline built in Python (:mod:`flowgpu.pipeline.builder`).

A :class:`Ref` names a param, input or step of one pipeline; :func:`render` turns what a Python
caller passes (refs, tuples, paths, NumPy scalars and dtypes) into spec data, and refuses anything
a YAML file could not hold; :func:`step_function` checks that a function can be a step named by
import path.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from flowgpu.pipeline.sites import Pos, Site, call_site

__all__ = ["Ref", "render", "step_function", "builtin_type", "short", "PARAM_TYPES"]

PARAM_TYPES = {bool: "bool", int: "int", float: "float", str: "str", list: "list"}


class Ref:
    """A param, input or step of one :class:`~flowgpu.pipeline.builder.Pipeline`: what its methods return and take."""

    __slots__ = ("pipeline", "name", "kind", "part")

    def __init__(self, pipeline: Any, name: str, kind: str, part: str | None = None):  # a builder.Pipeline
        self.pipeline, self.name, self.kind, self.part = pipeline, name, kind, part

    def __str__(self) -> str:
        if self.kind == "param":
            return "${params.%s}" % self.name
        return self.name if self.part is None else f"{self.name}.{self.part}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)

    def __repr__(self) -> str:
        return f"<{self.kind} {str(self)!r} of pipeline {self.pipeline.name!r}>"

    def __getitem__(self, part: str | int) -> "Ref":
        """One result of a step with several (a ``uses`` step's outputs, an op returning a tuple)."""
        if self.kind != "step" or self.part is not None:
            raise call_site(__file__).error(f"{self!r} has no parts", hint="only a step's results have parts")
        return Ref(self.pipeline, self.name, self.kind, str(part))

    def __iter__(self):
        raise TypeError(f"{self!r} is a reference to a pipeline entry, not a sequence")


def render(owner: Any, site: Site, value: Any, path: tuple, at: Pos) -> Any:
    """``value`` as spec data: param refs as ``${params.name}``, tuples as lists, paths as text."""
    if isinstance(value, Ref):
        if value.kind == "param" and value.pipeline is owner:
            return str(value)
        raise site.error(f"{value!r} cannot be used here", path, at=at, hint=(
            "an array goes in as an input of a step (by position, or by keyword for ops taking inputs by "
            "name)" if value.kind != "param" else "use params of this pipeline"))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return np.dtype(value).name
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [render(owner, site, v, path + (i,), at) for i, v in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: render(owner, site, v, path + (k,), at) for k, v in value.items()}
    raise site.error(f"{type(value).__name__} {short(value)} is not spec data", path, at=at,
                     hint="a spec holds numbers, strings, booleans, lists and mappings with string keys")


def step_function(func: Callable, site: Site) -> tuple[str, str]:
    """``(qualname, module)`` of a function a spec can name by import path; a lambda, a closure
    and a function of ``__main__`` are refused (a worker or `flowgpu run` could not import them)."""
    what = getattr(func, "__qualname__", repr(func))
    module = getattr(func, "__module__", None)
    fix = "define it with def at the top level of a module (beside the script), and import it from there"
    if not inspect.isfunction(func) or func.__name__ == "<lambda>" or "<locals>" in what:
        kind = "a lambda" if getattr(func, "__name__", "") == "<lambda>" else (
            "defined inside a function" if "<locals>" in what else f"a {type(func).__name__}, not a function")
        raise site.error(f"step function {what!r} is {kind}: a spec names its function by import path", ("steps",),
                         hint=fix)
    if module in (None, "__main__"):
        raise site.error(f"step function {what!r} is defined in the script that runs (__main__): workers and "
                         "`flowgpu run` import it by 'module:name'", ("steps",), hint=fix)
    return what, module


def builtin_type(value: Any) -> type | None:
    """The plain type of a param default (``bool`` is not ``int`` here), or None."""
    return type(value) if type(value) in PARAM_TYPES else None


def short(value: Any) -> str:
    """``repr(value)``, cut to fit a message."""
    text = repr(value)
    return text if len(text) <= 50 else text[:47] + "..."
