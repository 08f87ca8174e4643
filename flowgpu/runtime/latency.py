"""Send the cluster's control messages sooner: flowgpu's graphs have few, large tasks.

distributed batches its control messages: a client writes to the scheduler at most every 10 ms, the
scheduler to each worker every 5 ms, a worker to the scheduler every 2 ms. That suits graphs of
millions of tiny tasks. On a GPU worker a chunk task takes about a millisecond, so the batching
*is* the latency: measured on an H200 (BENCHMARKS.md), a ``compute()`` that follows another one
waited ~10 ms before its first task started, longer than the whole 8 GiB fused pass on the GPU.

:func:`tune` shortens those intervals to ``flowgpu.batch-interval`` (1 ms by default): on the
client always, and on the scheduler and workers of a local cluster the session started (a joined
cluster is not ours to retune). Messages are still batched, only over a shorter window.
"""

from __future__ import annotations

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

__all__ = ["tune", "BatchInterval", "WorkerBatchInterval"]


class BatchInterval(SchedulerPlugin):
    """Shorter batching on the scheduler, for the streams to workers (also those that join later)."""

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
    """Shorter batching of a worker's messages to the scheduler (task finished, data added...)."""

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
