"""FlowgpuStore's tiers, eviction order, accounting and failure paths, without a GPU."""

from __future__ import annotations

import errno
import os
import threading
import warnings

import numpy as np
import pytest

from flowgpu.memory import disk as disk_mod
from flowgpu.memory.events import PinnedAllocated
from flowgpu.memory.store import FlowgpuStore
from tests.memory.fakes import FakeDeviceArray, FakeTransfer, failing_pinned, fake_pinned


def _chunks(rng, n, shape=(64, 128)):
    return {("x", i): rng.standard_normal(shape).astype(np.float32) for i in range(n)}


def _tier(store, key):
    store.check()  # each key in exactly one tier, every tier's bytes add up
    return store.tier_of(key)


# -- host -> disk (CPU mode) --------------------------------------------------------------------
def test_host_over_limit_goes_to_disk_least_recently_used_first(tmp_path, rng):
    chunks = _chunks(rng, 6)
    nb = next(iter(chunks.values())).nbytes
    store = FlowgpuStore(str(tmp_path), memory_limit=3 * nb)
    for k, v in chunks.items():
        store[k] = v
    assert [_tier(store, k) for k in chunks] == ["disk"] * 3 + ["host"] * 3
    assert store.host.nbytes == 3 * nb
    # touching x0 brings it back and pushes the least recently used host chunk (x3) out
    np.testing.assert_array_equal(store[("x", 0)], chunks[("x", 0)])
    assert _tier(store, ("x", 0)) == "host" and _tier(store, ("x", 3)) == "disk"
    for k, v in chunks.items():
        np.testing.assert_array_equal(store[k], v)
    assert len(store) == 6 and set(store) == set(chunks)
    st = store.stats()
    assert st["moves"]["host_to_disk"]["bytes"] == st["moves"]["host_to_disk"]["count"] * nb
    assert st["moves"]["disk_to_host"]["count"] >= 4
    assert st["tiers"]["host"]["bytes"] <= 3 * nb


def test_spill_files_are_raw_npy_and_are_removed(tmp_path, rng):
    chunks = _chunks(rng, 4)
    nb = chunks[("x", 0)].nbytes
    store = FlowgpuStore(str(tmp_path), memory_limit=nb)
    for k, v in chunks.items():
        store[k] = v
    files = sorted(os.listdir(store.directory))
    assert len(files) == 3 and all(f.endswith(".npy") for f in files)
    # readable by plain NumPy without pickle
    got = [np.load(os.path.join(store.directory, f), allow_pickle=False) for f in files]
    assert sorted(g.tobytes() for g in got) == sorted(chunks[("x", i)].tobytes() for i in range(3))
    for k in list(store):
        del store[k]
    assert os.listdir(store.directory) == [] and len(store) == 0
    with pytest.raises(KeyError):
        store[("x", 0)]


def test_fortran_and_strided_chunks_round_trip_through_disk(tmp_path, rng):
    a = np.asfortranarray(rng.standard_normal((33, 17)))
    b = rng.standard_normal((40, 40))[::3, 1::2]
    store = FlowgpuStore(str(tmp_path), memory_limit=1)
    store["a"], store["b"] = a, b
    assert _tier(store, "a") == "disk" and _tier(store, "b") == "disk"
    np.testing.assert_array_equal(store["a"], a)
    np.testing.assert_array_equal(store["b"], b)


def test_non_array_values_stay_in_memory(tmp_path, rng):
    store = FlowgpuStore(str(tmp_path), memory_limit=1)
    obj = np.array([{"a": 1}, None], dtype=object)
    store["t"] = (1, "two")
    store["o"] = obj
    assert store["t"] == (1, "two") and store["o"] is obj
    assert store.stats()["tiers"]["other"]["keys"] == 2


def test_overwrite_replaces_in_place(tmp_path, rng):
    store = FlowgpuStore(str(tmp_path), memory_limit=10_000)
    a, b = rng.standard_normal(100), rng.standard_normal(200)
    store["k"] = a
    store["k"] = b
    assert len(store) == 1 and store.host.nbytes == b.nbytes
    np.testing.assert_array_equal(store["k"], b)


def test_evict_protocol_for_distributed_memory_monitor(tmp_path, rng):
    store = FlowgpuStore(str(tmp_path))  # no limit: only the monitor evicts
    a = rng.standard_normal(1000)
    store["a"] = a
    assert store.fast and store.evict() == a.nbytes
    assert not store.fast and store.evict() == -1
    assert store.spilled_total == (a.nbytes, os.path.getsize(os.path.join(store.directory, os.listdir(store.directory)[0])))
    np.testing.assert_array_equal(store["a"], a)
    metrics = store.cumulative_metrics
    assert metrics[("host_to_disk", "bytes")] == a.nbytes and metrics[("disk_to_host", "count")] == 1


# -- failures of the disk tier ------------------------------------------------------------------
def test_disk_full_fails_the_write_that_cannot_fit_and_reports_it(tmp_path, rng, monkeypatch):
    """A spill that fails (ENOSPC) disables the disk tier; the next chunk that cannot fit in host memory
    fails at once (the task fails, the run ends with the reason) rather than the worker pausing for ever."""
    def enospc(path, array):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(disk_mod, "_write_file", enospc)
    chunks = _chunks(rng, 5)
    nb = chunks[("x", 0)].nbytes
    store = FlowgpuStore(str(tmp_path), memory_limit=2 * nb)
    items = list(chunks.items())
    for k, v in items[:2]:
        store[k] = v
    with pytest.warns(RuntimeWarning, match="No space left"), \
            pytest.raises(disk_mod.DiskFull, match="host memory is full and could not write to the spill directory"):
        store[items[2][0]] = items[2][1]
    for k, v in items[:2]:  # what was stored before is all there
        np.testing.assert_array_equal(store[k], v)
    st = store.stats()
    assert st["events"]["disk_failures"] == 1
    assert any("No space left" in e for e in st["errors"])
    assert st["tiers"]["disk"]["disabled"] and st["tiers"]["disk"]["keys"] == 0
    assert os.listdir(store.directory) == []  # the partial file is gone
    assert store.evict() == -1


def test_read_only_spill_directory_fails_the_write_that_cannot_fit(tmp_path, rng):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the spill directory should be")
    chunks = _chunks(rng, 4)
    nb = chunks[("x", 0)].nbytes
    store = FlowgpuStore(str(blocker), memory_limit=nb)  # <file>/flowgpu-spill cannot be created
    items = list(chunks.items())
    store[items[0][0]] = items[0][1]
    with pytest.warns(RuntimeWarning, match="could not write to the spill directory"), \
            pytest.raises(disk_mod.DiskFull, match="local-directory"):
        store[items[1][0]] = items[1][1]
    np.testing.assert_array_equal(store[items[0][0]], items[0][1])
    assert store.stats()["events"]["disk_failures"] == 1


# -- the device tier, with a stand-in device -----------------------------------------------------
def _device_store(tmp_path, n_dev, nb, **kw):
    t = kw.pop("transfer", None) or FakeTransfer()
    kw.setdefault("pinned_allocator", fake_pinned)
    kw.setdefault("spare_bytes", 0)  # no buffers allocated ahead: exact allocation counts
    return FlowgpuStore(str(tmp_path), device_memory_limit=n_dev * nb, transfer=t, **kw), t


def test_device_over_limit_goes_to_pinned_host_and_comes_back(tmp_path, rng):
    chunks = _chunks(rng, 5)
    nb = chunks[("x", 0)].nbytes
    store, t = _device_store(tmp_path, 2, nb)
    for k, v in chunks.items():
        store[k] = FakeDeviceArray(v)
    assert [_tier(store, k) for k in chunks] == ["host"] * 3 + ["device"] * 2
    assert all(store.host.peek(k).buf.pinned for k in store.host)
    got = store[("x", 0)]
    assert isinstance(got, FakeDeviceArray)  # back on the device, not a host array
    np.testing.assert_array_equal(got.a, chunks[("x", 0)])
    assert _tier(store, ("x", 0)) == "device" and _tier(store, ("x", 3)) == "host"
    for k, v in chunks.items():
        np.testing.assert_array_equal(store[k].a, v)
    st = store.stats()
    assert st["moves"]["device_to_host"]["bytes"] == st["moves"]["device_to_host"]["count"] * nb
    assert st["moves"]["host_to_device"]["count"] == t.h2d
    # chunks are immutable: one brought back keeps its host copy, and evicting it again copies nothing
    assert st["moves"]["device_to_host"]["count"] == 4  # x0-x2 at first, x3 once x0 came back
    assert st["events"]["clean_device_evictions"] >= 3
    pool = st["pinned_pool"]
    assert pool["allocations"] == 4 and pool["in_use"] == 4 * pool["allocated"] // pool["allocations"]


@pytest.mark.parametrize("uploads", [True, False], ids=["async-uploads", "sync-uploads"])
def test_repeated_passes_copy_each_chunk_to_host_once(tmp_path, rng, uploads):
    """A pass over persisted data under a device limit: the second and third pass move chunks
    host -> device only; the values read stay bit-identical."""
    chunks = _chunks(rng, 6)
    nb = chunks[("x", 0)].nbytes
    store, t = _device_store(tmp_path, 2, nb, transfer=FakeTransfer(uploads=uploads))
    for k, v in chunks.items():
        store[k] = FakeDeviceArray(v)
    first = store.stats()["moves"]["device_to_host"]["count"]
    for _ in range(3):
        for k, v in chunks.items():
            np.testing.assert_array_equal(store[k].a, v)
    st = store.stats()
    assert st["moves"]["device_to_host"]["count"] <= len(chunks) and first == 4
    assert st["moves"]["host_to_device"]["count"] == t.h2d >= 3 * 4
    assert st["tiers"]["device"]["bytes"] <= 2 * nb


def test_host_pressure_drops_clean_copies_before_writing_to_disk(tmp_path, rng):
    chunks = _chunks(rng, 4)
    nb = chunks[("x", 0)].nbytes
    store, _ = _device_store(tmp_path, 2, nb, memory_limit=3 * nb)
    for k in list(chunks)[:3]:
        store[k] = FakeDeviceArray(chunks[k])  # x0 spilled to host
    np.testing.assert_array_equal(store[("x", 0)].a, chunks[("x", 0)])  # back; x1 spilled; x0 clean
    assert store.stats()["tiers"]["host"]["clean_copies"] == 1
    store[("x", 3)] = FakeDeviceArray(chunks[("x", 3)])  # evicts x0 (clean: no copy)
    store[("y", 0)] = FakeDeviceArray(chunks[("x", 0)] + 1)
    store[("y", 1)] = FakeDeviceArray(chunks[("x", 1)] + 1)
    for k, v in chunks.items():
        np.testing.assert_array_equal(store[k].a, v)
    st = store.stats()
    assert st["tiers"]["host"]["bytes"] <= 3 * nb
    assert st["events"].get("clean_copies_dropped", 0) + st["events"].get("clean_device_evictions", 0) >= 1


def test_device_host_disk_chain_is_bit_identical(tmp_path, rng):
    chunks = _chunks(rng, 8)
    chunks[("x", 7)] = np.asfortranarray(chunks[("x", 7)])
    nb = chunks[("x", 0)].nbytes
    store, _ = _device_store(tmp_path, 2, nb, memory_limit=2 * nb)
    for k, v in chunks.items():
        store[k] = FakeDeviceArray(v)
    assert [_tier(store, k) for k in chunks].count("disk") == 4
    for k in reversed(list(chunks)):
        got = store[k]
        assert isinstance(got, FakeDeviceArray)
        assert got.a.tobytes(order="A") == chunks[k].tobytes(order="A")
        assert got.a.flags.f_contiguous == chunks[k].flags.f_contiguous
    st = store.stats()
    assert st["moves"]["disk_to_host"]["count"] == 4
    assert st["pinned_pool"]["pageable_fallbacks"] == 0
    assert st["pinned_pool"]["in_use"] == sum(e.buf.size for e in store.host.values() if e.buf is not None)


def test_reading_a_chunk_whose_copy_is_in_flight_reclaims_it(tmp_path, rng):
    chunks = _chunks(rng, 3)
    nb = chunks[("x", 0)].nbytes
    t = FakeTransfer(hold=True)
    store, _ = _device_store(tmp_path, 1, nb, transfer=t, max_pending_bytes=10 * nb)
    dev = {k: FakeDeviceArray(v) for k, v in chunks.items()}
    for k, v in dev.items():
        store[k] = v
    assert store.copies.down_bytes == 2 * nb
    assert store[("x", 0)] is dev[("x", 0)]  # no copy back: it never left
    assert store.stats()["events"]["reclaimed_in_flight"] == 1
    t.finish_all()
    st = store.stats()
    assert st["tiers"]["device"]["pending_bytes"] == 0
    assert st["pinned_pool"]["in_use"] == st["pinned_pool"]["allocated"] - st["pinned_pool"]["cached"]
    for k, v in chunks.items():
        np.testing.assert_array_equal(store[k].a, v)


def test_pending_copies_are_bounded(tmp_path, rng):
    chunks = _chunks(rng, 6)
    nb = chunks[("x", 0)].nbytes
    t = FakeTransfer(hold=True)
    store, _ = _device_store(tmp_path, 1, nb, transfer=t, max_pending_bytes=2 * nb)
    for k, v in chunks.items():
        store[k] = FakeDeviceArray(v)
    assert store.copies.down_bytes <= 2 * nb


def test_pinned_pool_exhausted_falls_back_to_pageable(tmp_path, rng):
    chunks = _chunks(rng, 4)
    nb = chunks[("x", 0)].nbytes
    store, _ = _device_store(tmp_path, 1, nb, pinned_allocator=failing_pinned)
    with pytest.warns(RuntimeWarning, match="pageable"):
        for k, v in chunks.items():
            store[k] = FakeDeviceArray(v)
    assert not any(e.buf.pinned for e in store.host.values())
    for k, v in chunks.items():
        np.testing.assert_array_equal(store[k].a, v)
    st = store.stats()
    assert st["events"]["pageable_fallbacks"] >= 3 and st["pinned_pool"]["alloc_failures"] == 1


def test_pinned_pool_capacity_is_respected(tmp_path, rng):
    chunks = _chunks(rng, 5)
    nb = chunks[("x", 0)].nbytes
    store, _ = _device_store(tmp_path, 1, nb, pinned_pool_size=2 * nb + 100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for k, v in chunks.items():
            store[k] = FakeDeviceArray(v)
    pool = store.stats()["pinned_pool"]
    assert pool["allocated"] <= 2 * nb + 100 and pool["pageable_fallbacks"] >= 1
    for k, v in chunks.items():
        np.testing.assert_array_equal(store[k].a, v)


def test_prefetch_only_into_free_room(tmp_path, rng):
    chunks = _chunks(rng, 4)
    nb = chunks[("x", 0)].nbytes
    store, _ = _device_store(tmp_path, 2, nb)
    for k, v in chunks.items():
        store[k] = FakeDeviceArray(v)
    assert not store.prefetch(("x", 0))  # device full: would evict what is about to run
    del store[("x", 3)]
    assert store.prefetch(("x", 0)) and _tier(store, ("x", 0)) == "device"
    assert not store.prefetch(("x", 0))  # already there
    assert store.stats()["prefetched"] == 1
    np.testing.assert_array_equal(store[("x", 0)].a, chunks[("x", 0)])


def test_delete_while_loading_discards_the_load(tmp_path, rng):
    a = rng.standard_normal(1000)
    store, t = _device_store(tmp_path, 1, a.nbytes)
    store["a"] = FakeDeviceArray(a)
    store["b"] = FakeDeviceArray(a + 1)
    original = t.to_device

    def to_device_then_delete(host, meta, pinned):
        del store["a"]  # the event loop drops the key while the prefetcher copies it
        return original(host, meta, pinned)

    t.to_device = to_device_then_delete
    store._fetch("a", prefetch=True)
    assert "a" not in store and len(store) == 1 and store.device.nbytes == a.nbytes
    store.check()


def test_a_key_deleted_while_its_upload_is_in_flight_keeps_its_buffer_until_the_upload_ends(tmp_path, rng):
    a = rng.standard_normal(1000)
    store, t = _device_store(tmp_path, 1, a.nbytes, transfer=FakeTransfer(hold_uploads=True))
    store["a"] = FakeDeviceArray(a)
    store["b"] = FakeDeviceArray(a + 1)  # a spilled to a pinned buffer
    upload = t.to_device_async

    def upload_then_delete(host, meta, pinned):
        out = upload(host, meta, pinned)
        del store["a"]  # the event loop drops the key while the prefetcher's upload still reads the buffer
        return out

    t.to_device_async = upload_then_delete
    store._fetch("a", prefetch=True)
    assert "a" not in store and len(store) == 1
    assert store.pool.stats()["in_use"] > 0 and store.host.orphans  # not handed out for reuse yet
    t.finish_all()
    assert store.stats()["pinned_pool"]["in_use"] == 0 and not store.host.orphans
    store.check()


def test_chunks_read_back_unchanged_are_evicted_again_without_a_write(tmp_path, rng):
    chunks = _chunks(rng, 4)
    nb = chunks[("x", 0)].nbytes
    store = FlowgpuStore(str(tmp_path), memory_limit=2 * nb)
    for k, v in chunks.items():
        store[k] = v
    for k, v in chunks.items():
        np.testing.assert_array_equal(store[k], v)
    assert store.stats()["moves"]["host_to_disk"]["count"] == 4  # each chunk written once
    for _ in range(2):
        for k, v in chunks.items():
            np.testing.assert_array_equal(store[k], v)
    st = store.stats()
    assert st["moves"]["host_to_disk"]["count"] == 4  # and never again
    assert st["events"]["clean_evictions"] >= 4
    store[("x", 0)] = chunks[("x", 1)]  # a new value must not resurrect the old file
    del store[("x", 2)], store[("x", 3)]
    store["y"], store["z"] = chunks[("x", 2)], chunks[("x", 3)]
    np.testing.assert_array_equal(store[("x", 0)], chunks[("x", 1)])
    for k in list(store):
        del store[k]
    assert os.listdir(store.directory) == []


def test_buffer_of_an_upload_in_flight_is_not_reused_until_it_finishes(tmp_path, rng):
    chunks = _chunks(rng, 3)
    nb = chunks[("x", 0)].nbytes
    store, t = _device_store(tmp_path, 1, nb, transfer=FakeTransfer(hold_uploads=True))
    for k, v in chunks.items():
        store[k] = FakeDeviceArray(v)
    got = store[("x", 0)]  # its upload is 'in flight'
    np.testing.assert_array_equal(got.a, chunks[("x", 0)])
    in_use = store.pool.stats()["in_use"]
    del store[("x", 0)]  # dropped while the copy still reads its pinned buffer
    assert store.pool.stats()["in_use"] == in_use  # not handed back yet
    assert "host_to_device" not in store.stats()["moves"]  # counted once it has finished
    t.finish_all()
    st = store.stats()
    assert store.pool.stats()["in_use"] < in_use
    assert st["moves"]["host_to_device"]["count"] == 1
    for k in list(chunks)[1:]:
        np.testing.assert_array_equal(store[k].a, chunks[k])


def test_memory_monitor_eviction_frees_clean_copies_first(tmp_path, rng):
    chunks = _chunks(rng, 3)
    nb = chunks[("x", 0)].nbytes
    store, t = _device_store(tmp_path, 2, nb)
    for k, v in chunks.items():
        store[k] = FakeDeviceArray(v)  # x0 spilled to host
    store[("x", 0)]  # back on the device; its host copy is kept (clean), x1 spilled
    before = store.stats()["tiers"]
    assert before["host"]["clean_copies"] == 1
    assert store.evict() == nb  # distributed's memory monitor asks for memory: no disk write needed
    after = store.stats()
    assert after["tiers"]["host"]["clean_copies"] == 0 and after["tiers"]["disk"]["keys"] == 0
    assert after["tiers"]["host"]["bytes"] == before["host"]["bytes"] - nb
    assert store.evict() == nb and store.stats()["tiers"]["disk"]["keys"] == 1  # then to disk
    for k, v in chunks.items():
        got = store[k]
        np.testing.assert_array_equal(got.a if isinstance(got, FakeDeviceArray) else got, v)


def test_spills_find_spare_buffers_allocated_ahead(tmp_path, rng):
    """Once chunks spill, the pool keeps a buffer allocated ahead, so the next spill reuses it
    instead of allocating in the thread that stores the chunk."""
    chunks = _chunks(rng, 4)
    nb = chunks[("x", 0)].nbytes
    calls = []

    def recording(size):
        calls.append(threading.current_thread().name)
        return fake_pinned(size)

    store, _ = _device_store(tmp_path, 1, nb, pinned_allocator=recording, spare_bytes=nb)
    spares = threading.Semaphore(0)
    store.subscribe(lambda ev: ev.background and spares.release(), PinnedAllocated)
    for i, (k, v) in enumerate(chunks.items()):
        store[k] = FakeDeviceArray(v)
        if i:  # from the first spill on, each spill has a spare allocated behind it
            assert spares.acquire(timeout=60), "no spare buffer was allocated ahead"
    st = store.stats()["pinned_pool"]
    assert calls[0] == threading.current_thread().name  # the very first spill had nothing ready
    assert calls.count("flowgpu-pinned-spares") == len(calls) - 1 == 3  # every later one was ready
    assert st["reuses"] == 2 and st["in_use"] == 3 * st["allocated"] // 4 and st["cached"] > 0
    for k, v in chunks.items():
        np.testing.assert_array_equal(store[k].a, v)
    store.close()  # waits for a spare still being allocated, then frees it with the rest
    assert store.pool.stats()["allocated"] == 0


@pytest.mark.parametrize("hold", [False, True], ids=["copies-done", "copies-in-flight"])
def test_releasing_everything_after_passes_returns_every_byte(tmp_path, rng, hold):
    """Persist, two passes that bring chunks back and evict them again, then release all: every
    tier's bytes return to zero and every pinned buffer is free for the next graph."""
    chunks = _chunks(rng, 8)
    nb = chunks[("x", 0)].nbytes
    t = FakeTransfer(hold=hold, hold_uploads=hold)
    store, _ = _device_store(tmp_path, 3, nb, transfer=t, memory_limit=4 * nb)
    for k, v in chunks.items():
        store[k] = FakeDeviceArray(v)
    for _ in range(2):
        for k, v in chunks.items():
            np.testing.assert_array_equal(store[k].a, v)
    store["partial"] = np.float64(rng.standard_normal())
    t.finish_all()
    for k in [*chunks, "partial"]:
        del store[k]
    st = store.stats()
    assert len(store) == 0
    assert [st["tiers"][tier]["bytes"] for tier in ("device", "host", "disk")] == [0, 0, 0]
    assert st["tiers"]["device"]["pending_bytes"] == 0 and st["tiers"]["host"]["clean_copies"] == 0
    assert st["pinned_pool"]["in_use"] == 0 and not store.host.orphans and not store.copies.down
    store.check()
