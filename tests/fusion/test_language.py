"""The expression language: what it accepts, what it refuses (and how it says so), and its typing."""

from __future__ import annotations

import numpy as np
import pytest

from flowgpu.errors import KernelError
from flowgpu.fusion.language import FUNCTIONS, parse


def test_names_in_order_of_first_use():
    assert parse("b * a + sqrt(b) - c").names == ("b", "a", "c")


def test_evaluate_matches_numpy(rng):
    x = rng.random(100) + 0.1
    y = rng.random(100) - 0.5
    e = parse("where(y > 0, sqrt(x) * y, -x ** 2) + clip(y, -0.25, 0.25) // 0.1 % 3")
    want = np.where(y > 0, np.sqrt(x) * y, -x ** 2) + np.clip(y, -0.25, 0.25) // 0.1 % 3
    np.testing.assert_array_equal(e.evaluate({"x": x, "y": y}, np), want)


def test_chained_comparison_means_and(rng):
    x = rng.random(50) * 3
    got = parse("1 < x <= 2").evaluate({"x": x}, np)
    np.testing.assert_array_equal(got, (1 < x) & (x <= 2))


def test_every_function_evaluates(rng):
    x = rng.random(8) * 0.5 + 1.1  # inside every domain (arccosh needs >= 1, arcsin <= 1 after scaling)
    for name, (nargs, _) in FUNCTIONS.items():
        arg = "x / 3" if name in ("arcsin", "arccos", "arctanh") else "x"
        text = f"{name}({', '.join([arg] * nargs)})"
        got = parse(text).evaluate({"x": x}, np)
        assert np.all(np.isfinite(got)) or name in ("isnan", "isinf", "isfinite"), text


@pytest.mark.parametrize("text, token, col", [
    ("np.sqrt(x)", "np.sqrt", 1),
    ("x + y[0]", "y[0]", 5),
    ("x.T", "x.T", 1),
    ("(lambda: x)()", "lambda", 2),
    ("x + open(y)", "open", 5),
    ("x and y", "and", 1),
    ("x + __import__('os')", "__import__", 5),
    ("[v for v in x]", "for", 1),
    ("x + 'a'", "'a'", 5),
    ("x if y else 1", "where", 1),
    ("x +* 1", "valid expression", 4),
])
def test_refuses_with_token_and_column(text, token, col):
    with pytest.raises(KernelError) as info:
        parse(text)
    msg = str(info.value)
    assert token in msg
    assert f"column {col}" in msg


def test_unknown_name_lists_the_inputs():
    with pytest.raises(KernelError, match=r"unknown name 'z'.*inputs are: x, y"):
        parse("x + z", names=["x", "y"])


def test_wrong_arity_and_keywords():
    with pytest.raises(KernelError, match="takes 2 argument"):
        parse("maximum(x)")
    with pytest.raises(KernelError, match="positional"):
        parse("clip(x, lo=0, hi=1)")


def test_is_a_value_error():
    with pytest.raises(ValueError):
        parse("")


def test_literals_fold_and_stay_weak():
    e = parse("x * (2 * 3) + -1")
    assert e.result_dtype({"x": np.float32}) == np.float32
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(e.evaluate({"x": x}, np), x * 6 - 1)


@pytest.mark.parametrize("text, types, want", [
    ("x * 2.0 + 1", {"x": "float32"}, "float32"),
    ("x / 2", {"x": "int32"}, "float64"),
    ("x + y", {"x": "float32", "y": "int64"}, "float64"),
    ("sqrt(x)", {"x": "int16"}, "float32"),
    ("x > a", {"x": "float32", "a": 0.5}, "bool"),
    ("x * a", {"x": "float32", "a": np.float64(2)}, "float64"),  # NumPy scalars are not weak
    ("(x > 0) & (y < 1)", {"x": "float64", "y": "float64"}, "bool"),
    ("x // 2 + x % 3", {"x": "int32"}, "int32"),
])
def test_result_dtype_is_numpys(text, types, want):
    assert parse(text).result_dtype(types) == np.dtype(want)
    samples = {k: (np.ones(3, dtype=v) if isinstance(v, str) else v) for k, v in types.items()}
    assert parse(text).evaluate(samples, np).dtype == np.dtype(want)


def test_types_numpy_refuses_are_kernel_errors():
    with pytest.raises(KernelError, match="cannot be applied"):
        parse("x & y").infer({"x": np.float32, "y": np.float32})
