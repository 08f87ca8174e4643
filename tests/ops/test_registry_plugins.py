"""User ops through the decorator, and the built-in templates against the kernel expression language."""

from __future__ import annotations

import numpy as np
import pytest

import flowgpu
from flowgpu.errors import OpError
from flowgpu.ops import get, names, registry
from flowgpu.ops.signature import bind_arguments
from tests.ops.conftest import chunked, computed
from tests.tolerance import assert_within_terms


@pytest.fixture
def scratch_ops():
    """Names registered by a test are removed afterwards."""
    before = set(registry.OPS.names())
    yield
    for name in set(registry.OPS.names()) - before:
        registry.OPS.remove(name)


def test_decorator_registers_a_user_op(scratch_ops, rng, backend):
    @flowgpu.op("test_axpy", kind="elementwise", expression="alpha * x + y")
    def axpy(x, y, *, alpha: float = 1.0):
        """alpha * x + y for arrays x and y."""
        return alpha * x + y

    op = get("test_axpy")
    assert "test_axpy" in names()
    assert op.inputs == ("x", "y") and op.kind == "elementwise"
    assert op.summary == "alpha * x + y for arrays x and y."
    a, b = rng.random((2, 9, 4))
    alpha = float(rng.normal())
    out = op(chunked(a, 4, backend), chunked(b, 4, backend), alpha=alpha)
    assert_within_terms(computed(out, backend), alpha * a + b, np.abs(alpha * a) + b, 4)
    with pytest.raises(OpError, match="unknown argument 'beta'"):
        bind_arguments("test_axpy", {"beta": 1.0}, n_inputs=2)


def test_decorator_refuses_to_replace_a_builtin(scratch_ops):
    with pytest.raises(OpError, match="'sum' is already registered"):
        @flowgpu.op("sum")
        def my_sum(x):
            """Not the real sum."""
            return x


def test_unknown_op_suggests_close_names():
    with pytest.raises(OpError, match="unknown op 'gausian_filter'; did you mean 'gaussian_filter'"):
        get("gausian_filter")


def _templated():
    return [op for op in registry.all_ops() if op.expression and op.func.__module__ == "flowgpu.ops.elementwise"]


@pytest.mark.parametrize("name", [op.name for op in _templated()])
def test_expression_template_evaluates_like_the_op(name, rng):
    """The template the compiler fuses gives the same values as calling the op (unfused)."""
    expr = pytest.importorskip("flowgpu.fusion.language")
    import dask.array as da

    op = get(name)
    arrays = {n: 0.5 + rng.random((5, 4)) for n in op.inputs}
    if name == "where":
        arrays["cond"] = rng.random((5, 4)) > 0.5
    params = op.signature.parameters
    scalars = {k: float(v) for k, v in zip([p for p in params if p not in op.inputs], sorted(rng.random(2)))}
    parsed = expr.parse(op.expression)
    assert set(parsed.names) <= set(arrays) | set(scalars) | {p for p in params if params[p].default is not params[p].empty}
    env = {k: (params[k].default) for k in parsed.names if k not in arrays and k not in scalars}
    env.update(arrays)
    env.update(scalars)
    expected = parsed.evaluate(env, np)
    result = op(*[da.from_array(arrays[n], chunks=2) for n in op.inputs], **scalars).compute()
    np.testing.assert_allclose(result, expected, rtol=1e-12)
