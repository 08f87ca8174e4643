"""Pipelines: YAML (or Python) specs validated, composed, compiled to one Dask graph, and run.

>>> from flowgpu import pipeline
>>> spec = pipeline.load("pipelines/quickstart.yaml")            # doctest: +SKIP
>>> plan = pipeline.compile(spec, params={"n": 2000})            # doctest: +SKIP
>>> result = pipeline.run(spec, overrides={"params.n": 2000})    # doctest: +SKIP
>>> p = pipeline.Pipeline("demo")                                 # or build one in Python (flowgpu.Pipeline)
"""

from __future__ import annotations

import functools
import os
from typing import Any

from flowgpu.pipeline.build import from_dict, load, load_spec
from flowgpu.pipeline.batch import check_joined
from flowgpu.pipeline.builder import Pipeline, Ref
from flowgpu.pipeline.compiler import Plan, compile
from flowgpu.pipeline.planning import describe
from flowgpu.pipeline.runconfig import RunConfig
from flowgpu.pipeline.runner import BatchResult, RunResult, check_outputs, plan_items, run, session_options
from flowgpu.pipeline.checks import check_session
from flowgpu.pipeline.spec import Spec, json_schema
from flowgpu.pipeline.foreach import expand
from flowgpu.pipeline.runner import status as _status
from flowgpu.pipeline.tables import check_items
from flowgpu.registry import checking_only, recording_imports

__all__ = ["BatchResult", "Pipeline", "Plan", "Ref", "RunConfig", "RunResult", "Spec", "compile", "describe", "from_dict", "imports",
           "json_schema", "load", "run", "status", "validate"]


def _runs_no_user_code(func: Any) -> Any:
    """``func`` with every import path checked in its module's source, never imported."""
    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        with checking_only():
            return func(*args, **kwargs)
    return checked


status = _runs_no_user_code(_status)


@_runs_no_user_code
def validate(spec: Spec | str | os.PathLike | dict, overrides: dict[str, Any] | None = None,
             params_file: str | None = None, *, foreach: dict[str, Any] | None = None, overwrite: bool = False,
             cluster: dict[str, Any] | None = None, allow_spec_address: bool = False) -> Spec:
    """Refuse all that :func:`run` would refuse before computing (``foreach``: each item of that batch, as
    ``--foreach``); runs nothing, calls no user code.

    With a scheduler address in ``cluster`` (``--scheduler``), its workers are asked whether they see
    the inputs and can write the outputs' folders, writing nothing. Returns the validated :class:`Spec`.
    """
    spec = load_spec(spec, overrides, params_file, foreach)  # as run loads it
    plan = compile(spec)
    check_outputs(spec, overwrite, {params_file: f"the params file {params_file!r}"} if params_file else None)
    items = expand(spec, foreach)  # a batch: within flowgpu.spec.max-items, every item as run checks it
    if len(items) > 1:
        plan_items(items, overwrite, params_file)
    else:
        check_items(items, [plan])
    options = session_options(spec, cluster, allow_spec_address)
    check_session(spec, options)
    if (cluster or {}).get("address"):  # --scheduler: ask its workers (a spec's own address is only checked)
        check_joined(spec, plan, options)
    return spec


def imports(spec: Spec | str | os.PathLike | dict, overrides: dict[str, Any] | None = None,
            params_file: str | None = None, **checks: Any) -> tuple[Spec, list[tuple[str, str]]]:
    """:func:`validate` ``spec`` and say what it would import: ``(what, "package.module:name")`` for
    every callable it names (``python`` sources, ``map_blocks`` functions, in included specs too).
    Running the spec runs them; ``flowgpu.trusted-modules`` limits where they may come from."""
    with recording_imports() as seen:
        checked = validate(spec, overrides, params_file, **checks)
    return checked, list(seen)
