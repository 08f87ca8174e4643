"""Compiled fused kernels, built once per process and key: CuPy ``ElementwiseKernel``/``ReductionKernel``
for CuPy chunks, numba ``@vectorize`` ufuncs and gufunc reduction loops for NumPy chunks. Reductions
accumulate in NumPy's dtypes (:func:`reduction_dtypes`) and, on the CPU, in NumPy's order.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from flowgpu.backend import import_cupy
from flowgpu.fusion.codegen import Unfusable, c_type
from flowgpu.fusion.codegen_cpu import python_globals, to_python
from flowgpu.fusion.codegen_cuda import CUDA_OPTIONS, CUDA_PREAMBLE, CudaGenerator, to_cuda
from flowgpu.fusion.kernel_cache import cached, guvectorize, python_namespace, vectorize
from flowgpu.fusion.language import Expr

__all__ = ["REDUCTIONS", "reduction_dtypes", "identity", "elementwise_kernel", "reduce_kernel", "cuda_combine"]

REDUCTIONS = ("sum", "mean", "min", "max", "prod", "nansum", "nanprod", "nanmin", "nanmax")
_ADDING = ("sum", "mean", "nansum")
_MULTIPLYING = ("prod", "nanprod")
_NUMPY_BUFFER = 8192  # NumPy's ufunc buffer: a sum casting its values adds each buffer's pairwise sum in turn
# the step of a numba loop for min/max-like reductions; nanmin/nanmax skip NaN as NumPy's fmin/fmax do
_EXTREME = {"min": "_min", "max": "_max", "nanmin": "_fmin", "nanmax": "_fmax"}

_lock = threading.RLock()  # re-entrant: the row-wise reduction kernel builds the flat one inside
_cache: dict[tuple, Any] = {}


def reduction_dtypes(reduction: str, dtype: Any) -> tuple[np.dtype, np.dtype]:
    """``(accumulator, result)`` dtypes of ``reduction`` over values of ``dtype``, as NumPy types them."""
    dtype = np.dtype(dtype)
    if reduction in _EXTREME:
        return dtype, dtype
    result = getattr(np, reduction)(np.ones(1, dtype=dtype)).dtype
    # NumPy's result dtype (a float32 sum overflows where NumPy's does); float16 accumulates in float32,
    # as NumPy's half loops and CuPy's add
    return (np.dtype("float32") if result == np.float16 else result), result


def _key(expr: Expr, dtypes: tuple, scalars: tuple, out_dtype: np.dtype, what: str) -> tuple:
    # scalars by repr: an unpickled NaN equals no other NaN, and would compile per chunk
    return (what, expr.text, tuple(map(str, dtypes)), repr(scalars), str(out_dtype))


def _types(arrays: tuple[str, ...], dtypes: tuple, scalars: tuple) -> dict[str, Any]:
    return {**dict(zip(arrays, (np.dtype(d) for d in dtypes))), **dict(scalars)}


def _name(key: tuple) -> str:
    return "fg_fused_" + hashlib.sha1(repr(key).encode()).hexdigest()[:12]


def _cached(key: tuple, build: Callable[[], Any]) -> Any:
    with _lock:
        kern = _cache.get(key)
        if kern is None:
            kern = _cache[key] = build()
        return kern


def _compile_python(src: str, fname: str, **extra: Any) -> dict[str, Any]:
    """The globals in which ``src`` defined its functions (``fname`` first among them)."""
    return python_namespace(src, fname, dict(python_globals(), **extra))


def elementwise_kernel(expr: Expr, arrays: tuple[str, ...], dtypes: tuple, scalars: tuple,
                       out_dtype: np.dtype, backend: str) -> Any:
    """The compiled elementwise kernel (cached): called with the input chunks, returns the output chunk."""
    key = _key(expr, dtypes, scalars, out_dtype, f"map-{backend}")

    def build() -> Any:
        types = _types(arrays, dtypes, scalars)
        args = [f"in{i}" for i in range(len(arrays))]
        if backend == "cupy":
            cp = import_cupy()
            code, _ = to_cuda(expr, types, arrays, out_dtype=out_dtype)
            # parameter types are NumPy names: CuPy reads them with numpy.dtype(), so the C name
            # "float" would declare float64 (and "long long" would not parse)
            params = ", ".join(f"{np.dtype(d).name} {a}" for d, a in zip(dtypes, args))
            return cp.ElementwiseKernel(params, f"{np.dtype(out_dtype).name} out", f"out = {code};",
                                        name=_name(key), preamble=CUDA_PREAMBLE, options=CUDA_OPTIONS)
        import numba

        code, _ = to_python(expr, types, arrays, out_dtype=out_dtype)
        fname = _name(key)
        func = _compile_python(f"def {fname}({', '.join(args)}):\n    return {code}\n", fname)[fname]
        sig = numba.from_dtype(out_dtype)(*[numba.from_dtype(d) for d in dtypes])
        return vectorize(func, [sig])

    return _cached(key, build)


def _loop_src(fname: str, nargs: int, code: str, reduction: str, acc: np.dtype, ndim: int) -> str:
    """A numba loop reducing ``code`` over flat (``ndim`` 1) or 2-D strided inputs in C order: NumPy's
    order for products; integers and min/max no order changes."""
    args = ", ".join(f"in{i}" for i in range(nargs))
    if ndim == 1:
        head, idx, zero = "    for i in range(in0.shape[0]):\n", "        ", "[0]"
    else:
        head, idx, zero = "    for r in range(in0.shape[0]):\n        for c in range(in0.shape[1]):\n", "            ", "[0, 0]"
    if reduction not in _EXTREME:
        init = f"_t_{acc.name}({1 if reduction in _MULTIPLYING else 0})"
        step = "acc *= v" if reduction in _MULTIPLYING else "acc += v"
        if reduction.startswith("nan"):  # NaN counts as the identity: skipped
            step = f"if v == v:\n{idx}    {step}"
        return (f"def {fname}({args}):\n    acc = {init}\n{head}"
                f"{idx}v = _t_{acc.name}({code})\n{idx}{step}\n    return acc\n")
    helper = _EXTREME[reduction]
    first = code.replace("[i]", zero).replace("[r, c]", zero)
    empty = "in0.shape[0] == 0" if ndim == 1 else "in0.shape[0] == 0 or in0.shape[1] == 0"
    return (f"def {fname}({args}):\n    if {empty}:\n        return _t_{acc.name}(0)\n"
            f"    acc = _t_{acc.name}({first})\n{head}"
            f"{idx}acc = {helper}(acc, _t_{acc.name}({code}))\n    return acc\n")


def _rows_src(fname: str, nargs: int, reduction: str, acc: np.dtype) -> str:
    """A numba loop over the contiguous rows of 2-D inputs, each reduced by ``_flat`` (the 1-D kernel),
    for reductions no order changes: the inner loop vectorises (20 ms against 39 ms through the 2-D
    loop for a 128 MiB column block, 2 cores)."""
    rows = ", ".join(f"_np.ascontiguousarray(in{i}[r])" for i in range(nargs))
    args = ", ".join(f"in{i}" for i in range(nargs))
    combine = (f"{_EXTREME[reduction]}(acc, part)" if reduction in _EXTREME
               else "acc * part" if reduction in _MULTIPLYING else "acc + part")
    empty = f"_t_{acc.name}({1 if reduction in _MULTIPLYING else 0})"
    first = rows.replace("[r]", "[0]")
    return (f"def {fname}({args}):\n    if in0.shape[0] == 0:\n        return {empty}\n"
            f"    acc = _flat({first})\n"
            f"    for r in range(1, in0.shape[0]):\n        part = _flat({rows})\n"
            f"        acc = {combine}\n    return acc\n")


def _pairwise_src(fname: str, nargs: int, code: str, acc: np.dtype, ndim: int, nan: bool, block: int) -> str:
    """NumPy's pairwise summation (``pairwise_sum``, numpy ``loops_utils.h.src``) of ``code``'s values
    in C order: leaves of up to 128 values with 8 accumulators (``_pw_leaf``), halved on multiples
    of 8 above that; 0 plus the sum, or plus each ``block`` in turn where NumPy casts in buffers.
    So the sum rounds and overflows as NumPy's does. ``_fill`` computes the values of ``[s, s + m)``.
    """
    args = ", ".join(f"in{i}" for i in range(nargs))
    t = f"_t_{acc.name}"
    value = f"v = {t}({code})\n{{i}}buf[{{k}}] = v if v == v else {t}(0)" if nan else f"buf[{{k}}] = {t}({code})"
    if ndim == 1:
        size = "in0.shape[0]"
        fill = (f"def {fname}_fill(s, m, buf, {args}):\n    for k in range(m):\n        i = s + k\n"
                f"        {value.format(i='        ', k='k')}\n")
    else:  # 2-D: the flat index s is row r, column c; a row's part at a time
        size = "in0.shape[0] * in0.shape[1]"
        fill = (f"def {fname}_fill(s, m, buf, {args}):\n    w = in0.shape[1]\n    r = s // w\n    c = s - r * w\n"
                f"    k = 0\n    while k < m:\n        step = min(w - c, m - k)\n        for j in range(step):\n"
                f"            cc = c + j\n            {value.format(i='            ', k='k + j')}\n"
                f"        k += step\n        r += 1\n        c = 0\n")
    # the recursion of NumPy's pairwise_sum, with a stack: (start, size, how far) per level
    driver = f"""def {fname}_pw(s, n, buf, {args}):
    if n <= 128:
        {fname}_fill(s, n, buf, {args})
        return _pw_leaf(buf, n, {t}(-0.0))
    starts = _np.empty(64, _np.int64)
    sizes = _np.empty(64, _np.int64)
    phase = _np.zeros(64, _np.int64)
    vals = _np.empty(64, buf.dtype)
    starts[0] = s
    sizes[0] = n
    sp = 1
    vp = 0
    while sp > 0:
        top = sp - 1
        m = sizes[top]
        if m <= 128:
            {fname}_fill(starts[top], m, buf, {args})
            vals[vp] = _pw_leaf(buf, m, {t}(-0.0))
            vp += 1
            sp -= 1
        elif phase[top] < 2:
            half = m // 2
            half -= half % 8
            starts[sp] = starts[top] + (half if phase[top] == 1 else 0)
            sizes[sp] = m - half if phase[top] == 1 else half
            phase[sp] = 0
            phase[top] += 1
            sp += 1
        else:
            vp -= 1
            vals[vp - 1] = vals[vp - 1] + vals[vp]
            sp -= 1
    return vals[0]


def {fname}({args}):
    n = {size}
    buf = _np.empty(128, _np.{acc.name})
    total = {t}(0)
    step = n if {block} == 0 else {block}
    s = 0
    while s < n:
        m = min(step, n - s)
        total = total + {fname}_pw(s, m, buf, {args})
        s += m
    return total
"""
    return fill + "\n\n" + driver


def reduce_kernel(expr: Expr, arrays: tuple[str, ...], dtypes: tuple, scalars: tuple,
                  val_dtype: np.dtype, reduction: str, backend: str, ndim: int | str = 1) -> Any:
    """The compiled kernel (cached) reducing ``expr``'s values (of ``val_dtype``) into the accumulator.

    CuPy: a ``ReductionKernel``. NumPy: a numba gufunc ``f(*inputs)`` (so NumPy reads the flags its
    loop raised) over flat inputs (``ndim=1``), 2-D strided ones (``2``) or contiguous rows (``"rows"``).
    """
    acc, _ = reduction_dtypes(reduction, val_dtype)
    key = _key(expr, dtypes, scalars, val_dtype, f"reduce-{reduction}-{backend}-{ndim}")

    def build() -> Any:
        types = _types(arrays, dtypes, scalars)
        if backend == "cupy":
            cp = import_cupy()
            code, _ = to_cuda(expr, types, arrays, out_dtype=val_dtype)
            if "float16" in code:  # a ReductionKernel's source has no float16 type (ElementwiseKernel's has)
                raise Unfusable(f"expression {expr.text!r}: a float16 value inside a CuPy reduction kernel")
            act = c_type(acc)
            params = ", ".join(f"{np.dtype(d).name} in{i}" for i, d in enumerate(dtypes))
            red, ident = cuda_combine(reduction, acc)
            return cp.ReductionKernel(params, f"{np.dtype(acc).name} out", f"(({act}){code})", red, "out = a", ident,
                                      name=_name(key), reduce_type=act, preamble=CUDA_PREAMBLE, options=CUDA_OPTIONS)
        import numba

        jit = numba.njit(nogil=True, error_model="numpy")
        fname = _name(key)
        two = ndim in (2, "rows")
        flat = None
        if acc.kind == "f" and reduction in _ADDING:  # NumPy's pairwise summation
            # NumPy casts values of another dtype than the sum's in buffers of 8192, each summed on its own
            natural = expr.result_dtype(types)
            code, _ = to_python(expr, types, arrays, out_dtype=val_dtype, index="r, cc" if two else "i")
            src = _pairwise_src(fname, len(arrays), code, acc, 2 if two else 1, reduction.startswith("nan"),
                                0 if natural == acc else _NUMPY_BUFFER)
        elif ndim == "rows" and (acc.kind != "f" or reduction in _EXTREME):  # rows, each through the flat loop
            flat = reduce_kernel(expr, arrays, dtypes, scalars, val_dtype, reduction, backend, "body")
            src = _rows_src(fname, len(arrays), reduction, acc)
        else:  # float products: in C order, as NumPy multiplies
            code, _ = to_python(expr, types, arrays, out_dtype=val_dtype, index="r, c" if two else "i")
            src = _loop_src(fname, len(arrays), code, reduction, acc, 2 if two else 1)
        namespace = _compile_python(src, fname, _flat=flat)
        for helper in (f"{fname}_fill", f"{fname}_pw"):  # the pairwise sum's own functions
            if helper in namespace:
                namespace[helper] = cached(jit(namespace[helper]))
        body = cached(jit(namespace[fname]))
        if ndim == "body":  # the flat loop itself, which the rows kernel calls
            return body
        core = "(m,w)" if two else "(n)"
        layout = f"{','.join([core] * len(arrays))}->()"
        item = numba.from_dtype(acc)
        sig = (*[numba.from_dtype(d)[:, :] if two else numba.from_dtype(d)[:] for d in dtypes], item[:])
        args = ", ".join(f"in{i}" for i in range(len(arrays)))
        wrapper = _compile_python(f"def {fname}_g({args}, out):\n    out[0] = _body({args})\n", f"{fname}_g",
                                  _body=body)[f"{fname}_g"]
        return guvectorize(wrapper, [sig], layout)

    return _cached(key, build)


def cuda_combine(reduction: str, acc: np.dtype) -> tuple[str, str]:
    """``(combine of a and b, identity)`` in CUDA C for ``reduction`` accumulating in ``acc``; nansum and
    nanprod take a NaN as the identity, nanmin/nanmax start from NaN (a slice of NaN stays NaN)."""
    if reduction in _ADDING or reduction in _MULTIPLYING:
        op, ident = ("+", "0") if reduction in _ADDING else ("*", "1")
        if reduction.startswith("nan"):
            zero = f"({c_type(acc)}){ident}"  # either side may be the value (CuPy's order is its own)
            return f"(a == a ? a : {zero}) {op} (b == b ? b : {zero})", ident
        return f"a {op} b", ident
    return f"_fg{_EXTREME[reduction]}(a, b)", CudaGenerator.literal(identity(reduction, acc), acc)


def identity(reduction: str, dtype: np.dtype) -> Any:
    """The partial of ``reduction`` over no values."""
    if reduction not in _EXTREME:
        return int(reduction in _MULTIPLYING)
    low = reduction in ("min", "nanmin")
    if dtype.kind == "b":
        return low
    if dtype.kind == "f":
        return np.nan if reduction.startswith("nan") else np.inf if low else -np.inf
    info = np.iinfo(dtype)
    return info.max if low else info.min
