"""The summary of a run that failed, and writing summaries atomically."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

from flowgpu import __version__
from flowgpu.errors import SpecError
from flowgpu.pipeline.compiler import Plan
from flowgpu.pipeline.spec import Spec

__all__ = ["failure_summary", "write_json"]


def write_json(path: str, data: dict) -> None:
    """Write ``data`` to ``path`` as JSON atomically: a temporary file beside it, then a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=str)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _failed_step(spec: Spec, plan: Plan | None, error: BaseException) -> str | None:
    """The input or step an error came from, when it can be told: the spec field it names, the
    node whose tasks failed (a worker's ``KilledWorker``), or the map_blocks function it raised in."""
    chain, e = [], error
    while e is not None and len(chain) < 8:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        path = getattr(e, "path", None)
        if isinstance(e, SpecError) and isinstance(path, str) and path.split(".")[0] in ("steps", "inputs"):
            return path.split(".")[1] if "." in path else None
        key = getattr(e, "task", None) or getattr(e, "key", None)
        key = key[0] if isinstance(key, tuple) and key else key
        if plan is not None and isinstance(key, str):
            for name, node in plan.nodes.items():
                if node.array is not None and node.array.name == key:
                    return node.fused_into or name
        for note in getattr(e, "__notes__", ()):
            users = [n for n, st in spec.steps.items() if st.op == "map_blocks" and repr(st.args.get("function")) in note]
            if len(users) == 1:
                return users[0]
    return None


def failure_summary(spec: Any, state: dict[str, Any], error: BaseException, wall: float) -> dict[str, Any]:
    """The summary of a run that failed: the error, its step when known, and what was (not) written."""
    given = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else None  # a spec file that did not load
    spec = spec if isinstance(spec, Spec) else None
    plan = state.get("plan")
    outputs = {}
    for name, out in (spec.outputs.items() if spec is not None else ()):
        written = name in state["written"]
        outputs[name] = {"from": out.from_, "sink": out.sink, "path": out.path, "written": written,
                         **({"location": state["written"][name]} if written else {})}
    message = "interrupted" if isinstance(error, KeyboardInterrupt) else str(error)
    return {
        "flowgpu": __version__,
        "name": spec.name if spec is not None else None,
        "file": spec._origin.file if spec is not None and spec._origin else given,
        "status": "failed",
        "error": message,
        "error_type": type(error).__name__,
        "step": _failed_step(spec, plan, error) if spec is not None else None,
        "wall_seconds": wall,
        "params": dict(spec._origin.params) if spec is not None and spec._origin else {},
        "written": sorted(state["written"]),
        "not_written": sorted(set(outputs) - set(state["written"])),
        "outputs": outputs,
    }
