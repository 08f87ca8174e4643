"""dlpack_map: per-chunk PyTorch / JAX functions fed through DLPack, without copies."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import flowgpu
from flowgpu.errors import KernelError
from flowgpu.kernels.dlpack import DLPackFunction


def test_array_framework_round_trips_numpy_chunks(rng):
    a = rng.standard_normal((130, 70))
    b = rng.standard_normal(70)
    out = flowgpu.dlpack_map(lambda x, y: x * y - 1, da.from_array(a, chunks=(50, 70)), b,
                             framework="array")
    assert isinstance(out, da.Array) and out.dtype == np.float64
    np.testing.assert_allclose(out.compute(), a * b - 1)


def test_decorator_form_and_keyword_arguments(rng):
    @flowgpu.dlpack_map(framework="array")
    def scaled(x, factor=1.0):
        """x times factor"""
        return x * factor

    assert isinstance(scaled, DLPackFunction) and scaled.__doc__ == "x times factor"
    a = rng.random((40, 30), dtype=np.float32)
    out = scaled(da.from_array(a, chunks=16), factor=3.0)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.compute(), a * 3.0, rtol=1e-6)


def test_unknown_framework_and_tuple_results(rng):
    with pytest.raises(KernelError, match="framework='tensorflow'.*torch, jax, array"):
        flowgpu.dlpack_map(lambda t: t, framework="tensorflow")
    with pytest.raises(KernelError, match="return one tensor per chunk"):
        flowgpu.dlpack_map(lambda t: (t, t), rng.random(4), framework="array")


def test_shape_changing_function_with_map_blocks_arguments(rng):
    a = rng.random((60, 20))
    out = flowgpu.dlpack_map(lambda x: x.sum(axis=1), da.from_array(a, chunks=(25, 20)),
                             framework="array", drop_axis=1)
    assert out.shape == (60,)
    np.testing.assert_allclose(out.compute(), a.sum(axis=1))


# -- PyTorch on the CPU -----------------------------------------------------------------------------
def test_torch_cpu_chunks_match_numpy(rng):
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((257, 64)).astype(np.float32)
    out = flowgpu.dlpack_map(lambda t: torch.nn.functional.gelu(t) * 2,
                             da.from_array(a, chunks=(100, 64)), framework="torch")
    assert out.dtype == np.float32
    got = out.compute()
    x = torch.from_numpy(a.astype(np.float64))
    np.testing.assert_allclose(got, (torch.nn.functional.gelu(x) * 2).numpy(), rtol=1e-5, atol=1e-6)


def test_torch_dtype_inferred_from_the_function(rng):
    pytest.importorskip("torch")
    a = rng.random(100)
    out = flowgpu.dlpack_map(lambda t: t > 0.5, da.from_array(a, chunks=30), framework="torch")
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out.compute(), a > 0.5)


def test_torch_receives_and_returns_the_same_memory(rng):
    pytest.importorskip("torch")
    seen = []

    def double_in_place(t):
        seen.append(t.data_ptr())
        return t.mul_(2)

    a = rng.random(1000)
    want = a * 2
    out = flowgpu.dlpack_map(double_in_place, a, framework="torch")
    assert seen == [a.ctypes.data]                 # no copy on the way in
    assert out.ctypes.data == a.ctypes.data        # nor on the way out
    np.testing.assert_array_equal(out, want)


def test_torch_results_that_require_grad_are_detached(rng):
    torch = pytest.importorskip("torch")
    w = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
    a = rng.random((20, 10))
    out = flowgpu.dlpack_map(lambda t: t * w, da.from_array(a, chunks=10), framework="torch")
    np.testing.assert_allclose(out.compute(), a * 3.0)


def test_jax_cpu_chunks(rng):
    jnp = pytest.importorskip("jax.numpy")
    a = rng.random((50, 8), dtype=np.float32)
    out = flowgpu.dlpack_map(lambda t: jnp.sin(t) + 1, da.from_array(a, chunks=(20, 8)), framework="jax")
    np.testing.assert_allclose(out.compute(), np.sin(a) + 1, rtol=1e-6)


# -- GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_torch_zero_copy_on_cupy_chunks(rng):
    torch = pytest.importorskip("torch")
    import cupy as cp

    seen = []

    def double_in_place(t):
        assert t.is_cuda
        seen.append(t.data_ptr())
        return t.mul_(2)

    x = cp.asarray(rng.random(10_000, dtype=np.float32))
    ptr = x.data.ptr
    want = x.get() * 2
    out = flowgpu.dlpack_map(double_in_place, x, framework="torch")
    assert isinstance(out, cp.ndarray)
    assert seen == [ptr] and out.data.ptr == ptr
    np.testing.assert_array_equal(out.get(), want)


@pytest.mark.gpu
def test_gpu_torch_on_chunked_cupy_array(rng):
    torch = pytest.importorskip("torch")
    import cupy as cp

    a = rng.standard_normal((3000, 256)).astype(np.float32)
    x = da.from_array(cp.asarray(a), chunks=(1000, 256), asarray=False)
    out = flowgpu.dlpack_map(lambda t: torch.relu(t) @ torch.ones(256, 4, device=t.device),
                             x, framework="torch", chunks=((1000,) * 3, (4,)))
    got = out.compute()
    assert isinstance(got, cp.ndarray) and got.shape == (3000, 4)
    np.testing.assert_allclose(got.get(), np.maximum(a, 0) @ np.ones((256, 4), np.float32), rtol=1e-4)


@pytest.mark.gpu
def test_gpu_jax_on_cupy_chunks(rng):
    jnp = pytest.importorskip("jax.numpy")
    import cupy as cp

    a = rng.random((400, 64), dtype=np.float32)
    x = da.from_array(cp.asarray(a), chunks=(100, 64), asarray=False)
    got = flowgpu.dlpack_map(lambda t: jnp.tanh(t) * 2, x, framework="jax").compute()
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(got.get(), np.tanh(a) * 2, rtol=1e-5)
