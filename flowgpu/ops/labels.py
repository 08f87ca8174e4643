"""Ops on labelled inputs (``xarray.DataArray``, from ``source: xarray``): the op runs on the dask
arrays under the labels (the same graph as for bare inputs), and :func:`call` puts the labels on
the result as xarray would: elementwise ops through ``xarray.apply_ufunc``; reductions drop the
reduced dims and their coordinates; ``transpose``, ``slice`` and ``squeeze`` are xarray's own; any
other op keeps the labels when it keeps the shape, else gives a bare array. Ops registered with
``labelled=True`` take the DataArrays themselves. ``axis``/``axes`` may name dimensions.
"""

from __future__ import annotations

from typing import Any

from flowgpu.arrays.labels import bare, is_labelled
from flowgpu.errors import ArgumentError
from flowgpu.ops.registry import Op
from flowgpu.ops.shape import parse_index

__all__ = ["call", "axis_numbers"]

AXIS_ARGS = ("axis", "axes")


def _number(op_name: str, arg: str, x: Any, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    if x is None:
        raise ArgumentError(f"op {op_name!r}: {arg} {value!r} names a dimension, but its input has no dimension "
                            "names (only a labelled input, e.g. from source: xarray, has them); give a number",
                            argument=arg)
    if value not in x.dims:
        raise ArgumentError(f"op {op_name!r}: {arg} {value!r} is not a dimension of its input; its dims: "
                            f"{', '.join(map(str, x.dims))}", argument=arg)
    return x.get_axis_num(value)


def axis_numbers(op_name: str, arg: str, value: Any, x: Any) -> Any:
    """``value`` (a dim name or number, or a list of them) with names as numbers of ``x``'s axes."""
    if isinstance(value, (list, tuple)):
        return type(value)(_number(op_name, arg, x, v) if not isinstance(v, (list, tuple)) else v for v in value)
    return _number(op_name, arg, x, value)


def _on_bare(op: Op, args: list, kwargs: dict) -> Any:
    return op(*map(bare, args), **{k: bare(v) for k, v in kwargs.items()})


def _reduced(op: Op, x: Any, args: list, kwargs: dict) -> Any:
    """A reduction of labelled ``x``: its op on the dask array, the reduced dims' coords dropped."""
    axis = kwargs.get("axis")
    numbers = range(x.ndim) if axis is None else ([axis] if isinstance(axis, int) else list(axis))
    gone = {x.dims[int(a) % x.ndim] for a in numbers}
    out = _on_bare(op, args, kwargs)
    keepdims = bool(kwargs.get("keepdims", False))
    dims = [d for d in x.dims if keepdims or d not in gone]
    coords = {k: c for k, c in x.coords.items() if not set(c.dims) & gone}
    out = type(x)(out, dims=dims, coords=coords, attrs=dict(x.attrs))  # a DataArray, as x
    out.name = x.name  # not the dask array's name, which xarray takes when given None
    return out


def _elementwise(op: Op, args: list, kwargs: dict) -> Any:
    """``op`` through ``xarray.apply_ufunc``, which gets the labelled values (broadcast by dimension name)."""
    at = [i for i, v in enumerate(args) if is_labelled(v)]
    keys = [k for k, v in kwargs.items() if is_labelled(v)]

    def apply(*values):
        a, k = list(args), dict(kwargs)
        for i, v in zip(at, values):
            a[i] = v
        k.update(zip(keys, values[len(at):]))
        return op(*a, **k)

    import xarray  # noqa: PLC0415 - loaded already (the inputs are its DataArrays); not for bare inputs

    labelled = [*(args[i] for i in at), *(kwargs[k] for k in keys)]
    return xarray.apply_ufunc(apply, *labelled, dask="allowed", keep_attrs=True)


def _shaped(op: Op, x: Any, args: list, kwargs: dict) -> Any:
    """``transpose``, ``slice`` and ``squeeze`` as xarray does them; else labels kept when the shape is."""
    if len(args) == 1 and op.name in ("transpose", "slice", "squeeze"):
        op(x.data, **kwargs)  # the op's own checks and messages
        if op.name == "slice":
            return x[parse_index(kwargs["index"])]
        axes = kwargs.get("axes" if op.name == "transpose" else "axis")
        dims = None if axes is None else [x.dims[int(a)] for a in ([axes] if isinstance(axes, int) else axes)]
        return x.squeeze(dims) if op.name == "squeeze" else x.transpose(*(dims or ()))
    out = _on_bare(op, args, kwargs)
    if not isinstance(out, (tuple, list)) and getattr(out, "shape", None) == x.shape:
        return x.copy(data=out)
    return out


def call(op: Op, args: list, kwargs: dict) -> Any:
    """Call ``op`` on ``args``/``kwargs`` whose arrays may be labelled; labels carried as xarray does."""
    first = next((v for v in [*args, *kwargs.values()] if is_labelled(v)), None)
    kwargs = {k: axis_numbers(op.name, k, v, first) if k in AXIS_ARGS else v for k, v in kwargs.items()}
    if first is None or op.meta.get("labelled"):
        return op(*args, **kwargs)
    if op.kind == "elementwise":
        return _elementwise(op, list(args), kwargs)
    if op.kind == "reduction" and args and is_labelled(args[0]):
        return _reduced(op, args[0], list(args), kwargs)
    return _shaped(op, first, list(args), kwargs)
