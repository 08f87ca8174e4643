"""What the user-kernel decorators share: signatures, a per-process compile cache, CuPy chunks
handed to numba-cuda, dask arguments. numba, CuPy and numba.cuda are imported where used.
"""

from __future__ import annotations

import inspect
import itertools
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize

# numba-cuda 0.30 still looks up np.row_stack, which NumPy 2.5 removed (it was exactly vstack)
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

from flowgpu.backend import empty_meta, import_cupy, is_cupy
from flowgpu.errors import KernelError

_PYTHON_SCALARS = (bool, int, float, complex)


@dataclass(frozen=True)
class Signature:
    """One kernel signature: the input and output dtypes and the text (or numba object) it came from."""

    inputs: tuple[np.dtype, ...]
    outputs: tuple[np.dtype, ...]
    source: Any

    def __str__(self) -> str:
        ins = ", ".join(d.name for d in self.inputs)
        outs = ", ".join(d.name for d in self.outputs)
        return f"({ins}) -> {outs}"


def _as_dtype(t: Any, where: str) -> np.dtype:
    from numba.core import types
    from numba.np.numpy_support import as_dtype

    if isinstance(t, types.Array):
        t = t.dtype
    try:
        return np.dtype(as_dtype(t))
    except Exception:
        raise KernelError(f"{where}: numba type {t} has no NumPy dtype; use numeric types such as "
                          "float32, float64, int64, complex128") from None


def is_scalar(x: Any) -> bool:
    """A Python or NumPy scalar (not an array, not a 0-d dask array)."""
    return isinstance(x, (*_PYTHON_SCALARS, np.generic))


def arg_dtype(x: Any) -> np.dtype | type:
    """The dtype of an array argument; a Python scalar's type itself (it is "weak", as in NumPy 2)."""
    if isinstance(x, _PYTHON_SCALARS):
        return type(x)
    try:
        return np.dtype(x.dtype)
    except AttributeError:
        return np.asarray(x).dtype


def _accepts(have: np.dtype | type, want: np.dtype) -> bool:
    if have is bool:
        return np.can_cast(np.bool_, want, "safe")
    if have is int:  # weak Python int: any integer, float or complex kind
        return want.kind in "iufc"
    if have is float:
        return want.kind in "fc"
    if have is complex:
        return want.kind == "c"
    return np.can_cast(have, want, "safe")


def select_signature(signatures: Sequence[Signature], args: Sequence[Any], name: str) -> Signature:
    """The first signature every argument casts to safely (NumPy's loop rule; Python scalars are weak)."""
    have = [arg_dtype(a) for a in args]
    for sig in signatures:
        if len(sig.inputs) == len(have) and all(_accepts(h, w) for h, w in zip(have, sig.inputs)):
            return sig
    names = ", ".join(h.__name__ if isinstance(h, type) else np.dtype(h).name for h in have)
    choices = "; ".join(str(s) for s in signatures)
    raise KernelError(f"{name}: no signature accepts inputs ({names}); it has {choices}. Add a "
                      "signature for these types, or cast the inputs with .astype(...)")


def concrete_dtypes(args: Sequence[Any]) -> tuple[np.dtype, ...]:
    """Input dtypes for a lazily compiled kernel; a Python scalar's is NumPy 2's beside the arrays."""
    arrays = [arg_dtype(a) for a in args if not isinstance(a, _PYTHON_SCALARS)]
    out = []
    for a in args:
        if isinstance(a, _PYTHON_SCALARS):
            out.append(np.result_type(*arrays, a) if arrays else np.asarray(a).dtype)
        else:
            out.append(arg_dtype(a))
    return tuple(np.dtype(d) for d in out)


def infer_return_dtype(pyfunc: Callable, in_dtypes: Sequence[np.dtype], name: str, key: str) -> np.dtype:
    """The dtype numba infers ``pyfunc`` returns for scalars of ``in_dtypes`` (cached under ``key``)."""
    key = (key, "infer", tuple(in_dtypes))

    def build():
        import numba
        from numba.np.numpy_support import from_dtype

        disp = numba.njit(pyfunc)
        try:
            disp.compile(tuple(from_dtype(d) for d in in_dtypes))
        except Exception as e:
            raise KernelError(f"{name}: numba cannot compile it for inputs "
                              f"({', '.join(d.name for d in in_dtypes)}): {_numba_reason(e)}") from None
        return _as_dtype(disp.nopython_signatures[-1].return_type, f"{name} returns")

    return cached(key, build)


def _numba_reason(e: BaseException) -> str:
    """numba's reason in one line: its first, the cause under a "Failed in ... pipeline" head, and where."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    said = lines[:2] if lines[0].startswith("Failed in") and len(lines) > 1 else lines[:1]
    where = next((line.rstrip(":") for line in lines if line.startswith('File "')), None)
    return "; ".join(said + ([where] if where and where not in said else []))


_cache: dict[Any, Any] = {}
_cache_lock = threading.RLock()
_keys = itertools.count()


def cached(key: Any, build: Callable[[], Any]) -> Any:
    """``build()`` once per process and key (numba compiles once per worker, not per chunk)."""
    with _cache_lock:
        if key not in _cache:
            _cache[key] = build()
        return _cache[key]


def any_cupy(args: Sequence[Any]) -> bool:
    """True when any argument is a CuPy array, or a dask array whose chunks are CuPy."""
    return any(is_cupy(a) or (isinstance(a, da.Array) and is_cupy(a._meta)) for a in args)


def numba_stream():
    """A numba stream object for CuPy's current stream, so numba kernels queue behind CuPy's work."""
    from numba import cuda

    cp = import_cupy()
    ptr = cp.cuda.get_current_stream().ptr
    return cuda.external_stream(ptr) if ptr else cuda.default_stream()


def numba_view(x: Any):
    """A numba device array viewing CuPy array ``x`` (no copy, no stream synchronisation)."""
    from numba import cuda

    return cuda.as_cuda_array(x, sync=False)


def dense(x: Any, shape: tuple[int, ...], dtype: Any, xp) -> Any:
    """``x`` broadcast to ``shape`` as a C-contiguous array of ``dtype`` (no copy when it is one)."""
    arr = xp.asarray(x, dtype=dtype)
    if arr.shape != shape:
        arr = xp.broadcast_to(arr, shape)
    return xp.ascontiguousarray(arr)


def describe(pyfunc: Callable, drop_last: int = 0) -> inspect.Signature | None:
    """``pyfunc``'s Python signature, less its last ``drop_last`` parameters (outputs)."""
    try:
        sig = inspect.signature(pyfunc)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[:len(params) - drop_last])


def as_dask_args(args: Sequence[Any]) -> list[Any]:
    """Arrays as dask arrays (one chunk for plain NumPy/CuPy arrays); scalars as they are."""
    out = []
    for a in args:
        if isinstance(a, da.Array) or is_scalar(a):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.append(da.from_array(np.asarray(a), chunks=-1))
        else:
            out.append(da.from_array(a, chunks=-1, asarray=False))
    return out


def map_broadcast(func: Callable, args: Sequence[Any], dtype: Any, *, name: str, who: str,
                  token: Sequence[Any], cupy: bool | None = None) -> da.Array:
    """``func`` over the chunks of ``args`` (arrays and scalars) broadcast together, as one dask layer
    named ``name-<token>``; ``who`` starts the error for shapes that do not broadcast; ``cupy``: the
    chunks are CuPy (default: as the inputs')."""
    dargs = as_dask_args(args)
    shapes = [a.shape for a in dargs if isinstance(a, da.Array)]
    try:
        ndim = len(np.broadcast_shapes(*shapes))
    except ValueError:
        raise KernelError(f"{who}: input shapes {', '.join(map(str, shapes))} do not broadcast "
                          "together (NumPy's rules)") from None
    pairs = []
    for a in dargs:
        pairs += [a, tuple(range(a.ndim))[::-1] if isinstance(a, da.Array) else None]
    meta = empty_meta(any_cupy(dargs) if cupy is None else cupy, dtype, ndim)
    return da.blockwise(func, tuple(range(ndim))[::-1], *pairs, dtype=dtype, meta=meta,
                        name=f"{name}-{tokenize(*token, *dargs)}")


def cuda_ufunc(kind: str, pyfunc: Callable, *args: Any) -> Any:
    """``numba.vectorize`` / ``numba.guvectorize`` (``kind``) of ``pyfunc`` for the CUDA target."""
    import numba

    try:
        return getattr(numba, kind)(*args, target="cuda")(pyfunc)
    except ValueError as e:  # "Unsupported target": numba-cuda without numba's target hook
        from numba import cuda

        if "target" not in str(e) or not hasattr(cuda, kind):
            raise
        return getattr(cuda, kind)(*args)(pyfunc)


class Named:
    """A decorator's object: stands for a user function (name, module, docstring), tokenized by its key."""

    def _stand_for(self, func: Any, name: str, doc: str | None = None) -> None:
        self.__name__ = self.__qualname__ = name
        self.__module__ = getattr(func, "__module__", None) or type(self).__module__
        self.__doc__ = func.__doc__ if doc is None else doc
        self._key = f"{name}-{secrets.token_hex(4)}-{next(_keys)}"  # names it in compile caches and pickles

    def __dask_tokenize__(self):
        return self._key


class NumbaUfunc(Named):
    """A (generalised) ufunc of ``pyfunc`` compiled by numba (``KIND``: ``vectorize`` or ``guvectorize``)
    with ``nin`` inputs and ``nout`` outputs; a subclass gives ``numba_args`` and ``_apply_cuda``."""

    KIND: str
    nin: int
    nout: int = 1

    def __init__(self, pyfunc: Callable, name: str | None, default: str):
        self.pyfunc = pyfunc
        self._stand_for(pyfunc, name or getattr(pyfunc, "__name__", default))

    def parse_signatures(self, signatures: Sequence[Any] | str, nout: int | None,
                         takes: str) -> list[Signature]:
        """Parse numba signatures (``"float32(float32, float32)"`` or numba objects) of ``nin`` inputs
        (``takes`` says what has that many); with ``nout`` (guvectorize) the last ``nout`` arguments
        are the outputs, else the return type is."""
        from numba.core.sigutils import normalize_signature

        where = f"{self.KIND} {self.__name__!r}: signature"
        if isinstance(signatures, str) or not isinstance(signatures, Sequence):
            signatures = [signatures]
        out = []
        for sig in signatures:
            try:
                args, ret = normalize_signature(sig)
            except Exception as e:
                raise KernelError(f"{where} {sig!r} is not a numba signature ({e}); write it like "
                                  "'float32(float32, float32)'") from None
            if nout is None:
                if ret is None:
                    raise KernelError(f"{where} {sig!r} has no return type; write it like "
                                      "'float32(float32, float32)'")
                ins, outs = args, (ret,)
            else:
                if len(args) <= nout:
                    raise KernelError(f"{where} {sig!r} has {len(args)} arguments; the layout needs "
                                      f"the inputs followed by {nout} output(s)")
                ins, outs = args[:-nout], args[-nout:]
            if len(ins) != self.nin:
                raise KernelError(f"{where} {sig!r} has {len(ins)} inputs but {takes} {self.nin}")
            out.append(Signature(tuple(_as_dtype(t, f"{where} {sig!r}") for t in ins),
                                 tuple(_as_dtype(t, f"{where} {sig!r}") for t in outs), sig))
        return out

    def apply(self, sig: Signature, *chunks: Any) -> Any:
        """Run signature ``sig`` on in-memory arrays (NumPy or CuPy) or scalars."""
        if any(is_cupy(c) for c in chunks):
            return self._apply_cuda(sig, chunks)
        out = self.compiled("cpu", sig)(*(np.asarray(c, dtype=d) for c, d in zip(chunks, sig.inputs)))
        return tuple(np.asarray(o) for o in out) if self.nout > 1 else np.asarray(out)

    def compiled(self, target: str, sig: Signature) -> Any:
        """The numba ufunc of ``sig`` for ``target`` (``"cpu"`` or ``"cuda"``), built once per process."""
        def build():
            import numba

            args = self.numba_args(sig)
            try:
                if target == "cuda":
                    return cuda_ufunc(self.KIND, self.pyfunc, *args)
                return getattr(numba, self.KIND)(*args)(self.pyfunc)
            except Exception as e:
                shown = sig.source if sig.source is not None else sig
                raise KernelError(f"{self.__name__}: numba could not compile it for the {target} target with "
                                  f"signature {shown}: {_numba_reason(e)}") from None

        return cached((self._key, target, sig.inputs, sig.outputs), build)
