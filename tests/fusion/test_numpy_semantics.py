"""Fused elementwise chains keep NumPy's meaning where it is subtle: a negative scalar as the base of
``**``, logical (not bitwise) ufuncs, integer powers, Python ints beyond the chain's dtype. Bugs 1, 2,
4 and 5 of issue 16, found by a differential test against NumPy, one section each.

Every case runs the same code unfused with NumPy and fused (``fusing()`` on a plain dask graph,
``fg.fuse`` and, where the language is concerned, ``fused_elementwise``) on fresh random data:
values and dtypes must be NumPy's.
"""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.fusion import fused_elementwise, fusing
from flowgpu.fusion.chunk import FusedChunk

pytestmark = pytest.mark.timeout(120)


def _fused_texts(arr) -> list[str]:
    return [layer.task.func.text for layer in arr.__dask_graph__().layers.values()
            if isinstance(getattr(getattr(layer, "task", None), "func", None), FusedChunk)]


def _same(got, want) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)


def _under_fusing(lazy):
    with fusing():
        return lazy.compute(scheduler="sync")


# ------------------------------------------------- bug 1: a negative scalar as the base of **


def test_negative_scalar_base_of_power(rng):
    """Bug 1: `(-2.0) ** (x + 1)` gave -(2.0 ** (x + 1)): the text `(-2.0 ** v0)` re-parsed."""
    xn = rng.integers(0, 6, (30, 20)).astype(np.float64)  # whole exponents: the signs alternate
    x = da.from_array(xn, chunks=(11, 7))
    with np.errstate(invalid="ignore"):
        want = (-2.0) ** (xn + 1) * (-3) ** (xn - 1)
    e = (-2.0) ** (x + 1) * (-3) ** (x - 1)
    (text,) = _fused_texts(fg.optimize(e))
    assert "(-2.0) **" in text and "(-3) **" in text
    _same(_under_fusing(e), want)
    _same(fg.fuse(lambda a: (-2.0) ** (a + 1) * (-3) ** (a - 1))(x).compute(), want)
    total = fg.fuse(lambda a: ((-2.0) ** (a + 1)).sum())(x).compute()
    assert float(total) == pytest.approx(((-2.0) ** (xn + 1)).sum(), rel=1e-12)


# ------------------------------------------------- bug 2: logical_and/or/xor/not were bitwise

LOGICAL = {
    "logical_and": lambda a, b: np.logical_and(a + 1, b - 1),
    "logical_or": lambda a, b: np.logical_or(a * 2, b),
    "logical_xor": lambda a, b: np.logical_xor(a - 1, b + 1),
    "logical_not": lambda a, b: np.logical_not(a + b),
}


def _logical_inputs(rng, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Values where each operand above is zero (false), nonzero and, for floats, NaN (true)."""
    if kind == "int":  # values whose bits differ from their truth (2 & 1 == 0)
        return rng.integers(-3, 4, (25, 16)), rng.integers(-3, 4, (25, 16))
    pool = np.concatenate([[-1.0, 0.0, 1.0, np.nan], rng.random(4) * 6 - 3])
    return rng.choice(pool, (25, 16)), rng.choice(pool, (25, 16))


@pytest.mark.parametrize("kind", ["int", "float"])
@pytest.mark.parametrize("name", list(LOGICAL))
def test_logical_ufuncs_are_logical(rng, name, kind):
    """Bug 2: np.logical_* became & | ^ ~: bitwise values and int dtype on ints, KernelError on floats."""
    f = LOGICAL[name]
    xn, yn = _logical_inputs(rng, kind)
    x, y = da.from_array(xn, chunks=(10, 7)), da.from_array(yn, chunks=(10, 7))
    want = f(xn, yn)
    assert want.dtype == np.bool_ and want.any() and not want.all()
    (text,) = _fused_texts(fg.optimize(f(x, y) | (x > 10)))  # fused with its neighbours, as a function
    assert f"{name}(" in text
    _same(_under_fusing(f(x, y)), want)
    _same(fg.fuse(f)(x, y).compute(), want)
    assert int(fg.fuse(lambda a, b: f(a, b).sum())(x, y).compute()) == int(want.sum())


def test_logical_functions_in_the_language(rng):
    """Bug 2: the expression language has logical_and/or/xor/not, typed bool, on any operands."""
    xn, yn = _logical_inputs(rng, "float")
    kn = rng.integers(-2, 3, xn.shape).astype(np.int32)
    env = {"x": da.from_array(xn, chunks=9), "y": da.from_array(yn, chunks=9), "k": da.from_array(kn, chunks=9)}
    text = "logical_or(logical_and(x + 1, k), logical_xor(y, 0.5)) & logical_not(k - 1)"
    want = np.logical_or(np.logical_and(xn + 1, kn), np.logical_xor(yn, 0.5)) & np.logical_not(kn - 1)
    _same(fused_elementwise(text, env).compute(), want)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int", "float"])
def test_gpu_logical_ufuncs_are_logical(rng, kind):
    """Bug 2 on CuPy chunks: the same values and bool dtype as NumPy."""
    import cupy as cp

    xn, yn = _logical_inputs(rng, kind)
    x, y = (da.from_array(cp.asarray(v), chunks=(10, 7)) for v in (xn, yn))
    for name, f in LOGICAL.items():
        got = _under_fusing(f(x, y))
        assert isinstance(got, cp.ndarray), name
        _same(cp.asnumpy(got), f(xn, yn))
        _same(cp.asnumpy(fg.fuse(f)(x, y).compute()), f(xn, yn))


# ------------------------------------------------- bug 4: an integer to a negative integer power


def test_integer_power_negative_exponent_raises_as_numpy(rng):
    """Bug 4: `(x + 1) ** y` on int arrays with negative y returned values where NumPy raises ValueError.

    The fused path leaves integer ** signed-integer-array to the array library (no kernel can raise
    per element), which raises NumPy's own error; other powers stay fused.
    """
    xn, yn = rng.integers(-4, 5, 40), rng.integers(-3, 4, 40)
    yn[rng.integers(0, 40)] = -1
    x, y = da.from_array(xn, chunks=13), da.from_array(yn, chunks=13)
    with pytest.raises(ValueError, match="negative integer powers"):
        (xn + 1) ** yn
    with pytest.raises(ValueError, match="negative integer powers"):
        _under_fusing((x + 1) ** y)
    with pytest.raises(ValueError, match="negative integer powers"):
        _under_fusing(np.power(x * 2, y) - 1)
    with pytest.raises(ValueError, match="negative integer powers"):
        fg.fuse(lambda a, b: (a + 1) ** b)(x, y).compute()
    with pytest.raises(ValueError, match="negative integer powers"):
        fg.fuse(lambda a, b: ((a + 1) ** b).sum())(x, y).compute()


@pytest.mark.parametrize("exp_dtype", ["int8", "int64", "uint8"])
def test_integer_power_nonnegative_exponent_matches_numpy(rng, exp_dtype):
    """Bug 4: with non-negative exponents integer powers still give NumPy's values and dtype."""
    xn = rng.integers(-4, 5, (20, 12)).astype(np.int32)
    yn = rng.integers(0, 5, (20, 12)).astype(exp_dtype)
    x, y = da.from_array(xn, chunks=7), da.from_array(yn, chunks=7)
    want = (xn + 1) ** yn - xn
    assert want.dtype.kind == "i"
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "could not compile a fused kernel": fused
        _same(_under_fusing((x + 1) ** y - x), want)
        _same(fg.fuse(lambda a, b: (a + 1) ** b - a)(x, y).compute(), want)
        _same(fused_elementwise("power(x + 1, y) - x", {"x": x, "y": y}).compute(), want)
        assert int(fg.fuse(lambda a, b: ((a + 1) ** b - a).sum())(x, y).compute()) == int(want.sum())
        _same(fused_elementwise("(x + 1) ** 3 - x", {"x": x}).compute(), (xn + 1) ** 3 - xn)


@pytest.mark.gpu
def test_gpu_integer_power_signed_exponent_is_cupys(rng):
    """Bug 4 on CuPy chunks: integer ** signed-integer array gives what CuPy itself gives, unfused."""
    import cupy as cp

    xn, yn = rng.integers(-4, 5, 4000), rng.integers(-3, 4, 4000)
    xc, yc = cp.asarray(xn), cp.asarray(yn)
    x, y = da.from_array(xc, chunks=1000), da.from_array(yc, chunks=1000)
    want = cp.asnumpy((xc + 1) ** yc)
    got = cp.asnumpy(fg.fuse(lambda a, b: (a + 1) ** b)(x, y).compute())
    _same(got, want)
    ok = cp.abs(yc)
    _same(cp.asnumpy(_under_fusing((x + 1) ** da.from_array(ok, chunks=1000))), (xn + 1) ** np.abs(yn))


# ------------------------------------------------- bug 5: Python ints outside the chain's dtype

BIG = {
    "lt 2**63": lambda a: (a + 1) < 2**63,
    "eq 2**64": lambda a: (a * 2) == 2**64,
    "ne 2**64": lambda a: (a * 2) != 2**64,
    "2**63 gt": lambda a: 2**63 > (a - 1),
    "ge -2**70": lambda a: (a - 1) >= -2**70,
    "le -2**64": lambda a: (a + 1) <= -2**64,
}


@pytest.mark.parametrize("name", list(BIG))
def test_python_int_outside_int64_in_comparison(rng, name):
    """Bug 5: `(x + 1) < 2**63` was all False (the literal wrapped); `(x * 2) == 2**64` crashed `fusing()`."""
    f = BIG[name]
    xn = rng.integers(-10**6, 10**6, (30, 10))
    x = da.from_array(xn, chunks=(8, 6))
    want = f(xn) & (xn > 0) | (xn < -5 * 10**5)  # both values occur
    assert want.any() and not want.all()
    lazy = f(x) & (x > 0) | (x < -5 * 10**5)
    (text,) = _fused_texts(fg.optimize(lazy))
    assert str(2**63) in text or str(2**64) in text or str(2**70) in text
    _same(_under_fusing(lazy), want)
    _same(fg.fuse(lambda a: f(a) & (a > 0) | (a < -5 * 10**5))(x).compute(), want)


@pytest.mark.parametrize("dtype, text, python", [
    ("int8", "x < 1000", lambda x: x < 1000),
    ("int8", "-1000 < x - 1", lambda x: -1000 < x - 1),
    ("uint8", "x >= -1", lambda x: x >= -1),
    ("uint64", "(x + 1) < 2**64", lambda x: (x + 1) < 2**64),
    ("uint64", "x == -1", lambda x: x == -1),
    ("int32", "(x < 2**40) & (x > 3)", lambda x: (x < 2**40) & (x > 3)),
])
def test_python_int_outside_the_dtype_in_the_language(rng, dtype, text, python):
    """Bug 5: any comparison with a Python int beyond the other side's dtype is NumPy's, never wrapped."""
    xn = rng.integers(0, 100, 64).astype(dtype)
    want = python(xn)
    got = fused_elementwise(text, {"x": da.from_array(xn, chunks=20)}).compute()
    _same(got, want)
    _same(_under_fusing(python(da.from_array(xn, chunks=20))), want)


@pytest.mark.gpu
def test_gpu_python_int_outside_int64_in_comparison(rng):
    """Bug 5 on CuPy chunks: the same as NumPy."""
    import cupy as cp

    xn = rng.integers(-10**6, 10**6, 5000)
    x = da.from_array(cp.asarray(xn), chunks=1000)
    for name, f in BIG.items():
        _same(cp.asnumpy(_under_fusing(f(x) | (x > 0))), f(xn) | (xn > 0))
        _same(cp.asnumpy(fg.fuse(lambda a: f(a) | (a > 0))(x).compute()), f(xn) | (xn > 0))
