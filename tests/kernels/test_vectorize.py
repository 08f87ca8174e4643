"""@flowgpu.vectorize: a scalar function as a ufunc over chunked arrays, with NumPy's rules."""

from __future__ import annotations

import uuid

import dask
import dask.array as da
import numpy as np
import pytest

import flowgpu
from flowgpu.errors import KernelError
from flowgpu.kernels import _numba
from flowgpu.kernels.vectorize import Vectorized


@flowgpu.vectorize(["float32(float32, float32)", "float64(float64, float64)"])
def mul_add(a, b):
    """a * b + 1"""
    return a * b + 1


def test_chunked_float32_matches_float64_reference(rng):
    a = rng.standard_normal((301, 205)).astype(np.float32)
    b = rng.standard_normal((301, 205)).astype(np.float32)
    out = mul_add(da.from_array(a, chunks=(100, 64)), da.from_array(b, chunks=(75, 205)))
    assert isinstance(out, da.Array) and out.dtype == np.float32
    got = out.compute()
    assert got.dtype == np.float32 and got.shape == a.shape
    want = a.astype(np.float64) * b + 1
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape_b", [(205,), (301, 1), (1, 205), ()])
def test_broadcasts_like_numpy(rng, shape_b):
    a = rng.random((301, 205))
    b = rng.random(shape_b)
    db = da.from_array(b, chunks=-1) if b.ndim else b
    got = mul_add(da.from_array(a, chunks=(64, 100)), db).compute()
    np.testing.assert_allclose(got, a * b + 1, rtol=1e-12)


def test_broadcasts_numpy_and_python_scalars_into_dask(rng):
    a = rng.random((40, 30))
    row = rng.random(30)
    got = mul_add(da.from_array(a, chunks=(16, 30)), row).compute()
    np.testing.assert_allclose(got, a * row + 1)
    got = mul_add(2.5, da.from_array(a, chunks=7)).compute()
    np.testing.assert_allclose(got, 2.5 * a + 1)


@pytest.mark.parametrize("da_dtype, db_dtype, want", [
    ("float32", "float32", "float32"),
    ("int16", "float32", "float32"),      # int16 -> float32 is safe
    ("int32", "float32", "float64"),      # int32 -> float32 is not: next signature
    ("float32", "float64", "float64"),
    ("uint8", "bool", "float32"),
])
def test_picks_first_signature_inputs_cast_to_safely(rng, da_dtype, db_dtype, want):
    a = (rng.random(50) * 100).astype(da_dtype)
    b = (rng.random(50) * 100).astype(db_dtype)
    out = mul_add(da.from_array(a, chunks=20), da.from_array(b, chunks=20))
    assert out.dtype == np.dtype(want)
    got = out.compute()
    assert got.dtype == np.dtype(want)
    np.testing.assert_allclose(got, a.astype(want) * b.astype(want) + 1, rtol=1e-6)


def test_python_scalars_are_weak_like_numpy2(rng):
    a = rng.random(30, dtype=np.float32)
    assert mul_add(da.from_array(a, chunks=10), 2.0).dtype == np.float32
    assert mul_add(a, 3).dtype == np.float32
    # a NumPy float64 scalar is strong, as in NumPy
    assert mul_add(da.from_array(a, chunks=10), np.float64(2.0)).dtype == np.float64


def test_no_signature_fits_says_which_types(rng):
    z = (rng.random(8) + 1j * rng.random(8)).astype(np.complex64)
    with pytest.raises(KernelError, match=r"mul_add: no signature accepts inputs \(complex64, float\).*astype"):
        mul_add(da.from_array(z, chunks=4), 1.0)


def test_plain_numpy_arrays_and_scalars_compute_at_once(rng):
    a, b = rng.random((5, 4)), rng.random(4)
    got = mul_add(a, b)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, a * b + 1)
    x, y = rng.random(), rng.random()
    assert mul_add(x, y) == pytest.approx(x * y + 1)


def test_lazy_compiles_per_input_dtypes(rng):
    @flowgpu.vectorize
    def clipped_diff(a, b):
        d = a - b
        return d if d > 0 else 0

    a = rng.integers(-50, 50, 60).astype(np.int32)
    b = rng.integers(-50, 50, 60).astype(np.int32)
    out = clipped_diff(da.from_array(a, chunks=25), da.from_array(b, chunks=25))
    assert out.dtype.kind == "i"
    np.testing.assert_array_equal(out.compute(), np.maximum(a - b, 0))
    # numba's typing decides the return: float32 or int 0 unify to float64
    f = rng.random(60, dtype=np.float32)
    out = clipped_diff(da.from_array(f, chunks=25), 0.5)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.compute(), np.maximum(f - np.float32(0.5), 0), rtol=1e-6)

    @flowgpu.vectorize
    def times(a, b):
        return a * b

    out = times(da.from_array(f, chunks=25), 0.5)
    assert out.dtype == np.float32  # the Python float takes the array's float32, as in NumPy 2
    np.testing.assert_allclose(out.compute(), f * np.float32(0.5), rtol=1e-6)


def test_wrong_number_of_inputs():
    with pytest.raises(KernelError, match=r"mul_add\(\) takes 2 inputs, got 3"):
        mul_add(1.0, 2.0, 3.0)


def test_shapes_that_do_not_broadcast(rng):
    with pytest.raises(KernelError, match="do not broadcast"):
        mul_add(da.from_array(rng.random((4, 3))), da.from_array(rng.random(5)))


def test_a_function_numba_cannot_compile_names_the_signature(rng):
    @flowgpu.vectorize(["float64(float64)"])
    def strange(a):
        return a.no_such_attribute

    with pytest.raises(KernelError, match=r"strange: numba could not compile it for the cpu target with "
                                          r"signature float64\(float64\)") as e:
        strange(rng.random(3))
    # numba's reason and the line, not only its "Failed in nopython mode pipeline" head
    assert "no_such_attribute" in str(e.value) and 'test_vectorize.py", line ' in str(e.value), str(e.value)


@pytest.mark.parametrize("sig, match", [
    ("float32(float32)", "has 1 inputs but mul2\\(\\) takes 2"),
    ("nonsense((", "is not a numba signature"),
    ("(float32, float32)", "has no return type"),
])
def test_bad_signatures_are_refused(sig, match):
    with pytest.raises(KernelError, match=match):
        @flowgpu.vectorize([sig])
        def mul2(a, b):
            return a * b


def test_compiles_once_per_process_and_signature(rng):
    @flowgpu.vectorize(["float64(float64)"])
    def cube(x):
        return x * x * x

    a = rng.random(1000)
    # in this process (a Session another test left open would otherwise compile on its workers)
    np.testing.assert_allclose(cube(da.from_array(a, chunks=50)).compute(scheduler="threads"), a ** 3)
    np.testing.assert_allclose(cube(da.from_array(a, chunks=70)).compute(scheduler="threads"), a ** 3)
    compiled = [k for k in _numba._cache if isinstance(k, tuple) and k[0] == cube._key]
    assert len(compiled) == 1  # 35 chunks, one compile


def test_is_a_vectorized_object_with_the_function_signature():
    assert isinstance(mul_add, Vectorized)
    assert list(mul_add.__signature__.parameters) == ["a", "b"]
    assert mul_add.__doc__ == "a * b + 1"
    assert "float32" in repr(mul_add)


def test_runs_on_a_cluster(cpu_session, rng):
    a = rng.random((200, 100), dtype=np.float32)
    b = rng.random(100, dtype=np.float32)
    out = mul_add(da.from_array(a, chunks=(50, 100)), da.from_array(b, chunks=100))
    got = cpu_session.client.compute(out).result()
    np.testing.assert_allclose(got, a.astype(np.float64) * b + 1, rtol=1e-6)


def test_registered_as_a_pipeline_op_and_used_from_yaml(rng):
    pipeline = pytest.importorskip("flowgpu.pipeline")
    name = f"mul_add_{uuid.uuid4().hex[:8]}"

    @flowgpu.op(name, kind="user")
    @flowgpu.vectorize(["float64(float64, float64)"])
    def step(a, b):
        return a * b + 1

    seed_x, seed_y = (int(s) for s in rng.integers(0, 2**31, 2))
    spec = pipeline.from_dict({
        "name": "vec",
        "inputs": {"x": {"source": "random", "shape": [120, 50], "seed": seed_x, "chunks": [40, 50]},
                   "y": {"source": "random", "shape": [120, 50], "seed": seed_y, "chunks": [40, 50]}},
        "steps": {"z": {"op": name, "inputs": ["x", "y"]}},
        "outputs": {"z": {"from": "z"}},
    })
    with dask.config.set({"array.backend": "numpy"}):
        got = pipeline.compile(spec).outputs["z"].compute()
        x = flowgpu.random((120, 50), seed=seed_x).compute()
        y = flowgpu.random((120, 50), seed=seed_y).compute()
    np.testing.assert_allclose(got, x * y + 1)


# -- GPU: numba-cuda on CuPy chunks ----------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_cupy_chunks_match_numpy(rng):
    import cupy as cp

    a = rng.standard_normal((1001, 257)).astype(np.float32)
    b = rng.standard_normal(257).astype(np.float32)
    x = da.from_array(cp.asarray(a), chunks=(300, 128), asarray=False)
    y = da.from_array(cp.asarray(b), chunks=128, asarray=False)
    out = mul_add(x, y)
    assert type(out._meta).__module__.startswith("cupy") and out.dtype == np.float32
    got = out.compute()
    assert isinstance(got, cp.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got.get(), a.astype(np.float64) * b + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_non_contiguous_chunks_scalars_and_dtype_selection(rng):
    import cupy as cp

    a = rng.standard_normal((300, 200))
    xt = da.from_array(cp.asarray(a), chunks=(100, 50), asarray=False).T  # F-ordered chunks
    got = mul_add(xt, 3.0).compute()
    assert got.dtype == np.float64
    # the GPU contracts x * 3 + 1 into one fused multiply-add: equal to the last bit or two, and
    # where the sum cancels towards 0 the relative difference grows, so bound it absolutely too
    np.testing.assert_allclose(got.get(), a.T * 3.0 + 1, rtol=1e-12, atol=1e-14 * np.abs(a).max())
    i16 = cp.asarray(rng.integers(-100, 100, 500).astype(np.int16))
    got = mul_add(i16, cp.float32(0.5))  # plain CuPy arrays compute at once, on the GPU
    assert isinstance(got, cp.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got.get(), i16.get() * 0.5 + 1, rtol=1e-6)


@pytest.mark.gpu
def test_gpu_lazy_signature_and_session(gpu_session, rng):
    import cupy as cp

    @flowgpu.vectorize
    def relu(x):
        return x if x > 0 else 0.0

    x = flowgpu.normal((2000, 500), dtype="float32", seed=int(rng.integers(2**31)), chunks=(500, 500))
    out = relu(x)
    got = gpu_session.client.compute(out).result()
    ref = x.compute()
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(got), np.maximum(cp.asnumpy(ref), 0), rtol=1e-6)
