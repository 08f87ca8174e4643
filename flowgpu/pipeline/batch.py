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

__all__ = ["Job", "Outcome", "execute"]


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
        for name in job.todo:
            in_summary = sinks.sink_entry(job.item.spec.outputs[name].sink).has(sinks.IN_SUMMARY)
            cache.record(job.plan, name, job.recipes[name], item=job.item.values,
                         location=None if in_summary else o.values[name],
                         value=o.values[name] if in_summary else None)
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
                    try:
                        results, error = client.gather(self.futures[o]), None
                    except Exception as e:  # noqa: BLE001
                        results, error = None, e
                    self.settle(o, error, results, started)
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
    visibility.check(client, visibility.input_entries(o.job.plan for o in work))  # before anything is staged
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
            visibility.check(client, visibility.output_entries(p for o in ready for p in o.pending.values()))
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
        for o in work:
            if o.status not in ("ok", "failed", "cancelled"):
                run.fail(o, None, "cancelled")
    failed = [o for o in work if o.status == "failed"]
    if failed and not config.keep_going:
        raise failed[0].error
