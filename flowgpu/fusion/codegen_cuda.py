"""CUDA C++ for fused kernels: an :class:`Expr` as the body of a CuPy ``ElementwiseKernel`` or
``ReductionKernel`` (or the tiled kernel); the helpers it calls are :data:`CUDA_PREAMBLE`.
"""

from __future__ import annotations

import functools

import numpy as np

from flowgpu.fusion.codegen import Generator, c_type, generate

__all__ = ["to_cuda", "CUDA_PREAMBLE", "CUDA_OPTIONS", "CudaGenerator"]

# nvrtc contracts a * b + c into one fused multiply-add by default: one rounding where NumPy (and CuPy's
# unfused operators, one kernel each) round twice, and finite where NumPy's a * b overflows to inf
CUDA_OPTIONS = ("--fmad=false",)

_C_FUNCS = {
    "arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
    "arctanh": "atanh", "arctan2": "atan2",
    # NumPy's NaN rules, which C's fmin/fmax do not follow
    "minimum": "_fg_min", "maximum": "_fg_max", "fmin": "_fg_fmin", "fmax": "_fg_fmax",
}

CUDA_PREAMBLE = r"""
#include <cupy/float16.cuh>  // CuPy declares float16 but defines it only for kernels with a float16 parameter
template <typename T> __device__ __forceinline__ T _fg_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T _fg_min(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T _fg_fmax(T a, T b) { return (a >= b || b != b) ? a : b; }
template <typename T> __device__ __forceinline__ T _fg_fmin(T a, T b) { return (a <= b || b != b) ? a : b; }
template <typename T> __device__ __forceinline__ T _fg_clip(T x, T lo, T hi) { return _fg_min(_fg_max(x, lo), hi); }
template <typename T> __device__ __forceinline__ T _fg_sign(T a) {
    return a != a ? a : (T)((a > (T)0) - (a < (T)0));
}
template <typename T> __device__ __forceinline__ T _fg_iabs(T a) {  // the lowest integer stays itself, as NumPy's
    return a < (T)0 ? (T)(0ULL - (unsigned long long)a) : a;
}
template <typename T> __device__ __forceinline__ T _fg_ifloordiv(T a, T b) {
    if (b == (T)0) return (T)0;
    if ((T)-1 < (T)0 && b == (T)-1) return (T)(0ULL - (unsigned long long)a);  // lowest // -1 wraps, as NumPy
    T q = a / b;
    if ((a % b != (T)0) && ((a < (T)0) != (b < (T)0))) q -= (T)1;
    return q;
}
template <typename T> __device__ __forceinline__ T _fg_imod(T a, T b) {
    if (b == (T)0 || ((T)-1 < (T)0 && b == (T)-1)) return (T)0;  // x % -1 is 0 (the lowest integer too)
    T r = a % b;
    if (r != (T)0 && ((r < (T)0) != (b < (T)0))) r += b;
    return r;
}
template <typename T> __device__ __forceinline__ T _fg_ipow(T a, T b) {  // unsigned: wraps, as NumPy's
    unsigned long long r = 1, m = (unsigned long long)a;
    while (b > (T)0) { if (b & (T)1) r *= m; m *= m; b >>= 1; }
    return (T)r;
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
    else fl = copysign((T)0, (T)(a / b));  // float16 / float16 is a float: one overload
    return fl;
}
"""


class CudaGenerator(Generator):
    LOGICAL = {"&": "&&", "|": "||", "^": "!=", "+": "||", "*": "&&"}
    HELPERS = {"//": ("_fg_ifloordiv", "_fg_ffloordiv"), "%": ("_fg_imod", "_fg_fmod"), "**": ("_fg_ipow", "pow")}
    TEMPLATES = {"not": "(!{0})", "sqrt": "sqrt({0})", "plain": "({0} {op} {1})", "sign": "_fg_sign<{c}>({0})",
                 "wrapping": "(({c})((unsigned long long)({0}) {op} (unsigned long long)({1})))",
                 "clip": "_fg_clip<{c}>({0}, {1}, {2})", "select": "({0} ? {1} : {2})",
                 "True": "true", "False": "false", "nan": "(0.0/0.0)", "inf": "(1.0/0.0)", "-inf": "(-1.0/0.0)"}

    @classmethod
    def cast(cls, code: str, want: np.dtype) -> str:
        return f"(({c_type(want)}){code})"  # a literal's cast is folded by the compiler

    @staticmethod
    def integer(v: int) -> str:
        return f"{v}{'ULL' if v > 2**63 - 1 else 'LL' if abs(v) > 2**31 - 1 else ''}"

    def function(self, f: str) -> str:
        return _C_FUNCS.get(f, f)

    def typed(self, name: str, d: np.dtype) -> str:
        # the template's type given, never deduced: operands of two C types (float16 and the float a
        # math function returns for it) match no template otherwise (_fg_ffloordiv(float, float16))
        return f"{name}<{c_type(d)}>" if name.startswith("_fg_") else name

    def widens(self, d: np.dtype) -> bool:
        # C computes char and short in int; CUDA's math functions compute float16 in float: cast back,
        # so the value is NumPy's (rounded to float16 after each operation) and has the C type float16
        return (d.kind in "iu" and d.itemsize < 4) or d == np.float16

    def undefined_overflow(self, op: str, d: np.dtype) -> bool:
        # C computes char and short in int: only unsigned short * unsigned short can overflow it
        return (d.kind == "i" and d.itemsize >= 4) or (d == np.uint16 and op == "*")

    def abs(self, a: str, d: np.dtype) -> str:
        if d.kind == "f":
            return f"fabs({a})"
        return a if d.kind in "bu" else f"_fg_iabs<{c_type(d)}>({a})"


to_cuda = functools.partial(generate, CudaGenerator)  # (expr, types, arrays, *, out_dtype) -> (code, dtype)
