"""Chains over dtypes no fused kernel takes (complex, datetime, object) compute as dask built them,
under ``fusing()``, ``fg.optimize`` and ``fg.fuse`` (bug 3 of issue 16), on fresh random data
against NumPy and dask."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import flowgpu as fg
from flowgpu.fusion import fusing


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
