"""Array creation: reproducible random numbers, the same for any chunking, and agreeing with NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import flowgpu as fg
from flowgpu.errors import ChunkError, ConfigError


@pytest.fixture
def seed(rng):
    return int(rng.integers(0, 2**62))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_is_reproducible_and_chunk_independent(seed, dtype):
    a = fg.to_numpy(fg.random((301, 207), dtype=dtype, seed=seed, chunks=(100, 50)))
    b = fg.to_numpy(fg.random((301, 207), dtype=dtype, seed=seed, chunks=(301, 13)))
    c = fg.to_numpy(fg.random((301, 207), dtype=dtype, seed=seed + 1, chunks=(100, 50)))
    assert a.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert 0 <= a.min() and a.max() < 1


def test_random_looks_uniform(seed):
    a = fg.to_numpy(fg.random((400_000,), seed=seed, chunks=100_000))
    hist = np.histogram(a, bins=10, range=(0, 1))[0]
    expected = a.size / 10
    chi2 = float((((hist - expected) ** 2) / expected).sum())
    assert chi2 < 40, chi2  # 9 degrees of freedom: p < 1e-5 for a correct generator
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 0.01


def test_normal_moments(seed):
    a = fg.to_numpy(fg.normal((200_000,), seed=seed, chunks=50_000, loc=2.0, scale=3.0))
    assert abs(a.mean() - 2.0) < 0.05 and abs(a.std() - 3.0) < 0.05


def test_seed_none_differs():
    a = fg.to_numpy(fg.random((50,), chunks=10))
    b = fg.to_numpy(fg.random((50,), chunks=10))
    assert not np.array_equal(a, b)


def test_fill_and_arange_match_numpy(rng):
    v = float(rng.standard_normal())
    np.testing.assert_array_equal(fg.to_numpy(fg.full((7, 5), v, chunks=3)), np.full((7, 5), v))
    np.testing.assert_array_equal(fg.to_numpy(fg.ones((7, 5), dtype="int32", chunks=3)), np.ones((7, 5), "int32"))
    np.testing.assert_array_equal(fg.to_numpy(fg.zeros((4,), chunks=3)), np.zeros(4))
    start, step = float(rng.uniform(-5, 5)), float(rng.uniform(0.1, 2))
    np.testing.assert_allclose(fg.to_numpy(fg.arange(start, start + 40 * step, step, chunks=7)),
                               np.arange(start, start + 40 * step, step), rtol=1e-12)
    np.testing.assert_array_equal(fg.to_numpy(fg.arange(23, chunks=5)), np.arange(23))


def test_from_array_roundtrip_and_dask_ops(rng):
    data = rng.standard_normal((120, 80)).astype("float32")
    x = fg.from_array(data, chunks=(50, 30))
    assert x.chunks == ((50, 50, 20), (30, 30, 20))
    np.testing.assert_allclose(fg.to_numpy((x * 2 + 1).mean(axis=0)), (data * 2 + 1).mean(axis=0), rtol=1e-5)


@pytest.mark.parametrize("kwargs, error", [
    (dict(shape=(10,), dtype="int32"), ConfigError),
    (dict(shape=(10,), seed=-1), ConfigError),
    (dict(shape=(10, 10), chunks=(3, 3, 3)), ChunkError),
    (dict(shape="big"), ConfigError),
])
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        fg.random(**kwargs)


def test_to_device_and_to_host_are_identity_on_cpu(rng):
    data = rng.random((10, 10))
    x = fg.from_array(data, chunks=5)
    assert fg.to_device(x) is x and fg.to_host(x) is x


def _numpy_uniform(location, full_shape, key, dtype, stream):
    """The reference formula in plain NumPy: splitmix64 of (key, global flat index [* 2 + stream])."""
    strides = [int(np.prod(full_shape[i + 1:], dtype=np.int64)) for i in range(len(full_shape))]
    idx = np.zeros((1,) * len(full_shape), dtype=np.uint64)
    for axis, ((start, stop), g) in enumerate(zip(location, strides)):
        shape = [1] * len(full_shape)
        shape[axis] = stop - start
        idx = idx + (np.arange(start, stop, dtype=np.uint64) * np.uint64(g)).reshape(shape)
    if stream >= 0:
        idx = idx * np.uint64(2) + np.uint64(stream)
    with np.errstate(over="ignore"):
        z = idx * np.uint64(0x9E3779B97F4A7C15) + np.uint64(key)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    if dtype == np.float32:
        return (z >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
    return (z >> np.uint64(11)).astype(np.float64) * (2.0**-53)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("location, shape", [([(3, 50), (7, 20), (2, 9)], (100, 30, 11)), ([(5, 17)], (20,)), ([], ())])
def test_compiled_generator_matches_the_numpy_formula(dtype, location, shape, seed):
    """The numba kernel must reproduce the plain NumPy hash exactly."""
    import importlib

    r = importlib.import_module("flowgpu.arrays.random")
    key = r.seed_key(seed)
    for stream in (-1, 0, 1):
        fast = r.uniform_block(location, shape, key, dtype, "numpy", stream=stream)
        slow = _numpy_uniform(location, shape, key, np.dtype(dtype), stream)
        np.testing.assert_array_equal(fast, slow)
