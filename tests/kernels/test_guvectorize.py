"""@flowgpu.guvectorize: generalised ufuncs over the core dimensions of chunked arrays."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import flowgpu
from flowgpu.errors import KernelError
from flowgpu.kernels.guvectorize import CoreRechunkWarning, parse_layout
from tests.tolerance import assert_within_terms


@flowgpu.guvectorize(["void(float32[:], float32[:], float32[:])",
                      "void(float64[:], float64[:], float64[:])"], "(n),(n)->()")
def dot(a, b, res):
    """Inner product over the last axis."""
    acc = 0.0
    for i in range(a.shape[0]):
        acc += a[i] * b[i]
    res[0] = acc


@flowgpu.guvectorize(["void(float64[:], float64[:], float64[:])"], "(n)->(),()")
def min_max(a, lo, hi):
    lo[0] = a[0]
    hi[0] = a[0]
    for i in range(1, a.shape[0]):
        lo[0] = min(lo[0], a[i])
        hi[0] = max(hi[0], a[i])


def test_dot_over_loop_dimensions_matches_numpy(rng):
    a = rng.standard_normal((7, 130, 64))
    b = rng.standard_normal(64)
    out = dot(da.from_array(a, chunks=(3, 50, 64)), da.from_array(b, chunks=64))
    assert out.shape == (7, 130) and out.dtype == np.float64
    # 64 products summed: within 64 epsilons of |a| @ |b| (a relative bound failed where they cancelled)
    assert_within_terms(out.compute(), a @ b, np.abs(a) @ np.abs(b), 64)


def test_float32_signature_chosen_for_float32_inputs(rng):
    a = rng.random((90, 33), dtype=np.float32)
    b = rng.random((90, 33), dtype=np.float32)
    out = dot(da.from_array(a, chunks=(40, 33)), da.from_array(b, chunks=(40, 33)))
    assert out.dtype == np.float32
    want = np.einsum("ij,ij->i", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out.compute(), want, rtol=1e-5)


def test_split_core_dimension_is_rechunked_with_a_warning(rng):
    a = rng.random((60, 80))
    b = rng.random((60, 80))
    x, y = da.from_array(a, chunks=(20, 30)), da.from_array(b, chunks=(30, 80))
    with pytest.warns(CoreRechunkWarning, match=r"input 0 has its core dimension\(s\) n \(axis 1\) split"):
        out = dot(x, y)
    np.testing.assert_allclose(out.compute(), np.einsum("ij,ij->i", a, b), rtol=1e-12)


def test_split_core_dimension_refused_when_rechunk_false(rng):
    x = da.from_array(rng.random((60, 80)), chunks=(20, 30))
    with pytest.raises(KernelError, match=r"split across chunks; rechunk it first, e\.g\. x\.rechunk\(\{1: -1\}\)"):
        dot(x, x, rechunk=False)

    @flowgpu.guvectorize(["void(float64[:], float64[:])"], "(n)->()", rechunk=False)
    def total(a, res):
        res[0] = a.sum()

    with pytest.raises(KernelError, match="split across chunks"):
        total(x)
    np.testing.assert_allclose(total(x.rechunk({1: -1})).compute(), x.compute().sum(axis=1))


def test_several_outputs(rng):
    a = rng.standard_normal((45, 17))
    lo, hi = min_max(da.from_array(a, chunks=(10, 17)))
    np.testing.assert_array_equal(lo.compute(), a.min(axis=1))
    np.testing.assert_array_equal(hi.compute(), a.max(axis=1))


def test_output_dimension_sized_by_an_input(rng):
    @flowgpu.guvectorize(["void(float64[:], float64[:], float64[:])"], "(n),(k)->(k)")
    def ends(a, like, res):
        res[0] = a[0]
        res[1] = a[a.shape[0] - 1]

    a = rng.random((33, 9))
    out = ends(da.from_array(a, chunks=(10, 9)), np.empty(2))
    assert out.shape == (33, 2)
    np.testing.assert_array_equal(out.compute(), a[:, [0, -1]])


def test_plain_numpy_arrays(rng):
    a, b = rng.random((4, 6)), rng.random(6)
    np.testing.assert_allclose(dot(a, b), a @ b)
    with pytest.raises(KernelError, match="core dimension 'n' is 6 in one input and 5 in input 1"):
        dot(a, rng.random(5))


def test_mismatched_core_lengths_of_dask_arrays_are_said_as_for_numpy(rng):
    """Dask inputs gave dask's 'Chunks do not add up to shape' from unifying their chunks."""
    a, b = da.from_array(rng.random((8, 6)), chunks=(4, 6)), da.from_array(rng.random((8, 4)), chunks=(4, 4))
    with pytest.raises(KernelError, match="core dimension 'n' is 6 in one input and 4 in input 1"):
        dot(a, b)


@pytest.mark.parametrize("layout", ["(n),(n)", "n->m", "(n,)->(1)"])
def test_bad_layouts(layout):
    with pytest.raises(KernelError, match="is not a gufunc signature"):
        parse_layout(layout)


def test_signature_and_layout_must_agree():
    with pytest.raises(KernelError, match="has 1 inputs but layout"):
        flowgpu.guvectorize(["void(float64[:], float64[:])"], "(n),(n)->()")(lambda a, b, r: None)
    with pytest.raises(KernelError, match="give numba signatures"):
        flowgpu.guvectorize([], "(n)->()")(lambda a, r: None)
    with pytest.raises(KernelError, match="output dimension\\(s\\) k appear in no input"):
        flowgpu.guvectorize(["void(float64[:], float64[:])"], "(n)->(k)")(lambda a, r: None)


def test_python_signature_hides_outputs():
    assert list(dot.__signature__.parameters) == ["a", "b"]
    assert dot.__doc__ == "Inner product over the last axis."


# -- GPU: numba-cuda gufuncs on CuPy chunks --------------------------------------------------------
@pytest.mark.gpu
def test_gpu_dot_on_cupy_chunks(rng):
    import cupy as cp

    a = rng.standard_normal((5, 300, 128)).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    x = da.from_array(cp.asarray(a), chunks=(2, 100, 128), asarray=False)
    y = da.from_array(cp.asarray(b), chunks=128, asarray=False)
    out = dot(x, y)
    assert out.dtype == np.float32
    got = out.compute()
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(got.get(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpu_several_outputs_and_rechunk(rng):
    import cupy as cp

    a = rng.standard_normal((70, 40))
    x = da.from_array(cp.asarray(a), chunks=(20, 15), asarray=False)
    with pytest.warns(CoreRechunkWarning):
        lo, hi = min_max(x)
    np.testing.assert_array_equal(lo.compute().get(), a.min(axis=1))
    np.testing.assert_array_equal(hi.compute().get(), a.max(axis=1))
