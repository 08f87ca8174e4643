"""On a GPU session's backend (dask ``array.backend = cupy``), ops built on flowgpu's own arrays keep CuPy
chunks and give the NumPy results."""

from __future__ import annotations

import dask
import numpy as np
import pytest

import flowgpu
from flowgpu.backend import is_cupy
from flowgpu.ops import get

pytestmark = pytest.mark.gpu

PIPELINE = [
    ("multiply", lambda x: get("multiply")(x, 2.5)),
    ("sqrt", lambda x: get("sqrt")(x)),
    ("clip", lambda x: get("clip")(x, lo=0.2, hi=0.8)),
    ("where", lambda x: get("where")(get("greater")(x, 0.5), x, -1.0)),
    ("sum", lambda x: get("sum")(x, axis=0)),
    ("std", lambda x: get("std")(x, axis=1, ddof=1)),
    ("nanmean", lambda x: get("nanmean")(get("where")(get("greater")(x, 0.9), np.nan, x), axis=0)),
    ("argmax", lambda x: get("argmax")(x, axis=1)),
    ("cumsum", lambda x: get("cumsum")(x, axis=0, dtype="float64")),
    ("any", lambda x: get("multiply")(get("any")(get("greater")(x, 0.99), axis=0), 1.0)),
    ("matmul", lambda x: get("matmul")(get("transpose")(x), x)),
    ("slice", lambda x: get("slice")(x, index="3:40, ::3")),
    ("fft", lambda x: get("rfft")(x, axis=1)),
    ("gaussian", lambda x: get("gaussian_filter")(x, sigma=2.0, mode="nearest")),
    ("median", lambda x: get("median_filter")(x, size=3)),
    ("concatenate", lambda x: get("concatenate")(x, x, axis=1)),
]


@pytest.mark.parametrize("name, build", PIPELINE, ids=[p[0] for p in PIPELINE])
def test_ops_on_flowgpu_random_cupy_chunks_equal_numpy(name, build):
    seed = int(np.random.SeedSequence().entropy % 2**31)
    host = flowgpu.random((64, 48), dtype="float32", seed=seed, chunks=(16, 24))
    with dask.config.set({"array.backend": "cupy"}):
        dev = flowgpu.random((64, 48), dtype="float32", seed=seed, chunks=(16, 24))
        assert is_cupy(dev._meta)
        out = build(dev)
    assert is_cupy(out._meta), name
    result = out.compute()
    assert is_cupy(result), name
    expected = build(host).compute()
    assert result.dtype == expected.dtype
    scale = max(1.0, float(np.abs(expected).max()))  # float32 sums (matmul, fft) err in absolute terms
    np.testing.assert_allclose(result.get(), expected, rtol=2e-5, atol=4e-6 * scale)


def test_mixed_numpy_and_cupy_inputs_run_on_the_gpu(rng):
    import cupy as cp
    import dask.array as da

    a, b = rng.random((2, 30, 20))
    dev = da.from_array(cp.asarray(a), chunks=10, asarray=False)
    host = da.from_array(b, chunks=10)
    out = get("add")(dev, host)
    assert is_cupy(out._meta)
    np.testing.assert_allclose(out.compute().get(), a + b, rtol=1e-12)
