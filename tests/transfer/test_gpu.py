"""The CUDA paths of the transfer layer: run on an H200 with `pytest -m gpu tests/transfer`."""

from __future__ import annotations

import time

import numpy as np
import pytest

from flowgpu.backend import import_cupy
from flowgpu.transfer.pinned import PinnedPool, registered_pinned_allocator
from flowgpu.transfer.staging import to_device_staged
from flowgpu.transfer.streams import CupyTransfer

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
