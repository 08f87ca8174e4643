"""Elementwise ops equal NumPy on fresh random data, on NumPy chunks and (gpu) CuPy chunks."""

from __future__ import annotations

import numpy as np
import pytest

from flowgpu.errors import OpError
from flowgpu.ops import get
from tests.ops.conftest import chunked, computed, max_rel_err
from tests.tolerance import assert_within_terms

# name -> (numpy reference, input domain (low, high))
UNARY = {
    "negative": (np.negative, (-3, 3)),
    "abs": (np.abs, (-3, 3)),
    "sqrt": (np.sqrt, (0.1, 9)),
    "square": (np.square, (-3, 3)),
    "exp": (np.exp, (-3, 3)),
    "log": (np.log, (2, 10)),
    "log10": (np.log10, (2, 10)),
    "log1p": (np.log1p, (0.01, 3)),
    "expm1": (np.expm1, (0.01, 2)),
    "sin": (np.sin, (0.1, 1.4)),
    "cos": (np.cos, (0.1, 1.4)),
    "tan": (np.tan, (0.1, 1.2)),
    "tanh": (np.tanh, (0.1, 3)),
    "floor": (np.floor, (1.1, 50)),
    "ceil": (np.ceil, (1.1, 50)),
}
BINARY = {
    "add": (np.add, (0.5, 3)),
    "subtract": (np.subtract, (0.5, 3)),
    "multiply": (np.multiply, (-3, 3)),
    "divide": (np.divide, (0.5, 3)),
    "power": (np.power, (0.5, 2)),
    "minimum": (np.minimum, (-3, 3)),
    "maximum": (np.maximum, (-3, 3)),
}
COMPARE = {
    "greater": np.greater, "greater_equal": np.greater_equal, "less": np.less,
    "less_equal": np.less_equal, "equal": np.equal, "not_equal": np.not_equal,
}


def _data(rng, shape, domain, dtype):
    lo, hi = domain
    return (lo + (hi - lo) * rng.random(shape)).astype(dtype)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float32_within_1e6_of_float64_reference(name, rng, backend):
    ref_fn, domain = UNARY[name]
    x = _data(rng, (23, 17), domain, np.float32)
    out = get(name)(chunked(x, (7, 5), backend))
    assert out.dtype == np.float32
    result = computed(out, backend)
    assert result.dtype == np.float32
    assert max_rel_err(result, ref_fn(x.astype(np.float64))) < 1e-6


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_float64_equals_numpy(name, rng, backend):
    ref_fn, domain = UNARY[name]
    x = _data(rng, (31,), domain, np.float64)
    result = computed(get(name)(chunked(x, 8, backend)), backend)
    np.testing.assert_allclose(result, ref_fn(x), rtol=1e-13)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_arrays_broadcast_and_match_reference(name, rng, backend):
    ref_fn, domain = BINARY[name]
    a = _data(rng, (12, 10), domain, np.float32)
    b = _data(rng, (10,), domain, np.float32)
    out = get(name)(chunked(a, (5, 4), backend), chunked(b, 4, backend))
    result = computed(out, backend)
    assert result.dtype == np.float32
    assert max_rel_err(result, ref_fn(a.astype(np.float64), b.astype(np.float64))) < 1e-6


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("side", ["left", "right"])
def test_binary_with_a_number_keeps_the_array_dtype(name, side, rng, backend):
    ref_fn, domain = BINARY[name]
    a = _data(rng, (9, 8), domain, np.float32)
    s = float(_data(rng, (), domain, np.float32))  # a number float32 holds exactly
    x = chunked(a, 4, backend)
    out = get(name)(x, s) if side == "left" else get(name)(s, x)
    ref = ref_fn(a.astype(np.float64), s) if side == "left" else ref_fn(s, a.astype(np.float64))
    result = computed(out, backend)
    assert result.dtype == np.float32
    assert max_rel_err(result, ref) < 1e-6


@pytest.mark.parametrize("name", sorted(COMPARE))
def test_comparisons_equal_numpy(name, rng, backend):
    a = rng.integers(0, 4, (10, 6)).astype(np.float64)
    b = rng.integers(0, 4, (10, 6)).astype(np.float64)
    out = get(name)(chunked(a, 3, backend), chunked(b, 3, backend))
    result = computed(out, backend)
    assert result.dtype == bool
    np.testing.assert_array_equal(result, COMPARE[name](a, b))


def test_clip_scale_where_astype(rng, backend):
    a = rng.normal(size=(15, 6)).astype(np.float32)
    b = rng.normal(size=(15, 6)).astype(np.float32)
    x, y = chunked(a, 4, backend), chunked(b, 4, backend)
    lo, hi = sorted(float(v) for v in rng.normal(size=2) * 0.5)
    np.testing.assert_array_equal(computed(get("clip")(x, lo=lo, hi=hi), backend), np.clip(a, lo, hi))
    factor, offset = rng.normal(size=2)
    scaled = computed(get("scale")(x, factor=factor, offset=offset), backend)
    assert scaled.dtype == np.float32
    # float32 rounds factor, offset, the product and the sum (a relative bound on the result failed
    # where a * factor nearly cancelled offset: 2.4e-5 with seed 935679669)
    assert_within_terms(scaled, a.astype(np.float64) * factor + offset,
                        np.abs(a.astype(np.float64) * factor) + abs(offset), 2, np.float32)
    cond = get("greater")(x, y)
    np.testing.assert_array_equal(computed(get("where")(cond, x, 0.0), backend), np.where(a > b, a, 0))
    np.testing.assert_array_equal(computed(get("where")(cond, x, y), backend), np.where(a > b, a, b))
    cast = computed(get("astype")(x * 10, dtype="int32"), backend)
    assert cast.dtype == np.int32
    np.testing.assert_array_equal(cast, (a * np.float32(10)).astype(np.int32))


def test_zero_dimensional_results_are_arrays_too(rng, backend):
    """A ratio of two reductions (0-d arrays) is an elementwise op like any other."""
    a, b = 0.5 + rng.random((2, 12, 5))
    ratio = get("divide")(get("mean")(chunked(a, 4, backend)), get("sum")(chunked(b, 4, backend)))
    assert ratio.shape == ()
    np.testing.assert_allclose(computed(ratio, backend), a.mean() / b.sum(), rtol=1e-12)
    np.testing.assert_allclose(computed(get("sqrt")(get("max")(chunked(a, 4, backend))), backend),
                               np.sqrt(a.max()), rtol=1e-12)


def test_numbers_only_is_an_op_error():
    with pytest.raises(OpError, match="at least one operand must be an array"):
        get("add")(1.0, 2.0)


def test_clip_bounds_in_the_wrong_order_are_refused(rng):
    import dask.array as da

    with pytest.raises(OpError, match="lo=1.0 is greater than hi=0.0"):
        get("clip")(da.from_array(rng.random(4)), lo=1.0, hi=0.0)


def test_bad_dtype_names_the_value(rng):
    import dask.array as da

    with pytest.raises(OpError, match="'floaty32' is not a dtype"):
        get("astype")(da.from_array(rng.random(4)), dtype="floaty32")


@pytest.mark.parametrize("name", sorted(UNARY) + sorted(BINARY) + sorted(COMPARE) + ["clip", "scale", "where"])
def test_elementwise_ops_declare_a_template_over_their_parameters(name):
    op = get(name)
    assert op.kind == "elementwise"
    assert op.expression
    params = set(op.signature.parameters)
    words = {w for w in __import__("re").findall(r"[A-Za-z_]\w*", op.expression)}
    known_functions = {"sqrt", "exp", "log", "log10", "log1p", "expm1", "abs", "sin", "cos", "tan", "tanh",
                       "floor", "ceil", "minimum", "maximum", "clip", "where"}
    assert words - known_functions <= params, op.expression
    assert set(op.inputs) <= words or name == "square"
