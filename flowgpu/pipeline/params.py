"""Params: typed defaults, overrides (``--set params.n=1000``, ``--params file.yaml``) and the
substitution of ``${params.name}`` everywhere else in a spec.

A path param (one whose value is text, e.g. a glob's items) also gives its parts, as pathlib's
``PurePath`` names them: ``${params.tile.stem}`` (``data/tiles/t_01.npy`` -> ``t_01``), ``.name``
(``t_01.npy``), ``.suffix`` (``.npy``) and ``.parent`` (``data/tiles``), chained left to right
(``${params.tile.parent.name}`` -> ``tiles``).

A reference that is the whole value (``shape: [${params.n}, ${params.n}]``) is replaced by the
typed value; one inside a longer string (``path: out/${params.name}.zarr``) by its text.
"""

from __future__ import annotations

import difflib
import pathlib
from typing import Any

from flowgpu.errors import SpecError, SpecLimitError
from flowgpu.pipeline.loader import SourceMap, limit, parse_yaml
from flowgpu.pipeline.spec import PARAM_REF, PATH_ATTRIBUTES

__all__ = ["resolve_params", "substitute", "parse_value", "set_path", "split_overrides"]

_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list}


def parse_value(text: Any) -> Any:
    """A command-line value as YAML would read it: ``1000`` -> int, ``true`` -> bool, ``[1, 2]`` -> list."""
    if not isinstance(text, str) or not text.strip():
        return text
    try:
        return parse_yaml(text)[0]  # bounded like a spec file: no tags, no alias bombs, no deep nesting
    except SpecLimitError as e:
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise SpecLimitError(f"the value {shown!r}: {e.message}", hint=e.hint) from None
    except SpecError:
        return text  # not YAML: the text itself


def split_overrides(overrides: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``{"params.n": 5, "cluster.n_workers": 2}`` into params and other dotted paths."""
    params, other = {}, {}
    for key, value in (overrides or {}).items():
        if key.startswith("params."):
            params[key[len("params."):]] = value
        else:
            other[key] = value
    return params, other


def set_path(data: dict, dotted: str, value: Any, smap: SourceMap) -> None:
    """Set ``data["a"]["b"] = value`` for ``dotted="a.b"``, creating mappings on the way."""
    parts = dotted.split(".")
    if len(parts) > limit("max-depth"):
        raise SpecLimitError(f"--set {dotted[:40]}...: the key has {len(parts)} parts, more than "
                             f"flowgpu.spec.max-depth ({limit('max-depth')})",
                             hint="set a key of the spec's own sections, e.g. params.n=1000")
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part) if isinstance(node, dict) else None
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise smap.error(f"--set {dotted}: {'.'.join(parts[: i + 1])} is not a mapping", tuple(parts[: i + 1]),
                             hint="--set sets keys of mappings, e.g. params.n=1000 or cluster.n_workers=2")
        node = nxt
    node[parts[-1]] = parse_value(value)


def _typed(name: str, kind: str | None, value: Any, where: tuple, smap: SourceMap, source: str) -> Any:
    if kind is None or value is None:
        return value
    want = _TYPES[kind]
    value = parse_value(value) if isinstance(value, str) and kind != "str" else value
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, want) and not (kind in ("int", "float") and isinstance(value, bool)):
        return value
    raise smap.error(f"param {name!r} is {kind} but {source} gives {value!r} ({type(value).__name__})", where,
                     hint=f"give a {kind} value")


def resolve_params(data: dict, smap: SourceMap, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The value of every param: default, then ``overrides`` (already merged from file and --set)."""
    raw = data.get("params") or {}
    if not isinstance(raw, dict):
        raise smap.error("params must be a mapping of name: default", ("params",),
                         hint="e.g. params: {n: 1000, dtype: float32}")
    values: dict[str, Any] = {}
    kinds: dict[str, str | None] = {}
    for name, p in raw.items():
        where = ("params", name)
        if isinstance(p, dict):
            for key in p:
                if key not in ("type", "default", "description"):
                    close = difflib.get_close_matches(str(key), ["type", "default", "description"], n=1)
                    raise smap.error(f"unknown key {key!r}", where + (key,), key=True,
                                     hint=f"did you mean {close[0]!r}?" if close else
                                     "a param has type, default and description")
            kind = p.get("type")
            if kind is not None and kind not in _TYPES:
                raise smap.error(f"param {name!r} has unknown type {kind!r}", where + ("type",),
                                 hint=f"choose one of {', '.join(_TYPES)}")
            default = p.get("default")
        else:
            kind, default = None, p
        if kind is None and default is not None:
            kind = next((k for k, t in _TYPES.items() if type(default) is t), None)
        kinds[name] = kind
        values[name] = _typed(name, kind, default, where, smap, "its default")
    for name, value in (overrides or {}).items():
        if name not in raw:
            close = difflib.get_close_matches(name, list(raw), n=3)
            hint = f"did you mean {', '.join(map(repr, close))}?" if close else (
                f"this spec's params: {', '.join(raw) or 'none'}; declare it under params:")
            raise smap.error(f"override params.{name} names a param this spec does not declare", ("params",),
                             hint=hint, key=True)
        values[name] = _typed(name, kinds[name], value, ("params", name), smap, "the override")
    for name, value in values.items():
        if value is None:
            raise smap.error(f"param {name!r} has no value", ("params", name),
                             hint=f"give it a default, or set it: --set params.{name}=...")
    return values


def _attribute(m: Any, values: dict[str, Any], smap: SourceMap, path: tuple) -> Any:
    """The value ``${params.name.attr...}`` in match ``m`` stands for: the param's value, or (with
    attributes) that of a path param's ``name``, ``stem``, ``suffix`` or ``parent`` as pathlib says."""
    name, attrs = m.group(1), m.group(2)
    value = values[name]
    if not attrs:
        return value
    allowed = ", ".join(f".{a}" for a in PATH_ATTRIBUTES)
    if not isinstance(value, str):
        raise smap.error(f"{m.group(0)}: param {name!r} is {type(value).__name__} ({value!r}), not a path: "
                         f"{attrs.split('.')[1]!r} is an attribute of path params ({allowed})", path,
                         hint=f"use ${{params.{name}}} for its value, or give a path (text) param, e.g. a glob's items")
    for attr in attrs.split(".")[1:]:
        if attr not in PATH_ATTRIBUTES:
            close = difflib.get_close_matches(attr, PATH_ATTRIBUTES, n=1)
            raise smap.error(f"{m.group(0)}: unknown attribute {attr!r} of path param {name!r}", path,
                             hint=(f"did you mean .{close[0]}? " if close else "") + f"a path param has {allowed}, "
                                  f"e.g. ${{params.{name}.stem}} (data/t_01.npy -> t_01)")
        value = str(getattr(pathlib.PurePath(value), attr))
    return value


def substitute(data: Any, values: dict[str, Any], smap: SourceMap, path: tuple = ()) -> Any:
    """Replace ``${params.name}`` (and ``${params.name.stem}``, ...: :data:`PATH_ATTRIBUTES` of a
    path param) in every string of ``data`` (but the ``params`` block itself)."""
    if isinstance(data, dict):
        return {k: (v if path == () and k == "params" else substitute(v, values, smap, path + (k,)))
                for k, v in data.items()}
    if isinstance(data, list):
        return [substitute(v, values, smap, path + (i,)) for i, v in enumerate(data)]
    if not isinstance(data, str) or "${" not in data:
        return data
    for m in PARAM_REF.finditer(data):
        if m.group(1) not in values:
            close = difflib.get_close_matches(m.group(1), list(values), n=3)
            hint = f"did you mean ${{params.{close[0]}}}?" if close else (
                f"declare it under params: (defined: {', '.join(values) or 'none'})")
            raise smap.error(f"undefined param {m.group(1)!r} in {data!r}", path, hint=hint)
        _attribute(m, values, smap, path)
    whole = PARAM_REF.fullmatch(data)
    if whole:
        return _attribute(whole, values, smap, path)
    if "${" in PARAM_REF.sub("", data):
        raise smap.error(f"malformed param reference in {data!r}", path,
                         hint="write references as ${params.name} (a path param's parts: ${params.name.stem}, "
                              ".name, .suffix, .parent)")
    return PARAM_REF.sub(lambda m: str(_attribute(m, values, smap, path)), data)
