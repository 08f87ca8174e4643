"""@flowgpu.kernel: raw CUDA kernels per chunk, their CPU counterparts, and GPU-only errors."""

from __future__ import annotations

import uuid

import dask
import dask.array as da
import numpy as np
import pytest

import flowgpu
from flowgpu.errors import KernelError
from flowgpu.kernels.raw import Kernel

MUL_SRC = r'''
extern "C" __global__ void mul(const float* a, const float* b, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * b[i];
}
'''

AXPY_SRC = r'''
extern "C" __global__ void axpy(const double* x, const double* y, double* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 2.0 * x[i] + y[i];
}
extern "C" __global__ void unused(double* out, long long n) {}
'''

mul = flowgpu.kernel(MUL_SRC, dtype="float32", cpu=np.multiply)
mul_gpu_only = flowgpu.kernel(MUL_SRC, dtype="float32")


@pytest.fixture
def cpu_backend():
    """Whatever sessions earlier tests opened, compute on NumPy here."""
    with dask.config.set({"array.backend": "numpy"}):
        yield


def test_cpu_counterpart_on_numpy_chunks(rng, cpu_backend):
    a = rng.standard_normal((301, 150)).astype(np.float32)
    b = rng.standard_normal((301, 150)).astype(np.float32)
    out = mul(da.from_array(a, chunks=(100, 64)), da.from_array(b, chunks=(100, 64)))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.compute(), a.astype(np.float64) * b, rtol=1e-6)


def test_inputs_broadcast_and_cast_to_the_kernel_dtype(rng, cpu_backend):
    a = rng.standard_normal((40, 30))            # float64 in, float32 out
    row = rng.standard_normal(30).astype(np.float32)
    out = mul(da.from_array(a, chunks=(16, 30)), row)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.compute(), (a * row).astype(np.float32), rtol=1e-6)


def test_inputs_that_do_not_broadcast_are_refused_when_the_graph_is_built(rng, cpu_backend):
    a = da.from_array(rng.standard_normal((40, 30)), chunks=(16, 30))
    with pytest.raises(KernelError, match=r"kernel 'mul': input shapes \(40, 30\), \(7,\) do not broadcast"):
        mul(a, da.from_array(rng.standard_normal(7)))


def test_gpu_only_kernel_on_a_cpu_session_says_what_to_do(rng, cpu_backend):
    x = da.from_array(rng.random(100, dtype=np.float32), chunks=50)
    with pytest.raises(KernelError) as info:
        mul_gpu_only(x, x)
    msg = str(info.value)
    assert "'mul' is GPU-only" in msg
    assert "cpu=" in msg and "Session(backend='gpu')" in msg
    assert mul_gpu_only.gpu_only and not mul.gpu_only
    with pytest.raises(KernelError, match="GPU-only"):
        mul_gpu_only(rng.random(4, dtype=np.float32), rng.random(4, dtype=np.float32))


def test_kernel_name_found_in_source_or_required():
    assert mul.kernel_name == "mul"
    with pytest.raises(KernelError, match="2 __global__ function"):
        flowgpu.kernel(AXPY_SRC)
    assert flowgpu.kernel(AXPY_SRC, name="axpy", cpu=lambda x, y: 2 * x + y).kernel_name == "axpy"
    with pytest.raises(KernelError, match="no __global__ function 'axpx'"):
        flowgpu.kernel(AXPY_SRC, name="axpx")
    with pytest.raises(KernelError, match="give CUDA C source"):
        flowgpu.kernel(42)
    with pytest.raises(KernelError, match="threads per block"):
        flowgpu.kernel(MUL_SRC, block=4096)
    with pytest.raises(KernelError, match="kernel dtype='floot32' is not a dtype"):  # was NumPy's bare TypeError
        flowgpu.kernel(MUL_SRC, dtype="floot32", cpu=np.multiply)


def test_numba_cuda_jit_kernel_with_cpu_counterpart(rng, cpu_backend):
    from numba import cuda

    @flowgpu.kernel(cpu=lambda x, y: 2 * x + y)
    @cuda.jit
    def axpy(x, y, out, n):
        i = cuda.grid(1)
        if i < n:
            out[i] = 2 * x[i] + y[i]

    assert isinstance(axpy, Kernel) and list(axpy.__signature__.parameters) == ["x", "y"]
    x, y = rng.random((50, 20)), rng.random((50, 20))
    got = axpy(da.from_array(x, chunks=(20, 20)), da.from_array(y, chunks=(20, 20))).compute()
    np.testing.assert_allclose(got, 2 * x + y)
    # shipped to a worker it leaves the dispatcher behind and re-jits its Python function there
    import cloudpickle

    shipped = cloudpickle.loads(cloudpickle.dumps(axpy))
    assert shipped._dispatcher is None and shipped.jit_options == axpy.jit_options
    np.testing.assert_allclose(shipped(x, y), 2 * x + y)


def test_plain_python_function_kernel_without_cpu_is_gpu_only(rng, cpu_backend):
    @flowgpu.kernel
    def negate(x, out, n):
        pass

    assert negate.gpu_only and "numba.cuda" in repr(negate)
    with pytest.raises(KernelError, match="'negate' is GPU-only"):
        negate(da.from_array(rng.random(10), chunks=5))


def test_cpu_counterpart_returning_the_wrong_shape(rng, cpu_backend):
    bad = flowgpu.kernel(MUL_SRC, cpu=lambda a, b: (a * b).sum())
    with pytest.raises(KernelError, match=r"cpu= function returned shape \(\)"):
        bad(da.from_array(rng.random(10), chunks=5), 2.0).compute()


def test_registered_as_a_pipeline_op(rng, cpu_backend):
    pipeline = pytest.importorskip("flowgpu.pipeline")
    name = f"mul_{uuid.uuid4().hex[:8]}"
    flowgpu.op(name, kind="user")(flowgpu.kernel(MUL_SRC, dtype="float32", cpu=np.multiply))
    seed = int(rng.integers(2**31))
    spec = pipeline.from_dict({
        "name": "raw",
        "inputs": {"x": {"source": "random", "shape": [64, 32], "dtype": "float32", "seed": seed,
                         "chunks": [32, 32]}},
        "steps": {"sq": {"op": name, "inputs": ["x", "x"]}},
        "outputs": {"sq": {"from": "sq"}},
    })
    got = pipeline.compile(spec).outputs["sq"].compute()
    x = flowgpu.random((64, 32), dtype="float32", seed=seed).compute()
    np.testing.assert_allclose(got, x * x, rtol=1e-6)


# -- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_raw_kernel_on_cupy_chunks(rng):
    import cupy as cp

    a = rng.standard_normal((1000, 300)).astype(np.float32)
    b = rng.standard_normal(300)  # float64, broadcast: cast to float32 for the kernel
    x = da.from_array(cp.asarray(a), chunks=(256, 128), asarray=False)
    out = mul_gpu_only(x, cp.asarray(b))
    got = out.compute()
    assert isinstance(got, cp.ndarray) and got.dtype == np.float32
    np.testing.assert_allclose(got.get(), a * b.astype(np.float32), rtol=1e-6)
    # non-contiguous chunks (a transpose) go through a contiguous copy
    got = mul_gpu_only(x.T, x.T).compute().get()
    np.testing.assert_allclose(got, a.T * a.T, rtol=1e-6)


@pytest.mark.gpu
def test_gpu_numba_cuda_jit_kernel(rng):
    import cupy as cp
    from numba import cuda

    @flowgpu.kernel
    @cuda.jit
    def axpy(x, y, out, n):
        i = cuda.grid(1)
        if i < n:
            out[i] = 2 * x[i] + y[i]

    x, y = rng.random((700, 90)), rng.random((700, 90))
    dx = da.from_array(cp.asarray(x), chunks=(300, 90), asarray=False)
    dy = da.from_array(cp.asarray(y), chunks=(300, 90), asarray=False)
    got = axpy(dx, dy).compute()
    assert isinstance(got, cp.ndarray)
    np.testing.assert_allclose(got.get(), 2 * x + y)


@pytest.mark.gpu
def test_gpu_session_moves_numpy_chunks_to_the_device(gpu_session, rng):
    import cupy as cp

    a = rng.random(10_000, dtype=np.float32)
    x = da.from_array(a, chunks=3000)  # host chunks, GPU-only kernel, GPU session
    out = mul_gpu_only(x, x)
    assert type(out._meta).__module__.startswith("cupy")
    got = gpu_session.client.compute(out).result()
    np.testing.assert_allclose(cp.asnumpy(got), a * a, rtol=1e-6)
