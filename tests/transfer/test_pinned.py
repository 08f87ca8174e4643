"""The pinned pool's bookkeeping, with a stand-in allocator: spares allocated ahead, waits, failures."""

from __future__ import annotations

import threading
import time

import pytest

from flowgpu.transfer.pinned import PinnedPool, shared_executor, size_class
from tests.transfer.fakes import fake_pinned

MiB = 1 << 20


def _until(cond, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_keep_spare_allocates_ahead_within_capacity():
    pool = PinnedPool(capacity=3 * size_class(5 * MiB), allocator=fake_pinned)
    a = pool.take(5 * MiB)
    pool.keep_spare(5 * MiB, 4)  # only two more fit under the capacity
    _until(lambda: pool.stats()["cached"] == 2 * a.size)
    time.sleep(0.05)
    st = pool.stats()
    assert st["allocated"] == 3 * a.size and st["background_allocations"] == 2
    b, c = pool.take(5 * MiB), pool.take(5 * MiB)
    assert pool.stats()["reuses"] == 2 and len({a.ptr, b.ptr, c.ptr}) == 3
    # full: a fourth request falls back to pageable memory, with a warning, and loses nothing
    with pytest.warns(RuntimeWarning, match="pinned pool is full"):
        d = pool.take(5 * MiB)
    assert not d.pinned
    for buf in (a, b, c, d):
        pool.give(buf)
    assert pool.trim() == 3 * a.size and pool.stats()["allocated"] == 0
    time.sleep(0.05)
    assert pool.stats()["allocated"] == 0  # trim() also stops keeping spares


def test_take_waits_for_the_spare_being_allocated():
    gate = threading.Event()
    calls = []

    def slow(size):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            gate.wait(60)
        return fake_pinned(size)

    pool = PinnedPool(allocator=slow)
    pool.keep_spare(2 * MiB, 1)
    _until(lambda: calls)  # the background thread is inside the allocator
    got = []
    taker = threading.Thread(target=lambda: got.append(pool.take(2 * MiB)))
    taker.start()
    time.sleep(0.1)
    assert not got  # waiting for the spare, not allocating a second buffer
    gate.set()
    taker.join(10)
    assert got and got[0].pinned
    assert calls[0] == "flowgpu-pinned-spares" and threading.current_thread().name not in calls
    _until(lambda: pool.stats()["cached"] == got[0].size)  # and a new spare follows


def test_a_failing_background_allocation_stops_spares_and_take_still_serves():
    calls = []

    def fails_once(size):
        calls.append(size)
        if len(calls) == 1:
            raise MemoryError("cudaErrorMemoryAllocation (fake)")
        return fake_pinned(size)

    pool = PinnedPool(allocator=fails_once)
    pool.keep_spare(3 * MiB, 2)
    _until(lambda: pool.stats()["alloc_failures"] == 1)
    buf = pool.take(3 * MiB)  # allocated in this thread, as without spares
    assert buf.pinned and pool.stats()["background_allocations"] == 0 and len(calls) == 2
    pool.give(buf)


def test_shared_executor_is_one_bounded_pool_per_name():
    import os

    a, b = shared_executor("flowgpu-test-pool", 64), shared_executor("flowgpu-test-pool", 2)
    assert a is b and a._max_workers == min(64, os.cpu_count() or 1)
    assert shared_executor("flowgpu-test-other", 1) is not a
    names = set(a.map(lambda _: threading.current_thread().name, range(8)))
    assert all(n.startswith("flowgpu-test-pool") for n in names)


def test_trim_waits_for_a_spare_being_allocated_and_frees_it():
    """Freeing the pool (a store's close) while a spare is being allocated in the background
    leaves nothing allocated: trim waits for that allocation, then frees it too."""
    gate = threading.Event()
    started = threading.Event()

    def slow(size):
        started.set()
        gate.wait(60)
        return fake_pinned(size)

    pool = PinnedPool(allocator=slow)
    pool.keep_spare(2 * MiB, 1)
    assert started.wait(60)
    freed = []
    trimmer = threading.Thread(target=lambda: freed.append(pool.trim()))
    trimmer.start()
    trimmer.join(0.2)
    assert trimmer.is_alive()  # waiting for the allocation in flight
    gate.set()
    trimmer.join(10)
    assert freed == [size_class(2 * MiB)] and pool.stats()["allocated"] == 0
