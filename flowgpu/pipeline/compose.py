"""Composition: a step that ``uses`` another spec file.

The included spec is compiled as part of this one: its inputs named under the step's ``inputs``
are bound to arrays of this pipeline (checked against the shape and dtype the included spec
declares for them), the others are opened from its own sources; ``params`` are passed to it; its
outputs become ``<step>.<output>`` here. Its sinks are not written: only this pipeline's outputs are.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.arrays.labels import bare
from flowgpu.errors import SpecError, SpecLimitError, did_you_mean
from flowgpu.pipeline.build import build
from flowgpu.pipeline.loader import SourceMap, limit, read_yaml
from flowgpu.pipeline.spec import Spec

__all__ = ["resolve_uses", "compile_uses", "counting_includes"]

_KERNEL_FILES = ("/proc/", "/sys/")  # what they hold is the system's (an environment, its state), never a spec
_included: ContextVar[list[int] | None] = ContextVar("flowgpu_included", default=None)


@contextlib.contextmanager
def counting_includes() -> Iterator[None]:
    """Count the included specs one compile builds: includes of includes multiply (two steps using a
    file that has two steps using the next ... is 2**depth compiles), so past ``flowgpu.spec.max-includes``
    the compile stops instead of running for hours; so does one whose included specs' steps, each time
    included, make more than ``flowgpu.spec.max-steps`` in all (counted before each is built)."""
    token = _included.set([0, 0])
    try:
        yield
    finally:
        _included.reset(token)


def resolve_uses(spec: Spec, name: str, smap: SourceMap, stack: tuple[str, ...]) -> str:
    """Absolute path of step ``name``'s included file; missing, self and cyclic includes fail."""
    origin = spec.origin
    base = origin.base_dir if origin is not None else os.getcwd()
    path = os.path.abspath(os.path.join(base, os.path.expanduser(spec.steps[name].uses)))
    where = ("steps", name, "uses")
    if not os.path.exists(path):  # a FIFO or device is refused by read_yaml, by name
        here = os.path.dirname(path)
        hint = did_you_mean(os.path.basename(path), os.listdir(here) if os.path.isdir(here) else [],
                            "paths are relative to the spec file that uses them")
        raise smap.error(f"included spec {spec.steps[name].uses!r} does not exist ({path})", where, hint=hint)
    kernel = next((k for k in _KERNEL_FILES if os.path.realpath(path).startswith(k)), None)
    if kernel is not None:
        raise smap.error(f"included spec {spec.steps[name].uses!r} is a file the kernel makes up ({kernel}...), "
                         "not a spec", where, hint="give the path of a YAML spec file")
    me = os.path.abspath(origin.file) if origin is not None and origin.file else None
    if path == me:
        raise smap.error(f"step {name!r} includes the spec it is in", where,
                         hint="a spec cannot use itself; move the shared steps into another file")
    chain = [*stack, me] if me else list(stack)
    if path in chain:
        loop = " -> ".join(os.path.basename(p) for p in [*chain[chain.index(path):], path])
        raise smap.error(f"cyclic include: {loop}", where, hint="specs must not include each other in a loop")
    return path


def _check_binding(child: Spec, inner: str, x: Any, where: tuple, smap: SourceMap, step: str) -> None:
    if not isinstance(bare(x), da.Array):  # labelled (an xarray.DataArray) or bare
        raise smap.error(f"{inner!r} is bound to something that is not an array", where,
                         hint="bind it to an input or a step with one result")
    model = child.inputs[inner]
    fields = model.model_fields_set
    if "shape" in fields and list(model.shape) != list(x.shape):
        raise smap.error(f"shape mismatch: {step!r} binds {inner!r} to an array of shape {list(x.shape)}, but the "
                         f"included spec declares {list(model.shape)}", where,
                         hint="pass matching params to the included spec, or bind another array")
    if "dtype" in fields and model.dtype is not None and np.dtype(model.dtype) != x.dtype:
        raise smap.error(f"dtype mismatch: {step!r} binds {inner!r} to {x.dtype}, but the included spec declares "
                         f"{np.dtype(model.dtype)}", where, hint="add an astype step before it, or pass the dtype as "
                                                                 "a param of the included spec")


def _count_steps(count: list[int] | None, spec: Spec, data: Any, name: str, smap: SourceMap) -> None:
    """Add the steps of step ``name``'s included spec (``data``, as read) to this compile's, the top
    spec's own first (the first include of a compile is always one of its steps)."""
    if count is None:
        return
    steps = data.get("steps") if isinstance(data, dict) else None
    count[1] = (count[1] or len(spec.steps)) + (len(steps) if isinstance(steps, dict) else 0)
    most = limit("max-steps")
    if count[1] > most:
        raise smap.error(f"the included specs would make {count[1]:,} steps to compile, more than {most:,}",
                         ("steps", name, "uses"), kind=SpecLimitError,
                         hint="include large specs from fewer steps, or raise flowgpu.spec.max-steps")


def compile_uses(spec: Spec, name: str, smap: SourceMap, values: dict[str, Any], stack: tuple[str, ...],
                 compile_spec: Callable[..., Any]):
    """Compile step ``name``'s included spec with its inputs bound; returns its Plan."""
    step = spec.steps[name]
    path = resolve_uses(spec, name, smap, stack)
    count, most = _included.get(), limit("max-includes")
    if count is not None:
        count[0] += 1
        if count[0] > most:
            raise smap.error(f"more than {most} included specs to compile (includes of includes multiply)",
                             ("steps", name, "uses"), kind=SpecLimitError,
                             hint="include each spec from fewer steps, or raise flowgpu.spec.max-includes")
    data, child_map = read_yaml(path)
    _count_steps(count, spec, data, name, smap)
    declared = (data.get("params") or {}) if isinstance(data, dict) else {}
    for key in step.params:
        if key not in declared:
            raise smap.error(f"{os.path.basename(path)} has no param {key!r}", ("steps", name, "params", key),
                             hint=did_you_mean(key, declared, f"its params: {', '.join(declared) or 'none'}"),
                             key=True)
    child = build(data, child_map, {f"params.{k}": v for k, v in step.params.items()})
    bindings: dict[str, da.Array] = {}
    for inner, ref in (step.inputs or {}).items():
        where = ("steps", name, "inputs", inner)
        if inner not in child.inputs:
            raise smap.error(f"{os.path.basename(path)} has no input {inner!r}", where, key=True,
                             hint=did_you_mean(inner, child.inputs, f"its inputs: {', '.join(child.inputs) or 'none'}"))
        head, _, part = ref.partition(".")
        x = values[head][part] if part and isinstance(values.get(head), dict) else values.get(ref)
        _check_binding(child, inner, x, where, smap, name)
        bindings[inner] = x
    me = spec.origin.file if spec.origin is not None else None
    try:
        return compile_spec(child, bindings, (*stack, os.path.abspath(me)) if me else stack)
    except SpecError:
        raise
