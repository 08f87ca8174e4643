"""Helpers for op tests: the same test runs on NumPy chunks and (marked gpu) on CuPy chunks."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from flowgpu.backend import import_cupy, is_cupy


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def backend(request):
    """Which chunk type the test's arrays hold; synchronous scheduler, no cluster."""
    with dask.config.set(scheduler="threads"):
        yield request.param


def chunked(x: np.ndarray, chunks, backend: str) -> da.Array:
    """``x`` as a dask array with NumPy or CuPy chunks."""
    if backend == "cupy":
        cp = import_cupy()
        return da.from_array(cp.asarray(x), chunks=chunks, asarray=False)
    return da.from_array(x, chunks=chunks)


def computed(x, backend: str) -> np.ndarray:
    """Compute a dask array (checking its chunk type matches ``backend``) and return it as NumPy."""
    if isinstance(x, da.Array):
        assert is_cupy(x._meta) == (backend == "cupy"), f"meta is {type(x._meta)} on backend {backend}"
        x = x.compute()
    assert is_cupy(x) == (backend == "cupy"), f"result is {type(x)} on backend {backend}"
    return x.get() if is_cupy(x) else np.asarray(x)


def max_rel_err(result: np.ndarray, reference: np.ndarray) -> float:
    """Largest relative error of ``result`` against a (float64) ``reference``."""
    ref = np.asarray(reference, dtype=np.float64)
    res = np.asarray(result, dtype=np.float64)
    assert res.shape == ref.shape, (res.shape, ref.shape)
    scale = np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(res - ref) / scale)) if ref.size else 0.0
