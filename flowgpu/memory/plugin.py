"""Worker side of the store: :func:`stats`, and :class:`MemoryPlugin` on each worker, which

* adds ``flowgpu-memory`` (bytes per tier, moves) to the worker's heartbeat metrics;
* on GPU workers orders each task's stream after its inputs' uploads (the store only enqueues them)
  and waits for that stream before the result reaches the store, whose copies must not read a chunk
  still being computed;
* prefetches the inputs of the next ready tasks, in a thread, when they fit without evicting.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections import Counter, defaultdict

from distributed import get_worker
from distributed.diagnostics.plugin import WorkerPlugin

from flowgpu.backend import import_cupy
from flowgpu.memory.accounting import rates
from flowgpu.memory.store import FlowgpuStore
from flowgpu.transfer.streams import sync_current_stream

__all__ = ["MemoryPlugin", "delta", "stats", "summary"]

logger = logging.getLogger("flowgpu.memory")

_MAX_READY_SCAN = 2000  # beyond this many ready tasks, only look at the next one


def stats(dask_worker=None) -> dict:
    """This worker's store statistics (``client.run(stats)``); ``{"store": "<class name>"}`` for a
    store not flowgpu's."""
    if dask_worker is None:
        dask_worker = get_worker()
    data = dask_worker.data
    if isinstance(data, FlowgpuStore):
        st = data.stats()
        st["worker"] = getattr(dask_worker, "id", None)  # a worker the nanny restarts is a new one, counting from 0
        # the Zarr device path's counters, where flowgpu.io was imported (not for this: zarr costs 40 MB)
        counters = getattr(sys.modules.get("flowgpu.io.storage"), "COUNTERS", None)
        if counters is not None:
            st["moves"] = {**st["moves"], **counters.moves()}
            st["events"] = {**st["events"], **counters.events()}
        return st
    return {"store": type(data).__name__}


def summary(per_worker: dict[str, dict]) -> dict:
    """Sum ``client.run(stats)`` results over workers for a run summary; ``"workers"`` keeps each
    worker's own counters (``{worker id: {"moves", "events"}}``) for :func:`delta`."""
    moves, events = _totals(per_worker, {})
    errors = list(dict.fromkeys(e for st in per_worker.values() for e in st.get("errors", [])))  # distinct, in order
    workers = {st.get("worker") or a: {"moves": st.get("moves", {}), "events": st.get("events", {})}
               for a, st in per_worker.items()}
    stores = sorted({st.get("store", "?") for st in per_worker.values()})
    return {"stores": stores, "moves": rates(moves), "events": dict(events), "errors": errors, "workers": workers}


def delta(before: dict | None, after: dict) -> dict:
    """What the workers moved between two :func:`summary` answers, worker by worker (one started or
    restarted since ``before`` counts from 0; one gone is not counted)."""
    moves, events = _totals(after["workers"], (before or {}).get("workers", {}))
    return {"moves": rates({a: m for a, m in moves.items() if m["count"]}),
            "events": {k: n for k, n in events.items() if n}, "errors": after["errors"]}


def _totals(now: dict[str, dict], was: dict[str, dict]) -> tuple[dict[str, Counter], Counter]:
    """Each worker's ``moves`` and ``events`` in ``now`` less the same worker's in ``was``, summed."""
    moves: dict[str, Counter] = defaultdict(lambda: Counter(bytes=0, count=0, seconds=0.0))
    events: Counter = Counter()
    for worker, st in now.items():
        old = was.get(worker, {})
        for act, m in st.get("moves", {}).items():
            b = old.get("moves", {}).get(act, {})
            moves[act].update({k: m[k] - b.get(k, 0) for k in ("bytes", "count", "seconds")})
        events.update({k: n - old.get("events", {}).get(k, 0) for k, n in st.get("events", {}).items()})
    return moves, events


def _metric(worker) -> dict:
    data = worker.data
    if not isinstance(data, FlowgpuStore):
        return {}
    st = data.stats()
    out = {f"{t}_bytes": v["bytes"] for t, v in st["tiers"].items() if "bytes" in v}
    for act, m in st["moves"].items():
        out[f"{act}_bytes"] = m["bytes"]
        out[f"{act}_seconds"] = m["seconds"]
    out.update(st["events"])
    return out


def _syncing(fn, store=None):
    """``fn`` ordered after the uploads enqueued so far (its inputs' and earlier ones: called in the
    event loop as the task is submitted), waiting for its own stream at the end."""
    t = getattr(store, "_transfer", None)
    uploads = t.uploads_so_far() if t is not None and hasattr(t, "uploads_so_far") else ()

    def run(*args, **kwargs):
        if uploads:
            t.order_current_stream(uploads)  # inputs still on their way arrive before the task reads them
        try:
            return fn(*args, **kwargs)
        finally:
            sync_current_stream()

    return run


class MemoryPlugin(WorkerPlugin):
    """Metrics, prefetching (``prefetch``) and per-task stream synchronisation (``sync_streams``)."""

    name = "flowgpu-memory"
    idempotent = True

    def __init__(self, prefetch: bool = True, sync_streams: bool = True):
        self.prefetch = prefetch
        self.sync_streams = sync_streams

    def setup(self, worker) -> None:
        self.worker = worker
        self.store = worker.data if isinstance(worker.data, FlowgpuStore) else None
        worker.metrics["flowgpu-memory"] = _metric
        if self.store is not None and self.store.adopt_worker_limit:
            limit = getattr(worker.memory_manager, "memory_limit", None)
            if limit:
                self.store.set_memory_limit(int(limit * self.store.host_fraction))
        if self.sync_streams and self.store is not None:
            self._wrap_executor(worker)
        self._queue: queue.Queue | None = None
        self._queued: set = set()
        if self.prefetch and self.store is not None:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._run, name="flowgpu-prefetch", daemon=True)
            self._thread.start()

    def _wrap_executor(self, worker) -> None:
        store = self.store
        if import_cupy(strict=False) is None:
            return
        ex = worker.executors.get("default")
        if ex is None or getattr(ex, "_flowgpu_sync", False):
            return
        base = type(ex)
        # keep the class name: distributed runs tasks with thread context only for executors
        # whose type name says ThreadPoolExecutor
        cls = type(base.__name__, (base,), {
            "submit": lambda self, fn, *a, **k: base.submit(self, _syncing(fn, store), *a, **k),
            "_flowgpu_sync": True,
        })
        ex.__class__ = cls

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if self._queue is None or finish != "executing":
            return
        try:
            ready = self.worker.state.ready
            n = self.worker.state.nthreads if len(ready) <= _MAX_READY_SCAN else 1
            for ts in ready.peekn(n):
                for dep in ts.dependencies:
                    if dep.key not in self._queued:
                        self._queued.add(dep.key)
                        self._queue.put(dep.key)
        except Exception:  # never let prefetching disturb the worker
            logger.debug("flowgpu prefetch scan failed", exc_info=True)

    def _run(self) -> None:
        while True:
            key = self._queue.get()
            if key is None:
                return
            try:
                self.store.prefetch(key)
            except Exception:
                logger.debug("flowgpu prefetch of %s failed", key, exc_info=True)
            finally:
                self._queued.discard(key)

    def teardown(self, worker) -> None:
        if self._queue is not None:
            self._queue.put(None)
        worker.metrics.pop("flowgpu-memory", None)
