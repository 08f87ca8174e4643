"""Bugs 3, 6 and 7 of issue 16, each proven on fresh random data against NumPy and dask."""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu import pipeline
from flowgpu.errors import FlowgpuError, KernelError, SpecError
from flowgpu.fusion import fused_elementwise, fusing
from flowgpu.fusion.chunk import FusedChunk
from flowgpu.fusion.language import parse


def _fused_layers(arr):
    return [layer for layer in arr.__dask_graph__().layers.values()
            if isinstance(getattr(getattr(layer, "task", None), "func", None), FusedChunk)]


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12)


# -- bug 3: chains over dtypes no kernel takes are computed as dask built them ------------------------

def _complex(rng, shape):
    return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)


@pytest.mark.timeout(60)
def test_complex_chains_under_fusing_match_dask(rng):
    """Bug 3: a chain over complex arrays raised KernelError under fusing(); now dask's own values."""
    zn, wn = _complex(rng, (30, 20)), rng.random((30, 20))
    z, w = da.from_array(zn, chunks=(7, 9)), da.from_array(wn, chunks=(7, 9))
    exprs = [lambda a, b: (a * 2 + 1) ** 2 - a,  # complex in, complex out
             lambda a, b: abs(a) * b + 1,  # complex in, float out
             lambda a, b: np.sqrt(a * b) + np.exp(-a)]
    for f in exprs:
        want = f(zn, wn)
        with fusing():
            got = f(z, w).compute(scheduler="sync")
        _same(got, want)
        _same(fg.optimize(f(z, w)).compute(scheduler="sync"), want)
    with fusing():
        total = ((z * 2 + 1) ** 2 - z).sum().compute(scheduler="sync")
    np.testing.assert_allclose(total, ((zn * 2 + 1) ** 2 - zn).sum(), rtol=1e-10)


@pytest.mark.timeout(60)
def test_datetime_and_object_chains_under_fusing_match_dask(rng):
    """Bug 3: datetime and object chains under fusing() compute as dask does, not KernelError."""
    start = np.datetime64("2020-01-01T00:00:00")
    tn = start + rng.integers(0, 10**6, 50).astype("timedelta64[s]")
    un = start + rng.integers(0, 10**6, 50).astype("timedelta64[s]")
    t, u = da.from_array(tn, chunks=13), da.from_array(un, chunks=13)
    with fusing():
        got = (abs(t - u) > (u - t)).compute(scheduler="sync")
        lag = abs(t - u).compute(scheduler="sync")
    assert got.dtype == bool and (got == (abs(tn - un) > (un - tn))).all()
    assert lag.dtype == np.dtype("timedelta64[s]") and (lag == abs(tn - un)).all()
    on = np.array([int(v) for v in rng.integers(-1000, 1000, 40)], dtype=object)
    o = da.from_array(on, chunks=9)
    with fusing():
        got = ((o + 1) * 3 - o).compute(scheduler="sync")
    assert got.dtype == object and list(got) == list((on + 1) * 3 - on)


@pytest.mark.timeout(120)
def test_lstsq_of_complex_matrices_under_fusing(rng):
    """Bug 3: the cause of dask's own test_linalg::test_lstsq failing under fusing()."""
    an, bn = _complex(rng, (100, 10)), _complex(rng, 100)
    a, b = da.from_array(an, chunks=(10, 10)), da.from_array(bn, chunks=10)
    with fusing():
        x, res, rank, sv = dask_values = da.linalg.lstsq(a, b)
        x, res, rank, sv = da.compute(*dask_values, scheduler="sync")
    xn, resn, rankn, svn = np.linalg.lstsq(an, bn, rcond=-1)
    np.testing.assert_allclose(x, xn, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(res, resn, rtol=1e-8)
    assert rank == rankn
    np.testing.assert_allclose(sv, svn, rtol=1e-8)


@pytest.mark.timeout(60)
def test_fuse_on_complex_inputs_falls_back_to_dask(rng):
    """Bug 3: fg.fuse on complex inputs gives dask's values (with a warning), never a KernelError."""
    zn = _complex(rng, 64)
    z = da.from_array(zn, chunks=16)
    with pytest.warns(RuntimeWarning, match="complex128"):
        got = fg.fuse(lambda a: (a * 2 + 1) ** 2 - a)(z).compute(scheduler="sync")
    _same(got, (zn * 2 + 1) ** 2 - zn)
    with pytest.warns(RuntimeWarning, match="complex128"):
        total = fg.fuse(lambda a: abs(a - 1).max())(z).compute(scheduler="sync")
    assert total == np.abs(zn - 1).max()


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_gpu_complex_chain_under_fusing(rng):
    """Bug 3 on CuPy chunks: a complex chain under fusing() gives CuPy's unfused values."""
    import cupy as cp

    zn = _complex(rng, (40, 30))
    z = da.from_array(cp.asarray(zn), chunks=(10, 15), asarray=False)
    with fusing():
        got = ((z * 2 + 1) ** 2 - abs(z)).compute(scheduler="sync")
    assert isinstance(got, cp.ndarray)
    _same(cp.asnumpy(got), (zn * 2 + 1) ** 2 - abs(zn))


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
        np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "float32" else 1e-12, err_msg=red)


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


# -- bug 7: the expression parser is bounded: no hang, no RecursionError ------------------------------

@pytest.mark.timeout(120)
def test_huge_constant_powers_are_refused_not_computed(rng):
    """Bug 7: `x + 9 ** 9 ** 9` hung folding the constant; now one clear KernelError, at once."""
    for text in ("x + 9 ** 9 ** 9", "x * (-7) ** 10 ** 8", "2 ** 2 ** 40 < x"):
        with pytest.raises(KernelError, match="digits") as e:
            parse(text)
        assert isinstance(e.value, FlowgpuError) and "column" in str(e.value)
    xn = rng.random(10)
    x = da.from_array(xn, chunks=5)
    with pytest.raises(KernelError, match="digits"):  # the same bound when the numbers are inputs
        fused_elementwise("x + k ** m", {"x": x, "k": 9, "m": 9 ** 9})
    # powers of a sensible size still fold, exactly
    assert parse("2 ** 100 + x").root.left.value == 2 ** 100
    got = fused_elementwise("x * 3 ** 4 + 2 ** -2", {"x": x}).compute(scheduler="sync")
    np.testing.assert_allclose(got, xn * 81 + 0.25, rtol=1e-15)


@pytest.mark.timeout(120)
def test_deep_comparison_chains_are_refused_clearly(rng):
    """Bug 7: a long chain `x < x < ...` (each comparison one level of &) leaked RecursionError."""
    x = da.from_array(rng.random(10), chunks=5)
    for n in (400, 5000):
        with pytest.raises(KernelError, match="nests more than"):
            fused_elementwise("x" + " < x" * n, {"x": x})
    got = fused_elementwise("x" + " <= x" * 20, {"x": x}).compute(scheduler="sync")
    assert got.all()


@pytest.mark.timeout(60)
def test_pipeline_reports_bad_expressions_as_spec_errors(tmp_path, rng):
    """Bug 7: the pipeline's `expr` step reports a huge power or a deep chain at the step's place."""
    np.save(tmp_path / "x.npy", rng.random(8))
    for text in ("u + 9 ** 9 ** 9", "u" + " < u" * 400):
        spec = {"inputs": {"x": {"source": "npy", "path": str(tmp_path / "x.npy")}},
                "steps": {"g": {"op": "expr", "inputs": {"u": "x"}, "args": {"expression": text}}},
                "outputs": {"g": {"from": "g"}}}
        with pytest.raises(SpecError) as e:
            pipeline.compile(spec)
        assert e.value.path == "steps.g"
        assert "digits" in str(e.value) or "nests more than" in str(e.value)


@pytest.mark.timeout(120)
def test_long_chains_fuse_in_segments(rng):
    """Bug 7 (and 3): a chain of hundreds of ops under fusing() raised KernelError at compute (and
    RecursionError past ~1000); now it is cut into kernels; fg.fuse of one falls back to dask."""
    xn = rng.random(12)
    x = da.from_array(xn, chunks=4)
    for n in (300, 2000):
        y, want = x, xn
        for i in range(n):
            y, want = y * 0.999 + i % 3, want * 0.999 + i % 3
        with fusing():
            got = y.compute(scheduler="sync")
        np.testing.assert_allclose(got, want, rtol=1e-12)
        o = fg.optimize(y)
        assert 2 * n // 32 <= len(_fused_layers(o)) <= 2 * n // 31 + 1
        np.testing.assert_allclose(o.compute(scheduler="sync"), want, rtol=1e-12)

    def chain(a):
        for i in range(300):
            a = a * 0.999 + i % 3
        return a

    with pytest.warns(RuntimeWarning, match="nests more than|too many nested parentheses"):
        got = fg.fuse(chain)(x).compute(scheduler="sync")
    np.testing.assert_allclose(got, chain(xn), rtol=1e-12)
