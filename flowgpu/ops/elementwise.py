"""Elementwise arithmetic and math ops, NumPy ufuncs on dask arrays (CuPy blocks dispatch to CuPy's).

The operands of a binary op may be arrays or numbers: in a step, the array is the input and the
number an argument named after the operand (``op: multiply, inputs: [x], args: {b: 2.0}``). A number
keeps the array's dtype (NumPy 2 promotion): a float32 array times ``2.0`` stays float32.
"""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from flowgpu.errors import OpError
from flowgpu.ops._common import Array, DType, defop, dtype_arg, same_backend

__all__ = [
    "add", "subtract", "multiply", "divide", "power", "minimum", "maximum",
    "greater", "greater_equal", "less", "less_equal", "equal", "not_equal",
    "negative", "absolute", "sqrt", "square", "exp", "log", "log10", "log1p", "expm1",
    "sin", "cos", "tan", "tanh", "floor", "ceil", "clip", "scale", "where", "astype",
    "real", "imag", "conj", "angle",
]

_BINARY_DOC = """{summary}

``a`` and ``b`` are arrays or numbers, at least one an array; arrays broadcast as in NumPy.

Returns
-------
dask.array.Array
    ``{expression}``, elementwise, with NumPy's dtype promotion.
"""

_UNARY_DOC = """{summary}

Returns
-------
dask.array.Array
    ``{expression}``, elementwise, same chunks as ``x`` (NumPy or CuPy).
"""


def _number(x: Any) -> Any:
    """NumPy scalars as Python numbers, so they never upcast an array (NumPy 2 promotion)."""
    return x.item() if isinstance(x, np.generic) else x


def _operands(name: str, *xs: Any) -> list[Any]:
    xs = tuple(_number(x) for x in xs)
    if not any(hasattr(x, "shape") and hasattr(x, "dtype") for x in xs):
        raise OpError(f"op {name!r}: at least one operand must be an array, got only numbers; "
                      "compute a number in a param instead")
    return same_backend(*xs)


def _binary(name: str, ufunc: np.ufunc, expression: str, summary: str) -> Any:
    def func(a: Array | float, b: Array | float) -> Array:
        a, b = _operands(name, a, b)
        return ufunc(a, b)

    doc = _BINARY_DOC.format(summary=summary, expression=expression)
    return defop(name, doc, kind="elementwise", expression=expression)(func)


def _unary(name: str, ufunc: np.ufunc, expression: str | None, summary: str) -> Any:
    def func(x: Array) -> Array:
        (x,) = _operands(name, x)
        return ufunc(x)

    doc = _UNARY_DOC.format(summary=summary, expression=expression or f"{name}(x)")
    return defop(name, doc, kind="elementwise", expression=expression)(func)


add = _binary("add", np.add, "a + b", "Sum of two arrays, or of an array and a number.")
subtract = _binary("subtract", np.subtract, "a - b", "Difference a - b of arrays or numbers.")
multiply = _binary("multiply", np.multiply, "a * b", "Product of two arrays, or of an array and a number.")
divide = _binary("divide", np.true_divide, "a / b", "True division a / b of arrays or numbers.")
power = _binary("power", np.power, "a ** b", "a raised to the power b, elementwise.")
minimum = _binary("minimum", np.minimum, "minimum(a, b)", "Elementwise minimum of two arrays or numbers.")
maximum = _binary("maximum", np.maximum, "maximum(a, b)", "Elementwise maximum of two arrays or numbers.")
greater = _binary("greater", np.greater, "a > b", "True where a > b (a boolean array).")
greater_equal = _binary("greater_equal", np.greater_equal, "a >= b", "True where a >= b (a boolean array).")
less = _binary("less", np.less, "a < b", "True where a < b (a boolean array).")
less_equal = _binary("less_equal", np.less_equal, "a <= b", "True where a <= b (a boolean array).")
equal = _binary("equal", np.equal, "a == b", "True where a == b (a boolean array).")
not_equal = _binary("not_equal", np.not_equal, "a != b", "True where a != b (a boolean array).")

negative = _unary("negative", np.negative, "-x", "Negated values, -x.")
absolute = _unary("abs", np.absolute, "abs(x)", "Absolute values |x|.")
sqrt = _unary("sqrt", np.sqrt, "sqrt(x)", "Square root (nan for negative values).")
square = _unary("square", np.square, "x * x", "Squared values, x * x.")
exp = _unary("exp", np.exp, "exp(x)", "Exponential e**x.")
log = _unary("log", np.log, "log(x)", "Natural logarithm (nan below 0, -inf at 0).")
log10 = _unary("log10", np.log10, "log10(x)", "Base-10 logarithm.")
log1p = _unary("log1p", np.log1p, "log1p(x)", "log(1 + x), accurate for small x.")
expm1 = _unary("expm1", np.expm1, "expm1(x)", "exp(x) - 1, accurate for small x.")
sin = _unary("sin", np.sin, "sin(x)", "Sine of x (radians).")
cos = _unary("cos", np.cos, "cos(x)", "Cosine of x (radians).")
tan = _unary("tan", np.tan, "tan(x)", "Tangent of x (radians).")
tanh = _unary("tanh", np.tanh, "tanh(x)", "Hyperbolic tangent.")
floor = _unary("floor", np.floor, "floor(x)", "Largest whole number <= x.")
ceil = _unary("ceil", np.ceil, "ceil(x)", "Smallest whole number >= x.")
# the parts of complex numbers: the kernel expression language has no complex functions, so these
# are not fused (expression None)
real = _unary("real", np.real, None, "Real part of x (x itself for real arrays).")
imag = _unary("imag", np.imag, None, "Imaginary part of x (zeros for real arrays).")
conj = _unary("conj", np.conj, None, "Complex conjugate of x (x itself for real arrays).")
angle = _unary("angle", np.angle, None, "Angle (argument) of complex x in radians, in (-pi, pi].")


@defop("clip", kind="elementwise", expression="clip(x, lo, hi)")
def clip(x: Array, *, lo: float, hi: float) -> Array:
    """Values limited to the range [lo, hi].

    For a one-sided limit use ``maximum`` (``b: lo``) or ``minimum``.

    Returns
    -------
    dask.array.Array
        ``clip(x, lo, hi)``, in ``x``'s dtype.
    """
    if lo > hi:
        raise OpError(f"op 'clip': lo={lo!r} is greater than hi={hi!r}; swap them")
    (x,) = _operands("clip", x)
    return np.clip(x, _number(lo), _number(hi))


@defop("scale", kind="elementwise", expression="x * factor + offset")
def scale(x: Array, *, factor: float = 1.0, offset: float = 0.0) -> Array:
    """x * factor + offset, with numbers factor and offset.

    Returns
    -------
    dask.array.Array
        In ``x``'s dtype for float arrays (NumPy 2 promotion: Python numbers do not upcast).
    """
    (x,) = _operands("scale", x)
    return x * _number(factor) + _number(offset)


@defop("where", kind="elementwise", expression="where(cond, a, b)")
def where(cond: Array, a: Array | float, b: Array | float) -> Array:
    """a where cond is true, else b.

    ``cond`` is a boolean array (typically a comparison op's output); ``a`` and ``b`` are arrays or
    numbers that broadcast against it.

    Returns
    -------
    dask.array.Array
    """
    cond, a, b = _operands("where", cond, a, b)
    return da.where(cond, a, b)


@defop("astype", kind="elementwise")
def astype(x: Array, *, dtype: DType) -> Array:
    """x converted to another dtype.

    ``dtype`` is a NumPy dtype name (``float32``, ``int64``, ``complex64``, ...). Floats become
    integers by truncation toward zero, as in NumPy. A complex array is not converted to a real
    dtype (that would drop the imaginary part): take ``real``, ``imag`` or ``abs`` first.

    Returns
    -------
    dask.array.Array
    """
    dt = dtype_arg("astype", dtype)
    (x,) = _operands("astype", x)
    if x.dtype.kind == "c" and dt.kind != "c":
        raise OpError(f"op 'astype': converting complex {x.dtype} to {dt} would drop the imaginary part; "
                      f"use op 'real' (or 'abs' for the magnitude) first, then astype")
    return x.astype(dt)
