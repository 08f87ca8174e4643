"""How a session turns the store on: config, cluster kwargs, limits checked before a run."""

from __future__ import annotations

import dask.config
import psutil
import pytest

from flowgpu.errors import ConfigError, MemoryLimitError
from flowgpu.memory import resolved_limits, stats, summary, worker_data_kwargs, worker_environ
from flowgpu.memory.store import FlowgpuStore
from flowgpu.runtime.options import SessionOptions, resolve


def _cpu(**kw):
    return SessionOptions(backend="cpu", **kw)


def test_cpu_session_gets_a_flowgpu_store_with_a_host_budget():
    kw = worker_data_kwargs(_cpu(memory_limit=1_000_000_000))
    cls, args = kw["data"]
    assert cls is FlowgpuStore
    assert args["memory_limit"] == 600_000_000 and args["device_memory_limit"] is None
    assert worker_environ(_cpu()) == {}


def test_auto_memory_limit_is_adopted_from_the_worker():
    assert resolved_limits(_cpu(memory_limit="auto"))["host"] == "auto"
    assert resolved_limits(_cpu(memory_limit=0.5))["host"] == int(psutil.virtual_memory().total * 0.5 * 0.6)
    with dask.config.set({"flowgpu.spill.host-fraction": 0.5}):
        assert resolved_limits(_cpu(memory_limit=1000))["host"] == 500


@pytest.mark.parametrize("store,streams,want", [("flowgpu", True, "1"), ("flowgpu", False, "0"),
                                                 ("dask", True, "0"), ("dask-cuda", True, "0")])
def test_gpu_workers_get_per_thread_streams_only_with_flowgpus_store(monkeypatch, store, streams, want):
    """Said either way: a 1 left in the environment by an earlier Session must not reach workers
    whose store orders nothing across streams."""
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    with dask.config.set({"flowgpu.spill.store": store, "flowgpu.spill.per-thread-streams": streams}):
        assert worker_environ(SessionOptions(backend="gpu")) == {"CUPY_CUDA_PER_THREAD_DEFAULT_STREAM": want}


def test_store_dask_keeps_the_clusters_own():
    for name in ("dask", "dask-cuda"):
        with dask.config.set({"flowgpu.spill.store": name}):
            assert worker_data_kwargs(_cpu(memory_limit=10**9)) == {}


def test_bad_spill_config_is_a_clear_error():
    """Refused when a Session resolves its options, before any cluster starts."""
    with dask.config.set({"flowgpu.spill.store": "zict"}):
        with pytest.raises(ConfigError, match="flowgpu.spill.store 'zict'.*flowgpu, dask-cuda, dask"):
            resolve(backend="cpu")
    with dask.config.set({"flowgpu.spill.host-fraction": 1.5}):
        with pytest.raises(ConfigError, match="host-fraction"):
            resolve(backend="cpu")
    with dask.config.set({"flowgpu.spill.pinned-pool-size": "100PiB"}):
        with pytest.raises(MemoryLimitError, match="larger than this machine"):
            worker_data_kwargs(_cpu())


def test_stats_of_other_stores_and_summary(tmp_path, rng):
    class W:
        data = {}

    assert stats(W()) == {"store": "dict"}
    store = FlowgpuStore(str(tmp_path), memory_limit=1)
    W.data = store
    store["a"] = rng.standard_normal(100)
    st = stats(W())
    assert st["moves"]["host_to_disk"]["bytes"] == 800
    total = summary({"w1": st, "w2": st, "w3": {"store": "dict"}})
    assert total["moves"]["host_to_disk"]["bytes"] == 1600 and total["stores"] == ["dict", "flowgpu"]
