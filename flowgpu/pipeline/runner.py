"""Running a pipeline: one Dask graph for all outputs, submitted to a Session, written atomically.

1. load and compile the spec (pure; any problem is a :class:`SpecError` and nothing runs);
2. refuse output paths that hold data flowgpu did not write (unless ``overwrite``), or that are or
   contain the run's own files (:mod:`flowgpu.pipeline.checks`);
3. hold every output path's write lock (one run per output; waiting, or failing with
   ``wait=False``), which also finishes commits that dead runs left half-done there;
4. use the given (or current) Session, or start one from the spec's ``cluster:`` block (whose
   address or open dashboard needs ``allow_spec_address``);
5. compile again inside the session (CuPy chunks on GPUs, chunks sized for its workers), stage
   every output's write, compute all of them together, and commit them in one transaction (all
   new or all old) only when all succeeded. A failure removes the staging and raises :class:`RunError`
   (and still writes ``summary_path``, with what failed: :mod:`flowgpu.pipeline.outcome`).
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from flowgpu import __version__, runtime
from flowgpu.backend import current_backend
from flowgpu.diagnostics import compute_with_progress, monitor, render_summary
from flowgpu.errors import ConfigError, FlowgpuError, OutputError, RunError
from flowgpu.io import faults, sinks
from flowgpu.pipeline.build import build, from_dict, load, read_params_file
from flowgpu.pipeline.compiler import Plan, compile
from flowgpu.pipeline.checks import check_outputs, protected_paths, session_options
from flowgpu.pipeline.outcome import failure_summary, write_json
from flowgpu.pipeline.failures import explain, failed_with, watch_spill
from flowgpu.pipeline.planning import check_memory, describe, graph_size
from flowgpu.pipeline.spec import Spec

__all__ = ["RunResult", "run", "check_outputs", "protected_paths", "session_options"]


@dataclass
class RunResult:
    """What a run produced: ``outputs`` (value for summary outputs, path for files) and ``summary``."""

    outputs: dict[str, Any]
    summary: dict[str, Any]
    plan: Plan | None = field(default=None, repr=False)


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
        on_session: Any = None, allow_spec_address: bool = False, wait: bool = True,
        report: str | os.PathLike | None = None) -> RunResult:
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
    wait : when another run is writing one of the outputs, wait for it (a line on stderr says so);
        ``False`` (``--no-wait``): fail at once with :class:`OutputLockedError`.
    report : also write a self-contained HTML report of the run there (atomically; a failed run
        that got as far as computing writes one too): :mod:`flowgpu.diagnostics.runreport`.
    """
    console = console or Console(stderr=True, quiet=not progress)
    started = time.perf_counter()
    state: dict[str, Any] = {"written": {}, "report": report}
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
                    allow_spec_address, params_file, wait, state)
    except BaseException as e:
        if summary_path:
            write_json(summary_path, failure_summary(spec, state, e, time.perf_counter() - started))
        if report and "tracked" in state:  # the run report says what failed, too
            state["tracked"].write_report(report, failure_summary(spec, state, e, time.perf_counter() - started))
        raise


def _run(spec: Spec, session: Any, overwrite: bool, summary_path: str | None, cluster: dict[str, Any] | None,
         console: Console, progress: bool, on_session: Any, allow_spec_address: bool, params_file: str | None,
         wait: bool, state: dict[str, Any]) -> RunResult:
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
    with sinks.hold_outputs([o.path for o in spec.outputs.values() if o.path is not None], wait):
        if session is None:
            own = session = _start_session(spec, cluster, allow_spec_address)
        pending: dict[str, sinks.PendingWrite] = {}
        try:
            if on_session is not None:
                on_session(session)
            return _execute(spec, session, overwrite, summary_path, console, progress, state, pending)
        finally:
            if own is not None:
                own.close()
                for p in pending.values():  # again, now that no worker can still be writing into the staging
                    p.abort()


def _execute(spec: Spec, session: Any, overwrite: bool, summary_path: str | None, console: Console,
             progress: bool, state: dict[str, Any], pending: dict[str, sinks.PendingWrite]) -> RunResult:
    start = time.perf_counter()
    moves_before = _memory_moves(session)
    # inside the session (its backend and chunk sizes), before anything is written; python sources
    # are called here, and only here
    plan = state["plan"] = compile(spec, for_run=True)
    if getattr(session, "workers", None):  # one task, and the largest array, fit the workers (or a SpecError)
        check_memory(plan, session.workers, session.threads_per_worker, session.worker_budget)
    status = "failed"
    try:
        for name, x in plan.outputs.items():
            out = spec.outputs[name]
            pending[name] = sinks.prepare_write(out.sink, x, out.path, overwrite, **out.sink_options())
        targets = [p.target for p in pending.values()]
        faults.point("after-prepare")
        try:
            with watch_spill(session), monitor.track(plan, session, lambda: describe(plan), targets={
                    n: p.target for n, p in pending.items()}, report=bool(state["report"])) as state["tracked"]:
                results = compute_with_progress(targets, client=getattr(session, "client", None),
                                                console=console, show=progress, description=spec.name)
        except FlowgpuError:
            raise
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                raise RunError(f"pipeline {spec.name!r} failed while running: {failed_with(e)}") from e
            paths = ", ".join(repr(p.location) for p in pending.values() if p.location)
            raise OutputError(f"pipeline {spec.name!r} failed writing its outputs ({paths}): {e.strerror}; free "
                              "space there or choose a path on another filesystem. Nothing was replaced") from e
        except Exception as e:
            raise explain(e, plan, session) or RunError(
                f"pipeline {spec.name!r} failed while running: {failed_with(e)}") from e
        values = {}
        locations = sinks.commit_all(list(pending.values()))  # one transaction: all new or all old
        for (name, p), result, location in zip(pending.items(), results, locations):
            in_summary = sinks.sink_entry(p.sink).has(sinks.IN_SUMMARY)
            values[name] = sinks.to_summary_value(result) if in_summary else location
            if not in_summary:
                state["written"][name] = location  # moved into place (a failed run's summary says so)
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
        write_json(summary_path, summary)
    if state["report"]:
        state["tracked"].write_report(state["report"], summary)
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
