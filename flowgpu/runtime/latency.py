"""Batch the cluster's control messages over ``flowgpu.batch-interval`` (1 ms) instead of distributed's
2-10 ms: a GPU chunk task takes about a millisecond, so on an H200 (BENCHMARKS.md) a ``compute()``
waited ~10 ms for its first task, longer than a whole 8 GiB fused pass. Only the client is tuned on
a joined cluster; the scheduler and workers too on one the Session started.
"""

from __future__ import annotations

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

__all__ = ["tune", "BatchInterval", "WorkerBatchInterval"]


class BatchInterval(SchedulerPlugin):
    """Shorter batching of the scheduler's streams to workers (also those that join later)."""

    name = "flowgpu-batch-interval"

    def __init__(self, seconds: float):
        self.seconds = seconds

    async def start(self, scheduler) -> None:
        for comm in (*scheduler.stream_comms.values(), *scheduler.client_comms.values()):
            comm.interval = min(comm.interval, self.seconds)

    def add_worker(self, scheduler=None, worker=None, **kwargs) -> None:
        comm = scheduler.stream_comms.get(worker)
        if comm is not None:
            comm.interval = min(comm.interval, self.seconds)


class WorkerBatchInterval(WorkerPlugin):
    """Shorter batching of a worker's messages to the scheduler."""

    name = "flowgpu-worker-batch-interval"

    def __init__(self, seconds: float):
        self.seconds = seconds

    def setup(self, worker) -> None:
        stream = getattr(worker, "batched_stream", None)
        if stream is not None:
            stream.interval = min(stream.interval, self.seconds)


def tune(client, seconds: float | None, *, cluster: bool) -> None:
    """Batch ``client``'s messages over at most ``seconds`` (and, with ``cluster=True``, its scheduler's
    and workers'); ``None`` changes nothing."""
    if seconds is None:
        return
    comm = getattr(client, "scheduler_comm", None)
    if comm is not None and hasattr(comm, "interval"):
        comm.interval = min(comm.interval, seconds)
    if cluster:
        client.register_plugin(BatchInterval(seconds), name=BatchInterval.name)
        client.register_plugin(WorkerBatchInterval(seconds), name=WorkerBatchInterval.name)
