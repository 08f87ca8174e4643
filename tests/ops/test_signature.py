"""Argument checks: wrong names or types give one OpError naming the op, the argument and the accepted ones."""

from __future__ import annotations

import pytest

from flowgpu.errors import OpError
from flowgpu.ops import get, names
from flowgpu.ops.signature import bind_arguments


@pytest.mark.parametrize("op, args, n_inputs, message", [
    ("sum", {"axs": 0}, 1, "op 'sum': unknown argument 'axs'; did you mean 'axis'\\? it accepts: axis, keepdims, dtype"),
    ("sum", {"axis": 1.5}, 1, "op 'sum': argument 'axis' must be int, str, a list of int or str or None, not float"),
    ("sum", {"keepdims": "yes"}, 1, "argument 'keepdims' must be bool"),
    ("clip", {"lo": 0.0}, 1, "op 'clip': missing argument 'hi'"),
    ("clip", {"lo": "zero", "hi": 1}, 1, "argument 'lo' must be a number"),
    ("add", {}, 1, "op 'add' takes 2 input\\(s\\) \\(a, b\\), got 1"),
    ("sqrt", {}, 2, "op 'sqrt' takes 1 input\\(s\\) \\(x\\), got 2"),
    ("concatenate", {}, 0, "takes at least 1 input"),
    ("concatenate", {"arrays": [1]}, 2, "list them under inputs"),
    ("gaussian_filter", {"sigma": 1, "mode": "bounce"}, 1, "argument 'mode' must be one of 'reflect'"),
    ("gaussian_filter", {}, 1, "missing argument 'sigma'"),
    ("map_blocks", {"func": "numpy:sqrt"}, 1, "unknown argument 'func'; did you mean 'function'"),
    ("transpose", {"axes": [1, 0.5]}, 1, "argument 'axes' must be"),
    ("slice", {"index": {"a": 1}}, 1, "argument 'index' must be"),
])
def test_bind_arguments_rejects(op, args, n_inputs, message):
    with pytest.raises(OpError, match=message):
        bind_arguments(op, args, n_inputs=n_inputs)


@pytest.mark.parametrize("op, args, n_inputs", [
    ("clip", {"lo": 0, "hi": 1.5}, 1),
    ("multiply", {"b": 2.0}, 1),  # a number for an array operand
    ("multiply", {}, 2),
    ("sum", {"axis": [0, 1], "keepdims": True, "dtype": "float64"}, 1),
    ("slice", {"index": "0:10, ::2"}, 1),
    ("slice", {"index": [[0, 10], None]}, 1),
    ("concatenate", {"axis": 1}, 3),
    ("gaussian_filter", {"sigma": [0, 1.5, 1.5], "mode": "nearest"}, 1),
    ("rechunk", {"chunks": {0: 10}}, 1),
])
def test_bind_arguments_accepts(op, args, n_inputs):
    assert bind_arguments(op, args, n_inputs=n_inputs) == args


def test_direct_calls_are_checked_too(rng):
    import dask.array as da

    x = da.from_array(rng.random((3, 3)))
    with pytest.raises(OpError, match="op 'mean': unknown argument 'axes'; did you mean 'axis'"):
        get("mean")(x, axes=0)
    with pytest.raises(OpError, match="op 'sqrt': argument 'x' must be an array, not str"):
        get("sqrt")("x")
    with pytest.raises(OpError, match="op 'transpose'"):
        get("transpose")(x, x)


def test_every_builtin_has_a_numpydoc_docstring_with_a_summary():
    for name in names():
        op = get(name)
        if op.func.__module__.startswith("flowgpu.ops") and op.func.__module__ != "flowgpu.ops.expression":
            assert op.summary and op.summary.endswith("."), name
            assert "Returns\n-------" in op.doc, name


def test_required_ops_are_registered():
    wanted = {"add", "subtract", "multiply", "divide", "power", "negative", "abs", "sqrt", "exp", "log", "sin",
              "cos", "tanh", "minimum", "maximum", "clip", "where", "astype", "square", "sum", "mean", "min",
              "max", "std", "var", "prod", "transpose", "matmul", "slice", "reshape", "rechunk", "concatenate",
              "stack", "fft", "ifft", "rfft", "fft2", "gaussian_filter", "uniform_filter", "median_filter",
              "map_blocks"}
    assert wanted <= set(names())
    assert get("concatenate").inputs == ("arrays*",)
    assert get("where").inputs == ("cond", "a", "b")
