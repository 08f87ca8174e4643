"""flowgpu.fuse: the traced Python API gives the unfused result, in one kernel per chunk."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.errors import KernelError


@pytest.fixture
def xs(rng):
    xn = rng.random((120, 90), dtype=np.float32)
    return xn, da.from_array(xn, chunks=(50, 40))


def test_chain_with_trailing_sum(xs):
    xn, x = xs
    f = fg.fuse(lambda x: ((x * 2 + 1) ** 2 - x).sum())
    out = f(x)
    assert isinstance(out, da.Array) and out.dtype == np.float32
    want = ((xn.astype(np.float64) * 2 + 1) ** 2 - xn).sum()
    assert abs(float(out.compute()) - want) / want < 1e-6


def test_reduce_argument_axis_keepdims(xs):
    xn, x = xs
    f = fg.fuse(lambda x, y: np.sqrt(x * x + y), reduce="max", axis=1, keepdims=True)
    out = f(x, 0.5)
    np.testing.assert_allclose(out.compute(), np.sqrt(xn * xn + 0.5).max(axis=1, keepdims=True), rtol=1e-6)


def test_numpy_functions_and_late_arithmetic(xs):
    xn, x = xs

    @fg.fuse
    def f(x):
        return np.mean(np.where(x > 0.5, np.exp(x), -x), axis=0) / 2 + 1

    want = np.where(xn > 0.5, np.exp(xn), -xn).mean(axis=0) / 2 + 1
    np.testing.assert_allclose(f(x).compute(), want, rtol=1e-6)


def test_one_fused_task_per_chunk(xs):
    _, x = xs
    out = fg.fuse(lambda x: np.maximum(x * 3 - 1, 0) + np.sin(x))(x)
    (opt,) = dask.optimize(out)
    assert len(opt.__dask_graph__()) == 2 * x.npartitions  # the chunks of x and one fused task each


def test_plain_arrays_in_plain_array_out(xs):
    xn, _ = xs
    got = fg.fuse(lambda x: x * 2 + 1)(xn)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    np.testing.assert_array_equal(got, xn * 2 + 1)


def test_untraceable_falls_back_with_a_warning(xs):
    xn, x = xs
    f = fg.fuse(lambda x: (x + x.T[:90, :90].sum()) * 2)
    with pytest.warns(RuntimeWarning, match="cannot be fused .*; applying it to the dask arrays unfused"):
        out = f(x)
    np.testing.assert_allclose(out.compute(), (xn + xn.T[:90, :90].sum()) * 2, rtol=1e-5)
    with pytest.warns(RuntimeWarning, match=r"cannot be fused .*; applying it to the arrays unfused") as said:
        got = f(xn)  # NumPy in: no dask array is in sight, so none is named
    assert "dask" not in str(said[0].message) and isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, (xn + xn.T[:90, :90].sum()) * 2, rtol=1e-5)


@pytest.mark.parametrize("sign", [1, -1])
def test_control_flow_on_a_reduced_value_falls_back_with_a_warning(xs, sign):
    """``p if p.sum() > 0 else -p`` raised "'>' not supported between instances of 'Reduced' and 'int'"."""
    xn, x = xs
    xn, x = (xn - 0.5) * sign + 0.01 * sign, (x - 0.5) * sign + 0.01 * sign
    f = fg.fuse(lambda p: p if p.sum() > 0 else -p)
    with pytest.warns(RuntimeWarning, match="Python control flow on a reduced value"):
        out = f(x)
    np.testing.assert_array_equal(out.compute(), xn if xn.sum() > 0 else -xn)


def test_arrays_that_do_not_broadcast_are_said_as_numpy_says(xs):
    """Shapes that do not broadcast gave dask's "Chunks do not add up to shape" from deep inside."""
    xn, x = xs
    with pytest.raises(ValueError, match=r"cannot be broadcast .* shape \(120, 90\) and arg 1 with shape \(10, 90\)"):
        fg.fuse(lambda p, q: p + q)(x, x[:10])


def test_bad_reduce_name():
    with pytest.raises(KernelError, match="median"):
        fg.fuse(lambda x: x, reduce="median")


def test_something_not_callable_is_refused_when_fused():
    """fg.fuse(3) gave a Fused that failed only when called, with Python's 'int' object is not callable."""
    with pytest.raises(KernelError, match=r"fuse\(3\): give the function to fuse"):
        fg.fuse(3)


@pytest.mark.gpu
def test_gpu_fuse_chain_sum(rng):
    import cupy as cp

    xn = rng.random(5_000_000, dtype=np.float32)
    x = da.from_array(cp.asarray(xn), chunks=1_000_000)
    out = fg.fuse(lambda x: ((x * 2 + 1) ** 2 - x).sum())(x).compute()
    want = ((xn.astype(np.float64) * 2 + 1) ** 2 - xn).sum()
    assert abs(float(out) - want) / want < 1e-6
