"""Fused arithmetic follows NumPy's dtype rules: a NumPy scalar on the left of a comparison, the lowest
integer floor-divided by -1, narrow integers wrapping after every operation, clip bounds beyond the
dtype, float16 on NumPy chunks, a reduction's ``dtype=``, the integer reciprocal of zero. Found by the
property-based tests (tests/fusion/test_properties.py), each checked on fresh random data against
NumPy, through ``fusing()``, ``fg.fuse`` and the expression language."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.fusion import chunk, fused_elementwise, fusing


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    np.testing.assert_array_equal(got, want)


def _no_flowgpu_warning(fn):
    """``fn()``, asserting flowgpu warned nothing (no "cannot be fused", no "could not compile")."""
    getattr(chunk, "_warned", set()).clear()  # flowgpu warns once per expression and process
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = fn()
    ours = [str(w.message) for w in seen if "flowgpu" in str(w.message)]
    assert not ours, ours
    return out


def _under_fusing(arr):
    with fusing():
        return arr.compute(scheduler="sync")


# -- a NumPy scalar on the left of a comparison -------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("scalar", [np.float32(1.5), np.int16(-3), np.uint8(200), np.float64(0.25)])
def test_numpy_scalar_left_of_a_comparison_is_fused(rng, scalar):
    """``np.float32(1.5) < x`` reached fg.fuse's tracer as a 0-d ndarray (NumPy wraps a scalar's own
    comparison so), which fg.fuse refused: "cannot be fused", computed unfused. Now it is fused."""
    xn = rng.integers(-300, 300, 500).astype(np.int16) if np.dtype(type(scalar)).kind in "iu" \
        else rng.standard_normal(500).astype(np.float32)
    x = da.from_array(xn, chunks=120)
    for f in (lambda a: scalar < (a * 2), lambda a: scalar >= a + 1, lambda a: (scalar == a) | (a > 0)):
        with np.errstate(all="ignore"):
            want = f(xn)
        _same(_no_flowgpu_warning(lambda: fg.fuse(f)(x).compute(scheduler="sync")), want)
        _same(_under_fusing(f(x)), want)
    assert want.any() and not want.all()  # fresh data on both sides of the scalar


# -- the lowest integer floor-divided by -1 -----------------------------------------------------------

def _lowest_and_random(rng, dtype, n=400):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    x[rng.choice(n, 40, replace=False)] = info.min
    y = rng.integers(-3, 4, n).astype(dtype)
    y[rng.choice(n, 80, replace=False)] = -1
    return x, y


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["int64", "int32", "int8"])
def test_lowest_integer_floordiv_minus_one_wraps_as_numpy(rng, dtype):
    """``np.iinfo(int64).min // -1`` is the lowest int64 again in NumPy (it wraps); the numba kernel
    gave 0. ``%`` by -1 is 0, as NumPy says."""
    xn, yn = _lowest_and_random(rng, np.dtype(dtype))
    x, y = da.from_array(xn, chunks=97), da.from_array(yn, chunks=97)
    with np.errstate(all="ignore"):
        div, mod = (xn + 0) // yn, (xn + 0) % yn
    assert (div == np.iinfo(dtype).min).sum() >= 1
    _same(_under_fusing((x + 0) // y), div)
    _same(fg.fuse(lambda a, b: (a + 0) // b)(x, y).compute(scheduler="sync"), div)
    _same(fused_elementwise("x // y", {"x": x, "y": y}).compute(scheduler="sync"), div)
    _same(_under_fusing((x + 0) % y), mod)
    with np.errstate(all="ignore"):
        assert int(fg.fuse(lambda a, b: ((a + 0) // b).sum())(x, y).compute(scheduler="sync")) == int(div.sum())


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["int64", "int32", "int8"])
def test_gpu_lowest_integer_floordiv_minus_one_wraps_as_numpy(rng, dtype):
    """The same on CuPy chunks: the CUDA helpers return the wrapped value (and 0 for ``%``)."""
    import cupy as cp

    xn, yn = _lowest_and_random(rng, np.dtype(dtype))
    x, y = da.from_array(cp.asarray(xn), chunks=97), da.from_array(cp.asarray(yn), chunks=97)
    with np.errstate(all="ignore"):
        div, mod = (xn + 0) // yn, (xn + 0) % yn
    _same(cp.asnumpy(_under_fusing((x + 0) // y)), div)
    _same(cp.asnumpy(fg.fuse(lambda a, b: (a + 0) // b)(x, y).compute()), div)
    _same(cp.asnumpy(_under_fusing((x + 0) % y)), mod)


# -- small integers wrap after every operation, not only at the end --------------------------------

NARROW = {
    "square then compare": lambda a: (a ** 2) > 0,
    "cube then sum": lambda a: (a ** 3).sum(),
    "np.square then compare": lambda a: np.square(a) > 0,
    "negative then compare": lambda a: (-a) > 0,
    "floordiv by -1 then compare": lambda a: (a // (a - a - 1)) > 0,  # -1, or the largest unsigned
    "reciprocal then compare": lambda a: np.reciprocal(a | 1) > 0,
    "product then floordiv": lambda a: (a * a) // 3,
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["int8", "uint8", pytest.param("int16", marks=pytest.mark.slow),
                                   pytest.param("uint16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", list(NARROW))
def test_small_integers_wrap_before_the_next_operation(rng, dtype, name):
    """numba computes ``int8 * int8`` in int64 (CUDA C in int): ``x ** 2 > 0`` with ``x = 16`` was True
    where NumPy's int8 ``16 ** 2`` wraps to 0 (False). Each node is now cast back to its dtype."""
    info = np.iinfo(dtype)
    xn = rng.integers(info.min, info.max, 600, endpoint=True).astype(dtype)
    x = da.from_array(xn, chunks=130)
    f = NARROW[name]
    with np.errstate(all="ignore"):
        want = f(xn)
    _same(_no_flowgpu_warning(lambda: fg.fuse(f)(x).compute(scheduler="sync")), want)
    _same(_under_fusing(f(x)), want)


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16"])
def test_gpu_small_integers_wrap_before_the_next_operation(rng, dtype):
    """The same on CuPy chunks (C promotes char and short to int)."""
    info = np.iinfo(dtype)
    _gpu_same_as_numpy(rng.integers(info.min, info.max, 600, endpoint=True).astype(dtype), NARROW.values())


def _gpu_same_as_numpy(xn: np.ndarray, functions) -> None:
    """Each of ``functions`` of ``xn`` on CuPy chunks, through fg.fuse and fusing(), is NumPy's."""
    import cupy as cp

    x = da.from_array(cp.asarray(xn), chunks=130)
    for f in functions:
        with np.errstate(all="ignore"):
            want = f(xn)
        _same(cp.asnumpy(fg.fuse(f)(x).compute()), want)
        _same(cp.asnumpy(_under_fusing(f(x))), want)


# -- wide signed integers wrap: their overflow is undefined in numba's LLVM and in C++ ----------------

WIDE = {
    "plus one beyond the largest": lambda a: (a + 1) > a,
    "product then floordiv": lambda a: (a * a) // 3,
    "product then mod": lambda a: (a * a) % 7,
    "negated product then compare": lambda a: (-(a * 4)) < 0,
    "cube then compare": lambda a: (a ** 3) > 0,
    "abs of a product": lambda a: abs(a * 2) >= 0,
}


def _wide(rng, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = np.array([info.max, info.min, info.max - 1, -1, 0], dtype=dtype)
    return np.concatenate([edges, rng.integers(info.min, info.max, 400, endpoint=True, dtype=dtype)])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["int64", pytest.param("int32", marks=pytest.mark.slow)])
def test_wide_signed_integers_wrap_as_numpy(rng, dtype):
    """numba flags signed + - * no-signed-wrap, so LLVM folded ``x + 1 > x`` to True for the largest
    int64 and ``(x * x) // 3`` came out of another overflow: now they are computed unsigned."""
    xn = _wide(rng, dtype)
    x = da.from_array(xn, chunks=130)
    for name, f in WIDE.items():
        with np.errstate(all="ignore"):
            want = f(xn)
        _same(_no_flowgpu_warning(lambda: fg.fuse(f)(x).compute(scheduler="sync")), want)
        _same(_under_fusing(f(x)), want)
    assert not ((xn + 1) > xn).all()  # the largest is there, and wraps


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["int32", "int64", "uint16"])
def test_gpu_wide_signed_integers_wrap_as_numpy(rng, dtype):
    """The same on CuPy chunks: C++'s signed overflow is undefined too (int and long long, and the int
    that unsigned short * unsigned short is computed in)."""
    _gpu_same_as_numpy(_wide(rng, dtype), WIDE.values())


@pytest.mark.timeout(60)
def test_sign_of_infinities_is_numpys(rng):
    """The fused CPU sign computed ``a - a + ...``: NaN for +-inf (inf - inf), also inside a sum."""
    xn = np.concatenate([[np.inf, -np.inf, -0.0, np.nan], rng.standard_normal(200)])
    x = da.from_array(xn, chunks=60)
    for f in (lambda a: np.sign(a) * 1, lambda a: np.sign(a[np.isfinite(a) | np.isinf(a)]).sum()):
        _same(_under_fusing(f(x)), f(xn))
    _same(fg.fuse(lambda a: np.sign(a) + 0)(x).compute(scheduler="sync"), np.sign(xn) + 0)


# -- np.clip with a Python int outside the dtype's range -------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("lo, hi", [(0, 200), (-200, 50), (-1000, 1000), (-5, 2**64)])
def test_clip_bound_outside_the_dtype_is_no_bound(rng, lo, hi):
    """NumPy 2 clips int8 values to ``[0, 200]`` as ``[0, 127]``: a bound beyond the range bounds
    nothing. The kernel cast 200 to int8 (-56) and clipped everything to -56."""
    xn = rng.integers(-128, 128, 500).astype(np.int8)
    x = da.from_array(xn, chunks=111)
    f = lambda a: np.clip(a * 3, lo, hi)  # noqa: E731
    with np.errstate(all="ignore"):
        want = f(xn)
    _same(_no_flowgpu_warning(lambda: fg.fuse(f)(x).compute(scheduler="sync")), want)
    _same(_under_fusing(f(x)), want)
    _same(fused_elementwise(f"clip(x * 3, {lo}, {hi})", {"x": x}).compute(scheduler="sync"), want)


# -- float16 on NumPy chunks -------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "bool", "float16"])
def test_float16_on_numpy_chunks_is_numpys_without_a_compile_warning(rng, dtype):
    """NumPy gives float16 for float functions of (u)int8 and bool; numba has no float16, so the kernel
    failed to compile ("could not compile ... NotImplementedError: float16") on every such chain.
    Now the chunk is computed by NumPy, silently, with NumPy's float16 rounding after each step."""
    xn = (rng.integers(-100, 100, 400) if dtype != "float16" else rng.standard_normal(400) * 50).astype(dtype)
    x = da.from_array(xn, chunks=90)
    for f in (lambda a: np.sqrt(abs(a)) * 3 + 1, lambda a: (np.arctan(a) < np.sqrt(abs(a))).sum(),
              lambda a: (np.exp2(a * 1) - 1).max()):
        with np.errstate(all="ignore"):
            want = f(xn)
        _same(_no_flowgpu_warning(lambda: fg.fuse(f)(x).compute(scheduler="sync")), want)
        _same(_no_flowgpu_warning(lambda: _under_fusing(f(x))), want)


@pytest.mark.gpu
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ["bool", "int8", "float16"])
def test_gpu_float16_values_in_a_reduction_are_cupys_without_a_compile_warning(rng, dtype):
    """``np.arccos`` of a bool array is float16 in NumPy; CuPy's ReductionKernel source has no float16
    type, so ``fg.fuse(lambda a: np.arccos(a).sum())`` on CuPy chunks failed to compile (found by the
    property tests on the H200). Such a chunk is now reduced by CuPy itself, silently."""
    import cupy as cp

    xn = (rng.integers(0, 2, 300) if dtype == "bool" else rng.integers(-1, 2, 300)).astype(dtype)
    x = da.from_array(cp.asarray(xn), chunks=70)
    for f in (lambda a: np.arccos(a).sum(), lambda a: (np.arctan(a) * 2).max()):
        with np.errstate(all="ignore"):
            want = f(xn)
        got = cp.asnumpy(_no_flowgpu_warning(lambda: fg.fuse(f)(x).compute(scheduler="sync")))
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype)
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-2)  # float16 sums


# -- a reduction's dtype= casts the values, not the result --------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, dtype", [("sum", "int64"), ("sum", "int8"), ("prod", "int64"), ("sum", "uint32"),
                                         ("mean", "float32")])
def test_reduction_dtype_casts_each_value_as_numpy(rng, name, dtype):
    """``fg.fuse(lambda a: (a * 1.5).sum(dtype=np.int64))`` summed the floats and truncated the sum;
    NumPy truncates each value and sums those (in ``dtype``, whose result it returns)."""
    xn = rng.standard_normal((40, 30)) * 3
    x = da.from_array(xn, chunks=(13, 11))
    for axis in (None, 0, (0, 1)):
        def f(a):
            return getattr(abs(a * 1.5), name)(axis=axis, dtype=dtype)
        with np.errstate(all="ignore"):
            want = f(xn)
        got = _no_flowgpu_warning(lambda: fg.fuse(f)(x).compute(scheduler="sync"))
        assert got.dtype == want.dtype and got.shape == want.shape
        if np.dtype(dtype).kind == "f":
            np.testing.assert_allclose(got, want, rtol=1e-5)
        else:
            np.testing.assert_array_equal(got, want)


# -- the integer reciprocal of zero ------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16"])
def test_integer_reciprocal_of_zero_is_numpys(rng, dtype):
    """``np.reciprocal`` of an integer 0 is NumPy's cast of inf (0 for int16 on x86, the lowest value
    for int64); the numba kernel's own cast gave -32768 for int16. Other values truncate 1 / x."""
    xn = rng.integers(-3 if dtype[0] == "i" else 0, 4, 500).astype(dtype)
    xn[rng.choice(500, 50, replace=False)] = 0
    x = da.from_array(xn, chunks=120)
    with np.errstate(all="ignore"):
        want = np.reciprocal(xn * 1) + 1
    _same(fg.fuse(lambda a: np.reciprocal(a * 1) + 1)(x).compute(scheduler="sync"), want)
    _same(_under_fusing(np.reciprocal(x * 1) + 1), want)
