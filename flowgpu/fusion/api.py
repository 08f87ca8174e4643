"""``flowgpu.fuse``: the Python API of kernel fusion, in the spirit of ``cupy.fuse``.

``fuse(fn)`` traces ``fn`` with symbolic stand-ins (:class:`Sym`) for its arrays: operators, NumPy
ufuncs, ``np.where``/``np.clip`` and one trailing reduction become one expression, compiled by
``fused_elementwise`` into ONE kernel per chunk; arithmetic on the reduced value is left to dask.
Python numbers stay weak, NumPy/CuPy arrays in give an array out. A function that cannot be traced
(``if`` on values, indexing, ...) runs unfused on the dask arrays, with a warning saying why.
"""

from __future__ import annotations

import functools
import operator
import warnings
from collections.abc import Callable
from typing import Any

import dask
import dask.array as da
import numpy as np

from flowgpu.errors import KernelError
from flowgpu.fusion.codegen import c_type
from flowgpu.fusion.compiled import REDUCTIONS
from flowgpu.fusion.kernel import fused_elementwise
from flowgpu.fusion.language import is_scalar, literal_text, template_of

__all__ = ["fuse", "Fused"]


class Untraceable(Exception):
    """``fn`` did something a fused kernel cannot express."""


_REDUCTIONS = {"sum": "sum", "mean": "mean", "min": "min", "amin": "min", "max": "max", "amax": "max",
               "prod": "prod"}


class _Tracer(dict):
    """The inputs (arrays and strongly typed scalars) of one trace, by name."""

    def bind(self, value: Any) -> str:
        name = f"a{len(self)}"
        self[name] = value
        return name


def _operand(tracer: _Tracer, v: Any) -> str:
    if isinstance(v, Sym):
        return v.text
    if (text := literal_text(v)) is not None:
        return text
    if is_scalar(v) or (isinstance(v, np.ndarray) and v.ndim == 0):
        # NumPy scalars keep their dtype (they are not weak): pass them as inputs. NumPy hands a
        # scalar's comparison (``np.float32(1.5) < x``) to ``__array_ufunc__`` as a 0-d array.
        return tracer.bind(v)
    if isinstance(v, Reduced):
        raise Untraceable("the result of a reduction is used inside the elementwise part")
    raise Untraceable(f"a {type(v).__name__} operand cannot be part of a fused expression")


class _Lazy:
    """Arithmetic on a reduced result, applied by dask; a subclass's ``materialize()`` is its value."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs:
            return NotImplemented
        return Late(ufunc, inputs)

    for _name, _op in {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
                       "truediv": operator.truediv, "floordiv": operator.floordiv, "mod": operator.mod,
                       "pow": operator.pow}.items():
        locals()[f"__{_name}__"] = (lambda op: lambda self, o: Late(op, (self, o)))(_op)
        locals()[f"__r{_name}__"] = (lambda op: lambda self, o: Late(op, (o, self)))(_op)
    del _name, _op

    def __neg__(self):
        return Late(operator.neg, (self,))

    for _name in ("lt", "le", "gt", "ge"):  # eq/ne stay identity, as for any object
        locals()[f"__{_name}__"] = (lambda op: lambda self, o: Late(op, (self, o)))(getattr(operator, _name))
    del _name

    def __bool__(self):
        raise Untraceable("Python control flow on a reduced value (an 'if' or 'and' on x.sum() > 0)")


class Late(_Lazy):
    def __init__(self, op: Callable, args: tuple):
        self.op, self.args = op, args

    def materialize(self) -> Any:
        return self.op(*[a.materialize() if isinstance(a, _Lazy) else a for a in self.args])


class Reduced(_Lazy):
    """A fused elementwise expression followed by one reduction."""

    def __init__(self, sym: "Sym", reduction: str, axis: Any, keepdims: bool, dtype: Any = None):
        self.sym, self.reduction, self.axis, self.keepdims, self.dtype = sym, reduction, axis, keepdims, dtype

    def materialize(self) -> Any:
        # ``sum(dtype=d)`` reduces the values cast to ``d`` (NumPy's meaning), not the sum cast after
        out = _fused(self.sym.text, self.sym.tracer, reduction=self.reduction,
                     axis=self.axis, keepdims=self.keepdims, dtype=self.dtype)
        return out.astype(self.dtype) if self.dtype is not None and out.dtype != self.dtype else out


class Sym:
    """A symbolic array inside a traced function."""

    __array_priority__ = 1000

    def __init__(self, text: str, tracer: _Tracer):
        self.text, self.tracer = text, tracer

    def _bin(self, op: str, other: Any, reflected: bool = False) -> "Sym":
        a, b = self.text, _operand(self.tracer, other)
        if reflected:
            a, b = b, a
        return Sym(f"({a} {op} {b})", self.tracer)

    for _op, _sym in {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%",
                      "pow": "**", "and": "&", "or": "|", "xor": "^"}.items():
        locals()[f"__{_op}__"] = (lambda s: lambda self, o: self._bin(s, o))(_sym)
        locals()[f"__r{_op}__"] = (lambda s: lambda self, o: self._bin(s, o, True))(_sym)
    for _op, _sym in {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}.items():
        locals()[f"__{_op}__"] = (lambda s: lambda self, o: self._bin(s, o))(_sym)
    for _op, _sym in {"neg": "(-{})", "invert": "(~{})", "abs": "abs({})"}.items():
        locals()[f"__{_op}__"] = (lambda s: lambda self: Sym(s.format(self.text), self.tracer))(_sym)
    del _op, _sym
    __hash__ = object.__hash__

    def __pos__(self):
        return self

    def __bool__(self):
        raise Untraceable("Python control flow (if/and/or/while) on array values")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise Untraceable(f"attribute .{name} of an array")

    def __getitem__(self, key):
        raise Untraceable("indexing an array")

    def _reduce(self, reduction: str, axis=None, dtype=None, out=None, keepdims=False, **kw) -> Reduced:
        if out is not None or kw:
            raise Untraceable(f"{reduction}() with {', '.join(['out'] * (out is not None) + list(kw))}")
        return Reduced(self, reduction, axis, bool(keepdims), dtype)

    sum = functools.partialmethod(_reduce, "sum")
    mean = functools.partialmethod(_reduce, "mean")
    prod = functools.partialmethod(_reduce, "prod")

    def min(self, axis=None, out=None, keepdims=False, **kw):
        return self._reduce("min", axis, None, out, keepdims, **kw)

    def max(self, axis=None, out=None, keepdims=False, **kw):
        return self._reduce("max", axis, None, out, keepdims, **kw)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        name = ufunc.__name__
        red = {"add": "sum", "multiply": "prod", "minimum": "min", "maximum": "max"}.get(name)
        if method == "reduce" and red and len(inputs) == 1:
            return self._reduce(red, **{"axis": 0, **kwargs})
        if method != "__call__" or kwargs:
            raise Untraceable(f"numpy.{name}.{method} with {sorted(kwargs)}")
        if any(isinstance(i, _Lazy) for i in inputs):
            return Late(ufunc, inputs)
        args = [_operand(self.tracer, i) for i in inputs]
        template = template_of(ufunc, len(args))
        if template is None:
            raise Untraceable(f"numpy.{name}")
        return Sym(template.format(*args), self.tracer)

    def __array_function__(self, func, types, args, kwargs):
        name = func.__name__
        if name in _REDUCTIONS and args and isinstance(args[0], Sym):
            return args[0]._reduce(_REDUCTIONS[name], *args[1:], **kwargs)
        if name in ("where", "clip") and len(args) == 3 and not kwargs:
            ops = [_operand(self.tracer, a) for a in args]
            return Sym(f"{name}({', '.join(ops)})", self.tracer)
        raise Untraceable(f"numpy.{name}")


def _fused(text: str, inputs: dict, **kwargs: Any) -> Any:
    try:
        for v in inputs.values():  # fuse() says so where no kernel takes a dtype (fused_elementwise need not)
            if isinstance(v, da.Array):
                c_type(v.dtype)
        return fused_elementwise(text, inputs, **kwargs)
    except KernelError as e:  # no kernel takes it (complex or datetime inputs, nested too deep, ...)
        raise Untraceable(str(e).splitlines()[0]) from None


def _trace(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn`` called with a :class:`Sym` for each array argument."""
    tracer = _Tracer()

    def stand_in(v: Any) -> Any:
        if is_scalar(v) or isinstance(v, (str, bytes, type(None))):
            return v
        if hasattr(v, "shape") and hasattr(v, "dtype"):
            return Sym(tracer.bind(v), tracer)
        raise Untraceable(f"argument of type {type(v).__name__}")

    return fn(*map(stand_in, args), **{k: stand_in(v) for k, v in kwargs.items()})


class Fused:
    """A function whose elementwise body (and trailing reduction) runs as one kernel per chunk."""

    def __init__(self, fn: Callable, *, reduce: str | None = None, axis: Any = None, keepdims: bool = False):
        if reduce is not None and reduce not in REDUCTIONS:
            raise KernelError(f"fuse(reduce={reduce!r}): choose one of {', '.join(REDUCTIONS)}")
        if not callable(fn):
            raise KernelError(f"fuse({fn!r}): give the function to fuse, e.g. fuse(lambda x: (x * 2 + 1).sum())")
        self.fn, self.reduce, self.axis, self.keepdims = fn, reduce, axis, keepdims
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"flowgpu.fuse({getattr(self.fn, '__name__', self.fn)!r})"

    def _result(self, out: Any) -> Any:
        if isinstance(out, tuple):
            return tuple(self._result(o) for o in out)
        if isinstance(out, Sym):
            if self.reduce is not None:
                return Reduced(out, self.reduce, self.axis, self.keepdims).materialize()
            return _fused(out.text, out.tracer)
        if isinstance(out, _Lazy):
            if self.reduce is not None:
                raise KernelError(f"{self!r}: the function already reduces; drop reduce={self.reduce!r}")
            return out.materialize()
        raise Untraceable(f"the function returned a {type(out).__name__}, not an array expression")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        lazy = any(isinstance(v, da.Array) for v in (*args, *kwargs.values()))
        if not lazy:  # plain NumPy/CuPy arrays in, plain array out (as with cupy.fuse)
            args = tuple(map(_as_dask, args))
            kwargs = {k: _as_dask(v) for k, v in kwargs.items()}
        try:
            result = self._result(_trace(self.fn, args, kwargs))
        except Untraceable as why:
            warnings.warn(f"{self!r} cannot be fused ({why}); applying it to the {'dask ' if lazy else ''}arrays "
                          "unfused", RuntimeWarning, stacklevel=2)
            result = self.fn(*args, **kwargs)
            if self.reduce is not None:
                result = getattr(result, self.reduce)(axis=self.axis, keepdims=self.keepdims)
        if lazy:
            return result
        return dask.compute(result, scheduler="sync")[0]


def _as_dask(v: Any) -> Any:
    is_array = hasattr(v, "shape") and hasattr(v, "dtype") and not is_scalar(v) and not isinstance(v, da.Array)
    return da.asarray(v) if is_array else v


def fuse(fn: Callable | None = None, *, reduce: str | None = None, axis: Any = None,
         keepdims: bool = False) -> Any:
    """Fuse ``fn``'s elementwise body (and one trailing reduction) into one kernel per chunk.

    ``fn`` uses operators, NumPy ufuncs, ``np.where``, ``np.clip`` and at most one trailing
    ``sum``/``mean``/``min``/``max``/``prod`` (method or ``np.`` function, with ``axis``, ``keepdims``);
    or ``reduce=`` one of those reduces its result over ``axis`` instead. The :class:`Fused` returned
    (also as ``@fuse`` or ``@fuse(reduce="sum")``) gives a lazy dask array for dask inputs and a
    computed array for NumPy/CuPy ones.
    """
    make = functools.partial(Fused, reduce=reduce, axis=axis, keepdims=keepdims)
    return make if fn is None else make(fn)
