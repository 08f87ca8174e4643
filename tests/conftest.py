"""Shared fixtures. GPU tests are skipped in this one place when no GPU with CuPy is visible."""

from __future__ import annotations

import os

import dask
import numpy as np
import pytest

from flowgpu import backend


def _gpu_ready() -> bool:
    return backend.has_gpu() and backend.import_cupy(strict=False) is not None


GPU = _gpu_ready()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def own_cluster_folder(tmp_path_factory):
    """No test may join (or stop) a developer's real cluster that stays up (`flowgpu cluster start`): a
    run with no session joins the one in flowgpu.cluster.directory when it runs. Point that folder at
    one of this test session's own (0700), here and, through the environment, in every `python -m
    flowgpu` a test starts."""
    folder = str(tmp_path_factory.mktemp("cluster"))
    os.environ["DASK_FLOWGPU__CLUSTER__DIRECTORY"] = folder
    with dask.config.set({"flowgpu.cluster.directory": folder}):
        yield folder


@pytest.fixture(scope="session", autouse=True)
def own_kernel_cache(tmp_path_factory):
    """The compiled fused kernels of this test session in a folder of its own (flowgpu.cache.kernels),
    here and in the processes tests start: no test writes into ~/.cache, and each session compiles
    afresh what it tests."""
    folder = str(tmp_path_factory.mktemp("kernels"))
    os.environ["DASK_FLOWGPU__CACHE__KERNELS"] = folder
    with dask.config.set({"flowgpu.cache.kernels": folder}):
        yield folder


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory, monkeypatch):
    """Each test its own output cache (flowgpu.cache.directory), in this process and in the processes
    it starts: no test sees what another recorded, and none writes into the working directory."""
    folder = str(tmp_path_factory.mktemp("flowgpu-cache"))
    monkeypatch.setenv("DASK_FLOWGPU__CACHE__DIRECTORY", folder)
    with dask.config.set({"flowgpu.cache.directory": folder}):
        yield folder


@pytest.fixture
def rng():
    """Fresh random data every run (the seed is printed on failure by pytest's -ra summary)."""
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"rng seed: {seed}")
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def cpu_session():
    """One small local CPU cluster shared by the tests that need a cluster."""
    from flowgpu import Session

    with Session(backend="cpu", n_workers=2, threads_per_worker=1, memory_limit="2GiB",
                 dashboard_address=None) as s:
        yield s


@pytest.fixture(scope="module")
def gpu_session():
    """A GPU Session per test module: it sets dask's array backend to cupy while open, so a wider
    scope would leak CuPy chunks into CPU tests that run after it in a plain `pytest` on a GPU host."""
    from flowgpu import Session

    if not GPU:
        pytest.skip("needs an NVIDIA GPU with CuPy")
    with Session(backend="gpu", dashboard_address=None) as s:
        yield s
