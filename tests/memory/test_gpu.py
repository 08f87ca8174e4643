"""The CUDA paths of the worker store: run on an H200 with `pytest -m gpu tests/memory`."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.backend import import_cupy
from flowgpu.fusion.graph import array_optimize
from flowgpu.memory.events import CopyEnqueued, PinnedAllocated
from flowgpu.memory.store import FlowgpuStore

pytestmark = pytest.mark.gpu


def test_store_evicts_device_chunks_to_pinned_host_and_back(tmp_path, rng):
    cp = import_cupy()
    chunks = {i: cp.asarray(rng.standard_normal((4096, 4096), dtype=np.float32)) for i in range(8)}  # 64 MiB each
    nb = chunks[0].nbytes
    store = FlowgpuStore(str(tmp_path), device_memory_limit=3 * nb, memory_limit=3 * nb)
    want = {i: cp.asnumpy(v) for i, v in chunks.items()}
    for i, v in chunks.items():
        store[i] = v
    del chunks, v
    st = store.stats()
    assert st["tiers"]["device"]["keys"] == 3 and st["tiers"]["host"]["keys"] == 3 and st["tiers"]["disk"]["keys"] == 2
    for i in reversed(range(8)):
        got = store[i]
        assert isinstance(got, cp.ndarray)
        assert cp.asnumpy(got).tobytes() == want[i].tobytes()
    st = store.stats()
    assert st["pinned_pool"]["pageable_fallbacks"] == 0
    assert st["moves"]["device_to_host"]["bytes"] >= 5 * nb
    assert st["moves"]["host_to_device"]["gbps"] > 5  # pinned copies; pageable would be ~6 GB/s at best
    store.check()
    store.close()


def test_store_events_time_each_copy_on_the_device(tmp_path, rng):
    """What benchmarks.probes.out_of_core subscribes to: each copy enqueued, with CUDA events."""
    cp = import_cupy()
    chunks = {i: cp.asarray(rng.standard_normal((2048, 2048), dtype=np.float32)) for i in range(4)}  # 16 MiB each
    nb = chunks[0].nbytes
    store = FlowgpuStore(str(tmp_path), device_memory_limit=2 * nb)
    enqueued, allocs = [], []
    store.subscribe(enqueued.append, CopyEnqueued)
    store.subscribe(allocs.append, PinnedAllocated)
    want = {i: cp.asnumpy(v) for i, v in chunks.items()}
    for i, v in chunks.items():
        store[i] = v
    del chunks, v
    for i in range(4):
        assert cp.asnumpy(store[i]).tobytes() == want[i].tobytes()
    store.check()
    downs = [e for e in enqueued if e.activity == "device_to_host"]
    ups = [e for e in enqueued if e.activity == "host_to_device"]
    assert len(downs) >= 2 and len(ups) >= 2 and allocs and all(a.end >= a.start for a in allocs)
    for e in downs + ups:
        e.copy.wait()
        assert e.nbytes == nb and e.copy.seconds > 0
    store.close()


def test_local_cuda_cluster_under_a_small_device_limit(rng):
    seed = int(rng.integers(2**62))
    expr = lambda a: ((a * 2 + 1) ** 2 - a).sum()  # noqa: E731
    shape, chunks = (32768, 32768), (4096, 8192)  # 4 GiB of float32 in 128 MiB chunks
    with fg.Session(backend="gpu", gpus=[0], device_memory_limit="1GiB", threads_per_worker=2,
                    dashboard_address=None) as s:
        x = fg.random(shape, dtype="float32", seed=seed, chunks=chunks).persist()
        got = float(expr(x).compute())
        got_t = float((x + x.T).sum().compute())
        per_worker = s.client.run(fg.memory.stats)
        env = s.client.run(lambda: __import__("os").environ.get("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"))
    # the same graph, fused as the Session fuses it (a fused chain rounds as one kernel: FMAs, its
    # own reduction order), computed with everything held on the device
    with dask.config.set({"array.backend": "cupy", "scheduler": "threads", "array_optimize": array_optimize}):
        y = fg.random(shape, dtype="float32", seed=seed, chunks=chunks)
        want, want_t = float(expr(y).compute()), float((y + y.T).sum().compute())
    assert got == want and got_t == want_t  # bit-identical to the same computation held on the device
    (st,) = per_worker.values()
    assert st["store"] == "flowgpu" and st["tiers"]["device"]["limit"] == 1 << 30
    assert st["moves"]["device_to_host"]["bytes"] >= 3 << 30
    assert st["moves"]["host_to_device"]["count"] > 0
    assert st["pinned_pool"]["pageable_fallbacks"] == 0 and not st["errors"]
    assert set(env.values()) == {"1"}
