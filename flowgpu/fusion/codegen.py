"""Code generation for fused kernels: the walk over an :class:`Expr` shared by the CUDA generator
(``codegen_cuda``) and the numba one (``codegen_cpu``).

Every operand is cast to the dtype NumPy computes that node in (:meth:`Expr.infer`; Python literals
are weak), so a fused kernel gives NumPy's result. Inputs are named ``in0, in1, ...`` (no clash with
C keywords); a subclass spells casts, literals, helpers and functions for its target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from flowgpu.errors import KernelError
from flowgpu.fusion.language import COMPARISONS, FUNCTIONS, BinOp, Call, Const, Expr, Name, Node, Typing, UnaryOp

__all__ = ["Generator", "generate", "C_TYPES", "c_type", "Unfusable"]

C_TYPES = {
    "bool": "bool", "int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
    "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
    "uint64": "unsigned long long", "float16": "float16", "float32": "float", "float64": "double",
}


class Unfusable(KernelError):
    """NumPy semantics no kernel reproduces (e.g. an integer to a negative integer power raises):
    the chunk is computed by its array library instead."""


_LOGICAL = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}
# ``a op b`` when a is below (-1) or above (+1) every value b can have
_ORDERED = {"<": (True, False), "<=": (True, False), ">": (False, True), ">=": (False, True),
            "==": (False, False), "!=": (True, True)}


def c_type(dtype: Any) -> str:
    """The C type of a NumPy dtype; KernelError for dtypes fused kernels do not handle."""
    name = np.dtype(dtype).name
    try:
        return C_TYPES[name]
    except KeyError:
        raise KernelError(f"dtype {name} is not supported by fused kernels (use bool, int or float dtypes)") from None


class Generator:
    """The walk over the tree. A subclass gives ``LOGICAL`` (``& | ^ + *`` on booleans), ``HELPERS``
    (operator -> (integer, float) helper where NumPy differs from the target) and ``TEMPLATES`` (code
    over the operands ``{0}, {1}, ...`` and the dtype ``{d}``; and the constants), plus ``cast``,
    ``abs``, ``function`` (the target's name of ``sqrt``, ``arctan2``, ``minimum``, ...), ``undefined_overflow``
    (where the target's integer arithmetic must be computed unsigned to wrap) and ``widens``
    (True when the target computes a dtype in a wider type, as C's ``char * char`` is an ``int``: such a
    node is cast back, so it wraps as NumPy's does).
    """

    LOGICAL: dict[str, str]
    HELPERS: dict[str, tuple[str, str]]
    TEMPLATES: dict[str, str]

    def __init__(self, expr: Expr, typing: Typing, names: Mapping[str, str]):
        self.expr = expr
        self.t = typing
        self.names = names  # user name -> generated argument name

    @classmethod
    def literal(cls, value: Any, want: np.dtype) -> str:
        """``value`` as a constant of dtype ``want``."""
        if want.kind == "b":
            return cls.TEMPLATES[str(bool(value))]
        if want.kind != "f":
            return cls.cast(cls.integer(int(value)), want)
        v = float(value)
        text = repr(v) if math.isfinite(v) else cls.TEMPLATES["nan" if v != v else "inf" if v > 0 else "-inf"]
        return cls.cast(text, want)

    @staticmethod
    def integer(v: int) -> str:
        """An integer literal's text (before its cast)."""
        return str(v)

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
            code = self.binop(node, d)
        elif isinstance(node, UnaryOp):  # "-" or "~" (the parser folds "+")
            a = self.gen(node.operand, d)
            code = self.TEMPLATES["not"].format(a) if d.kind == "b" else \
                self.negative(a, d) if node.op == "-" else f"({node.op}{a})"
        else:  # a Call (a Const is a scalar: gen() writes it as a literal)
            code = self.call(node, d)
        if d.kind == "b" or not self.widens(d):
            return code
        return self.cast(code, d)

    def typed(self, name: str, d: np.dtype) -> str:
        """``name`` as called on values of dtype ``d`` (C++: ``_fg_min<float>``)."""
        return name

    def helper(self, names: tuple[str, str], d: np.dtype, *args: str) -> str:
        """A call of the integer or the float helper of ``names``, as ``d`` says."""
        return f"{self.typed(names[0] if d.kind in 'iu' else names[1], d)}({', '.join(args)})"

    def arith(self, op: str, a: str, b: str, d: np.dtype) -> str:
        if op in self.HELPERS:
            return self.helper(self.HELPERS[op], d, a, b)
        if op in "+-*" and self.undefined_overflow(op, d):
            # the target's signed overflow is undefined (numba's LLVM flags it nsw, C++ says so), which lets
            # the compiler fold INT64_MAX + 1 > INT64_MAX to True: computed unsigned, it wraps as NumPy's does
            return self.TEMPLATES["wrapping"].format(a, b, op=op, d=d.name, c=c_type(d))
        return self.TEMPLATES["plain"].format(a, b, op=op, d=d.name)

    def undefined_overflow(self, op: str, d: np.dtype) -> bool:
        """Whether ``op`` on dtype ``d`` may overflow where the target leaves the result undefined."""
        raise NotImplementedError

    def negative(self, a: str, d: np.dtype) -> str:
        return self.arith("-", self.literal(0, d), a, d) if self.undefined_overflow("-", d) else f"(-{a})"

    def binop(self, node: BinOp, d: np.dtype) -> str:
        op = node.op
        if op in COMPARISONS:
            c = self.t.compare_dtype(node)
            side = self.beyond(node.left, c) or -self.beyond(node.right, c)
            if side:  # NumPy compares a Python int outside the dtype's range exactly: it never wraps
                return self.literal(_ORDERED[op][side > 0], np.dtype(bool))
            return f"({self.gen(node.left, c)} {op} {self.gen(node.right, c)})"
        if op == "**":
            return self.power(node, d)
        a, b = self.gen(node.left, d), self.gen(node.right, d)
        if d.kind == "b":
            if op not in self.LOGICAL:
                raise KernelError(f"expression {self.expr.text!r}: {op!r} on booleans is not supported")
            return f"({a} {self.LOGICAL[op]} {b})"
        return self.arith(op, a, b, d)

    def product(self, factors: list[str], d: np.dtype) -> str:
        """``a * a (* a)``: integers through :meth:`arith` (wrapping), floats in one expression."""
        if d.kind not in "iu":
            return f"({' * '.join(factors)})"
        code = factors[0]
        for f in factors[1:]:
            code = self.arith("*", code, f, d)
        return code

    def beyond(self, node: Node, c: np.dtype) -> int:
        """+1 (-1) when ``node`` is a weak Python int above (below) the range of integer dtype ``c``, else 0."""
        v = self.t.value(node) if c.kind in "iu" and self.t.weak(node) else None
        if not isinstance(v, int) or isinstance(v, bool):
            return 0
        info = np.iinfo(c)
        return 1 if v > info.max else -1 if v < info.min else 0

    def int_power(self, exponent: Node, d: np.dtype) -> None:
        """Refuse an integer power whose exponent may be negative, where NumPy raises ValueError."""
        if d.kind in "iu" and self.t.value(exponent) is None and self.t.dtype(exponent).kind == "i":
            raise Unfusable(f"expression {self.expr.text!r}: an integer power with a signed integer array as "
                            "exponent (NumPy raises for negative exponents)")

    def power(self, node: BinOp, d: np.dtype) -> str:
        self.int_power(node.right, d)
        a = self.gen(node.left, d)
        exp = self.t.value(node.right) if self.t.weak(node.right) else None
        if exp is not None and d.kind in "fiu":
            if exp in (1, 2, 3):
                return a if exp == 1 else self.product([a] * int(exp), d)
            if d.kind == "f" and exp == 0.5:
                return self.TEMPLATES["sqrt"].format(a)
            if d.kind == "f" and exp == -1:
                return f"({self.literal(1, d)} / {a})"
        return self.helper(self.HELPERS["**"], d, a, self.gen(node.right, d))

    def call(self, node: Call, d: np.dtype) -> str:
        f = node.func
        family = FUNCTIONS[f][1]
        args = node.args
        if family == "predicate":
            ad = self.t.dtype(args[0])
            if ad.kind != "f":  # integers and booleans are never NaN nor infinite
                return self.literal(f == "isfinite", np.dtype(bool))
            return f"{self.function(f)}({self.gen(args[0], ad)})"
        if family == "where":
            return self.TEMPLATES["select"].format(self.gen(args[0], np.dtype(bool)), self.gen(args[1], d), self.gen(args[2], d))
        gen = [self.gen(a, d) for a in args]
        if family == "logical":  # d is bool: the operands are cast to bool (nonzero, NaN included)
            return self.TEMPLATES["not"].format(gen[0]) if f == "logical_not" else \
                f"({gen[0]} {self.LOGICAL[_LOGICAL[f]]} {gen[1]})"
        if family == "round" and d.kind != "f":
            return gen[0]
        if family in ("float", "round"):
            return f"{self.function(f)}({gen[0]})"
        if family == "abs":
            return self.abs(gen[0], d)
        if family == "negative":
            return self.negative(gen[0], d)
        if family == "square":
            return self.product([gen[0]] * 2, d)
        if family == "reciprocal":
            one_over = self.arith("/", self.literal(1, d), gen[0], d)
            if d.kind not in "iu":
                return one_over
            # NumPy's integer 1 / 0 is its platform's cast of inf to the dtype: take the value from NumPy
            with np.errstate(all="ignore"):
                at_zero = int(np.reciprocal(np.zeros(1, dtype=d))[0])
            zero = f"({gen[0]} == {self.literal(0, d)})"
            return self.TEMPLATES["select"].format(zero, self.literal(at_zero, d), one_over)
        if family == "sign":
            return self.TEMPLATES["sign"].format(gen[0], d=d.name, c=c_type(d))
        if family == "clip":
            # a Python int below (above) an integer dtype's range is no bound at all, as in NumPy
            low, high = self.beyond(args[1], d) < 0, self.beyond(args[2], d) > 0
            if low or high:
                code = gen[0] if low else f"{self.typed(self.function('maximum'), d)}({gen[0]}, {gen[1]})"
                return code if high else f"{self.typed(self.function('minimum'), d)}({code}, {gen[2]})"
            return self.TEMPLATES["clip"].format(*gen, c=c_type(d))
        if f == "power":
            self.int_power(args[1], d)
            return self.helper(self.HELPERS["**"], d, *gen)
        return f"{self.typed(self.function(f), d)}({gen[0]}, {gen[1]})"  # minimum, maximum, fmin, fmax, arctan2, hypot


def generate(generator: type[Generator], expr: Expr, types: Mapping[str, Any], arrays: Sequence[str], *,
             out_dtype: Any = None, index: str | None = None) -> tuple[str, np.dtype]:
    """Code for ``expr`` from ``generator``, and its dtype (``out_dtype``, default NumPy's).

    ``types`` maps each name to a dtype (the ``arrays``, named ``in0, ...``, or ``in0[i]`` with
    ``index="i"``) or a scalar value (inlined).
    """
    typing = expr.infer(types)
    dtype = np.dtype(out_dtype) if out_dtype is not None else typing.dtype(expr.root)
    for name in arrays:
        c_type(types[name])
    c_type(dtype)
    suffix = f"[{index}]" if index else ""
    names = {name: f"in{i}{suffix}" for i, name in enumerate(arrays)}
    return generator(expr, typing, names).gen(expr.root, dtype), dtype
