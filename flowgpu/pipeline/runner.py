"""Running a pipeline, or a batch of it: one Session, every item's graph submitted together, written atomically.

1. load the spec and expand its batch (``foreach``: :mod:`flowgpu.pipeline.foreach`; a plain run
   is one item), then compile (for the session's workers: its ``facts``) and check every item (pure; any problem is a :class:`SpecError`
   naming the item, and nothing runs);
2. refuse output paths that hold data flowgpu did not write (unless ``overwrite``), that are or
   contain the run's own files (:mod:`flowgpu.pipeline.checks`), or that two items share;
3. hold every output path's write lock (one run per output; waiting, or failing with
   ``wait=False``), which also finishes commits that dead runs left half-done there;
4. ask the cache which outputs are up to date (:mod:`flowgpu.pipeline.cache`: the recipe that made
   each and the fingerprints of the files it read) and say so; when nothing is left to compute,
   stop here, starting no cluster;
5. use the given (or current) Session, or start one from the spec's ``cluster:`` block (whose
   address or open dashboard needs ``allow_spec_address``), and hand the jobs to
   :func:`flowgpu.pipeline.batch.execute`: compiled again only when the plans were built for other
   workers (a cluster started after step 4) or stand in for python sources, staged, computed
   together, each item committed in one transaction (all new or all old) when all its outputs are
   done, then recorded in the cache. A failure removes the item's staging and raises (or, with
   ``keep_going``, stays in its item); ``summary_path`` is written either way
   (:mod:`flowgpu.pipeline.outcome`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape

from flowgpu import runtime
from flowgpu.diagnostics import runreport
from flowgpu.errors import ConfigError, FlowgpuError
from flowgpu.fusion.classic import require_classic_graphs
from flowgpu.io import sinks
from flowgpu.pipeline import cache as outputs_cache
from flowgpu.pipeline import tables
from flowgpu.pipeline.batch import Job, execute
from flowgpu.pipeline.checks import check_outputs, check_side_files, protected_paths, session_options
from flowgpu.pipeline.compiler import Plan
from flowgpu.pipeline.foreach import Item, expand
from flowgpu.pipeline.planning import describe
from flowgpu.pipeline.outcome import RunState, batch_summary, failure_summary, moves_delta, run_summary, write_json
from flowgpu.pipeline.spec import Spec
from flowgpu.pipeline.status import judge, line, load_spec, plan_items
from flowgpu.runtime import standing

__all__ = ["BatchResult", "RunResult", "run", "check_outputs", "protected_paths", "session_options"]


@dataclass
class RunResult:
    """What a run produced: ``outputs`` (value for summary outputs, path for files) and ``summary``;
    in a batch also the item's ``params`` and ``status`` (ok, failed, up-to-date, cancelled)."""

    outputs: dict[str, Any]
    summary: dict[str, Any]
    plan: Plan | None = field(default=None, repr=False)
    status: str = "ok"
    params: dict[str, Any] = field(default_factory=dict)


def _start_session(spec: Spec, cluster: dict[str, Any] | None, allow_spec_address: bool = False,
                   console: Console | None = None):
    opts = session_options(spec, cluster, allow_spec_address)
    running = None if opts.pop("standalone", False) else standing.join(opts)
    if running is not None:  # the cluster that stays up (flowgpu cluster start), used as it is; say so
        opts, line = running
        if console is not None:
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    address = opts.pop("address", None)
    try:
        return runtime.Session(address, **opts)
    except ConfigError as e:
        raise spec.error(str(e), ("cluster",), hint="fix the cluster: block or the CLI option") from None


def run(spec: Spec | str | os.PathLike | dict, *, overrides: dict[str, Any] | None = None, params_file: str | None = None,
        session: runtime.RunSession | str | None = None, overwrite: bool = False, summary_path: str | None = None,
        cluster: dict[str, Any] | None = None, console: Console | None = None, progress: bool = True,
        on_session: Callable[[runtime.RunSession], None] | None = None, allow_spec_address: bool = False, wait: bool = True,
        foreach: dict[str, Any] | None = None, keep_going: bool = False, force: bool = False,
        checksum: bool = False, cache: bool = True, report: str | os.PathLike | None = None) -> "RunResult | BatchResult":
    """Run a pipeline (or a batch of it) and return its outputs and summary.

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
        With no scheduler or session given, a run joins the cluster that stays up (``flowgpu cluster
        start``) when one runs, and says so; ``{"standalone": True}`` starts one of its own instead.
    console : where to print progress and notes (default: stderr); ``progress=False`` is quiet.
    on_session : called with the session once it is ready (the CLI prints the dashboard link).
    allow_spec_address : let the spec's ``cluster.address`` (another scheduler) or a dashboard open to
        the network take effect; without it they are refused (see :func:`session_options`).
    wait : when another run is writing one of the outputs, wait for it (a line on stderr says so);
        ``False`` (``--no-wait``): fail at once with :class:`OutputLockedError`.
    foreach : run a batch: param name -> values (a list, a glob ``"data/*.npy"``, a range ``"0:8"``,
        ``{"glob": ...}``, ``{"range": ...}``), with the spec's ``foreach:`` block; several make a grid.
        Every item is compiled before any runs; the result is then a :class:`BatchResult`.
    keep_going : a failing item does not stop the others (the result says which failed).
    force : compute every output, up to date or not.
    checksum : tell changed input files by their content, not only their size and modification time.
    cache : skip outputs that are up to date, and record what made each output written
        (``flowgpu.cache.directory``); ``False`` computes everything and records nothing.
    report : also write a self-contained HTML report of the run (or batch) there, atomically, also
        when it failed while computing: :mod:`flowgpu.diagnostics.runreport`.
    """
    require_classic_graphs()
    console = console or Console(stderr=True, quiet=not progress)
    started = time.perf_counter()
    state = RunState()
    given = spec
    try:
        spec = load_spec(spec, overrides, params_file)
        state.side_files_ok = False
        check_side_files(spec, summary_path, report, overwrite, params_file)  # as outputs: before anything runs
        state.side_files_ok = True
        items = expand(spec, foreach)
        options = dict(overwrite=overwrite, cluster=cluster, progress=progress, on_session=on_session,
                       allow_spec_address=allow_spec_address, params_file=params_file, wait=wait,
                       keep_going=keep_going, force=force, checksum=checksum, cache=cache, report=report)
        result = _run(spec, items, session, console, state, bool(foreach or spec.foreach), **options)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):  # what the command line says of it: what was committed, what not
            e.flowgpu_outcome = interrupted(state.jobs)
        if summary_path and _may_write(state, given, summary_path, overwrite, params_file):
            write_json(summary_path, state.summary if state.summary is not None else
                       failure_summary(spec, state, e, time.perf_counter() - started), overwrite)
        raise
    if summary_path:
        write_json(summary_path, result.summary, overwrite)
    return result


def _may_write(state: RunState, spec: Any, summary_path: str, overwrite: bool, params_file: str | None) -> bool:
    """Whether a failed run may write its summary: its path passed the checks, or (the spec did not
    load) passes those that need no spec."""
    if state.side_files_ok is not None:
        return state.side_files_ok
    try:
        check_side_files(spec if isinstance(spec, (str, os.PathLike)) else None, summary_path, None, overwrite,
                         params_file)
    except FlowgpuError:
        return False
    return True


@dataclass
class BatchResult:
    """What a batch produced: one :class:`RunResult` per item (``params`` and ``status`` in each),
    and the batch's ``summary`` (with its ``items``)."""

    items: list[RunResult]
    summary: dict[str, Any]

    @property
    def ok(self) -> bool:
        """Whether every item succeeded (or was up to date)."""
        return self.summary["status"] == "ok"


def _run(spec: Spec, items: list[Item], session: runtime.RunSession | str | None, console: Console, state: RunState,
         batch: bool, *, overwrite: bool, cluster: dict[str, Any] | None, progress: bool,
         on_session: Callable[[runtime.RunSession], None] | None, allow_spec_address: bool,
         params_file: str | None, wait: bool, keep_going: bool, force: bool, checksum: bool,
         cache: bool, report: str | os.PathLike | None) -> "RunResult | BatchResult":
    started = time.perf_counter()
    if isinstance(session, str):
        if session != "local":
            raise ConfigError(f"session={session!r}: give a flowgpu.Session, None, or \"local\"")
        session = runtime.ThreadedSession()
    if session is None:
        session = runtime.current_session()
    # on an open session where every output will be computed, python sources are called now, once;
    # otherwise they stand in until an item is known to run (batch._prepare calls them then)
    every = session is not None and (force or not cache)
    early = _memory_soon(session) if every else None  # the workers answer while the items compile
    plans = plan_items(items, overwrite, params_file, session.facts if session is not None else None,
                       for_run=every)
    jobs = [Job(item, plan, list(plan.outputs)) for item, plan in zip(items, plans)]
    state.plan, state.jobs = plans[0], jobs
    own = None
    paths = [o.path for item in items for o in item.spec.outputs.values() if o.path is not None]
    with sinks.hold_outputs(paths, wait):
        store = outputs_cache.Cache() if cache else None
        if store is not None:
            judge(jobs, store, force, checksum)
            console.print(f"{escape(spec.name)}: {escape(line(jobs))}", highlight=False)
        memory = None
        afters: list = []  # the accounting after a plain run, asked for as soon as its results are back
        try:
            if any(job.todo for job in jobs):
                if session is None:  # the plans were built for this machine: compiled again if its workers differ
                    own = session = _start_session(items[0].spec, cluster, allow_spec_address, console)
                if on_session is not None:
                    on_session(session)
                memory = early or _memory_soon(session)  # the workers answer while the items compile

                def computed() -> None:  # answered while the run commits
                    if memory() is not None:
                        afters.append(_memory_soon(session))

                try:
                    execute(jobs, session, overwrite=overwrite, keep_going=keep_going, console=console,
                            progress=progress, cache=store, report=bool(report), memory=memory,
                            computed=None if batch else computed)
                except BaseException:
                    if batch:  # what a failed batch's --summary says
                        state.summary = _batch_result(spec, jobs, session, started).summary
                    raise
                finally:
                    state.written = dict(jobs[0].written)
                    if report:  # the run report, of a failed run too
                        _write_report(report, spec, jobs, session, started, batch, overwrite)
            for said in tables.write_tables(jobs, overwrite):  # every item's row, computed now or up to date
                console.print(said, markup=False, highlight=False, soft_wrap=True)
            after = (afters[0] if afters else _memory_soon(session)) \
                if memory is not None and memory() is not None and not batch else None
            result = _batch_result(spec, jobs, session, started) if batch else _single_result(jobs[0], session, started)
            if report and not any(job.todo for job in jobs):  # all up to date: the report says so
                _write_report(report, spec, jobs, session, started, batch, overwrite)
            if after is not None:
                result.summary["memory"] = moves_delta(memory(), after())
            return result
        finally:
            if own is not None:
                own.close()
                for job in jobs:  # again, now that no worker can still be writing into the staging
                    job.abort()


def _names(paths: list[str], most: int = 6) -> str:
    shown = [os.path.relpath(p) if not os.path.relpath(p).startswith("..") else p for p in paths[:most]]
    return ", ".join(shown) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def interrupted(jobs: list[Job]) -> str:
    """What an interrupted run says: each output moved into place, and those that were not (and stay
    as they were); a commit cut short is finished by the next run or ``flowgpu clean``."""
    moved = [loc for job in jobs for loc in job.written.values()]
    todo = [p.location for job in jobs for n, p in job.pending.items() if p.location and n not in job.written]
    cut = any(getattr(p.atomic, "stuck", False) for job in jobs for p in job.pending.values())
    if not moved:
        said = "interrupted; no output was moved into place"
        said += f" (not written: {_names(todo)}, as they were before the run)" if todo else ""
    else:
        items = sum(1 for job in jobs if job.written)
        batch = f" ({items} of {len(jobs)} batch items committed)" if len(jobs) > 1 else ""
        said = f"interrupted after {len(moved)} output(s) were moved into place{batch}: {_names(moved)}"
        said += f"; not written: {_names(todo)} (as they were before the run)" if todo else ""
    if cut:
        said += "; a commit was cut short: the next run that writes those outputs (or flowgpu clean) finishes it"
    return said


def _memory_soon(session: runtime.RunSession) -> Callable[[], dict | None]:
    """``session.memory_summary()`` asked for now, on a thread of its own (a round trip to every
    worker); the function returned waits for the answer."""
    if getattr(session, "client", None) is None:
        return session.memory_summary
    box: dict[str, Any] = {}
    # a daemon: a run that failed before it needed the answer does not wait for it at exit
    thread = threading.Thread(target=lambda: box.setdefault("summary", session.memory_summary()), daemon=True,
                              name="flowgpu-memory-summary")
    thread.start()

    def answer() -> dict | None:
        thread.join()
        return box.get("summary")

    return answer


def _write_report(path: str | os.PathLike, spec: Spec, jobs: list[Job], session: runtime.RunSession, started: float,
                  batch: bool, overwrite: bool) -> None:
    summary = (_batch_result(spec, jobs, session, started) if batch else _single_result(jobs[0], session, started)).summary
    runs = [(j.item.label, j.tracked.report_data() if j.tracked is not None else  # up to date: its plan
             {"description": describe(j.run_plan or j.plan), "view": None, "dask_html": None}) for j in jobs]
    runreport.write(path, runreport.render(summary, runs), overwrite)


def _info(session: runtime.RunSession) -> dict:
    return session.info() if session is not None and hasattr(session, "info") else {}


def _single_result(job: Job, session: runtime.RunSession, started: float) -> RunResult:
    values = {**job.cached, **job.values}
    status = "ok" if job.status in ("ok", "up-to-date") else job.status
    plan = job.run_plan or job.plan
    summary = run_summary(job.item.spec, plan, _info(session), values, set(job.values), time.perf_counter() - started,
                          status, job.reasons)
    return RunResult(values, summary, plan, status)


def _batch_result(spec: Spec, jobs: list[Job], session: runtime.RunSession, started: float) -> BatchResult:
    results, entries = [], []
    for job in jobs:
        one = _single_result(job, session, started)
        one.summary["wall_seconds"] = job.seconds
        said = str(job.error).removeprefix(f"batch item {job.item.index + 1} of {job.item.of} ({job.item.label}): ")
        entry = {"index": job.item.index, "params": job.item.values, "status": job.status,
                 "outputs": one.summary["outputs"], "error": said if job.error is not None else None,
                 "wall_seconds": job.seconds}
        one.params, one.status = job.item.values, job.status
        results.append(one)
        entries.append(entry)
    return BatchResult(results, batch_summary(spec, entries, _info(session), time.perf_counter() - started))
