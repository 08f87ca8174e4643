"""From YAML data to a validated :class:`~flowgpu.pipeline.spec.Spec`, with errors that point into the file."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from flowgpu.errors import SpecError, did_you_mean
from flowgpu.io import sinks, sources
from flowgpu.pipeline import spec as S
from flowgpu.pipeline.loader import SourceMap, read_yaml
from flowgpu.pipeline.params import resolve_params, set_path, split_overrides, substitute
from flowgpu.registry import add_import_dirs

__all__ = ["Origin", "build", "load", "from_dict", "read_params_file", "import_dirs"]


@dataclass
class Origin:
    """Where a spec came from, so it can be rebuilt with other params and errors can point into it."""

    file: str | None
    smap: SourceMap
    raw: dict  # the data before params were substituted and overrides applied
    params: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)

    @property
    def base_dir(self) -> str:
        return os.path.dirname(os.path.abspath(self.file)) if self.file else os.getcwd()


def _fields_at(data: Any, path: tuple) -> list[str]:
    """Allowed keys of the mapping at ``path`` (for 'did you mean' hints)."""
    models = {(): S.Spec, ("cluster",): S.Cluster}
    model = models.get(path)
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


def _describe(value: Any) -> str:
    text = repr(value)
    return (text[:60] + "...") if len(text) > 63 else text


def _translate(err: dict, data: Any, smap: SourceMap) -> SpecError:
    loc = tuple(err.get("loc", ()))
    kind = err.get("type", "")
    msg = err.get("msg", "invalid value").removeprefix("Value error, ")
    path = _data_path(data, loc)
    if kind == "extra_forbidden":
        key = loc[-1]
        parent = path[:-1] if path[-1:] == (key,) else path
        allowed = _fields_at(data, parent)
        hint = did_you_mean("uses" if key == "include" and "uses" in allowed else key, allowed,
                            f"allowed here: {', '.join(allowed)}" if allowed else "remove it (see `flowgpu schema`)")
        return smap.error(f"unknown key {key!r}", parent + (key,), hint=hint, key=True)
    if kind == "missing":
        return smap.error(f"missing required key {loc[-1]!r}", path, hint=f"add '{loc[-1]}: ...' here")
    if kind == "union_tag_invalid":
        tag = err.get("ctx", {}).get("tag")
        field, registry = ("sink", sinks.SINKS) if path[:1] == ("outputs",) else ("source", sources.SOURCES)
        return smap.error(f"unknown {field} {tag!r}", path + (field,), hint=registry.suggest(tag))
    if kind == "union_tag_not_found":
        return smap.error("an input needs a 'source'", path,
                          hint=f"e.g. source: random (one of {', '.join(sources.source_names())})")
    if "[key]" in loc and kind == "string_pattern_mismatch":
        return smap.error(f"{err.get('input')!r} is not a valid name", path, key=True,
                          hint="names start with a letter or '_' and hold letters, digits and '_'")
    value = err.get("input")
    if kind.endswith(("_type", "_parsing")) or kind in ("literal_error", "enum"):
        return smap.error(f"wrong type or value {_describe(value)}: {msg}", path,
                          hint="see `flowgpu schema` for the accepted values")
    return smap.error(msg, path, hint="see `flowgpu schema` or docs/pipelines.md for this field")


def build(data: Any, smap: SourceMap, overrides: dict[str, Any] | None = None) -> S.Spec:
    """Validate ``data`` (as read from YAML) into a Spec, after params and overrides are applied."""
    if not isinstance(data, dict):
        raise smap.error(f"a spec is a mapping of keys (name, inputs, steps, outputs, ...), not "
                         f"{type(data).__name__}", (), hint="start from pipelines/quickstart.yaml")
    raw = copy.deepcopy(data)
    param_over, other = split_overrides(overrides)
    work = copy.deepcopy(data)
    for key, value in other.items():
        if key.split(".")[0] not in S.Spec.model_fields:
            raise SpecError(f"--set {key}: {key.split('.')[0]!r} is not a section of a spec", file=smap.file,
                            line=1, col=1, path=key if len(key) <= 60 else key[:57] + "...",
                            hint=did_you_mean(key.split(".")[0], S.Spec.model_fields, "use e.g. params.n=1000"))
        set_path(work, key, value, smap)
    values = resolve_params(work, smap, param_over)
    work = substitute(work, values, smap)
    import_dirs(smap.file)
    try:
        spec = S.Spec.model_validate(work)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        raise _translate(errors[0], work, smap) from None
    spec._origin = Origin(smap.file, smap, raw, values, dict(overrides or {}))
    return spec


def import_dirs(file: str | None) -> None:
    """The one rule for import paths in a spec (``python`` sources, ``map_blocks``): modules beside
    the spec file, then in the working directory, are importable, besides ``sys.path``; the same
    under the ``flowgpu`` script, ``python -m flowgpu`` and Python."""
    add_import_dirs(*([os.path.dirname(os.path.abspath(file))] if file else []), os.getcwd())


def read_params_file(path: str) -> dict[str, Any]:
    """``--params file.yaml``: a mapping of param name -> value (a top-level ``params:`` is accepted too)."""
    data, smap = read_yaml(path)
    if isinstance(data, dict) and set(data) == {"params"}:
        data = data["params"]
    if not isinstance(data, dict):
        raise smap.error("a params file is a mapping of name: value", (), hint="e.g. 'n: 1000'")
    return {f"params.{k}": v for k, v in data.items()}


def load(path: str | os.PathLike, overrides: dict[str, Any] | None = None, params_file: str | None = None) -> S.Spec:
    """Read, check and return the spec at ``path`` (params substituted, overrides applied).

    Parameters
    ----------
    path : the YAML spec file.
    overrides : dotted keys to set, e.g. ``{"params.n": 1000, "cluster.n_workers": 2}``.
    params_file : a YAML file of param values, applied before ``overrides``.
    """
    data, smap = read_yaml(path)
    merged = dict(read_params_file(params_file)) if params_file else {}
    merged.update(overrides or {})
    return build(data, smap, merged)


def from_dict(data: dict, overrides: dict[str, Any] | None = None) -> S.Spec:
    """A spec from Python data, with the same params handling and checks as a YAML file."""
    return build(copy.deepcopy(data), SourceMap(None), overrides)
