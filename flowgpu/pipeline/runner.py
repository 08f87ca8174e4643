"""Running a pipeline: one Dask graph for all outputs, submitted to a Session, written atomically.

1. load and compile the spec (pure; any problem is a :class:`SpecError` and nothing runs);
2. refuse output paths that hold data flowgpu did not write (unless ``overwrite``);
3. use the given (or current) Session, or start one from the spec's ``cluster:`` block;
4. compile again inside the session (CuPy chunks on GPUs, chunks sized for its workers), set up
   every output's write under a temporary name, compute all of them together, and move them into
   place only when all succeeded. A failure removes the temporaries and raises :class:`RunError`.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from flowgpu import __version__, runtime
from flowgpu.backend import current_backend
from flowgpu.diagnostics import compute_with_progress, render_summary
from flowgpu.errors import ConfigError, FlowgpuError, OutputExistsError, RunError, SpecError
from flowgpu.io import sinks
from flowgpu.pipeline import compose
from flowgpu.pipeline.build import build, from_dict, load, read_params_file
from flowgpu.pipeline.compiler import Plan, compile
from flowgpu.pipeline.planning import graph_size
from flowgpu.pipeline.spec import Spec

__all__ = ["RunResult", "run", "check_outputs", "protected_paths", "session_options"]


@dataclass
class RunResult:
    """What a run produced: ``outputs`` (value for summary outputs, path for files) and ``summary``."""

    outputs: dict[str, Any]
    summary: dict[str, Any]
    plan: Plan | None = field(default=None, repr=False)


def _spec_paths(spec: Spec, found: dict[str, str], stack: tuple[str, ...] = ()) -> None:
    """The files a run reads (``realpath -> what it is``): the spec, its includes and its inputs' paths."""
    origin = spec._origin
    if origin is not None and origin.file:
        found.setdefault(os.path.realpath(origin.file), f"the spec {origin.file!r}" if not stack
                         else f"the included spec {origin.file!r}")
    for name, model in spec.inputs.items():
        path = getattr(model, "path", None)
        if isinstance(path, str) and path:
            found.setdefault(os.path.realpath(os.path.expanduser(path)), f"input {name!r} ({path})")
    for name, step in spec.steps.items():
        if step.uses is None or origin is None:
            continue
        child_file = compose.resolve_uses(spec, name, origin.smap, stack)
        child = load(child_file, {f"params.{k}": v for k, v in step.params.items()})
        _spec_paths(child, found, (*stack, os.path.abspath(origin.file or os.curdir)))


def protected_paths(spec: Spec, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What no output may be or contain (``realpath -> what it is``): the working directory, the spec,
    its includes, every input path of the run, and ``extra`` (e.g. the params file)."""
    found = {os.path.realpath(os.getcwd()): "the working directory"}
    for path, what in (extra or {}).items():
        found.setdefault(os.path.realpath(path), what)
    _spec_paths(spec, found)
    return found


def check_outputs(spec: Spec, overwrite: bool = False, protect: dict[str, str] | None = None) -> None:
    """Refuse, before anything runs, output paths that are taken, given twice, or that are or
    contain what the run needs (:func:`protected_paths`; ``protect`` adds paths and what they are)."""
    smap = spec._origin.smap
    seen: dict[str, str] = {}
    protected = protected_paths(spec, protect) if any(o.path for o in spec.outputs.values()) else {}
    for name, out in spec.outputs.items():
        if out.path is None:
            continue
        path = os.path.abspath(out.path)
        if path in seen:
            raise smap.error(f"outputs {seen[path]!r} and {name!r} both write {out.path!r}", ("outputs", name, "path"),
                             hint="give each output its own path")
        seen[path] = name
        real = os.path.realpath(path)
        for kept, what in protected.items():
            if kept == real or kept.startswith(real.rstrip(os.sep) + os.sep):
                raise smap.error(f"output {name!r} would replace {out.path!r}, which {'is' if kept == real else 'contains'} "
                                 f"{what}", ("outputs", name, "path"),
                                 hint="write the output to a path of its own (a new name such as 'result.zarr'); "
                                      "--overwrite never replaces these")
        try:
            sinks.check_destination(path, overwrite)
        except OutputExistsError as e:
            raise smap.error(str(e).split(";")[0], ("outputs", name, "path"),
                             hint="choose another path, or pass --overwrite (overwrite=True) to replace it") from None


def _loopback(address: str) -> bool:
    """Whether ``address`` (``host:port``, ``tcp://host:port``, ``:port``) listens on this machine only."""
    rest = address.rpartition("://")[2].strip()
    if rest.startswith("["):
        host = rest[1:].partition("]")[0]
    elif rest.count(":") > 1:
        host = rest  # a bare IPv6 address
    else:
        host = rest.partition(":")[0] if ":" in rest else ("" if rest.isdigit() else rest)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "" and 0.0.0.0 mean every interface; a name may resolve anywhere


def session_options(spec: Spec, cluster: dict[str, Any] | None = None, allow_spec_address: bool = False
                    ) -> dict[str, Any]:
    """Session keyword arguments: the spec's ``cluster:`` block, then ``cluster`` (CLI) overrides.

    A spec from elsewhere must not send the run's data to another scheduler, or open the dashboard
    to the network, without a word: its ``cluster.address`` and a ``cluster.dashboard_address``
    that is not a loopback address are refused unless confirmed (``allow_spec_address``, the same
    address in ``cluster``, or the key set on the command line with ``--set``).
    """
    opts = {k: v for k, v in spec.cluster.model_dump().items() if v is not None}
    given = {k: v for k, v in (cluster or {}).items() if v is not None}
    set_here = spec._origin.overrides if spec._origin is not None else {}
    risky = {"address": ("sends this run, and its data, to the scheduler at", lambda v: False),
             "dashboard_address": ("opens the dashboard to the network at", _loopback)}
    for key, (does, harmless) in risky.items():
        value = opts.get(key)
        if (value is None or allow_spec_address or key in given or f"cluster.{key}" in set_here
                or harmless(str(value))):
            continue
        flag = f"--scheduler {value}" if key == "address" else f"--set cluster.{key}={value}"
        raise spec._origin.smap.error(
            f"the spec {does} {value!r} (cluster.{key}); a spec from elsewhere could send your data anywhere",
            ("cluster", key), hint=f"if you mean it, confirm with {flag} or --allow-spec-address "
                                   "(Python: run(..., allow_spec_address=True)); else remove it from the spec")
    opts.update(given)
    return opts


def _start_session(spec: Spec, cluster: dict[str, Any] | None, allow_spec_address: bool = False):
    opts = session_options(spec, cluster, allow_spec_address)
    address = opts.pop("address", None)
    try:
        return runtime.Session(address, **opts)
    except ConfigError as e:
        raise spec._origin.smap.error(str(e), ("cluster",), hint="fix the cluster: block or the CLI option") from None


class _LocalRun:
    """Stands in for a Session when running on dask's local threaded scheduler."""

    client = None
    backend = "local"
    n_workers = 1
    dashboard_link = None

    def memory_summary(self) -> None:
        return None  # no workers, no flowgpu data store

    def info(self) -> dict:
        return {"backend": f"local ({current_backend()})", "n_workers": 1, "threads_per_worker": os.cpu_count(),
                "address": None, "dashboard": None}


def _disk_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def run(spec: Spec | str | os.PathLike | dict, *, overrides: dict[str, Any] | None = None, params_file: str | None = None,
        session: Any = None, overwrite: bool = False, summary_path: str | None = None,
        cluster: dict[str, Any] | None = None, console: Console | None = None, progress: bool = True,
        on_session: Any = None, allow_spec_address: bool = False) -> RunResult:
    """Run a pipeline and return its outputs and summary.

    Parameters
    ----------
    spec : a :class:`Spec`, the path of a YAML spec, or a spec as a Python dict.
    overrides : dotted keys to set, e.g. ``{"params.n": 1000}`` (as ``--set``).
    params_file : a YAML file of param values (as ``--params``).
    session : a :class:`flowgpu.Session` to run on; default: the current one, else one started from
        the spec's ``cluster:`` block (and closed at the end). ``"local"`` runs on dask's threaded
        scheduler in this process, with no cluster (small runs and tests).
    overwrite : replace output paths that hold data flowgpu did not write.
    summary_path : also write the summary as JSON there (atomically); a failed run writes one too,
        with ``status: "failed"``, the error, the step it came from when known, and what was written.
    cluster : Session options overriding the spec's ``cluster:`` block (``--scheduler``, ``--gpus``).
    console : where to print progress and the summary (default: stderr); ``progress=False`` is quiet.
    on_session : called with the session once it is ready (the CLI prints the dashboard link).
    allow_spec_address : let the spec's ``cluster.address`` (another scheduler) or a dashboard open to
        the network take effect; without it they are refused (see :func:`session_options`).
    """
    console = console or Console(stderr=True, quiet=not progress)
    started = time.perf_counter()
    state: dict[str, Any] = {"written": {}}
    try:
        if isinstance(spec, (str, os.PathLike)):
            spec = load(spec, overrides, params_file)
        elif isinstance(spec, dict):
            spec = from_dict(spec, {**(read_params_file(params_file) if params_file else {}), **(overrides or {})})
        elif overrides or params_file:
            merged = {**spec._origin.overrides, **(read_params_file(params_file) if params_file else {}),
                      **(overrides or {})} if spec._origin else dict(overrides or {})
            spec = build(spec._origin.raw, spec._origin.smap, merged)
        return _run(spec, session, overwrite, summary_path, cluster, console, progress, on_session,
                    allow_spec_address, params_file, state)
    except BaseException as e:
        if summary_path:
            _write_json(summary_path, _failure(spec, state, e, time.perf_counter() - started))
        raise


def _run(spec: Spec, session: Any, overwrite: bool, summary_path: str | None, cluster: dict[str, Any] | None,
         console: Console, progress: bool, on_session: Any, allow_spec_address: bool, params_file: str | None,
         state: dict[str, Any]) -> RunResult:
    own = None
    if isinstance(session, str):
        if session != "local":
            raise ConfigError(f"session={session!r}: give a flowgpu.Session, None, or \"local\"")
        session = _LocalRun()
    if session is None:
        session = runtime.current_session()
    if session is None:
        compile(spec)  # every check before any cluster starts (_execute checks again inside it)
    check_outputs(spec, overwrite, {params_file: f"the params file {params_file!r}"} if params_file else None)
    if session is None:
        own = session = _start_session(spec, cluster, allow_spec_address)
    try:
        if on_session is not None:
            on_session(session)
        return _execute(spec, session, overwrite, summary_path, console, progress, state)
    finally:
        if own is not None:
            own.close()


def _execute(spec: Spec, session: Any, overwrite: bool, summary_path: str | None, console: Console,
             progress: bool, state: dict[str, Any]) -> RunResult:
    start = time.perf_counter()
    moves_before = _memory_moves(session)
    # inside the session (its backend and chunk sizes), before anything is written; python sources
    # are called here, and only here
    plan = state["plan"] = compile(spec, for_run=True)
    pending: dict[str, sinks.PendingWrite] = {}
    status = "failed"
    try:
        for name, x in plan.outputs.items():
            out = spec.outputs[name]
            pending[name] = sinks.prepare_write(out.sink, x, out.path, overwrite, **out.sink_options())
        targets = [p.target for p in pending.values()]
        try:
            results = compute_with_progress(targets, client=getattr(session, "client", None), console=console,
                                            show=progress, description=spec.name)
        except FlowgpuError:
            raise
        except Exception as e:
            raise RunError(f"pipeline {spec.name!r} failed while running: {type(e).__name__}: {e}") from e
        values = {}
        for (name, p), result in zip(pending.items(), results):
            in_summary = sinks.sink_entry(p.sink).has(sinks.IN_SUMMARY)
            values[name] = sinks.to_summary_value(result) if in_summary else p.commit()
            state["written"][name] = values[name]
        status = "ok"
    except BaseException:
        for p in pending.values():
            p.abort()
        raise
    finally:
        wall = time.perf_counter() - start
    summary = _summary(spec, plan, session, values, wall, status)
    summary["memory"] = _moves_delta(moves_before, _memory_moves(session))
    if summary_path:
        _write_json(summary_path, summary)
    render_summary(summary, console)
    return RunResult(values, summary, plan)


def _memory_moves(session: Any) -> dict | None:
    """The workers' data-store accounting summed over workers, or None (no cluster, or not flowgpu's store)."""
    return session.memory_summary()


def _moves_delta(before: dict | None, after: dict | None) -> dict | None:
    """What this run moved between tiers: ``{"moves": {activity: {bytes, count, seconds, gbps}}, "events", "errors"}``."""
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


def _summary(spec: Spec, plan: Plan, session: Any, values: dict, wall: float, status: str) -> dict[str, Any]:
    outputs = {}
    written = 0
    for name, x in plan.outputs.items():
        out = spec.outputs[name]
        entry = {"from": out.from_, "sink": out.sink, "shape": list(x.shape), "dtype": str(x.dtype),
                 "chunks": [list(c) for c in x.chunks] if x.npartitions <= 64 else list(x.chunksize)}
        sink = sinks.sink_entry(out.sink)
        if sink.has(sinks.IN_SUMMARY):
            entry["value"] = values[name]
        else:
            entry["location"] = values[name]
            if sink.has(sinks.WRITES_PATH) and values[name] and os.path.exists(values[name]):
                written += _disk_bytes(values[name])
        outputs[name] = entry
    read = sum(int(n.array.nbytes) for n in plan.nodes.values() if n.reads_files and n.array is not None)
    info = session.info() if hasattr(session, "info") else {}
    return {
        "flowgpu": __version__,
        "name": spec.name,
        "file": plan.file,
        "status": status,
        "params": plan.params,
        "wall_seconds": wall,
        "bytes_read": read,
        "bytes_written": written,
        "tasks": graph_size(list(plan.outputs.values())),
        "fused": {k: v["expression"] for k, v in plan.fusion.roots.items()},
        "session": {k: info.get(k) for k in ("backend", "n_workers", "threads_per_worker", "address", "dashboard")},
        "outputs": outputs,
    }




def _write_json(path: str, data: dict) -> None:
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


def _failure(spec: Any, state: dict[str, Any], error: BaseException, wall: float) -> dict[str, Any]:
    """The summary of a run that failed: the error, its step when known, and what was (not) written."""
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
        "file": spec._origin.file if spec is not None and spec._origin else None,
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
