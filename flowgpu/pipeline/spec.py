"""The pipeline spec: pydantic models for the YAML file and for pipelines built in Python.

Unknown keys are refused everywhere; ``flowgpu schema`` is generated from these models (so their
docstrings and descriptions are the schema's). The models of ``inputs`` and ``outputs`` come from
the source and sink registries (:func:`spec_model`, rebuilt when a registry changes), so a plugin's
source is validated like a built-in one.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Discriminator, Field, PrivateAttr, Tag, create_model,
                      model_validator)
from pydantic.json_schema import GenerateJsonSchema

from flowgpu import config
from flowgpu.errors import SpecError
from flowgpu.io import sinks, sources
from flowgpu.io.paths import resolve, shown
from flowgpu.pipeline.loader import SourceMap

__all__ = ["Origin", "Spec", "Param", "Step", "Output", "Cluster", "Expect", "ForeachGlob", "ForeachRange",
           "NAME_PATTERN", "PARAM_REF", "PARAM_TYPES", "PATH_ATTRIBUTES", "json_schema", "spec_model",
           "input_model", "output_model"]

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# ``${params.name}`` and ``${params.name.stem}``: group 1 the name, group 2 the attributes (".parent.name")
PARAM_REF = re.compile(r"\$\{params\.([A-Za-z_][A-Za-z0-9_]*)((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}")
PATH_ATTRIBUTES = ("name", "stem", "suffix", "parent")  # of a path param, as pathlib's
PARAM_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list}  # a param's type: by name
RANGE = re.compile(r"^\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+)\s*)?$")  # a foreach range: start:stop[:step]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
DTypeName = Annotated[str, AfterValidator(sources.dtype_name)]
Scalar = Union[bool, int, float, str, None]


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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# -- params -----------------------------------------------------------------------------------------
class Param(_Model):
    """A typed parameter; ``${params.<name>}`` anywhere in the spec is replaced by its value."""

    type: Literal[tuple(PARAM_TYPES)] | None = Field(
        None, description="Type of the value; taken from `default` when not given.")
    default: Any = Field(None, description="Value used unless overridden by --set params.<name>=... or --params FILE.")
    description: str = ""


# -- steps ------------------------------------------------------------------------------------------
class Expect(_Model):
    """Checks on a step's result, made when the spec is compiled (before anything runs)."""

    shape: list[int | None] | None = Field(None, description="Expected shape; null matches any length.")
    dtype: DTypeName | None = None


class Step(_Model):
    """One node: an ``op`` applied to its inputs, or another spec file through ``uses``."""

    op: str | None = Field(None, description="Name of a registered op (see `flowgpu ops`).")
    uses: str | None = Field(
        None, description="Another spec file (path relative to this one) whose outputs this step provides.")
    inputs: list[str] | dict[str, str] = Field(
        default_factory=list,
        description="Names of inputs or steps (`step.output` for a `uses` step). A mapping binds names: "
                    "op arguments, or the inputs of a `uses` spec.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the op.")
    params: dict[str, Any] = Field(default_factory=dict, description="Params passed to a `uses` spec.")
    expect: Expect | None = None
    description: str = ""

    @model_validator(mode="after")
    def _op_or_uses(self) -> "Step":
        if (self.op is None) == (self.uses is None):
            raise ValueError("give exactly one of 'op' or 'uses'")
        if self.uses is not None and isinstance(self.inputs, list) and self.inputs:
            raise ValueError("the inputs of a 'uses' step are a mapping: {name in that spec: name here}")
        if self.op is not None and self.params:
            raise ValueError("'params' belongs to 'uses' steps; give op arguments under 'args'")
        return self


class Output(_Model):
    """Where a result goes: a file or store (sinks that write a path), or the run summary."""

    from_: str = Field(..., alias="from", description="Name of the input or step (or `step.output`) to write.")
    # absolute before any graph is built: workers may run elsewhere
    path: Annotated[str, AfterValidator(resolve)] | None = Field(
        None, description="Destination of sinks that write a file or store (relative to the working directory, made "
                          "absolute there).")

    @model_validator(mode="before")
    @classmethod
    def _implied_sink(cls, data: Any) -> Any:
        if isinstance(data, dict) and "sink" not in data and (named := _implied(data.get("path"))):
            data = {**data, "sink": named}  # the one sink whose files are named as its path is
        return data

    @model_validator(mode="after")
    def _path(self) -> "Output":
        entry = sinks.sink_entry(self.sink)
        needs_path = entry.has(sinks.WRITES_PATH) or entry.has(sinks.COLLECTS)
        if needs_path and not self.path:
            raise ValueError(f"a {self.sink} output needs a 'path'")
        if not needs_path and self.path:
            fits = sinks.sinks_for(self.path)
            if "sink" not in self.model_fields_set and len(fits) > 1:
                raise ValueError(f"{shown(self.path)!r} may be written by sink {' or '.join(fits)}: say which "
                                 f"(sink: {fits[0]})")
            writers = [n for n in sinks.sink_names() if sinks.sink_entry(n).has(sinks.WRITES_PATH)]
            said = "takes no 'path'" if "sink" in self.model_fields_set else \
                "(the default when no sink is given and the path's suffix names none) takes no 'path'"
            raise ValueError(f"a {self.sink} output {said}; give the sink that writes the file (sink: "
                             f"{'|'.join(writers)}), or name the file so that its suffix says ({', '.join(_suffixes())})")
        return self

    def sink_options(self) -> dict[str, Any]:
        """The options this output gives its sink (all but from, sink and path)."""
        return self.model_dump(exclude={"from_", "sink", "path"})


def _implied(path: Any) -> str | None:
    """The sink an output with this path and no ``sink`` gets: the only one its suffix names."""
    fits = sinks.sinks_for(path)
    return fits[0] if len(fits) == 1 else None


def _suffixes() -> list[str]:
    """Each suffix that names one sink, as ``.npy: npy``."""
    by = {}
    for name in sinks.sink_names():
        for suffix in sinks.sink_entry(name).suffixes:
            by.setdefault(suffix, []).append(name)
    return [f"{suffix}: {names[0]}" for suffix, names in by.items() if len(names) == 1]


def _source_tag(v: Any) -> Any:
    return v.get("source") if isinstance(v, dict) else getattr(v, "source", None)


def _sink_tag(v: Any) -> Any:
    if isinstance(v, dict):
        return v["sink"] if "sink" in v else _implied(v.get("path")) or sinks.DEFAULT_SINK
    return getattr(v, "sink", None)


# -- cluster: its fields, types and descriptions made from flowgpu-schema.yaml, as a Session's ------
CLUSTER_OPTIONS = ("backend", "scheduler-address", "kind", "jobs", "gpus-per-job", "gpus", "n-workers",
                   "threads-per-worker", "memory-limit", "device-memory-limit", "rmm-pool-size", "local-directory",
                   "dashboard-address", "protocol")


def _annotation(schema: dict) -> Any:
    """The type a flowgpu-schema.yaml property declares ("4GiB" stays a string: the Session parses it)."""
    if "anyOf" in schema:
        return Union[tuple(_annotation(s) for s in schema["anyOf"])]
    if "enum" in schema or "const" in schema:
        return Literal[tuple(schema.get("enum", [schema.get("const")]))]
    kind = schema.get("type")
    if isinstance(kind, list):
        return Union[tuple(_annotation({**schema, "type": k}) for k in kind)]
    bounds = {"ge": schema["minimum"]} if "minimum" in schema else {}
    if kind == "null":
        return type(None)
    if kind == "integer":
        return Annotated[int, Field(**bounds)]
    if kind == "number":  # an int stays an int (4 bytes is not the fraction 4.0)
        return Union[Annotated[int, Field(**bounds)], Annotated[float, Field(**bounds)]]
    if kind == "string":
        return Annotated[str, Field(min_length=schema["minLength"])] if "minLength" in schema else str
    if kind == "boolean":
        return bool
    if kind == "array":
        return list[_annotation(schema["items"])]
    raise TypeError(f"flowgpu-schema.yaml: no type for {schema!r}")


def _option_name(key: str) -> str:
    return "address" if key == "scheduler-address" else key.replace("-", "_")


Cluster = create_model(
    "Cluster", __base__=_Model,
    __doc__="Session options (see ``flowgpu.Session``); the CLI's --scheduler/--cluster/--gpus override them.",
    **{_option_name(k): (Union[_annotation(config.SCHEMA["properties"][k]), None],
                         Field(None, description=config.SCHEMA["properties"][k].get("description")))
       for k in CLUSTER_OPTIONS})


# -- foreach ----------------------------------------------------------------------------------------
class ForeachGlob(_Model):
    """The paths that match a glob pattern (relative to the working directory), sorted."""

    glob: str = Field(..., description="e.g. data/*.npy; a pattern that matches nothing is refused.")


class ForeachRange(_Model):
    """The integers of ``start:stop[:step]``, as Python's range (stop excluded)."""

    range: str = Field(..., pattern=r"^\s*-?\d+\s*:\s*-?\d+\s*(:\s*-?\d+\s*)?$",
                       description="start:stop or start:stop:step, e.g. 0:64 or 100:1000:100")


ForeachValues = Union[list[Scalar], ForeachGlob, ForeachRange]


# -- the spec ---------------------------------------------------------------------------------------
class Spec(_Model):
    """A whole pipeline."""

    version: Literal[1] = 1
    name: str = "pipeline"
    description: str = ""
    params: dict[Name, Union[Param, Scalar, list[Any]]] = Field(
        default_factory=dict, description="Typed defaults: `n: 1000` or `n: {type: int, default: 1000}`.")
    inputs: dict[Name, Any] = Field(default_factory=dict, description="Named sources (see `flowgpu sources`).")
    steps: dict[Name, Step] = Field(default_factory=dict)
    outputs: dict[Name, Any] = Field(default_factory=dict, description="Named sinks (see `flowgpu sinks`).")
    cluster: Cluster = Field(default_factory=Cluster)
    foreach: dict[Name, ForeachValues] = Field(
        default_factory=dict,
        description="Run the pipeline once per value of these params (several: every combination), as one "
                    "batch on one cluster: `seed: [0, 1, 2]`, `input: {glob: data/*.npy}`, `n: {range: 100:500:100}`.")
    _origin: Origin | None = PrivateAttr(default=None)

    @property
    def origin(self) -> Origin:
        """Where the spec came from; for a spec made by ``Spec(...)``, its data (no file)."""
        if self._origin is None:
            data = self.model_dump(by_alias=True, exclude_defaults=True)
            self._origin = Origin(None, SourceMap(None), data)
        return self._origin

    def __eq__(self, other: object) -> bool:  # what it says, wherever it was read from (not its origin)
        return isinstance(other, Spec) and (self is other or self.model_dump() == other.model_dump())

    __hash__ = None  # as pydantic's models: mutable, so not hashable

    def error(self, message: str, path: tuple = (), hint: str | None = None, *,
              kind: type[SpecError] = SpecError) -> SpecError:
        """A :class:`SpecError` at ``path`` (``("steps", "z", "args")``), with ``file:line:col`` if known."""
        return self.origin.smap.error(message, path, hint=hint, kind=kind)

    @model_validator(mode="after")
    def _names_unique(self) -> "Spec":
        both = sorted(set(self.inputs) & set(self.steps))
        if both:
            raise ValueError(f"{both[0]!r} is both an input and a step; give them different names")
        return self

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> "Spec":
        if cls is Spec:
            return spec_model().model_validate(obj, **kwargs)
        return super().model_validate(obj, **kwargs)


def _tagged(model: type[BaseModel], field: str, name: str, base: type[BaseModel] | None = None,
            default: bool = False) -> type[BaseModel]:
    bases = (base, model) if base is not None else model
    title = "".join(part.capitalize() for part in name.replace(".", "_").split("_"))
    return create_model(f"{title}{'Source' if field == 'source' else 'Output'}", __base__=bases, __doc__=model.__doc__,
                        **{field: (Literal[name], name if default else ...)})


_cache: dict[tuple[int, int], tuple[type[Spec], dict[str, type], dict[str, type]]] = {}


def _generate() -> tuple[type[Spec], dict[str, type], dict[str, type]]:
    source_entries, sink_entries = sources.SOURCES.entries(), sinks.SINKS.entries()
    key = (sources.SOURCES.version, sinks.SINKS.version)
    if key not in _cache:
        ins = {e.name: _tagged(e.options, "source", e.name) for e in source_entries}
        outs = {e.name: _tagged(e.options, "sink", e.name, Output, e.name == sinks.DEFAULT_SINK) for e in sink_entries}
        input_union = Annotated[Union[tuple(Annotated[m, Tag(n)] for n, m in ins.items())],
                                Discriminator(_source_tag)]
        output_union = Annotated[Union[tuple(Annotated[m, Tag(n)] for n, m in outs.items())],
                                 Discriminator(_sink_tag)]
        model = create_model("Spec", __base__=Spec, __doc__=Spec.__doc__, **{
            section: (dict[Name, union], Field(default_factory=dict, description=Spec.model_fields[section].description))
            for section, union in (("inputs", input_union), ("outputs", output_union))})
        _cache.clear()
        _cache[key] = (model, ins, outs)
    return _cache[key]


def spec_model() -> type[Spec]:
    return _generate()[0]


def input_model(source: Any) -> type[BaseModel] | None:
    return _generate()[1].get(source)


def output_model(sink: Any) -> type[BaseModel] | None:
    return _generate()[2].get(sink)


class _ParamFriendly(GenerateJsonSchema):
    """JSON schema in which every number or boolean may also be a ``${params.name}`` reference."""

    _REF = {"type": "string", "pattern": r"^\$\{params\.[A-Za-z_][A-Za-z0-9_]*\}$"}

    def int_schema(self, schema):
        return {"anyOf": [super().int_schema(schema), self._REF]}

    def float_schema(self, schema):
        return {"anyOf": [super().float_schema(schema), self._REF]}

    def bool_schema(self, schema):
        return {"anyOf": [super().bool_schema(schema), self._REF]}


def json_schema() -> dict:
    """The JSON schema of a spec file (what ``flowgpu schema`` prints)."""
    out = spec_model().model_json_schema(by_alias=True, schema_generator=_ParamFriendly)
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "flowgpu pipeline spec"
    return out
