"""From YAML data to a validated :class:`~flowgpu.pipeline.spec.Spec`, with errors that point into the file.

Params: typed defaults, overrides (``--set``, ``--params``) and the substitution of ``${params.name}``
(and a path param's parts, ``${params.tile.stem}``, as pathlib names them). A reference that is the
whole value is replaced by the typed value; one inside a longer string by its text.
"""

from __future__ import annotations

import copy
import difflib
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from flowgpu.errors import SpecError, SpecLimitError, did_you_mean
from flowgpu.io import sinks, sources
from flowgpu.io.paths import glob_files
from flowgpu.pipeline import spec as S
from flowgpu.pipeline.loader import SourceMap, limit, parse_yaml, read_yaml
from flowgpu.pipeline.spec import PARAM_REF, PARAM_TYPES, PATH_ATTRIBUTES, RANGE, Origin
from flowgpu.registry import add_import_dirs

# where each value of a params file is written: param name -> (the file's SourceMap, the path in it)
Written = dict[str, tuple[SourceMap, tuple]]

__all__ = ["Origin", "build", "load", "from_dict", "read_params_file", "import_dirs", "parse_value",
           "load_spec"]


# -- params: typed defaults, overrides and substitution ----------------------------------------------
def clip(text: str, most: int) -> str:
    return text if len(text) <= most else text[:most - 3] + "..."


def parse_value(text: Any) -> Any:
    """A command-line value as YAML would read it: ``1000`` -> int, ``true`` -> bool, ``[1, 2]`` -> list."""
    if not isinstance(text, str) or not text.strip():
        return text
    try:
        return parse_yaml(text)[0]  # bounded like a spec file: no tags, no alias bombs, no deep nesting
    except SpecLimitError as e:
        raise SpecLimitError(f"the value {clip(text, 40)!r}: {e.message}", hint=e.hint) from None
    except SpecError:
        return text  # not YAML: the text itself


def set_path(data: dict, dotted: str, value: Any, smap: SourceMap) -> None:
    parts = dotted.split(".")
    if len(parts) > limit("max-depth"):
        raise SpecLimitError(f"--set {dotted[:40]}...: the key has {len(parts)} parts, more than "
                             f"flowgpu.spec.max-depth ({limit('max-depth')})",
                             hint="set a key of the spec's own sections, e.g. params.n=1000")
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)  # a mapping: build() checked the document is one, and the loop each part
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
    want = PARAM_TYPES[kind]
    value = parse_value(value) if isinstance(value, str) and kind != "str" else value
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, want) and not (kind in ("int", "float") and isinstance(value, bool)):
        return value
    raise smap.error(f"param {name!r} is {kind} but {source} gives {value!r} ({type(value).__name__})", where,
                     hint=f"give {'an' if kind[0] in 'aeiou' else 'a'} {kind} value" + (
                         f", or write the default of {name!r} with a decimal point to make it a float param"
                         if kind == "int" and isinstance(value, float) else ""))


def _stand_in(given: Any) -> Any:
    """The first value of a param a batch iterates over: it stands for them where the spec is checked."""
    if isinstance(given, dict) and len(given) == 1:
        given = next(iter(given.values()))  # {glob: ...} or {range: ...}
    if isinstance(given, (list, tuple)):
        return given[0] if given else None
    if not isinstance(given, str):
        return None
    if m := RANGE.match(given):
        return int(m.group(1))
    if set("*?[") & set(given):
        return (glob_files(given, 1) or [given])[0]
    return parse_value(given.split(",")[0].strip())


def resolve_params(data: dict, smap: SourceMap, overrides: dict[str, Any] | None = None,
                   iterated: dict[str, Any] | None = None, written: Written | None = None) -> dict[str, Any]:
    """The value of every param: default, then ``overrides``; one with neither that a batch iterates over
    (``foreach:``, then ``iterated``) stands for its first value. ``written``: where overrides read from a
    params file are written, for errors that point there."""
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
                    raise smap.error(f"unknown key {key!r}", where + (key,), key=True, hint=did_you_mean(
                        key, ["type", "default", "description"], "a param has type, default and description"))
            kind = p.get("type")
            if kind is not None and kind not in PARAM_TYPES:
                raise smap.error(f"param {name!r} has unknown type {kind!r}", where + ("type",),
                                 hint=f"choose one of {', '.join(PARAM_TYPES)}")
            default = p.get("default")
        else:
            kind, default = None, p
        if kind is None and default is not None:
            kind = next((k for k, t in PARAM_TYPES.items() if type(default) is t), None)
        kinds[name] = kind
        ref = PARAM_REF.search(default) if isinstance(default, str) else None
        if ref is not None:  # substituted nowhere: it would name a folder '${params.base}'
            raise smap.error(f"param {name!r} defaults to {default!r}, which uses ${{params.{ref.group(1)}}}: a "
                             "param's default is not substituted", where,
                             hint=f"write the value out, or join the params where the value is used, e.g. path: "
                                  f"\"${{params.{ref.group(1)}}}/...\"")
        values[name] = _typed(name, kind, default, where, smap, "its default")
    for name, value in (overrides or {}).items():
        at, where = (written or {}).get(name, (smap, None))  # a params file's value: errors point into that file
        if name not in raw:
            hint = did_you_mean(name, raw, f"this spec's params: {', '.join(raw) or 'none'}; declare it under params:",
                                n=3)
            raise at.error(f"{'params file entry' if where else 'override'} params.{name} names a param this spec "
                           "does not declare", where or ("params",), hint=hint, key=True)
        values[name] = _typed(name, kinds[name], value, where or ("params", name), at,
                              "the params file" if where else "the override")
    block = data.get("foreach")
    iterated = {**(block if isinstance(block, dict) else {}), **(iterated or {})}
    for name, value in values.items():
        if value is None and name in iterated and (first := _stand_in(iterated[name])) is not None:
            values[name] = value = _typed(name, kinds[name], first, ("params", name), smap, "its first foreach value")
        if value is None:
            raise smap.error(f"param {name!r} has no value", ("params", name),
                             hint=f"give it a default, set it (--set params.{name}=...) or iterate over it "
                                  f"(foreach: or --foreach params.{name}=...)")
    return values


def _attribute(m: Any, values: dict[str, Any], smap: SourceMap, path: tuple) -> Any:
    """The value ``${params.name.attr...}`` in match ``m`` stands for."""
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
    """Replace ``${params.name...}`` in every string of ``data`` (but the ``params`` block itself)."""
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


def _fields_at(data: Any, path: tuple) -> list[str]:
    model = {(): S.Spec, ("cluster",): S.Cluster}.get(path)
    if model is None and len(path) == 2:
        model = {"steps": S.Step, "params": S.Param}.get(path[0])
        entry = (data.get(path[0], {}).get(path[1]) or {}) if isinstance(data, dict) else {}
        if path[0] == "inputs" and isinstance(entry, dict):
            model = S.input_model(entry.get("source"))
        if path[0] == "outputs" and isinstance(entry, dict):
            model = S.output_model(entry.get("sink", sinks.DEFAULT_SINK))
    if model is None and len(path) == 3 and path[0] == "steps" and path[2] == "expect":
        model = S.Expect
    if model is None:
        return []
    return [f.alias or name for name, f in model.model_fields.items()]


def _sinks_with(data: Any, path: tuple, key: str) -> list[str]:
    """The sinks taking option ``key``, when ``path`` is an output that names no sink ([] otherwise)."""
    entry = (data.get("outputs") or {}).get(path[1]) if len(path) == 2 and path[0] == "outputs" else None
    if not isinstance(entry, dict) or "sink" in entry:
        return []
    return [n for n in sinks.sink_names() if key in getattr(S.output_model(n), "model_fields", {})]


def _data_path(data: Any, loc: tuple) -> tuple:
    """The part of pydantic's ``loc`` that names real places in ``data`` (drops union tags etc.)."""
    out: list = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            out.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            out.append(part)
            node = node[part]
        elif part == "[key]":
            break
    return tuple(out)


def _translate(err: dict, data: Any, smap: SourceMap) -> SpecError:
    loc = tuple(err.get("loc", ()))
    kind = err.get("type", "")
    msg = err.get("msg", "invalid value").removeprefix("Value error, ")
    path = _data_path(data, loc)
    if kind == "extra_forbidden":
        key = loc[-1]
        parent = path[:-1] if path[-1:] == (key,) else path
        allowed = _fields_at(data, parent)
        if (owners := _sinks_with(data, parent, key)):
            return smap.error(f"{key!r} is an option of sink {' or '.join(owners)}, and this output names no sink",
                              parent + (key,), hint=f"say which: sink: {owners[0]}", key=True)
        hint = did_you_mean("uses" if key == "include" and "uses" in allowed else key, allowed,
                            f"allowed here: {', '.join(allowed)}" if allowed else "remove it (see `flowgpu schema`)")
        return smap.error(f"unknown key {key!r}", parent + (key,), hint=hint, key=True)
    if kind == "missing":
        return smap.error(f"missing required key {loc[-1]!r}", path, hint=f"add '{loc[-1]}: ...' here")
    if kind == "union_tag_invalid":
        tag = err.get("ctx", {}).get("tag")
        field, registry = ("sink", sinks.SINKS) if path[:1] == ("outputs",) else ("source", sources.SOURCES)
        if tag in registry.broken:  # installed, but refused when loaded: why, not "unknown"
            return smap.error(registry.broken[tag], path + (field,), hint=f"fix the plugin, or choose another {field} "
                              f"(run 'flowgpu {field}s' to list them)")
        return smap.error(f"unknown {field} {tag!r}", path + (field,), hint=registry.suggest(tag))
    if kind == "union_tag_not_found":
        return smap.error("an input needs a 'source'", path,
                          hint=f"e.g. source: random (one of {', '.join(sources.source_names())})")
    if "[key]" in loc and kind == "string_pattern_mismatch":
        return smap.error(f"{err.get('input')!r} is not a valid name", path, key=True,
                          hint="names start with a letter or '_' and hold letters, digits and '_'")
    value = err.get("input")
    if kind.endswith(("_type", "_parsing")) or kind in ("literal_error", "enum"):
        return smap.error(f"wrong type or value {clip(repr(value), 63)}: {msg}", path,
                          hint="see `flowgpu schema` for the accepted values")
    return smap.error(msg, path, hint="see `flowgpu schema` or docs/pipelines.md for this field")


def build(data: Any, smap: SourceMap, overrides: dict[str, Any] | None = None,
          iterated: dict[str, Any] | None = None, written: Written | None = None) -> S.Spec:
    """Validate ``data`` (as read from YAML) into a Spec, params and overrides applied (``iterated``:
    ``--foreach`` values; ``written``: where the params file's are, as :func:`read_params_file` says)."""
    if not isinstance(data, dict):
        raise smap.error(f"a spec is a mapping of keys (name, inputs, steps, outputs, ...), not "
                         f"{type(data).__name__}", (), hint="start from pipelines/quickstart.yaml")
    overrides = dict(overrides or {})
    work = copy.deepcopy(data)
    for key, value in overrides.items():
        if key.startswith("params."):
            continue  # resolve_params gives params their values, typed
        if key.split(".")[0] not in S.Spec.model_fields:
            raise SpecError(f"--set {key}: {key.split('.')[0]!r} is not a section of a spec", file=smap.file,
                            line=1, col=1, path=clip(key, 60),
                            hint=did_you_mean(key.split(".")[0], S.Spec.model_fields, "use e.g. params.n=1000"))
        set_path(work, key, value, smap)
    values = resolve_params(work, smap, {k.removeprefix("params."): v for k, v in overrides.items()
                                         if k.startswith("params.")},
                            {k.removeprefix("params."): v for k, v in (iterated or {}).items()}, written)
    work = substitute(work, values, smap)
    import_dirs(smap.file)
    try:
        spec = S.Spec.model_validate(work)
    except ValidationError as e:
        raise _translate(e.errors(include_url=False)[0], work, smap) from None
    spec._origin = Origin(smap.file, smap, copy.deepcopy(data), values, overrides)
    return spec


def import_dirs(file: str | None) -> None:
    """Modules beside the spec file, then in the working directory, are importable by the spec."""
    add_import_dirs(*([os.path.dirname(os.path.abspath(file))] if file else []), os.getcwd())


def read_params_file(path: str) -> tuple[dict[str, Any], Written]:
    """``--params file.yaml``: a mapping of param name -> value (a top-level ``params:`` is accepted too), as
    overrides (``params.name``), and where each is written in the file."""
    data, smap = read_yaml(path, "params file")
    top: tuple = ()
    if isinstance(data, dict) and set(data) == {"params"}:
        data, top = data["params"], ("params",)
    if not isinstance(data, dict):
        raise smap.error("a params file is a mapping of name: value", top, hint="e.g. 'n: 1000'")
    return {f"params.{k}": v for k, v in data.items()}, {str(k): (smap, (*top, k)) for k in data}


def _given(overrides: dict[str, Any] | None, params_file: str | None) -> tuple[dict[str, Any], Written]:
    """The overrides: ``params_file``'s values, then ``overrides``; and where those still from the file are."""
    values, written = read_params_file(params_file) if params_file else ({}, {})
    overrides = overrides or {}
    return {**values, **overrides}, {k: w for k, w in written.items() if f"params.{k}" not in overrides}


def load(path: str | os.PathLike, overrides: dict[str, Any] | None = None, params_file: str | None = None,
         foreach: dict[str, Any] | None = None) -> S.Spec:
    """Read, check and return the spec at ``path``. ``overrides``: dotted keys to set, e.g.
    ``{"params.n": 1000}``, after ``params_file``'s; ``foreach``: a batch's values (``--foreach``)."""
    data, smap = read_yaml(path)
    given, written = _given(overrides, params_file)
    return build(data, smap, given, foreach, written)


def from_dict(data: dict, overrides: dict[str, Any] | None = None, foreach: dict[str, Any] | None = None) -> S.Spec:
    """A spec from Python data, with the same params handling and checks as a YAML file."""
    return build(data, SourceMap(None), overrides, foreach)


def load_spec(spec: S.Spec | str | os.PathLike | dict, overrides: dict[str, Any] | None = None,
              params_file: str | None = None, foreach: dict[str, Any] | None = None) -> S.Spec:
    """A spec from a path, a dict or a Spec, with ``overrides`` and the params file applied."""
    if isinstance(spec, (str, os.PathLike)):
        return load(spec, overrides, params_file, foreach)
    given, written = _given(overrides, params_file)
    if isinstance(spec, dict):
        return build(spec, SourceMap(None), given, foreach, written)
    if not given:
        return spec
    return build(spec.origin.raw, spec.origin.smap, {**spec.origin.overrides, **given}, written=written)
