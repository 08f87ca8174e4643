"""Pipelines: YAML (or Python) specs validated, composed, compiled to one Dask graph, and run.

>>> from flowgpu import pipeline
>>> spec = pipeline.load("pipelines/quickstart.yaml")            # doctest: +SKIP
>>> plan = pipeline.compile(spec, params={"n": 2000})            # doctest: +SKIP
>>> result = pipeline.run(spec, overrides={"params.n": 2000})    # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

from flowgpu.pipeline.build import from_dict, load
from flowgpu.pipeline.compiler import Plan, compile
from flowgpu.pipeline.planning import describe
from flowgpu.pipeline.runner import RunResult, run
from flowgpu.pipeline.spec import Spec, json_schema

__all__ = ["Plan", "RunResult", "Spec", "compile", "describe", "from_dict", "json_schema", "load", "run",
           "validate"]


def validate(spec: Spec | str | os.PathLike | dict, overrides: dict[str, Any] | None = None,
             params_file: str | None = None) -> Spec:
    """Check a spec completely (schema, references, includes, shapes and dtypes); runs nothing.

    Returns the validated :class:`Spec`; raises :class:`~flowgpu.errors.SpecError` otherwise.
    """
    if isinstance(spec, (str, os.PathLike)):
        spec = load(spec, overrides, params_file)
    elif isinstance(spec, dict):
        spec = from_dict(spec, overrides)
    compile(spec)
    return spec
