"""Running a pipeline, or a batch of it, and :func:`status` (what a run would do, without running).

Both go through the same first steps: every item compiled and checked (:func:`plan_items`), each
output judged up to date or not (:func:`judge`). A run then executes the jobs on one session
(:func:`flowgpu.pipeline.batch.execute`) and builds its summary from their outcomes, of a failure too.
"""

from __future__ import annotations

import functools
import os
import pathlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import Console
from rich.markup import escape

from flowgpu import __version__, runtime
from flowgpu.backend import Facts
from flowgpu.diagnostics import events, jsontext, monitor, runreport
from flowgpu.errors import BackendError, ConfigError, FlowgpuError, SpecError
from flowgpu.fusion.classic import require_classic_graphs
from flowgpu.io import atomic, sinks
from flowgpu.io.lock import Waiting
from flowgpu.io.paths import shown
from flowgpu.memory import delta as memory_delta
from flowgpu.pipeline import cache as outputs_cache
from flowgpu.pipeline import recipe, tables
from flowgpu.pipeline.batch import Job, Outcome, execute
from flowgpu.pipeline.build import load_spec
from flowgpu.pipeline.checks import (SUMMARY_HEAD, check_outputs, check_side_files, check_session, cluster_error,
                                     protected_paths, session_options)
from flowgpu.pipeline.compiler import Plan, compile
from flowgpu.pipeline.foreach import Item, expand, in_item
from flowgpu.pipeline.planning import describe, graph_size
from flowgpu.pipeline.runconfig import RunConfig
from flowgpu.pipeline.spec import PARAM_REF, Spec
from flowgpu.runtime import standing

__all__ = ["BatchResult", "RunConfig", "RunResult", "run", "status", "plan_items", "check_outputs", "protected_paths",
           "session_options"]


# -- what a run would do: every item compiled and checked, each output judged ------------------------

def plan_items(items: list[Item], overwrite: bool, params_file: str | None, facts: Facts | None = None,
               for_run: bool = False) -> list[Plan]:
    """Compile (for ``facts``) and check every item before anything runs; a bad item refuses the batch."""
    plans, seen = [], {}
    protect = {params_file: f"the params file {params_file!r}"} if params_file else None
    for item in items:
        try:
            plans.append(compile(item.spec, facts=facts, for_run=for_run))
            check_outputs(item.spec, overwrite, protect)
        except SpecError as e:
            raise in_item(e, item) from None
        for name, out in item.spec.outputs.items():
            if out.path is None or tables.collects(out):  # every item writes a row of the table
                continue
            path = atomic.canonical(out.path)  # one file, also when a linked folder gives it two names
            if path in seen:
                other, first = seen[path]
                through = "" if first == os.path.abspath(out.path) else f" (through a linked folder: both are {path})"
                raise item.spec.error(
                    f"batch items {other.index + 1} ({other.label}) and {item.index + 1} ({item.label}) both write "
                    f"output {name!r} to {shown(out.path)!r}{through}", ("outputs", name, "path"),
                    hint=_distinct_hint(item, other, name))
            seen[path] = item, os.path.abspath(out.path)
    tables.check_items(items, plans)
    _refuse_reading_another_items_output(items, plans)
    return plans


def _distinct_hint(item: Item, other: Item, output: str) -> str:
    """How to give each item's output a path of its own: a foreach param in it, or more of a path param."""
    # as written: ${params...} not substituted
    given = (item.spec.origin.raw.get("outputs") or {}).get(output, {}).get("path")
    refs = PARAM_REF.finditer(given) if isinstance(given, str) else ()
    part = next((m for m in refs if m.group(2) and m.group(1) in item.values), None)
    if part is not None:
        name = part.group(1)
        return (f"their {name}s differ in a part that ${{params.{name}{part.group(2)}}} drops: keep more of it, e.g. "
                f"${{params.{name}.parent.name}}_${{params.{name}.stem}} (folder and name)")
    differ = [k for k, v in item.values.items() if other.values.get(k) != v]  # what tells these two apart
    return "put a foreach param in the path, e.g. path: out/${params.%s}.zarr" % next(iter(differ or item.values))


def _above(path: str) -> list[str]:
    return [path, *map(str, pathlib.PurePath(path).parents)]


def _refuse_reading_another_items_output(items: list[Item], plans: list[Plan]) -> None:
    """Refuse a batch in which an item reads what another writes: the items run at the same time."""
    if len(items) < 2:
        return
    written: dict[str, tuple[Item, str]] = {}  # an output's real path -> who writes it
    holding: dict[str, list[tuple[Item, str]]] = {}  # a folder -> two items writing in it, at most
    for item in items:
        for name, out in item.spec.outputs.items():
            if out.path is None or "://" in out.path:
                continue
            real = os.path.realpath(os.path.abspath(out.path))
            written.setdefault(real, (item, name))
            for folder in _above(real)[1:]:
                writers = holding.setdefault(folder, [])
                if len(writers) < 2 and all(w is not item for w, _ in writers):
                    writers.append((item, name))
    for item, plan in zip(items, plans):
        for path, spec, name in plan.reads():
            real = os.path.realpath(os.path.abspath(path))
            found = [written[p] for p in _above(real) if p in written] + holding.get(real, [])
            other = next(((w, o) for w, o in found if w is not item), None)
            if other is None:
                continue
            writer, output = other
            message = (f"batch item {item.index + 1} ({item.label}) reads {shown(path)!r} (input {name!r}), which batch "
                       f"item {writer.index + 1} ({writer.label}) writes (output {output!r}): the items of a batch run "
                       "at the same time, so what it read would depend on which ran first")
            hint = ("let no item read what another writes: make that output in a batch of its own first, "
                    "or give the items' outputs paths none of them reads")
            raise spec.error(message, ("inputs", name, "path"), hint=hint)


def judge(jobs: list[Job], store: Any, force: bool, checksum: bool) -> list[Job]:
    """The jobs, each saying which of its outputs are up to date."""
    judged = []
    for job in jobs:
        recipes = recipe.recipes(job.plan, checksum=checksum)
        verdicts = store.check(job.plan, recipes, item=job.item.values, checksum=checksum, force=force)
        todo = tuple(n for n in job.plan.outputs if not verdicts[n].up_to_date)
        cached = {n: v.value if v.location is None else v.location for n, v in verdicts.items() if v.up_to_date}
        judged.append(replace(job, todo=todo, reasons={n: verdicts[n].reason for n in todo}, cached=cached,
                              verdicts=verdicts, recipes=recipes))
    return judged


def line(jobs: list[Job]) -> str:
    """What a run says of its outputs, all items together: ``3 up to date, 1 to compute (...)``."""
    return outputs_cache.summarize({f"{j.item.index}:{n}": v for j in jobs for n, v in j.verdicts.items()})


def status(spec: Spec | str | os.PathLike | dict, *, overrides: dict[str, Any] | None = None,
           params_file: str | None = None, foreach: dict[str, Any] | None = None, checksum: bool = False,
           force: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """What ``run`` would do now: ``{"name", "file", "line", "items": [{"index", "params", "outputs":
    {name: {"up_to_date", "reason", "value"/"location"}}}]}``. Starts no cluster, calls no user code,
    takes no lock."""
    spec = load_spec(spec, overrides, params_file, foreach)
    items = expand(spec, foreach)
    plans = plan_items(items, overwrite, params_file)
    jobs = judge([Job(item, plan, tuple(plan.outputs)) for item, plan in zip(items, plans)], outputs_cache.Cache(),
                 force, checksum)
    entries = [{"index": job.item.index, "params": job.item.values, "outputs": {
        name: {"up_to_date": v.up_to_date, "reason": v.reason,
               **({"location": v.location} if v.location is not None else {"value": v.value})}
        for name, v in job.verdicts.items()}} for job in jobs]
    return {"name": spec.name, "file": spec.origin.file, "line": line(jobs), "items": entries}


@dataclass
class RunResult:
    """What a run produced: ``outputs`` (a value, or a file's path) and ``summary``; in a batch also the
    item's ``params`` and ``status``."""

    outputs: dict[str, Any]
    summary: dict[str, Any]
    plan: Plan | None = field(default=None, repr=False)
    status: str = "ok"
    params: dict[str, Any] = field(default_factory=dict)


def _start_session(spec: Spec, config: RunConfig) -> runtime.Session:
    opts = session_options(spec, config.cluster, config.allow_spec_address)
    running = None if opts.pop("standalone", False) else standing.join(opts)
    if running is not None:  # the cluster that stays up (flowgpu cluster start), used as it is; say so
        opts, line = running
        config.console.print(line, markup=False, highlight=False, soft_wrap=True)
    address = opts.pop("address", None)
    try:
        return runtime.Session(address, **opts)
    except (ConfigError, BackendError) as e:
        raise cluster_error(spec, {"address": address, **opts}, e) from None


def run(spec: Spec | str | os.PathLike | dict, config: RunConfig | None = None,
        **kwargs: Any) -> "RunResult | BatchResult":
    """Run a pipeline (or a batch of it) and return its outputs and summary.

    ``spec``: a :class:`Spec`, the path of a YAML spec, or a dict. ``config``: how to run it
    (:class:`RunConfig`); keywords set its fields (``run("spec.yaml", session="local", force=True)``).
    """
    config = replace(config or RunConfig(), **kwargs)
    config = replace(config, console=config.console or Console(stderr=True, quiet=not config.progress))
    require_classic_graphs()
    started = time.perf_counter()
    try:
        loaded = load_spec(spec, config.overrides, config.params_file, config.foreach)
    except BaseException as e:
        if config.summary_path and _may_write(spec, config):
            write_json(config.summary_path, failure_summary(spec, None, {}, e, time.perf_counter() - started),
                       config.overwrite)
        raise
    # as outputs, before anything runs
    check_side_files(loaded, config.summary_path, config.report, config.overwrite, config.params_file)
    return _run(loaded, config, started)


def _may_write(spec: Any, config: RunConfig) -> bool:
    """Whether a run whose spec did not load may write its summary there."""
    try:
        check_side_files(spec if isinstance(spec, (str, os.PathLike)) else None, config.summary_path, None,
                         config.overwrite, config.params_file)
    except FlowgpuError:
        return False
    return True


@dataclass
class BatchResult:
    """What a batch produced: one :class:`RunResult` per item, and the batch's ``summary``."""

    items: list[RunResult]
    summary: dict[str, Any]

    @property
    def ok(self) -> bool:
        return self.summary["status"] == "ok"


def _run(spec: Spec, config: RunConfig, begun: float) -> "RunResult | BatchResult":
    follower = monitor.Follower(report=bool(config.report))  # the dashboard's flowgpu page, and the report

    def tell(event: events.Event) -> None:
        for subscriber in (follower, *config.subscribers):
            subscriber(event)

    outcomes: list[Outcome] = []  # what happened to each item: what a failure says
    failed = None  # a failed batch's summary
    try:
        items = expand(spec, config.foreach)
        batch = bool(config.foreach or spec.foreach)
        started = time.perf_counter()
        session = _given_session(config.session)
        # on an open session where every output will be computed, python sources are called now, once;
        # otherwise they stand in until an item is known to run (batch._Batch.start calls them then)
        every = session is not None and (config.force or not config.cache)
        early = session.memory_summary_soon() if every else None  # the workers answer while the items compile
        plans = plan_items(items, config.overwrite, config.params_file, session.facts if session is not None else None,
                           for_run=every)
        jobs = [Job(item, plan, tuple(plan.outputs)) for item, plan in zip(items, plans)]
        if session is None:  # the cluster it would start: refused now, before anything is said or locked
            check_session(items[0].spec, session_options(items[0].spec, config.cluster, config.allow_spec_address))
        own = None
        paths = [o.path for item in items for o in item.spec.outputs.values() if o.path is not None]
        with sinks.hold_outputs(paths, config.wait, functools.partial(_lock_note, config.console)):
            store = outputs_cache.Cache() if config.cache else None
            if store is not None:
                jobs = judge(jobs, store, config.force, config.checksum)
                if not config.console.quiet:  # rich renders what a quiet console drops: 0.3-2 ms a run
                    config.console.print(f"{escape(spec.name)}: {escape(line(jobs))}", highlight=False)
            outcomes += [Outcome(job, "waiting" if job.todo else "up-to-date") for job in jobs]
            memory = None
            afters: list = []  # the accounting after a plain run, asked for as soon as its results are back
            try:
                if any(job.todo for job in jobs):
                    if session is None:  # the plans were built for this machine: compiled again if its workers differ
                        own = session = _start_session(items[0].spec, config)
                    tell(events.SessionReady(session))
                    memory = early or session.memory_summary_soon()  # the workers answer while the items compile

                    def computed() -> None:  # asked as its tasks finish: answered while the results come back
                        if memory() is not None:
                            afters.append(session.memory_summary_soon())

                    try:
                        execute(outcomes, session, config, cache=store, tell=tell, memory=memory,
                                computed=None if batch else computed)
                    except BaseException:
                        if batch:  # what a failed batch's --summary says
                            failed = _result(spec, outcomes, session, started, True).summary
                        raise
                    finally:
                        if config.report:  # the run report, of a failed run too
                            _write_report(spec, outcomes, session, started, batch, config, follower)
                elif config.report:  # all up to date: the report says so
                    _write_report(spec, outcomes, session, started, batch, config, follower)
                for said in tables.write_tables(outcomes, config.overwrite):  # every item's row, computed now or up to date
                    config.console.print(said, markup=False, highlight=False, soft_wrap=True)
                after = (afters[0] if afters else session.memory_summary_soon()) \
                    if memory is not None and memory() is not None and not batch else None
                result = _result(spec, outcomes, session, started, batch)
                if after is not None and (now := after()) is not None:
                    result.summary["memory"] = memory_delta(memory(), now)
            finally:
                if own is not None:
                    own.close()
                    for o in outcomes:  # again, now that no worker can still be writing into the staging
                        o.abort()
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):  # what the command line says of it: what was committed, what not
            e.flowgpu_outcome = interrupted(outcomes)
        summary = failed or failure_summary(spec, outcomes[0].job.plan if outcomes else None,
                                            outcomes[0].written if outcomes else {}, e, time.perf_counter() - begun)
        _ended(config, tell, summary)
        raise
    _ended(config, tell, result.summary)
    return result


def _ended(config: RunConfig, tell: Callable[[events.Event], None], summary: dict[str, Any]) -> None:
    if config.summary_path:
        write_json(config.summary_path, summary, config.overwrite)
    tell(events.RunFinished(summary))


def _lock_note(console: Console, note: str) -> None:
    """The output lock's note: what it left alone of the user's, and a wait for another run, are said
    even with -q; a dead run's staging removed is progress talk, quiet with -q."""
    if isinstance(note, (atomic.Refused, Waiting)):
        atomic.notify_stderr(note)
    else:
        console.print(f"flowgpu: {note}", markup=False, highlight=False, soft_wrap=True)


def _given_session(session: runtime.RunSession | str | None) -> runtime.RunSession | None:
    if isinstance(session, str):
        if session != "local":
            raise ConfigError(f"session={session!r}: give a flowgpu.Session, None, or \"local\"")
        return runtime.ThreadedSession()
    return session if session is not None else runtime.current_session()


def _names(paths: list[str], most: int = 6) -> str:
    return ", ".join(map(shown, paths[:most])) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def interrupted(outcomes: list[Outcome]) -> str:
    """What an interrupted run says: the outputs moved into place, and those that were not."""
    moved = [loc for o in outcomes for loc in o.written.values()]
    todo = [p.location for o in outcomes for n, p in o.pending.items() if p.location and n not in o.written]
    cut = any(getattr(p.atomic, "stuck", False) for o in outcomes for p in o.pending.values())
    if not moved:
        said = "interrupted; no output was moved into place"
        said += f" (not written: {_names(todo)}, as they were before the run)" if todo else ""
    else:
        items = sum(1 for o in outcomes if o.written)
        batch = f" ({items} of {len(outcomes)} batch items committed)" if len(outcomes) > 1 else ""
        said = f"interrupted after {len(moved)} output(s) were moved into place{batch}: {_names(moved)}"
        said += f"; not written: {_names(todo)} (as they were before the run)" if todo else ""
    if cut:
        said += "; a commit was cut short: the next run that writes those outputs (or flowgpu clean) finishes it"
    return said


def _write_report(spec: Spec, outcomes: list[Outcome], session: runtime.RunSession, started: float, batch: bool,
                  config: RunConfig, follower: monitor.Follower) -> None:
    result = _result(spec, outcomes, session, started, batch)
    summary = result.summary
    if batch:  # the header's totals: an array several items read is read once (they share its tasks)
        reads = {n.array.name: int(n.array.nbytes) for o in outcomes if o.values
                 for n in (o.plan or o.job.plan).nodes.values() if n.reads_files and n.array is not None}
        summary.update(tasks=sum(r.summary["tasks"] for r in result.items), bytes_read=sum(reads.values()),
                       bytes_written=sum(r.summary["bytes_written"] for r in result.items))
    failed = next((o for o in outcomes if o.status in ("failed", "cancelled")), None)
    if failed is not None:  # it computed no output to count its tasks and reads by: not known, rather than 0
        summary.update(tasks=None, bytes_read=None)
        if not batch and failed.error is not None:  # what its --summary says (run raises this error)
            summary.update(error=str(failed.error), error_type=type(failed.error).__name__,
                           step=_failed_step(failed.job.item.spec, failed.plan or failed.job.plan, failed.error))
    runs = [(o.job.item.label, follower.report_data(o.job.item.index) or  # up to date: its plan
             {"description": describe(o.plan or o.job.plan), "view": None, "dask_html": None}) for o in outcomes]
    runreport.write(config.report, runreport.render(summary, runs), config.overwrite)


def _result(spec: Spec, outcomes: list[Outcome], session: runtime.RunSession, started: float,
            batch: bool) -> "RunResult | BatchResult":
    """What the run did, from its outcomes: a plain run's :class:`RunResult`, or the batch's items."""
    info = session.info() if session is not None and hasattr(session, "info") else {}
    if not batch:
        return _single_result(outcomes[0], info, started)
    results, entries = [], []
    for o in outcomes:
        item = o.job.item
        one = _single_result(o, info, started)
        one.summary["wall_seconds"] = o.seconds
        said = str(o.error).removeprefix(f"batch item {item.index + 1} of {item.of} ({item.label}): ")
        entries.append({"index": item.index, "params": item.values, "status": o.status,
                        "outputs": one.summary["outputs"], "error": said if o.error is not None else None,
                        "wall_seconds": o.seconds})
        if o.status in ("failed", "cancelled"):  # as a failed run's summary says it
            entries[-1].update(step=_failed_step(item.spec, o.plan or o.job.plan, o.error) if o.error else None,
                               written=sorted(o.written), not_written=sorted(set(o.job.todo) - set(o.written)))
        one.params, one.status = item.values, o.status
        results.append(one)
    ok = all(e["status"] in ("ok", "up-to-date") for e in entries)
    return BatchResult(results, {
        **_head(spec, spec.origin.file, "ok" if ok else "failed"),
        "wall_seconds": time.perf_counter() - started,
        "counts": dict(Counter(e["status"] for e in entries)),
        "session": _session(info),
        "items": entries,
    })


def _single_result(o: Outcome, info: dict, started: float) -> RunResult:
    values, spec, plan = o.outputs, o.job.item.spec, o.plan or o.job.plan
    status = "ok" if o.status in ("ok", "up-to-date") else o.status
    computed = set(o.values)
    outputs, written = _outputs(spec, plan, values, computed)
    for name, why in o.job.reasons.items():
        outputs[name]["reason"] = why
    read = sum(int(n.array.nbytes) for n in plan.nodes.values()
               if computed and n.reads_files and n.array is not None)
    return RunResult(values, {
        **_head(spec, plan.file, status),
        "params": plan.params,
        "wall_seconds": time.perf_counter() - started,
        "bytes_read": read,
        "bytes_written": written,
        "tasks": graph_size([plan.outputs[n] for n in computed]) if computed else 0,
        "fused": dict(plan.fusion),
        "session": _session(info),
        "outputs": outputs,
    }, plan, status)


# -- what a run says it did: the summary of a run, of a batch and of a run that failed ----------------
def write_json(path: str, data: dict, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` as JSON atomically; ``overwrite=False``: only over a summary."""
    atomic.write_text(path, jsontext.dumps(data, indent=2), head=None if overwrite else SUMMARY_HEAD,
                      what="run summary", public=True)


def _failed_step(spec: Spec, plan: Plan | None, error: BaseException) -> str | None:
    """The input or step an error came from: the spec field it names, the node whose tasks failed, or
    the map_blocks function it raised in; None when it cannot be told."""
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
    """The summary of a run that failed: the error, its step when known, and what was (not) ``moved``."""
    given = os.fspath(spec) if isinstance(spec, (str, os.PathLike)) else None  # a spec file that did not load
    spec = spec if isinstance(spec, Spec) else None
    outputs = {}
    for name, out in (spec.outputs.items() if spec is not None else ()):
        written = name in moved
        outputs[name] = {"from": out.from_, "sink": out.sink, "path": out.path, "written": written,
                         **({"location": moved[name]} if written else {})}
    message = "interrupted" if isinstance(error, KeyboardInterrupt) else str(error)
    return {
        **_head(spec, spec.origin.file if spec is not None else given, "failed"),
        "error": message,
        "error_type": type(error).__name__,
        "step": _failed_step(spec, plan, error) if spec is not None else None,
        "wall_seconds": wall,
        "params": dict(spec.origin.params) if spec is not None else {},
        "written": sorted(moved),
        "not_written": sorted(set(outputs) - set(moved)),
        "outputs": outputs,
    }


def _disk_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)


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


def _head(spec: Spec | None, file: str | None, status: str) -> dict[str, Any]:
    """How every summary begins (``SUMMARY_HEAD``: its first key is the version)."""
    name = spec.name if spec is not None else None
    return {"flowgpu": __version__, "name": name, "file": file, "status": status}
