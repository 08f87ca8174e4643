"""The pipeline spec: pydantic models for the YAML file and for pipelines built in Python.

A spec has ``params`` (typed defaults, referenced as ``${params.name}``), ``inputs`` (named
sources), ``steps`` (named ops, or other spec files through ``uses``), ``outputs`` (named sinks)
and an optional ``cluster`` block. Unknown keys are refused everywhere, and the JSON schema that
editors use (``flowgpu schema``) is generated from these same models.

Examples
--------
>>> from flowgpu.pipeline.spec import Spec
>>> spec = Spec.model_validate({
...     "name": "demo",
...     "inputs": {"x": {"source": "random", "shape": [100, 100], "seed": 0}},
...     "steps": {"total": {"op": "sum", "inputs": ["x"]}},
...     "outputs": {"total": {"from": "total"}},
... })
>>> spec.steps["total"].op
'sum'
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator
from pydantic.json_schema import GenerateJsonSchema

__all__ = [
    "Spec", "Param", "Step", "Output", "Cluster", "Input", "Expect", "SOURCE_MODELS", "NAME_PATTERN",
    "PARAM_REF", "json_schema",
]

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
PARAM_REF = re.compile(r"\$\{params\.([A-Za-z_][A-Za-z0-9_]*)\}")
Chunks = Union[Literal["auto"], int, str, list[Union[int, Literal["auto"], list[int]]]]
Scalar = Union[bool, int, float, str, None]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


# -- params -----------------------------------------------------------------------------------------
class Param(_Model):
    """A typed parameter; ``${params.<name>}`` anywhere in the spec is replaced by its value."""

    type: Literal["int", "float", "str", "bool", "list"] | None = Field(
        None, description="Type of the value; taken from `default` when not given.")
    default: Any = Field(None, description="Value used unless overridden by --set params.<name>=... or --params FILE.")
    description: str = ""


# -- inputs (sources) -------------------------------------------------------------------------------
class _Source(_Model):
    chunks: Chunks = Field("auto", description="Chunk shape, a byte size such as '256MiB', or 'auto'.")


class _Generated(_Source):
    shape: list[int] = Field(..., description="Array shape, e.g. [10000, 10000].")
    dtype: str = "float64"

    @field_validator("shape")
    @classmethod
    def _non_negative(cls, v: list[int]) -> list[int]:
        if any(s < 0 for s in v):
            raise ValueError("shape lengths must be >= 0")
        return v


class RandomSource(_Generated):
    """Uniform random numbers in [0, 1), reproducible per seed."""

    source: Literal["random"]
    seed: int | None = None


class NormalSource(_Generated):
    """Normal random numbers, reproducible per seed."""

    source: Literal["normal"]
    seed: int | None = None
    loc: float = 0.0
    scale: float = 1.0


class ZerosSource(_Generated):
    source: Literal["zeros"]


class OnesSource(_Generated):
    source: Literal["ones"]


class FullSource(_Generated):
    source: Literal["full"]
    fill_value: float | int | bool


class ArangeSource(_Source):
    """Evenly spaced values in [start, stop)."""

    source: Literal["arange"]
    start: float | int = 0
    stop: float | int
    step: float | int = 1
    dtype: str | None = None


class ZarrSource(_Source):
    """A Zarr array (path relative to the working directory)."""

    source: Literal["zarr"]
    path: str
    component: str | None = None
    chunks: Chunks | None = None


class NpySource(_Source):
    """A ``.npy`` file, read chunk by chunk (path relative to the working directory)."""

    source: Literal["npy"]
    path: str


class PythonSource(_Source):
    """An array returned by a Python callable given by import path, ``package.module:function``."""

    source: Literal["python"]
    callable: str = Field(..., description="Import path of a function returning an array, e.g. 'mypkg.data:load'.")
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the callable.")

    @field_validator("callable")
    @classmethod
    def _import_path(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z_][\w.]*[:.][A-Za-z_]\w*$", v):
            raise ValueError("give an import path such as 'mypkg.data:load'")
        return v


SOURCE_MODELS = (RandomSource, NormalSource, ZerosSource, OnesSource, FullSource, ArangeSource, ZarrSource,
                 NpySource, PythonSource)
Input = Annotated[Union[SOURCE_MODELS], Field(discriminator="source")]


# -- steps ------------------------------------------------------------------------------------------
class Expect(_Model):
    """Checks on a step's result, made when the spec is compiled (before anything runs)."""

    shape: list[int | None] | None = Field(None, description="Expected shape; null matches any length.")
    dtype: str | None = None


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


# -- outputs (sinks) --------------------------------------------------------------------------------
class Output(_Model):
    """Where a result goes: a Zarr store, a .npy file, or the run summary (scalars, small arrays)."""

    from_: str = Field(..., alias="from", description="Name of the input or step (or `step.output`) to write.")
    sink: Literal["zarr", "npy", "summary"] = "summary"
    path: str | None = Field(None, description="Destination for zarr/npy sinks (relative to the working directory).")
    component: str | None = None

    @model_validator(mode="after")
    def _path(self) -> "Output":
        if self.sink in ("zarr", "npy") and not self.path:
            raise ValueError(f"a {self.sink} output needs a 'path'")
        if self.sink == "summary" and self.path:
            raise ValueError("a summary output has no 'path'; use sink: zarr or npy to write a file")
        return self


# -- cluster ----------------------------------------------------------------------------------------
class Cluster(_Model):
    """Session options (see ``flowgpu.Session``); the CLI's --scheduler/--gpus override them."""

    backend: Literal["auto", "gpu", "cpu"] | None = None
    address: str | None = None
    gpus: list[int] | str | int | None = None
    n_workers: int | None = Field(None, ge=1)
    threads_per_worker: int | None = Field(None, ge=1)
    memory_limit: str | int | float | None = None
    device_memory_limit: str | int | float | None = None
    rmm_pool_size: str | int | float | None = None
    local_directory: str | None = None
    dashboard_address: str | None = None


# -- the spec ---------------------------------------------------------------------------------------
class Spec(_Model):
    """A whole pipeline."""

    version: Literal[1] = 1
    name: str = "pipeline"
    description: str = ""
    params: dict[Annotated[str, Field(pattern=NAME_PATTERN)], Union[Param, Scalar, list[Any]]] = Field(
        default_factory=dict, description="Typed defaults: `n: 1000` or `n: {type: int, default: 1000}`.")
    inputs: dict[Annotated[str, Field(pattern=NAME_PATTERN)], Input] = Field(default_factory=dict)
    steps: dict[Annotated[str, Field(pattern=NAME_PATTERN)], Step] = Field(default_factory=dict)
    outputs: dict[Annotated[str, Field(pattern=NAME_PATTERN)], Output] = Field(default_factory=dict)
    cluster: Cluster = Field(default_factory=Cluster)
    # where the spec came from (file, source map, data before params were substituted); set by load()
    _origin: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _names_unique(self) -> "Spec":
        both = sorted(set(self.inputs) & set(self.steps))
        if both:
            raise ValueError(f"{both[0]!r} is both an input and a step; give them different names")
        return self


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
    out = Spec.model_json_schema(by_alias=True, schema_generator=_ParamFriendly)
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "flowgpu pipeline spec"
    return out
