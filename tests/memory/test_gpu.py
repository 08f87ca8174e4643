"""The CUDA paths of the memory layer: run on an H200 with `pytest -m gpu tests/memory`."""

from __future__ import annotations

import time

import dask
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.backend import import_cupy
from flowgpu.fusion.graph import array_optimize
from flowgpu.memory.events import CopyEnqueued, PinnedAllocated
from flowgpu.memory.pinned import PinnedPool
from flowgpu.memory.staging import to_device_staged
from flowgpu.memory.store import FlowgpuStore
from flowgpu.memory.transfer import CupyTransfer

pytestmark = pytest.mark.gpu


def test_pinned_pool_reuses_buffers():
    pool = PinnedPool(capacity=1 << 30)
    a = pool.take(10 << 20)
    assert a.pinned and a.view.nbytes == a.size >= 10 << 20
    ptr = a.ptr
    pool.give(a)
    b = pool.take(10 << 20)  # same size class: the same buffer again, no cudaHostAlloc
    assert b.ptr == ptr
    st = pool.stats()
    assert st["allocations"] == 1 and st["reuses"] == 1 and st["in_use"] == b.size
    pool.give(b)
    assert pool.trim() == b.size and pool.stats()["allocated"] == 0


@pytest.mark.parametrize("nbytes", [1 << 20, (96 << 20) + 4096], ids=["small", "huge-pages"])
def test_registered_pinned_buffers_are_page_locked_and_copy_both_ways(rng, nbytes):
    from flowgpu.memory.pinned import registered_pinned_allocator

    cp = import_cupy()
    buf = registered_pinned_allocator(nbytes)
    assert buf.pinned and buf.size == nbytes
    assert cp.cuda.runtime.pointerGetAttributes(buf.ptr).type == 1  # cudaMemoryTypeHost: pinned
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    buf.view[:] = data
    d = cp.empty(nbytes, dtype=cp.uint8)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.runtime.memcpyAsync(d.data.ptr, buf.ptr, nbytes, cp.cuda.runtime.memcpyHostToDevice, s.ptr)
    s.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(d), data)
    d += 1
    cp.cuda.get_current_stream().synchronize()  # s does not wait for the default stream by itself
    cp.cuda.runtime.memcpyAsync(buf.ptr, d.data.ptr, nbytes, cp.cuda.runtime.memcpyDeviceToHost, s.ptr)
    s.synchronize()
    np.testing.assert_array_equal(buf.view, data + np.uint8(1))


def test_pool_keeps_pinned_spares_ready():
    pool = PinnedPool(capacity=1 << 30)
    pool.keep_spare(64 << 20, 2)
    deadline = time.monotonic() + 60
    while pool.stats()["cached"] < 2 * (64 << 20):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    a = pool.take(64 << 20)
    assert a.pinned and pool.stats()["reuses"] == 1
    pool.give(a)
    pool.trim()


@pytest.mark.parametrize("layout", ["C", "F", "strided"])
@pytest.mark.parametrize("dtype", ["float32", "int64", "complex64"])
def test_async_copies_round_trip_bit_identical(rng, layout, dtype):
    cp = import_cupy()
    host = (rng.standard_normal((1500, 900)) * 1000).astype(dtype)
    d = cp.asarray(host)
    if layout == "F":
        d = cp.asfortranarray(d)
    elif layout == "strided":
        d = d[::2, 1::3]
    t = CupyTransfer()
    pool = PinnedPool()
    meta = t.meta(d)
    buf = pool.take(meta.nbytes)
    pending = t.to_host_async(d, buf, meta)
    pending.wait()
    back = meta.host_array(buf)
    np.testing.assert_array_equal(back, cp.asnumpy(d))
    assert pending.seconds is not None and pending.seconds >= 0
    again, seconds = t.to_device(back, meta, buf.pinned)
    assert again.shape == d.shape and again.dtype == d.dtype and seconds >= 0
    assert cp.asnumpy(again).tobytes() == cp.asnumpy(d).tobytes()


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


def test_staging_from_memory_mapped_npy(tmp_path, rng):
    cp = import_cupy()
    a = rng.standard_normal((3000, 2500)).astype(np.float32)
    path = tmp_path / "a.npy"
    np.save(path, a)
    m = np.load(path, mmap_mode="r")
    got = to_device_staged(m[100:2900], budget=1 << 20)  # many slices through two buffers
    assert isinstance(got, cp.ndarray) and got.flags.c_contiguous
    assert cp.asnumpy(got).tobytes() == a[100:2900].tobytes()
    f = np.asfortranarray(a[:, :1000])
    assert cp.asnumpy(to_device_staged(f, budget=1 << 20)).tobytes() == np.ascontiguousarray(f).tobytes()
    assert float(to_device_staged(np.float64(2.5))) == 2.5
    full = PinnedPool(capacity=0)  # no pinned memory at all: pageable fallback, same bytes
    with pytest.warns(RuntimeWarning, match="pageable"):
        got = to_device_staged(a, budget=1 << 22, pool=full)
    assert cp.asnumpy(got).tobytes() == a.tobytes()
