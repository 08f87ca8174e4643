"""fused_elementwise: one kernel per chunk gives the unfused result, with NumPy's dtypes."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from flowgpu.errors import KernelError
from flowgpu.fusion import chunk, compiled, fused_elementwise, fusing, parse
from tests.tolerance import assert_within_terms

CHAIN = "(x * 2 + 1) ** 2 - x"


def rel_err(got, want) -> float:
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    scale = np.maximum(np.abs(want), 1e-30)
    return float(np.max(np.abs(got - want) / scale))


def ref(text, env):
    """The float64 reference: the unfused expression on float64 copies of the inputs."""
    env64 = {k: (v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
             for k, v in env.items()}
    return parse(text).evaluate(env64, np)


def test_chain_float32_matches_float64_reference(rng):
    xn = rng.random((301, 207), dtype=np.float32)
    out = fused_elementwise(CHAIN, {"x": da.from_array(xn, chunks=(100, 64))})
    assert out.dtype == np.float32
    got = out.compute()
    assert got.dtype == np.float32 and got.shape == xn.shape
    assert rel_err(got, ref(CHAIN, {"x": xn})) < 1e-6


def test_one_task_per_chunk(rng):
    x = da.from_array(rng.random((40, 40)), chunks=10)
    out = fused_elementwise("sqrt(x) * 2 + sin(x) - x ** 3", {"x": x})
    (opt,) = dask.optimize(out)
    fused = [k for k in dict(opt.__dask_graph__()) if isinstance(k, tuple) and k[0] == opt.name]
    assert len(fused) == 16
    assert len(opt.__dask_graph__()) == 16 + 16  # the chunks of x, and one fused task per chunk


@pytest.mark.parametrize("reduction", ["sum", "mean", "min", "max", "prod"])
def test_fused_reductions(rng, reduction):
    xn = rng.random(10_000, dtype=np.float32) + 0.5
    text = CHAIN if reduction != "prod" else "1 + x * 1e-4"
    out = fused_elementwise(text, {"x": da.from_array(xn, chunks=1500)}, reduction=reduction)
    want = getattr(np, reduction)(ref(text, {"x": xn}))
    assert out.dtype == getattr(np, reduction)(xn).dtype == np.float32
    got = out.compute()
    if reduction == "prod":  # 10,000 float32 products, multiplied in float32 as NumPy and dask multiply
        values = parse(text).evaluate({"x": xn}, np)
        assert rel_err(got, np.prod(values.astype(np.float64))) < 1e-4
        x = da.from_array(xn, chunks=1500)  # as dask code, fused: dask's to the last bit (its tree, in one task)
        with fusing():
            assert (1 + x * 1e-4).prod().compute() == (1 + x * 1e-4).prod().compute(optimize_graph=False)
        return
    assert np.shape(got) == () and rel_err(got, want) < 1e-6


@pytest.mark.parametrize("axis", [0, 1, (0, 2), -1, None])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduction_axes(rng, axis, keepdims):
    xn = rng.random((12, 9, 10)) - 0.5
    yn = rng.random(10)
    env = {"x": da.from_array(xn, chunks=(5, 4, 6)), "y": da.from_array(yn, chunks=3)}
    out = fused_elementwise("x * y + abs(x)", env, reduction="sum", axis=axis, keepdims=keepdims)
    want = (xn * yn + np.abs(xn)).sum(axis=axis, keepdims=keepdims)
    assert out.shape == want.shape
    np.testing.assert_allclose(out.compute(), want, rtol=1e-12)


def test_broadcasting_and_scalars(rng):
    xn = rng.random((30, 20), dtype=np.float32)
    yn = rng.random((30, 1), dtype=np.float32)
    env = {"x": da.from_array(xn, chunks=(7, 6)), "y": da.from_array(yn, chunks=(10, 1)), "a": 1.5,
           "b": np.float32(0.25)}
    out = fused_elementwise("maximum(x - y, b) * a", env)
    assert out.dtype == np.float32 and out.shape == (30, 20)
    assert rel_err(out.compute(), np.maximum(xn - yn, 0.25) * 1.5) < 1e-6


def test_numpy_scalar_is_strong_like_numpy(rng):
    xn = rng.random(50, dtype=np.float32)
    out = fused_elementwise("x * a", {"x": da.from_array(xn, chunks=20), "a": np.float64(3.0)})
    assert out.dtype == (xn * np.float64(3.0)).dtype == np.float64
    np.testing.assert_allclose(out.compute(), xn.astype(np.float64) * 3.0)


def test_dtype_argument_casts_the_result(rng):
    xn = rng.random(100)
    out = fused_elementwise("x * 100", {"x": da.from_array(xn, chunks=30)}, dtype="int32")
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.compute(), (xn * 100).astype(np.int32))


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8"])
def test_integer_semantics_match_numpy(rng, dtype):
    xn = rng.integers(-50 if dtype != "uint8" else 0, 100, 500).astype(dtype)
    yn = rng.integers(1, 9, 500).astype(dtype)
    yn[::7] = 0  # NumPy gives 0 for // and % by zero
    text = "x // y + x % y * 3 - minimum(x, y) + where(x > y, x, y) + abs(x)"
    env = {"x": da.from_array(xn, chunks=128), "y": da.from_array(yn, chunks=128)}
    with np.errstate(all="ignore"):
        want = parse(text).evaluate({"x": xn, "y": yn}, np)
    out = fused_elementwise(text, env)
    assert out.dtype == want.dtype
    np.testing.assert_array_equal(out.compute(), want)


@pytest.mark.parametrize("dtype", [pytest.param("float32", marks=pytest.mark.slow), "float64"])
def test_float_functions_and_operators(rng, dtype):
    xn = (rng.random(1000) * 4 - 2).astype(dtype)
    yn = (rng.random(1000) * 4 - 2).astype(dtype)
    texts = [
        "sqrt(abs(x)) + exp(x) + log(abs(x) + 1) + log1p(abs(y)) + sin(x) * cos(y) + tan(x / 4) + tanh(y)",
        "arcsin(x / 2) + arccos(y / 2) + arctan(x) + arctan2(x, y) + hypot(x, y) + cbrt(x) + exp2(y) + expm1(x)",
        "floor(x) + ceil(y) + trunc(x) + rint(y) + sign(x) + square(y) + reciprocal(x) + negative(y)",
        "x // y + x % y + x / y + x ** 2 + abs(x) ** 1.5 + clip(x, -1, 1) + fmin(x, y) + fmax(x, y)",
        "where((x > 0) & ~(y > 0) | (x < -1), log10(abs(x)) + log2(abs(y)), sinh(x) + cosh(y) + arcsinh(x))",
        "isnan(x / y) + isfinite(x) + isinf(x)",
    ]
    env = {"x": da.from_array(xn, chunks=300), "y": da.from_array(yn, chunks=300)}
    for text in texts:
        out = fused_elementwise(text, env)
        with np.errstate(all="ignore"):
            want64 = ref(text, {"x": xn, "y": yn})
            want = parse(text).evaluate({"x": xn, "y": yn}, np)
        assert out.dtype == want.dtype, text
        got = out.compute()
        if dtype == "float64":
            np.testing.assert_allclose(got, want64, rtol=1e-11, atol=1e-12, err_msg=text)
        else:  # sums of many float32 terms cancel: compare with NumPy's own float32 result
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.nanmax(np.abs(want)), err_msg=text)


def test_nan_propagation_like_numpy(rng):
    xn = rng.random(100)
    xn[::9] = np.nan
    yn = rng.random(100)
    env = {"x": da.from_array(xn, chunks=40), "y": da.from_array(yn, chunks=40)}
    text = "maximum(x, y) + minimum(y, x) + clip(x, 0.2, 0.8)"
    np.testing.assert_array_equal(fused_elementwise(text, env).compute(),
                                  np.maximum(xn, yn) + np.minimum(yn, xn) + np.clip(xn, 0.2, 0.8))
    assert np.isnan(fused_elementwise("x", env, reduction="max").compute())


def test_numpy_array_inputs_are_wrapped(rng):
    xn = rng.random((20, 20))
    out = fused_elementwise("x + y", {"x": da.from_array(xn, chunks=5), "y": xn.T.copy()})
    np.testing.assert_allclose(out.compute(), xn + xn.T)


def test_kernels_are_cached(rng):
    x = da.from_array(rng.random(100), chunks=10)
    fused_elementwise("x * 7 - 3", {"x": x}).compute()
    n = len(compiled._cache)
    fused_elementwise("x * 7 - 3", {"x": x + 1}).compute()
    assert len(compiled._cache) == n


def test_errors():
    x = da.ones(10, chunks=5)
    with pytest.raises(KernelError, match="unknown name 'y'"):
        fused_elementwise("x + y", {"x": x})
    with pytest.raises(KernelError, match="no array input"):
        fused_elementwise("a + 1", {"a": 2.0})
    with pytest.raises(KernelError, match="reduction='median'"):
        fused_elementwise("x", {"x": x}, reduction="median")
    with pytest.raises(KernelError, match="reduction='median'"):  # also where no kernel takes the dtype
        fused_elementwise("x", {"x": da.ones(4, dtype=complex)}, reduction="median")


@pytest.mark.parametrize("reduction", [None, "sum", "max"])
def test_complex_inputs_give_numpys_values_unfused(rng, reduction):
    zn = (rng.normal(size=(30, 20)) + 1j * rng.normal(size=(30, 20))).astype(np.complex64)
    wn = rng.normal(size=(30, 20)).astype(np.float32)
    z, w = da.from_array(zn, chunks=(10, 20)), da.from_array(wn, chunks=(10, 20))
    got = fused_elementwise("abs(z) ** 2 + w * 3", {"z": z, "w": w}, reduction=reduction, axis=0)
    want = np.abs(zn.astype(np.complex128)) ** 2 + wn.astype(np.float64) * 3
    want = want if reduction is None else getattr(np, reduction)(want, axis=0)
    assert got.dtype == np.float32  # NumPy's: |complex64| is float32
    # float32 against float64, where |z|^2 + 3w nearly cancels too: a few ulps of the values' scale
    np.testing.assert_allclose(got.compute(), want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
    doubled = fused_elementwise("z * 2 - 1", {"z": z}).compute()  # complex stays complex
    assert doubled.dtype == np.complex64
    np.testing.assert_allclose(doubled, zn.astype(np.complex128) * 2 - 1, rtol=1e-6)


def test_expr_op_is_registered(rng):
    from flowgpu.ops import get

    op = get("expr")
    assert op.kind == "elementwise" and op.inputs == ("**",)
    xn, yn = rng.random(64), rng.random(64)
    out = op("hypot(a, b) * k", a=da.from_array(xn, chunks=16), b=da.from_array(yn, chunks=16), k=2)
    np.testing.assert_allclose(out.compute(), np.hypot(xn, yn) * 2)


# ----------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", [None, "sum", "mean", "min", "max"])
def test_gpu_chain_matches_reference(rng, reduction):
    import cupy as cp

    xn = rng.random((2048, 1500), dtype=np.float32)
    x = da.from_array(cp.asarray(xn), chunks=(1024, 750))
    out = fused_elementwise(CHAIN, {"x": x}, reduction=reduction)
    got = out.compute()
    assert isinstance(got, cp.ndarray) and got.dtype == np.float32
    want = ref(CHAIN, {"x": xn})
    if reduction:
        want = getattr(np, reduction)(want)
    assert rel_err(cp.asnumpy(got), want) < 1e-6


@pytest.mark.gpu
def test_gpu_large_flat_reduction_and_tail(rng):
    import cupy as cp

    n = 3 * chunk._ROW * 5 + 12345  # rows of _ROW plus a tail
    xn = rng.random(n, dtype=np.float32)
    got = fused_elementwise(CHAIN, {"x": da.from_array(cp.asarray(xn), chunks=n // 2 + 1)}, reduction="sum")
    assert rel_err(float(got.compute()), ref(CHAIN, {"x": xn}).sum()) < 1e-6


@pytest.mark.gpu
def test_gpu_transposed_input_sum(rng):
    import cupy as cp

    xn = rng.random((1000, 1000), dtype=np.float32)
    x = da.from_array(cp.asarray(xn), chunks=300)
    got = fused_elementwise("a + b", {"a": x, "b": x.T}, reduction="sum").compute()
    assert rel_err(float(got), (xn.astype(np.float64) + xn.T).sum()) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_gpu_functions_match_numpy(rng, dtype):
    import cupy as cp

    xn = (rng.random(4096) * 8 - 4).astype(dtype)
    yn = (rng.random(4096) * 8 + 1).astype(dtype)
    texts = ["x // y + x % y - maximum(x, y) + where(x > 0, x, y) + abs(x) + sign(x) + clip(x, -2, 2)",
             "sqrt(abs(x)) + exp(x / 4) + log1p(abs(y)) + arctan2(x, y) + hypot(x, y) + x ** 2 + y ** 0.5"]
    env = {"x": da.from_array(cp.asarray(xn), chunks=1000), "y": da.from_array(cp.asarray(yn), chunks=1000)}
    for text in texts:
        with np.errstate(all="ignore"):
            want = parse(text).evaluate({"x": xn, "y": yn}, np)
        out = fused_elementwise(text, env)
        assert out.dtype == want.dtype
        np.testing.assert_allclose(cp.asnumpy(out.compute()), want, rtol=2e-6 if dtype == "float32" else 1e-12,
                                   err_msg=text)


@pytest.mark.parametrize("reduction", ["sum", "mean", "min", "max"])
def test_strided_column_chunks(rng, reduction):
    xn = rng.random((64, 300), dtype=np.float32) + 0.5
    x = da.from_array(xn, chunks=(64, 70))  # column blocks of a row-major array are not contiguous
    got = fused_elementwise(CHAIN, {"x": x}, reduction=reduction).compute()
    want = getattr(np, reduction)(ref(CHAIN, {"x": xn}))
    assert rel_err(got, want) < 1e-6


@pytest.mark.parametrize("reduction", ["sum", "max"])
def test_cpu_transposed_and_strided_inputs_together(rng, reduction):
    """Rows of a column block are contiguous, rows of a transposed block are not: both reduce right."""
    xn = rng.standard_normal((90, 90))
    x = da.from_array(xn, chunks=(90, 40))
    got = fused_elementwise("a * 2 - b", {"a": x, "b": x.T}, reduction=reduction).compute()
    want = getattr(np, reduction)(xn * 2 - xn.T)
    if reduction == "sum":  # it may nearly cancel: its rounding follows the size of the terms
        assert_within_terms(got, want, np.abs(xn * 2).sum() + np.abs(xn).sum(), xn.size)
    else:
        assert got == want


def test_full_reduction_combines_partials_in_one_step(rng):
    """Each task costs a scheduler round trip on a cluster: 64 chunks reduce in 64 + a few tasks, not a tree."""
    data = rng.standard_normal((64 * 50, 300)).astype(np.float32)
    x = da.from_array(data, chunks=(50, 300))
    total = fused_elementwise("(x * 2 + 1) ** 2 - x", {"x": x}, reduction="sum")
    ref = ((data.astype(np.float64) * 2 + 1) ** 2 - data).sum()
    assert abs(float(total.compute()) - ref) / abs(ref) < 1e-6
    graph = total.__dask_optimize__(total.__dask_graph__(), total.__dask_keys__())
    tasks = len(graph) - 64  # less the input chunks
    assert tasks == 64 + 1, tasks


@pytest.mark.parametrize("reduction", ["sum", "mean", "min", "max", "prod"])
@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_full_reduction_one_combine_task_dtypes_and_shapes(rng, reduction, dtype, keepdims):
    data = (rng.integers(1, 4, (30, 20)) if dtype == "int32" else rng.random((30, 20)) + 0.5).astype(dtype)
    x = da.from_array(data, chunks=(7, 6))
    out = fused_elementwise("x * 1", {"x": x}, reduction=reduction, keepdims=keepdims)
    if reduction == "prod":
        data = data[:3]  # keep the product in range
        x = da.from_array(data, chunks=(2, 6))
        out = fused_elementwise("x * 1", {"x": x}, reduction=reduction, keepdims=keepdims)
    want = getattr(np, reduction)(data, keepdims=keepdims)
    got = out.compute()
    assert out.dtype == want.dtype and got.dtype == want.dtype
    assert out.shape == want.shape == np.shape(got)
    np.testing.assert_allclose(got, want, rtol=1e-6)
