"""flowgpu.batch-interval: the session's client, scheduler and workers batch control messages briefly."""

import dask
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.errors import ConfigError


def _intervals(s):
    sched = s.client.run_on_scheduler(
        lambda dask_scheduler: [c.interval for c in dask_scheduler.stream_comms.values()])
    workers = s.client.run(lambda dask_worker: dask_worker.batched_stream.interval)
    return s.client.scheduler_comm.interval, sched, list(workers.values())


def test_local_session_shortens_every_batching_interval(cpu_session, rng):
    client, sched, workers = _intervals(cpu_session)
    assert client <= 0.001
    assert len(sched) == 2 and all(i <= 0.001 for i in sched)
    assert len(workers) == 2 and all(i <= 0.001 for i in workers)
    data = rng.random((300, 200))
    x = fg.from_array(data, chunks=(50, 200))
    for _ in range(3):  # back-to-back computes: nothing waits on a batch that never comes
        assert np.isclose(float((x * 2).sum().compute()), 2 * data.sum())


def test_null_keeps_distributed_batching():
    with dask.config.set({"flowgpu.batch-interval": None}):
        with fg.Session(backend="cpu", n_workers=1, threads_per_worker=1, memory_limit="1GiB",
                        dashboard_address=None) as s:
            client, sched, workers = _intervals(s)
    # distributed's own (10, 5 and 2 ms in 2026.7), not shortened to flowgpu's 1 ms
    assert client > 0.001 and len(sched) == 1 and sched[0] > 0.001 and workers[0] > 0.001


@pytest.mark.parametrize("bad", ["soon", -1, "5s", True])
def test_bad_interval_fails_before_any_cluster_starts(bad):
    with dask.config.set({"flowgpu.batch-interval": bad}):
        with pytest.raises(ConfigError, match="flowgpu.batch-interval"):
            fg.Session(backend="cpu", dashboard_address=None)
