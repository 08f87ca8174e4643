"""A worker that died while running a step, said in the step's words instead of ``KilledWorker``.

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

import os
import threading
import time
import traceback
from typing import Any

import dask.array as da
import numpy as np
from dask.utils import format_bytes, key_split
from distributed import Future, KilledWorker

from flowgpu import config
from flowgpu.errors import RunError
from flowgpu.pipeline.compiler import Plan
from flowgpu.runtime import RunSession

__all__ = ["explain", "failed_with", "watch_spill"]

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

    ``baseline``: the session's :meth:`memory_summary` taken just before (its errors are old ones),
    which saves asking the workers again; by default it is asked for on entering."""

    def __init__(self, session: RunSession, interval: float = 1.0, baseline: Any = ASK, no_workers: float | None = None):
        self.session, self.interval, self.baseline = session, interval, baseline
        self.no_workers = config.parse_seconds(config.get("run.no-workers-timeout")) if no_workers is None \
            else no_workers
        self.error: str | None = None
        self.kind = "spill"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _errors(self) -> list[str]:
        summary = self.session.memory_summary()
        return list(summary["errors"]) if summary else []

    def _stop_run(self, kind: str, error: str) -> None:
        client = self.session.client
        self.kind, self.error = kind, error
        futures = [Future(k, client) for k in list(client.futures)]
        client.cancel(futures, reason=f"flowgpu-{kind}", msg=error)

    def _watch(self, before: set | None, started: set[str]) -> None:
        client = self.session.client
        alone_since = None
        while not self._stop.wait(self.interval):
            if before is not None:
                new = [e for e in self._errors() if e not in before]
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
        summary = self.session.memory_summary() if self.baseline is ASK else self.baseline
        before = set(summary["errors"]) if summary is not None else None  # only flowgpu's store reports spill errors
        started = set(getattr(self.session, "workers", None) or ())  # as the Session met them: no round trip
        self._thread = threading.Thread(target=self._watch, args=(before, started), daemon=True,
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
