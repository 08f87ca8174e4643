"""Session on GPUs (LocalCUDACluster): run on an H200 with `pytest -m gpu`."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import flowgpu as fg
from flowgpu import backend
from flowgpu.errors import MemoryLimitError

pytestmark = pytest.mark.gpu


def _chunk_kinds(block):
    return np.array([[backend.is_cupy(block)]])


def test_gpu_session_has_cupy_chunks_on_workers(gpu_session):
    s = gpu_session
    assert s.backend == "gpu" and s.array_backend == "cupy"
    assert s.n_workers == backend.gpu_count()
    x = fg.random((4000, 3000), dtype="float32", seed=5, chunks=(1000, 1000))
    kinds = x.map_blocks(_chunk_kinds, dtype=bool, chunks=((1,) * 4, (1,) * 3), meta=np.empty((0, 0), bool))
    assert bool(kinds.all().compute())
    # the workers' own config says cupy too
    assert set(s.client.run(lambda: dask.config.get("array.backend")).values()) == {"cupy"}


def test_gpu_and_cpu_give_the_same_numbers(gpu_session, rng):
    seed = int(rng.integers(0, 2**62))
    x = fg.random((3000, 3000), dtype="float32", seed=seed, chunks=(1000, 1500))
    on_gpu = fg.to_numpy(x)
    gpu_sum = float((x + x.T).sum().compute())
    with dask.config.set({"array.backend": "numpy", "scheduler": "threads"}):
        y = fg.random((3000, 3000), dtype="float32", seed=seed, chunks=(1000, 1500))
        on_cpu = y.compute()
    np.testing.assert_array_equal(on_gpu, on_cpu)
    ref = float((on_cpu.astype(np.float64) + on_cpu.T.astype(np.float64)).sum())
    assert abs(gpu_sum - ref) / abs(ref) < 1e-6


def test_issue_example_transpose_sum(gpu_session):
    x = fg.random((40_000, 40_000), dtype="float32", seed=0, chunks="auto")
    got = float((x + x.T).sum().compute())
    # E[x] = 0.5, so the sum of x + x.T over 1.6e9 elements is close to 1.6e9
    assert abs(got / 1.6e9 - 1) < 1e-3
    assert gpu_session.dashboard_link is None


def test_rmm_pool_session():
    with fg.Session(backend="gpu", gpus=[0], rmm_pool_size="2GiB", dashboard_address=None) as s:
        def allocator_info():
            import cupy
            import rmm

            return type(rmm.mr.get_current_device_resource()).__name__, cupy.cuda.get_allocator().__qualname__

        infos = list(s.client.run(allocator_info).values())
        assert all("Pool" in mr for mr, _ in infos), infos
        assert all("rmm" in alloc.lower() for _, alloc in infos), infos
        x = fg.random((2000, 2000), dtype="float64", seed=1, chunks=1000)
        assert 0.49 < float(x.mean().compute()) < 0.51


def test_gpus_subset_starts_one_worker_per_gpu():
    last = backend.gpu_count() - 1
    with fg.Session(gpus=[last], dashboard_address=None) as s:
        assert s.n_workers == 1
        cvd = list(s.client.run(lambda: __import__("os").environ.get("CUDA_VISIBLE_DEVICES")).values())
        assert cvd[0].split(",")[0] == backend.physical_devices()[last]


@pytest.mark.skipif(backend.gpu_count() < 2, reason="needs two GPUs")
def test_two_gpus_two_workers():
    with fg.Session(dashboard_address=None) as s:
        assert s.n_workers == 2
        devices = sorted(v.split(",")[0] for v in s.client.run(
            lambda: __import__("os").environ.get("CUDA_VISIBLE_DEVICES")).values())
        assert devices == sorted(backend.physical_devices()[:2])


def test_cpu_backend_on_a_gpu_machine(rng):
    data = rng.random((500, 400))
    with fg.Session(backend="cpu", n_workers=1, dashboard_address=None) as s:
        assert s.array_backend == "numpy"
        x = fg.from_array(data, chunks=200)
        assert not backend.is_cupy(x._meta)
        np.testing.assert_allclose(float(x.sum().compute()), data.sum())


def test_device_limit_larger_than_device_is_refused():
    with pytest.raises(MemoryLimitError, match="larger than the GPU"):
        fg.Session(backend="gpu", device_memory_limit="100TB")


def test_to_device_and_back(gpu_session, rng):
    data = rng.standard_normal((1000, 600)).astype("float32")
    x = fg.from_array(data, chunks=300)
    assert backend.is_cupy(x._meta)
    h = fg.to_host(x)
    assert not backend.is_cupy(h._meta)
    np.testing.assert_array_equal(h.compute(), data)
    np.testing.assert_allclose(fg.to_numpy(fg.to_device(h) * 2), data * 2)
