"""Batches: one pipeline, once per value of some of its params (``foreach:``, ``--foreach``).

Several params make a grid (every combination, the first varying slowest). Each combination is an
:class:`Item` with a spec of its own, so every check is made for every item before any runs. A
batch holds at most ``flowgpu.spec.max-items`` items, counted before any is built.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flowgpu.errors import FlowgpuError, SpecError, SpecLimitError
from flowgpu.io.paths import glob_files
from flowgpu.pipeline.build import build, parse_value
from flowgpu.pipeline.loader import limit
from flowgpu.pipeline.spec import NAME_PATTERN, RANGE, ForeachGlob, ForeachRange, Spec

__all__ = ["Item", "expand", "in_item", "parse_option", "values_of"]

_GLOB_CHARS = set("*?[")


@dataclass
class Item:
    """One instance of a batch: its index, the values of its foreach params, and its own spec."""

    index: int
    values: dict[str, Any]
    spec: Spec
    of: int = 1

    @property
    def label(self) -> str:
        """``seed=1, input=data/a.npy`` (the spec's name outside a batch)."""
        if not self.values:
            return self.spec.name
        return ", ".join(f"{k}={v}" for k, v in self.values.items())


def in_item(error: FlowgpuError, item: Item) -> FlowgpuError:
    """``error`` naming the batch item it came from (a plain run's is left as it is)."""
    if item.of <= 1 and not item.values:
        return error
    said = f"batch item {item.index + 1} of {item.of} ({item.label}): "
    if isinstance(error, SpecError):
        return SpecError(said + error.message, file=error.file, line=error.line, col=error.col, path=error.path,
                         hint=error.hint)
    out = type(error)(said + str(error))
    out.__cause__ = error.__cause__
    return out


def _fail(message: str, where: str, hint: str, spec: Spec | None = None, path: tuple = (),
          kind: type[SpecError] = SpecError) -> SpecError:
    if spec is not None and path:
        return spec.error(message, path, hint=hint, kind=kind)
    return kind(message, path=where, hint=hint)


def _too_many(what: str, where: str, spec: Spec | None, path: tuple) -> SpecError:
    return _fail(f"{what}, more than the {limit('max-items'):,} items a batch may have", where,
                 "split it into smaller batches, or raise flowgpu.spec.max-items", spec, path, SpecLimitError)


_FRACTION_RANGE = re.compile(r"^\s*[-+]?[\d.]+\s*:\s*[-+]?[\d.]+\s*(?::\s*[-+]?[\d.]+\s*)?$")  # 0:1:0.25


def values_of(name: str, given: Any, *, spec: Spec | None = None, where: str | None = None) -> Sequence[Any]:
    """The values of one foreach param: a list, a glob, a range (never listed) or comma-separated text."""
    where = where or f"foreach.{name}"
    path = ("foreach", name) if where == f"foreach.{name}" else ()
    if isinstance(given, (ForeachGlob, ForeachRange)):
        given = given.model_dump()
    if isinstance(given, dict) and set(given) == {"glob"}:
        pattern = str(given["glob"])
        found = glob_files(pattern, limit("max-items"))
        if not found:
            raise _fail(f"the glob {pattern!r} matches no path", where,
                        "check the pattern (relative to the working directory)", spec, path)
        if len(found) > limit("max-items"):
            raise _too_many(f"the glob {pattern!r} matches more than {limit('max-items'):,} paths", where, spec, path)
        return found
    if isinstance(given, dict) and set(given) == {"range"}:
        text = given["range"]
        m = RANGE.match(str(text)) if not isinstance(text, list) else None
        bounds = [int(v) for v in text] if isinstance(text, list) else (
            [int(g) for g in m.groups() if g is not None] if m else None)
        if not bounds or not 2 <= len(bounds) <= 3 or (len(bounds) == 3 and bounds[2] == 0):
            raise _fail(f"{text!r} is not a range", where, "write start:stop or start:stop:step, e.g. 0:64:8",
                        spec, path)
        values = range(*bounds)
        if not values:
            raise _fail(f"the range {text!r} is empty", where, "stop must be past start, in step's direction",
                        spec, path)
        if len(values) > limit("max-items"):
            raise _too_many(f"the range {text!r} holds {len(values):,} values", where, spec, path)
        return values
    if isinstance(given, str):
        text = given.strip()
        if RANGE.match(text):
            return values_of(name, {"range": text}, spec=spec, where=where)
        if _FRACTION_RANGE.match(text):
            raise _fail(f"{text!r} is not a range: start:stop[:step] takes integers", where,
                        "list the values instead, e.g. 0,0.25,0.5,0.75", spec, path)
        if _GLOB_CHARS & set(text):
            return values_of(name, {"glob": text}, spec=spec, where=where)
        given = [parse_value(v.strip()) for v in text.split(",")] if text else []
    if isinstance(given, (list, tuple)):
        if not given:
            raise _fail("no values", where, "give at least one value", spec, path)
        if len(given) > limit("max-items"):
            raise _too_many(f"it lists {len(given):,} values", where, spec, path)
        return list(given)
    raise _fail(f"{given!r} is not a list of values, a glob or a range", where,
                "e.g. [0, 1, 2], {glob: data/*.npy} or {range: 0:8}", spec, path)


def parse_option(text: str) -> tuple[str, str]:
    key, sep, values = text.partition("=")
    name = key.strip().removeprefix("params.")
    if not sep or not re.match(NAME_PATTERN, name):
        raise SpecError(f"--foreach {text!r}: give params.NAME=VALUES", path="--foreach",
                        hint="VALUES: a comma list (0,1,2), a glob of paths (data/*.npy) or a range (0:64:8)")
    return name, values


def _declared(spec: Spec, name: str, where: str) -> None:
    if name in spec.params:
        return
    known = ", ".join(spec.params) or "none"
    path = ("foreach", name) if where.startswith("foreach.") else ()
    raise _fail(f"{name!r} is not a param of this spec", where,
                f"its params: {known}; declare it under params: and use it as ${{params.{name}}}", spec, path)


def expand(spec: Spec, foreach: dict[str, Any] | None = None) -> list[Item]:
    """Every item of the batch ``spec`` describes (its ``foreach:`` block, then ``foreach``); one item
    with no values without either."""
    origin = spec.origin
    pinned = {k.removeprefix("params.") for k in origin.overrides if k.startswith("params.")}
    axes: dict[str, list[Any]] = {}
    replaced = {k.removeprefix("params.") for k in foreach or {}}  # --foreach replaces the block's values
    for name, given in spec.foreach.items():
        if name not in pinned and name not in replaced:
            _declared(spec, name, f"foreach.{name}")
            axes[name] = values_of(name, given, spec=spec)
    for key, given in (foreach or {}).items():
        name = key.removeprefix("params.")
        where = f"--foreach params.{name}"
        _declared(spec, name, where)
        if name in pinned:
            raise SpecError(f"params.{name} is also set (--set or --params)", path=where,
                            hint="give it one way: a single value, or values to iterate over")
        axes[name] = values_of(name, given, spec=spec, where=where)
    if not axes:
        return [Item(0, {}, spec)]
    count = math.prod(len(v) for v in axes.values())
    if count > limit("max-items"):  # each axis is within the limit: their grid is not
        grid = " x ".join(f"{len(v):,} {k}" for k, v in axes.items())
        where, path = ("foreach", ("foreach",)) if spec.foreach else ("--foreach", ())
        raise _too_many(f"the batch would have {count:,} items ({grid})", where, spec, path)
    items = []
    for i, combo in enumerate(itertools.product(*axes.values())):
        values = dict(zip(axes, combo))
        item = Item(i, values, spec, count)
        try:
            item.spec = build(origin.raw, origin.smap, {**origin.overrides, **{f"params.{k}": v for k, v in values.items()}})
        except SpecError as e:
            raise in_item(e, item) from None
        item.values = {k: item.spec.origin.params[k] for k in values}  # typed: what the run uses (3.0, not 3)
        items.append(item)
    return items
