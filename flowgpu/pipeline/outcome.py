"""What a run says it did: the summary of a run, of a batch and of a run that failed, written atomically."""

from __future__ import annotations

import os
from typing import Any

from flowgpu import __version__
from flowgpu.diagnostics import jsontext
from flowgpu.errors import SpecError
from flowgpu.io import atomic, sinks
from flowgpu.pipeline.compiler import Plan
from flowgpu.pipeline.planning import graph_size
from flowgpu.pipeline.spec import Spec

__all__ = ["batch_summary", "failure_summary", "is_summary", "moves_delta", "run_summary", "write_json"]

_HEAD = b'{\n  "flowgpu": '  # how every summary written here begins (its first key is the version)


def is_summary(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a run summary that :func:`write_json` wrote (a file that begins as one)."""
    return atomic.starts_with(os.fspath(path), _HEAD)


def write_json(path: str, data: dict, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` as JSON atomically (NaN as "NaN": valid JSON); ``overwrite=False``
    (a run's ``--summary``): refuse to replace a file that is not a summary."""
    atomic.write_text(path, jsontext.dumps(data, indent=2), head=None if overwrite else _HEAD, what="run summary")


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


def failure_summary(spec: Any, plan: Plan | None, moved: dict[str, str], error: BaseException,
                    wall: float) -> dict[str, Any]:
    """The summary of a run that failed: the error, its step when known (``plan``: the first item's,
    once compiled), and what was (not) written (``moved``: output name -> location moved into place)."""
    given = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else None  # a spec file that did not load
    spec = spec if isinstance(spec, Spec) else None
    outputs = {}
    for name, out in (spec.outputs.items() if spec is not None else ()):
        written = name in moved
        outputs[name] = {"from": out.from_, "sink": out.sink, "path": out.path, "written": written,
                         **({"location": moved[name]} if written else {})}
    message = "interrupted" if isinstance(error, KeyboardInterrupt) else str(error)
    return {
        "flowgpu": __version__,
        "name": spec.name if spec is not None else None,
        "file": spec.origin.file if spec is not None and spec.origin else given,
        "status": "failed",
        "error": message,
        "error_type": type(error).__name__,
        "step": _failed_step(spec, plan, error) if spec is not None else None,
        "wall_seconds": wall,
        "params": dict(spec.origin.params) if spec is not None and spec.origin else {},
        "written": sorted(moved),
        "not_written": sorted(set(outputs) - set(moved)),
        "outputs": outputs,
    }


def _disk_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def moves_delta(before: dict | None, after: dict | None) -> dict | None:
    """What a run moved between tiers: ``{"moves": {activity: {bytes, count, seconds, gbps}}, "events", "errors"}``."""
    if after is None:
        return None
    before = before or {"moves": {}, "events": {}}
    moves = {}
    for act, m in after["moves"].items():
        b = before["moves"].get(act, {})
        d = {k: m[k] - b.get(k, 0) for k in ("bytes", "count", "seconds")}
        if d["count"]:
            d["gbps"] = d["bytes"] / d["seconds"] / 1e9 if d["seconds"] > 0 else None
            moves[act] = d
    events = {k: n - before["events"].get(k, 0) for k, n in after["events"].items() if n - before["events"].get(k, 0)}
    return {"moves": moves, "events": events, "errors": after["errors"]}


def _outputs(spec: Spec, plan: Plan, values: dict, computed: set[str]) -> tuple[dict, int]:
    outputs, written = {}, 0
    for name, x in plan.outputs.items():
        out = spec.outputs[name]
        entry = {"from": out.from_, "sink": out.sink, "shape": list(x.shape), "dtype": str(x.dtype),
                 "chunks": [list(c) for c in x.chunks] if x.npartitions <= 64 else list(x.chunksize),
                 "status": "computed" if name in computed else "up-to-date" if name in values else "not-computed"}
        sink = sinks.sink_entry(out.sink)
        if sink.has(sinks.IN_SUMMARY):
            entry["value"] = values.get(name)
        else:
            entry["location"] = values.get(name)
            if name in computed and sink.has(sinks.WRITES_PATH) and values[name] and os.path.exists(values[name]):
                written += _disk_bytes(values[name])
        outputs[name] = entry
    return outputs, written


def _session(info: dict) -> dict:
    return {k: info.get(k) for k in ("backend", "n_workers", "threads_per_worker", "address", "dashboard", "workers")}


def run_summary(spec: Spec, plan: Plan, info: dict, values: dict, computed: set[str], wall: float, status: str,
                reasons: dict[str, str] | None = None) -> dict[str, Any]:
    """The summary of one run: each output (shape, dtype, value or location, computed or up to date),
    bytes read and written, tasks, what was fused, the session."""
    outputs, written = _outputs(spec, plan, values, computed)
    for name, why in (reasons or {}).items():
        outputs[name]["reason"] = why
    read = sum(int(n.array.nbytes) for n in plan.nodes.values() if n.reads_files and n.array is not None) if computed else 0
    return {
        "flowgpu": __version__,
        "name": spec.name,
        "file": plan.file,
        "status": status,
        "params": plan.params,
        "wall_seconds": wall,
        "bytes_read": read,
        "bytes_written": written,
        "tasks": graph_size([plan.outputs[n] for n in computed]) if computed else 0,
        "fused": dict(plan.fusion),
        "session": _session(info),
        "outputs": outputs,
    }


def batch_summary(spec: Spec, items: list[dict[str, Any]], info: dict, wall: float) -> dict[str, Any]:
    """The summary of a batch: one entry per item (``params``, ``status``: ok, failed or up-to-date,
    ``outputs``, ``error``), the counts of each status, and the session."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item["status"]] = counts.get(item["status"], 0) + 1
    return {
        "flowgpu": __version__,
        "name": spec.name,
        "file": spec.origin.file if spec.origin else None,
        "status": "ok" if all(i["status"] in ("ok", "up-to-date") for i in items) else "failed",
        "wall_seconds": wall,
        "counts": counts,
        "session": _session(info),
        "items": items,
    }
