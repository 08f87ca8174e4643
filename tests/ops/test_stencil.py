"""Stencil filters on several chunks equal scipy.ndimage on the whole array, interior and edges."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.ndimage as ndi

from flowgpu.errors import OpError
from flowgpu.ops import get
from tests.ops.conftest import chunked, computed

MODES = ["reflect", "nearest", "constant", "mirror", "wrap"]


def _check(result, ref, dtype):
    # scipy filters float32 in float64 and rounds; CuPy may accumulate in float32: allow a few ulps
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(result, ref, rtol=tol, atol=tol)
    # the edges are where chunking and boundary handling go wrong: check them on their own too
    for axis in range(ref.ndim):
        for edge in (0, -1):
            np.testing.assert_allclose(np.take(result, edge, axis=axis), np.take(ref, edge, axis=axis),
                                       rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sigma, truncate", [(1.5, 4.0), ([0.7, 2.2], 3.0), (3.0, 4.0)])
def test_gaussian_filter(mode, sigma, truncate, rng, backend):
    a = rng.random((45, 35)).astype(np.float32)
    x = chunked(a, (9, 7), backend)
    out = get("gaussian_filter")(x, sigma=sigma, mode=mode, cval=0.25, truncate=truncate)
    result = computed(out, backend)
    assert result.dtype == np.float32
    if sigma == 1.5:  # depth 6 fits the chunks: they are kept (a deeper filter makes dask merge them)
        assert out.chunks == x.chunks
    _check(result, ndi.gaussian_filter(a, sigma, mode=mode, cval=0.25, truncate=truncate), np.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [3, 4, [5, 2]])
def test_uniform_filter(mode, size, rng, backend):
    a = rng.random((29, 26))
    out = get("uniform_filter")(chunked(a, (6, 8), backend), size=size, mode=mode, cval=-1.0)
    _check(computed(out, backend), ndi.uniform_filter(a, size, mode=mode, cval=-1.0), np.float64)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [3, 4, [5, 1]])
def test_median_filter(mode, size, rng, backend):
    a = rng.random((25, 22)).astype(np.float32)
    out = get("median_filter")(chunked(a, (6, 5), backend), size=size, mode=mode, cval=0.5)
    result = computed(out, backend)
    np.testing.assert_array_equal(result, ndi.median_filter(a, size, mode=mode, cval=0.5))


@pytest.mark.parametrize("alias, mode", [("grid-mirror", "reflect"), ("grid-wrap", "wrap"), ("grid-constant", "constant")])
def test_grid_mode_synonyms(alias, mode, rng, backend):
    a = rng.random((20, 16))
    out = get("uniform_filter")(chunked(a, 6, backend), size=5, mode=alias, cval=0.7)
    _check(computed(out, backend), ndi.uniform_filter(a, 5, mode=mode, cval=0.7), np.float64)


def test_filter_only_some_axes_of_a_stack(rng, backend):
    a = rng.random((4, 20, 18))
    out = get("gaussian_filter")(chunked(a, (1, 7, 6), backend), sigma=1.2, axes=[1, 2])
    _check(computed(out, backend), ndi.gaussian_filter(a, (0, 1.2, 1.2)), np.float64)
    out = get("median_filter")(chunked(a, (1, 7, 6), backend), size=3, axes=[-2, -1])
    np.testing.assert_array_equal(computed(out, backend), ndi.median_filter(a, (1, 3, 3)))


@pytest.mark.parametrize("mode", MODES)
def test_axes_shorter_than_the_reach(mode, rng, backend):
    # a thin stack filtered along every axis (sigma 2: reach 8 > 3 pages, dask's map_overlap refuses
    # such a depth), and a split axis shorter than the reach: scipy's answer either way
    a = rng.random((3, 30, 5)).astype(np.float32)
    for chunks in [(1, 10, 5), (3, 15, 3)]:
        out = get("gaussian_filter")(chunked(a, chunks, backend), sigma=2.0, mode=mode, cval=0.3)
        _check(computed(out, backend), ndi.gaussian_filter(a, 2.0, mode=mode, cval=0.3), np.float32)
        assert len(out.chunks[1]) == len(chunked(a, chunks, backend).chunks[1])  # the long axis stays split
    out = get("median_filter")(chunked(a, (1, 10, 2), backend), size=7, mode=mode, cval=0.3)
    np.testing.assert_array_equal(computed(out, backend), ndi.median_filter(a, 7, mode=mode, cval=0.3))


def test_bad_filter_arguments(rng):
    import dask.array as da

    x = da.from_array(rng.random((6, 6)), chunks=3)
    with pytest.raises(OpError, match="argument 'mode' must be one of"):
        get("gaussian_filter")(x, sigma=1, mode="bounce")
    with pytest.raises(OpError, match="has 3 values but the array has 2"):
        get("uniform_filter")(x, size=[3, 3, 3])
    with pytest.raises(OpError, match="whole numbers >= 1"):
        get("median_filter")(x, size=0)
    with pytest.raises(OpError, match="must not be negative"):
        get("gaussian_filter")(x, sigma=-1)
