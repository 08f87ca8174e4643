"""``@flowgpu.kernel``: a raw CUDA kernel applied chunk by chunk, with an optional CPU counterpart.

The kernel is CUDA C source (a CuPy ``RawKernel``) or a ``numba.cuda.jit`` function (a plain
Python function is jitted). Launch convention, one thread per element: a chunk's inputs are
broadcast together, cast to ``dtype``, made C-contiguous and passed flat as
``(in_0, ..., in_k, out, n)``, ``n`` the element count (``long long`` / ``int64``); ``block``
threads per block (256), ``ceil(n / block)`` blocks on CuPy's current stream; a thread with
``i >= n`` does nothing.

``cpu=`` is the same operation for NumPy chunks (NumPy arrays in, the output returned). Without it
the kernel is GPU-only: a CPU session raises KernelError when the graph is built, a GPU session
moves NumPy chunks to the device. As a pipeline op: ``@flowgpu.op("name")`` on top (``gpu_only=True``
without ``cpu=``).

>>> import numpy as np, flowgpu
>>> mul = flowgpu.kernel(r'''
... extern "C" __global__ void mul(const float* a, const float* b, float* out, long long n) {
...     long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
...     if (i < n) out[i] = a[i] * b[i];
... }''', dtype="float32", cpu=np.multiply)
>>> mul(np.float32([1, 2]), np.float32([3, 4]))
array([3., 8.], dtype=float32)
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Sequence
from typing import Any

import dask.array as da
import numpy as np

from flowgpu.backend import current_backend, import_cupy, is_cupy
from flowgpu.errors import BackendError, KernelError
from flowgpu.kernels import _numba as nb

__all__ = ["kernel", "Kernel"]

_GLOBAL = re.compile(r"__global__\s+void\s+([A-Za-z_]\w*)\s*\(")


class Kernel(nb.Named):
    """A raw CUDA kernel made by :func:`kernel`; call it with dask, NumPy or CuPy arrays."""

    def __init__(self, cuda: str | Callable, *, name: str | None = None, dtype: Any = None,
                 cpu: Callable | None = None, block: int = 256, options: Sequence[str] = ()):
        self.cpu = cpu
        try:
            self.dtype = np.dtype(dtype) if dtype is not None else None
        except TypeError:
            raise KernelError(f"kernel dtype={dtype!r} is not a dtype; give e.g. 'float32'") from None
        if not isinstance(block, int) or not 1 <= block <= 1024:
            raise KernelError(f"kernel block={block!r}: give threads per block between 1 and 1024")
        self.block = block
        self.options = tuple(options)
        self._dispatcher = None
        self.jit_options: dict = {}
        if isinstance(cuda, str):
            self.source, self.py_func = cuda, None
            found = _GLOBAL.findall(cuda)
            if name is None and len(found) != 1:
                raise KernelError("kernel: the CUDA source has "
                                  f"{'no' if not found else len(found)} __global__ function(s); "
                                  "name the one to launch with kernel(source, name='...')")
            self.kernel_name = name or found[0]
            if self.kernel_name not in found:
                raise KernelError(f"kernel: no __global__ function {self.kernel_name!r} in the CUDA "
                                  f"source (it has {', '.join(found) or 'none'}); add "
                                  "extern \"C\" __global__ void NAME(...)")
        elif callable(cuda):
            self.source = None
            if type(cuda).__module__.startswith(("numba.cuda", "numba_cuda")) and hasattr(cuda, "py_func"):
                self._dispatcher = cuda
                self.jit_options = dict(getattr(cuda, "targetoptions", {}) or {})
            self.py_func = cuda.py_func if self._dispatcher is not None else cuda
            self.kernel_name = name or self.py_func.__name__
        else:
            raise KernelError(f"kernel: give CUDA C source (a str) or a numba.cuda.jit function, "
                              f"not {type(cuda).__name__}")
        if cpu is not None and not callable(cpu):
            raise KernelError(f"kernel {self.kernel_name!r}: cpu= must be a function of NumPy "
                              f"arrays, not {cpu!r}")
        self._stand_for(cpu or self.py_func, self.kernel_name, getattr(self.py_func, "__doc__", None)
                        or getattr(cpu, "__doc__", None) or f"Raw CUDA kernel {self.kernel_name}.")
        signatures = (nb.describe(f, drop_last=n) for f, n in ((self.py_func, 2), (cpu, 0)) if f is not None)
        self.__signature__ = next((s for s in signatures if s is not None),
                                  inspect.Signature([inspect.Parameter("arrays", inspect.Parameter.VAR_POSITIONAL)]))
        self.gpu_only = cpu is None

    def __repr__(self) -> str:
        kind = "CUDA C" if self.source is not None else "numba.cuda"
        return f"<flowgpu.kernel {self.kernel_name} ({kind}{', GPU-only' if self.gpu_only else ''})>"

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_dispatcher"] = None  # the worker re-jits py_func once (numba dispatchers hold a context)
        return state

    def gpu_only_error(self) -> KernelError:
        return KernelError(
            f"kernel {self.kernel_name!r} is GPU-only (a CUDA kernel with no CPU counterpart) and this "
            "session computes on the CPU (NumPy chunks). Give a CPU version, "
            f"flowgpu.kernel(..., cpu=my_numpy_function), or run it in a GPU session: "
            "flowgpu.Session(backend='gpu') on a machine with an NVIDIA GPU and CuPy")

    def target(self, args: Sequence[Any]) -> str:
        """``"cuda"`` for CuPy chunks (or NumPy ones on a GPU session without ``cpu=``), else ``"cpu"``."""
        if nb.any_cupy(args):
            return "cuda"
        if self.cpu is not None:
            return "cpu"
        if current_backend() == "cupy":
            return "cuda"
        raise self.gpu_only_error()

    def out_dtype(self, args: Sequence[Any]) -> np.dtype:
        if self.dtype is not None:
            return self.dtype
        return np.dtype(np.result_type(*(nb.arg_dtype(a) if not nb.is_scalar(a) else a for a in args)))

    def __call__(self, *arrays: Any) -> Any:
        if not arrays:
            raise KernelError(f"kernel {self.kernel_name!r} needs at least one input array")
        target = self.target(arrays)
        dtype = self.out_dtype(arrays)
        if not any(isinstance(a, da.Array) for a in arrays):
            return self.apply(target, dtype, *arrays)
        return nb.map_broadcast(functools.partial(self.apply, target, dtype), arrays, dtype,
                                name=self.kernel_name, who=f"kernel {self.kernel_name!r}",
                                token=(self._key, target, dtype), cupy=target == "cuda")

    def apply(self, target: str, dtype: np.dtype, *chunks: Any) -> Any:
        """Run on in-memory chunks: the CUDA kernel (``target="cuda"``) or the CPU version."""
        shape = np.broadcast_shapes(*(np.shape(c) for c in chunks))
        if target == "cpu" and not any(is_cupy(c) for c in chunks):
            out = np.asarray(self.cpu(*(np.asarray(c) if not nb.is_scalar(c) else c for c in chunks)))
            if out.shape != shape:
                raise KernelError(f"kernel {self.kernel_name!r}: its cpu= function returned shape "
                                  f"{out.shape} for inputs broadcasting to {shape}")
            return out.astype(dtype, copy=False)
        try:
            cp = import_cupy()
        except BackendError:
            raise self.gpu_only_error() from None
        ins = [nb.dense(c, shape, dtype, cp).reshape(-1) for c in chunks]
        out = cp.empty(shape, dtype=dtype)
        n = out.size
        if n:
            grid = (n + self.block - 1) // self.block
            if self.source is not None:
                self._compiled()((grid,), (self.block,), (*ins, out.reshape(-1), np.int64(n)))
            else:
                views = [nb.numba_view(a) for a in (*ins, out.reshape(-1))]
                self._compiled()[grid, self.block, nb.numba_stream()](*views, np.int64(n))
        return out

    def _compiled(self):
        """The source's CuPy ``RawKernel``, or the numba-cuda kernel (built once per process)."""
        if self._dispatcher is not None:
            return self._dispatcher

        def build():
            if self.source is not None:
                try:
                    return import_cupy().RawKernel(self.source, self.kernel_name, options=self.options)
                except Exception as e:  # CuPy compiles lazily; this catches bad arguments early
                    raise KernelError(f"kernel {self.kernel_name!r}: {e}") from None
            from numba import cuda

            try:
                return cuda.jit(**self.jit_options)(self.py_func)
            except TypeError:  # an option this numba-cuda does not take back: jit plainly
                return cuda.jit(self.py_func)

        return nb.cached((self._key, "compiled"), build)


def kernel(cuda: str | Callable | None = None, *, name: str | None = None, dtype: Any = None,
           cpu: Callable | None = None, block: int = 256, options: Sequence[str] = ()) -> Any:
    """A raw CUDA kernel applied chunk by chunk (the launch convention: this module's docstring).

    ``cuda``: CUDA C source (``extern "C" __global__ void NAME(...)``) or a ``numba.cuda.jit`` (or
    plain Python) function; leave out for ``@flowgpu.kernel(cpu=...)``. ``name``: the ``__global__``
    function to launch (found in the source when there is one). ``dtype``: inputs are cast to it and
    the output has it (default: NumPy's result type). ``cpu``: the same on NumPy arrays, for CPU
    sessions (without it the kernel is GPU-only). ``options``: ``RawKernel`` compiler options.
    Lazy for dask arrays, computed at once for NumPy or CuPy arrays.
    """
    make = functools.partial(Kernel, name=name, dtype=dtype, cpu=cpu, block=block, options=options)
    return make if cuda is None else make(cuda)
