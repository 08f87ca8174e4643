"""Two workers (real processes): chunks are made and read on both, computed where they are, and a
reduction moves its small partials between workers, never the chunks.

Where a chunk is comes from the scheduler (``who_has``); what moved between workers from each
worker's ``transfer_incoming_log`` (every key fetched from a peer, with its size). How many chunks
each worker makes is the scheduler's queue's to decide (a worker that frees a thread takes the next
task), so the tests ask only that both make some, and that reads depend on nothing that would tie
them to one worker.
"""

from __future__ import annotations

import collections

import dask
import numpy as np
import pytest
import zarr
from distributed import wait

import flowgpu as fg
from flowgpu import backend
from flowgpu.io.npy import from_npy
from flowgpu.io.zarr import from_zarr

pytestmark = pytest.mark.timeout(300)

SHAPE, CHUNKS = (4096, 512), (256, 512)  # 16 chunks of 1 MiB
N_CHUNKS = (SHAPE[0] // CHUNKS[0]) * (SHAPE[1] // CHUNKS[1])
CHUNK_BYTES = CHUNKS[0] * CHUNKS[1] * 8
TREE_INPUTS = N_CHUNKS + N_CHUNKS // 4  # dask's sum combines 4 at a time: 16 -> 4 -> 1


@pytest.fixture(scope="module")
def two_workers():
    # without work stealing: on a loaded machine the scheduler may move a task (and fetch its chunk) to the
    # idler worker, which says nothing about where the graph puts the work (the fast tier met it once in -n 2)
    with dask.config.set({"distributed.scheduler.work-stealing": False}), \
            fg.Session(backend="cpu", n_workers=2, threads_per_worker=2, memory_limit="1GiB",
                       dashboard_address=None) as s:
        yield s


def _clear_transfers(dask_worker=None) -> None:
    dask_worker.transfer_incoming_log.clear()


def _fetched(dask_worker=None) -> list[tuple[str, int]]:
    return [(str(key), int(nbytes)) for e in dask_worker.transfer_incoming_log for key, nbytes in e["keys"].items()]


def _sources(tmp_path, rng) -> dict:
    a = rng.random(SHAPE)
    path, store = str(tmp_path / "a.npy"), str(tmp_path / "a.zarr")
    np.save(path, a)
    z = zarr.create_array(store, shape=SHAPE, chunks=CHUNKS, dtype=a.dtype)
    z[...] = a
    seed = int(rng.integers(1 << 30))
    with dask.config.set({"array.backend": "numpy"}):  # the same random numbers, made here
        want_random = np.asarray(fg.random(SHAPE, seed=seed, chunks=CHUNKS).compute(scheduler="threads"))
    return {"random": (lambda: fg.random(SHAPE, seed=seed, chunks=CHUNKS), want_random),
            "npy": (lambda: from_npy(path, chunks=CHUNKS), a),
            "zarr": (lambda: from_zarr(store), a)}


def _moved(client) -> list[tuple[str, int]]:
    return [item for items in client.run(_fetched).values() for item in items]


def _only_partials(moved: list[tuple[str, int]]) -> None:
    big = [(k, n) for k, n in moved if n > CHUNK_BYTES // 100]
    assert big == [], f"chunks moved between workers: {big}"
    # nothing but the reduction's partials (and npy's reader task: a path, shared by its reads)
    assert all(k.startswith(("('sum-", "sum-", "original-from-npy-")) for k, _ in moved), moved
    assert len(moved) <= TREE_INPUTS, moved  # at most once per input of the combine tree


@pytest.mark.parametrize("source", ["zarr"])  # npy's reads share their reader task (flowgpu/io/npy.py says why)
def test_reads_depend_on_nothing(tmp_path, rng, source):
    """Each read task holds its reader (a path): no shared task draws the reads to one worker."""
    x = _sources(tmp_path, rng)[source][0]()
    assert x.dask.dependencies == {x.name: set()}
    assert len(x.__dask_graph__()) == N_CHUNKS


@pytest.mark.parametrize("source", ["random", "npy", "zarr"])
def test_chunks_made_on_both_workers_are_reduced_where_they_are(two_workers, tmp_path, rng, source):
    make, want = _sources(tmp_path, rng)[source]
    client = two_workers.client
    y = client.persist((make() * 2.0 + 1.0) ** 2)
    wait(y)
    held = collections.Counter(w for ws in client.who_has(y).values() for w in ws)
    assert sum(held.values()) == N_CHUNKS and len(held) == 2, held  # each chunk once, and on both workers
    client.run(_clear_transfers)
    got = float(y.sum().compute())
    assert np.isclose(got, float(((want * 2.0 + 1.0) ** 2).sum()), rtol=1e-12)
    _only_partials(_moved(client))
    np.testing.assert_allclose(y.compute(), (want * 2.0 + 1.0) ** 2, rtol=1e-12)


@pytest.mark.parametrize("source", ["random", "npy", "zarr"])
def test_chain_and_sum_moves_partials_not_chunks(two_workers, tmp_path, rng, source):
    make, want = _sources(tmp_path, rng)[source]
    client = two_workers.client
    client.run(_clear_transfers)
    got = float(((make() * 2.0 + 1.0) ** 2).sum().compute())
    assert np.isclose(got, float(((want * 2.0 + 1.0) ** 2).sum()), rtol=1e-12)
    moved = _moved(client)
    _only_partials(moved)
    print(f"{source}: {len(moved)} partials moved between 2 workers for {N_CHUNKS} chunks")


# -- on two GPUs (the lead runs these on nvidia-h200-x2; skipped with fewer) --------------------------
def _two_gpus() -> bool:
    return backend.gpu_count() >= 2


@pytest.mark.gpu
@pytest.mark.skipif(not _two_gpus(), reason="needs two GPUs")
@pytest.mark.parametrize("protocol", ["tcp", "ucx"])
def test_two_gpus_share_the_chunks_and_give_one_gpus_result(rng, protocol):
    if protocol == "ucx":
        pytest.importorskip("distributed_ucxx", reason="needs distributed-ucxx (pip install distributed-ucxx-cu13)")
    seed, shape, chunks = int(rng.integers(1 << 30)), (8192, 4096), (512, 4096)  # 16 chunks of 8 MiB
    n, chunk_bytes = 16, 512 * 4096 * 4

    def run(gpus):
        with fg.Session(gpus=gpus, protocol=protocol, dashboard_address=None) as s:
            y = s.client.persist((fg.random(shape, dtype="float32", seed=seed, chunks=chunks) * 2 + 1) ** 2)
            wait(y)
            held = collections.Counter(w for ws in s.client.who_has(y).values() for w in ws)
            s.client.run(_clear_transfers)
            total = float(y.sum(dtype="float64").compute())
            return total, held, _moved(s.client)

    one, _, _ = run([0])
    two, held, moved = run([0, 1])
    assert two == one  # bit-identical: the same chunks, the same combine tree, wherever they ran
    with dask.config.set({"array.backend": "numpy"}):
        want = float(((fg.random(shape, dtype="float32", seed=seed, chunks=chunks) * 2 + 1) ** 2)
                     .sum(dtype="float64").compute(scheduler="threads"))
    assert np.isclose(two, want, rtol=1e-6)
    assert sum(held.values()) == n and len(held) == 2, held
    assert all(nbytes < chunk_bytes // 100 for _, nbytes in moved), moved  # partials moved, never chunks
    assert len(moved) <= n + n // 4, moved
