"""Running the items of a batch on one session: prepared, submitted together, committed one by one.

Every item (a plain run is a batch of one) is compiled inside the session and its outputs to
compute are staged; then all items go to the cluster at once, so independent items run
concurrently and tasks they share (the same input read by all) run once. As each item's last
future completes, its outputs are committed in one transaction of their own (all new or all old)
and recorded in the cache; an item that fails is aborted (nothing of it moved into place) and,
unless ``keep_going``, stops the batch: the others are cancelled and aborted too, and what was
already committed stays, complete and recorded (a re-run skips it).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any

import dask
from distributed import as_completed, wait

from flowgpu.diagnostics import BatchBars
from flowgpu.diagnostics.events import ItemFinished, ItemStarted
from flowgpu.errors import FlowgpuError, OutputError, RunError, SpecError
from flowgpu.io import faults, sinks
from flowgpu.pipeline import visibility
from flowgpu.pipeline.compiler import Plan, calls_user_code, compile
from flowgpu.pipeline.failures import ASK, explain, failed_with, watch_spill
from flowgpu.pipeline.foreach import Item, in_item
from flowgpu.pipeline.planning import check_memory, describe
from flowgpu.pipeline.runconfig import RunConfig
from flowgpu.runtime import RunSession

__all__ = ["Job", "execute"]


@dataclass
class Job:
    """One item of a batch on its way: what to compute, its staged writes, its futures, its outcome."""

    item: Item
    plan: Plan  # compiled outside the session (pure): shapes, dtypes, recipes
    todo: list[str]  # the outputs to compute (the others are up to date)
    cached: dict[str, Any] = field(default_factory=dict)  # up-to-date outputs: value or location
    reasons: dict[str, str] = field(default_factory=dict)  # why each output of todo is computed
    verdicts: dict[str, Any] = field(default_factory=dict)  # the cache's word on each output
    recipes: dict[str, Any] | None = None
    run_plan: Plan | None = None  # compiled inside the session
    pending: dict[str, sinks.PendingWrite] = field(default_factory=dict)
    futures: list = field(default_factory=list)
    status: str = "waiting"  # waiting, running, ok, failed, up-to-date, cancelled
    values: dict[str, Any] = field(default_factory=dict)
    written: dict[str, str] = field(default_factory=dict)
    error: BaseException | None = None
    seconds: float = 0.0
    bar: Any = None

    @property
    def name(self) -> str:
        return self.item.spec.name

    def abort(self) -> None:
        for p in self.pending.values():
            p.abort()


def _said(job: Job, error: FlowgpuError) -> FlowgpuError:
    """``error`` naming the batch item it came from (a plain run's error is left as it is)."""
    item = job.item
    if item.of <= 1 and not item.values:
        return error
    if isinstance(error, SpecError):
        return in_item(error, item)
    said = type(error)(f"batch item {item.index + 1} of {item.of} ({item.label}): {error}")
    said.__cause__ = error.__cause__
    return said


def _failure(job: Job, error: BaseException, session: RunSession) -> FlowgpuError:
    """What a user is told when ``job`` failed with ``error``: the step, the fix, that nothing was replaced."""
    if isinstance(error, FlowgpuError):
        return _said(job, error)
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        paths = ", ".join(repr(p.location) for p in job.pending.values() if p.location)
        out: FlowgpuError = OutputError(f"pipeline {job.name!r} failed writing its outputs ({paths}): {error.strerror}; "
                                        "free space there or choose a path on another filesystem. Nothing was replaced")
    else:
        out = explain(error, job.run_plan, session) or RunError(
            f"pipeline {job.name!r} failed while running: {failed_with(error)}")
    out.__cause__ = error
    return _said(job, out)


def _prepare(job: Job, session: RunSession, overwrite: bool) -> None:
    """Stage ``job``'s writes, on its plan as compiled, unless that was built for other workers than
    the session's (a run that started its own cluster after judging its outputs) or stands in for
    python sources, which are called here, and only here: then compiled for the session."""
    spec = job.item.spec
    facts = session.facts
    plan = job.run_plan = compile(spec, for_run=True, facts=facts) \
        if job.plan.facts != facts or (calls_user_code(job.plan) and not job.plan.for_run) else job.plan
    if session.workers:  # one task, and the largest array, fit the workers (or a SpecError)
        check_memory(plan, session.workers, session.threads_per_worker, session.worker_budget)
    for name in job.todo:
        out = spec.outputs[name]
        x = plan.labelled.get(name, plan.outputs[name])  # labelled outputs as xarray.DataArray (sink: xarray)
        job.pending[name] = sinks.prepare_write(out.sink, x, out.path, overwrite, **out.sink_options())


def _commit(job: Job, results: list[Any], cache: Any) -> None:
    """Move ``job``'s outputs into place together, then record them (an entry only for a complete output)."""
    spec = job.item.spec
    if cache is not None:
        cache.invalidate(job.plan, job.todo, item=job.item.values)
    locations = sinks.commit_all(list(job.pending.values()))
    for (name, p), result, location in zip(job.pending.items(), results, locations):
        if sinks.sink_entry(p.sink).has(sinks.IN_SUMMARY):
            job.values[name] = sinks.to_summary_value(result)
        else:
            job.values[name] = job.written[name] = location
    faults.point("item-committed")
    if cache is not None and job.recipes is not None:
        for name in job.todo:
            in_summary = sinks.sink_entry(spec.outputs[name].sink).has(sinks.IN_SUMMARY)
            cache.record(job.plan, name, job.recipes[name], item=job.item.values,
                         location=None if in_summary else job.values[name],
                         value=job.values[name] if in_summary else None)
    job.status = "ok"


class _Batch:
    """One :func:`execute`: the session, the cache, the progress bars and whom to tell."""

    def __init__(self, session: RunSession, config: RunConfig, cache: Any, tell: Callable[[Any], None]):
        self.session, self.config, self.cache, self.tell = session, config, cache, tell
        self.bars = BatchBars(config.console, show=config.progress)

    def start(self, job: Job) -> None:
        """Stage ``job`` and say it starts."""
        _prepare(job, self.session, self.config.overwrite)
        item = job.item
        self.tell(ItemStarted(item.index, item.label if item.values else None, job.run_plan,
                              functools.partial(describe, job.run_plan), {n: p.target for n, p in job.pending.items()},
                              tuple(job.cached)))
        job.bar = self.bars.add(item.label)

    def settle(self, job: Job, error: BaseException | None, results: list[Any] | None, started: float) -> None:
        """Commit ``job`` (or fail it, removing its staging) and say how it ended."""
        job.seconds = time.perf_counter() - started
        self.bars.done(job.bar)
        if error is None:
            try:
                _commit(job, results or [], self.cache)
            except Exception as e:  # noqa: BLE001 - said below, with the item
                error = e
        if error is None:
            self.tell(ItemFinished(job.item.index, job))
        else:
            self.fail(job, error)

    def fail(self, job: Job, error: BaseException | None, status: str = "failed") -> None:
        """``job`` failed with ``error`` (or was cancelled): its staging removed, said."""
        if error is not None:
            job.error = _failure(job, error, self.session)
        job.status = status
        job.abort()
        self.tell(ItemFinished(job.item.index, job))

    def local(self, jobs: list[Job]) -> None:
        """One item after the other on dask's threaded scheduler, in this process."""
        for job in jobs:
            started = time.perf_counter()
            job.status = "running"
            try:
                with self.bars.local(job.bar) or contextlib.nullcontext():
                    results = list(dask.compute(*(p.target for p in job.pending.values()), scheduler="threads"))
                error = None
            except Exception as e:  # noqa: BLE001 - the item fails; said in its words
                results, error = None, e
            self.settle(job, error, results, started)
            if job.status == "failed" and not self.config.keep_going:
                return

    def distributed(self, jobs: list[Job]) -> None:
        """Every item submitted at once; each committed as soon as its last future is done."""
        client = self.session.client
        started = time.perf_counter()
        owner: dict[int, Job] = {}
        left: dict[int, int] = {}
        futures = client.compute([p.target for job in jobs for p in job.pending.values()])  # one graph, shared tasks once
        for job in jobs:
            job.futures, futures = futures[:len(job.pending)], futures[len(job.pending):]
            job.status = "running"
            self.bars.follow(job.bar, client, job.futures)
            for f in job.futures:
                owner[id(f)] = job
            left[id(job)] = len(job.futures)
        try:
            if len(jobs) == 1:  # a plain run: waited for and gathered in one call, as compute() does
                self._gather_one(client, jobs[0], started)
                return
            for future in as_completed([f for job in jobs for f in job.futures]):
                job = owner[id(future)]
                if job.status != "running":
                    continue
                if future.status != "finished":
                    error = future.exception() if future.status == "error" else RunError(
                        f"pipeline {job.name!r} was cancelled: {future.status}")
                    _settled(job)
                    self.settle(job, error, None, started)
                    if not self.config.keep_going:
                        return
                    continue
                left[id(job)] -= 1
                if left[id(job)] == 0:
                    try:
                        results, error = client.gather(job.futures), None
                    except Exception as e:  # noqa: BLE001
                        results, error = None, e
                    self.settle(job, error, results, started)
                    if job.status == "failed" and not self.config.keep_going:
                        return
        finally:
            for job in jobs:
                if job.status == "running":
                    _cancel(client, job)
                    self.fail(job, None, "cancelled")

    def _gather_one(self, client: Any, job: Job, started: float) -> None:
        """Wait for ``job``'s futures and fetch their results in one round trip (the first failure ends
        the wait), then commit or fail it."""
        try:
            results, error = client.gather(job.futures), None
        except CancelledError:  # distributed's FutureCancelledError
            results, error = None, RunError(f"pipeline {job.name!r} was cancelled: cancelled")
        except Exception as e:  # noqa: BLE001 - the item fails; said in its words
            results, error = None, e
        if error is not None:
            _settled(job)
        self.settle(job, error, results, started)


def _writes(job: Job) -> list:
    return [f for f, p in zip(job.futures, job.pending.values()) if not sinks.sink_entry(p.sink).has(sinks.IN_SUMMARY)]


def _settled(job: Job) -> None:
    """Wait until none of failed ``job``'s writes can still write into its staging (each finishes or
    fails at once: it needs the failed task), so aborting removes the staging for good."""
    try:
        wait(_writes(job), timeout=120)
    except Exception:  # noqa: S110 - a write that was cancelled or timed out: the staging goes anyway
        pass


def _cancel(client: Any, job: Job) -> None:
    """Stop ``job``'s writes (tasks already running finish; their staging is removed after them, at
    the latest when the next run takes the output's lock)."""
    writes = _writes(job)
    if writes:
        client.cancel(writes)


def execute(jobs: list[Job], session: RunSession, config: RunConfig, *, cache: Any = None,
            tell: Callable[[Any], None] = lambda event: None, memory: Callable[[], Any] | None = None) -> None:
    """Compute the ``todo`` outputs of every job on ``session`` and commit each job's outputs when all
    are done; sets each job's ``status``, ``values`` and ``error``, and tells ``tell`` when each
    starts and ends (:mod:`flowgpu.diagnostics.events`). Without ``keep_going`` the first failure
    cancels the rest and is raised; with it, every failure stays in its job. ``memory``: a function that
    gives the session's ``memory_summary()`` the caller asked for just before (the spill watch starts
    from it), so the workers need not be asked again."""
    run = _Batch(session, config, cache, tell)
    work = [job for job in jobs if job.todo]
    client = session.client
    visibility.check(client, visibility.input_entries(job.plan for job in work))  # before anything is staged
    try:
        with run.bars:
            ready = []
            for job in work:
                try:
                    run.start(job)
                    ready.append(job)
                except Exception as e:  # noqa: BLE001 - said in the item's words
                    run.fail(job, e)
                    if not config.keep_going:
                        raise job.error from e
            visibility.check(client, visibility.output_entries(p for job in ready for p in job.pending.values()))
            faults.point("after-prepare")
            baseline = ASK if memory is None else memory()
            with watch_spill(session, baseline=baseline) as watch:  # a spill directory that fills during the run stops it
                if client is not None:
                    run.distributed(ready)
                else:
                    run.local(ready)
            if watch.error is not None:
                raise watch.stopped()
    finally:
        for job in work:
            if job.status not in ("ok", "failed", "cancelled"):
                run.fail(job, None, "cancelled")
    failed = [job for job in work if job.status == "failed"]
    if failed and not config.keep_going:
        raise failed[0].error
