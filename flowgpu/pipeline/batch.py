"""Running the items of a batch (a plain run is one) on one session.

All items are staged, then submitted together (shared tasks run once); each item's outputs are
committed in a transaction of their own as its last future completes. Before anything is staged,
every worker is asked whether it sees the inputs and output folders as the client does
(:func:`check_visible`): a worker that cannot would read every chunk as the fill value. A worker
killed while running a step is said in that step's words (:func:`explain`); :class:`watch_spill`
stops a run that would wait for ever (a spill directory that fills, no workers left).
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
from flowgpu.errors import FlowgpuError, OutputError, PathNotVisibleError, RunError
from flowgpu.io import faults, paths, sinks, sources
from flowgpu.pipeline.compiler import Plan, calls_user_code, compile
from flowgpu.pipeline.foreach import Item, in_item
from flowgpu.pipeline.planning import check_memory, describe
from flowgpu.pipeline.runconfig import RunConfig
from flowgpu.runtime import RunSession

__all__ = ["Job", "Outcome", "execute", "check_joined", "watch_spill"]


@dataclass(frozen=True)
class Job:
    """One item of a batch as planned and judged (frozen; what happens to it is its :class:`Outcome`)."""

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
    ok, failed, up-to-date or cancelled; ``written``: the outputs moved into place."""

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
        return {**self.job.cached, **self.values}

    def abort(self) -> None:
        for p in self.pending.values():
            p.abort()


def _failure(o: Outcome, error: BaseException, session: RunSession) -> FlowgpuError:
    """What a user is told when ``o``'s job failed: the step, the fix, that nothing was replaced."""
    item, name = o.job.item, o.job.item.spec.name
    if gone := runtime.cluster_gone(session, [p.location for p in o.pending.values() if p.location]):
        return in_item(RunError(f"pipeline {name!r} stopped: {gone}"), item)
    if isinstance(error, FlowgpuError):
        return in_item(error, item)
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        paths = ", ".join(repr(p.location) for p in o.pending.values() if p.location)
        out: FlowgpuError = OutputError(f"pipeline {name!r} failed writing its outputs ({paths}): {error.strerror}; "
                                        "free space there or choose a path on another filesystem. Nothing was replaced")
    else:
        out = explain(error, o.plan, session) or RunError(
            f"pipeline {name!r} failed while running: {failed_with(error)}")
    out.__cause__ = error
    return in_item(out, item)


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
    """``compute(targets)``'s results (or futures) in the order of ``targets``: dask (2026.8) answers
    group by group of collections with the same optimizer (``compute(array_a, delayed_b, array_c)``
    gives ``(a, c, b)``), so the targets go in grouped that way and the answers are put back in order."""
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
    """One :func:`execute`: the session, the cache, the progress bars and whom to tell."""

    def __init__(self, session: RunSession, config: RunConfig, cache: Any, tell: Callable[[Any], None],
                 computed: Callable[[], Any] | None = None):
        self.session, self.config, self.cache, self.tell, self.computed = session, config, cache, tell, computed
        self.bars = BatchBars(config.console, show=config.progress)
        self.bar: dict[Outcome, Any] = {}
        self.futures: dict[Outcome, list] = {}

    def start(self, o: Outcome) -> None:
        """Stage the job's writes and say it starts. Compiled again for the session when its plan was built
        for other workers, or stands in for python sources (called here, and only here)."""
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
        if error is not None:
            o.error = _failure(o, error, self.session)
        if status == "cancelled" and o in self.futures and (writes := self._writes(o)):
            # its writes stop: running tasks finish, and their staging goes after them (at the latest
            # when the next run takes the lock)
            self.session.client.cancel(writes)
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
        if len(ready) == 1:  # a plain run: waited for and gathered in one call, as compute() does
            if self.computed is not None:
                self._when_done(ready[0])
            self._gather_one(client, ready[0], started)
            return
        for future in as_completed([f for o in ready for f in self.futures[o]]):  # the rest: execute cancels
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

    def _gather_one(self, client: Any, o: Outcome, started: float) -> None:
        """Fetch ``o``'s results in one round trip (the first failure ends the wait); commit or fail it."""
        try:
            results, error = client.gather(self.futures[o]), None
        except CancelledError:  # distributed's FutureCancelledError
            results, error = None, RunError(f"pipeline {o.job.item.spec.name!r} was cancelled: cancelled")
        except Exception as e:  # noqa: BLE001 - the item fails; said in its words
            results, error = None, e
        if error is not None:
            self._settled(o)
        self.settle(o, error, results, started)

    def _when_done(self, o: Outcome) -> None:
        """Call ``computed`` as soon as all of ``o``'s tasks have finished (on distributed's callback thread),
        so what it asks the workers is answered while the results come back and are committed."""
        left, lock = [len(self.futures[o])], threading.Lock()

        def done(_: Future) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            if all(f.status == "finished" for f in self.futures[o]):
                self.computed()

        for f in self.futures[o]:
            f.add_done_callback(done)

    def _writes(self, o: Outcome) -> list:
        return [f for f, p in zip(self.futures[o], o.pending.values())
                if not sinks.sink_entry(p.sink).has(sinks.IN_SUMMARY)]

    def _settled(self, o: Outcome) -> None:
        """Wait until none of failed ``o``'s writes can still write into its staging."""
        with contextlib.suppress(Exception):  # a write cancelled or timed out: the staging goes anyway
            wait(self._writes(o), timeout=120)


def execute(outcomes: list[Outcome], session: RunSession, config: RunConfig, *, cache: Any,
            tell: Callable[[Any], None], memory: Callable[[], Any],
            computed: Callable[[], Any] | None) -> None:
    """Compute each job's ``todo`` outputs on ``session``, commit each job when all its outputs are done
    and fill its outcome, telling ``tell`` when each starts and ends. Without ``keep_going`` the first
    failure cancels the rest and is raised. ``memory``: gives the ``memory_summary()`` asked for just
    before (the spill watch starts from it); ``computed``: called when a plain run's tasks have finished."""
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
            with watch_spill(session, memory) as watch:
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


# -- what the workers see (check_visible) ------------------------------------------------------------
STAGE_MARKER = "owner.json"  # what a staging folder holds from the start (flowgpu.io.atomic)


def input_entries(plans: Iterable[Plan]) -> list[dict[str, Any]]:
    """What the workers must read: the metadata of every input that reads stored data."""
    out, seen = [], set()
    for path, spec, name in (read for plan in plans for read in plan.reads()):
        model = spec.inputs[name]
        files = paths.metadata_files(path, getattr(model, "component", None)) if path not in seen else None
        seen.add(path)
        if files:
            out.append({"what": f"input {name!r} ({sources.source_entry(model.source).name})", "path": path,
                        "read": files})
    return out


def output_entries(pending: Iterable[Any]) -> list[dict[str, Any]]:
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
    """``validate --scheduler``: ask the workers of the scheduler in ``options`` about the inputs and
    output folders, writing nothing."""
    options = {k: v for k, v in options.items() if k != "standalone"}
    address = options.pop("address", None)
    if address is None:
        return
    with runtime.Session(address, **options) as session:
        check_visible(session.client, input_entries([plan]) + folder_entries(spec))


# -- a failed item said in its step's words, and the watch over a run ------------------------------
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
    """``"ValueError: bad block (raised at boom.py:2, in boom)"``: the innermost frame of the user's own
    code (the workers' "Compute Failed" logs are silenced, so this line says where it failed)."""
    text = f"{type(error).__name__}: {error}"
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not any(part in f.filename for part in _LIBRARY_PARTS) and not f.filename.startswith("<")]
    if frames:
        f = frames[-1]
        text += f" (raised at {os.path.basename(f.filename)}:{f.lineno}, in {f.name})"
    return text


def explain(error: BaseException, plan: Plan | None, session: RunSession) -> RunError | None:
    """A :class:`RunError` naming the step, chunk size and memory limit for a ``KilledWorker``, else None."""
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


class watch_spill:  # noqa: N801 - used as a context manager, like a function
    """While open, cancel the session's computations when they would wait for ever: a worker's spill
    directory stops taking writes, or the cluster has had no worker for ``flowgpu.run.no-workers-timeout``.
    ``baseline``: a function that answers the :meth:`memory_summary` asked for before the run (its errors
    are old ones), waited for at the watch's first look."""

    interval = 1.0  # seconds between looks

    def __init__(self, session: RunSession, baseline: Callable[[], Any]):
        self.session, self.baseline = session, baseline
        self.no_workers = config.parse_seconds(config.get("run.no-workers-timeout"))
        self.error: str | None = None
        self.kind = "spill"
        self._stop, self._lock = threading.Event(), threading.Lock()
        self._thread: threading.Thread | None = None

    def _stop_run(self, kind: str, error: str) -> None:
        client = self.session.client
        self.kind, self.error = kind, error
        futures = [Future(k, client) for k in list(client.futures)]
        client.cancel(futures, reason=f"flowgpu-{kind}", msg=error)

    def _watch(self, started: set[str]) -> None:
        client = self.session.client
        summary = self.baseline()  # started one interval in: a shorter run never waits for the answer
        before = set(summary["errors"]) if summary is not None else None  # only flowgpu's store reports them
        alone_since = None
        while True:
            if before is not None:
                now = self.session.memory_summary()
                new = [e for e in (now["errors"] if now else ()) if e not in before]
                if new:
                    self._stop_run("spill", new[0])
                    return
            workers = _worker_count(client)
            alone_since = None if workers is None or workers else alone_since or time.monotonic()
            if alone_since is not None and time.monotonic() - alone_since >= self.no_workers:
                self._stop_run("no-workers", _workers_gone(client, started, self.no_workers))
                return
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> "watch_spill":
        client = getattr(self.session, "client", None)
        if client is None:
            return self
        started = set(getattr(self.session, "workers", None) or ())  # as the Session met them: no round trip

        def begin() -> None:  # on the client's event loop, one interval in: a shorter run starts no thread
            with self._lock:
                if not self._stop.is_set():
                    self._thread = threading.Thread(target=self._watch, args=(started,), daemon=True,
                                                    name="flowgpu-watch-run")
                    self._thread.start()

        loop = client.loop.asyncio_loop
        loop.call_soon_threadsafe(loop.call_later, self.interval, begin)
        return self

    def stopped(self) -> RunError:
        if self.kind == "no-workers":
            return RunError(f"{self.error}. Nothing was written")
        return RunError(f"a worker could not spill, so the run was stopped: {self.error}. Nothing was written")

    def __exit__(self, kind, exc, tb) -> None:
        with self._lock:
            self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc is not None and self.error is not None:
            raise self.stopped() from exc


def _worker_count(client: Any) -> int | None:
    """How many workers the scheduler has, as the client last heard (no round trip); None: not known."""
    info = getattr(client, "_scheduler_identity", None)
    count = info.get("n_workers") if isinstance(info, dict) else None  # Scheduler.identity() says it
    return count if isinstance(count, int) else None


def _workers_gone(client: Any, started: set[str], waited: float) -> str:
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
