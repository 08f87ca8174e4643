"""A stand-in for CuPy arrays on a machine without a GPU: ``Dev`` refuses NumPy array operands where
CuPy does (its ufuncs, ``einsum``, ``where``, ``dot``, ...) with CuPy's own message, so the
rewrite that moves host operands to the device (flowgpu.fusion.device) is tested on the CPU."""

from __future__ import annotations

import numpy as np

STRICT = {"einsum", "where", "dot", "tensordot", "matmul", "clip"}


def _check(values) -> None:
    for v in values:
        if type(v) is np.ndarray:
            raise TypeError("Unsupported type <class 'numpy.ndarray'>")
        if isinstance(v, (list, tuple)):
            _check(v)


def _unwrap(v):
    if isinstance(v, Dev):
        return v.view(np.ndarray)
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(x) for x in v)
    if isinstance(v, dict):
        return {k: _unwrap(x) for k, x in v.items()}
    return v


def _wrap(v):
    if type(v) is np.ndarray:
        return v.view(Dev)
    if isinstance(v, np.generic):
        return np.asarray(v).view(Dev)
    if isinstance(v, (list, tuple)):
        return type(v)(_wrap(x) for x in v)
    return v


class Dev(np.ndarray):
    """An array "on the device"."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _check(inputs)
        _check(kwargs.get("out", ()))
        return _wrap(getattr(ufunc, method)(*_unwrap(inputs), **_unwrap(kwargs)))

    def __array_function__(self, func, types, args, kwargs):
        if func.__name__ in STRICT:
            _check(args)
            _check(list(kwargs.values()))
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))


def to_dev(block):
    """A block "copied to the device"."""
    return np.asarray(block).view(Dev)


to_dev.moves_to_device = True


def is_dev(x) -> bool:
    return isinstance(x, Dev)
