"""Code generation for fused kernels: one :class:`~flowgpu.kernels.expr.Expr` to CUDA C or Python.

Both generators follow NumPy's typing node by node (from :meth:`Expr.infer`): every operand is
cast to the dtype NumPy would compute that operation in, and Python literals take the dtype of
their context (``x * 2.0`` with ``x`` float32 multiplies in float32, as NumPy 2 does). So a fused
kernel gives the unfused NumPy result up to floating-point rounding.

* :func:`to_cuda` gives a C++ expression for ``cupy.ElementwiseKernel`` / ``cupy.ReductionKernel``;
  helpers it needs (NaN-propagating minimum, NumPy's floor division and remainder, ...) are in
  :data:`CUDA_PREAMBLE`.
* :func:`to_python` gives Python source for numba (``@vectorize`` or an ``@njit`` loop); its
  helpers are in :func:`python_globals`.

Inputs are renamed ``in0, in1, ...`` so user names never clash with C keywords or CuPy's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flowgpu.errors import KernelError
from flowgpu.kernels.expr import BinOp, Call, Const, Expr, Name, Node, Typing, UnaryOp

__all__ = ["to_cuda", "to_python", "python_globals", "CUDA_PREAMBLE", "C_TYPES", "c_type", "c_literal"]

C_TYPES = {
    "bool": "bool", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
    "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
    "uint64": "unsigned long long", "float16": "float16", "float32": "float", "float64": "double",
}

_C_FUNCS = {
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
    "arctanh": "atanh", "arctan2": "atan2",
}

CUDA_PREAMBLE = r"""
template <typename T> __device__ __forceinline__ T _fg_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T _fg_min(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T _fg_fmax(T a, T b) { return (a >= b || b != b) ? a : b; }
template <typename T> __device__ __forceinline__ T _fg_fmin(T a, T b) { return (a <= b || b != b) ? a : b; }
template <typename T> __device__ __forceinline__ T _fg_clip(T x, T lo, T hi) { return _fg_min(_fg_max(x, lo), hi); }
template <typename T> __device__ __forceinline__ T _fg_sign(T a) {
    return a != a ? a : (T)((a > (T)0) - (a < (T)0));
}
template <typename T> __device__ __forceinline__ T _fg_iabs(T a) { return a < (T)0 ? (T)(-a) : a; }
template <typename T> __device__ __forceinline__ T _fg_ifloordiv(T a, T b) {
    if (b == (T)0) return (T)0;
    T q = a / b;
    if ((a % b != (T)0) && ((a < (T)0) != (b < (T)0))) q -= (T)1;
    return q;
}
template <typename T> __device__ __forceinline__ T _fg_imod(T a, T b) {
    if (b == (T)0) return (T)0;
    T r = a % b;
    if (r != (T)0 && ((r < (T)0) != (b < (T)0))) r += b;
    return r;
}
template <typename T> __device__ __forceinline__ T _fg_ipow(T a, T b) {
    T r = 1;
    while (b > (T)0) { if (b & (T)1) r *= a; a *= a; b >>= 1; }
    return r;
}
template <typename T> __device__ __forceinline__ T _fg_fmod(T a, T b) {
    T mod = fmod(a, b);
    if (b == (T)0) return mod;
    if (mod != (T)0) { if ((b < (T)0) != (mod < (T)0)) mod += b; }
    else mod = copysign((T)0, b);
    return mod;
}
template <typename T> __device__ __forceinline__ T _fg_ffloordiv(T a, T b) {
    if (b == (T)0) return a / b;
    T mod = fmod(a, b);
    T div = (a - mod) / b;
    if (mod != (T)0 && ((b < (T)0) != (mod < (T)0))) div -= (T)1;
    T fl;
    if (div != (T)0) { fl = floor(div); if (div - fl > (T)0.5) fl += (T)1; }
    else fl = copysign((T)0, a / b);
    return fl;
}
"""


def c_type(dtype: Any) -> str:
    """The C type of a NumPy dtype; KernelError for dtypes fused kernels do not handle."""
    name = np.dtype(dtype).name
    try:
        return C_TYPES[name]
    except KeyError:
        raise KernelError(f"dtype {name} is not supported by fused kernels (use bool, int or float dtypes)") from None


def c_literal(value: Any, dtype: Any) -> str:
    """``value`` as a C literal of ``dtype`` (the cast is folded by the compiler)."""
    dtype = np.dtype(dtype)
    ct = c_type(dtype)
    if dtype.kind == "b":
        return "true" if bool(value) else "false"
    if dtype.kind == "f":
        v = float(value)
        if math.isnan(v):
            body = "(0.0/0.0)"
        elif math.isinf(v):
            body = "(1.0/0.0)" if v > 0 else "(-1.0/0.0)"
        else:
            body = repr(v)
        return f"(({ct}){body})"
    v = int(value)
    suffix = "ULL" if v > 2**63 - 1 else ("LL" if abs(v) > 2**31 - 1 else "")
    return f"(({ct}){v}{suffix})"


class _Gen:
    """Shared walk over the tree; subclasses say how to spell casts, literals and operations."""

    def __init__(self, expr: Expr, typing: Typing, names: Mapping[str, str]):
        self.expr = expr
        self.t = typing
        self.names = names  # user name -> generated argument name

    # how a node of dtype ``have`` becomes ``want``
    def cast(self, code: str, want: np.dtype) -> str:
        raise NotImplementedError

    def literal(self, value: Any, want: np.dtype) -> str:
        raise NotImplementedError

    def gen(self, node: Node, want: np.dtype) -> str:
        """Code for ``node`` with dtype ``want``."""
        value = self.t.value(node)
        if value is not None and (self.t.weak(node) or isinstance(node, (Name, Const))):
            return self.literal(value, want)
        code = self.raw(node)
        have = self.t.dtype(node)
        return code if have == want else self.cast(code, want)

    def raw(self, node: Node) -> str:
        """Code for ``node`` in its own dtype."""
        if isinstance(node, Name):
            return self.names[node.id]
        d = self.t.dtype(node)
        if isinstance(node, BinOp):
            return self.binop(node, d)
        if isinstance(node, UnaryOp):
            a = self.gen(node.operand, d)
            if node.op == "-":
                return f"(-{a})" if d.kind != "b" else f"(!{a})"
            return f"(!{a})" if d.kind == "b" else f"(~{a})"
        if isinstance(node, Call):
            return self.call(node, d)
        raise KernelError(f"cannot generate code for {node!r}")  # pragma: no cover

    def binop(self, node: BinOp, d: np.dtype) -> str:
        raise NotImplementedError

    def call(self, node: Call, d: np.dtype) -> str:
        raise NotImplementedError

    def power(self, node: BinOp, d: np.dtype, pow_fn: str, ipow_fn: str, sqrt_fn: str) -> str:
        a = self.gen(node.left, d)
        exp = self.t.value(node.right) if self.t.weak(node.right) else None
        if exp is not None and d.kind in "fiu":
            if exp == 2:
                return f"({a} * {a})"
            if exp == 1:
                return a
            if exp == 3:
                return f"({a} * {a} * {a})"
            if d.kind == "f" and exp == 0.5:
                return f"{sqrt_fn}({a})"
            if d.kind == "f" and exp == -1:
                return f"({self.literal(1, d)} / {a})"
        b = self.gen(node.right, d)
        return f"{ipow_fn}({a}, {b})" if d.kind in "iu" else f"{pow_fn}({a}, {b})"


class _CudaGen(_Gen):
    def cast(self, code: str, want: np.dtype) -> str:
        return f"(({c_type(want)}){code})"

    def literal(self, value: Any, want: np.dtype) -> str:
        return c_literal(value, want)

    def binop(self, node: BinOp, d: np.dtype) -> str:
        op = node.op
        if op in ("==", "!=", "<", "<=", ">", ">="):
            c = self.t.compare_dtype(node)
            return f"({self.gen(node.left, c)} {op} {self.gen(node.right, c)})"
        if op == "**":
            return self.power(node, d, "pow", "_fg_ipow", "sqrt")
        a, b = self.gen(node.left, d), self.gen(node.right, d)
        if d.kind == "b":
            logical = {"&": "&&", "|": "||", "^": "!=", "+": "||", "*": "&&"}
            if op not in logical:
                raise KernelError(f"expression {self.expr.text!r}: {op!r} on booleans is not supported")
            return f"({a} {logical[op]} {b})"
        if op == "//":
            return f"_fg_ifloordiv({a}, {b})" if d.kind in "iu" else f"_fg_ffloordiv({a}, {b})"
        if op == "%":
            return f"_fg_imod({a}, {b})" if d.kind in "iu" else f"_fg_fmod({a}, {b})"
        return f"({a} {op} {b})"

    def call(self, node: Call, d: np.dtype) -> str:
        from flowgpu.kernels.expr import FUNCTIONS

        f = node.func
        family = FUNCTIONS[f][1]
        args = node.args
        if family == "predicate":
            ad = self.t.dtype(args[0])
            a = self.gen(args[0], ad)
            if ad.kind != "f":
                return "false" if f != "isfinite" else "true"
            return f"{f}({a})"
        if family == "where":
            return f"({self.gen(args[0], np.dtype(bool))} ? {self.gen(args[1], d)} : {self.gen(args[2], d)})"
        gen = [self.gen(a, d) for a in args]
        if family == "float":
            return f"{_C_FUNCS.get(f, f)}({gen[0]})"
        if family == "round":
            return f"{f}({gen[0]})" if d.kind == "f" else gen[0]
        if family == "abs":
            if d.kind == "f":
                return f"fabs({gen[0]})"
            return gen[0] if d.kind in "bu" else f"_fg_iabs({gen[0]})"
        if family == "negative":
            return f"(-{gen[0]})"
        if family == "square":
            return f"({gen[0]} * {gen[0]})"
        if family == "reciprocal":
            return f"({self.literal(1, d)} / {gen[0]})"
        if family == "sign":
            return f"_fg_sign({gen[0]})"
        if family == "clip":
            return f"_fg_clip({gen[0]}, {gen[1]}, {gen[2]})"
        if f in ("minimum", "maximum", "fmin", "fmax"):
            name = {"minimum": "_fg_min", "maximum": "_fg_max", "fmin": "_fg_fmin", "fmax": "_fg_fmax"}[f]
            return f"{name}({gen[0]}, {gen[1]})"
        if f == "power":
            return f"_fg_ipow({gen[0]}, {gen[1]})" if d.kind in "iu" else f"pow({gen[0]}, {gen[1]})"
        return f"{_C_FUNCS.get(f, f)}({gen[0]}, {gen[1]})"  # arctan2, hypot


def _arg_names(expr: Expr, arrays: Sequence[str], index: str | None = None) -> dict[str, str]:
    suffix = f"[{index}]" if index else ""
    return {name: f"in{i}{suffix}" for i, name in enumerate(arrays)}


def to_cuda(expr: Expr, types: Mapping[str, Any], arrays: Sequence[str], *, out_dtype: Any = None) -> tuple[str, np.dtype]:
    """CUDA C++ for ``expr``: ``(code, dtype)``.

    ``types`` maps each name to a dtype (array inputs, listed in ``arrays`` in argument order, named
    ``in0, in1, ...`` in the code) or a scalar value (inlined). ``code`` has type ``out_dtype``
    (default: NumPy's result dtype, returned as ``dtype``).
    """
    typing = expr.infer(types)
    dtype = np.dtype(out_dtype) if out_dtype is not None else typing.dtype(expr.root)
    for name in arrays:
        c_type(types[name])
    c_type(dtype)
    return _CudaGen(expr, typing, _arg_names(expr, arrays)).gen(expr.root, dtype), dtype


# ---------------------------------------------------------------- Python source for numba


def _py_literal(value: Any, want: np.dtype) -> str:
    if want.kind == "b":
        return "True" if bool(value) else "False"
    if want.kind == "f":
        v = float(value)
        body = "_nan" if math.isnan(v) else ("_inf" if v > 0 else "(-_inf)") if math.isinf(v) else repr(v)
        return f"_t_{want.name}({body})"
    return f"_t_{want.name}({int(value)})"


class _PyGen(_Gen):
    def cast(self, code: str, want: np.dtype) -> str:
        c_type(want)  # refuse dtypes numba should not see either
        return f"_t_{want.name}({code})"

    def literal(self, value: Any, want: np.dtype) -> str:
        return _py_literal(value, want)

    def raw(self, node: Node) -> str:
        if isinstance(node, UnaryOp):
            d = self.t.dtype(node)
            a = self.gen(node.operand, d)
            if d.kind == "b":
                return f"(not {a})"
            return f"(-{a})" if node.op == "-" else f"(~{a})"
        return super().raw(node)

    def binop(self, node: BinOp, d: np.dtype) -> str:
        op = node.op
        if op in ("==", "!=", "<", "<=", ">", ">="):
            c = self.t.compare_dtype(node)
            return f"({self.gen(node.left, c)} {op} {self.gen(node.right, c)})"
        if op == "**":
            return self.power(node, d, "_pow", "_ipow", "_np.sqrt")
        a, b = self.gen(node.left, d), self.gen(node.right, d)
        if d.kind == "b":
            logical = {"&": "and", "|": "or", "^": "!=", "+": "or", "*": "and"}
            if op not in logical:
                raise KernelError(f"expression {self.expr.text!r}: {op!r} on booleans is not supported")
            return f"({a} {logical[op]} {b})"
        if op == "/":
            return f"_div({a}, {b})"
        if op == "//":
            return f"_ifloordiv({a}, {b})" if d.kind in "iu" else f"_ffloordiv({a}, {b})"
        if op == "%":
            return f"_imod({a}, {b})" if d.kind in "iu" else f"_fmod({a}, {b})"
        return f"_t_{d.name}({a} {op} {b})"

    def call(self, node: Call, d: np.dtype) -> str:
        from flowgpu.kernels.expr import FUNCTIONS

        f = node.func
        family = FUNCTIONS[f][1]
        args = node.args
        if family == "predicate":
            ad = self.t.dtype(args[0])
            a = self.gen(args[0], ad)
            if ad.kind != "f":
                return "False" if f != "isfinite" else "True"
            return f"_np.{f}({a})"
        if family == "where":
            return f"({self.gen(args[1], d)} if {self.gen(args[0], np.dtype(bool))} else {self.gen(args[2], d)})"
        gen = [self.gen(a, d) for a in args]
        if family == "float":
            return f"_np.{f}({gen[0]})"
        if family == "round":
            return f"_np.{f}({gen[0]})" if d.kind == "f" else gen[0]
        if family == "abs":
            return gen[0] if d.kind in "bu" else f"_t_{d.name}(abs({gen[0]}))"
        if family == "negative":
            return f"(-{gen[0]})"
        if family == "square":
            return f"({gen[0]} * {gen[0]})"
        if family == "reciprocal":
            return f"_div({self.literal(1, d)}, {gen[0]})"
        if family == "sign":
            return f"_t_{d.name}(_sign({gen[0]}))"
        if family == "clip":
            return f"_min(_max({gen[0]}, {gen[1]}), {gen[2]})"
        if f in ("minimum", "maximum", "fmin", "fmax"):
            return f"_{f.replace('minimum', 'min').replace('maximum', 'max')}({gen[0]}, {gen[1]})"
        if f == "power":
            return f"_ipow({gen[0]}, {gen[1]})" if d.kind in "iu" else f"_pow({gen[0]}, {gen[1]})"
        return f"_np.{f}({gen[0]}, {gen[1]})"


def to_python(expr: Expr, types: Mapping[str, Any], arrays: Sequence[str], *,
              out_dtype: Any = None, index: str | None = None) -> tuple[str, np.dtype]:
    """Python source of a scalar expression over ``in0, in1, ...`` for numba, and its dtype.

    With ``index="i"`` the inputs are spelled ``in0[i], ...`` (for a loop over flat arrays).
    Evaluate it with :func:`python_globals` as globals (which holds the ``_t_<dtype>`` casts and the
    NumPy-semantics helpers, themselves numba-compiled).
    """
    typing = expr.infer(types)
    dtype = np.dtype(out_dtype) if out_dtype is not None else typing.dtype(expr.root)
    for name in arrays:
        c_type(types[name])
    c_type(dtype)
    return _PyGen(expr, typing, _arg_names(expr, arrays, index)).gen(expr.root, dtype), dtype


_GLOBALS: dict[str, Any] | None = None


def python_globals() -> dict[str, Any]:
    """Globals for :func:`to_python` code: casts and helpers compiled once with numba."""
    global _GLOBALS
    if _GLOBALS is not None:
        return _GLOBALS
    import numba

    jit = numba.njit(cache=False, error_model="numpy")

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

    @jit
    def _sign(a):
        if a != a:
            return a
        return a - a + ((a > 0) - (a < 0))

    @jit
    def _ifloordiv(a, b):
        if b == 0:
            return a - a
        return a // b

    @jit
    def _imod(a, b):
        if b == 0:
            return a - a
        return a % b

    @jit
    def _ipow(a, b):
        r = a - a + 1
        while b > 0:
            if b & 1:
                r = r * a
            a = a * a
            b = b >> 1
        return r

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
    _GLOBALS = g
    return g
