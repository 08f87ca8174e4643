"""Python source for numba from an :class:`Expr`: the body of a ``@vectorize`` ufunc or an ``@njit``
reduction loop, calling ``_t_<dtype>`` casts and NumPy-semantics helpers (:func:`python_globals`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flowgpu.fusion.codegen import C_TYPES, Generator, Unfusable, c_type, generate
from flowgpu.fusion.language import Expr

__all__ = ["to_python", "python_globals"]

_MINMAX = {"minimum": "_min", "maximum": "_max", "fmin": "_fmin", "fmax": "_fmax"}  # NumPy's NaN rules


def _closes(code: str) -> bool:
    """True when the first parenthesis of ``code`` closes at its end (``code`` is one call)."""
    depth = 0
    for i, ch in enumerate(code):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and ch == ")":
            return i == len(code) - 1
    return False


class PythonGenerator(Generator):
    LOGICAL = {"&": "and", "|": "or", "^": "!=", "+": "or", "*": "and"}
    HELPERS = {"/": ("_div", "_div"), "//": ("_ifloordiv", "_ffloordiv"), "%": ("_imod", "_fmod"),
               "**": ("_ipow", "_pow")}
    TEMPLATES = {"not": "(not {0})", "sqrt": "_np.sqrt({0})", "plain": "_t_{d}({0} {op} {1})",
                 "wrapping": "_t_{d}(_wrap(_u64({0}) {op} _u64({1})))",
                 "sign": "_t_{d}(_sign({0}))", "clip": "_min(_max({0}, {1}), {2})", "select": "_where({0}, {1}, {2})",
                 "True": "True", "False": "False", "nan": "_nan", "inf": "_inf", "-inf": "(-_inf)"}

    def widens(self, d: np.dtype) -> bool:
        return True  # numba computes small integers in int64, float32 ** float32 in float64, ...

    def undefined_overflow(self, op: str, d: np.dtype) -> bool:
        return d == np.int64  # smaller integers are computed in int64, where + - * cannot overflow

    @classmethod
    def cast(cls, code: str, want: np.dtype) -> str:
        c_type(want)  # refuse dtypes numba should not see either
        return code if code.startswith(f"_t_{want.name}(") and _closes(code) else f"_t_{want.name}({code})"

    def function(self, f: str) -> str:
        return _MINMAX.get(f) or f"_np.{f}"

    def abs(self, a: str, d: np.dtype) -> str:
        return a if d.kind in "bu" else f"_t_{d.name}(abs({a}))"


def to_python(expr: Expr, types: Mapping[str, Any], arrays: Sequence[str], *,
              out_dtype: Any = None, index: str | None = None) -> tuple[str, np.dtype]:
    """:func:`~flowgpu.fusion.codegen.generate` for numba; Unfusable for float16 values."""
    code, dtype = generate(PythonGenerator, expr, types, arrays, out_dtype=out_dtype, index=index)
    if "float16" in code or any(np.dtype(types[a]) == np.float16 for a in arrays):
        # numba has no float16; NumPy rounds to it after every operation, which the array library does
        raise Unfusable(f"expression {expr.text!r}: float16 values (numba has no float16)")
    return code, dtype


@functools.lru_cache(maxsize=1)
def python_globals() -> dict[str, Any]:
    """Globals for :func:`to_python` code: casts and helpers compiled with numba (shared: never change)."""
    import numba
    from llvmlite import ir
    from numba.extending import intrinsic

    jit = numba.njit(cache=False, error_model="numpy")

    @intrinsic
    def _raise_divide(typingctx):
        """Raise the divide-by-zero flag, as NumPy's integer ``//`` and ``%`` by zero do: ``1.0 / 0.0``
        through an empty asm, which the compiler can neither fold nor drop."""
        def codegen(context, builder, signature, args):
            i64, f64 = ir.IntType(64), ir.DoubleType()
            zero = builder.asm(ir.FunctionType(i64, [i64]), "", "=r,0", [ir.Constant(i64, 0)], side_effect=True)
            q = builder.fdiv(ir.Constant(f64, 1.0), builder.sitofp(zero, f64))
            builder.asm(ir.FunctionType(ir.VoidType(), [i64]), "", "r", [builder.bitcast(q, i64)], side_effect=True)
            return context.get_dummy_value()
        return numba.types.none(), codegen

    @jit
    def _where(c, a, b):  # both values computed first, as NumPy's where (and their flags raised)
        return a if c else b

    @jit
    def _pw_leaf(buf, m, zero):  # NumPy's pairwise_sum of m <= 128 values (numpy loops_utils.h.src)
        if m < 8:
            res = zero  # NumPy's -0.0: the sign of a zero sum is lost when the identity 0 is added
            for i in range(m):
                res += buf[i]
            return res
        r0, r1, r2, r3, r4, r5, r6, r7 = buf[0], buf[1], buf[2], buf[3], buf[4], buf[5], buf[6], buf[7]
        end = m - m % 8
        for i in range(8, end, 8):
            r0 += buf[i]
            r1 += buf[i + 1]
            r2 += buf[i + 2]
            r3 += buf[i + 3]
            r4 += buf[i + 4]
            r5 += buf[i + 5]
            r6 += buf[i + 6]
            r7 += buf[i + 7]
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(end, m):
            res += buf[i]
        return res

    @jit
    def _max(a, b):
        return a if (a > b or a != a) else b

    @jit
    def _min(a, b):
        return a if (a < b or a != a) else b

    @jit
    def _fmax(a, b):
        return a if (a >= b or b != b) else b

    @jit
    def _fmin(a, b):
        return a if (a <= b or b != b) else b

    @jit
    def _div(a, b):
        return a / b

    _u64 = np.uint64  # integers computed unsigned wrap (numba flags signed + - * nsw: undefined overflow)

    @jit
    def _wrap(u):  # an unsigned result back to int64, bit for bit
        return np.int64(u)

    @jit
    def _sign(a):
        if a != a:
            return a
        return (a > 0) - (a < 0)  # not a - a + ...: inf - inf is NaN

    @jit
    def _ifloordiv(a, b):
        if b == 0:
            _raise_divide()
            return a - a
        if b == -1:  # the lowest integer // -1 wraps to itself in NumPy (numba's // gives 0)
            return -a
        return a // b

    @jit
    def _imod(a, b):
        if b == 0:
            _raise_divide()
            return a - a
        return a % b

    @jit
    def _ipow(a, b):  # unsigned, so that it wraps (the caller casts to the dtype)
        r, m = np.uint64(1), np.uint64(a)
        while b > 0:
            if b & 1:
                r = r * m
            m = m * m
            b = b >> 1
        return np.int64(r)

    @jit
    def _pow(a, b):
        return a ** b

    @jit
    def _fmod(a, b):
        mod = np.fmod(a, b)
        if b == 0:
            return mod
        if mod != 0:
            if (b < 0) != (mod < 0):
                mod += b
        else:
            mod = np.copysign(a - a, b)
        return mod

    @jit
    def _ffloordiv(a, b):
        if b == 0:
            return a / b
        mod = np.fmod(a, b)
        div = (a - mod) / b
        if mod != 0 and ((b < 0) != (mod < 0)):
            div -= 1
        if div != 0:
            fl = np.floor(div)
            if div - fl > 0.5:
                fl += 1
        else:
            fl = np.copysign(div - div, a / b)
        return fl

    g: dict[str, Any] = {k: v for k, v in locals().items() if k.startswith("_") and callable(v)}
    g.update({f"_t_{name}": getattr(np, name) if name != "bool" else np.bool_ for name in C_TYPES})
    g.update({"_np": np, "_inf": math.inf, "_nan": math.nan})
    return g
