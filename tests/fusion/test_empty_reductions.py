"""Fused reductions over zero-size chunks and empty arrays give NumPy's values and dtypes, and raise
where NumPy and dask raise (bug 6 of issue 16), on fresh random data."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest

import flowgpu as fg


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12)


# -- bug 6: fused reductions over zero-size chunks and empty arrays ---------------------------------

REDS = ("min", "max", "sum", "mean", "prod")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "int64"])
def test_fused_reduction_skips_zero_size_chunks(rng, dtype):
    """Bug 6: fg.fuse((a + 1).min()) over a zero-size chunk raised ValueError with a "could not
    compile" warning; now each reduction gives NumPy's value and dtype, with no warning."""
    xn = (rng.random(9) * 10 - 5).astype(dtype)
    x = da.from_array(xn, chunks=((3, 0, 4, 0, 2),))
    for red in REDS:
        want = getattr(xn + 1, red)()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = fg.fuse(lambda a: getattr(a + 1, red)())(x).compute(scheduler="sync")
        assert got.dtype == want.dtype, red
        # summed in another order than NumPy's (per chunk): float32 rounding, against the values' size
        scale = float(np.abs(xn + 1).sum()) / (xn.size if red == "mean" else 1) if red in ("sum", "mean") else 0.0
        np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-12,
                                   atol=(1e-6 if dtype == "float32" else 1e-12) * scale, err_msg=red)


@pytest.mark.timeout(60)
def test_fused_axis_reductions_with_zero_size_chunks(rng):
    """Bug 6: zero-size chunks along either axis of a 2-D array, any axis, the NumPy result."""
    mn = rng.standard_normal((6, 5))
    for chunks in (((2, 0, 4), (5,)), ((6,), (2, 0, 3)), ((3, 0, 3), (1, 0, 4))):
        m = da.from_array(mn, chunks=chunks)
        for axis in (0, 1, None, (0, 1)):
            for red in ("min", "max", "sum"):
                want = getattr(mn * 2 - 1, red)(axis=axis)
                got = fg.fuse(lambda a: getattr(a * 2 - 1, red)(axis=axis))(m).compute(scheduler="sync")
                _same(np.asarray(got), np.asarray(want))


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("error")  # no "could not compile" warning either
def test_fused_reductions_of_empty_arrays_behave_as_dask(rng):
    """Bug 6: min/max over no values raise ValueError as NumPy and dask do (without a misleading
    "could not compile" warning); over an empty extent of the result, an empty result; sum gives 0."""
    e = da.from_array(np.zeros(0), chunks=((0,),))
    wide = da.from_array(rng.random((4, 0)), chunks=((2, 2), (0,)))
    for red in ("min", "max"):
        with pytest.raises(ValueError, match="zero-size"):
            getattr(e + 1, red)().compute(scheduler="sync")
        with pytest.raises(ValueError, match="zero-size"):
            fg.fuse(lambda a: getattr(a + 1, red)())(e).compute(scheduler="sync")
        with pytest.raises(ValueError, match="zero-size"):
            fg.fuse(lambda a: getattr(a + 1, red)(axis=1))(wide).compute(scheduler="sync")
        got = fg.fuse(lambda a: getattr(a + 1, red)(axis=0))(wide).compute(scheduler="sync")
        assert got.shape == (0,) and got.dtype == np.float64
    total = fg.fuse(lambda a: (a + 1).sum())(e).compute(scheduler="sync")
    assert total == 0 and total.dtype == np.float64


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_gpu_fused_reduction_skips_zero_size_chunks(rng):
    """Bug 6 on CuPy chunks: zero-size chunks give the identity, the result NumPy's."""
    import cupy as cp

    xn = rng.standard_normal(1000).astype(np.float32)
    x = da.from_array(cp.asarray(xn), chunks=((300, 0, 700),), asarray=False)
    for red in REDS:
        got = fg.fuse(lambda a: getattr(a + 1, red)())(x).compute(scheduler="sync")
        np.testing.assert_allclose(float(got), float(getattr(xn + 1, red)()), rtol=1e-4)
