"""A small, safe expression language for fused kernels: ``parse("(x * 2 + 1) ** 2 - x")``.

A whitelisted subset of Python read with :mod:`ast` (never ``eval``): names, numbers, arithmetic,
comparisons (``0 < x < 1`` means ``(0 < x) & (x < 1)``), ``& | ^ ~`` (bitwise on integers, as in
NumPy) and the functions in :data:`FUNCTIONS`; anything else raises KernelError at its column.
:meth:`Expr.infer` gives every node's dtype under NumPy's rules, which the code generators follow.
"""

from __future__ import annotations

import ast
import difflib
import functools
import math
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowgpu.errors import KernelError

__all__ = ["parse", "Expr", "Node", "Name", "Const", "BinOp", "UnaryOp", "Call", "FUNCTIONS", "Typing", "is_scalar",
           "literal_text", "template_of"]

# function name -> (number of arguments, family); the family tells the code generators how to type it
FUNCTIONS: dict[str, tuple[int, str]] = {
    **{f: (1, "float") for f in (
        "sqrt", "cbrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan",
        "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh")},
    **{f: (1, "round") for f in ("floor", "ceil", "trunc", "rint")},
    **{f: (1, "predicate") for f in ("isnan", "isinf", "isfinite")},
    "abs": (1, "abs"), "absolute": (1, "abs"), "negative": (1, "negative"), "square": (1, "square"),
    "reciprocal": (1, "reciprocal"), "sign": (1, "sign"),
    **{f: (2, "binary") for f in ("minimum", "maximum", "fmin", "fmax", "arctan2", "hypot", "power")},
    "where": (3, "where"), "clip": (3, "clip"),
    **{f: (2, "logical") for f in ("logical_and", "logical_or", "logical_xor")}, "logical_not": (1, "logical"),
}

BINARY_OPS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
}
COMPARE_OPS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
UNARY_OPS = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}
MAX_INT_BITS = 4096  # the largest Python int ``**`` of two ints may make (any dtype holds far less)


def _pow(a: Any, b: Any) -> Any:
    """``a ** b``, refused for two Python ints whose result would be huge (``9 ** 9 ** 9``: hours)."""
    if type(a) is int and type(b) is int and b > 1 and abs(a) > 1:
        bits = b * math.log2(abs(a))
        if bits > MAX_INT_BITS:
            base = f"({a})" if a < 0 else str(a)
            raise OverflowError(f"{base} ** {b} would have about {int(bits * math.log10(2)) + 1:,} digits, "
                                f"more than the {MAX_INT_BITS} bits allowed (no dtype holds it)")
    return operator.pow(a, b)


_PY_OPS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": _pow, "&": operator.and_,
    "|": operator.or_, "^": operator.xor, "==": operator.eq, "!=": operator.ne, "<": operator.lt,
    "<=": operator.le, ">": operator.gt, ">=": operator.ge,
}
# the operators of Python's and NumPy's functions (logical_and/or/xor/not are functions of the
# language: & | ^ ~ are bitwise on integers)
_BINARY = {f: op for op, f in _PY_OPS.items() if op != "**"} | {operator.pow: "**"} | {
    np.add: "+", np.subtract: "-", np.multiply: "*", np.true_divide: "/", np.floor_divide: "//",
    np.remainder: "%", np.power: "**", np.greater: ">", np.greater_equal: ">=", np.less: "<",
    np.less_equal: "<=", np.equal: "==", np.not_equal: "!=", np.bitwise_and: "&", np.bitwise_or: "|",
    np.bitwise_xor: "^"}
_UNARY = {operator.neg: "-", operator.invert: "~", operator.pos: "+", np.negative: "-", np.invert: "~",
          np.positive: "+"}


def template_of(func: Any, nargs: int) -> str | None:
    """A ``str.format`` template over ``{0}, {1}, ...`` for an elementwise ``func``, else None."""
    if func in _BINARY and nargs == 2:
        return "({0} %s {1})" % _BINARY[func]
    if func in _UNARY and nargs == 1:
        return "(%s{0})" % _UNARY[func]
    if (func is abs or func is operator.abs) and nargs == 1:
        return "abs({0})"
    name = getattr(func, "__name__", None)
    if isinstance(func, np.ufunc):
        name = "abs" if name == "absolute" else name
        if name in FUNCTIONS and FUNCTIONS[name][0] == nargs:
            return f"{name}({', '.join('{%d}' % i for i in range(nargs))})"
        return None
    module = getattr(func, "__module__", "") or ""
    if name in ("where", "clip") and nargs == 3 and (module.startswith("numpy") or module.startswith("dask")):
        return f"{name}({{0}}, {{1}}, {{2}})"
    return None


COMPARISONS = frozenset(COMPARE_OPS.values())
_HINTS = {
    ast.Attribute: "call functions by their plain name, e.g. sqrt(x) rather than np.sqrt(x)",
    ast.Subscript: "indexing is not supported inside an expression; slice the array before the step",
    ast.BoolOp: "use & and | (with parentheses) instead of 'and' / 'or'",
    ast.Lambda: "write the expression itself, without lambda",
    ast.IfExp: "use where(condition, a, b) instead of 'a if condition else b'",
}


@dataclass(frozen=True, eq=False)
class Node:
    """Base class of expression nodes; ``col`` is the 1-based column in the source text."""

    col: int


@dataclass(frozen=True, eq=False)
class Name(Node):
    id: str


@dataclass(frozen=True, eq=False)
class Const(Node):
    value: bool | int | float


@dataclass(frozen=True, eq=False)
class BinOp(Node):
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, eq=False)
class UnaryOp(Node):
    op: str
    operand: Node


@dataclass(frozen=True, eq=False)
class Call(Node):
    func: str
    args: tuple[Node, ...]


def is_scalar(value: Any) -> bool:
    """True for Python and NumPy scalars (bool, int, float), which are inlined into kernels."""
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating))


def literal_text(value: Any) -> str | None:
    """A Python bool, int or float as expression text (negatives parenthesised: ``(-2.0) ** x``);
    None for NaN, inf and any other value (NumPy scalars, whose dtype a literal would lose)."""
    if type(value) not in (bool, int, float) or (type(value) is float and not math.isfinite(value)):
        return None
    text = repr(value)
    return f"({text})" if text.startswith("-") else text


MAX_DEPTH = 200  # operations one expression may nest; deeper trees pass Python's recursion in codegen


def _fail(text: str, col: int, message: str, hint: str | None = None) -> KernelError:
    shown, at = (text, col) if len(text) <= 120 else (text[max(col - 60, 0):col + 60], min(col, 61))
    pointer = f"\n    {shown}\n    {' ' * (at - 1)}^"
    tail = f"; {hint}" if hint else ""
    quoted = repr(text) if len(text) <= 120 else f"{text[:57]!r}...({len(text):,} characters)"
    return KernelError(f"expression {quoted}, column {col}: {message}{tail}{pointer}")


def _depth(tree: ast.AST) -> int:
    """How deep ``tree`` nests, a comparison chain one level per comparison (no recursion: it may be deep)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        step = len(node.ops) if isinstance(node, ast.Compare) else 1
        stack.extend((child, d + step) for child in ast.iter_child_nodes(node))
    return deepest


class _Builder:
    def __init__(self, text: str, allowed: frozenset[str] | None):
        self.text = text
        self.allowed = allowed
        self.names: list[str] = []

    def token(self, node: ast.AST) -> str:
        seg = ast.get_source_segment(self.text, node)
        return seg if seg is not None else type(node).__name__

    def build(self, node: ast.AST) -> Node:
        col = getattr(node, "col_offset", 0) + 1
        if isinstance(node, ast.Name):
            if node.id in FUNCTIONS and (self.allowed is None or node.id not in self.allowed):
                raise _fail(self.text, col, f"{node.id!r} is a function; call it, e.g. {node.id}(x)")
            if self.allowed is not None and node.id not in self.allowed:
                known = ", ".join(sorted(self.allowed)) or "none"
                raise _fail(self.text, col, f"unknown name {node.id!r}", f"the inputs are: {known}")
            if node.id not in self.names:
                self.names.append(node.id)
            return Name(col, node.id)
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, (bool, int, float)):
                return Const(col, v)
            raise _fail(self.text, col, f"literal {self.token(node)} is not a number",
                        "only int, float, True and False literals are allowed")
        if isinstance(node, ast.BinOp):
            op = BINARY_OPS.get(type(node.op))
            if op is None:
                raise _fail(self.text, col, f"operator in {self.token(node)!r} is not supported",
                            "use + - * / // % ** & | ^")
            left, right = self.build(node.left), self.build(node.right)
            if not (isinstance(left, Const) and isinstance(right, Const)):
                return BinOp(col, op, left, right)
            try:
                return Const(col, _PY_OPS[op](left.value, right.value))
            except (ArithmeticError, ValueError, TypeError) as e:
                raise _fail(self.text, col, f"{self.token(node)!r} cannot be computed: {e}") from None
        if isinstance(node, ast.UnaryOp):
            op = UNARY_OPS.get(type(node.op))
            if op is None:
                raise _fail(self.text, col, f"{self.token(node)!r}: 'not' is not supported", "use ~ instead")
            operand = self.build(node.operand)
            if op == "+":
                return operand
            if isinstance(operand, Const) and op == "-":
                return Const(col, -operand.value)
            return UnaryOp(col, op, operand)
        if isinstance(node, ast.Compare):
            built = [self.build(p) for p in (node.left, *node.comparators)]
            out: Node | None = None
            for i, cmp in enumerate(node.ops):
                op = COMPARE_OPS.get(type(cmp))
                if op is None:
                    raise _fail(self.text, col, f"comparison in {self.token(node)!r} is not supported",
                                "use == != < <= > >=")
                term = BinOp(col, op, built[i], built[i + 1])
                out = term if out is None else BinOp(col, "&", out, term)
            return out
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name):
                if not isinstance(node.func, ast.Attribute):
                    self.build(node.func)  # raises at the offending token (a lambda, a subscript, ...)
                raise _fail(self.text, node.func.col_offset + 1, f"cannot call {self.token(node.func)!r}",
                            _HINTS[ast.Attribute])
            fname = node.func.id
            if fname not in FUNCTIONS:
                close = difflib.get_close_matches(fname, list(FUNCTIONS), n=3)
                hint = f"did you mean {', '.join(close)}?" if close else \
                    f"known functions: {', '.join(sorted(FUNCTIONS))}"
                raise _fail(self.text, col, f"unknown function {fname!r}", hint)
            if node.keywords:
                kw = node.keywords[0]
                raise _fail(self.text, getattr(kw, "col_offset", node.col_offset) + 1,
                            f"{fname}() takes positional arguments only")
            nargs = FUNCTIONS[fname][0]
            if len(node.args) != nargs:
                raise _fail(self.text, col, f"{fname}() takes {nargs} argument(s), got {len(node.args)}")
            return Call(col, fname, tuple(self.build(a) for a in node.args))
        hint = _HINTS.get(type(node))
        if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp, ast.DictComp)):
            hint = "comprehensions are not supported; write one elementwise expression"
        raise _fail(self.text, col, f"{self.token(node)!r} is not allowed in an expression", hint)


@functools.lru_cache(maxsize=1024)
def _parse_cached(text: str, allowed: frozenset[str] | None) -> "Expr":
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        col = e.offset or 1
        raise _fail(text.strip(), col, f"not a valid expression ({e.msg})") from None
    except (RecursionError, MemoryError):
        tree = None
    if tree is None or _depth(tree) > MAX_DEPTH:
        raise _fail(text.strip(), 1, f"the expression nests more than {MAX_DEPTH} operations deep",
                    "split it into several steps")
    builder = _Builder(text.strip(), allowed)
    root = builder.build(tree.body)
    return Expr(text.strip(), root, tuple(builder.names))


def parse(text: str, names: Iterable[str] | None = None) -> "Expr":
    """Parse ``text`` into an :class:`Expr`; ``names`` are the inputs it may use (None: any name).

    Raises KernelError naming the first token that is not allowed, with its column.
    """
    if not isinstance(text, str) or not text.strip():
        raise KernelError(f"expression {text!r} is empty; give one such as 'x * 2 + 1'")
    return _parse_cached(text, frozenset(names) if names is not None else None)


@dataclass(eq=False)
class Expr:
    """A parsed expression: its text, its tree and its free names (in order of first use)."""

    text: str
    root: Node
    names: tuple[str, ...]

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"

    def evaluate(self, env: Mapping[str, Any], xp: Any = np, *, record: dict | None = None) -> Any:
        """Evaluate unfused with ``xp`` (numpy or cupy); ``record`` receives each node's value."""
        missing = [n for n in self.names if n not in env]
        if missing:
            raise KernelError(f"expression {self.text!r} needs input(s) {', '.join(missing)} which were not given")
        return _eval(self.root, env, xp, record)

    def infer(self, types: Mapping[str, Any]) -> "Typing":
        """The NumPy type of every node for inputs of these dtypes (or scalars, Python's weak).

        Raises KernelError when NumPy refuses the types (``float & float``, ``int ** -1``).
        """
        samples = {}
        for name in self.names:
            if name not in types:
                raise KernelError(f"expression {self.text!r} needs input {name!r}, which was not given")
            t = types[name]
            samples[name] = t if is_scalar(t) else np.ones(1, dtype=np.dtype(t))
        record: dict[Any, Any] = {}
        try:
            with np.errstate(all="ignore"):
                self.evaluate(samples, np, record=record)
        except Exception as e:
            shown = {n: (type(t).__name__ if is_scalar(t) else str(np.dtype(t))) for n, t in types.items()
                     if n in self.names}
            raise KernelError(f"expression {self.text!r} cannot be applied to inputs {shown}: {e}") from None
        return Typing(record)

    def result_dtype(self, types: Mapping[str, Any]) -> np.dtype:
        """The dtype NumPy gives the unfused expression for inputs of these dtypes (or scalars)."""
        return self.infer(types).dtype(self.root)


class Typing:
    """Types of the nodes of one expression for one set of input types."""

    def __init__(self, record: dict):
        self._record = record

    def weak(self, node: Node) -> bool:
        """True when the node is a weak Python scalar."""
        return isinstance(self._record[id(node)], (bool, int, float))

    def value(self, node: Node) -> Any:
        """The node's value when it is a scalar (weak, or a NumPy scalar input); else None."""
        v = self._record[id(node)]
        return v if is_scalar(v) else None

    def dtype(self, node: Node) -> np.dtype:
        """The node's dtype (a weak scalar's: NumPy's for it alone)."""
        v = self._record[id(node)]
        return np.result_type(v) if isinstance(v, (bool, int, float)) else np.asarray(v).dtype

    def compare_dtype(self, node: BinOp) -> np.dtype:
        """The dtype both sides of a comparison are promoted to."""
        return self._record[("compare", id(node))]


def _eval(node: Node, env: Mapping[str, Any], xp: Any, record: dict | None) -> Any:
    if isinstance(node, Name):
        value = env[node.id]
    elif isinstance(node, Const):
        value = node.value
    elif isinstance(node, BinOp):
        a = _eval(node.left, env, xp, record)
        b = _eval(node.right, env, xp, record)
        value = _PY_OPS[node.op](a, b)
        if node.op in COMPARISONS and record is not None:
            record[("compare", id(node))] = np.result_type(a, b)
    elif isinstance(node, UnaryOp):
        a = _eval(node.operand, env, xp, record)
        value = -a if node.op == "-" else ~a
    else:  # a Call, the builder's last kind of node
        args = [_eval(a, env, xp, record) for a in node.args]
        value = getattr(xp, "abs" if node.func == "absolute" else node.func)(*args)
    if record is not None:
        record[id(node)] = value
    return value
