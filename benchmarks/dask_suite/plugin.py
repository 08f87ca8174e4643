"""A pytest plugin: every dask array computation of the test session goes through flowgpu's fusion.

    python -m pytest -p benchmarks.dask_suite.plugin ...

At configure time it sets, for the whole session, dask's ``array_optimize`` hook to
:func:`flowgpu.fusion.graph.array_optimize` and ``flowgpu.fuse-ufuncs: true`` (what
``flowgpu.fusion.fusing()`` sets for a block), so every ``.compute()``, ``dask.compute`` and
``persist`` on the threaded or sync scheduler is optimised by flowgpu first. It only toggles
config: whatever the optimisation does today is what the tests see.

It also counts the computations that went through the hook and those whose optimised graph calls
code of flowgpu (a fused kernel); with ``FLOWGPU_DASK_SUITE_CENSUS=DIR`` it writes them to
``DIR/census-main.json`` when the session ends (under pytest-xdist, each worker hands its counts
to the controller, which writes the sum), so the runner can tell "fused and passed" from "never
fused at all".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dask
import pytest
from dask._task_spec import DataNode, Task

from flowgpu.fusion import graph

CONFIG = "flowgpu.fuse-ufuncs"
CENSUS_ENV = "FLOWGPU_DASK_SUITE_CENSUS"

census = {"computes": 0, "fused": 0}
_setting: Any = None
_census_file: Path | None = None  # where the counts go, decided before any test runs
WORKER_KEY = "flowgpu_census"  # the counts in an xdist worker's workeroutput


def _ours(func: Any) -> bool:
    mod = getattr(func, "__module__", None) or getattr(type(func), "__module__", "") or ""
    return mod.startswith("flowgpu.") or type(func).__module__.startswith("flowgpu.")


def _calls_flowgpu(node: Any, depth: int = 0) -> bool:
    """Whether a task (or a graph, or what a task holds) calls a function of flowgpu."""
    if depth > 12:
        return False
    if isinstance(node, Task):
        if _ours(node.func) or any(_ours(f) for f in getattr(node.func, "funcs", ())):
            return True
        return any(_calls_flowgpu(a, depth + 1) for a in (*node.args, *node.kwargs.values()))
    if isinstance(node, DataNode):
        return _calls_flowgpu(node.value, depth + 1)
    if isinstance(node, Mapping):
        return any(_calls_flowgpu(v, depth + 1) for v in node.values())
    if isinstance(node, (list, tuple)):
        return any(_calls_flowgpu(v, depth + 1) for v in node)
    return False


def counting_optimize(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """flowgpu's ``array_optimize``, counting what it returns."""
    out = graph.array_optimize(dsk, keys, **kwargs)
    census["computes"] += 1
    if _calls_flowgpu(out):
        census["fused"] += 1
    return out


def pytest_configure(config: Any) -> None:
    global _setting, _census_file
    _setting = dask.config.set({"array_optimize": counting_optimize, CONFIG: True})
    folder = os.environ.get(CENSUS_ENV)  # read now: a test may change os.environ
    if folder:
        _census_file = Path(folder) / "census-main.json"


def pytest_report_header(config: Any) -> str:
    return f"flowgpu fusion on for every compute: array_optimize={graph.__name__}.array_optimize, {CONFIG}=true"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """On the xdist controller: add a finished worker's counts."""
    for k, v in getattr(node, "workeroutput", {}).get(WORKER_KEY, {}).items():
        census[k] = census.get(k, 0) + v


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: Any) -> None:
    """A worker hands its counts to the controller; the controller (or a run without xdist) writes them."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[WORKER_KEY] = dict(census)
    elif _census_file is not None:
        _census_file.parent.mkdir(parents=True, exist_ok=True)
        _census_file.write_text(json.dumps(census))


def pytest_unconfigure(config: Any) -> None:
    global _setting
    if _setting is not None:
        _setting.__exit__(None, None, None)
        _setting = None
