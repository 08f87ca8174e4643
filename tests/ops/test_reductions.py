"""Reductions equal NumPy (float64 reference) over all axes, one axis and several, with keepdims."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

from flowgpu.errors import OpError
from flowgpu.ops import get
from tests.ops.conftest import chunked, computed, max_rel_err

REF = {"sum": np.sum, "mean": np.mean, "min": np.min, "max": np.max, "std": np.std, "var": np.var,
       "prod": np.prod}
# float32 accumulates in float32 (as NumPy does): allow for the rounding of a few hundred additions
RTOL32 = {"sum": 1e-6, "mean": 1e-6, "min": 0, "max": 0, "std": 1e-5, "var": 1e-5, "prod": 1e-5}


@pytest.mark.parametrize("name", sorted(REF))
@pytest.mark.parametrize("axis", [None, 0, 1, [0, 2], -1])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_matches_float64_reference(name, axis, keepdims, rng, backend):
    a = (0.5 + rng.random((9, 8, 7))).astype(np.float32)
    if name == "prod":
        a = (0.9 + 0.2 * rng.random((9, 8, 7))).astype(np.float32)
    np_axis = tuple(axis) if isinstance(axis, list) else axis
    out = get(name)(chunked(a, (4, 3, 7), backend), axis=axis, keepdims=keepdims)
    result = computed(out, backend)
    ref = REF[name](a.astype(np.float64), axis=np_axis, keepdims=keepdims)
    assert result.shape == np.shape(ref)
    assert result.dtype == np.float32
    assert max_rel_err(result, ref) <= max(RTOL32[name], 1e-7)


def test_sum_and_mean_accumulate_in_the_requested_dtype(rng, backend):
    a = rng.random((40, 30)).astype(np.float32)
    x = chunked(a, (16, 16), backend)
    total = computed(get("sum")(x, dtype="float64"), backend)
    assert total.dtype == np.float64
    np.testing.assert_allclose(total, a.astype(np.float64).sum(), rtol=1e-12)
    mean = computed(get("mean")(x, axis=0, dtype="float64"), backend)
    np.testing.assert_allclose(mean, a.astype(np.float64).mean(axis=0), rtol=1e-12)


def test_std_var_ddof(rng, backend):
    a = rng.normal(size=(50, 6))
    x = chunked(a, (12, 6), backend)
    np.testing.assert_allclose(computed(get("std")(x, axis=0, ddof=1), backend), a.std(axis=0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(computed(get("var")(x, ddof=1), backend), a.var(ddof=1), rtol=1e-12)


def test_integer_sum_follows_numpy(rng, backend):
    a = rng.integers(-100, 100, (20, 10)).astype(np.int16)
    result = computed(get("sum")(chunked(a, 6, backend), axis=1), backend)
    np.testing.assert_array_equal(result, a.sum(axis=1))
    assert result.dtype == a.sum(axis=1).dtype


def test_reductions_declare_their_kind():
    for name in [*REF, *NAN, "any", "all", "argmin", "argmax"]:
        assert get(name).kind == "reduction"
    for name in ("sum", "mean", "min", "max", "prod"):
        assert get(name).meta["reduction"] == name


def test_axis_out_of_range_is_an_op_error(rng):
    import dask.array as da

    with pytest.raises(OpError, match="axis 2 is out of range for an array of 2 dimension"):
        get("sum")(da.from_array(rng.random((3, 3))), axis=2)


@pytest.mark.parametrize("name", ["sum", "mean", "max", "std", "prod"])
def test_a_reduction_op_gives_the_bits_of_the_same_dask_code(rng, name, backend):
    """A spec's reduction step and the same call in Python give one answer: the op's full reduction
    combined its partials flat, dask's tree nests them (149952.797 against 149952.78 in float32)."""
    a = (rng.random((300, 200)) - 0.25).astype(np.float32)
    a = 1 + (a - 0.25) * 0.001 if name == "prod" else a  # a product of 60,000 values near 1 stays normal
    x = chunked(a, (20, 25), backend)  # 120 chunks
    for kw in ({}, {"axis": 0}):
        got, same = computed(get(name)(x, **kw), backend), computed(getattr(da, name)(x, **kw), backend)
        assert got.dtype == same.dtype and np.array_equal(got, same), (kw, got, same)
        np.testing.assert_allclose(got, getattr(np, name)(a.astype(np.float64), **kw),  # float32's rounding
                                   rtol=1e-3 if name == "prod" else 1e-4)


NAN = ["nansum", "nanmean", "nanprod", "nanmin", "nanmax", "nanstd", "nanvar"]


@pytest.mark.parametrize("name", NAN)
@pytest.mark.parametrize("axis", [None, 0, [0, 2]])
def test_nan_reductions_leave_nans_out_as_numpy_does(name, axis, rng, backend):
    a = 0.9 + 0.2 * rng.random((9, 8, 7))
    a[rng.random(a.shape) < 0.2] = np.nan
    np_axis = tuple(axis) if isinstance(axis, list) else axis
    result = computed(get(name)(chunked(a, (4, 3, 7), backend), axis=axis), backend)
    ref = getattr(np, name)(a, axis=np_axis)
    assert not np.isnan(result).any()
    np.testing.assert_allclose(result, ref, rtol=1e-12)


@pytest.mark.parametrize("name", ["any", "all"])
@pytest.mark.parametrize("axis", [None, 1, [0, 1]])
def test_any_and_all_match_numpy(name, axis, rng, backend):
    a = rng.random((12, 9)) < (0.05 if name == "any" else 0.95)
    np_axis = tuple(axis) if isinstance(axis, list) else axis
    result = computed(get(name)(chunked(a, (5, 4), backend), axis=axis), backend)
    np.testing.assert_array_equal(result, getattr(np, name)(a, axis=np_axis))


@pytest.mark.parametrize("name", ["argmin", "argmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_arg_reductions_give_numpys_indices(name, axis, rng, backend):
    a = rng.normal(size=(23, 17))
    result = computed(get(name)(chunked(a, (5, 4), backend), axis=axis), backend)
    np.testing.assert_array_equal(result, getattr(np, name)(a, axis=axis))


@pytest.mark.parametrize("name", ["cumsum", "cumprod"])
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_scans_match_numpy_along_an_axis_and_flattened(name, axis, rng, backend):
    a = 0.95 + 0.1 * rng.random((13, 6))
    result = computed(get(name)(chunked(a, (4, 4), backend), axis=axis), backend)
    np.testing.assert_allclose(result, getattr(np, name)(a, axis=axis), rtol=1e-12)
    ints = rng.integers(-9, 9, (10, 4)).astype(np.int8)
    summed = computed(get("cumsum")(chunked(ints, (3, 4), backend), axis=0, dtype="int16"), backend)
    assert summed.dtype == np.int16
    np.testing.assert_array_equal(summed, np.cumsum(ints, axis=0, dtype=np.int16))
