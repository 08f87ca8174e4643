"""The store's events: what a profiler sees, subscribing instead of patching the store."""

from __future__ import annotations

import numpy as np
import pytest

from flowgpu.memory.events import (CleanCopyDropped, CopyEnqueued, Events, FetchEnded, FetchStarted, Moved, Noted,
                                   PinnedAllocated, SpillEnded, SpillStarted)
from flowgpu.memory.store import FlowgpuStore
from tests.memory.fakes import FakeDeviceArray, FakeTransfer, fake_pinned


def _store(tmp_path, nb, n_dev=1, **kw):
    return FlowgpuStore(str(tmp_path), device_memory_limit=n_dev * nb, transfer=FakeTransfer(),
                        pinned_allocator=fake_pinned, spare_bytes=0, **kw)


def test_a_spill_and_its_read_back_as_events(tmp_path, rng):
    a, b = rng.standard_normal((2, 300))
    store = _store(tmp_path, a.nbytes)
    seen = []
    store.subscribe(seen.append)
    store["a"] = FakeDeviceArray(a)
    store["b"] = FakeDeviceArray(b)  # spills a
    np.testing.assert_array_equal(store["a"].a, a)  # back up; b spills
    kinds = [type(e) for e in seen]
    assert kinds[:3] == [SpillStarted, PinnedAllocated, CopyEnqueued]
    assert set(kinds[3:5]) == {SpillEnded, Moved}  # the copy may finish before the spill call returns
    start, end = seen[0], next(e for e in seen if isinstance(e, SpillEnded))
    assert start.key == end.key == "a" and end.nbytes == a.nbytes and end.start <= end.end
    enq, moved = seen[2], next(e for e in seen if isinstance(e, Moved))
    assert (enq.activity, enq.key, enq.nbytes) == ("device_to_host", "a", a.nbytes) and enq.copy is not None
    assert (moved.activity, moved.key, moved.nbytes) == ("device_to_host", "a", a.nbytes)
    fetch = [e for e in seen if isinstance(e, (FetchStarted, FetchEnded))]
    assert [type(e) for e in fetch] == [FetchStarted, FetchEnded]
    assert fetch[0].tier == fetch[1].tier == "host" and not fetch[1].prefetch and fetch[1].start <= fetch[1].end
    ups = [e for e in seen if isinstance(e, CopyEnqueued) and e.activity == "host_to_device"]
    assert [(e.key, e.nbytes) for e in ups] == [("a", a.nbytes)]
    # what the accounting counted is what the events said
    moves = store.stats()["moves"]
    for act in ("device_to_host", "host_to_device"):
        said = [e for e in seen if isinstance(e, Moved) and e.activity == act]
        assert moves[act]["count"] == len(said) and moves[act]["bytes"] == sum(e.nbytes for e in said)


def test_subscribing_to_some_kinds_and_unsubscribing(tmp_path, rng):
    chunks = [rng.standard_normal(200) for _ in range(3)]
    nb = chunks[0].nbytes
    store = _store(tmp_path, nb, n_dev=2)
    drops, notes = [], []
    stop = store.subscribe(drops.append, CleanCopyDropped)
    store.subscribe(notes.append, Noted)
    for i, c in enumerate(chunks):
        store[i] = FakeDeviceArray(c)
    store[0]  # back on the device with a clean host copy
    assert store.stats()["tiers"]["host"]["clean_copies"] == 1
    assert store.evict() == nb  # the memory monitor frees the clean copy first
    assert [(e.key, e.nbytes) for e in drops] == [(0, nb)] and all(isinstance(e, CleanCopyDropped) for e in drops)
    assert "clean_copies_dropped" in [e.name for e in notes]
    stop()
    store[1]
    assert store.evict() == nb and store.stats()["events"]["clean_copies_dropped"] == 2
    assert len(drops) == 1  # unsubscribed
    for i, c in enumerate(chunks):
        got = store[i]
        np.testing.assert_array_equal(got.a if isinstance(got, FakeDeviceArray) else got, c)
    store.check()


def test_a_failing_subscriber_never_breaks_the_store(tmp_path, rng, caplog):
    a = rng.standard_normal(500)
    store = FlowgpuStore(str(tmp_path), memory_limit=1)

    def broken(event):
        raise RuntimeError("profiler bug")

    store.subscribe(broken)
    store["a"] = a  # to disk, events on the way
    np.testing.assert_array_equal(store["a"], a)
    assert store.stats()["moves"]["host_to_disk"]["count"] == 1  # the accounting still counted
    assert "profiler bug" in caplog.text


def test_unknown_kinds_are_refused_and_unobserved_kinds_are_not_built():
    events = Events()
    with pytest.raises(TypeError, match="not store events"):
        events.subscribe(print, dict)
    assert not events.wants(FetchStarted)
    events.emit(FetchStarted)  # would fail to build (fields missing) if anything listened
    got = []
    events.subscribe(got.append, Noted)
    events.emit(Noted, "x", "why")
    assert got == [Noted("x", "why")] and events.wants(Noted) and not events.wants(Moved)
