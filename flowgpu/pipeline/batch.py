"""Running the items of a batch on one session: prepared, submitted together, committed one by one.

Every item (a plain run is a batch of one) is compiled inside the session and its outputs to
compute are staged; then all items go to the cluster at once, so independent items run
concurrently and tasks they share (the same input read by all) run once. As each item's last
future completes, its outputs are committed in one transaction of their own (all new or all old)
and recorded in the cache; an item that fails is aborted (nothing of it moved into place) and,
unless ``keep_going``, stops the batch: the others are cancelled and aborted too, and what was
already committed stays, complete and recorded (a re-run skips it).

Before anything is staged, every worker is asked whether it sees the run's inputs and outputs as
the client does: a worker on another host, in another mount namespace, or one whose storage is not the client's,
would find no Zarr store at an input's path and read every chunk as the fill value. So a run asks
each worker first, in one round trip (:func:`flowgpu.io.paths.probe` through ``client.run``):

* every input's metadata (a Zarr store's ``zarr.json`` / ``.zarray``, a ``.npy`` file) opens and reads;
* every output's staging folder, which the client has just made, is the same folder there (it
  holds the client's ``owner.json``) and takes a file.

``flowgpu validate --scheduler`` asks the same of the inputs, and for each output that its nearest
existing folder is the client's (same inode) and writable, writing nothing. A worker that cannot
is a :class:`~flowgpu.errors.PathNotVisibleError` (exit 2) naming the worker, its host and working
directory, the path, and what to do; nothing has been computed, and the run's staging is removed.

A worker that died while running a step is said in the step's words instead of ``KilledWorker``:
distributed gives up on a task once ``distributed.scheduler.allowed-failures`` workers died running
it, and raises ``KilledWorker`` naming only the task's key. Each key's name is the name of one of
the plan's arrays (the compiler's layer names), so the step, its chunk size and the workers' memory
limit can be named, with the fix. A worker dies for other reasons too (a crash in native code, a
SIGKILL); the message says memory is the likely cause, not the certain one.

:class:`watch_spill` covers the other way a run stops without a word: a worker whose spill
directory fills or turns read-only during the run cannot free memory, and distributed pauses it
for ever. The watch polls the workers' stores (:meth:`Session.memory_summary`, their "errors") and,
on a new spill failure, cancels the run's tasks and raises a :class:`RunError` with the reason.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pathlib
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.utils import format_bytes, key_split
from distributed import Future, KilledWorker, as_completed, wait

from flowgpu import config, runtime
from flowgpu.diagnostics import BatchBars
from flowgpu.diagnostics.events import ItemFinished, ItemStarted
from flowgpu.errors import FlowgpuError, OutputError, PathNotVisibleError, RunError, SpecError
from flowgpu.io import faults, paths, sinks, sources
from flowgpu.pipeline.compiler import Plan, calls_user_code, compile
from flowgpu.pipeline.foreach import Item, in_item
from flowgpu.pipeline.planning import check_memory, describe
from flowgpu.pipeline.runconfig import RunConfig
from flowgpu.runtime import RunSession

__all__ = ["Job", "Outcome", "execute", "check_joined", "watch_spill"]


@dataclass(frozen=True)
class Job:
    """One item of a batch as planned and judged: what to compute and what is up to date (never changed
    after; what happens to it is its :class:`Outcome`)."""

    item: Item
    plan: Plan  # compiled outside the session (pure): shapes, dtypes, recipes
    todo: tuple[str, ...]  # the outputs to compute (the others are up to date)
    cached: dict[str, Any] = field(default_factory=dict)  # up-to-date outputs: value or location
    reasons: dict[str, str] = field(default_factory=dict)  # why each output of todo is computed
    verdicts: dict[str, Any] = field(default_factory=dict)  # the cache's word on each output
    recipes: dict[str, Any] | None = None


@dataclass(eq=False)
class Outcome:
    """What happened to a :class:`Job`; only :func:`execute` changes it. ``status``: waiting, running,
    ok, failed, up-to-date or cancelled; ``values``: each computed output's value or location;
    ``written``: those moved into place; ``plan``: the plan it ran (compiled in the session);
    ``pending``: its staged writes."""

    job: Job
    status: str = "waiting"
    values: dict[str, Any] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)
    error: BaseException | None = None
    seconds: float = 0.0
    plan: Plan | None = None
    pending: dict[str, sinks.PendingWrite] = field(default_factory=dict)

    @property
    def outputs(self) -> dict[str, Any]:
        """Every output's value or location: up to date or computed."""
        return {**self.job.cached, **self.values}

    def abort(self) -> None:
        for p in self.pending.values():
            p.abort()


def _said(item: Item, error: FlowgpuError) -> FlowgpuError:
    """``error`` naming the batch item it came from (a plain run's error is left as it is)."""
    if item.of <= 1 and not item.values:
        return error
    if isinstance(error, SpecError):
        return in_item(error, item)
    said = type(error)(f"batch item {item.index + 1} of {item.of} ({item.label}): {error}")
    said.__cause__ = error.__cause__
    return said


def _failure(o: Outcome, error: BaseException, session: RunSession) -> FlowgpuError:
    """What a user is told when ``o``'s job failed with ``error``: the step, the fix, that nothing was replaced."""
    item, name = o.job.item, o.job.item.spec.name
    if isinstance(error, FlowgpuError):
        return _said(item, error)
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        paths = ", ".join(repr(p.location) for p in o.pending.values() if p.location)
        out: FlowgpuError = OutputError(f"pipeline {name!r} failed writing its outputs ({paths}): {error.strerror}; "
                                        "free space there or choose a path on another filesystem. Nothing was replaced")
    else:
        out = explain(error, o.plan, session) or RunError(
            f"pipeline {name!r} failed while running: {failed_with(error)}")
    out.__cause__ = error
    return _said(item, out)


def _commit(o: Outcome, results: list[Any], cache: Any) -> None:
    """Move the job's outputs into place together, then record them (an entry only for a complete output)."""
    job = o.job
    if cache is not None:
        cache.invalidate(job.plan, job.todo, item=job.item.values)
    locations = sinks.commit_all(list(o.pending.values()))
    for (name, p), result, location in zip(o.pending.items(), results, locations):
        if sinks.sink_entry(p.sink).has(sinks.IN_SUMMARY):
            o.values[name] = sinks.to_summary_value(result)
        else:
            o.values[name] = o.written[name] = location
    faults.point("item-committed")
    if cache is not None and job.recipes is not None:
        for name in job.todo:  # the outputs staged: written (a location) or summary values
            cache.record(job.plan, name, job.recipes[name], item=job.item.values, location=o.written.get(name),
                         value=None if name in o.written else o.values[name])
    o.status = "ok"


def _in_order(compute: Callable[[list], Any], targets: list) -> list:
    """``compute(targets)``'s results (or futures) in the order of ``targets``.

    dask (2026.8) merges the graphs of collections with the same low-level optimizer and returns
    their results group by group: ``dask.compute(array_a, delayed_b, array_c)`` answers
    ``(a, c, b)``, and so does ``client.compute``. A run whose outputs mix arrays and a Delayed
    (``sink: xarray`` writes through one) then gave each output the next one's value. The targets go
    in already grouped the same way (by ``__dask_optimize__``, first appearance first), so the
    answers come back in that order, and are put back in the caller's.
    """
    groups: dict[Any, list[int]] = {}
    for i, t in enumerate(targets):
        groups.setdefault(getattr(t, "__dask_optimize__", None), []).append(i)
    order = [i for members in groups.values() for i in members]
    got = compute([targets[i] for i in order])
    out: list = [None] * len(targets)
    for i, value in zip(order, got, strict=True):
        out[i] = value
    return out


class _Batch:
    """One :func:`execute`: the session, the cache, the progress bars and whom to tell; each running
    item's bar and futures."""

    def __init__(self, session: RunSession, config: RunConfig, cache: Any, tell: Callable[[Any], None],
                 computed: Callable[[], Any] | None = None):
        self.session, self.config, self.cache, self.tell, self.computed = session, config, cache, tell, computed
        self.bars = BatchBars(config.console, show=config.progress)
        self.bar: dict[Outcome, Any] = {}
        self.futures: dict[Outcome, list] = {}

    def start(self, o: Outcome) -> None:
        """Stage the job's writes and say it starts: on its plan as compiled, unless that was built for other
        workers than the session's (a run that started its own cluster after judging its outputs) or stands
        in for python sources, which are called here, and only here: then compiled for the session."""
        job, spec, session = o.job, o.job.item.spec, self.session
        plan = o.plan = compile(spec, for_run=True, facts=session.facts) \
            if job.plan.facts != session.facts or (calls_user_code(job.plan) and not job.plan.for_run) else job.plan
        if session.workers:  # one task, and the largest array, fit the workers (or a SpecError)
            check_memory(plan, session.workers, session.threads_per_worker, session.worker_budget)
        for name in job.todo:
            out = spec.outputs[name]
            x = plan.labelled.get(name, plan.outputs[name])  # labelled outputs as xarray.DataArray (sink: xarray)
            o.pending[name] = sinks.prepare_write(out.sink, x, out.path, self.config.overwrite, **out.sink_options())
        self.tell(ItemStarted(job.item.index, job.item.label if job.item.values else None, plan,
                              functools.partial(describe, plan), {n: p.target for n, p in o.pending.items()},
                              tuple(job.cached)))
        self.bar[o] = self.bars.add(job.item.label)

    def settle(self, o: Outcome, error: BaseException | None, results: list[Any] | None, started: float) -> None:
        """Commit ``o``'s job (or fail it, removing its staging) and say how it ended."""
        o.seconds = time.perf_counter() - started
        self.bars.done(self.bar[o])
        if error is None:
            try:
                _commit(o, results or [], self.cache)
            except Exception as e:  # noqa: BLE001 - said below, with the item
                error = e
        if error is None:
            self.tell(ItemFinished(o.job.item.index, o))
        else:
            self.fail(o, error)

    def fail(self, o: Outcome, error: BaseException | None, status: str = "failed") -> None:
        """``o``'s job failed with ``error`` (or was cancelled): its staging removed, said."""
        if error is not None:
            o.error = _failure(o, error, self.session)
        o.status = status
        o.abort()
        self.tell(ItemFinished(o.job.item.index, o))

    def local(self, ready: list[Outcome]) -> None:
        """One item after the other on dask's threaded scheduler, in this process."""
        for o in ready:
            started = time.perf_counter()
            o.status = "running"
            try:
                with self.bars.local(self.bar[o]) or contextlib.nullcontext():
                    results = _in_order(lambda ts: dask.compute(*ts, scheduler="threads"),
                                        [p.target for p in o.pending.values()])
                error = None
            except Exception as e:  # noqa: BLE001 - the item fails; said in its words
                results, error = None, e
            self.settle(o, error, results, started)
            if o.status == "failed" and not self.config.keep_going:
                return

    def distributed(self, ready: list[Outcome]) -> None:
        """Every item submitted at once; each committed as soon as its last future is done."""
        client = self.session.client
        started = time.perf_counter()
        owner: dict[int, Outcome] = {}
        futures = _in_order(client.compute, [p.target for o in ready for p in o.pending.values()])  # one graph
        for o in ready:
            self.futures[o], futures = futures[:len(o.pending)], futures[len(o.pending):]
            o.status = "running"
            self.bars.follow(self.bar[o], client, self.futures[o])
            owner.update((id(f), o) for f in self.futures[o])
        try:
            if len(ready) == 1:  # a plain run: waited for and gathered in one call, as compute() does
                self._gather_one(client, ready[0], started)
                return
            for future in as_completed([f for o in ready for f in self.futures[o]]):
                o = owner[id(future)]
                if o.status != "running":
                    continue
                if future.status != "finished":
                    error = future.exception() if future.status == "error" else RunError(
                        f"pipeline {o.job.item.spec.name!r} was cancelled: {future.status}")
                    self._settled(o)
                    self.settle(o, error, None, started)
                elif all(f.status == "finished" for f in self.futures[o]):
                    self._gather_one(client, o, started)
                if o.status == "failed" and not self.config.keep_going:
                    return
        finally:
            for o in ready:
                if o.status == "running":  # its writes stop: running tasks finish, and their staging goes
                    if writes := self._writes(o):  # after them (at the latest when the next run takes the lock)
                        client.cancel(writes)
                    self.fail(o, None, "cancelled")

    def _gather_one(self, client: Any, o: Outcome, started: float) -> None:
        """Wait for ``o``'s futures and fetch their results in one round trip (the first failure ends
        the wait), then (``computed()`` first, when all came back) commit or fail it."""
        try:
            results, error = client.gather(self.futures[o]), None
        except CancelledError:  # distributed's FutureCancelledError
            results, error = None, RunError(f"pipeline {o.job.item.spec.name!r} was cancelled: cancelled")
        except Exception as e:  # noqa: BLE001 - the item fails; said in its words
            results, error = None, e
        if error is None and self.computed is not None:
            self.computed()
        if error is not None:
            self._settled(o)
        self.settle(o, error, results, started)

    def _writes(self, o: Outcome) -> list:
        return [f for f, p in zip(self.futures[o], o.pending.values())
                if not sinks.sink_entry(p.sink).has(sinks.IN_SUMMARY)]

    def _settled(self, o: Outcome) -> None:
        """Wait until none of failed ``o``'s writes can still write into its staging (each finishes or
        fails at once: it needs the failed task), so aborting removes the staging for good."""
        with contextlib.suppress(Exception):  # a write cancelled or timed out: the staging goes anyway
            wait(self._writes(o), timeout=120)


def execute(outcomes: list[Outcome], session: RunSession, config: RunConfig, *, cache: Any = None,
            tell: Callable[[Any], None] = lambda event: None, memory: Callable[[], Any] | None = None,
            computed: Callable[[], Any] | None = None) -> None:
    """Compute the ``todo`` outputs of every outcome's job on ``session`` and commit each job's outputs
    when all are done, filling its outcome (``status``, ``values``, ``written``, ``error``, ``seconds``)
    and telling ``tell`` when each starts and ends (:mod:`flowgpu.diagnostics.events`). Without
    ``keep_going`` the first failure cancels the rest and is raised; with it, every failure stays in
    its outcome. ``memory``: a function that gives the session's ``memory_summary()`` the caller asked
    for just before (the spill watch starts from it), so the workers need not be asked again.
    ``computed``: called as soon as a plain run's results are back on a Session, before they are
    committed (the run asks the workers for their memory accounting then, answered while it commits)."""
    run = _Batch(session, config, cache, tell, computed)
    work = [o for o in outcomes if o.job.todo]
    client = session.client
    check_visible(client, input_entries(o.job.plan for o in work))  # before anything is staged
    try:
        with run.bars:
            ready = []
            for o in work:
                try:
                    run.start(o)
                    ready.append(o)
                except Exception as e:  # noqa: BLE001 - said in the item's words
                    run.fail(o, e)
                    if not config.keep_going:
                        raise o.error from e
            check_visible(client, output_entries(p for o in ready for p in o.pending.values()))
            faults.point("after-prepare")
            baseline = ASK if memory is None else memory  # asked before the run; the watch's thread waits for it
            with watch_spill(session, baseline=baseline) as watch:  # a spill directory that fills during the run stops it
                if client is not None:
                    run.distributed(ready)
                else:
                    run.local(ready)
            if watch.error is not None:
                raise watch.stopped()
    finally:
        for o in work:
            if o.status not in ("ok", "failed", "cancelled"):
                run.fail(o, None, "cancelled")
    failed = [o for o in work if o.status == "failed"]
    if failed and not config.keep_going:
        raise failed[0].error


# -- what the workers see (check_visible) --------------------------------------------------------------------------
# The file a staging folder holds from the start (flowgpu.io.atomic): who writes there.
STAGE_MARKER = "owner.json"


def input_entries(plans: Iterable[Plan]) -> list[dict[str, Any]]:
    """What the workers must read: the metadata of every input that reads stored data (in included specs too)."""
    out, seen = [], set()
    for top in plans:
        for plan in top.tree():
            for name, node in plan.nodes.items():
                if node.kind != "input" or not node.reads_files:
                    continue
                model = plan.spec.inputs[name]
                path = getattr(model, "path", None)
                if not isinstance(path, str) or paths.is_url(path) or path in seen:
                    continue
                seen.add(path)
                files = paths.metadata_files(path, getattr(model, "component", None))
                if files:
                    out.append({"what": f"input {name!r} ({sources.source_entry(model.source).name})",
                                "path": path, "read": files})
    return out


def output_entries(pending: Iterable[Any]) -> list[dict[str, Any]]:
    """What the workers must write: the staging folder of every staged output (``PendingWrite``s)."""
    return [{"what": f"output {p.location!r}", "path": p.location, "write": p.atomic.stage, "marker": STAGE_MARKER}
            for p in pending if getattr(p, "atomic", None) is not None]


def folder_entries(spec: Any) -> list[dict[str, Any]]:
    """For a check that writes nothing (validate): each output path's nearest existing folder, by inode."""
    out = []
    for name, o in spec.outputs.items():
        if not o.path or paths.is_url(o.path):
            continue
        folder = next(str(p) for p in pathlib.PurePath(o.path).parents if os.path.isdir(p))  # o.path is absolute
        out.append({"what": f"output {name!r}", "path": o.path, "write": folder, "inode": os.stat(folder).st_ino})
    return out


def check_visible(client: Any, entries: list[dict[str, Any]]) -> None:
    """Ask every worker of ``client``'s cluster about ``entries``; raise when one cannot reach one."""
    if client is None or not entries:
        return
    answers = client.run(paths.probe, [{k: v for k, v in e.items() if k not in ("what", "path")} for e in entries])
    problems = [(address, answer, problem) for address, answer in sorted(answers.items())
                for problem in answer["problems"]]
    if not problems:
        return
    address, answer, (index, path, why) = problems[0]
    entry = entries[index]
    shown = entry["path"] if path == entry["path"] else f"{entry['path']} ({path})"
    workers = len({a for a, _, _ in problems})
    more = f" (and {len(problems) - 1} more problem(s) on {workers} worker(s))" if len(problems) > 1 else ""
    raise PathNotVisibleError(
        f"{entry['what']}: {shown} {why} for worker {address} on host {answer['host']} (working directory "
        f"{answer['cwd']}){more}; {paths.FIX}. Nothing was computed")


def check_joined(spec: Any, plan: Plan, options: dict[str, Any]) -> None:
    """What ``validate --scheduler`` adds: join the scheduler in ``options`` (Session keywords) and ask
    its workers about ``plan``'s inputs and ``spec``'s output folders, writing nothing. Nothing when
    ``options`` names no scheduler."""
    options = {k: v for k, v in options.items() if k != "standalone"}
    address = options.pop("address", None)
    if address is None:
        return
    with runtime.Session(address, **options) as session:
        check_visible(session.client, input_entries([plan]) + folder_entries(spec))


# -- a failed item said in its step's words, and the watch over a run ------------------------------
# code whose frames a user does not need to see: flowgpu's own and the libraries it runs on
_LIBRARY_PARTS = (os.sep + "flowgpu" + os.sep, os.sep + "dask" + os.sep, os.sep + "distributed" + os.sep,
                  os.sep + "numpy" + os.sep, os.sep + "cupy" + os.sep, os.sep + "toolz" + os.sep)


def _step_of(plan: Plan, name: str, prefix: str = "") -> tuple[str, da.Array] | None:
    for step in plan.order:
        if plan.nodes[step].kind == "uses":
            found = _step_of(plan.children[step], name, f"{prefix}{step}/")
            if found:
                return found
            continue
        x = plan.arrays.get(step)
        if isinstance(x, da.Array) and (x.name == name or name in x.__dask_graph__().layers):
            return prefix + step, x
    return None


def failed_with(error: BaseException) -> str:
    """``"ValueError: bad block (raised at boom.py:2, in boom)"``: the error and the innermost frame of
    the user's own code, taken from the traceback distributed brings back from the worker. The
    workers' own "Compute Failed" logs are silenced (the Session's ``silence_logs``), so this line is
    where a user learns where their function failed."""
    text = f"{type(error).__name__}: {error}"
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not any(part in f.filename for part in _LIBRARY_PARTS) and not f.filename.startswith("<")]
    if frames:
        f = frames[-1]
        text += f" (raised at {os.path.basename(f.filename)}:{f.lineno}, in {f.name})"
    return text


def explain(error: BaseException, plan: Plan | None, session: RunSession) -> RunError | None:
    """A :class:`RunError` naming the step, chunk size and memory limit for a ``KilledWorker``; None
    for any other error."""
    if not isinstance(error, KilledWorker) or plan is None:
        return None
    key = getattr(error, "task", None)
    name = key[0] if isinstance(key, tuple) else str(key)
    found = _step_of(plan, name)
    step = f"step {found[0]!r}" if found else f"task {key_split(name)!r}"
    chunk = ""
    if found and not any(np.isnan(c) for c in found[1].chunksize):
        x = found[1]
        chunk = f" (chunks of {format_bytes(int(np.prod(x.chunksize, dtype=np.int64)) * x.dtype.itemsize)})"
    limits = {w.get("memory_limit") for w in getattr(session, "workers", {}).values()} - {None}
    limit = f"limited to {format_bytes(min(limits))} each" if limits else "with no memory limit"
    return RunError(
        f"{step}{chunk} killed the worker processes that ran it ({limit}); the most likely cause is running "
        "out of memory. Use smaller chunks, fewer threads_per_worker, or a larger cluster.memory_limit "
        "(flowgpu plan shows each step's chunks and the estimated peak per worker). Nothing was written"
    )


ASK = object()  # watch_spill's baseline when the caller has none: it asks the workers


class watch_spill:  # noqa: N801 - used as a context manager, like a function
    """While open, end the session's computations when they cannot go on but would wait for ever:

    * a worker's spill directory stops taking writes (distributed pauses such a worker for ever);
    * the cluster has had no worker at all for ``flowgpu.run.no-workers-timeout`` (every worker
      died or was killed and none came back: distributed waits for one without a word).

    ``baseline``: the session's :meth:`memory_summary` asked for before the run (its errors are old
    ones), or a function that answers it: the watch's thread waits for the answer at its first look,
    the run does not; by default it is asked for on entering."""

    def __init__(self, session: RunSession, interval: float = 1.0, baseline: Any = ASK, no_workers: float | None = None):
        self.session, self.interval, self.baseline = session, interval, baseline
        self.no_workers = config.parse_seconds(config.get("run.no-workers-timeout")) if no_workers is None \
            else no_workers
        self.error: str | None = None
        self.kind = "spill"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _stop_run(self, kind: str, error: str) -> None:
        client = self.session.client
        self.kind, self.error = kind, error
        futures = [Future(k, client) for k in list(client.futures)]
        client.cancel(futures, reason=f"flowgpu-{kind}", msg=error)

    def _watch(self, baseline: Any, started: set[str]) -> None:
        client = self.session.client
        before: Any = ASK
        alone_since = None
        while not self._stop.wait(self.interval):
            if before is ASK:  # a run shorter than one interval never waits for the answer
                summary = baseline() if callable(baseline) else baseline
                before = set(summary["errors"]) if summary is not None else None  # only flowgpu's store reports them
            if before is not None:
                now = self.session.memory_summary()
                new = [e for e in (now["errors"] if now else ()) if e not in before]
                if new:
                    self._stop_run("spill", new[0])
                    return
            workers = _worker_count(client)
            if workers is None or workers:
                alone_since = None
                continue
            alone_since = alone_since or time.monotonic()
            if time.monotonic() - alone_since >= self.no_workers:
                self._stop_run("no-workers", _workers_gone(client, started, self.no_workers))
                return

    def __enter__(self) -> "watch_spill":
        client = getattr(self.session, "client", None)
        if client is None:
            return self
        baseline = self.session.memory_summary() if self.baseline is ASK else self.baseline
        started = set(getattr(self.session, "workers", None) or ())  # as the Session met them: no round trip
        self._thread = threading.Thread(target=self._watch, args=(baseline, started), daemon=True,
                                        name="flowgpu-watch-run")
        self._thread.start()
        return self

    def stopped(self) -> RunError:
        """The error that says why the watch stopped the run (when ``self.error`` is set)."""
        if self.kind == "no-workers":
            return RunError(f"{self.error}. Nothing was written")
        return RunError(f"a worker could not spill, so the run was stopped: {self.error}. Nothing was written")

    def __exit__(self, kind, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc is not None and self.error is not None:
            raise self.stopped() from exc


def _worker_count(client: Any) -> int | None:
    """How many workers the scheduler has, as the client last heard (it asks every 2 s by itself,
    ``distributed.client.scheduler-info-interval``): no round trip of the run's own. None: not known."""
    info = getattr(client, "_scheduler_identity", None)
    count = info.get("n_workers") if isinstance(info, dict) else None
    if count is None and isinstance(info, dict) and isinstance(info.get("workers"), dict):
        count = len(info["workers"])
    return count if isinstance(count, int) else None


def _workers_gone(client: Any, started: set[str], waited: float) -> str:
    """What happened to the workers, as the scheduler saw it: which left, and with how many tasks running."""
    try:
        events = [e for _, e in client.get_events("all") if isinstance(e, dict) and e.get("action") == "remove-worker"]
    except Exception:  # noqa: BLE001 - the account is best effort; the stop is not
        events = []
    lost = [e for e in events if not e.get("expected")]
    names = sorted({e.get("worker") for e in lost if e.get("worker")} | started)
    running = sum(len(e.get("processing-tasks") or ()) for e in lost)
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (f"the cluster has had no worker for {waited:g}s, so the run was stopped: {len(lost) or len(names)} "
            f"worker(s) left it without being asked to ({shown}; {running} task(s) were running on them) and none "
            "came back. Workers die when they run out of memory, crash in native code or are killed: their logs say "
            "which (flowgpu.run.no-workers-timeout sets how long a run waits for one)")
