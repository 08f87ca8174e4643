"""chunks="auto": blocks bounded by the target, spread evenly so no task is a small leftover."""

import dask
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.arrays.chunks import check_fits, resolve_chunks, target_chunk_bytes
from flowgpu.errors import ChunkError
from flowgpu.runtime.session import worker_budget

NO_SESSION = {"flowgpu.worker.budget": None, "flowgpu.worker.threads": None}  # as without an open Session


@pytest.mark.parametrize("shape, target", [((40000, 40000), "4GiB"), ((1001, 999), "1MiB"), ((10**7,), "3MiB")])
def test_auto_chunks_are_even_and_within_the_target(shape, target):
    with dask.config.set({"flowgpu.chunks.cpu-target": target, **NO_SESSION}):
        chunks = resolve_chunks("auto", shape, "float32")
    limit = dask.utils.parse_bytes(target)
    assert tuple(sum(c) for c in chunks) == shape
    assert int(np.prod([max(c) for c in chunks])) * 4 <= limit
    for c in chunks:
        assert max(c) - min(c) <= 1  # even: no ragged last block
    if shape == (40000, 40000):
        assert chunks == ((20000, 20000), (20000, 20000))  # not 32768 + 7232


@pytest.mark.parametrize("shape, stored", [((1000, 1000), (64, 64)), ((40000, 300), (1000, 300)), ((977,), (10,))])
def test_auto_chunks_of_stored_data_are_whole_stored_chunks_within_the_target(shape, stored):
    """An HDF5 dataset's own chunks (``previous``): no stored chunk is split between two tasks."""
    with dask.config.set({"flowgpu.chunks.cpu-target": "1MiB", **NO_SESSION}):
        chunks = resolve_chunks("auto", shape, "float64", previous=stored)
    assert tuple(sum(c) for c in chunks) == shape
    one_stored_chunk = int(np.prod(stored)) * 8
    assert int(np.prod([max(c) for c in chunks])) * 8 <= max(1 << 20, one_stored_chunk)  # never splits a stored chunk
    for c, unit in zip(chunks, stored):
        assert all(n % unit == 0 for n in c[:-1]) and 0 < c[-1] <= max(c)
        assert len(c) == 1 or max(c[:-1]) - min(c[:-1]) <= unit  # as even as whole stored chunks allow


def test_explicit_chunks_are_kept_as_given_and_auto_axes_evened(rng):
    with dask.config.set({"flowgpu.chunks.cpu-target": "64KiB", **NO_SESSION}):
        chunks = resolve_chunks(("auto", 300), (5000, 1000), "float64")
        assert chunks[1] == (300, 300, 300, 100)
        assert max(chunks[0]) - min(chunks[0]) <= 1
        data = rng.random((5000, 1000))
        x = fg.from_array(data, chunks=("auto", 300))
    np.testing.assert_array_equal(x.compute(scheduler="sync"), data)


@pytest.mark.parametrize("threads", [1, 3])
def test_auto_chunks_follow_the_published_worker_budget(rng, threads):
    budget = int(rng.integers(64 << 20, 512 << 20))
    facts = {"flowgpu.worker.budget": budget, "flowgpu.worker.threads": threads,
             "flowgpu.chunks.cpu-target": "1GiB", "flowgpu.chunks.headroom": 4}
    with dask.config.set(facts):
        target = target_chunk_bytes()
        chunks = resolve_chunks("auto", (30_000, 20_000), "float64")
    assert target == budget // (4 * threads)
    assert max(chunks[0]) * max(chunks[1]) * 8 <= target
    with dask.config.set({"flowgpu.chunks.cpu-target": "1GiB", **NO_SESSION}):
        assert target_chunk_bytes() == 1 << 30  # without a session only the target applies


def test_chunks_larger_than_the_worker_budget_are_refused():
    chunks = ((4000,), (4000,))  # one block of 128 MB in float64
    with dask.config.set(NO_SESSION):
        check_fits(chunks, "float64")
    with dask.config.set({"flowgpu.worker.budget": 100_000_000}):
        with pytest.raises(ChunkError, match="128,000,000 bytes but a worker can hold 100,000,000 bytes"):
            check_fits(chunks, "float64")
        with pytest.raises(ChunkError, match="largest chunk"):
            resolve_chunks((4000, 4000), (8000, 8000), "float64")


def test_a_cpu_workers_budget_is_its_limit_up_to_the_pause_less_its_process():
    """What a CPU session publishes as ``flowgpu.worker.budget`` (and so what sizes chunks="auto")."""
    workers = {"a": {"memory_limit": 1000 << 20, "rss": 100 << 20}, "b": {"memory_limit": 2000 << 20, "rss": 90 << 20}}
    with dask.config.set({"distributed.worker.memory.pause": 0.8, "distributed.worker.memory.terminate": 0.95}):
        assert worker_budget(workers, "cpu") == int((1000 << 20) * 0.8) - (100 << 20)  # the smallest worker's
    with dask.config.set({"distributed.worker.memory.pause": False, "distributed.worker.memory.terminate": False}):
        assert worker_budget(workers, "cpu") == (900 << 20)
    assert worker_budget({"a": {"memory_limit": 100 << 20, "rss": 200 << 20}}, "cpu") == 0  # never negative
